"""Pipeline stages as traced JAX code: GPipe's loop in SPMD form.

The decoder's layer stack is stored as [K stages, L/K layers, ...] with the
stage dim on the mesh's P axis (models.transformer, `stage` -> P). Each of
the M + K - 1 iterations runs every stage on the micro-batch it holds (a vmap
over stages whose batched dim is P: each P shard runs its own stage), then
hands each stage's output to the next stage by a collective permute over P
(MaxText's pipeline.py does the same: vmap over stages, then a shift along
the stage axis). Stage 0 takes the next micro-batch instead; the last stage's
output is a finished micro-batch, handed to every stage by a sum over P (an
all-reduce of one micro-batch's activation), where the final norm and the
loss run with the batch laid out as without stages.

Differentiating the loop gives GPipe's schedule: every forward, then every
backward, so the traced program holds the saved activations of all M
micro-batches on each stage (what simulator.memory reads off the trace). The
non-interleaved bubble is (K - 1) / (M + K - 1) of the step for GPipe and
1F1B alike (Narayanan et al. 2021, "Efficient Large-Scale Language Model
Training on GPU Clusters Using Megatron-LM", section 2.2.1).
"""

from __future__ import annotations

from typing import Callable

import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec as P

from models.rules import AxisRules

STAGE_AXIS = "P"  # the mesh axis of the stages (meshes.layout.STAGE_AXIS)


def iterations(stages: int, microbatches: int) -> int:
  """Loop iterations: each micro-batch enters stage 0 once, the last leaves
  stage K-1 K-1 iterations later."""
  return microbatches + stages - 1


def bubble_fraction(stages: int, microbatches: int) -> float:
  """The idle share of a stage's step, (K-1)/(M+K-1), non-interleaved."""
  return (stages - 1) / iterations(stages, microbatches)


def _no_mesh() -> bool:
  return jax.sharding.get_abstract_mesh().empty


def split(x: jax.Array, microbatches: int, spec: P | None) -> jax.Array:
  """[B, ...] -> [M, B/M, ...], micro-batch j the rows i·M + j: each device
  splits the rows it holds, so no data moves (simulator.step does the same
  for grad_accum)."""
  shape = (x.shape[0] // microbatches, microbatches, *x.shape[1:])
  if _no_mesh():
    return jnp.moveaxis(x.reshape(shape), 1, 0)
  y = jnp.reshape(x, shape, out_sharding=P(spec[0], None, *spec[1:]))
  return jnp.moveaxis(y, 1, 0)


def merge(y: jax.Array, spec: P | None) -> jax.Array:
  """`split`'s inverse: [M, B/M, ...] -> [B, ...]."""
  shape = (y.shape[0] * y.shape[1], *y.shape[2:])
  y = jnp.moveaxis(y, 0, 1)
  if _no_mesh():
    return y.reshape(shape)
  return jnp.reshape(y, shape, out_sharding=spec)


def _handoff(y_K: jax.Array | None, inject: jax.Array, stages: int,
             send: bool, finish: bool) -> tuple[jax.Array, jax.Array | None]:
  """(next state [K, ...], finished micro-batch or None). With `send`, stage
  k's output goes to stage k+1 by a collective permute over P and stage 0
  takes `inject`; with `finish`, the last stage's output is summed over P
  (only it is non-zero) so every stage holds the finished micro-batch."""
  if _no_mesh():
    state = None
    if send:
      rest = y_K[:-1] if y_K is not None else jnp.zeros(
          (stages - 1, *inject.shape), inject.dtype)
      state = jnp.concatenate([inject[None], rest])
    return state, (y_K[-1] if finish else None)

  def body(inj, *y):
    k = jax.lax.axis_index(STAGE_AXIS)
    state = done = None
    if send:
      got = (jax.lax.ppermute(y[0], STAGE_AXIS,
                              [(i, i + 1) for i in range(stages - 1)])
             if y else jnp.zeros_like(inj[None]))
      state = jnp.where(k == 0, inj[None], got)
    if finish:
      done = jax.lax.psum(jnp.where(k == stages - 1, y[0][0], 0), STAGE_AXIS)
    return state, done

  args = (inject,) if y_K is None else (inject, y_K)
  return jax.shard_map(
      body, in_specs=(P(), P(STAGE_AXIS))[:len(args)],
      out_specs=(P(STAGE_AXIS) if send else None, P() if finish else None),
      axis_names={STAGE_AXIS})(*args)


def run(stage_fn: Callable[[jax.Array], jax.Array], x_MxBxSxD: jax.Array,
        stages: int, rules: AxisRules,
        names: tuple[str, ...]) -> jax.Array:
  """Every micro-batch through the K stages of `stage_fn` ([K, B, S, D] ->
  [K, B, S, D], each stage on its own slice), in M + K - 1 iterations;
  returns the last stage's outputs [M, B, S, D] laid out by `names`."""
  m = x_MxBxSxD.shape[0]
  inject = lambda t: (x_MxBxSxD[t] if t < m else jnp.zeros_like(x_MxBxSxD[0]))
  state, _ = _handoff(None, inject(0), stages, send=True, finish=False)
  done = []
  for t in range(iterations(stages, m)):
    y = stage_fn(state)
    last = t == iterations(stages, m) - 1
    state, out = _handoff(y, inject(t + 1), stages, send=not last,
                          finish=t >= stages - 1)
    if out is not None:
      done.append(out)
  out = jnp.stack(done)
  if _no_mesh():
    return out
  return jax.sharding.reshard(out, rules.spec("activations", (None, *names)))
