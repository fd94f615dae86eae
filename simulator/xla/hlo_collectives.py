"""Collectives read off a compiled (post-SPMD-partitioning) HLO module's text.

For each all-gather / all-reduce / reduce-scatter / all-to-all / collective-permute
(sync or async `-start` form, also inside fusions such as TPU's
`all-reduce-scatter` kCustom fusions) this lists:

  kind          the HLO op, without "-start"
  axes          the mesh axes its replica groups span, e.g. ("X",), ("Y",), ("X","Y"),
                or () when the groups are trivial; None when they match no axis subset
  in_bytes      per-device operand bytes (logical shapes, no layout padding)
  out_bytes     per-device result bytes
  count         how many times it runs per step: the product of the trip counts of the
                while loops (the scan over layers) that contain it

Replica groups come in three spellings, all handled: explicit `{{0,1},{2,3}}`, iota
`[2,4]<=[4,2]T(1,0)`, and mesh-style `mesh['axis_0'=4,'axis_1'=2] {'axis_0'}` (with
`device_ids=(...)` where XLA's mesh lists the devices in another order). With
`use_global_device_ids` the ids are positions in the flattened mesh (the device
assignment), not `device.id`, so axes are recovered from mesh coordinates.

Trip counts: XLA's text does not always carry `known_trip_count`; the largest integer
constant in the loop's condition computation is used (the scan length), and
`trip_count_known` says when neither was found (count then assumes 1).

One collective, listed once: libtpu's multi-step async collective fusion
(--xla_tpu_enable_async_collective_fusion_multiple_steps) clones a collective
into its start, its compute-overlapped update fusions and its done fusion,
each copy with the collective's `channel_id` and shapes, while the data moves
once. In qwen2-0.5b v5e-8 8x1 b16 s4096 dots (validation corpus #128), the
MLP weight's gather channel_id=54 sits in async-collective-start.6,
fusion.508, async-collective-done.6 and fusion.513's computations: counted
four times, the step's all-gathers read 4.31 GiB per device against the
traced program's 1.84; once, 1.91. A step may sit in a loop the
collective's start is outside: in mistral_7b v5e-64 64x1 s4096 (#133) the
attention output weight's gather (channel_id=48) has a step in
fusion.608, inside the flash attention's loop over 8 key blocks, run 256
times a step where its start runs 32 (once a layer): counted at each
copy's own runs, the step's all-gathers read 49.5 GiB against the traced
program's 26.5. Copies inside fusions' computations that share a channel
id, kind and shapes are one collective, run as often as the copy run
least (none where one such collective sits outside a fusion). Not so
libtpu's all-reduce-scatter fusions (an all-reduce and, as root, this
device's slice of it): each is a whole reduce-scatter, and under host
offload XLA peels a layer loop's first iteration into the step with its
collectives' channel ids (#288), so each copy is counted at its runs.
Collectives XLA runs on the host (MegaScale): an all-gather of values in
host memory, the NF4 codes of a QLoRA base kept there (--offload=params),
is not an `all-gather` op but custom-calls `MegaScaleCollectiveInputStart`
(this device's part as operand) and `MegaScaleCollectiveOutputStart` (the
gathered result), paired by their `_xla_host_transfer_rendezvous` and
typed by `_xla_megascale_transfer_type` (ALL_GATHER), with the group as
`_xla_megascale_target` of device ids offset by 100000. llama2_7b v5p-8
4x1 QLoRA nf4 --offload=params (corpus #70): 81 of them, u8[1,1024,5504]
in and u8[1,4096,5504] out for an MLP code slice, in the host
computations the layer loops call; the step's all-gathers read 0.52 GiB
without them against the traced program's 6.74.
Multi-slice (data-parallel replicas D across TPU slices): the optimized
module is one slice's (`num_partitions` the slice's devices, against the
mesh's before SPMD partitioning), its replica groups that slice's device
positions, read against the mesh without D; the sums over D are host
transfers, a `send` (with its `recv`) of `is_host_transfer=true`,
`_xla_megascale_transfer_type="ALL_REDUCE"`, carrying this device's part:
each send is one all-reduce over D of its shape's bytes (qwen2-0.5b
v5e-16x2 D2x16x1: README, "Data-parallel replicas").
Collectives outside fusions are each their own, channel ids alike: a
shard_map with every mesh axis manual gives its collectives channel_id=1,
the forward's permute and its transpose's in the backward loop alike (gpt2
v5p-8 P4x1x1, corpus #87: collective-permute-start.1 and
collective-permute-start, each run 11 times).
"""

from __future__ import annotations

import collections
import dataclasses
import itertools
import math
import re
from typing import Iterable, Sequence

import numpy as np

from meshes.layout import REPLICA_AXIS

KINDS = ("all-gather", "all-reduce", "reduce-scatter", "all-to-all",
         "collective-permute", "ragged-all-to-all")
DTYPE_BYTES = {
    "pred": 1, "s4": 0.5, "u4": 0.5, "s8": 1, "u8": 1, "s16": 2, "u16": 2, "s32": 4,
    "u32": 4, "s64": 8, "u64": 8, "f8e4m3fn": 1, "f8e5m2": 1, "f8e4m3": 1,
    "f8e4m3fnuz": 1, "f8e5m2fnuz": 1, "bf16": 2, "f16": 2, "f32": 4, "f64": 8,
    "c64": 8, "c128": 16, "token": 0,
}
_ARRAY = re.compile(r"\b([a-z][a-z0-9]*)\[([0-9,]*)\]")
_HEADER = re.compile(r"^(?:ENTRY\s+)?%?([\w.\-]+)\s*\(.*\)\s*->\s*.*\{\s*$")
INSTRUCTION = re.compile(r"^\s*(?:ROOT\s+)?%?([\w.\-]+)\s*=\s*(.*?)\s+([a-z][a-z0-9\-]*)\((.*)$")
_OP_KIND = re.compile(r"^(" + "|".join(KINDS) + r")(-start)?$")
# MegaScale's host-side collectives (see the module docstring).
_MEGASCALE = re.compile(r'custom_call_target="MegaScaleCollective(Input|Output)'
                        r'Start".*?_xla_host_transfer_rendezvous="([^"]+)"')
_MEGASCALE_KINDS = {"ALL_GATHER": "all-gather"}  # the one type seen (#70)
MEGASCALE_ID_OFFSET = 100000  # _xla_megascale_target's device ids (#70)
_DCN_SUM = '_xla_megascale_transfer_type="ALL_REDUCE"'  # a multi-slice sum


@dataclasses.dataclass(frozen=True)
class HloCollective:
  kind: str
  axes: tuple[str, ...] | None
  in_bytes: int
  out_bytes: int
  count: int
  name: str
  computation: str
  groups: str  # the replica_groups / source_target_pairs text, for humans

  @property
  def total_out_bytes(self) -> int:
    return self.out_bytes * self.count

  @property
  def total_in_bytes(self) -> int:
    return self.in_bytes * self.count


def shape_bytes(text: str) -> int:
  """Bytes of every array shape in `text` (a shape or a tuple of shapes)."""
  total = 0.0
  for dtype, dims in _ARRAY.findall(text):
    if dtype not in DTYPE_BYTES:
      continue
    n = math.prod(int(d) for d in dims.split(",") if d) if dims else 1
    total += n * DTYPE_BYTES[dtype]
  return int(total)


def computations(text: str) -> dict[str, list[str]]:
  comps: dict[str, list[str]] = {}
  current = None
  for line in text.splitlines():
    if current is None:
      m = _HEADER.match(line)
      if m:
        current = m.group(1)
        comps[current] = [line]
      continue
    if line.startswith("}"):  # "}" or, for a host computation under
      # offload, '}, execution_thread="host"'
      current = None
      continue
    comps[current].append(line)
  return comps


def entry_name(text: str) -> str | None:
  m = re.search(r"^ENTRY\s+%?([\w.\-]+)", text, re.M)
  return m.group(1) if m else None


def _trip_count(line: str, comps: dict[str, list[str]]) -> tuple[int, bool]:
  m = re.search(r'known_trip_count"?\s*[:=]\s*\{\s*"?n"?\s*[:=]\s*"?(\d+)', line)
  if m:
    return int(m.group(1)), True
  cond = re.search(r"condition=%?([\w.\-]+)", line)
  if cond and cond.group(1) in comps:
    consts = [int(c) for l in comps[cond.group(1)]
              for c in re.findall(r"[su]32\[\]\S*\s+constant\((\d+)\)", l)]
    if consts:
      return max(consts), True
  return 1, False


def _multipliers(text: str, comps: dict[str, list[str]]) -> tuple[dict[str, int], bool]:
  """How many times each computation runs per execution of the entry."""
  calls: dict[str, list[tuple[str, int]]] = collections.defaultdict(list)
  known = True
  for name, lines in comps.items():
    for line in lines[1:]:
      if " while(" in line:
        n, ok = _trip_count(line, comps)
        known &= ok
        body = re.search(r"body=%?([\w.\-]+)", line)
        cond = re.search(r"condition=%?([\w.\-]+)", line)
        if body:
          calls[name].append((body.group(1), n))
        if cond:
          calls[name].append((cond.group(1), n + 1))
        continue
      for key in ("calls", "to_apply", "true_computation", "false_computation"):
        for callee in re.findall(key + r"=%?([\w.\-]+)", line):
          calls[name].append((callee, 1))
      # called_computations: what a HostExecute custom-call runs on the host
      for key in ("branch_computations", "called_computations"):
        listed = re.search(key + r"=\{([^}]*)\}", line)
        if listed:
          for callee in re.findall(r"%?([\w.\-]+)", listed.group(1)):
            calls[name].append((callee, 1))
  entry = entry_name(text)
  mult: dict[str, int] = collections.defaultdict(int)
  if entry is None:
    return {n: 1 for n in comps}, known
  # Computations form a DAG; accumulate in topological order from the entry.
  order, seen = [], set()

  def visit(n):
    if n in seen:
      return
    seen.add(n)
    for callee, _ in calls.get(n, ()):
      visit(callee)
    order.append(n)

  visit(entry)
  mult[entry] = 1
  for n in reversed(order):
    for callee, k in calls.get(n, ()):
      mult[callee] += mult[n] * k
  return dict(mult), known


def _iota_groups(spec: str) -> list[list[int]] | None:
  m = re.match(r"\[([\d,]+)\]<=\[([\d,]+)\](?:T\(([\d,]+)\))?", spec)
  if not m:
    return None
  out_shape = [int(d) for d in m.group(1).split(",")]
  src = [int(d) for d in m.group(2).split(",")]
  ids = np.arange(math.prod(src)).reshape(src)
  if m.group(3):
    ids = ids.transpose([int(d) for d in m.group(3).split(",")])
  return ids.reshape(out_shape).reshape(-1, out_shape[-1]).tolist()


def _mesh_device_ids(spec: str | None, n: int) -> np.ndarray | None:
  """The device at each position of XLA's mesh, flattened: its order unless
  `device_ids=(...)` names another, an iota `[4,2]T(1,0)` or a list (XLA:GPU
  writes `mesh['axis_0'=2,'axis_1'=4], device_ids=([4,2]T(1,0)) {'axis_0'}`
  for the Y of a 4x2 plan: gpt2 h100:8 4x2 b8, GPU corpus #75)."""
  if not spec:
    return np.arange(n)
  m = re.fullmatch(r"\[([\d,]+)\](?:T\(([\d,]+)\))?", spec.strip())
  if m:
    ids = np.arange(n).reshape([int(d) for d in m.group(1).split(",")])
    if m.group(2):
      ids = ids.transpose([int(d) for d in m.group(2).split(",")])
    return ids.reshape(-1)
  if re.fullmatch(r"[\d,\s]+", spec):
    ids = np.array([int(d) for d in spec.split(",") if d.strip()])
    return ids if sorted(ids.tolist()) == list(range(n)) else None
  return None


def _axes_of_groups(groups: Sequence[Sequence[int]], mesh_shape: Sequence[int],
                    axis_names: Sequence[str]) -> tuple[str, ...] | None:
  n = math.prod(mesh_shape)
  if not groups:  # {} : one group of every device
    return tuple(a for a, s in zip(axis_names, mesh_shape) if s > 1)
  if all(len(g) <= 1 for g in groups):
    return ()
  ids = np.arange(n).reshape(mesh_shape)
  target = sorted(sorted(g) for g in groups)
  for r in range(1, len(mesh_shape) + 1):
    for axes in itertools.combinations(range(len(mesh_shape)), r):
      rest = [a for a in range(len(mesh_shape)) if a not in axes]
      moved = ids.transpose(rest + list(axes)).reshape(-1, math.prod(
          mesh_shape[a] for a in axes))
      if sorted(sorted(g) for g in moved.tolist()) == target:
        return tuple(axis_names[a] for a in axes)
  return None


def _axes_of_pairs(pairs: Sequence[tuple[int, int]], mesh_shape: Sequence[int],
                   axis_names: Sequence[str]) -> tuple[str, ...] | None:
  differ = set()
  for s, t in pairs:
    if max(s, t) >= math.prod(mesh_shape):
      return None
    cs, ct = np.unravel_index(s, mesh_shape), np.unravel_index(t, mesh_shape)
    differ |= {a for a in range(len(mesh_shape)) if cs[a] != ct[a]}
  return tuple(axis_names[a] for a in sorted(differ))


def _groups_and_axes(line: str, mesh_shape, axis_names):
  m = re.search(r"replica_groups=mesh\[([^\]]*)\]"
                r"(?:,\s*device_ids=\(([^)]*\)?)\))?\s*\{([^}]*)\}", line)
  if m:  # XLA's own mesh, whose axes need not be ours (32 for D2x16x1)
    named = re.findall(r"'(\w+)'\s*=\s*(\d+)", m.group(1))
    names, sizes = [n for n, _ in named], [int(v) for _, v in named]
    chosen = re.findall(r"'(\w+)'", m.group(3))
    idx = sorted(names.index(c) for c in chosen if c in names)
    ids = _mesh_device_ids(m.group(2), math.prod(sizes))
    if math.prod(sizes) != math.prod(mesh_shape) or ids is None:
      return m.group(0), None
    rest = [i for i in range(len(sizes)) if i not in idx]
    groups = ids.reshape(sizes).transpose(
        rest + idx).reshape(-1, math.prod(sizes[i] for i in idx)).tolist()
    return m.group(0), _axes_of_groups(groups, mesh_shape, axis_names)
  m = re.search(r"replica_groups=(\[[\d,]+\]<=\[[\d,]+\](?:T\([\d,]+\))?)", line)
  if m:
    groups = _iota_groups(m.group(1))
    return m.group(1), _axes_of_groups(groups, mesh_shape, axis_names)
  m = re.search(r"replica_groups=\{((?:\{[\d,]*\},?)*)\}", line)
  if m:
    groups = [[int(x) for x in g.split(",") if x]
              for g in re.findall(r"\{([\d,]*)\}", m.group(1))]
    return "{" + m.group(1) + "}", _axes_of_groups(groups, mesh_shape, axis_names)
  m = re.search(r"source_target_pairs=\{((?:\{\d+,\d+\},?)*)\}", line)
  if m:
    pairs = [(int(a), int(b)) for a, b in re.findall(r"\{(\d+),(\d+)\}", m.group(1))]
    return "{" + m.group(1) + "}", _axes_of_pairs(pairs, mesh_shape, axis_names)
  return "", None


def parse_collectives(hlo_text: str, mesh_shape: Sequence[int],
                      axis_names: Sequence[str] = ("X", "Y")
                      ) -> tuple[list[HloCollective], bool]:
  """(collectives, trip_counts_known) for a compiled module's `as_text()`."""
  comps = computations(hlo_text)
  mult, known = _multipliers(hlo_text, comps)
  fused = _fused(comps)
  dcn_axes = (REPLICA_AXIS,) if REPLICA_AXIS in axis_names else None
  mesh_shape, axis_names = _slice_mesh(hlo_text, mesh_shape, axis_names)
  out = []
  cloned: dict = {}  # (channel, kind, shapes) -> its fused copy run least
  direct: set = set()  # the keys of the collectives outside fusions
  for comp, lines in comps.items():
    shapes: dict[str, str] = {}
    header = lines[0]
    for pname, pshape in re.findall(r"([\w.\-]+):\s*((?:\([^)]*\))|[a-z0-9]+\[[\d,]*\])",
                                    header):
      shapes[pname] = pshape
    host_inputs = {ms.group(2): shape_bytes(m.group(2)) for line in lines[1:]
                   if (ms := _MEGASCALE.search(line)) and ms.group(1) == "Input"
                   and (m := INSTRUCTION.match(line))}
    for line in lines[1:]:
      m = INSTRUCTION.match(line)
      if not m:
        continue
      name, result, op, rest = m.groups()
      shapes[name] = result
      ms = _MEGASCALE.search(rest) if op == "custom-call" else None
      if ms and ms.group(1) == "Output":
        host = _megascale(line, result, host_inputs.get(ms.group(2), 0),
                          max(mult.get(comp, 1), 1), name, comp,
                          list(mesh_shape), list(axis_names))
        out += [host] if host else []
        continue
      if op == "send" and _DCN_SUM in rest:
        sent = shape_bytes(_ARRAY.search(result).group(0))
        out.append(HloCollective("all-reduce", dcn_axes, sent, sent,
                                 max(mult.get(comp, 1), 1), name, comp, "DCN"))
        continue
      km = _OP_KIND.match(op)
      if not km:
        continue
      operands = re.findall(r"%([\w.\-]+)", rest.split(")", 1)[0])
      in_bytes = sum(shape_bytes(shapes.get(o, "")) for o in operands)
      out_bytes = shape_bytes(result)
      if km.group(2):  # async start: result tuple is (operands..., outputs..., ctx)
        ctx = sum(shape_bytes(t) for t in re.findall(r"[us]32\[\]", result))
        out_bytes = max(out_bytes - in_bytes - ctx, 0) or in_bytes
      count = max(mult.get(comp, 1), 1)
      groups, axes = _groups_and_axes(line, list(mesh_shape), list(axis_names))
      if km.group(1) == "collective-permute" and axes == ():
        # it sends nothing: no pairs, or each device to itself (XLA:GPU's
        # `source_target_pairs={}` in GPU corpus #142's layer loop)
        continue
      c = HloCollective(km.group(1), axes, in_bytes, out_bytes, count, name,
                        comp, groups)
      channel = re.search(r"channel_id=(\d+)", rest)
      key = channel and (channel.group(1), km.group(1), in_bytes, out_bytes)
      if key and comp in fused:  # maybe one step of a multi-step fusion
        if key not in cloned or count < cloned[key].count:
          cloned[key] = c  # the step run least: the collective's own runs
      else:
        out.append(c)
        if key:
          direct.add(key)
  return out + [c for k, c in cloned.items() if k not in direct], known


def _slice_mesh(hlo_text: str, mesh_shape: Sequence[int],
                axis_names: Sequence[str]
                ) -> tuple[Sequence[int], Sequence[str]]:
  """The mesh a multi-slice module's replica groups index: without D where
  the module is one slice's, D of them (see the module docstring)."""
  m = re.search(r"num_partitions=(\d+)", hlo_text[:hlo_text.find("\n")])
  if (m and axis_names and axis_names[0] == REPLICA_AXIS
      and int(m.group(1)) * mesh_shape[0] == math.prod(mesh_shape)):
    return mesh_shape[1:], axis_names[1:]
  return mesh_shape, axis_names


def _megascale(line: str, result: str, in_bytes: int, count: int, name: str,
               comp: str, mesh_shape: list[int], axis_names: list[str]
               ) -> HloCollective | None:
  """A MegaScale host collective's OutputStart as one collective (the module
  docstring), or None for a transfer type that is no collective here."""
  kind = re.search(r'_xla_megascale_transfer_type="(\w+)"', line)
  kind = kind and _MEGASCALE_KINDS.get(kind.group(1))
  if not kind:
    return None
  target = re.search(r"_xla_megascale_target=\{((?:\{[\d,]*\},?)*)\}", line)
  groups = [[int(x) - MEGASCALE_ID_OFFSET for x in g.split(",") if x]
            for g in re.findall(r"\{([\d,]*)\}", target.group(1))
            ] if target else []
  axes = (_axes_of_groups(groups, mesh_shape, axis_names)
          if all(0 <= i < math.prod(mesh_shape) for g in groups for i in g)
          else None)
  return HloCollective(kind, axes, in_bytes, shape_bytes(result), count, name,
                       comp, target.group(0) if target else "")


def _fused(comps: dict[str, list[str]]) -> set[str]:
  """The computations fusions call, and what those call in turn: where
  libtpu's multi-step collective fusion puts its copies of a collective."""
  callees = {name: [c for line in lines[1:] for c in
                    re.findall(r"(?:calls|to_apply)=%?([\w.\-]+)", line)]
             for name, lines in comps.items()}
  todo = [c for lines in comps.values() for line in lines[1:]
          if (m := INSTRUCTION.match(line)) and m.group(3) == "fusion"
          for c in re.findall(r"calls=%?([\w.\-]+)", line)]
  fused: set[str] = set()
  while todo:
    name = todo.pop()
    if name not in fused and not _whole_reduce_scatter(comps.get(name, [])):
      fused.add(name)
      todo += callees.get(name, [])
  return fused


def _whole_reduce_scatter(lines: list[str]) -> bool:
  """A fused computation that is a whole reduce-scatter (libtpu's
  all-reduce-scatter fusion: an all-reduce and, as its root, this device's
  slice of it), not a step of a multi-step collective: each copy of it
  runs, so copies sharing a channel id are each counted. Under host
  offload XLA peels a layer loop's first iteration into the step with its
  collectives' channel ids (#288: channel 31's all-reduce-scatter, 31 runs
  in the backward loop and 1 peeled)."""
  root = next((l for l in lines[1:] if l.lstrip().startswith("ROOT ")), "")
  m = INSTRUCTION.match(root)
  if not m or m.group(3) != "dynamic-slice":
    return False
  operand = re.findall(r"%([\w.\-]+)", m.group(4))[:1]
  return bool(operand) and any(
      (i := INSTRUCTION.match(l)) and i.group(1) == operand[0]
      and i.group(3).startswith("all-reduce") for l in lines[1:])


def summarize(collectives: Iterable[HloCollective]) -> dict[str, dict[str, int]]:
  """{"all-gather@X": {"ops": n, "count": runs, "out_bytes": per-step bytes}, ...}."""
  table: dict[str, dict[str, int]] = {}
  for c in collectives:
    axes = "?" if c.axes is None else ("+".join(c.axes) or "-")
    row = table.setdefault(f"{c.kind}@{axes}", {"ops": 0, "count": 0,
                                                 "in_bytes": 0, "out_bytes": 0})
    row["ops"] += 1
    row["count"] += c.count
    row["in_bytes"] += c.total_in_bytes
    row["out_bytes"] += c.total_out_bytes
  return dict(sorted(table.items()))
