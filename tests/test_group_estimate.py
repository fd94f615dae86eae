"""simulator.group_estimate: one sweep group read at any batch, the same as
the memory and step-time estimators give for that batch on their own."""

from meshes.layout import abstract_mesh, plan_mesh
from meshes.topology import parse_topology
from models.registry import load_model
from simulator import memory
from simulator.group_estimate import CATEGORIES, GroupEstimate
from simulator.settings import TrainSettings
from simulator.tracing.trace import trace_probe


def test_a_group_at_a_batch_is_the_estimate_at_that_batch():
  cfg = load_model("tiny")
  plan = plan_mesh(parse_topology("v5p-8"), 4, 1)
  settings = TrainSettings(batch=8, seq=32, remat="full")
  traced = trace_probe(cfg, settings, abstract_mesh(plan))
  group = GroupEstimate(cfg, traced, plan, settings)
  for batch in (8, 64):
    values = group.at(batch)
    direct = memory.estimate_memory(traced, plan).at_batch(batch)
    assert values["peak_bytes"] == int(direct.per_device_bytes["peak"])
    assert set(values["memory"]) == set(CATEGORIES)
    assert sum(values["memory"].values()) == values["peak_bytes"]
    assert values["step_time_s"] > 0 and 0 < values["mfu"] <= 1
  # the largest batch within a share of the capacity fits there, the next
  # whole step does not
  largest = group.largest_batch(0.85)
  limit = 0.85 * group.base_memory.hbm_bytes
  assert group.base_memory.at_batch(largest).compiled_comparable_peak <= limit
  assert group.base_memory.at_batch(largest + group.batch_step
                                    ).compiled_comparable_peak > limit
