"""simulator.trace.fused_residuals: which residuals XLA keeps as buffers."""

import jax
import jax.numpy as jnp

from simulator.trace import fused_residuals


def _fused_by_shape(fn, *args) -> dict[tuple, list[bool]]:
  out: dict[tuple, list[bool]] = {}
  for r in fused_residuals(fn, *args):
    if not r.source.startswith("from the argument"):
      out.setdefault(r.aval.shape, []).append(r.fused)
  return out


def test_norm_intermediates_fuse_matmul_outputs_stay():
  """An RMS norm's f32 chain feeding a matmul: the chain is fused, the bf16
  value the matmul reads and the matmul's output are buffers."""
  def f(x, w):
    x32 = x.astype(jnp.float32)
    y = x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, -1, keepdims=True) + 1e-6)
    h = jnp.dot(y.astype(jnp.bfloat16), w)  # (8, 32)
    return jnp.sum(jnp.tanh(h).astype(jnp.float32))

  x = jnp.ones((8, 16), jnp.bfloat16)
  w = jnp.ones((16, 32), jnp.bfloat16)
  got = _fused_by_shape(f, x, w)
  assert True in got[(8, 16)] and False in got[(8, 16)]  # f32 chain; bf16 input
  assert got[(8, 32)].count(False) >= 1  # the matmul output
  assert all(got[(8, 32)][1:])  # tanh and what follows: fused


def test_matmul_plus_bias_is_a_buffer_activation_of_it_is_not():
  def f(x, w, b):
    h = jnp.dot(x, w) + b[None, :]  # XLA's output fusion: one buffer
    return jnp.sum(jax.nn.silu(h) * h)

  x, w, b = jnp.ones((8, 16)), jnp.ones((16, 32)), jnp.ones((32,))
  flags = _fused_by_shape(f, x, w, b)[(8, 32)]
  assert flags[0] is False  # dot + bias (the dot output is not saved)
  assert flags[1:] and all(flags[1:])  # silu's internals
