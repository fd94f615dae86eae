"""8-bit AdamW (`--optimizer=adamw_8bit`): moments stored blockwise-quantized.

As bitsandbytes' AdamW8bit stores them (bitsandbytes/optim/optimizer.py,
`Optimizer2State.init_state`; Dettmers et al. 2022, "8-bit Optimizers via
Block-wise Quantization"):

- each moment is one uint8 code per element into a 256-value "dynamic" map
  (`functional.create_dynamic_map`: signed for the first moment, unsigned
  for the second), scaled by one f32 absmax per block;
- a block is 2048 elements (`blocks = n // 2048` there). Here blocks run
  along the last dim, within one device's slice, so a block never straddles
  a shard: the block is gcd(the last dim's per-device length, 2048) elements
  (2048 for a 4096 slice, 256 for 11008's) and the absmaxes keep the
  parameter's layout;
- a parameter of fewer than 4096 elements (`min_8bit_size`) keeps f32
  moments.

The update dequantizes each moment (code -> map value x absmax), runs AdamW
in f32, and requantizes: the new absmax is the block's largest |value|, the
code the map value nearest to value / absmax (ties to the larger), as
bitsandbytes' kernels round. The state comes from `jax.eval_shape(tx.init)`
like every other optimizer's: about 2 bytes per parameter plus 8 per block.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax

BLOCK = 2048  # bitsandbytes' elements per absmax for 8-bit optimizer states
MIN_8BIT_SIZE = 4096  # smaller parameters keep f32 moments (min_8bit_size)


def dynamic_map(signed: bool) -> np.ndarray:
  """bitsandbytes' create_dynamic_map(signed, max_exponent_bits=7,
  total_bits=8), sorted: for each decade 10^(i-6), i = 0..6, the midpoints
  of an even split of [0.1, 1] into 2^i (signed, both signs) or 2^(i+1)
  (unsigned) parts, then 0 and 1."""
  data: list[float] = []
  for i in range(7):
    items = 2 ** i + 1 if signed else 2 ** (i + 1) + 1
    bounds = np.linspace(0.1, 1, items, dtype=np.float32)
    means = (bounds[:-1] + bounds[1:]) / 2.0
    data += (10.0 ** (i - 6) * means).tolist()
    if signed:
      data += (-(10.0 ** (i - 6)) * means).tolist()
  data += [0.0, 1.0]
  assert len(data) == 256, len(data)
  return np.sort(np.asarray(data, np.float32))


class Quantized(NamedTuple):
  codes: jax.Array  # uint8, the parameter's shape and layout
  absmax: jax.Array  # f32 [..., last // block]


class Adam8bitState(NamedTuple):
  count: jax.Array
  mu: optax.Updates  # Quantized leaves (f32 below MIN_8BIT_SIZE)
  nu: optax.Updates


def _spec(x: jax.Array) -> jax.P | None:
  """The PartitionSpec `x` carries under an explicit mesh (None: no mesh)."""
  if jax.sharding.get_abstract_mesh().empty:
    return None
  spec = tuple(jax.typeof(x).sharding.spec)
  return jax.P(*spec, *(None,) * (x.ndim - len(spec)))


def _per_device(f, spec: jax.P | None, n_in: int, n_out: int):
  """`f` run on each device's slice (shard_map): blocks never straddle a
  shard, so quantizing is local and moves no data."""
  if spec is None:
    return f
  return jax.shard_map(f, in_specs=(spec,) * n_in, out_specs=(spec,) * n_out)


def block_size(x: jax.Array) -> int:
  """Elements per absmax for `x` (module doc)."""
  sharding = getattr(jax.typeof(x), "sharding", None)
  local = (sharding.shard_shape(x.shape)[-1] if _spec(x) is not None
           else x.shape[-1])
  return math.gcd(local, BLOCK)


def _quantized(x: jax.Array) -> bool:
  return x.ndim > 0 and x.size >= MIN_8BIT_SIZE


def dequantize(q: Quantized, table: np.ndarray) -> jax.Array:
  """The f32 values the codes stand for."""

  def local(codes, absmax):
    blocks = absmax.shape[-1]
    codes = codes.reshape(*codes.shape[:-1], blocks, -1).astype(jnp.int32)
    levels = jnp.asarray(table)[codes] * absmax[..., None]
    return (levels.reshape(*levels.shape[:-2], -1),)

  out, = _per_device(local, _spec(q.codes), 2, 1)(q.codes, q.absmax)
  return out


def quantize(x: jax.Array, table: np.ndarray) -> Quantized:
  """Blockwise absmax, then the nearest map value to each x / absmax."""
  block = block_size(x)
  mid = (table[1:] + table[:-1]) / 2

  def local(x):
    blocked = x.reshape(*x.shape[:-1], -1, block)
    absmax = jax.lax.reduce_max(jnp.abs(blocked), (blocked.ndim - 1,))
    scaled = blocked / jnp.maximum(absmax, 1e-30)[..., None]
    # The code: how many midpoints between neighbouring map values lie at
    # or below the value (one fused compare-and-count per element).
    codes = (scaled[..., None] >= mid).astype(jnp.uint8).sum(
        axis=-1, dtype=jnp.uint8)
    return codes.reshape(x.shape), absmax

  return Quantized(*_per_device(local, _spec(x), 1, 2)(x))


SIGNED, UNSIGNED = dynamic_map(True), dynamic_map(False)


def adamw_8bit(learning_rate: float, b1: float = 0.9, b2: float = 0.999,
               eps: float = 1e-8, weight_decay: float = 1e-4
               ) -> optax.GradientTransformation:
  """AdamW with blockwise 8-bit moments (module doc); optax.adamw's
  defaults otherwise."""

  def init(params):
    def zeros(p, table):
      if not _quantized(p):
        return jnp.zeros_like(p, jnp.float32)
      return quantize(jnp.zeros_like(p, jnp.float32), table)

    return Adam8bitState(
        jnp.zeros([], jnp.int32),
        jax.tree.map(lambda p: zeros(p, SIGNED), params),
        jax.tree.map(lambda p: zeros(p, UNSIGNED), params))

  def update(grads, state, params):
    count = optax.safe_increment(state.count)
    c1 = 1 - b1 ** count.astype(jnp.float32)
    c2 = 1 - b2 ** count.astype(jnp.float32)

    def leaf(g, m, v, p):
      quant = isinstance(m, Quantized)
      g = g.astype(jnp.float32)
      m = b1 * (dequantize(m, SIGNED) if quant else m) + (1 - b1) * g
      v = b2 * (dequantize(v, UNSIGNED) if quant else v) + (1 - b2) * g * g
      u = -learning_rate * ((m / c1) / (jnp.sqrt(v / c2) + eps)
                            + weight_decay * p.astype(jnp.float32))
      if quant:
        m, v = quantize(m, SIGNED), quantize(v, UNSIGNED)
      return u.astype(p.dtype), m, v

    # The moments' trees hold a Quantized node where grads hold a leaf.
    out = jax.tree.map(leaf, grads, state.mu, state.nu, params)
    treedef = jax.tree.structure(grads)
    u, m, v = (treedef.unflatten(t) for t in zip(*treedef.flatten_up_to(out)))
    return u, Adam8bitState(count, m, v)

  return optax.GradientTransformation(init, update)
