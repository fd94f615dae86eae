"""Exact layouts of params, grads and optimizer state for each ZeRO choice."""

import dataclasses

import jax
import jax.extend
import pytest
from jax.sharding import AbstractMesh, AxisType, PartitionSpec as P

from models.presets import PRESETS
from simulator.settings import TrainSettings
from simulator.model_checks import kv_heads_replicated
from simulator.step import build_step, kv_heads_note
from simulator.tracing.trace import trace

MESH = AbstractMesh((4, 2), ("X", "Y"), axis_types=(AxisType.Explicit,) * 2)
TINY = PRESETS["tiny"]


def _spec(tree, *path):
  for key in path:
    tree = tree[key]
  return tree.sharding.spec


@pytest.mark.parametrize("shard, params, grads, moments", [
    ("dp", P(None, None, "Y"), P(None, None, "Y"), P(None, None, "Y")),
    ("zero1", P(None, None, "Y"), P(None, None, "Y"), P(None, "X", "Y")),
    ("zero2", P(None, None, "Y"), P(None, "X", "Y"), P(None, "X", "Y")),
    ("zero3", P(None, "X", "Y"), P(None, "X", "Y"), P(None, "X", "Y")),
])
def test_zero_stages_shard_what_they_say(shard, params, grads, moments):
  step = build_step(TINY, TrainSettings(batch=8, seq=32, shard=shard), MESH)
  wi = ("blocks", "mlp", "wi", "kernel")
  assert _spec(step.params, *wi) == params
  assert _spec(step.grads, *wi) == grads
  adam = step.opt_state[0]
  assert _spec(adam.mu, *wi) == moments and _spec(adam.nu, *wi) == moments
  assert step.batch["inputs"].sharding.spec == P("X", None)


def test_precision_policies_set_param_and_state_dtypes():
  dtypes = {}
  for precision in ("mixed", "bf16_master", "bf16"):
    step = build_step(TINY, TrainSettings(batch=8, seq=32, precision=precision),
                      MESH)
    leaves = jax.tree.leaves(step.opt_state)
    dtypes[precision] = (str(step.params["embedding"].dtype),
                         sorted({str(x.dtype) for x in leaves if x.ndim}))
  assert dtypes["mixed"] == ("float32", ["float32"])
  # bf16 params; the master copy and moments are f32.
  assert dtypes["bf16_master"] == ("bfloat16", ["float32"])
  assert dtypes["bf16"] == ("bfloat16", ["bfloat16"])


def test_gpt2_vocab_is_padded_for_tp():
  step = build_step(PRESETS["gpt2"], TrainSettings(batch=8, seq=32), MESH)
  assert step.vocab_padding == 1  # 50257 → 50258 for Y=2
  assert step.params["embedding"].shape == (50258, 768)


def test_indivisible_dims_are_rejected():
  mesh = AbstractMesh((2, 4), ("X", "Y"), axis_types=(AxisType.Explicit,) * 2)
  with pytest.raises(ValueError, match="Y=4 divides neither the 2 kv heads nor the 2 query heads"):
    build_step(TINY, TrainSettings(batch=8, seq=32), mesh)
  with pytest.raises(ValueError, match="dimension 6 is sharded over X=4"):
    build_step(TINY, TrainSettings(batch=6, seq=32), MESH)


def _residual_bytes(remat):
  t = trace(TINY, TrainSettings(batch=8, seq=32, remat=remat,
                                attention="materialized"), MESH)
  return sum(r.aval.size for r in t.residuals
             if not r.argument)


def test_remat_policy_changes_what_backward_keeps():
  sizes = {r: _residual_bytes(r) for r in ("none", "dots", "names:qkv", "full")}
  assert sizes["full"] < sizes["names:qkv"] < sizes["dots"] < sizes["none"]


def _x_gathers(jaxpr):
  """reshards that drop X from some dim: all-gathers over X."""
  n = 0
  for eqn in jaxpr.eqns:
    if eqn.primitive.name == "reshard":
      src, dst = eqn.invars[0].aval.sharding.spec, eqn.params["dst_sharding"].spec
      n += any(a == "X" and b != "X" for a, b in zip(src, dst))
    for sub in jax.extend.core.jaxprs_in_params(eqn.params):
      n += _x_gathers(sub)
  return n


def test_zero3_gathers_weights_in_the_program():
  gathers = {s: _x_gathers(trace(TINY, TrainSettings(batch=8, seq=32, shard=s),
                                 MESH).jaxpr.jaxpr) for s in ("dp", "zero3")}
  assert gathers["dp"] == 0 < gathers["zero3"]


@pytest.mark.parametrize("attention", ["flash", "materialized"])
@pytest.mark.parametrize("kv_heads,mesh_shape", [(1, (4, 1)), (1, (2, 2)),
                                                  (2, (1, 4))])
def test_kv_heads_fewer_than_y_are_replicated(attention, kv_heads, mesh_shape):
  """An MQA model (one kv head, as gemma-2b) traces on any Y dividing its
  query heads: the kv projections are replicated over Y, the query heads
  sharded, and the kv gradients summed over the query groups land in the kv
  layout (an all-reduce over Y)."""
  cfg = dataclasses.replace(TINY, n_heads=8, n_kv_heads=kv_heads)
  mesh = AbstractMesh(mesh_shape, ("X", "Y"),
                      axis_types=(AxisType.Explicit,) * 2)
  y = mesh_shape[1]
  assert kv_heads_replicated(cfg, y) == (kv_heads % y != 0)
  settings = TrainSettings(batch=8, seq=128, attention=attention)
  step = build_step(cfg, settings, mesh)
  k_spec = step.params["blocks"]["attn"]["k"]["kernel"].sharding.spec
  q_spec = step.params["blocks"]["attn"]["q"]["kernel"].sharding.spec
  assert "Y" in tuple(q_spec) and ("Y" in tuple(k_spec)) == (kv_heads % y == 0)
  traced = trace(cfg, settings, mesh)
  assert traced.residuals
  if kv_heads_replicated(cfg, y):
    assert "kv heads replicated over Y=" in kv_heads_note(cfg, y)
