"""The heap of a dumped module run in one of XLA's memory schedules: OpenXLA's
HeapSimulator::MinimumMemoryForModule (no fragmentation) replayed on the
module dumped before libtpu's memory-scheduler pass.

DefaultMemoryScheduler keeps whichever of its list, DFS and post-order
schedules that simulation finds smallest (simulator.xla.memory_scheduler).
`peak` orders every computation the way one scheduler would (the entry and
each loop body, condition and called computation; fusions are not
scheduled), runs the whole module as one sequence, a loop's condition and
body where the loop runs, and sums the buffers live at each step:

- a buffer is what XLA's alias analysis makes one: a loop's initial value,
  its body's parameter and result element and its own result element
  share one; so do a called computation's parameters and root with the
  call's operands and result; a fusion that updates a parameter in place (a
  dynamic-update-slice or scatter of it at its root) writes into that
  operand's buffer, as does a dynamic-update-slice outside a fusion;
- it is live from the first value it holds to its last use; a
  get-tuple-element or a tuple does not use the elements it forwards (only
  a get-tuple-element's read of the tuple's index table), a loop and a call
  use all of their operand;
- the entry's parameters are live from the start to their last use, the
  entry's result to the end; constants take no heap.

Checked against libtpu's own logged estimates and against compiles forced to
one scheduler (`--memory_scheduler`): README, "Each schedule's heap
replayed, and libtpu's scheduler forced".
"""

from __future__ import annotations

import dataclasses

from simulator.xla import memory_scheduler as ms

# libtpu's scheduler names (memory_scheduler.SCHEDULERS) this replays.
ORDERS = {"list": ms.list_order, "dfs": lambda c, m: ms.dfs_order(c),
          "post_order": lambda c, m: ms.post_order(c)}
_LOOP_PARTS = ("condition", "body")  # in the order the sequence runs them


@dataclasses.dataclass(frozen=True)
class Buffer:
  instruction: str  # the instruction that first defines one of its values
  bytes: int
  start: int  # step in the module's sequence
  end: int


@dataclasses.dataclass(frozen=True)
class Peak:
  scheduler: str
  bytes: int
  step: int
  instruction: str  # what runs at the peak
  live: tuple[Buffer, ...]  # largest first


class _Buffers:
  """Union-find over values: the buffers alias analysis makes."""

  def __init__(self):
    self.parent: dict = {}
    self.size: dict = {}

  def add(self, v, size: int) -> None:
    self.parent.setdefault(v, v)
    self.size[v] = max(self.size.get(v, 0), size)

  def find(self, v):
    while self.parent[v] != v:
      self.parent[v] = self.parent[self.parent[v]]
      v = self.parent[v]
    return v

  def union(self, a, b) -> None:
    a, b = self.find(a), self.find(b)
    if a != b:
      self.parent[b] = a
      self.size[a] = max(self.size[a], self.size[b])

  def share(self, mine, theirs) -> None:
    """Element by element, each of `mine`'s values one buffer with each of
    `theirs`' (lists of sets of values)."""
    for a_set, b_set in zip(mine, theirs):
      for a in a_set:
        for b in b_set:
          self.union(a, b)


def _in_place(module: ms.Module, i: ms.Instruction) -> dict[int, int]:
  """{result element (0 for an array): operand} an instruction updates in
  place: a dynamic-update-slice, or a fusion whose root (or root tuple's
  element) is a dynamic-update-slice or scatter of one of its parameters."""
  if i.opcode == "dynamic-update-slice":
    return {0: 0}
  fused = module.computations.get(i.attribute("calls") or "")
  if i.opcode != "fusion" or fused is None:
    return {}

  def parameter(name: str) -> int | None:
    x = fused.instructions[name]
    while x.opcode in ("bitcast", "reshape") and x.operands:
      x = fused.instructions[x.operands[0]]
    return x.number if x.opcode == "parameter" else None

  root = fused.instructions[fused.root]
  elements = ([fused.instructions[o] for o in root.operands]
              if root.opcode == "tuple" else [root])
  out = {}
  for k, x in enumerate(elements):
    if x.opcode in ("dynamic-update-slice", "scatter"):
      p = parameter(x.operands[0])
      if p is not None:
        out[k] = p
  return out


def peak(module: ms.Module, scheduler: str, top: int = 12) -> Peak:
  """The heap of `module` in `scheduler`'s order (ORDERS), no
  fragmentation: its largest size, where, and the `top` largest buffers
  live there."""
  order = ORDERS[scheduler]
  bufs = _Buffers()
  vals: dict[str, ms.Values] = {}
  sequence: list[tuple[str, str]] = []  # (computation, instruction)

  def run(name: str, params: list | None) -> None:
    """Values, aliasing and the sequence of computation `name`, its
    parameters holding `params` (per parameter: per element, values)."""
    c = module.computations[name]
    v = vals[name] = ms.values(c, module)
    for value, size in v.sizes.items():
      bufs.add((name, value), size if c.instructions[value[0]].opcode
               != "constant" else 0)
    held = lambda comp, elements: [{(comp, x) for x in e}  # noqa: E731
                                   for e in elements]
    for n in order(c, module):
      i = c.instructions[n]
      mine = held(name, v.at[n])
      if i.opcode == "parameter" and params is not None:
        bufs.share(mine, params[i.number])
      operands = [held(name, v.at[o]) for o in i.operands if o in v.at]
      callees = ([i.attribute(p) for p in _LOOP_PARTS] if i.opcode == "while"
                 else [i.attribute("to_apply")] if i.opcode == "call" else [])
      for callee in filter(None, callees):
        run(callee, [operands[0]] if i.opcode == "while" else operands)
        if i.opcode == "call" or callee == i.attribute("body"):
          bufs.share(mine, held(callee, vals[callee].at[
              module.computations[callee].root]))
      if i.opcode == "while":
        bufs.share(mine, operands[0])
      for k, o in _in_place(module, i).items():
        if k < len(mine) and o < len(operands):
          bufs.share([mine[k]], [set().union(*operands[o])])
      sequence.append((name, n))

  run(module.entry, None)
  start: dict = {}
  end: dict = {}
  first: dict = {}  # buffer -> the instruction that first holds it
  for step, (name, n) in enumerate(sequence):
    i = module.computations[name].instructions[n]
    v = vals[name]
    for value in v.flat(n):
      b = bufs.find((name, value))
      start.setdefault(b, step)
      first.setdefault(b, n)
      end[b] = max(end.get(b, step), step)
    if i.opcode == "tuple":
      continue  # forwards its operands' values, reads none
    for o in set(i.operands):
      if o not in v.at:
        continue
      used = ({x for x in v.defined[o] if x[1] == -1}
              if i.opcode == "get-tuple-element" else v.flat(o))
      for value in used:
        b = bufs.find((name, value))
        start.setdefault(b, step)
        first.setdefault(b, o)
        end[b] = max(end.get(b, step), step)
  last = len(sequence)
  entry = module.computations[module.entry]
  for value in vals[module.entry].flat(entry.root):
    end[bufs.find((module.entry, value))] = last
  for n, i in entry.instructions.items():
    if i.opcode == "parameter":
      for value in vals[module.entry].flat(n):
        start[bufs.find((module.entry, value))] = 0
  delta = [0] * (last + 2)
  for b, s in start.items():
    delta[s] += bufs.size[b]
    delta[end[b] + 1] -= bufs.size[b]
  live = best = at = 0
  for step in range(last + 1):
    live += delta[step]
    if live > best:
      best, at = live, step
  held = sorted((Buffer(first[b], bufs.size[b], start[b], end[b])
                 for b in start if start[b] <= at <= end[b] and bufs.size[b]),
                key=lambda x: -x.bytes)
  return Peak(scheduler, best, at, sequence[min(at, last - 1)][1],
              tuple(held[:top]))


def peaks(module: ms.Module) -> dict[str, Peak]:
  """Each of DefaultMemoryScheduler's three schedules' heap."""
  return {s: peak(module, s) for s in ORDERS}
