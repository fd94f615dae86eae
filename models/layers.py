"""The few layers the models need, written so every collective is a line of code.

Each weight is created with logical axis names (stored layout from the rules'
`params` table) and, before use, cast to the compute dtype and resharded to the
`compute` layout: that reshard *is* the FSDP all-gather, and its transpose in
the backward pass is the gradient reduce-scatter.
"""

from __future__ import annotations

from typing import Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp
from jax.ad_checkpoint import checkpoint_name

from models import quant
from models.config import GATED_MLPS
from models.offload import on_device
from models.rules import AxisRules, reshard

Names = Sequence[str | None]


def weight(module: nn.Module, name: str, shape: Sequence[int], names: Names,
           rules: AxisRules, dtype, param_dtype, init=None) -> jax.Array:
  """A parameter, gathered into its compute layout and cast to `dtype`."""
  if init is None:
    init = nn.initializers.variance_scaling(1.0, "fan_in", "normal",
                                            in_axis=0, out_axis=-1)
  w = module.param(name, nn.with_logical_partitioning(init, tuple(names)),
                   tuple(shape), param_dtype)
  return reshard(on_device(w).astype(dtype), rules.spec("compute", names))



def activation(x: jax.Array, names: Names, rules: AxisRules) -> jax.Array:
  return reshard(x, rules.spec("activations", names))


class Norm(nn.Module):
  """RMSNorm or LayerNorm over the (gathered) embed dim, computed in f32."""

  kind: str
  eps: float
  rules: AxisRules
  param_dtype: jnp.dtype

  @nn.compact
  def __call__(self, x_BxSxD: jax.Array) -> jax.Array:
    if self.kind == "none":
      return x_BxSxD
    d = x_BxSxD.shape[-1]
    ones, zeros = nn.initializers.ones, nn.initializers.zeros
    args = (self.rules, jnp.float32, self.param_dtype)
    scale = weight(self, "scale", (d,), ("embed",), *args, init=ones)
    x = x_BxSxD.astype(jnp.float32)
    if self.kind == "layer":
      x = x - jnp.mean(x, axis=-1, keepdims=True)
    y = x * jax.lax.rsqrt(jnp.mean(x * x, axis=-1, keepdims=True) + self.eps)
    y = y * scale
    if self.kind == "layer":
      y = y + weight(self, "bias", (d,), ("embed",), *args, init=zeros)
    return y.astype(x_BxSxD.dtype)


class Dense(nn.Module):
  """y = x·W (+b) as an einsum over named dims; `out` is the output layout."""

  shape: tuple[int, ...]
  names: tuple[str | None, ...]
  equation: str
  out: tuple[str | None, ...]
  rules: AxisRules
  dtype: jnp.dtype
  param_dtype: jnp.dtype
  bias: bool = False
  bias_dims: int = 1  # trailing weight dims the bias covers
  lora_rank: int = 0  # > 0: a trainable low-rank adapter beside the kernel
  quant: str = "none"  # the kernel stored quantized (models.quant), frozen

  @nn.compact
  def __call__(self, x: jax.Array) -> jax.Array:
    args = (self.rules, self.dtype, self.param_dtype)
    if self.quant == "nf4":
      w = quant.nf4_kernel(self, "kernel", self.shape, self.names, self.rules,
                           self.dtype)
    elif self.quant == "int8":
      w = quant.int8_kernel(self, "kernel", self.shape, self.names,
                            self._kernel_dims()[1], self.rules, self.dtype)
    else:
      w = weight(self, "kernel", self.shape, self.names, *args)
    out_spec = None
    if not jax.sharding.get_abstract_mesh().empty:
      out_spec = self.rules.spec("activations", self.out)
    y = jnp.einsum(self.equation, x, w, out_sharding=out_spec)
    if self.lora_rank:
      y = y + self._adapter(x, args)
    if self.bias:
      n = self.bias_dims
      b = weight(self, "bias", self.shape[-n:], self.names[-n:], *args,
                 init=nn.initializers.zeros)
      y = y + b
    return y

  def _kernel_dims(self) -> tuple[list[int], list[int]]:
    """The kernel dims the input contracts, and those the output keeps."""
    lhs, rest = self.equation.split(",")
    kernel, out = rest.split("->")
    return ([i for i, c in enumerate(kernel) if c in lhs],
            [i for i, c in enumerate(kernel) if c in out])

  def _adapter(self, x: jax.Array, args) -> jax.Array:
    """LoRA: x·A·B, A over the kernel's input dims and B over its output
    dims, each laid out by the kernel's own logical names (B starts at zero,
    as LoRA initialises it)."""
    lhs, rest = self.equation.split(",")
    kernel, out = rest.split("->")
    r = next(c for c in "rzyxwq" if c not in self.equation)
    into, outof = self._kernel_dims()
    keep = "".join(c for c in lhs if c not in kernel)
    a = weight(self, "lora_a", tuple(self.shape[i] for i in into) + (
        self.lora_rank,), tuple(self.names[i] for i in into) + (None,), *args)
    b = weight(self, "lora_b", (self.lora_rank,) + tuple(
        self.shape[i] for i in outof), (None,) + tuple(
            self.names[i] for i in outof), *args, init=nn.initializers.zeros)
    mid_spec = None
    if not jax.sharding.get_abstract_mesh().empty:
      mid_spec = self.rules.spec("activations", self.out[:len(keep)] + (None,))
    h = jnp.einsum(f"{lhs},{''.join(kernel[i] for i in into)}{r}->{keep}{r}",
                   x, a, out_sharding=mid_spec)
    out_spec = None
    if mid_spec is not None:
      out_spec = self.rules.spec("activations", self.out)
    return jnp.einsum(f"{keep}{r},{r}{''.join(kernel[i] for i in outof)}->{out}",
                      h, b, out_sharding=out_spec)


class Mlp(nn.Module):
  """SwiGLU / GeGLU (gated), GELU or ReLU, or `linear`: two matmuls, no
  activation.

  n_experts > 0: that many MLPs side by side (models.moe), each weight with a
  leading `exp` dim, applied to expert-major inputs x_ExGxCxD (expert, group,
  capacity slot); the matmuls are the same, batched over experts.
  """

  kind: str
  d_model: int
  d_ff: int
  bias: bool
  rules: AxisRules
  dtype: jnp.dtype
  param_dtype: jnp.dtype
  lora: tuple = (0, ())  # (rank, the projections that get an adapter)
  quant: str = "none"  # the kernels stored quantized (models.quant)
  n_experts: int = 0

  @nn.compact
  def __call__(self, x: jax.Array) -> jax.Array:
    common = dict(rules=self.rules, dtype=self.dtype,
                  param_dtype=self.param_dtype, bias=self.bias,
                  quant=self.quant)
    rank = lambda name: self.lora[0] if name in self.lora[1] else 0
    if self.n_experts:  # dims: e expert, g group, c capacity slot
      lead, names, rows, w = (self.n_experts,), ("exp",), "egc", "e"
      out = ("exp", "batch", None)
    else:
      lead, names, rows, w, out = (), (), "bs", "", ("batch", "length")
    up = lambda name: Dense(lead + (self.d_model, self.d_ff),
                            names + ("embed", "mlp"),
                            f"{rows}d,{w}df->{rows}f", out + ("mlp",),
                            name=name, lora_rank=rank(name), **common)
    x = checkpoint_name(x, "mlp_in")
    h = checkpoint_name(up("wi")(x), "mlpwi")
    if self.kind in GATED_MLPS:
      act = jax.nn.silu if self.kind == "swiglu" else jax.nn.gelu
      h = act(h) * checkpoint_name(up("wi_gate")(x), "mlpwi")
    elif self.kind in ("gelu", "relu"):
      h = (jax.nn.gelu if self.kind == "gelu" else jax.nn.relu)(h)
    h = checkpoint_name(h, "mlp_hidden")
    return checkpoint_name(Dense(
        lead + (self.d_ff, self.d_model), names + ("mlp", "embed"),
        f"{rows}f,{w}fd->{rows}d", out + ("embed",), name="wo",
        lora_rank=rank("wo"), **common)(h), "mlpwo")
