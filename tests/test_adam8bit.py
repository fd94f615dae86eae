"""simulator.adam8bit: bitsandbytes' blockwise 8-bit AdamW as an optax
transformation."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from jax.sharding import AxisType, NamedSharding, PartitionSpec as P

from meshes.layout import abstract_mesh, plan_mesh
from meshes.topology import parse_topology
from models.registry import load_model
from simulator import adam8bit as A
from simulator import memory
from simulator.optimizers import make_optimizer
from simulator.settings import TrainSettings
from simulator.step import build_step


def test_dynamic_maps_as_bitsandbytes_builds_them():
  """create_dynamic_map(signed, 7, 8): 256 sorted values; signed runs from
  -0.99296875 (no -1) to 1, unsigned from 0, its smallest step 1e-6 *
  mean(0.1, 0.55)."""
  for table in (A.SIGNED, A.UNSIGNED):
    assert table.shape == (256,) and np.all(np.diff(table) > 0)
    assert table[-1] == 1.0 and 0.0 in table
  assert A.SIGNED[0] == pytest.approx(-0.99296875)
  assert np.sum(A.SIGNED < 0) == 127 and np.sum(A.SIGNED > 0) == 128
  assert A.UNSIGNED[0] == 0.0
  assert A.UNSIGNED[1] == pytest.approx(0.325e-6)


def test_quantize_is_nearest_code_times_block_absmax():
  x = jax.random.normal(jax.random.key(0), (3, 4096)) * jnp.arange(
      1, 4097) / 4096
  q = A.quantize(x, A.SIGNED)
  assert q.codes.dtype == jnp.uint8 and q.codes.shape == x.shape
  assert q.absmax.shape == (3, 2)  # blocks of 2048 along the last dim
  blocks = np.asarray(x).reshape(3, 2, 2048)
  np.testing.assert_array_equal(q.absmax, np.abs(blocks).max(-1))
  scaled = blocks / np.abs(blocks).max(-1, keepdims=True)
  nearest = np.abs(scaled[..., None] - A.SIGNED).argmin(-1)
  np.testing.assert_array_equal(np.asarray(q.codes).reshape(3, 2, 2048),
                                nearest)
  back = A.dequantize(q, A.SIGNED)
  np.testing.assert_allclose(
      back, (A.SIGNED[nearest] * np.abs(blocks).max(-1, keepdims=True)
             ).reshape(3, 4096), rtol=1e-6)


def test_block_is_bitsandbytes_2048_within_a_shard():
  """gcd(per-device last dim, 2048): 11008 gives 256 (43 x 256)."""
  assert A.block_size(jnp.zeros((4, 4096))) == 2048
  assert A.block_size(jnp.zeros((4, 11008))) == 256
  mesh = jax.sharding.AbstractMesh((2, 2), ("X", "Y"),
                                   axis_types=(AxisType.Explicit,) * 2)
  with jax.sharding.use_abstract_mesh(mesh):
    x = jax.ShapeDtypeStruct((32, 1024, 4096), jnp.float32,
                             sharding=NamedSharding(mesh, P(None, "Y", "X")))
    state = jax.eval_shape(A.adamw_8bit(1e-3).init, {"w": x})
    jaxpr = jax.make_jaxpr(lambda x: A.dequantize(A.quantize(
        x, A.UNSIGNED), A.UNSIGNED))(x)
  mu = state.mu["w"]
  assert mu.codes.shape == (32, 1024, 4096) and mu.codes.dtype == jnp.uint8
  assert mu.absmax.shape == (32, 1024, 2)  # the local 2048 is one block
  assert mu.codes.sharding.spec == mu.absmax.sharding.spec == P(None, "Y",
                                                                "X")
  # Per device: no gather of the codes, no reshard moves data.
  assert [e.primitive.name for e in jaxpr.eqns] == ["shard_map"] * 2


def test_state_bytes_two_per_parameter_plus_scales():
  """The optimizer's bytes as the step holds them: uint8 codes for both
  moments, an f32 absmax per block, f32 moments under 4096 elements."""
  cfg = load_model("tiny")
  plan = plan_mesh(parse_topology("v5p-8"), 2, 2)
  est = lambda opt: memory.memory_report(cfg, TrainSettings(
      batch=8, seq=64, optimizer=opt), plan)
  eight, full = est("adamw_8bit"), est("adamw")
  step = build_step(cfg, TrainSettings(batch=8, seq=64,
                                       optimizer="adamw_8bit"),
                    abstract_mesh(plan))
  expect = 4  # the step count
  for g in jax.tree.leaves(step.grads):
    n = math.prod(g.sharding.shard_shape(g.shape))
    if g.size >= A.MIN_8BIT_SIZE:
      block = math.gcd(g.sharding.shard_shape(g.shape)[-1], A.BLOCK)
      expect += 2 * (n + 4 * n // block)
    else:
      expect += 2 * 4 * n
  assert eight.per_device_bytes["optimizer"] == expect
  assert eight.per_device_bytes["optimizer"] < full.per_device_bytes[
      "optimizer"] / 2


def test_it_trains_like_adamw():
  """A quadratic: within 5% of optax.adamw's loss after 300 steps, from
  41124 at the start."""
  target = {"w": jax.random.normal(jax.random.key(0), (8, 4096)),
            "b": jnp.arange(16.0) / 16}
  loss = lambda p: sum(jnp.sum((p[k] - target[k]) ** 2) for k in p)
  start = {"w": jnp.full((8, 4096), 0.5), "b": jnp.zeros(16)}

  def run(tx):
    @jax.jit
    def step(p, s):
      u, s = tx.update(jax.grad(loss)(p), s, p)
      return optax.apply_updates(p, u), s
    p, s = start, tx.init(start)
    for _ in range(300):
      p, s = step(p, s)
    return float(loss(p))

  eight, full = run(A.adamw_8bit(1e-2)), run(optax.adamw(1e-2))
  assert eight < float(loss(start)) / 50
  assert eight == pytest.approx(full, rel=0.05)


def test_by_name():
  tx = make_optimizer("adamw_8bit", "bf16_master")  # on the f32 master copy
  state = tx.init({"w": jnp.zeros((2, 4096), jnp.bfloat16)})
  assert state.inner.mu["w"].codes.dtype == jnp.uint8
