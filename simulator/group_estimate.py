"""The sweep's adapter onto simulator.memory and simulator.timing.roofline,
in a module of its own because it imports the estimators (and jax):
simulator.search imports it only when a config is not in the cache. A
GroupEstimate is data once built (its traced program dropped when it is
pickled), so the sweep's cache keeps it: a later sweep of other batches,
or another --hbm_fraction, reads the group instead of tracing it."""

from __future__ import annotations

import math
from typing import Any

from simulator import memory
from simulator.memory.points import LiveSetUnknown
from simulator.timing import roofline
from simulator.tracing import mesh_class

# Multiples of a group's batch step whose peaks a kept estimate knows.
_PEAK_GRID = sorted({2**k for k in range(21)} | {3 * 2**k for k in range(20)})

# What is live at the peak, by category, and the planning overhead.
CATEGORIES = (*memory.PEAK_CATEGORIES, "overhead")


class GroupEstimate:
  """One (mesh, remat, shard, optimizer) group, evaluated at any batch.

  Memory rescales the traced estimate (MemoryEstimate.at_batch); timing reads
  every term as fixed or linear in tokens off the same probe-batch trace.
  `resize`: the step was traced on another mesh of `plan`'s structural class
  (simulator.tracing.mesh_class); the estimators read it at `plan`'s sizes.
  """

  def __init__(self, cfg, traced, plan, settings,
               resize: mesh_class.Resize | None = None):
    self.resize = resize
    with mesh_class.resized(resize):
      self.mesh_model = roofline.fit_mesh(cfg, settings, plan, traced=traced)
      self.base_memory = memory.estimate_memory(traced, plan)
    self.hardware = roofline.Hardware.for_plan(plan)
    self.seq = settings.seq
    self.batch_step = plan.data * settings.batch_splits  # whole micro-batches
    self._largest: dict[float, int] = {}

  def __getstate__(self) -> dict:
    """As data (simulator.cache): first what is live at the peaks of
    batches from one whole step to about a million, two and three times
    each power of two, is walked, while the traced program is at hand; a
    batch whose peak is elsewhere makes `at` None."""
    with mesh_class.resized(self.resize):
      self.base_memory.walk_peaks(self.batch_step * m for m in _PEAK_GRID)
    return self.__dict__

  def largest_batch(self, fraction: float) -> int:
    """The largest global batch, a multiple of `batch_step`, whose peak
    stays within `fraction` of the capacity (0: not even one step): exact
    from the batch-affine memory (simulator.memory.largest_batch), once per
    group."""
    if fraction not in self._largest:
      with mesh_class.resized(self.resize):
        self._largest[fraction] = memory.largest_batch(
            self.base_memory,
            memory.peak_budget(self.base_memory.hbm_bytes, fraction),
            self.batch_step)
    return self._largest[fraction]

  def at(self, batch: int) -> dict[str, Any] | None:
    """The config's figures at `batch`; None from an estimator read from
    the cache that does not know what is live at this batch's peak (the
    sweep traces the group again)."""
    try:
      with mesh_class.resized(self.resize):  # what is live at the peak
        est = self.base_memory.summary_at(batch)
    except LiveSetUnknown:
      return None
    live = {**est.at_peak, "overhead": est.overhead_bytes}
    tokens = batch * self.seq
    step = roofline.step_estimate(self.mesh_model, tokens, self.hardware)
    thr = step.threshold_tokens_global
    return dict(memory={c: int(live.get(c, 0)) for c in CATEGORIES},
                peak_bytes=int(est.peak_bytes),
                peak_where=est.peak_where, t_math_s=step.t_math,
                t_comm_s=step.t_comm, exposed_comm_s=step.exposed_comm,
                step_time_s=step.step_time, t_hbm_s=step.t_hbm,
                t_matmul_hbm_s=step.t_matmul_hbm, t_host_s=step.t_host,
                exposed_host_s=step.exposed_host, mfu=step.mfu,
                roofline_mfu=step.roofline_mfu,
                threshold_tokens_global=thr,
                compute_bound=bool(math.isfinite(thr) and tokens >= thr))
