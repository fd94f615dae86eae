"""Real optax optimizers by name, and the precision policies' dtypes."""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
import optax

from simulator.adam8bit import adamw_8bit

LEARNING_RATE = 1e-4


class Precision(NamedTuple):
  param_dtype: jnp.dtype  # what params (and so grads) are stored in
  master_copy: bool  # optimizer holds an f32 copy of bf16 params
  moment_dtype: jnp.dtype | None  # None: optax's default


PRECISION = {
    # f32 params are the master copy; bf16 compute; f32 grads.
    "mixed": Precision(jnp.float32, False, None),
    # bf16 params and grads; the optimizer keeps an f32 master copy.
    "bf16_master": Precision(jnp.bfloat16, True, None),
    # everything bf16, moments too.
    "bf16": Precision(jnp.bfloat16, False, jnp.bfloat16),
}


class MasterState(NamedTuple):
  master: optax.Params
  inner: optax.OptState


def with_master_copy(tx: optax.GradientTransformation
                     ) -> optax.GradientTransformation:
  """Run `tx` on an f32 copy of the params; return bf16 deltas to apply."""

  def init(params):
    master = jax.tree.map(lambda p: p.astype(jnp.float32), params)
    return MasterState(master, tx.init(master))

  def update(grads, state, params):
    grads = jax.tree.map(lambda g: g.astype(jnp.float32), grads)
    updates, inner = tx.update(grads, state.inner, state.master)
    master = optax.apply_updates(state.master, updates)
    deltas = jax.tree.map(lambda m, p: (m - p.astype(jnp.float32)).astype(
        p.dtype), master, params)
    return deltas, MasterState(master, inner)

  return optax.GradientTransformation(init, update)


def make_optimizer(name: str, precision: str) -> optax.GradientTransformation:
  policy = PRECISION[precision]
  mu = policy.moment_dtype
  if name == "adamw":
    tx = optax.adamw(LEARNING_RATE, mu_dtype=mu)
  elif name == "adamw_bf16_mu":
    tx = optax.adamw(LEARNING_RATE, mu_dtype=jnp.bfloat16)
  elif name == "adamw_8bit":  # blockwise-quantized moments (bitsandbytes)
    tx = adamw_8bit(LEARNING_RATE)
  elif name == "adafactor":
    tx = optax.adafactor(LEARNING_RATE)
  elif name == "sgd":
    tx = optax.sgd(LEARNING_RATE)
  elif name == "sgd_momentum":
    tx = optax.sgd(LEARNING_RATE, momentum=0.9, accumulator_dtype=mu)
  else:
    raise ValueError(f"unknown optimizer {name!r}")
  return with_master_copy(tx) if policy.master_copy else tx
