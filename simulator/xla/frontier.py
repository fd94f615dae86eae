"""XLA's own largest batch, pinned by a few compiles the simulation places.

The simulation's largest batch (simulator.memory.largest_batch) keeps the
larger of its weight-gradient schedules, an upper bound on XLA's peak in all
but one corpus row; XLA's memory scheduler often keeps the smaller, so the
compiler's own frontier is usually further out (llama2_7b v5p-8 4x1 seq 2048
full, 85% of HBM: the estimate says 200 sequences, XLA fits 220; README).
Each compile says whether one batch fits in the same
budget (XLA's `peak_memory_in_bytes`, or libtpu's CompileTimeHbmOom: does not
fit). The first compile is at the simulation's answer, the next at the batch
where its smallest schedule stops fitting (`largest_batch_any_schedule`),
then steps out by doubling and bisects, on multiples of the batch step, so
the frontier is exact in a few compiles where it would take a dozen from
nothing.

XLA's peak is taken to grow with the batch. It does not always: its
latency-hiding scheduler raises the peak only while it stays under 95% of
HBM, so a larger batch can compile smaller (mixtral_mini v5e-16 8x2 experts
over X: 14.52 GiB at b480, 9.72 at b528; README). Where that happens the
answer is a batch XLA fits, not necessarily the largest; the compiles are
listed so the user sees it.
"""

from __future__ import annotations

import dataclasses
from typing import Callable

from meshes.layout import MeshPlan
from models.config import ModelConfig
from simulator.settings import TrainSettings


@dataclasses.dataclass(frozen=True)
class Probe:
  """One compile: XLA's peak at `batch` (for a refusal, its heap's peak as
  it refused: the figure libtpu's message calls HLO temporaries), and
  whether that fits the budget."""
  batch: int
  peak_bytes: int
  refused: bool  # CompileTimeHbmOom: XLA would not lay the step out in HBM
  fits: bool


@dataclasses.dataclass(frozen=True)
class Frontier:
  largest_fit: int  # the largest batch a compile fitted (0: none did)
  smallest_over: int | None  # the smallest a compile did not (None: none)
  step: int  # batches are multiples of it
  probes: tuple[Probe, ...]

  @property
  def exact(self) -> bool:
    """Whether the compiles pinned it: the next batch up did not fit."""
    return (self.smallest_over is not None
            and self.smallest_over - self.largest_fit <= self.step)


def search(probe: Callable[[int], Probe], start: int, guess: int, step: int,
           max_compiles: int) -> Frontier:
  """The largest multiple of `step` that `probe` says fits, taking fitting
  as monotone in the batch: `start` first (the simulation's answer); while
  batches fit, out to `guess`, one step past it, then by doubling strides;
  once one does not fit, bisection (down from `start` if even it does
  not). At most `max_compiles` probes; `exact` says whether they were
  enough."""
  if step <= 0 or max_compiles <= 0:
    raise ValueError(f"step={step} and max_compiles={max_compiles} must be "
                     "positive")
  start = max(start, step) // step * step
  jump = max(0, guess - start) // step * step
  strides = iter(([jump] if jump else []) + [step] + [
      max(step, jump) << k for k in range(1, 64)])
  done: list[Probe] = []
  lo, hi = 0, None  # largest known to fit (0: none), smallest known not to
  nxt = start
  while len(done) < max_compiles:
    p = probe(nxt)
    done.append(p)
    if p.fits:
      lo = nxt
    else:
      hi = nxt
    if hi is not None and hi - lo <= step:
      break
    if hi is None:  # every compile fitted: step out
      nxt = lo + next(strides)
    else:
      nxt = max(lo + step, (lo + hi) // 2 // step * step)
  return Frontier(lo, hi, step, tuple(done))


def compile_probe(cfg: ModelConfig, settings: TrainSettings, plan: MeshPlan,
                  cap_bytes: int, scheduler: str = "default"
                  ) -> Callable[[int], Probe]:
  """A probe that compiles the step at a batch for `plan`'s target (on a TPU
  with libtpu's memory scheduler `scheduler`) and holds XLA's peak against
  `cap_bytes`; an out-of-HBM refusal is an answer."""
  from simulator.xla import compiled, crosscheck

  def run(batch: int) -> Probe:
    try:
      report = compiled.compile_report(
          cfg, dataclasses.replace(settings, batch=batch), plan.topology.name,
          plan.X, plan.Y, progress=None, D=plan.D, scheduler=scheduler)
    except Exception as e:  # noqa: BLE001 - only XLA's HBM refusal is kept
      oom = crosscheck.hbm_oom(str(e))
      if oom is None:
        raise
      return Probe(batch, oom["temp_bytes"], True, False)
    return Probe(batch, report.peak_bytes, False,
                 report.peak_bytes <= cap_bytes)

  return run
