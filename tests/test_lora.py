"""LoRA (issue 17): adapters as real Flax parameters, the base frozen."""

import jax
import pytest

from meshes.layout import abstract_mesh, plan_mesh
from meshes.topology import parse_topology
from models.registry import load_model
from simulator import memory
from simulator.settings import TrainSettings
from simulator.step import build_step, trainable_params

PLAN = plan_mesh(parse_topology("v5p-8"), 2, 2)


def _step(**kw):
  return build_step(load_model("tiny"), TrainSettings(batch=8, seq=64, **kw),
                    abstract_mesh(PLAN))


def test_adapters_are_r_times_in_plus_out_per_projection():
  """tiny: d 64, 4 query heads and 2 kv heads of 16, 2 layers, d_ff 128."""
  c, r = load_model("tiny"), 8
  q, kv = c.n_heads * c.head_dim, c.n_kv_heads * c.head_dim
  per_layer = {"q": r * (64 + q), "k": r * (64 + kv), "v": r * (64 + kv),
               "o": r * (q + 64), "wi": r * (64 + 128), "wo": r * (128 + 64)}
  for targets in (("q", "k", "v", "o"), ("wi", "wo")):
    step = _step(lora_rank=r, lora_targets=targets)
    assert trainable_params(step) == c.n_layers * sum(
        per_layer[t] for t in targets)


def test_the_base_is_frozen_no_gradient_no_optimizer_state():
  full, lora = _step(), _step(lora_rank=4)
  grad_paths = [jax.tree_util.keystr(p) for p, _ in
                jax.tree_util.tree_flatten_with_path(lora.grads)[0]]
  assert grad_paths and all("lora_" in p for p in grad_paths)
  n = lambda tree: sum(x.size for x in jax.tree.leaves(tree))
  assert n(lora.params) == n(full.params) + trainable_params(lora)
  assert n(lora.opt_state) < n(full.opt_state) / 10
  # The traced step makes no weight gradient for a frozen kernel.
  e_full = memory.memory_report(load_model("tiny"),
                                TrainSettings(batch=8, seq=64), PLAN)
  e_lora = memory.memory_report(load_model("tiny"), TrainSettings(
      batch=8, seq=64, lora_rank=4), PLAN)
  assert e_lora.per_device_bytes["grads"] < e_full.per_device_bytes["grads"] / 10
  assert e_lora.trainable_params == trainable_params(lora)
  assert memory.to_json(e_lora)["trainable_params"] == e_lora.trainable_params


@pytest.mark.parametrize("kw,match", [
    (dict(lora_rank=-1), "lora_rank=-1"),
    (dict(lora_rank=4, lora_targets=("q", "attn")), "'attn' is not a projection"),
    (dict(lora_rank=4, lora_targets=()), "'empty' is not a projection"),
    (dict(lora_rank=4, lora_targets=("q", "q", "v")), "'q' is given twice"),
])
def test_bad_lora_settings(kw, match):
  with pytest.raises(ValueError, match=match):
    TrainSettings(**kw)
