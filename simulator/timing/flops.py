"""FLOPs of the traced train step, from its dot_generals.

Only matmuls are counted (elementwise work, norms, softmax and the optimizer update
are left out: a few FLOPs per element against thousands per matmul element). Per
dot_general: global FLOPs 2·|out|·|contracting|, and per-device FLOPs from the
operands' local shapes after the all-gathers the sharding implies (so replicated work
is charged to every device that does it).
"""

from __future__ import annotations

import collections
import dataclasses

from simulator.tracing.program import Dot, Program, read_traced


@dataclasses.dataclass(frozen=True)
class FlopCount:
  dots: tuple[Dot, ...]
  total_global: int  # whole step, all devices
  total_per_device: int
  by_phase: dict[str, int]  # global FLOPs per phase (forward/backward/optimizer)
  by_layer: dict[str, int]  # per-device FLOPs per layer kind, all instances
  per_layer_instance: dict[str, int]  # per-device FLOPs of one instance of a layer


def count_flops(program_or_traced) -> FlopCount:
  """FLOPs of a Program, or of a simulator.tracing.trace.Traced step."""
  program = (program_or_traced if isinstance(program_or_traced, Program)
             else read_traced(program_or_traced))
  by_phase, by_layer = collections.Counter(), collections.Counter()
  instances: dict[str, int] = {}
  for d in program.dots:
    by_phase[d.phase] += d.flops_global * d.count
    by_layer[d.layer] += d.flops_per_device * d.count
    instances[d.layer] = max(instances.get(d.layer, 1), d.count)
  for phase in ("forward", "backward", "optimizer"):
    by_phase.setdefault(phase, 0)
  return FlopCount(
      dots=tuple(program.dots),
      total_global=sum(by_phase.values()),
      total_per_device=sum(by_layer.values()),
      by_phase=dict(by_phase), by_layer=dict(by_layer),
      per_layer_instance={k: v // instances[k] for k, v in by_layer.items()})
