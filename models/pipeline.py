"""Pipeline stages as traced JAX code: GPipe's loop in SPMD form.

The decoder's layer stack is stored as [K stages, L/K layers, ...] with the
stage dim on the mesh's P axis (models.transformer, `stage` -> P). A scan
over the M + K - 1 iterations (MaxText's pipeline.py scans its iterations
too): each hands every stage's previous output to the next stage by a
collective permute over P, stage 0 taking the next micro-batch instead
(`pass_on`); runs every stage on what it holds (a vmap over stages whose
batched dim is P: each P shard runs its own stage); and hands the last
stage's output, a finished micro-batch once the pipeline is full, to every
stage by a sum over P (an all-reduce of one micro-batch's activation,
`finished`), where the final norm and the loss run with the batch laid out
as without stages. The first K-1 iterations' sums are of the fill's zeros.

Differentiating the scan gives GPipe's schedule: every forward, then every
backward, so the traced program holds the saved activations of every
iteration on each stage (what simulator.memory reads off the trace), and the
backward accumulates the stages' weight gradients in its carry. The
non-interleaved bubble is (K - 1) / (M + K - 1) of the step for GPipe and
1F1B alike (Narayanan et al. 2021, "Efficient Large-Scale Language Model
Training on GPU Clusters Using Megatron-LM", section 2.2.1).
"""

from __future__ import annotations

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


def sends(stages: int, microbatches: int) -> int:
  """Collective permutes per step: one forward per iteration and, in the
  backward, one back (the permute's transpose)."""
  return 2 * iterations(stages, microbatches)


def send_bytes(rows: int, seq: int, width: int, itemsize: int = 2) -> int:
  """Per-device bytes of one send: a micro-batch's residual stream, `rows`
  sequences of `seq` tokens by `width` (d_model over Y), bf16."""
  return rows * seq * width * itemsize


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


def injected(x_MxBxSxD: jax.Array, stages: int) -> jax.Array:
  """What stage 0 takes in each iteration: the M micro-batches, then K-1
  iterations of zeros while the last ones drain."""
  return jnp.pad(x_MxBxSxD, [(0, stages - 1)] + [(0, 0)] * (x_MxBxSxD.ndim
                                                            - 1))


def empty(x_BxSxD: jax.Array, stages: int, spec: P | None) -> jax.Array:
  """The stages' outputs before the first iteration: zeros [K, B, S, D]."""
  shape = (stages, *x_BxSxD.shape)
  if _no_mesh():
    return jnp.zeros(shape, x_BxSxD.dtype)
  return jnp.zeros(shape, x_BxSxD.dtype, out_sharding=P(STAGE_AXIS, *spec))


def _spec(x: jax.Array) -> P:
  """`x`'s own sharding (Explicit axes carry it on the type): a shard_map
  with every mesh axis manual takes and gives each value as it is laid out."""
  return jax.typeof(x).sharding.spec


def pass_on(y_K: jax.Array, inject: jax.Array) -> jax.Array:
  """Each stage's output to the next stage (a collective permute over P);
  stage 0 takes `inject`, the next micro-batch. Every mesh axis is manual,
  each operand keeping its own sharding (`_spec`): with P alone manual,
  XLA all-gathered each iteration's activations over X and Y around the
  permute (gpt2 v5e-16 4x2 P=2, corpus #252: bf16[8,28,1024,384]
  all-gathers, 8.2 GiB a device a step, which no sharding asks for)."""
  stages = y_K.shape[0]
  if _no_mesh():
    return jnp.concatenate([inject[None], y_K[:-1]])

  def body(y, inj):
    got = jax.lax.ppermute(y, STAGE_AXIS,
                           [(i, i + 1) for i in range(stages - 1)])
    return jnp.where(jax.lax.axis_index(STAGE_AXIS) == 0, inj[None], got)

  return jax.shard_map(body, in_specs=(_spec(y_K), _spec(inject)),
                       out_specs=_spec(y_K))(y_K, inject)


def finished(y_K: jax.Array) -> jax.Array:
  """The last stage's output on every stage: a sum over P of it and the
  other stages' zeros (every mesh axis manual, as in `pass_on`)."""
  stages = y_K.shape[0]
  if _no_mesh():
    return y_K[-1]

  def body(y):
    last = jax.lax.axis_index(STAGE_AXIS) == stages - 1
    return jax.lax.psum(jnp.where(last, y[0], 0), STAGE_AXIS)

  return jax.shard_map(body, in_specs=_spec(y_K),
                       out_specs=P(*_spec(y_K)[1:]))(y_K)
