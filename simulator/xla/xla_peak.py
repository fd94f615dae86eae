"""What XLA holds at its memory peak, read off the compiler's own dumps.

memory_analysis() gives one number; to explain a gap between it and the
symbolic estimate we need the buffers behind it. The TPU compiler dumps, next
to the optimized module (`*after_optimizations.txt`):

  *-buffer-assignment.txt  every HLO value's allocation, offset and size;
  *-live-range.txt         the schedule and every value's live range
                           (`name{index}:start-end`, in schedule positions).

Bytes in use at a position = per allocation, the union of the [offset,
offset+size) ranges of its values live there (values aliasing one buffer, a
while loop's tuple and its body's parameter, share offsets and count once).
Thread-local and non-default memory-space ("color") allocations are not HBM
and are left out; memory space 1 is the on-chip VMEM, where the compiler's
memory-space assignment may keep whole buffers (on v5e the output layer's
gathered weight and f32 gradient), so they never take HBM: `vmem_bytes` and
`vmem_buffers` say what went there. The maximum over the schedule reproduces
memory_analysis().peak_memory_in_bytes on TPU (checked: llama2_7b v5p-16 8x1,
9,775,129,600 B both ways), so the buffers live there are what the peak is.
"""

from __future__ import annotations

import dataclasses
import glob
import os
import re

_ALLOCATION = re.compile(r"allocation (\d+): size (\d+),(.*)")
_VALUE = re.compile(r" value: <\d+ ([\w.\-]+)(\{[\d,]*\})?(?: \(phi\))? @\d+> "
                    r"\(size=(\d+),offset=(\d+)\): (\S+)")
_RANGE = re.compile(r"\s*([\w.\-]+)(\{[\d,]*\}):(\d+)-(\d+)")
_INSTRUCTION = re.compile(r"\s*(?:ROOT )?%?([\w.\-]+) = ")
_OP_NAME = re.compile(r'op_name="([^"]*)"')


@dataclasses.dataclass(frozen=True)
class LiveBuffer:
  bytes: int
  value: str  # HLO value, name{tuple index}
  shape: str  # HLO shape with layout
  op_name: str  # the JAX op (or argument path) that made it
  argument: bool  # an entry parameter (params, optimizer state, batch)


@dataclasses.dataclass(frozen=True)
class XlaPeak:
  peak_bytes: int
  position: int  # in the schedule
  instruction: str  # scheduled there
  buffers: tuple[LiveBuffer, ...]  # largest first
  vmem_bytes: int = 0  # the on-chip VMEM scratch allocation (memory space 1)
  vmem_buffers: tuple[LiveBuffer, ...] = ()  # the largest placed there


def dump_file(dump_dir: str, module: str, suffix: str) -> str | None:
  """The newest file the compiler dumped for the HLO module named `module`
  (the lowered program's own name, e.g. "jit_step"), ending in `suffix`;
  files are named module_NNNN.<module>.<...>.<suffix>."""
  found = glob.glob(os.path.join(dump_dir, f"module_*.{glob.escape(module)}.*"
                                 f"{glob.escape(suffix)}"))
  return max(found, key=os.path.getmtime) if found else None


def _files(dump_dir: str, module: str) -> tuple[str, str, str] | None:
  # TPU: <module>.after_optimizations-..., GPU: <module>.sm_9.0a_gpu_after_...
  assignment = dump_file(dump_dir, module,
                         "after_optimizations-buffer-assignment.txt")
  if assignment is None:
    return None
  stem = assignment[:-len("-buffer-assignment.txt")]
  live, hlo = stem + "-live-range.txt", stem + ".txt"
  if not (os.path.exists(live) and os.path.exists(hlo)):
    return None
  return assignment, live, hlo


def _op_names(hlo_path: str) -> dict[str, str]:
  out = {}
  with open(hlo_path) as f:
    for line in f:
      m = _INSTRUCTION.match(line)
      if m:
        op = _OP_NAME.search(line)
        out[m.group(1)] = op.group(1) if op else ""
  return out


_VMEM = "color 1,"


def _values(assignment_path: str) -> tuple[dict, dict, int, dict]:
  """HBM values, VMEM values (value -> (allocation, offset, size, is an entry
  parameter, shape)), the VMEM allocation's size, and the HBM entry-parameter
  allocations' sizes (allocation -> bytes)."""
  hbm, vmem, vmem_size, parameters = {}, {}, 0, {}
  into = None
  with open(assignment_path) as f:
    for line in f:
      m = _ALLOCATION.match(line)
      if m:
        header = m.group(3)
        number, parameter = int(m.group(1)), " parameter " in header
        if _VMEM in header:
          into, vmem_size = vmem, vmem_size + int(m.group(2))
        elif "color" in header or "thread-local" in header:
          into = None
        else:
          into = hbm
          if parameter:
            parameters[number] = int(m.group(2))
        continue
      m = _VALUE.match(line)
      if m and into is not None:
        into[m.group(1) + (m.group(2) or "{}")] = (
            number, int(m.group(4)), int(m.group(3)), parameter, m.group(5))
  return hbm, vmem, vmem_size, parameters


def _buffers(keys, values: dict, op_names: dict[str, str]
             ) -> tuple[LiveBuffer, ...]:
  """One LiveBuffer per distinct (allocation, offset, size), largest first."""
  buffers, seen = [], set()
  for key in keys:
    a, offset, size, argument, shape = values[key]
    if (a, offset, size) in seen:  # aliases of one buffer: list it once
      continue
    seen.add((a, offset, size))
    op = op_names.get(key.split("{")[0], "")
    buffers.append(LiveBuffer(size, key, shape, op, argument))
  return tuple(sorted(buffers, key=lambda b: (-b.bytes, b.value)))


def _covered(intervals: list[tuple[int, int]]) -> int:
  total, end = 0, None
  start = None
  for a, b in sorted(intervals):
    if end is None or a > end:
      if end is not None:
        total += end - start
      start, end = a, b
    else:
      end = max(end, b)
  return total + (end - start if end is not None else 0)


def read_peak(dump_dir: str, module: str) -> XlaPeak | None:
  """The live set at the HBM peak of the compiled HLO module `module`, or
  None without its dumps."""
  files = _files(dump_dir, module)
  if files is None:
    return None
  assignment_path, live_path, hlo_path = files
  values, vmem, vmem_size, parameters = _values(assignment_path)
  # An entry parameter's allocation is the caller's: held for the whole
  # program (a donated one then holds the output), whatever its values'
  # live ranges say; memory_analysis counts it throughout.
  held = sum(parameters.values())
  with open(live_path) as f:
    text = f.read()
  schedule = [line.strip().split(":", 1)[1] for line in
              text[text.index("InstructionSequence:"):
                   text.index("BufferLiveRange:")].splitlines()[1:]
              if ":" in line]
  starts: dict[int, list] = {}
  ends: dict[int, list] = {}
  body = text[text.index("BufferLiveRange:"):]
  for line in body.splitlines()[1:]:
    m = _RANGE.match(line)
    if not m:
      break
    key = m.group(1) + m.group(2)
    if key in values:
      starts.setdefault(int(m.group(3)), []).append(key)
      ends.setdefault(int(m.group(4)), []).append(key)
  live: set[str] = set()
  best, best_at, best_live = -1, 0, frozenset()
  for t in range(len(schedule) + 1):
    live.update(starts.get(t, ()))
    if t in starts:
      by_allocation: dict[int, list] = {}
      for key in live:
        a, offset, size = values[key][:3]
        if a not in parameters:
          by_allocation.setdefault(a, []).append((offset, offset + size))
      used = held + sum(_covered(v) for v in by_allocation.values())
      if used > best:
        best, best_at, best_live = used, t, frozenset(live)
    live.difference_update(ends.get(t, ()))
  op_names = _op_names(hlo_path)
  at = schedule[best_at] if best_at < len(schedule) else ""
  return XlaPeak(best, best_at, at, _buffers(best_live, values, op_names),
                 vmem_size, _buffers(vmem, vmem, op_names)[:VMEM_BUFFERS])


VMEM_BUFFERS = 8  # the largest VMEM buffers kept


def op_tail(op_name: str, width: int) -> str:
  """The end of an HLO op_name that fits in `width`, cut at a "/" (the
  scopes nearest the op say most), and its quotes as written in JAX."""
  name = op_name.replace("\\'", "'")
  if len(name) <= width:
    return name
  tail = name[-(width - 2):]
  return "…/" + tail.split("/", 1)[1] if "/" in tail else "…" + tail[1:]
