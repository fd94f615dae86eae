"""Attention cores: materialized scores, or a blockwise (flash) loop.

Shapes: q_BxSxKxGxH (K kv heads, G query heads per kv head, H head dim),
k/v_BxTxKxH (T = S in self-attention). `materialized` keeps the B·heads·S·T
probabilities for backward; `flash` is a custom_vjp that saves only q, k, v,
the output and the per-row log-sum-exp (O(S) per head), recomputing
probabilities block by block. Decoders mask causally; an encoder and
cross-attention do not. `bias_KxGxSxT` (T5's relative position bias, shared
by the batch and trained) is added to the scores; `scale` multiplies q·k
(1/sqrt(H) unless given: T5 folds it into its initialisation and passes 1).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from models.config import FLASH_BLOCK

IMPLEMENTATIONS = ("materialized", "flash")


def _scores(q, k, q_pos, k_pos, causal, scale, bias=None):
  s = jnp.einsum("bskgh,btkh->bkgst", q, k,
                 preferred_element_type=jnp.float32) * scale
  if bias is not None:
    s = s + bias[None]
  if not causal:
    return s
  return jnp.where(q_pos[:, None] >= k_pos[None, :], s, -1e30)


def materialized(q, k, v, bias=None, causal=True, scale=None, start=0):
  """q at positions start..start+S-1 attends to k, v at 0..T-1 (T = S from
  0 in training; a decode step's q against the whole KV cache)."""
  scale = q.shape[-1] ** -0.5 if scale is None else scale
  q_pos = jnp.arange(q.shape[1])
  if not isinstance(start, int) or start:
    q_pos = q_pos + start
  k_pos = jnp.arange(k.shape[1])
  p_BxKxGxSxT = jax.nn.softmax(_scores(q, k, q_pos, k_pos, causal, scale, bias),
                               axis=-1).astype(q.dtype)
  return jnp.einsum("bkgst,btkh->bskgh", p_BxKxGxSxT, v)


def _layout_of(x):
  """x's layout under a mesh (None without one). A kv-head gradient sums
  over the query groups, which a mesh axis may shard while the kv heads are
  replicated (simulator.step.kv_heads_replicated): the sum is laid out (all-
  reduced) like the kv heads themselves."""
  if jax.sharding.get_abstract_mesh().empty:
    return None
  return jax.typeof(x).sharding.spec


def _blocks(x, block):
  """[B, T, ...] → [T/block, B, block, ...] so lax.scan walks key blocks."""
  b, t = x.shape[:2]
  x = x.reshape(b, t // block, block, *x.shape[2:])
  return jnp.moveaxis(x, 1, 0)


def _bias_blocks(bias, block):
  """bias_KxGxSxT → [T/block, K, G, S, block] (None stays None)."""
  if bias is None:
    return None
  k, g, s, t = bias.shape
  return jnp.moveaxis(bias.reshape(k, g, s, t // block, block), 3, 0)


def _forward(q, k, v, bias, block, causal, scale):
  q_pos = jnp.arange(q.shape[1])

  def step(carry, kv):
    m, l, acc = carry
    k_blk, v_blk, b_blk, start = kv
    sc = _scores(q, k_blk, q_pos, start + jnp.arange(block), causal, scale,
                 b_blk)
    m_new = jnp.maximum(m, sc.max(-1))
    p = jnp.exp(sc - m_new[..., None])
    corr = jnp.exp(m - m_new)
    l = l * corr + p.sum(-1)
    pv = jnp.einsum("bkgst,btkh->bkgsh", p.astype(v.dtype), v_blk,
                    preferred_element_type=jnp.float32)
    acc = acc * corr[..., None] + pv
    return (m_new, l, acc), None

  stats = jnp.einsum("bskgh->bkgs", jnp.zeros_like(q, dtype=jnp.float32))
  init = (stats - 1e30, stats, jnp.einsum("bskgh->bkgsh",
                                          jnp.zeros_like(q, jnp.float32)))
  starts = jnp.arange(0, k.shape[1], block)
  (m, l, acc), _ = jax.lax.scan(step, init, (
      _blocks(k, block), _blocks(v, block), _bias_blocks(bias, block), starts))
  out = jnp.einsum("bkgsh->bskgh", acc / l[..., None]).astype(q.dtype)
  return out, m + jnp.log(l)


def _backward(block, causal, scale, res, d_out):
  q, k, v, bias, out, lse = res
  q_pos = jnp.arange(q.shape[1])
  delta = jnp.einsum("bskgh,bskgh->bkgs", d_out.astype(jnp.float32),
                     out.astype(jnp.float32))

  def step(dq, kv):
    k_blk, v_blk, b_blk, start = kv
    p = jnp.exp(_scores(q, k_blk, q_pos, start + jnp.arange(block), causal,
                        scale, b_blk) - lse[..., None])
    dv = jnp.einsum("bkgst,bskgh->btkh", p.astype(d_out.dtype), d_out,
                    out_sharding=_layout_of(v_blk))
    dp = jnp.einsum("bskgh,btkh->bkgst", d_out, v_blk,
                    preferred_element_type=jnp.float32)
    d_scores = p * (dp - delta[..., None])  # the bias's gradient, per example
    ds = (d_scores * scale).astype(q.dtype)
    dq = dq + jnp.einsum("bkgst,btkh->bskgh", ds, k_blk,
                         preferred_element_type=jnp.float32)
    dk = jnp.einsum("bkgst,bskgh->btkh", ds, q, out_sharding=_layout_of(k_blk))
    db = None if b_blk is None else jnp.einsum(
        "bkgst->kgst", d_scores, out_sharding=_layout_of(b_blk))
    return dq, (dk, dv, db)

  starts = jnp.arange(0, k.shape[1], block)
  dq, (dk, dv, db) = jax.lax.scan(step, jnp.zeros_like(q, jnp.float32), (
      _blocks(k, block), _blocks(v, block), _bias_blocks(bias, block), starts))
  unblock = lambda x: jnp.reshape(jnp.moveaxis(x, 0, 1), k.shape,
                                  out_sharding=_layout_of(k))
  if db is not None:  # [T/block, K, G, S, block] → bias_KxGxSxT
    db = jnp.reshape(jnp.moveaxis(db, 0, 3), bias.shape,
                     out_sharding=_layout_of(bias)).astype(bias.dtype)
  return dq.astype(q.dtype), unblock(dk), unblock(dv), db


@functools.partial(jax.custom_vjp, nondiff_argnums=(4, 5, 6))
def _flash(q, k, v, bias, block, causal, scale):
  return _forward(q, k, v, bias, block, causal, scale)[0]


def _flash_fwd(q, k, v, bias, block, causal, scale):
  out, lse = _forward(q, k, v, bias, block, causal, scale)
  return out, (q, k, v, bias, out, lse)


_flash.defvjp(_flash_fwd, _backward)


def flash(q, k, v, bias=None, causal=True, scale=None):
  block = min(FLASH_BLOCK, k.shape[1])
  if k.shape[1] % block:
    near = [n for n in (k.shape[1] // block * block,
                        -(-k.shape[1] // block) * block) if n]
    raise ValueError(
        f"flash attention: sequence length {k.shape[1]} (with any image "
        f"tokens) is not a multiple of its block size {block}; choose one "
        f"that is ({' or '.join(map(str, near))}) or --attention=materialized")
  scale = q.shape[-1] ** -0.5 if scale is None else scale
  return _flash(q, k, v, bias, block, causal, scale)


def attend(implementation: str, q, k, v, bias=None, causal=True, scale=None):
  """Attention of q over k, v: see the module doc for the arguments."""
  if implementation == "materialized":
    return materialized(q, k, v, bias, causal, scale)
  if implementation == "flash":
    return flash(q, k, v, bias, causal, scale)
  raise ValueError(f"unknown attention {implementation!r}; valid: "
                   f"{', '.join(IMPLEMENTATIONS)}")
