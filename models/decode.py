"""The KV cache a serving loop keeps, as real arrays with logical axes.

One fixed-size cache of T = prompt + generate positions per sequence, k and v
stacked over layers like the weights (`CACHE_AXES`), so the layer scan hands
each layer its slice. A step writes its tokens' k and v at the current
position with `dynamic_update_slice` and, decoding, attends over all T
positions, the causal mask hiding the ones not written yet (the dense
fixed-size cache of MaxText's `autoregressive` mode; no paging).

An encoder-decoder (T5) serves with two such caches per layer, as Hugging
Face's T5 keeps its past_key_values (`Seq2SeqCache`): the decoder's own k and
v over its generated positions, and the cross-attention's k and v of the
encoder's output over the prompt's positions, projected once by the prefill
and read by every decode step.

int8: values rounded to int8 with one bf16 scale per token per kv head
(max |x| over the head dim), dequantized before attention, as MaxText's
inference/kvcache.py quantizes (`KVQuant.quantize`).
"""

from __future__ import annotations

import dataclasses
import math

import jax
import jax.numpy as jnp

KV_DTYPES = {"bf16": jnp.bfloat16, "int8": jnp.int8}
CACHE_AXES = ("layers", "batch", "length", "kv_heads", "kv")
SCALE_AXES = ("layers", "batch", "length", "kv_heads")
MAX_INT8 = 127.0
SCALE_DTYPE = jnp.bfloat16


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class KVCache:
  """k, v [L, B, T, K, H] (one layer's slice: [B, T, K, H]); int8 caches
  carry their scales [L, B, T, K], None otherwise."""

  k: jax.Array
  v: jax.Array
  k_scale: jax.Array | None = None
  v_scale: jax.Array | None = None


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class Seq2SeqCache:
  """An encoder-decoder's caches, each stacked over the decoder's layers:
  `self_attn` over the generated positions, `cross` over the prompt's."""

  self_attn: KVCache
  cross: KVCache


def cache_layout(n_layers: int, batch: int, length: int, n_kv_heads: int,
                 head_dim: int, kv_dtype: str
                 ) -> dict[str, tuple[tuple[int, ...], jnp.dtype, tuple]]:
  """Each KVCache field's (shape, dtype, logical axes); scales only for int8."""
  if kv_dtype not in KV_DTYPES:
    raise ValueError(f"kv_dtype={kv_dtype!r}; valid: {', '.join(KV_DTYPES)}")
  shape = (n_layers, batch, length, n_kv_heads, head_dim)
  out = {n: (shape, KV_DTYPES[kv_dtype], CACHE_AXES) for n in ("k", "v")}
  if kv_dtype == "int8":
    out |= {n: (shape[:-1], SCALE_DTYPE, SCALE_AXES)
            for n in ("k_scale", "v_scale")}
  return out


def cache_bytes(layout: dict, shards: dict[str, int] | None = None) -> int:
  """Bytes of a cache_layout, divided by the mesh-axis sizes (logical name
  -> how many shards) of the dims a mesh axis shards."""
  shards = shards or {}
  total = 0
  for shape, dtype, axes in layout.values():
    local = [d // shards.get(a, 1) for d, a in zip(shape, axes)]
    total += math.prod(local) * jnp.dtype(dtype).itemsize
  return total


def quantize(x_BxSxKxH: jax.Array) -> tuple[jax.Array, jax.Array]:
  """int8 values and the per-token-per-head scale (max |x| over H)."""
  scale_BxSxK = jnp.max(jnp.abs(x_BxSxKxH.astype(jnp.float32)), axis=-1)
  safe = jnp.where(scale_BxSxK > 0, scale_BxSxK, 1.0)
  q = jnp.rint(x_BxSxKxH * (MAX_INT8 / safe)[..., None]).astype(jnp.int8)
  return q, scale_BxSxK.astype(SCALE_DTYPE)


def write(layer: KVCache, k_BxSxKxH: jax.Array, v_BxSxKxH: jax.Array,
          pos: jax.Array) -> KVCache:
  """One layer's cache with the step's S tokens written at positions
  pos..pos+S-1."""
  at = lambda cache, new: jax.lax.dynamic_update_slice_in_dim(
      cache, new.astype(cache.dtype), pos, axis=1)
  if layer.k_scale is None:
    return KVCache(at(layer.k, k_BxSxKxH), at(layer.v, v_BxSxKxH))
  (k, ks), (v, vs) = quantize(k_BxSxKxH), quantize(v_BxSxKxH)
  return KVCache(at(layer.k, k), at(layer.v, v), at(layer.k_scale, ks),
                 at(layer.v_scale, vs))


def read(layer: KVCache, dtype=jnp.bfloat16) -> tuple[jax.Array, jax.Array]:
  """One layer's k and v over all T positions, in `dtype`."""
  if layer.k_scale is None:
    return layer.k.astype(dtype), layer.v.astype(dtype)
  dequant = lambda x, s: x.astype(dtype) * (s.astype(dtype) / MAX_INT8)[
      ..., None]
  return dequant(layer.k, layer.k_scale), dequant(layer.v, layer.v_scale)
