import jax
import jax.numpy as jnp
import numpy as np
import pytest

from models import attention


@pytest.fixture
def qkv():
  k1, k2, k3 = jax.random.split(jax.random.key(0), 3)
  shape = (2, 64, 2, 3, 16)  # B, S, kv heads, groups, head dim
  return (jax.random.normal(k1, shape), jax.random.normal(k2, shape[:3] + (16,)),
          jax.random.normal(k3, shape[:3] + (16,)))


def test_flash_matches_materialized_values_and_grads(qkv, monkeypatch):
  monkeypatch.setattr(attention, "FLASH_BLOCK", 16)  # 4 key blocks
  weights = jnp.sin(jnp.arange(16.0))
  loss = lambda fn: lambda q, k, v: jnp.sum(fn(q, k, v) * weights)
  np.testing.assert_allclose(attention.flash(*qkv),
                             attention.materialized(*qkv), atol=1e-5)
  for a, b in zip(jax.grad(loss(attention.flash), (0, 1, 2))(*qkv),
                  jax.grad(loss(attention.materialized), (0, 1, 2))(*qkv)):
    np.testing.assert_allclose(a, b, atol=1e-4)


@pytest.mark.parametrize("causal", [True, False])
def test_flash_with_a_bias_matches_materialized(qkv, monkeypatch, causal):
  """T5's case: a trained bias on the scores, unscaled q·k, keys longer than
  queries (cross-attention) or a bidirectional mask; the bias's gradient
  too."""
  monkeypatch.setattr(attention, "FLASH_BLOCK", 16)
  q, k, v = qkv
  if not causal:  # cross-attention: 32 queries over 64 keys
    q = q[:, :32]
  bias = jax.random.normal(jax.random.key(1), (2, 3, q.shape[1], k.shape[1]))
  weights = jnp.sin(jnp.arange(16.0))
  loss = lambda impl: lambda q, k, v, b: jnp.sum(attention.attend(
      impl, q, k, v, b, causal, 1.0) * weights)
  np.testing.assert_allclose(
      attention.flash(q, k, v, bias, causal, 1.0),
      attention.materialized(q, k, v, bias, causal, 1.0), atol=1e-5)
  grads = [jax.grad(loss(impl), (0, 1, 2, 3))(q, k, v, bias)
           for impl in ("flash", "materialized")]
  for a, b in zip(*grads):
    np.testing.assert_allclose(a, b, atol=1e-4)
  assert float(jnp.abs(grads[0][3]).sum()) > 0


def test_flash_saves_no_scores(qkv):
  from simulator.tracing.trace import fused_residuals
  q, k, v = qkv
  s = q.shape[1]
  for impl, has_s2 in (("flash", False), ("materialized", True)):
    res = fused_residuals(lambda q, k, v: attention.attend(impl, q, k, v).sum(),
                          q, k, v)
    assert any(r.aval.shape[-2:] == (s, s) for r in res) == has_s2, impl


def test_unknown_attention():
  with pytest.raises(ValueError, match="unknown attention 'sparse'"):
    attention.attend("sparse", None, None, None)


def test_flash_names_the_lengths_its_blocks_divide(qkv, monkeypatch):
  """A key length the flash block does not divide is a one-line error
  naming the multiples on either side and the other attention."""
  monkeypatch.setattr(attention, "FLASH_BLOCK", 24)  # 64 keys: 48 or 72
  q, k, v = qkv
  with pytest.raises(ValueError, match=r"sequence length 64 .* block size "
                     r"24; choose one that is \(48 or 72\) or "
                     r"--attention=materialized"):
    attention.attend("flash", q, k, v)
