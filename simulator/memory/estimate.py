"""Per-device HBM of one plan, read off the traced program (no hand formula).

Two views of the same traced step:

The step's tensors, by category (`per_device_bytes`): every figure is a
traced shape times its NamedSharding's per-device shape
(`sharding.shard_shape`) times the dtype's itemsize.
  params       step.params (stored layout: X-sharded under zero3, TP over Y);
  grads        step.grads (after reduce-scatter: X-sharded under zero2/3);
  optimizer    jax.eval_shape(tx.init) of the real optax optimizer (moments,
               Adafactor factors, master copy, counters);
  activations  what the backward pass keeps (the residuals JAX saves under
               the remat policy, scan-stacked over layers, those XLA fuses
               away left out: simulator.tracing.trace.saved_residuals) and the batch;
               offloaded residuals are `host_bytes`, not HBM.
An argument the step never reads (Adafactor's placeholder moments) is left
out, as jit drops it; on TPU each argument is counted in its tiled layout
(simulator.memory.tiling), so the arguments equal the compiler's.

The peak (`compiled_comparable_peak`): the arguments, live throughout, plus
the largest transient live set of a heap simulation of the whole traced step
(simulator.memory.liveness, with XLA's behaviours as the named rules of
simulator.memory.xla_rules). `peak_where` says where in the program it is,
`at_peak` what is live there by category (it sums to the peak), and
`phase_bytes` the largest live set of each part of the step (forward,
loss, backward, update, by named scope). It is the figure held against
XLA's `peak_memory_in_bytes`.

  overhead     OVERHEAD_FRACTION of the compiled-comparable peak: runtime and
               allocator fragmentation, which XLA's static figure does not
               contain; for planning only.
  peak         compiled_comparable_peak + overhead: what `fits`, the headroom
               and eta_mem use.

Batch rescaling: every value's bytes are either fixed or linear in the
global batch at a fixed mesh. The step is traced once, at the probe batch
(simulator.tracing.batch_probe), which tells the two apart by shape;
`estimate.at_batch(b)` is exact for any b the mesh divides, without
retracing (`from_trace.memory_report` does both); `summary_at(b)` gives
its peak figures alone, what a sweep records.

An estimate is data: simulator.memory.from_trace builds it from the traced
step (that module needs jax; this one does not), and a sweep keeps it and
reads it back without jax (simulator.group_estimate).
"""

from __future__ import annotations

import dataclasses
import fractions
import functools
import math
from typing import Iterable, Iterator

import numpy as np

from models import scopes
from simulator.tracing.batch_probe import rescale, rescale_text
from simulator.memory import schedule
from simulator.memory.points import (AUTOTUNED, LiveBuffer, LiveSetUnknown,
                                     Points, kept_orders)
from simulator.memory.tiling import tpu_tiled_bytes

# Runtime and fragmentation overhead as a fraction of the compiled-comparable
# peak. Seed 001 gives 5-20% ("typically"), and its worked estimator uses 10%;
# XLA's compiled peak contains none of it, so it is reported apart (the
# `overhead` category, inside `peak`) and left out of the compared figure.
# A named, documented default rather than a measured figure.
OVERHEAD_FRACTION = 0.10

CATEGORIES = ("params", "grads", "optimizer", "activations", "overhead",
              "peak")
# What is live at the peak; these sum to compiled_comparable_peak.
PEAK_CATEGORIES = ("params", "optimizer", "batch", "tile_padding", "grads",
                   "activations", "logits", "temporaries")
TOP_CONTRIBUTORS = 5
PEAK_BUFFERS = 12


@dataclasses.dataclass(frozen=True)
class Tensor:
  """One accounted value: bytes = fixed + linear * (batch / traced batch)."""

  category: str  # a CATEGORIES entry, "host", "padding" or "batch_padding"
  name: str
  shape: tuple[int, ...]  # per device, at the traced batch
  dtype: str
  fixed: int
  linear: int
  pinned: bool = False  # "host": in pinned_host memory (page-locked)

  def bytes_at(self, scale_num: int, scale_den: int) -> int:
    return self.fixed + self.linear * scale_num // scale_den


@dataclasses.dataclass(frozen=True)
class Contributor:
  name: str
  shape: tuple[int, ...]  # per device
  dtype: str
  bytes: int
  category: str = ""


@dataclasses.dataclass(frozen=True)
class MemoryEstimate:
  """Per-device bytes (ints); see the module docstring."""

  per_device_bytes: dict[str, int]  # the step's tensors, overhead, peak
  host_bytes: int  # state and residuals kept in host memory, per device
  pinned_host_bytes: int  # the part of host_bytes in memory kind pinned_host
  host_devices: int  # devices one host machine drives (its RAM serves them)
  hbm_bytes: int  # what the step may use: simulator.memory.capacity
  fits: bool
  headroom_bytes: int  # hbm_bytes - peak (negative: does not fit)
  eta_mem: float  # param bytes / peak
  batch_bytes: int  # the batch arguments, inside `activations`
  contributors: dict[str, tuple[Contributor, ...]]  # top tensors per category
  batch: int  # global batch in sequences
  batch_shards: int  # the batch is a multiple of this: X x micro-batches
  arguments_bytes: int  # params + optimizer + batch + tile padding
  tile_padding_bytes: int  # TPU tile padding of the arguments
  compiled_comparable_peak: int  # peak - overhead: what XLA's peak is
  at_peak: dict[str, int]  # what is live at the peak, by PEAK_CATEGORIES
  peak_where: str  # the program point of the peak
  peak_buffers: tuple[Contributor, ...]  # the largest transients live there
  phase_bytes: dict[str, int]  # the largest live set of each part
  traced_batch: int  # the batch `tensors` were traced at (the probe)
  tensors: tuple[Tensor, ...] = dataclasses.field(repr=False, default=())
  points: Points | None = dataclasses.field(repr=False, default=None)
  trainable_params: int = 0  # parameters the step trains (LoRA: adapters)
  # (stages, microbatches): the 1F1B rule on the traced GPipe step
  # (simulator.memory.schedule); None: the traced schedule as it is.
  one_f_one_b: tuple[int, int] | None = None
  # XLA's rematerialization limit (simulator.memory.capacity), where the
  # rematerialized-logits rule applies (xla_rules); None: it does not.
  remat_limit_bytes: int | None = None
  # The schedules the peak is not taken over (`deviceless`): none, or the
  # ones XLA's autotuner may pick on a real GPU (points.AUTOTUNED).
  left_out: tuple[str, ...] = ()

  @property
  def host_ram_bytes(self) -> int:
    """Host RAM one host machine holds for the step: every local device's
    host share (the host's own runtime and input pipeline not counted)."""
    return self.host_bytes * self.host_devices

  def at_batch(self, batch: int) -> "MemoryEstimate":
    """The same mesh and program at another global batch, without retracing."""
    self._check_batch(batch)
    return dataclasses.replace(
        assemble(self.tensors, self.points, batch, self.traced_batch,
                 self.hbm_bytes, self.batch_shards, self.host_devices,
                 self.one_f_one_b, self.remat_limit_bytes, self.left_out),
        trainable_params=self.trainable_params)

  def _check_batch(self, batch: int) -> None:
    if not isinstance(batch, int) or batch <= 0 or batch % self.batch_shards:
      raise ValueError(f"batch={batch!r} must be a positive multiple of "
                       f"{self.batch_shards} (each micro-batch split over "
                       "X)")

  def deviceless(self) -> "MemoryEstimate":
    """The estimate of the program a compile without the device gives (no
    autotuning: xla_gpu_rules, cuBLAS logits), which the GPU corpus holds
    against; the estimate itself, what `fits` uses, keeps every schedule."""
    return dataclasses.replace(self, left_out=AUTOTUNED).at_batch(
        self.batch)

  def comparable_peak_at(self, batch: int) -> int:
    """`at_batch(batch).compiled_comparable_peak` alone, without naming what
    is live (largest_batch's search asks it many times)."""
    return self._peak_at(batch)[0]

  def _peak_at(self, batch: int) -> tuple[int, int]:
    """(compiled-comparable peak, its point's index) at `batch`."""
    arguments, _, transient, index = self._peak(batch)
    return sum(arguments.values()) + transient, index

  def _peak(self, batch: int
            ) -> tuple[dict[str, int], tuple[str, ...] | None, int, int]:
    """(the arguments by at-peak category, the schedules the peak is taken
    over, the transient bytes and the point index of the peak) at `batch`."""
    arguments = self._arguments.at_peak(batch, self.traced_batch)
    orders = _kept_orders(self.points, batch, self.traced_batch,
                          sum(arguments.values()), self.remat_limit_bytes,
                          self.left_out)
    transient, index = _transient(self.points, batch, self.traced_batch,
                                  self.one_f_one_b, orders)
    return arguments, orders, transient, index

  def summary_at(self, batch: int) -> "PeakSummary":
    """`at_batch(batch)`'s peak, what is live there by category and where,
    without naming the tensors and buffers (a sweep asks at every config;
    at_batch names them for a report)."""
    self._check_batch(batch)
    arguments, orders, transient, index = self._peak(batch)
    at_peak = {c: 0 for c in PEAK_CATEGORIES}
    at_peak.update(arguments)
    for *_, category, b in _live_at_peak(self.points, index, batch,
                                         self.traced_batch, self.one_f_one_b):
      at_peak[category] += b
    comparable = sum(arguments.values()) + transient
    overhead = overhead_bytes(comparable)
    return PeakSummary(
        at_peak=at_peak, compiled_comparable_peak=comparable,
        overhead_bytes=overhead, peak_bytes=comparable + overhead,
        peak_where=_peak_where(self.points, index, orders,
                               self.remat_limit_bytes, self.one_f_one_b))

  @functools.cached_property
  def _arguments(self) -> "_Arguments":
    return _Arguments.of(self.tensors)

  def walk_peaks(self, batches: Iterable[int]) -> None:
    """Walks what is live at each of `batches`' peaks now, while the traced
    program is at hand: the estimate kept as data (points.Points) then
    answers every batch whose peak is at one of those points."""
    for batch in batches:
      index = self._peak_at(batch)[1]
      try:
        if index >= 0:
          self.points.live(index)
      except LiveSetUnknown:  # kept as data already: as it is
        return

  def schedule_peaks(self) -> dict[str, tuple[int, bool]]:
    """{schedule of the weight gradients: (its compiled-comparable peak,
    whether the peak is taken over it)} at this batch. XLA's scheduler
    picks one by its cost model (not derived: xla_rules, deferred weight
    gradients), so the peak is the largest of those kept; the
    rematerialized-logits rule drops the deferred one over XLA's limit.
    Empty with one schedule, or under the 1F1B rule."""
    if self.points is None or self.one_f_one_b:
      return {}
    peaks = self.order_peaks_at(self.batch)
    if len(peaks) < 2:
      return {}
    kept = _kept_orders(self.points, self.batch, self.traced_batch,
                        self.arguments_bytes, self.remat_limit_bytes,
                        self.left_out) or tuple(peaks)
    return {o: (b, o in kept) for o, b in peaks.items()}

  def order_peaks_at(self, batch: int) -> dict[str, int]:
    """{schedule of the weight gradients: its compiled-comparable peak} at
    `batch`, each nondecreasing in the batch (off the 1F1B rule)."""
    arguments = sum(self._arguments.at_peak(batch, self.traced_batch)
                    .values())
    return _order_peaks(self.points, batch, self.traced_batch, arguments)


def _batch_padding(t: Tensor, batch: int, traced_batch: int) -> int:
  shape = rescale(t.shape, batch, traced_batch)
  return (tpu_tiled_bytes(shape, t.dtype)
          - math.prod(shape) * np.dtype(t.dtype).itemsize)


# --------------------------------------------------------------------------
# The estimate.
# --------------------------------------------------------------------------


def _peak_category(b: LiveBuffer) -> str:
  """What a transient buffer live at the peak is, by structure."""
  linear = bool(b.bytes[1])
  if b.hoisted:
    return "temporaries"
  if linear and scopes.LOSS in b.scopes:
    return "logits"
  if b.backward:
    return "temporaries" if linear else "grads"
  return "activations" if linear else "temporaries"


# Where each argument tensor's bytes are counted at the peak.
_ARGUMENT_AT_PEAK = {"params": "params", "optimizer": "optimizer",
                     "batch": "batch", "padding": "tile_padding",
                     "batch_padding": "tile_padding"}


@dataclasses.dataclass(frozen=True)
class _Arguments:
  """The step's arguments by at-peak category at any batch: the bytes that
  do not scale summed once, the few that do (the batch and its tile
  padding) kept to rescale, each tensor exact as `Tensor.bytes_at`."""

  fixed: dict[str, int]
  scaled: tuple[Tensor, ...]

  @classmethod
  def of(cls, tensors: Iterable[Tensor]) -> "_Arguments":
    fixed = dict.fromkeys(("params", "optimizer", "batch", "tile_padding"), 0)
    scaled = []
    for t in tensors:
      if t.category not in _ARGUMENT_AT_PEAK:
        continue
      if t.linear or t.category == "batch_padding":
        scaled.append(t)
      else:
        fixed[_ARGUMENT_AT_PEAK[t.category]] += t.fixed
    return cls(fixed, tuple(scaled))

  def at_peak(self, batch: int, traced_batch: int) -> dict[str, int]:
    out = dict(self.fixed)
    for t in self.scaled:
      out[_ARGUMENT_AT_PEAK[t.category]] += (
          _batch_padding(t, batch, traced_batch)
          if t.category == "batch_padding" else t.bytes_at(batch, traced_batch))
    return out


@dataclasses.dataclass(frozen=True)
class PeakSummary:
  """A batch's peak without the tensors and buffers named
  (MemoryEstimate.summary_at): the figures a sweep records."""

  at_peak: dict[str, int]  # by PEAK_CATEGORIES; sums to the comparable peak
  compiled_comparable_peak: int
  overhead_bytes: int
  peak_bytes: int  # compiled_comparable_peak + overhead_bytes
  peak_where: str


def _kept_orders(points: Points, batch: int, traced_batch: int,
                 arguments: int, limit: int | None,
                 left_out: tuple[str, ...] = ()) -> tuple[str, ...] | None:
  """The schedules of the weight gradients the peak is taken over, but
  those `left_out`, with the rematerialized-logits rule (xla_rules) at
  XLA's limit `limit` (None: the rule does not apply); None: all."""
  if limit is None and not left_out:
    return None
  peaks = {o: b for o, b in _order_peaks(points, batch, traced_batch,
                                         arguments).items()
           if o not in left_out}
  return tuple(peaks) if limit is None else kept_orders(peaks, limit)


def _order_peaks(points: Points, batch: int, traced_batch: int,
                 arguments: int) -> dict[str, int]:
  """{schedule of the weight gradients: its compiled-comparable peak}."""
  return {o: arguments + v
          for o, v in points.order_peaks(batch, traced_batch).items()}


def _transient(points: Points, batch: int, traced_batch: int,
               one_f_one_b: tuple[int, int] | None,
               orders: tuple[str, ...] | None = None) -> tuple[int, int]:
  """(bytes, point index) of the largest transient live set over the
  schedules `orders` (None: all), under the 1F1B rule
  (simulator.memory.schedule) where it applies."""
  if one_f_one_b:
    transient, index, _ = schedule.one_f_one_b(points, batch, traced_batch,
                                               *one_f_one_b)
    return transient, index
  return points.peak_at(batch, traced_batch, orders)


def _live_at_peak(points: Points, index: int, batch: int,
                  traced_batch: int, one_f_one_b: tuple[int, int] | None
                  ) -> Iterator[tuple[str, tuple, str, str, int]]:
  """(name, shape at the traced batch, dtype, category, bytes) of each
  transient buffer live at point `index` at `batch`, and of the point-wise
  rules' bytes there (net)."""
  if index < 0:
    return
  cut = 1.0 - schedule.in_flight_share(*one_f_one_b) if one_f_one_b else 0.0
  for buf in points.live(index):
    b = buf.bytes[0] + buf.bytes[1] * batch // traced_batch
    if cut and schedule.stage_saved(buf):
      b -= schedule.taken_off(b, cut)
    yield buf.where, buf.shape, buf.dtype, _peak_category(buf), b
  dtypes = points.extra_dtypes(index)
  for what, extra in points.extras(index, batch, traced_batch).items():
    yield (f"{points.where[index]}: {what}", (), dtypes[what], "temporaries",
           extra)


def _peak_where(points: Points, index: int,
                orders: tuple[str, ...] | None, remat_limit: int | None,
                one_f_one_b: tuple[int, int] | None) -> str:
  """The program point of the peak, and the rule that put it there."""
  if index < 0:
    return "nothing transient"
  note = (" (rematerialized logits: the deferred order is over XLA's limit)"
          if remat_limit is not None and orders is not None
          and "deferred" not in orders else "")
  return points.where[index] + note + (" (1F1B rule)" if one_f_one_b else "")


def assemble(tensors: tuple[Tensor, ...], points: Points,
             batch: int, traced_batch: int, hbm_bytes: int,
             shards: int, host_devices: int,
             one_f_one_b: tuple[int, int] | None = None,
             remat_limit: int | None = None,
             left_out: tuple[str, ...] = ()) -> MemoryEstimate:
  """The estimate at `batch` of a step traced at `traced_batch`: its
  tensors, and the peak over `points` (simulator.memory.from_trace builds
  both)."""
  totals = {c: 0 for c in CATEGORIES}
  at_peak = {c: 0 for c in PEAK_CATEGORIES}
  host = pinned = 0
  by_category: dict[str, list[Contributor]] = {}
  for t in tensors:
    b = t.bytes_at(batch, traced_batch)
    category = t.category
    if category == "batch_padding":
      b, category = _batch_padding(t, batch, traced_batch), "padding"
    if category == "host":
      host += b
      pinned += b if t.pinned else 0
    elif category in ("padding", "batch"):
      at_peak["tile_padding" if category == "padding" else "batch"] += b
      if category == "batch":
        totals["activations"] += b
    else:
      totals[category] += b
      if category in ("params", "optimizer"):
        at_peak[category] += b  # arguments: live throughout
    if b and category != "padding":
      by_category.setdefault(category, []).append(
          Contributor(t.name, rescale(t.shape, batch, traced_batch), t.dtype,
                      b, category))
  arguments = sum(at_peak[c] for c in ("params", "optimizer", "batch",
                                       "tile_padding"))
  orders = _kept_orders(points, batch, traced_batch, arguments, remat_limit,
                        left_out)
  transient, index = _transient(points, batch, traced_batch, one_f_one_b,
                                orders)
  live = []
  for name, shape, dtype, category, b in _live_at_peak(
      points, index, batch, traced_batch, one_f_one_b):
    at_peak[category] += b
    live.append(Contributor(rescale_text(name, batch, traced_batch),
                            rescale(shape, batch, traced_batch), dtype, b,
                            category))
  comparable = arguments + transient
  totals["overhead"] = overhead_bytes(comparable)
  totals["peak"] = peak = comparable + totals["overhead"]
  phases = {part: arguments + v for part, v in
            points.part_peaks(batch, traced_batch, orders).items()}
  by_size = lambda xs: tuple(sorted(xs, key=lambda x: -x.bytes))
  return MemoryEstimate(
      per_device_bytes=totals, host_bytes=host, pinned_host_bytes=pinned,
      host_devices=host_devices, hbm_bytes=hbm_bytes,
      fits=peak <= hbm_bytes, headroom_bytes=hbm_bytes - peak,
      eta_mem=totals["params"] / peak if peak else 0.0,
      batch_bytes=at_peak["batch"],
      contributors={c: by_size(v)[:TOP_CONTRIBUTORS]
                    for c, v in by_category.items()},
      batch=batch, batch_shards=shards, arguments_bytes=arguments,
      tile_padding_bytes=at_peak["tile_padding"],
      compiled_comparable_peak=comparable, at_peak=at_peak,
      peak_where=_peak_where(points, index, orders, remat_limit, one_f_one_b),
      peak_buffers=by_size(live)[:PEAK_BUFFERS], phase_bytes=phases,
      traced_batch=traced_batch, tensors=tensors, points=points,
      one_f_one_b=one_f_one_b, remat_limit_bytes=remat_limit,
      left_out=left_out)


def _last(ok, limit: int) -> int:
  """The largest n in [1, limit] with ok(n), for ok true up to some n and
  false after it (0: not even 1): doubling, then bisection."""
  if not ok(1):
    return 0
  lo, hi = 1, 2
  while ok(hi) and hi < limit:
    lo, hi = hi, hi * 2
  while hi - lo > 1:
    mid = (lo + hi) // 2
    lo, hi = (mid, hi) if ok(mid) else (lo, mid)
  return lo


def overhead_bytes(comparable_peak: int) -> int:
  """The planning overhead on a compiler-comparable peak: what `fits` adds
  to it (the planned peak is the two together)."""
  return int(comparable_peak * OVERHEAD_FRACTION)


def peak_budget(capacity_bytes: int, fraction: float) -> int:
  """The compiler-comparable peak a plan may reach to keep within `fraction`
  of the capacity: that share, and no more than fits with the planning
  overhead (the verdict's own test), so a largest batch always fits, also
  where `fraction` is above 1 / (1 + OVERHEAD_FRACTION)."""
  with_overhead = fractions.Fraction(capacity_bytes) / (
      1 + fractions.Fraction(str(OVERHEAD_FRACTION)))  # exact: 110 -> 100
  return min(int(fraction * capacity_bytes), int(with_overhead))


def largest_batch(estimate: MemoryEstimate, cap_bytes: int, step: int,
                  limit: int = 1 << 40) -> int:
  """The largest global batch, a multiple of `step`, whose compiler-
  comparable peak is at most `cap_bytes` (0: not even `step` fits). Exact
  on a TPU, no compile: every program point's live bytes are affine in the
  batch, so each schedule's peak (the largest of its points) is
  nondecreasing in the batch. The peak itself is not where the
  rematerialized-logits rule drops a schedule over XLA's limit
  (xla_rules), but whether it fits changes only where some schedule's
  peak crosses `cap_bytes` or that limit: the answer is the largest of
  those crossings that fits. On a GPU a split matmul's partials and padded
  operands (xla_gpu_rules, split K) follow the split XLA picks for the
  batch's shapes, which can shrink as the batch grows: the search still
  takes each schedule's peak as nondecreasing."""
  fits = lambda n: estimate.comparable_peak_at(n * step) <= cap_bytes
  top = max(1, limit // step)
  if estimate.remat_limit_bytes is None:
    return _last(fits, top) * step
  crossings = {_last(lambda n, o=o, t=t: estimate.order_peaks_at(n * step)[o]
                     <= t, top)
               for o in set(estimate.points.order)
               for t in (cap_bytes, estimate.remat_limit_bytes)}
  return max((n for n in crossings if n and fits(n)), default=0) * step


def largest_batch_any_schedule(estimate: MemoryEstimate, cap_bytes: int,
                               step: int, limit: int = 1 << 40) -> int:
  """The largest batch, a multiple of `step`, at which the smallest of the
  simulated weight-gradient schedules fits in `cap_bytes`: how far XLA
  could go if its scheduler keeps that one. A first guess to compile at
  (simulator.xla.frontier), not a bound: `largest_batch` is the answer."""
  if estimate.points is None or estimate.one_f_one_b:
    return largest_batch(estimate, cap_bytes, step, limit)
  smallest = lambda n: min(estimate.order_peaks_at(n * step).values())
  return _last(lambda n: smallest(n) <= cap_bytes, max(1, limit // step)) * step


SCHEMA_VERSION = 2


def _contributors(xs) -> list[dict]:
  return [{"name": x.name, "shape": list(x.shape), "dtype": x.dtype,
           "bytes": int(x.bytes), **({"category": x.category}
                                     if x.category else {})} for x in xs]


def to_json(estimate: MemoryEstimate) -> dict:
  """The stable JSON schema (all bytes are ints, per device):

  {"schema_version": 2,
   "per_device_bytes": {"params", "grads", "optimizer", "activations",
                        "overhead", "peak"},
   "compiled_comparable_peak": int, "peak_where": str,
   "at_peak": {PEAK_CATEGORIES}: sums to compiled_comparable_peak,
   "peak_buffers": [{"name", "shape", "dtype", "bytes", "category"}, ...],
   "phase_bytes": {part of the step: its largest live set},
   "host_bytes", "pinned_host_bytes" (the part in memory kind pinned_host),
   "host_ram_bytes" (host_bytes x the devices one host machine drives),
   "hbm_bytes", "headroom_bytes", "fits", "eta_mem", "batch",
   "trainable_params",
   "batch_bytes", "overhead_fraction", "arguments_bytes",
   "tile_padding_bytes",
   "contributors": {category: [{"name", "shape", "dtype", "bytes"}, ...]}}
  """
  return {
      "schema_version": SCHEMA_VERSION,
      "per_device_bytes": {c: int(estimate.per_device_bytes[c])
                           for c in CATEGORIES},
      "compiled_comparable_peak": int(estimate.compiled_comparable_peak),
      "peak_where": estimate.peak_where,
      "at_peak": {c: int(v) for c, v in estimate.at_peak.items()},
      "peak_buffers": _contributors(estimate.peak_buffers),
      "phase_bytes": {k: int(v) for k, v in estimate.phase_bytes.items()},
      "host_bytes": int(estimate.host_bytes),
      "pinned_host_bytes": int(estimate.pinned_host_bytes),
      "host_ram_bytes": int(estimate.host_ram_bytes),
      "hbm_bytes": int(estimate.hbm_bytes),
      "headroom_bytes": int(estimate.headroom_bytes),
      "fits": bool(estimate.fits),
      "eta_mem": float(estimate.eta_mem),
      "batch": int(estimate.batch),
      "trainable_params": int(estimate.trainable_params),
      "batch_bytes": int(estimate.batch_bytes),
      "overhead_fraction": OVERHEAD_FRACTION,
      "arguments_bytes": int(estimate.arguments_bytes),
      "tile_padding_bytes": int(estimate.tile_padding_bytes),
      "contributors": {c: _contributors(v)
                       for c, v in estimate.contributors.items()},
  }
