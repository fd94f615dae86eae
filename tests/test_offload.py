"""--offload (issue 17): state in pinned host memory between steps."""

import jax
import pytest
from jax.extend import core as jcore

from meshes.layout import abstract_mesh, plan_mesh
from meshes.topology import parse_topology
from models.registry import load_model
from simulator import memory
from simulator.settings import TrainSettings
from simulator.step import build_step

PLAN = plan_mesh(parse_topology("v5p-8"), 2, 2)


def _settings(*offload):
  return TrainSettings(batch=8, seq=64, offload=offload)


def _estimate(*offload):
  return memory.memory_report(load_model("tiny"), _settings(*offload), PLAN)


def _kinds(tree) -> set:
  return {x.sharding.memory_kind for x in jax.tree.leaves(tree)}


def test_offloaded_state_is_host_bytes_not_hbm():
  base = _estimate()
  opt, both = _estimate("optimizer"), _estimate("optimizer", "params")
  assert opt.per_device_bytes["optimizer"] == 0
  assert opt.host_bytes == base.per_device_bytes["optimizer"]
  assert both.per_device_bytes["params"] == 0
  assert both.host_bytes == (base.per_device_bytes["optimizer"]
                             + base.per_device_bytes["params"])
  assert memory.to_json(both)["host_bytes"] == both.host_bytes


def test_the_step_keeps_state_on_the_host_and_fetches_it():
  step = build_step(load_model("tiny"), _settings("optimizer", "params"),
                    abstract_mesh(PLAN))
  assert _kinds(step.opt_state) == _kinds(step.params) == {"pinned_host"}
  with jax.sharding.use_abstract_mesh(abstract_mesh(PLAN)):
    jaxpr = jax.make_jaxpr(step.fn)(*step.args)
  outs = jaxpr.out_avals
  n = len(jax.tree.leaves(step.params))
  assert all(a.memory_space == jax.memory.Space.Host for a in outs[:n])

  def puts_in_scans(j, inside=False):
    """device_puts to the device, inside a scan body or not."""
    found = []
    for e in j.eqns:
      if e.primitive.name == "device_put" and inside:
        found += [v.aval.memory_space for v in e.outvars]
      for sub in jcore.jaxprs_in_params(e.params):
        found += puts_in_scans(sub, inside or e.primitive.name == "scan")
    return found
  # The layers fetch their own slice of each stacked parameter per layer.
  assert jax.memory.Space.Device in puts_in_scans(jaxpr.jaxpr)


def test_bad_offload():
  with pytest.raises(ValueError, match="'activations'; valid: optimizer, "
                     "params"):
    _settings("activations")


def test_pinned_host_bytes_and_the_ram_of_one_host():
  """What --offload pins is memory kind pinned_host; a host machine holds
  every local device's share (v5p: 4 chips per host VM)."""
  base, both = _estimate(), _estimate("optimizer", "params")
  assert base.pinned_host_bytes == base.host_bytes == base.host_ram_bytes == 0
  assert both.pinned_host_bytes == both.host_bytes > 0
  assert both.host_devices == 4
  assert both.host_ram_bytes == 4 * both.host_bytes
  js = memory.to_json(both)
  assert (js["pinned_host_bytes"], js["host_ram_bytes"]) == (
      both.host_bytes, 4 * both.host_bytes)
  # The batch rescaling keeps them (the state does not scale with it).
  again = both.at_batch(16)
  assert (again.pinned_host_bytes, again.host_ram_bytes) == (
      both.pinned_host_bytes, both.host_ram_bytes)


def test_offloaded_residuals_are_pinned_too():
  """remat offload: models.remat moves the named residuals to pinned_host."""
  est = memory.memory_report(load_model("tiny"), TrainSettings(
      batch=8, seq=64, remat="offload:qkv"), PLAN)
  assert est.pinned_host_bytes == est.host_bytes > 0
