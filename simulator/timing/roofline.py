"""Roofline of the traced step: T_math vs T_comm per layer, the compute-bound batch
threshold, step time, MFU, and the best X×Y split.

Derivation. Trace the step once, at the probe batch (simulator.tracing.batch_probe). Every
collective's per-device bytes and every matmul's FLOPs are exactly linear in the
global token count T (activations carry the batch dim, weights do not), and the
probe trace tells which values carry it:

    bytes_c(T) = b0_c + b1_c·T,        flops_layer(T) = f0 + f1·T   (per device).

Per layer instance (one scan iteration of the blocks; "top" is everything outside
the layer scan), with T_c from simulator.timing.comms.collective_cost (the TPU ring, or
NCCL's algorithms on GPUs, whose latency is part of c0):

    T_math(T) = (f0 + f1·T)/C,         T_comm(T) = Σ_c T_c(bytes_c(T)) = c0 + c1·T

(seed 004's convention: the collectives of a layer add up, none overlaps another).
The layer is compute-bound when T_math ≥ T_comm, i.e. for

    T ≥ T*_layer = (c0 - f0/C) / (f1/C - c1)      (never if f1/C ≤ c1),

and the step is compute-bound above T* = max over layers with FLOPs. Per device
means per data shard, T*/X (seed 004's B/X: the Y chips of a shard share its tokens).

Other meshes. A collective's bytes scale as X^-x_exp·Y^-y_exp at fixed T (x_exp,
y_exp: how often X, Y shard the array it moves, read off its sharding), FLOPs as
X^-1·Y^-1 when both axes split the matmul. With X = N/Y this gives T*(Y) for real
Y, minimised numerically (the continuous optimum); M_X, M_Y and wraparound are held
at the fitted mesh's values. For the seed's XXL model, forward pass, ring="book",
this is T*(Y) = F·C·X·M_Y / (M_X·(F·M_Y·W - C·Y)) with minimum 4C²N/(F·M_X·M_Y·W²)
at Y = F·M_Y·W/(2C) (simulator.formulas, used only in tests).

MXU tiles. A matmul's FLOPs are timed padded to whole MXU tiles of its
per-device [K, N] operand (`mxu_padding`): padding costs time, never model
FLOPs. The factor is the fitted mesh's; rescaling to other X, Y (thresholds,
the continuous optimum) keeps it.

Overlap and step time. A collective is overlappable when it is prefetchable (its
operand is a weight: the FSDP gather can be issued a layer ahead) or deferrable
(nothing on the layer's critical path waits for it: gradient reduce-scatters). TP
activation collectives sit on the critical path. Per layer instance:

    exposed = T_comm(critical) + max(0, T_comm(overlappable) - T_math)
    step    = Σ layers count·(T_math + exposed)
    MFU     = model FLOPs / (step · chips · C), model FLOPs = forward × (3 with the
              backward pass, 1 forward only): remat recomputation is not useful
              work (HFU counts it).

A fitted MeshModel is data: a sweep keeps it (simulator.group_estimate) and
reads it back without jax, so this module imports none; `fit_mesh` and
`pipeline_summary`, which trace or read the model's code, import it when
called.
"""

from __future__ import annotations

import collections
import dataclasses
import math
from typing import TYPE_CHECKING

import numpy as np

from meshes.layout import MeshPlan, abstract_mesh, mesh_shapes, plan_mesh
from models import scopes
from simulator.tracing.batch_probe import carries_batch, require_probe
from simulator.timing.comms import collective_cost
from simulator.tracing.conditions import Condition
from simulator.settings import TrainSettings

if TYPE_CHECKING:
  from simulator.tracing.program import Program
  from simulator.tracing.trace import Traced

PASSES = {"forward": ("forward",), "train": ("forward", "backward"),
          "step": ("forward", "backward", "optimizer")}

# Chips whose published runs the step time misses by more than its
# anchors' 5 points (experiments.step_time_anchors.HELD_OUT, README "Step
# time"): a report on them says so beside its step time and MFU.
_STEP_TIME_MISSES = {
    "v6e": "MaxText's four published Trillium runs come out 13 to 34 MFU "
           "points below their measured MFU (step_time_matrix): on v6e read "
           "the predicted step as an upper bound, the MFU as a lower one"}


def step_time_caveat(chip: str) -> str | None:
  """What a report on `chip` should say of its step time, or None."""
  return _STEP_TIME_MISSES.get(chip)


@dataclasses.dataclass(frozen=True)
class Hardware:
  """Figures the timing uses; defaults from the chip, overridable by flags."""

  flops_per_chip: float  # C, bf16 FLOP/s
  link_bandwidth: float  # one-way B/s per ICI link (v5p: 9e10; W_ici = 2x this)
  ring: str = "book"  # "book": f = 1; "exact": (n-1)/n
  wraparound: bool | None = None  # None: the plan's; True/False: force both axes
  hbm_bandwidth: float = 0.0  # B/s; 0: memory-bound work is not timed
  # FLOP/s the matmuls are timed at: what the chip was measured to reach
  # (meshes.hardware.Chip.measured_bf16_flops); 0: flops_per_chip. MFU's
  # denominator stays flops_per_chip.
  matmul_flops: float = 0.0
  host_bandwidth: float = 0.0  # one-way B/s to host memory; 0: not timed

  @property
  def time_flops(self) -> float:
    return self.matmul_flops or self.flops_per_chip

  @classmethod
  def for_plan(cls, plan: MeshPlan, flops_per_chip=None, link_bandwidth=None,
               ring="book", wraparound=None) -> "Hardware":
    chip = plan.topology.chip
    for name, v, unit in (("flops_per_chip", flops_per_chip, "FLOP/s"),
                          ("ici_link_bandwidth", link_bandwidth, "bytes/s")):
      if v is not None and not v > 0:
        raise ValueError(f"{name}={v} must be positive ({unit})")
    return cls(flops_per_chip or chip.bf16_flops,
               link_bandwidth or chip.ici_link_bandwidth, ring, wraparound,
               chip.measured_hbm_bandwidth or chip.hbm_bandwidth,
               flops_per_chip or chip.measured_bf16_flops,
               chip.host_link_bandwidth)


@dataclasses.dataclass(frozen=True)
class Term:
  """A collective, linear in global tokens at the fitted mesh."""

  kind: str
  axis: str
  layer: str
  phase: str
  source: str
  count: int
  overlappable: bool
  b0: float
  b1: float
  x_exp: int
  y_exp: int
  windowed: bool = False  # libtpu's windowed einsum loop (Collective.windowed)
  # made only where this holds (program.Collective.present_if), read at
  # tokens / tokens0 and the mesh's X and Y over the fitted plan's
  present_if: Condition | None = None
  tokens0: float = 1.0

  def present(self, tokens: float, x: float, y: float) -> bool:
    return self.present_if is None or self.present_if.holds(
        tokens / self.tokens0, x, y)


@dataclasses.dataclass(frozen=True)
class Work:
  layer: str
  phase: str
  count: int
  f0: float  # per-device FLOPs = f0 + f1·T
  f1: float
  g1: float  # global FLOPs per token
  x_exp: int
  y_exp: int
  kind: str = "activation"  # program.Dot.kind
  useful: float = 1.0  # the share that is model FLOPs (MoE: `_useful`)
  padding: float = 1.0  # MXU time over the FLOPs' time (`mxu_padding`)
  m0: float = 0.0  # per-device HBM bytes of operands and result = m0 + m1·T
  m1: float = 0.0


@dataclasses.dataclass(frozen=True)
class Hbm:
  """A fusion's HBM bytes per device = b0 + b1·T (T: global tokens)."""

  layer: str
  phase: str
  count: int
  b0: float
  b1: float


@dataclasses.dataclass(frozen=True)
class Host:
  """Bytes copied between host memory and HBM per device = b0 + b1·T, one
  way (`to_host`, or back)."""

  layer: str
  phase: str
  count: int
  to_host: bool
  b0: float
  b1: float


@dataclasses.dataclass(frozen=True)
class MeshModel:
  """Linear-in-tokens model of one traced mesh: cheap to evaluate at any batch."""

  plan: MeshPlan
  terms: tuple[Term, ...]
  work: tuple[Work, ...]
  layer_count: dict[str, int]
  seq: int
  hbm: tuple[Hbm, ...] = ()
  host: tuple[Host, ...] = ()


@dataclasses.dataclass(frozen=True)
class LayerTimes:
  layer: str
  count: int
  t_math: float  # per instance, seconds
  t_comm: float
  t_comm_overlappable: float
  exposed: float
  threshold_tokens_global: float
  t_hbm: float = 0.0  # per instance: its fusions' HBM bytes / bandwidth
  t_matmul_hbm: float = 0.0  # per instance: `matmul_hbm_time`
  t_host: float = 0.0  # per instance: `host_time`
  exposed_host: float = 0.0  # per instance: the part nothing hides


@dataclasses.dataclass(frozen=True)
class StepEstimate:
  tokens: float
  t_math: float
  t_comm: float
  exposed_comm: float
  step_time: float
  mfu: float
  hfu: float
  threshold_tokens_per_device: float
  threshold_tokens_global: float
  layers: tuple[LayerTimes, ...]
  t_hbm: float = 0.0  # memory-bound work: fusions' HBM bytes / bandwidth
  roofline_mfu: float = 0.0  # the bound: T_math and exposed comm only
  t_matmul_hbm: float = 0.0  # matmuls bound by their bytes: `matmul_hbm_time`
  t_host: float = 0.0  # host memory copies over the host link: `host_time`
  exposed_host: float = 0.0  # the part of t_host the layers' work leaves


def _useful(source: str, expert_fraction: float) -> float:
  """The share of a matmul that is model FLOPs: none of a mixture of
  experts' dispatch and combine, the routed share of its experts' slots."""
  names = scopes.scopes_of(source)
  if scopes.ROUTING in names:
    return 0.0
  return expert_fraction if scopes.EXPERTS in names else 1.0


def mxu_padding(mxu_dims: tuple[int, ...], tile: int) -> float:
  """How much longer a matmul runs than its FLOPs at peak say, from padding
  its per-device [K, N] operand to whole MXU tiles: the MXU multiplies
  bf16[8, tile] @ bf16[tile, tile] (TPU Scaling Book, "How to Think About
  TPUs": 128x128 on v4/v5e/v5p, 256x256 on v6e), so K and N run as multiples
  of `tile` (a 4-head slice of head_dim 96, K = 384, runs as 384; N = 96
  runs as 128: 4/3 the time). Dims that carry the batch (the tokens a
  weight gradient contracts) are left out: at any real batch they are
  thousands of tokens per device, padding them costs under a percent.
  A dot with K or N of 1 (a row-wise dot product, e.g. the flash backward's
  sum(dO·O)) never reaches the MXU: XLA's algebraic simplifier rewrites it
  as multiply and reduce (dot strength reduction). tile 0 (GPUs): 1."""
  if not tile or 1 in mxu_dims:
    return 1.0
  pad = 1.0
  for d in mxu_dims:
    if d and not carries_batch((d,)):
      pad *= -(-d // tile) * tile / d
  return pad


def fit(program: Program, tokens: int, plan: MeshPlan, seq: int,
        expert_fraction: float = 1.0, stage_share: float = 1.0) -> MeshModel:
  """Per-collective and per-matmul linear fits from one probe-batch trace.

  A value traced at the probe batch (simulator.tracing.batch_probe) either carries the
  batch (all of its bytes or FLOPs are the per-token term) or does not (all of
  them are the fixed term); `tokens` is the probe trace's global token count.
  expert_fraction: routed token choices over expert slots
  (models.moe.active_fraction), for the model FLOPs of MFU. stage_share:
  with pipeline stages, the share of the traced layers' work on real
  micro-batches, M/(M+K-1) (models.pipeline: the bubble's iterations run
  the stages on zeros); the step time keeps all of it, model FLOPs do not.
  """
  terms = []
  def split(value: float, dims) -> tuple[float, float]:
    """(fixed, per token): all of a value carrying the batch is per token."""
    return (0.0, value / tokens) if carries_batch(dims) else (float(value), 0.0)

  for c in program.collectives:
    terms.append(Term(c.kind, c.axis, c.layer, c.phase, c.source, c.count,
                      c.overlappable, *split(c.bytes_per_device, c.shape),
                      c.x_exp, c.y_exp, c.windowed, c.present_if, tokens))
  work = []
  tile = plan.topology.chip.mxu_size
  for d in program.dots:
    pad = mxu_padding(d.mxu_dims, tile)
    work.append(Work(d.layer, d.phase, d.count,
                     *split(d.flops_per_device * pad, d.dims),
                     split(d.flops_global, d.dims)[1],
                     d.x_exp, d.y_exp, d.kind,
                     _useful(d.source, expert_fraction)
                     * (stage_share if d.layer != "top" else 1.0), pad,
                     float(d.hbm_bytes[0]), d.hbm_bytes[1] / tokens))
  hbm = tuple(Hbm(t.layer, t.phase, t.count, float(t.fixed),
                  t.linear / tokens) for t in program.traffic)
  host = tuple(Host(h.layer, h.phase, h.count, h.to_host,
                    *split(h.bytes_per_device, h.shape)) for h in program.host)
  counts: dict[str, int] = {}
  for r in [*program.collectives, *program.dots, *hbm, *host]:
    counts[r.layer] = max(counts.get(r.layer, 1), r.count)
  return MeshModel(plan, tuple(terms), tuple(work), counts, seq, hbm, host)


def fit_mesh(cfg, settings: TrainSettings, plan: MeshPlan,
             traced: Traced | None = None,
             windowed_einsum: bool = True) -> MeshModel:
  """Trace the step on `plan` at the probe batch and fit the linear model.

  `traced`: the step already traced on `plan` at the probe batch
  (simulator.tracing.trace.trace_probe), reused; only its program is read.
  `windowed_einsum`: see simulator.tracing.program.read_for_plan.
  """
  # pylint: disable=g-import-not-at-top  (jax: the module doc)
  from models import moe
  from models.pipeline import iterations
  from simulator.tracing.program import read_for_plan
  from simulator.tracing.trace import trace_probe
  if traced is None:
    traced = trace_probe(cfg, settings, abstract_mesh(plan))
  batch = traced.step.batch["inputs"].shape[0]
  require_probe(batch, plan.data * plan.Y, "fit_mesh", settings.batch_splits)
  fraction = (moe.active_fraction(cfg, settings.seq, settings.capacity_factor)
              if cfg.moe else 1.0)
  share = (settings.microbatches / iterations(settings.pp,
                                              settings.microbatches)
           if settings.pp > 1 else 1.0)
  return fit(read_for_plan(traced, plan, windowed_einsum),
             batch * settings.seq, plan, settings.seq, fraction, share)


def _layer_times(model: MeshModel, tokens: float, hw: Hardware, phases,
                 X: float, Y: float):
  """Per layer: (count, math0, math1, comm0, comm1, overlap(T), crit(T), gflops1)."""
  plan = model.plan
  X0, Y0 = plan.X, plan.Y
  out = collections.defaultdict(lambda: [0.0] * 7)
  for w in model.work:
    if w.phase not in phases:
      continue
    s = (X0 / X) ** w.x_exp * (Y0 / Y) ** w.y_exp * w.count / model.layer_count[
        w.layer]
    r = out[w.layer]
    r[0] += w.f0 * s / hw.time_flops
    r[1] += w.f1 * s / hw.time_flops
    r[6] += w.g1 * w.count
  for t in model.terms:
    if t.phase not in phases or not t.present(tokens, X / X0, Y / Y0):
      continue
    n = {"X": X, "Y": Y}.get(t.axis) or plan.size(t.axis)
    s = (X0 / X) ** t.x_exp * (Y0 / Y) ** t.y_exp
    per_layer = t.count / model.layer_count[t.layer]
    cost = collective_cost(t.kind, t.axis, plan, hw.link_bandwidth, hw.ring,
                           hw.wraparound, (t.b0 + t.b1 * tokens) * s, n)
    c0 = cost.time(t.b0 * s) * per_layer
    c1 = t.b1 * s * cost.per_byte * per_layer
    r = out[t.layer]
    r[2] += c0
    r[3] += c1
    if t.overlappable:
      r[4] += c0 + c1 * tokens
    else:
      r[5] += c0 + c1 * tokens
  return out


def _threshold(m0, m1, c0, c1) -> float:
  """Smallest T >= 0 with m0 + m1·T >= c0 + c1·T for all larger T (inf: none)."""
  if m1 < c1 or (m1 == c1 and c0 > m0):
    return math.inf
  if m1 == c1:
    return 0.0
  return max(0.0, (c0 - m0) / (m1 - c1))


def threshold_tokens(model: MeshModel, hw: Hardware, pass_: str = "step",
                     X: float | None = None, Y: float | None = None) -> float:
  """Smallest global tokens at which every layer with FLOPs is compute-bound.
  Where a collective is made only at some batches (Term.present_if), the
  collectives are those of the batch the threshold lands on: read again
  there until it stays (a few rounds)."""
  X = model.plan.X if X is None else X
  Y = model.plan.Y if Y is None else Y
  at = 0.0
  for _ in range(4):
    best = 0.0
    for layer, (m0, m1, c0, c1, _, _, _) in _layer_times(
        model, at, hw, PASSES[pass_], X, Y).items():
      if m1 > 0:
        best = max(best, _threshold(m0, m1, c0, c1))
    if (best == at or not math.isfinite(best)
        or all(t.present_if is None for t in model.terms)):
      break
    at = best
  return best


def _hbm_times(model: MeshModel, tokens: float, hw: Hardware, phases
               ) -> dict[str, float]:
  """Per layer instance, the seconds its fusions spend moving HBM bytes."""
  out: dict[str, float] = collections.defaultdict(float)
  if not hw.hbm_bandwidth:
    return out
  for h in model.hbm:
    if h.phase in phases:
      out[h.layer] += ((h.b0 + h.b1 * tokens) * h.count
                       / model.layer_count[h.layer] / hw.hbm_bandwidth)
  return out


def matmul_hbm_time(model: MeshModel, tokens: float, hw: Hardware, phases
                    ) -> dict[str, float]:
  """Per layer instance, how much longer its matmuls run than their FLOPs
  say because their bytes, not their FLOPs, bound them: each matmul takes
  the larger of its FLOPs over the matmul rate and its operands' and
  result's bytes over the HBM bandwidth (the roofline of one kernel). A
  head-sized contraction (K = 128: the blockwise attention's scores
  [s, block] in f32 from bf16 [s, 128] and [128, block], as its traced
  scan runs) moves more bytes than the MXU or tensor cores need time
  for."""
  out: dict[str, float] = collections.defaultdict(float)
  if not hw.hbm_bandwidth:
    return out
  for w in model.work:
    if w.phase in phases and (w.m0 or w.m1):
      over = ((w.m0 + w.m1 * tokens) / hw.hbm_bandwidth
              - (w.f0 + w.f1 * tokens) / hw.time_flops)
      if over > 0:
        out[w.layer] += over * w.count / model.layer_count[w.layer]
  return out


def host_time(model: MeshModel, tokens: float, hw: Hardware, phases
              ) -> dict[str, float]:
  """Per layer instance, the seconds its copies between host memory and HBM
  take over the host link (PCIe): each way on its own, the link being full
  duplex, the longer of the two."""
  ways: dict = collections.defaultdict(float)
  if not hw.host_bandwidth:
    return {}
  for h in model.host:
    if h.phase in phases:
      ways[h.layer, h.to_host] += ((h.b0 + h.b1 * tokens) * h.count
                                   / model.layer_count[h.layer]
                                   / hw.host_bandwidth)
  out: dict[str, float] = collections.defaultdict(float)
  for (layer, _), seconds in ways.items():
    out[layer] = max(out[layer], seconds)
  return out


def _model_flops(model: MeshModel, tokens: float, backward: bool) -> float:
  """The work training needs, remat recompute left out: the forward, the
  input gradients (the forward again for weight matmuls, twice for those of
  two activations) and the weight gradients the step takes (for every
  weight: the forward's weight matmuls again, i.e. 3 x forward; with LoRA
  the adapters' alone). A mixture of experts counts its routed tokens'
  share of the experts' matmuls and no dispatch (Work.useful), as MaxText
  counts the top-k experts."""
  g = lambda w: w.g1 * w.count * w.useful
  fwd = sum(g(w) for w in model.work if w.phase == "forward")
  if not backward:
    return fwd * tokens
  weights = sum(g(w) for w in model.work
                if w.phase == "forward" and w.kind == "weight")
  taken = sum(g(w) for w in model.work
              if w.phase == "backward" and w.kind == "weight_grad")
  return (3 * fwd - weights + taken) * tokens


def step_estimate(model: MeshModel, tokens: float, hw: Hardware,
                  pass_: str = "step") -> StepEstimate:
  """Times of one step at `tokens` global tokens (microseconds to evaluate).

  Per layer instance, compute = T_math + T_matmul_hbm (`matmul_hbm_time`)
  + T_hbm (its fusions' HBM bytes over the HBM bandwidth: norms,
  elementwise, softmax outside a fused kernel, the loss, the optimizer
  update); overlappable collectives hide behind it, TP
  activation collectives are on the critical path. Copies between host
  memory and HBM (`host_time`: offloaded residuals, parameters, optimizer
  state) run on their own DMA engines, as XLA's asynchronous copy-start /
  copy-done pairs, beside the layer's compute and collectives; what they
  take beyond those is exposed. The roofline bound (`roofline_mfu`) is the
  same without T_hbm and the host copies."""
  if pass_ not in PASSES:
    raise ValueError(f"pass={pass_!r}; valid: {', '.join(PASSES)}")
  phases = PASSES[pass_]
  plan = model.plan
  hbm = _hbm_times(model, tokens, hw, phases)
  stall = matmul_hbm_time(model, tokens, hw, phases)
  host = host_time(model, tokens, hw, phases)
  layers, tm, tc, te, th, ts, bound = [], 0.0, 0.0, 0.0, 0.0, 0.0, 0.0
  t_host = exposed_host = 0.0
  all_global = 0.0
  times = _layer_times(model, tokens, hw, phases, plan.X, plan.Y)
  for layer in [*times, *(l for l in [*hbm, *host] if l not in times)]:
    m0, m1, c0, c1, ov, cr, g1 = times[layer] if layer in times else [0.0] * 7
    n = model.layer_count[layer]
    t_math = m0 + m1 * tokens
    t_comm = c0 + c1 * tokens
    compute = t_math + stall.get(layer, 0.0) + hbm.get(layer, 0.0)
    exposed = cr + max(0.0, ov - compute)
    behind = max(0.0, host.get(layer, 0.0) - compute - exposed)
    thr = _threshold(m0, m1, c0, c1) if m1 > 0 else math.inf
    layers.append(LayerTimes(layer, n, t_math, t_comm, ov, exposed, thr,
                             hbm.get(layer, 0.0), stall.get(layer, 0.0),
                             host.get(layer, 0.0), behind))
    t_host += n * host.get(layer, 0.0)
    exposed_host += n * behind
    tm += n * t_math
    tc += n * t_comm
    te += n * exposed
    th += n * hbm.get(layer, 0.0)
    ts += n * stall.get(layer, 0.0)
    bound += n * (t_math + cr + max(0.0, ov - t_math))
    all_global += g1 * tokens
  model_flops = _model_flops(model, tokens, "backward" in phases)
  step = tm + ts + th + te + exposed_host
  peak = plan.chips * hw.flops_per_chip
  thr = max([l.threshold_tokens_global for l in layers if l.t_math > 0] or
            [math.inf])
  return StepEstimate(
      tokens=tokens, t_math=tm, t_comm=tc, exposed_comm=te, step_time=step,
      mfu=model_flops / (step * peak) if step > 0 else 0.0,
      hfu=all_global / (step * peak) if step > 0 else 0.0,
      threshold_tokens_per_device=thr / plan.data,
      threshold_tokens_global=thr, layers=tuple(layers), t_hbm=th,
      roofline_mfu=model_flops / (bound * peak) if bound > 0 else 0.0,
      t_matmul_hbm=ts, t_host=t_host, exposed_host=exposed_host)


def continuous_optimum(model: MeshModel, hw: Hardware, pass_: str = "step"
                       ) -> tuple[float, float]:
  """(Y, global tokens) minimising the threshold over real Y in [1, N], X = N/Y."""
  n = model.plan.X * model.plan.Y
  f = lambda y: threshold_tokens(model, hw, pass_, X=n / y, Y=y)
  grid = np.exp(np.linspace(0.0, math.log(n), 801))
  vals = [f(y) for y in grid]
  i = int(np.argmin(vals))
  lo, hi = grid[max(i - 1, 0)], grid[min(i + 1, len(grid) - 1)]
  g = (math.sqrt(5) - 1) / 2
  for _ in range(100):  # golden section on the bracketing cell
    a, b = hi - g * (hi - lo), lo + g * (hi - lo)
    if f(a) <= f(b):
      hi = b
    else:
      lo = a
  y = (lo + hi) / 2
  return (y, f(y)) if f(y) <= vals[i] else (float(grid[i]), vals[i])


@dataclasses.dataclass(frozen=True)
class MeshRow:
  plan: MeshPlan
  model: MeshModel | None
  estimate: StepEstimate | None
  error: str | None = None


def search_meshes(cfg, settings: TrainSettings, topology, m_x=None, m_y=None,
                  meshes=None, hardware_kw=None, pass_: str = "step",
                  tokens: float | None = None, D: int = 1,
                  windowed_einsum: bool = True) -> list[MeshRow]:
  """Trace and estimate every X×Y factorization (or `meshes`) of the
  topology, of its chips over D replicas with D > 1 (`windowed_einsum`:
  see `fit_mesh`)."""
  rows = []
  for X, Y in meshes or mesh_shapes(topology, D):
    plan = plan_mesh(topology, X, Y, m_x, m_y, D=D)
    try:
      model = fit_mesh(cfg, settings, plan, windowed_einsum=windowed_einsum)
    except ValueError as e:  # e.g. a sharded dim the axis does not divide
      rows.append(MeshRow(plan, None, None, str(e).splitlines()[0]))
      continue
    hw = Hardware.for_plan(plan, **(hardware_kw or {}))
    est = step_estimate(model, tokens or settings.tokens, hw, pass_)
    rows.append(MeshRow(plan, model, est))
  return rows


def pipeline_summary(cfg, settings: TrainSettings, plan: MeshPlan) -> dict:
  """What a pipeline plan's step adds (models.pipeline): the bubble, the
  stage sends (count, per-device bytes each, seconds each at the P link's
  bandwidth, simulator.timing.comms) and the memory rule of the schedule."""
  from models import pipeline  # pylint: disable=g-import-not-at-top
  k, m = settings.pp, settings.microbatches
  each = pipeline.send_bytes(settings.batch // m // plan.X, settings.seq,
                             cfg.d_model // plan.Y)
  hw = Hardware.for_plan(plan)
  seconds = collective_cost("permute", "P", plan, hw.link_bandwidth).time(each)
  return {"stages": k, "microbatches": m, "schedule": settings.schedule,
          "iterations": pipeline.iterations(k, m),
          "bubble_fraction": pipeline.bubble_fraction(k, m),
          "sends": pipeline.sends(k, m), "send_bytes": each,
          "send_seconds": seconds,
          "memory": ("1F1B rule on the traced GPipe step "
                     "(simulator.memory.schedule)"
                     if settings.schedule == "1f1b" else
                     "traced (GPipe: every micro-batch in flight)")}
