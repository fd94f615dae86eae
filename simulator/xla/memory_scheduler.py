"""XLA's memory schedulers replayed on a dumped HLO module: the order a step
runs in, read off the module rather than guessed.

libtpu's final scheduling pipeline (pass hlo-memory-scheduler-with-brkga-
fallback, its BRKGA fallback off in the dumped flagfile) runs OpenXLA's
DefaultMemoryScheduler (xla/service/hlo_memory_scheduler.cc). It orders the
module three ways: a list schedule, a DFS schedule and the post order. It
simulates each one's heap and keeps the smallest. libtpu logs the three sizes
and its choice at --vmodule=hlo_memory_scheduler=2; `request_log` asks for
that and `logged` reads it off each compile (simulator.xla.compiled).
XLA:GPU runs the same scheduler (gpu_hlo_schedule.cc) and logs the same
lines to stderr where TSL's environment asks (`request_gpu_log`, before jax
loads); `stderr_logged` reads them off a GPU compile.

`dfs_order` and `post_order` replay two of the three on the entry computation
dumped before that pass (`experiments.validate --dump_passes=memory-scheduler`).
Instruction for instruction, they give the order XLA kept:
- gpt2 v5p-8 4x1 b16 s1024 full dp (corpus #25): XLA chose the DFS schedule
  (list 2.94, DFS 2.62, post order 3.04 GiB); `dfs_order` gives all 290
  entry instructions in XLA's order.
- gpt2 v5p-8 1x4 b8 s512 dots adafactor (#2): XLA chose the post order;
  `post_order` gives all 653 in its order.
- llama3_8b v5p-32 16x1 b256 s4096 (#56, DFS) and llama2_13b v5p-32 16x1
  b512 (#55, post order): 234 of 234 and 212 of 212 (README).
tests/test_memory_scheduler.py holds the first two on their dumps. The list schedule
is not replayed.

What the DFS order turns on. The DFS schedule visits an instruction's
operands by three keys, in turn:
- transitive extra users, capped at the instruction count;
- transitive bytes defined (the TPU's tiled sizes), capped at the bytes
  defined so far in post order;
- the name.
In a training step almost everything the backward pass makes reaches both
caps. So which of two gradients is made first (the output projection's
before or after the layers' backward loop: the deferred-weight-gradients
rule, simulator.memory.xla_rules) turns on three things a jaxpr does not
have: where each falls in the fused module's post order, the fused buffers'
tiled sizes, and the instruction names.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import glob
import itertools
import math
import os
import re
import sys
import tempfile
from typing import Iterator

from simulator.memory.tiling import tiled
from simulator.xla.xla_peak import op_tail
from simulator.xla.hlo_collectives import (DTYPE_BYTES, INSTRUCTION,
                                           computations, entry_name)

# What libtpu is asked to log (`request_log`): the scheduler's estimates,
# each line written at once (its INFO log is otherwise flushed up to 30 s
# late, after the compile has returned).
LOG_FLAG = "--vmodule=hlo_memory_scheduler=2 --logbufsecs=0"
_LOG_DIR = "/tmp/tpu_logs"  # libtpu's log directory unless TPU_LOG_DIR says
# What XLA:GPU is asked to log (`request_gpu_log`): INFO lines at all (jax's
# own default, set as it is imported, is WARNING and above) and the
# scheduler's at verbosity 2.
GPU_LOG_ENV = {"TF_CPP_MIN_LOG_LEVEL": "0",
               "TF_CPP_VMODULE": "hlo_memory_scheduler=2"}
_LOG_PREFIX = re.compile(r"[IWEF]\d{4} ")  # absl's: severity, month, day
# The pass whose input and output the replay reads (libtpu's final_scheduler
# pipeline, dump 0000/0001 of `--dump_passes=memory-scheduler`).
PASS = "hlo-memory-scheduler"
# Instructions the schedulers' statistics skip (ListScheduler::
# IgnoreInstruction): they occupy no scheduled buffer.
_IGNORED = ("parameter", "constant")
# Instructions that define no buffer of their own (they alias an operand's).
_ALIASING = ("get-tuple-element", "bitcast")
_POINTER_BYTES = 8  # a tuple's index table: one pointer per element
_ARRAY_LAYOUT = re.compile(r"\b([a-z][a-z0-9]*)\[([0-9,]*)\](\{[^}]*\})?")
_TILE = re.compile(r"T\(([\d,]+)\)")
_LOG = re.compile(r"(Min-memory|Chose min-memory) (list|dfs|post[ _]order) "
                  r"sequence: ([\d.]+)([KMGT]?i?B)")
_NAMES = {"list": "list", "dfs": "DFS", "post order": "post-order"}
# The memory schedulers libtpu runs by name (its --xla_memory_scheduler, a
# compile option: `compiler_options`), as libtpu lists them refusing another
# name ("Valid options are: default, list, dfs, post_order, brkga, bfs, ilp,
# backtracking, brute_force, local_order"). "default" is
# DefaultMemoryScheduler: the smallest of list, DFS and post order by its own
# estimate.
SCHEDULERS = ("default", "list", "dfs", "post_order", "brkga", "bfs", "ilp",
              "backtracking", "brute_force", "local_order")
_UNITS = {"B": 1, "KiB": 2**10, "MiB": 2**20, "GiB": 2**30, "TiB": 2**40}


@dataclasses.dataclass(frozen=True)
class Instruction:
  name: str
  opcode: str
  shape: str  # its result shape with layouts, as the module prints it
  operands: tuple[str, ...]
  control: tuple[str, ...]  # control predecessors
  op_name: str = ""  # the jax op it came from (metadata), for people
  text: str = ""  # what follows the opcode: operands and attributes

  def attribute(self, key: str) -> str | None:
    """An attribute's value: `index` of a get-tuple-element, `body` of a
    while, `calls` of a fusion, ..."""
    m = re.search(rf"\b{key}=%?([\w.\-]+)", self.text)
    return m.group(1) if m else None

  @property
  def number(self) -> int:
    """A parameter's number."""
    return int(self.text.split(")", 1)[0])


@dataclasses.dataclass(frozen=True)
class Computation:
  instructions: dict[str, Instruction]  # in the module's text order
  root: str


@dataclasses.dataclass(frozen=True)
class Module:
  computations: dict[str, Computation]
  entry: str


def _computation(lines: list[str]) -> Computation | None:
  instructions: dict[str, Instruction] = {}
  root = ""
  for line in lines[1:]:
    m = INSTRUCTION.match(line)
    if not m:
      continue
    name, shape, opcode, rest = m.groups()
    operands = re.findall(r"%([\w.\-]+)", _up_to_close(rest))
    control = re.search(r"control-predecessors=\{([^}]*)\}", rest)
    op_name = re.search(r'op_name="([^"]*)"', rest)
    instructions[name] = Instruction(
        name, opcode, shape, tuple(operands),
        tuple(re.findall(r"%([\w.\-]+)", control.group(1))) if control else (),
        op_name.group(1) if op_name else "", rest)
    if line.lstrip().startswith("ROOT"):
      root = name
  return Computation(instructions, root or name) if instructions else None


def read_entry(text: str) -> Computation:
  """The entry computation of an HLO module's text."""
  c = _computation(computations(text).get(entry_name(text) or "", []))
  if c is None:
    raise ValueError("no entry computation in the module text")
  return c


def read_module(text: str) -> Module:
  """Every computation of an HLO module's text (fusions' too)."""
  comps = {name: c for name, lines in computations(text).items()
           if (c := _computation(lines)) is not None}
  entry = entry_name(text)
  if entry not in comps:
    raise ValueError("no entry computation in the module text")
  return Module(comps, entry)


def _up_to_close(rest: str) -> str:
  """The operand list: `rest` up to the parenthesis that closes it."""
  depth = 1
  for i, ch in enumerate(rest):
    depth += (ch == "(") - (ch == ")")
    if depth == 0:
      return rest[:i]
  return rest


def tiled_array_bytes(shape: str) -> list[int]:
  """Bytes of each array in a shape printed with its layouts: the TPU's
  tiled size where the layout has a tile (simulator.memory.tiling)."""
  out = []
  for dtype, dims, layout in _ARRAY_LAYOUT.findall(shape):
    if dtype not in DTYPE_BYTES:
      continue
    sizes = [int(d) for d in dims.split(",") if d]
    minor_to_major, _, tiling = layout.strip("{}").partition(":")
    order = [int(d) for d in minor_to_major.split(",") if d][::-1]
    tile = _TILE.search(tiling)
    out.append(int(tiled([sizes[a] for a in order or range(len(sizes))],
                         DTYPE_BYTES[dtype],
                         tuple(map(int, tile.group(1).split(",")))
                         if tile else ())))
  return out


def defined_bytes(instruction: Instruction) -> int:
  """The bytes of the buffers an instruction defines (XLA's points-to
  analysis and the TPU's size function): none for an alias, a tuple's index
  table for a tuple, every element and that table for another tuple-shaped
  result."""
  if instruction.opcode in _ALIASING:
    return 0
  arrays = tiled_array_bytes(instruction.shape)
  table = _POINTER_BYTES * len(arrays)
  if instruction.shape.startswith("("):
    return table if instruction.opcode == "tuple" else sum(arrays) + table
  return sum(arrays)


def _predecessors(c: Computation, name: str) -> list[str]:
  i = c.instructions[name]
  return list(dict.fromkeys(o for o in (*i.operands, *i.control)
                            if o in c.instructions))


def _users(c: Computation) -> dict[str, set[str]]:
  users: dict[str, set[str]] = {n: set() for n in c.instructions}
  for name, i in c.instructions.items():
    for o in set(i.operands):
      if o in users:
        users[o].add(name)
  return users


def _dfs(c: Computation, start: str, seen: set, out: list, key=None) -> None:
  """Post-order DFS from `start` (HloInstruction::Accept[WithOperandOrder]):
  operands in their order, or sorted by `key` when given."""
  stack = [(start, False)]
  while stack:
    name, expanded = stack.pop()
    if expanded:
      if name not in seen:
        seen.add(name)
        out.append(name)
      continue
    if name in seen:
      continue
    stack.append((name, True))
    children = _predecessors(c, name)
    if key is not None:
      children.sort(key=key)
    stack += [(k, False) for k in reversed(children) if k not in seen]


def post_order(c: Computation) -> list[str]:
  """The post order (HloComputation::MakeInstructionPostOrder: from each
  instruction no one uses, in the module's order): what
  PostOrderMemoryScheduler schedules."""
  users = _users(c)
  out: list[str] = []
  seen: set = set()
  for r in (n for n in c.instructions if not users[n]):
    _dfs(c, r, seen, out)
  return out


def dfs_order(c: Computation) -> list[str]:
  """DFSMemoryScheduler's order: a post-order DFS that visits operands by
  decreasing transitive extra users (each instruction's users less one,
  summed over everything that leads to it, capped at the instruction count),
  then decreasing transitive bytes (capped at the bytes defined so far in
  post order), then name."""
  users = _users(c)
  extra: dict[str, int] = {}
  sizes: dict[str, int] = {}
  cumulative = 0
  for name in post_order(c):
    i = c.instructions[name]
    if i.opcode in _IGNORED:
      extra[name] = sizes[name] = 0
      continue
    own = defined_bytes(i)
    cumulative += own
    operands = set(i.operands) & c.instructions.keys()
    extra[name] = min(max(len(users[name]) - 1, 0)
                      + sum(extra[o] for o in operands), len(c.instructions))
    sizes[name] = min(own + sum(sizes[o] for o in operands), cumulative)

  def first(a: str, b: str) -> int:
    return ((extra[b] > extra[a]) - (extra[b] < extra[a])
            or (sizes[b] > sizes[a]) - (sizes[b] < sizes[a])
            or (a > b) - (a < b))

  out: list[str] = []
  seen: set = set()
  # HloComputation::AcceptWithOperandOrder: the unreachable roots, then the
  # root
  for r in [n for n in c.instructions if not users[n] and n != c.root] + [
      c.root]:
    _dfs(c, r, seen, out, key=functools.cmp_to_key(first))
  return out


# A value (XLA's HloValue): the instruction that defines it and which element
# of its result (-1: a tuple's index table).
Value = tuple[str, int]
# Instructions whose result is an operand's values (HloDataflowAnalysis
# defines none for them).
_FORWARDING = ("get-tuple-element", "bitcast", "optimization-barrier",
               "add-dependency")


def passed_through(module: Module, loop: Instruction) -> set[int]:
  """The elements a while loop's body hands back unchanged (its root's
  element k is its parameter's element k): the loop defines no new value
  there (dataflow's phi values with one input are removed)."""
  body = module.computations.get(loop.attribute("body") or "")
  if body is None:
    return set()
  param = next((n for n, i in body.instructions.items()
                if i.opcode == "parameter"), None)
  root = body.instructions[body.root]
  if root.opcode != "tuple":
    return set()
  out = set()
  for k, o in enumerate(root.operands):
    i = body.instructions.get(o)
    if (i is not None and i.opcode == "get-tuple-element"
        and i.operands[:1] == (param,) and i.attribute("index") == str(k)):
      out.add(k)
  return out


@dataclasses.dataclass(frozen=True)
class Values:
  """A computation's dataflow: the values at each element of each
  instruction's result, and what each instruction defines."""

  at: dict[str, list[frozenset]]  # instruction -> per element: its values
  defined: dict[str, list[Value]]
  sizes: dict[Value, int]

  def flat(self, name: str) -> frozenset:
    """Every value an instruction's result holds (its flattened value set),
    its own tuple table included."""
    return frozenset().union(*self.at[name], (v for v in self.defined[name]
                                              if v[1] == -1))


def values(c: Computation, module: Module | None = None) -> Values:
  """The values of `c` (HloDataflowAnalysis in SSA form, as the schedulers
  and the heap simulator read it): a get-tuple-element, bitcast or
  ...-done forwards an operand's values; a tuple defines only its index
  table; a while loop defines the elements its body changes
  (`passed_through`, with `module`), every other instruction all of its."""
  at: dict[str, list[frozenset]] = {}
  defined: dict[str, list[Value]] = {}
  sizes: dict[Value, int] = {}
  for name in post_order(c):
    i = c.instructions[name]
    arrays = tiled_array_bytes(i.shape)
    tup = i.shape.startswith("(")
    operands = [at[o] for o in i.operands if o in at]
    own: list[Value] = []

    def new(k: int, size: int) -> frozenset:
      sizes[(name, k)] = size
      own.append((name, k))
      return frozenset([(name, k)])

    if i.opcode == "get-tuple-element":
      k = int(i.attribute("index"))
      elements = [operands[0][k] if k < len(operands[0]) else frozenset()]
    elif i.opcode in _FORWARDING or i.opcode.endswith("-done"):
      first = operands[0] if operands else [frozenset()]
      elements = ([first[1]] if i.opcode.endswith("-done") and len(first) > 1
                  else list(first))
    elif i.opcode == "tuple":
      elements = [frozenset().union(*o) for o in operands]
      new(-1, _POINTER_BYTES * len(i.operands))
    elif tup:
      kept = (passed_through(module, i) if module and i.opcode == "while"
              else set())
      init = operands[0] if operands else []
      forwarded = (i.opcode.endswith("-start") and i.opcode != "async-start"
                   and operands)  # element 0: the operand itself
      elements = [init[k] if k in kept and k < len(init)
                  else frozenset().union(*operands[0]) if k == 0 and forwarded
                  else new(k, b) for k, b in enumerate(arrays)]
      new(-1, _POINTER_BYTES * len(arrays))
    else:
      elements = [new(0, sum(arrays))]
    at[name], defined[name] = elements, own
  return Values(at, defined, sizes)


def _effective_scalar(shape: str) -> bool:
  m = _ARRAY_LAYOUT.match(shape)
  return (not shape.startswith("(") and m is not None
          and all(d == "1" for d in m.group(2).split(",") if d))


def list_order(c: Computation, module: Module | None = None) -> list[str]:
  """ListMemoryScheduler's order (OpenXLA's ListScheduler): of the
  instructions whose operands are all scheduled, take the one with the
  highest priority, (bytes its operands' values free, those it reads last,
  less the bytes it defines; its users), an effective scalar first, and of
  equal ones the latest made ready (a std::multimap's last entry); a
  value's unscheduled uses count each reader once, and the root's values
  one use more (live out). Parameters and constants count no bytes."""
  vals = values(c, module)
  names = list(c.instructions)
  ordered_users: dict[str, list[str]] = {n: [] for n in names}
  successors: dict[str, list[str]] = {n: [] for n in names}
  for n in names:
    for o in dict.fromkeys(c.instructions[n].operands):
      if o in ordered_users:
        ordered_users[o].append(n)
    for p in c.instructions[n].control:
      if p in successors:
        successors[p].append(n)
  uses = {n: frozenset().union(*(vals.flat(o) for o in set(
      c.instructions[n].operands) if o in vals.at)) for n in names}
  unscheduled = dict.fromkeys(vals.sizes, 0)
  for n in names:
    for v in uses[n]:
      unscheduled[v] += 1
  for v in vals.flat(c.root):
    unscheduled[v] += 1
  ignored = {v for v in vals.sizes
             if c.instructions[v[0]].opcode in _IGNORED}
  defined = {n: 0 if c.instructions[n].opcode in _IGNORED
             else sum(vals.sizes[v] for v in vals.defined[n]) for n in names}
  waiting = {n: len(set(c.instructions[n].operands) & c.instructions.keys())
             + len(c.instructions[n].control) for n in names}

  def priority(n: str) -> tuple:
    if _effective_scalar(c.instructions[n].shape):
      return (math.inf, math.inf)
    freed = sum(vals.sizes[v] for v in uses[n]
                if v not in ignored and unscheduled[v] == 1)
    return (freed - defined[n], len(ordered_users[n]))

  ready: dict[str, tuple] = {}
  count = itertools.count()
  for n in names:
    if not waiting[n]:
      ready[n] = (priority(n), next(count))
  out: list[str] = []
  while ready:
    best = max(ready, key=ready.__getitem__)
    del ready[best]
    out.append(best)
    adjust = False
    for v in uses[best]:
      unscheduled[v] -= 1
      adjust |= unscheduled[v] == 1
    for u in ordered_users[best] + successors[best]:
      waiting[u] -= 1
      if not waiting[u]:
        ready[u] = (priority(u), next(count))
    if adjust:
      for o in c.instructions[best].operands:
        for u in ordered_users.get(o, ()):
          if u in ready and (p := priority(u)) != ready[u][0]:
            ready[u] = (p, next(count))
  return out


@dataclasses.dataclass(frozen=True)
class Replay:
  """XLA's order of a dumped module's entry computation beside the
  replayed schedules."""

  module: str
  xla: list[str]  # the order XLA kept
  list: list[str]
  dfs: list[str]
  post: list[str]
  computation: Computation  # as dumped before the pass
  hlo: Module  # the whole module as dumped before the pass

  def agreement(self, order: list[str]) -> int:
    """How many positions of `order` hold XLA's instruction."""
    return sum(a == b for a, b in zip(order, self.xla))


def pass_dumps(dump_dir: str) -> tuple[str, str]:
  """The module dumped before and after the memory scheduler's pass."""
  before = glob.glob(os.path.join(dump_dir, f"*.before_{PASS}*.txt"))
  after = glob.glob(os.path.join(dump_dir, f"*.after_{PASS}*.txt"))
  if len(before) != 1 or len(after) != 1:
    raise FileNotFoundError(
        f"{dump_dir!r} holds {len(before)} dumps before and {len(after)} "
        f"after the {PASS} pass, not one of each; compile with "
        "experiments.validate --dump_dir=DIR --dump_passes=memory-scheduler")
  return before[0], after[0]


def _read_dump(path: str, read):
  """`read` of the dump at `path`; a torn or foreign one's ValueError names
  the file."""
  with open(path) as f:
    text = f.read()
  try:
    return read(text)
  except ValueError as e:
    raise ValueError(f"{path}: {e}") from None


def replay(dump_dir: str) -> Replay:
  """Replays the list, DFS and post-order schedules on the module
  `dump_dir` holds (dumped before and after the scheduler's pass)."""
  before, after = pass_dumps(dump_dir)
  module = _read_dump(before, read_module)
  xla = list(_read_dump(after, read_entry).instructions)
  c = module.computations[module.entry]
  return Replay(os.path.basename(before).split(".")[1], xla,
                list_order(c, module), dfs_order(c), post_order(c), c, module)


def read_log(text: str) -> dict[str, int | str]:
  """libtpu's memory-scheduler log lines (`LOG_FLAG`): each schedule's heap
  in bytes ({"list": ..., "dfs": ..., "post order": ...}) and "chose": the
  one kept. Sizes as the log rounds them (three significant digits)."""
  out: dict[str, int | str] = {}
  for what, order, value, unit in _LOG.findall(text):
    order = order.replace("_", " ")
    if what == "Chose min-memory":
      out["chose"] = order
    else:
      out[order] = round(float(value) * _UNITS[unit])
  return out


def describe(r: Replay, min_bytes: int) -> str:
  """The replay for people: how much of XLA's order each replayed schedule
  gives, and the loops and buffers of `min_bytes` or more in XLA's order
  with their places in the replays."""
  n = len(r.xla)
  out = [f"{r.module}: {n} instructions in the entry computation, in the "
         "order XLA's memory scheduler kept",
         f"  list schedule replayed:  {r.agreement(r.list):5d} of {n} "
         "positions as XLA's (ties among small instructions follow an "
         "order the dump does not keep)",
         f"  DFS schedule replayed:   {r.agreement(r.dfs):5d} of {n} "
         "positions as XLA's",
         f"  post order replayed:     {r.agreement(r.post):5d} of {n}"]
  at = [{name: i for i, name in enumerate(o)}
        for o in (r.list, r.dfs, r.post)]
  out += [f"loops and buffers of {min_bytes / 2**20:g} MiB or more, in XLA's "
          "order (position in XLA's, the list, the DFS and the post order; "
          "GiB defined; instruction; its jax op):"]
  for i, name in enumerate(r.xla):
    ins = r.computation.instructions[name]
    size = defined_bytes(ins)
    if ins.opcode == "while" or (size >= min_bytes
                                 and ins.opcode not in _IGNORED):
      out.append(f"  {i:5d} " + " ".join(f"{o.get(name, -1):5d}" for o in at)
                 + f" {size / 2**30:8.3f}  {name:<28} {op_tail(ins.op_name, 60)}")
  return "\n".join(out)


def compiler_options(scheduler: str) -> dict[str, str]:
  """The compile option that makes libtpu run memory scheduler `scheduler`
  (none for its default)."""
  if scheduler not in SCHEDULERS:
    raise ValueError(f"memory scheduler {scheduler!r}: libtpu's are "
                     + ", ".join(SCHEDULERS))
  return {} if scheduler == "default" else {"xla_memory_scheduler": scheduler}


def request_log() -> None:
  """Asks libtpu to log its memory scheduler's estimates into its INFO log
  (`logged` reads them). It takes effect if libtpu has not loaded yet; a
  --vmodule already in LIBTPU_INIT_ARGS is kept as it is."""
  args = os.environ.get("LIBTPU_INIT_ARGS", "")
  if "--vmodule" not in args:
    os.environ["LIBTPU_INIT_ARGS"] = f"{args} {LOG_FLAG}".strip()


def request_gpu_log() -> None:
  """Asks XLA:GPU (the CUDA plugin) to log the same estimates and choice to
  stderr, where `stderr_logged` reads them: through TSL's environment
  (`GPU_LOG_ENV`), which the plugin reads once, as it loads with jax. So
  it holds for worker processes started from now on, and for this one only
  if it has not imported jax yet. A TF_CPP_VMODULE the user set is kept,
  and a minimum log level other than jax's own default (1, which jax sets
  as it is imported)."""
  os.environ.setdefault("TF_CPP_VMODULE", GPU_LOG_ENV["TF_CPP_VMODULE"])
  if os.environ.get("TF_CPP_MIN_LOG_LEVEL", "1") == "1":
    os.environ["TF_CPP_MIN_LOG_LEVEL"] = GPU_LOG_ENV["TF_CPP_MIN_LOG_LEVEL"]


def gpu_log_requested() -> bool:
  """Whether this process's XLA:GPU logs its memory scheduler's estimates
  (`request_gpu_log`, or the same environment set by hand)."""
  return ("hlo_memory_scheduler" in os.environ.get("TF_CPP_VMODULE", "")
          and os.environ.get("TF_CPP_MIN_LOG_LEVEL", "1") == "0")


@contextlib.contextmanager
def stderr_logged() -> Iterator[dict]:
  """Yields a dict that, after the block, holds `read_log` of what the
  block wrote to file descriptor 2 (XLA:GPU's log, `request_gpu_log`).
  Its INFO messages are dropped; everything else is written on to stderr
  after the block, so no warning or error is lost (`_not_info`)."""
  sys.stderr.flush()
  saved = os.dup(2)
  out: dict = {}
  with tempfile.TemporaryFile() as captured:
    os.dup2(captured.fileno(), 2)
    try:
      yield out
    finally:
      sys.stderr.flush()
      os.dup2(saved, 2)
      os.close(saved)
      captured.seek(0)
      text = captured.read().decode(errors="replace")
      out.update(read_log(text))
      rest = _not_info(text)
      if rest:
        os.write(2, rest.encode())


def _not_info(text: str) -> str:
  """`text` without its INFO messages: a line with absl's prefix (`I`,
  `W`, `E`, `F`, then month and day) starts a message, the lines up to the
  next one go with it (a ptxas warning logged at INFO runs on)."""
  kept, keep = [], True
  for line in text.splitlines(keepends=True):
    if _LOG_PREFIX.match(line):
      keep = not line.startswith("I")
    if keep:
      kept.append(line)
  return "".join(kept)


def _log_path() -> str | None:
  """libtpu's INFO log of this process (named with its pid), if any."""
  folder = os.environ.get("TPU_LOG_DIR", _LOG_DIR)
  found = glob.glob(os.path.join(glob.escape(folder),
                                 f"*.INFO.*.{os.getpid()}"))
  return max(found, key=os.path.getmtime) if found else None


@contextlib.contextmanager
def logged() -> Iterator[dict]:
  """Yields a dict that, after the block, holds `read_log` of what libtpu
  logged during it (empty where it logged no estimates)."""
  path = _log_path()
  start = os.path.getsize(path) if path else 0
  out: dict = {}
  try:
    yield out
  finally:
    now = _log_path()
    if now:
      with open(now, errors="replace") as f:
        f.seek(start if now == path else 0)
        out.update(read_log(f.read()))


def label(scheduler: str) -> str:
  """A schedule's name for people: list, DFS, post-order."""
  return _NAMES.get(scheduler.replace("_", " "), scheduler)


def replayed_summary(replayed: dict[str, int], against: int,
                     what: str = "the compiled peak") -> str:
  """Each schedule's replayed heap (simulator.xla.heap_replay) in one line
  of GiB, and the scheduler to force where one is under `against` bytes
  (`what`)."""
  line = ", ".join(f"{label(k)} {v / 2**30:.3f}" for k, v in replayed.items())
  smallest = min(replayed, key=replayed.__getitem__)
  if replayed[smallest] >= against:
    return f"{line} GiB"
  return (f"{line} GiB; the {label(smallest)} schedule's is "
          f"{(against - replayed[smallest]) / 2**30:.3f} GiB under {what} "
          f"(an estimate, as libtpu's: --memory_scheduler={smallest} "
          "compiles that schedule)")


def summary(log: dict) -> str:
  """XLA's estimates (libtpu's or XLA:GPU's) and its choice, in one line of GiB."""
  sizes = ", ".join(f"{_NAMES[k]} {log[k] / 2**30:.3f}"
                    for k in _NAMES if k in log)
  return (f"{sizes} GiB; kept the "
          f"{_NAMES.get(str(log.get('chose')), '?')} schedule")
