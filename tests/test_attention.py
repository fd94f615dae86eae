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


def test_flash_saves_no_scores(qkv):
  from simulator.trace import fused_residuals
  q, k, v = qkv
  s = q.shape[1]
  for impl, has_s2 in (("flash", False), ("materialized", True)):
    res = fused_residuals(lambda q, k, v: attention.attend(impl, q, k, v).sum(),
                          q, k, v)
    assert any(r.aval.shape[-2:] == (s, s) for r in res) == has_s2, impl


def test_unknown_attention():
  with pytest.raises(ValueError, match="unknown attention 'sparse'"):
    attention.attend("sparse", None, None, None)
