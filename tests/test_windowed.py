"""simulator.tracing.windowed: which reduce-scatters over Y libtpu runs as
its windowed einsum loop, what the loop sends, and the program walk's records
for a traced step."""

import dataclasses

import pytest

from meshes.hardware import CHIPS
from meshes.layout import abstract_mesh, plan_mesh
from meshes.topology import parse_topology
from models.presets import PRESETS
from simulator.settings import TrainSettings
from simulator.timing.roofline import fit_mesh
from simulator.tracing import program, windowed
from simulator.tracing.trace import trace_probe


@pytest.mark.parametrize("y, sent", [(4, 1.25), (8, 2.125), (16, 2.0625),
                                     (32, 2.03125), (2, None), (6, None),
                                     (12, None), (1, None)])
def test_what_the_loop_sends_at_each_probed_size(y, sent):
  assert windowed.sent_over_v(y) == sent


def test_the_threshold_is_on_the_contraction_over_the_results_bytes():
  v5p = CHIPS["v5p"].windowed_einsum_contraction
  assert not windowed.runs_windowed(v5p, 8, 4216, 2)
  assert windowed.runs_windowed(v5p, 8, 4224, 2)
  assert not windowed.runs_windowed(v5p, 8, 4224, 4)  # an f32 result
  assert windowed.runs_windowed(v5p, 8, 8448, 4)
  assert not windowed.runs_windowed(v5p, 2, 1 << 20, 2)  # no loop at Y = 2
  assert not windowed.runs_windowed(0, 8, 1 << 20, 2)  # GPUs: never
  assert CHIPS["h100-sxm"].windowed_einsum_contraction == 0


def _tiny(d_ff):
  return dataclasses.replace(PRESETS["tiny"], d_model=128, d_ff=d_ff,
                             n_kv_heads=4, n_layers=1)


def _step(plan, d_ff):
  settings = TrainSettings(batch=8, seq=64, remat="none")
  return trace_probe(_tiny(d_ff), settings, abstract_mesh(plan))


def test_a_traced_down_projection_past_the_threshold_is_the_loop_on_tpus():
  """Y = 4 on v5p: the MLP's down projection (f = d_ff = 8192) is the loop,
  1.25 V of collective-permutes over Y, overlappable; the attention's
  output projection (f = 64) stays a reduce-scatter; as XLA:GPU compiles
  it (or below the threshold) the down projection is a reduce-scatter."""
  plan = plan_mesh(parse_topology("v5p-32"), 4, 4)
  traced = _step(plan, 8192)
  tpu = program.read_for_plan(traced, plan).collectives
  gpu = program.read_traced(traced, gpu=True).collectives
  loops = [c for c in tpu if c.windowed]
  assert [(c.kind, c.axis, c.phase) for c in loops] == [
      ("permute", "Y", "forward")]
  assert loops[0].overlappable
  rs = [c for c in gpu if c.kind == "reduce-scatter" and c.axis == "Y"
        and c.source == loops[0].source]
  assert len(rs) == 1
  assert loops[0].bytes_per_device == 1.25 * rs[0].bytes_per_device
  assert sum(c.kind == "reduce-scatter" and c.axis == "Y" for c in tpu) == (
      sum(c.kind == "reduce-scatter" and c.axis == "Y" for c in gpu) - 1)
  below = _step(plan, 4096)
  assert not any(c.windowed for c in program.read_for_plan(
      below, plan).collectives)


def test_the_step_time_overlaps_the_loops_sends():
  """The roofline reads the step as the chip's compiler runs it: the loop's
  permutes are an overlappable term over Y."""
  plan = plan_mesh(parse_topology("v5p-32"), 4, 4)
  model = fit_mesh(_tiny(8192), TrainSettings(batch=8, seq=64, remat="none"),
                   plan)
  assert [(t.kind, t.axis, t.overlappable) for t in model.terms
          if t.kind == "permute"] == [("permute", "Y", True)]
