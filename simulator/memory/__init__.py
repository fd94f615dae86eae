"""Per-device memory of a training plan: the step's tensors, and its peak
from a heap simulation of the traced program.

  estimate   MemoryEstimate: categories, the peak, what is live there
  from_trace  the estimate of a traced step (the part that needs jax)
  liveness   the heap simulation (live ranges in program order)
  points     what it leaves as data: each point's bytes, the live sets
  xla_rules  what XLA holds differently from plain live ranges, as rules
  xla_gpu_rules  where XLA:GPU differs from those (TPU-read) rules
  tiling     TPU tiled layouts of arguments
"""

import importlib

# What the package exports, and the module each comes from: imported on first
# use (PEP 562), so importing `simulator.memory.capacity` (what a sweep
# read from its cache needs) does not import the estimator and jax.
_EXPORTS = {
    **{name: "simulator.memory.estimate" for name in (
        "CATEGORIES", "OVERHEAD_FRACTION", "PEAK_CATEGORIES", "SCHEMA_VERSION",
        "Contributor", "MemoryEstimate", "largest_batch",
        "largest_batch_any_schedule", "overhead_bytes", "peak_budget",
        "to_json")},
    **{name: "simulator.memory.from_trace" for name in (
        "estimate_memory", "memory_report")},
    "tpu_tiled_bytes": "simulator.memory.tiling",
}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
  if name not in _EXPORTS:
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
  return getattr(importlib.import_module(_EXPORTS[name]), name)
