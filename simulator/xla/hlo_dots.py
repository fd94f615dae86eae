"""The dots of an HLO module's text, as XLA:GPU's split-K rewriter sees them.

XLA dumps the module before and after each pass named by
`xla_dump_hlo_pass_re` (`compile_fn(..., dump_passes="splitk-rewriter")`).
Before the splitk-rewriter every dot is read as a [b, m, k] x [b, k, n]
matmul with its operands' element bits through the one-input elementwise
ops that make them (the rewriter's GetDotDimensions); after it, a split dot
is the one a reduce over its split dim reads (the rewriter names that
reduce's computation `<dot>.reduce_sub_computation`). `replay` holds the
rule of simulator.memory.xla_gpu_rules against what XLA did.
"""

from __future__ import annotations

import collections
import dataclasses
import math
import re

from typing import TYPE_CHECKING

from simulator.memory import xla_gpu_rules

if TYPE_CHECKING:
  from meshes.topology import Topology
  from models.config import ModelConfig
  from simulator.settings import TrainSettings

_INSTRUCTION = re.compile(
    r"^\s*(?:ROOT )?%(\S+) = (\w+)\[([\d,]*)\]\S* ([\w\-]+)\((.*?)\)(.*)$")
_BITS = {"pred": 8, "s8": 8, "u8": 8, "f8e4m3fn": 8, "f8e5m2": 8, "s16": 16,
         "u16": 16, "f16": 16, "bf16": 16, "s32": 32, "u32": 32, "f32": 32,
         "s64": 64, "u64": 64, "f64": 64}
# One-input elementwise HLO ops a GEMM operand is looked through.
_UNARY = {"convert", "copy", "negate", "abs", "exponential", "log", "tanh",
          "sqrt", "rsqrt", "logistic", "sign", "cosine", "sine",
          "exponential-minus-one", "log-plus-one", "reduce-precision", "not",
          "floor", "ceil", "round-nearest-even", "round-nearest-afz", "erf",
          "cbrt", "tan", "real", "imag"}


@dataclasses.dataclass(frozen=True)
class Dot:
  """One dot of the module."""

  name: str
  op_name: str  # the jax op it came from (its metadata)
  dims: tuple[int, int, int, int] | None  # b, m, n, k (None: several Ks)
  bits: tuple[int, int, int]  # lhs, rhs (through casts), result


@dataclasses.dataclass(frozen=True)
class _Instr:
  dtype: str
  shape: tuple[int, ...]
  op: str
  operands: tuple[str, ...]
  rest: str


def _instructions(text: str) -> dict[str, _Instr]:
  out = {}
  for line in text.splitlines():
    m = _INSTRUCTION.match(line)
    if m:
      name, dtype, dims, op, operands, rest = m.groups()
      out[name] = _Instr(dtype, tuple(int(d) for d in dims.split(",") if d),
                         op, tuple(re.findall(r"%([\w.\-]+)", operands)), rest)
  return out


def _ints(rest: str, key: str) -> list[int]:
  m = re.search(key + r"=\{([\d,]*)\}", rest)
  return [int(d) for d in m.group(1).split(",") if d] if m else []


def _op_name(rest: str) -> str:
  m = re.search(r'op_name="([^"]*)"', rest)
  return m.group(1) if m else ""


def _bits(instrs: dict[str, _Instr], name: str) -> int:
  i = instrs[name]
  while i.op in _UNARY and len(i.operands) == 1 and i.operands[0] in instrs:
    i = instrs[i.operands[0]]
  return _BITS[i.dtype]


def dots(text: str) -> list[Dot]:
  """The module's dots, in the order of its text."""
  instrs = _instructions(text)
  out = []
  for name, i in instrs.items():
    if i.op != "dot":
      continue
    lhs, rhs = (instrs[o] for o in i.operands[:2])
    lc, lb = _ints(i.rest, "lhs_contracting_dims"), _ints(i.rest,
                                                          "lhs_batch_dims")
    dims = None
    if len(lc) == 1:
      b = math.prod(lhs.shape[d] for d in lb)
      k = lhs.shape[lc[0]]
      dims = (b, math.prod(lhs.shape) // (b * k),
              math.prod(rhs.shape) // (b * k), k)
    out.append(Dot(name, _op_name(i.rest), dims,
                   (_bits(instrs, i.operands[0]), _bits(instrs, i.operands[1]),
                    _BITS[i.dtype])))
  return out


def splits(text: str) -> collections.Counter:
  """{(op_name, split): dots} of a module after the split-K rewriter (1:
  not split)."""
  instrs = _instructions(text)
  split = {}
  for i in instrs.values():
    if i.op == "reduce" and "reduce_sub_computation" in i.rest:
      dot = instrs[i.operands[0]]
      split[i.operands[0]] = dot.shape[_ints(i.rest, "dimensions")[0]]
  return collections.Counter((_op_name(i.rest), split.get(name, 1))
                             for name, i in instrs.items() if i.op == "dot")


def predicted(before: str, sms: xla_gpu_rules.Sms
              ) -> list[tuple[Dot, int]]:
  """Each dot of the module before the rewriter with the split the rule
  picks (1 for a dot of several contracting dims, which it leaves)."""
  return [(d, xla_gpu_rules.choose_split(d.dims, d.bits, sms) if d.dims
           else 1) for d in dots(before)]


def replay(before: str, after: str, sms: xla_gpu_rules.Sms
           ) -> tuple[list[tuple[Dot, int]], collections.Counter]:
  """(each dot with the rule's split, the (op_name, split) counts where the
  rule and XLA differ: the rule's minus XLA's and XLA's minus the rule's,
  empty when they agree)."""
  rule = predicted(before, sms)
  mine = collections.Counter((d.op_name, s) for d, s in rule)
  xla = splits(after)
  return rule, (mine - xla) + (xla - mine)


PASS = "splitk-rewriter"


def compile_and_replay(cfg: "ModelConfig", settings: "TrainSettings",
                       topology: "Topology", X: int, Y: int, dump_dir: str
                       ) -> tuple[list[tuple[Dot, int]], collections.Counter]:
  """Compiles the train step for the GPU `topology` (a Topology) with the
  module dumped around the split-K rewriter into `dump_dir`, and replays
  the rule on it (`replay`)."""
  from meshes import gpu_target  # pylint: disable=g-import-not-at-top
  from simulator.xla import compiled, xla_peak  # pylint: disable=g-import-not-at-top
  if topology.chip.kind != "gpu":
    raise ValueError(f"{topology.name} is not a GPU topology; the split-K "
                     f"rewriter is XLA:GPU's")
  compiled.compile_report(cfg, settings, topology.name, X, Y,
                          dump_dir=dump_dir, dump_passes=PASS)
  before = xla_peak.dump_file(dump_dir, "jit_step", f"before_{PASS}.txt")
  after = xla_peak.dump_file(dump_dir, "jit_step", f"after_{PASS}.before_"
                             "triton-gemm-rewriter.txt")
  if before is None or after is None:
    raise ValueError(f"no dump of the {PASS} pass in {dump_dir}")
  with open(before) as f, open(after) as g:
    return replay(f.read(), g.read(), xla_gpu_rules.Sms(
        *gpu_target.sm_count_and_major(topology.chip.name)))
