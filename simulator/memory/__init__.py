"""Per-device memory of a training plan: the step's tensors, and its peak
from a heap simulation of the traced program.

  estimate   MemoryEstimate: categories, the peak, what is live there
  liveness   the heap simulation (live ranges in program order)
  xla_rules  what XLA holds differently from plain live ranges, as rules
  xla_gpu_rules  where XLA:GPU differs from those (TPU-read) rules
  tiling     TPU tiled layouts of arguments
"""

from simulator.memory.estimate import (CATEGORIES, OVERHEAD_FRACTION,
                                       PEAK_CATEGORIES, SCHEMA_VERSION,
                                       Contributor, MemoryEstimate,
                                       estimate_memory, largest_batch,
                                       largest_batch_any_schedule,
                                       memory_report, to_json)
from simulator.memory.tiling import tpu_tiled_bytes

__all__ = ["CATEGORIES", "OVERHEAD_FRACTION", "PEAK_CATEGORIES",
           "SCHEMA_VERSION", "Contributor", "MemoryEstimate",
           "estimate_memory", "largest_batch", "largest_batch_any_schedule",
           "memory_report", "to_json",
           "tpu_tiled_bytes"]
