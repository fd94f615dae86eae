"""models.rules: logical axis names to mesh axes, a tuple of them included."""

import pytest
from jax.sharding import PartitionSpec as P

from models.rules import FSDP_TP, expert_rules


def test_a_logical_axis_may_map_to_several_mesh_axes():
  """With replicas the batch is split over D and X together; a later dim
  mapped to an axis already used keeps the rest of its axes (experts over
  X: an expert-major activation's batch is split over D alone)."""
  rules = FSDP_TP.replace("activations", batch=("D", "X"))
  assert rules.spec("activations", ("batch", "length", "embed")) == P(
      ("D", "X"), None, "Y")
  experts = expert_rules(rules, "X")
  assert experts.spec("activations", ("exp", "batch", "embed")) == P(
      "X", "D", "Y")
  assert experts.spec("activations", ("batch", "exp")) == P(("D", "X"), None)


def test_an_unknown_mesh_axis_is_refused():
  with pytest.raises(ValueError, match="unknown mesh axis 'Z'"):
    FSDP_TP.replace("activations", batch=("D", "Z"))
