"""A frozen base stored quantized (QLoRA), dequantized per layer in the compute dtype.

Layouts, as bitsandbytes stores them (bitsandbytes.functional.quantize_4bit /
quantize_blockwise; QLoRA, Dettmers et al. 2023, sections 2-3):

- nf4: two 4-bit codes per byte into the 16 NormalFloat levels (`NF4`), one
  absmax per block of 64 weights, double-quantized: the absmaxes are stored
  as 8-bit codes with one f32 scale per 256 of them. 0.5 + 1/64 + 4/16384
  bytes per weight (≈0.516).
- int8: one int8 code per weight and one f32 absmax per output feature
  (LLM.int8's row-wise SCB; Dettmers et al. 2022), 1 + 4/fan_in bytes per weight.

Blocks run along the kernel's last dim, so a block never straddles a shard: the
codes and absmaxes keep the kernel's logical axes, and a mesh axis sharding the
last dim must divide its block count too (simulator.step rejects one that does
not, naming the array). The FSDP all-gather moves the codes, not bf16 weights.
"""

from __future__ import annotations

import math
from typing import Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp

from models.offload import on_device
from models.rules import AxisRules, reshard

BLOCK = 64  # weights per nf4 absmax (bitsandbytes' blocksize for 4-bit)
ABSMAX_GROUP = 256  # absmaxes per f32 scale (double quantization)
# The 16 NormalFloat levels (bitsandbytes.functional, get_4bit_type("nf4")).
NF4 = (-1.0, -0.6961928009986877, -0.5250730514526367, -0.39491748809814453,
       -0.28444138169288635, -0.18477343022823334, -0.09105003625154495, 0.0,
       0.07958029955625534, 0.16093020141124725, 0.24611230194568634,
       0.33791524171829224, 0.44070982933044434, 0.5626170039176941,
       0.7229568362236023, 1.0)


def bytes_per_weight(kind: str, fan_in: int = 0) -> float:
  """Stored bytes per base weight, as the layouts above give them."""
  if kind == "nf4":
    return 0.5 + 1 / BLOCK + 4 / (BLOCK * ABSMAX_GROUP)
  if kind == "int8":
    return 1 + 4 / fan_in
  raise ValueError(f"base_quant={kind!r} stores no codes; valid: nf4, int8")


def _zeros(_, shape, dtype):
  return jnp.zeros(shape, dtype)


def _param(module: nn.Module, name: str, shape, names, dtype) -> jax.Array:
  return on_device(module.param(
      name, nn.with_logical_partitioning(_zeros, tuple(names)), tuple(shape),
      dtype))


def _compute(x: jax.Array, rules: AxisRules, names) -> jax.Array:
  return reshard(x, rules.spec("compute", tuple(names)))


def _reshape(x: jax.Array, shape, rules: AxisRules, names) -> jax.Array:
  if jax.sharding.get_abstract_mesh().empty:
    return x.reshape(shape)
  return jnp.reshape(x, shape, out_sharding=rules.spec("compute", tuple(names)))


def _lookup(table: jax.Array, idx: jax.Array, rules: AxisRules,
            names) -> jax.Array:
  """table[idx], laid out like idx (the table is replicated)."""
  if jax.sharding.get_abstract_mesh().empty:
    return table[idx]
  return table.at[idx].get(out_sharding=rules.spec("compute", tuple(names)))


def nf4_kernel(module: nn.Module, name: str, shape: Sequence[int],
               names: Sequence[str | None], rules: AxisRules,
               dtype) -> jax.Array:
  """The kernel `name` stored as NF4 (module doc), as a `dtype` array laid
  out in the compute layout."""
  *lead, last = shape
  if last % BLOCK:
    raise ValueError(f"base_quant=nf4: {module.name}/{name}'s last dim is "
                     f"{last}, not a multiple of nf4's blocks of {BLOCK}; "
                     "choose --base_quant=int8 or none")
  blocks = math.prod(lead) * last // BLOCK
  codes = _param(module, f"{name}_nf4", (*lead, last // 2), names, jnp.uint8)
  absmax = _param(module, f"{name}_absmax", (*lead, last // BLOCK), names,
                  jnp.uint8)
  scales = _param(module, f"{name}_absmax_scale",
                  (-(-blocks // ABSMAX_GROUP),), (None,), jnp.float32)
  codes, absmax = (_compute(a, rules, names) for a in (codes, absmax))
  # Second level: absmax code i is scaled by the f32 of its group of 256
  # (the groups run over the flattened absmaxes, as bitsandbytes lays them).
  group = jnp.repeat(scales, ABSMAX_GROUP)[:blocks].reshape(absmax.shape)
  group = _compute(group, rules, names)
  absmax = absmax.astype(jnp.float32) / 127.0 * group
  # First level: split each byte into its two codes, look the levels up.
  pairs = jnp.stack([codes >> 4, codes & 15], axis=-1)
  idx = _reshape(pairs, (*lead, last), rules, names)
  levels = _lookup(jnp.asarray(NF4, dtype), idx.astype(jnp.int32), rules,
                   names)
  blocked = _reshape(levels, (*lead, last // BLOCK, BLOCK), rules,
                     (*names, None))
  w = blocked * absmax.astype(dtype)[..., None]
  return _reshape(w, tuple(shape), rules, names)


def int8_kernel(module: nn.Module, name: str, shape: Sequence[int],
                names: Sequence[str | None], out_dims: Sequence[int],
                rules: AxisRules, dtype) -> jax.Array:
  """The kernel `name` stored as int8 with an f32 absmax per output feature
  (`out_dims`: the kernel dims the matmul's output keeps)."""
  codes = _param(module, f"{name}_int8", shape, names, jnp.int8)
  out_names = [names[i] for i in out_dims]
  absmax = _param(module, f"{name}_absmax", [shape[i] for i in out_dims],
                  out_names, jnp.float32)
  codes, absmax = _compute(codes, rules, names), _compute(absmax, rules,
                                                          out_names)
  expand = [i for i in range(len(shape)) if i not in out_dims]
  scale = jnp.expand_dims(absmax / 127.0, expand).astype(dtype)
  return codes.astype(dtype) * scale
