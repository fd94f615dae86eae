"""A pipeline schedule's activation memory, as a rule on the traced GPipe step.

The traced program (models.pipeline) is GPipe's: differentiating the stage
loop runs every forward, then every backward, so each device keeps one set
of saved stage activations per loop iteration (M + K - 1 sets: SPMD, every
stage saves in every iteration) until the backward frees them.

1F1B (PipeDream-Flush; Megatron-LM's non-interleaved schedule) starts a
micro-batch's backward as soon as the last stage has run its forward, so a
stage holds the saved activations of at most K micro-batches, min(M, K)
(Narayanan et al. 2021, "Efficient Large-Scale Language Model Training on
GPU Clusters Using Megatron-LM", section 2.2.1: 1F1B "limits the number of
in-flight microbatches to the pipeline depth"); its bubble is GPipe's.

Rule `one_f_one_b`: at every point of the heap simulation, the buffers the
forward made inside the layer stack's scope (the stages' saved activations,
and the running iteration's own) count min(M, K) / (M + K - 1) of their
bytes; the peak is the largest point after that. This rule is not checked
against a compile: XLA compiles the program it is given, the GPipe one.
"""

from __future__ import annotations

from models import scopes
from simulator.memory.points import LiveBuffer, Points


def in_flight_share(stages: int, microbatches: int) -> float:
  """1F1B's saved stage activations over the traced GPipe program's."""
  return min(microbatches, stages) / (microbatches + stages - 1)


def stage_saved(buf: LiveBuffer) -> bool:
  """A buffer the forward made inside the layer stack: a stage's saved
  activation (or the running iteration's)."""
  return not buf.backward and scopes.LAYERS in buf.scopes


def taken_off(nbytes: int, cut: float) -> int:
  """The bytes the rule takes off one stage-saved buffer."""
  return int(nbytes * cut)


def one_f_one_b(points: Points, num: int, den: int, stages: int,
                microbatches: int) -> tuple[int, int, int]:
  """(transient bytes, point index, bytes the rule took off there) of the
  largest point under the rule, at batch scale num/den. Points are visited
  largest first; once a point's GPipe bytes are no more than the best
  reduced figure so far, no later point can beat it (the rule only takes
  bytes off), so few points are walked."""
  values = points.at(num, den)
  cut = 1.0 - in_flight_share(stages, microbatches)
  best = (0, -1, 0)
  for i in sorted(range(len(values)), key=lambda i: -values[i]):
    if values[i] <= best[0]:
      break
    taken = sum(taken_off(b.bytes[0] + b.bytes[1] * num // den, cut)
                for b in points.live(i) if stage_saved(b))
    if values[i] - taken > best[0]:
      best = (int(values[i] - taken), i, taken)
  return best
