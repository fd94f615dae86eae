"""Trace the train step once under a mesh: the program every estimate reads.

`jax.make_jaxpr` of the step under an Explicit X/Y mesh gives every value with
its NamedSharding; `fused_residuals` of the loss lists what the backward pass
keeps under the remat policy, each with its sharding (JAX's saved residuals).

`fused_residuals` says which of a function's residuals XLA would keep as a
buffer of their own when the function is recomputed inside one fused loop body
(a rematerialized layer's backward): an elementwise op's output that feeds only
elementwise ops is computed inside the fusion of its consumers (the norm's f32
intermediates, the activation function's internals); outputs of matmuls,
collectives, reductions and loops, and any value a matmul or collective reads,
are buffers, and so is an elementwise op on a matmul's output that is not
saved itself (a bias add: XLA's output fusion).
"""

from __future__ import annotations

import dataclasses

import jax
from jax.extend import core as jcore
# private, used only here: JAX's naming of a jaxpr's residuals (what
# jax.ad_checkpoint.print_saved_residuals prints).
from jax._src.ad_checkpoint import _saved_residuals as _residuals_of_jaxpr

from models.config import ModelConfig
from simulator.batch_probe import probe_settings
from simulator.settings import TrainSettings
from simulator.step import Step, build_step


@dataclasses.dataclass(frozen=True)
class Residual:
  aval: jax.core.ShapedArray  # carries .sharding under an Explicit mesh
  source: str  # JAX's description: "from the argument ...", "output of dot_general ..."
  fused: bool = False  # see fused_residuals


@dataclasses.dataclass(frozen=True)
class Traced:
  step: Step
  jaxpr: jax.core.ClosedJaxpr  # the whole step: forward, backward, update
  residuals: tuple[Residual, ...]


# Ops XLA fuses into their consumers (elementwise, broadcasts) and ops that are
# only a view (a reshape or transpose of a buffer is a bitcast or a copy).
_ELEMENTWISE = {
    "abs", "add", "add_any", "and", "broadcast_in_dim", "ceil", "clamp",
    "convert_element_type", "cos", "div", "eq", "erf", "exp", "exp2", "expm1",
    "floor", "ge", "gt", "integer_pow", "iota", "is_finite", "le", "log",
    "log1p", "logistic", "lt", "max", "min", "mul", "ne", "neg", "not", "or",
    "pow", "rem", "round", "rsqrt", "select_n", "sign", "sin", "sqrt",
    "square", "stop_gradient", "sub", "tan", "tanh", "xor", "pvary"}
_VIEW = {"reshape", "squeeze", "expand_dims", "transpose", "name",
         "reduce_precision", "copy", "copy_p"}


def _inner_jaxpr(eqn):
  inner = eqn.params.get("jaxpr")
  return getattr(inner, "jaxpr", inner)


def _spec(aval) -> tuple:
  sharding = getattr(aval, "sharding", None)
  spec = tuple(getattr(sharding, "spec", ()))
  return spec + (None,) * (len(aval.shape) - len(spec))


def _fusible(eqn) -> bool:
  """Elementwise, or a jitted function made only of elementwise ops; a
  reshard that moves nothing (a scalar, the same spec) is one too."""
  name = eqn.primitive.name
  if name in _ELEMENTWISE:
    return True
  if name == "reshard":
    aval = eqn.invars[0].aval
    return not aval.shape or _spec(aval) == _spec(eqn.outvars[0].aval)
  inner = _inner_jaxpr(eqn) if name in ("jit", "pjit", "closed_call") else None
  return inner is not None and all(
      _fusible(e) or e.primitive.name in _VIEW for e in inner.eqns)


def read_inputs(jaxpr) -> list[bool]:
  """Which inputs of `jaxpr` the program reads, as jit's dead-code pass sees
  it: an input nothing live reads is dropped from the compiled arguments
  (Adafactor's (1,) placeholder moments), so it takes no argument memory."""
  jaxpr = getattr(jaxpr, "jaxpr", jaxpr)
  read = {v for v in jaxpr.outvars if isinstance(v, jcore.Var)}
  for eqn in reversed(jaxpr.eqns):
    if not eqn.effects and not any(v in read for v in eqn.outvars):
      continue  # dead: jit drops it
    inner = _inner_jaxpr(eqn) if eqn.primitive.name in (
        "jit", "pjit", "closed_call") else None
    if inner is not None and len(inner.invars) == len(eqn.invars):
      reads = read_inputs(inner)
    else:  # other higher-order ops: assume every operand is read
      reads = [True] * len(eqn.invars)
    read.update(v for v, r in zip(eqn.invars, reads)
                if r and isinstance(v, jcore.Var))
  return [v in read for v in jaxpr.invars]


def fused_residuals(fn, *args) -> tuple[Residual, ...]:
  """What the VJP of fn saves for its backward (as
  jax.ad_checkpoint.saved_residuals names them), each marked `fused` when XLA
  recomputes it inside the fusion that uses it rather than holding a buffer
  (see the module doc)."""
  leaves, tree = jax.tree.flatten(args)

  def flat(*leaves):
    return fn(*jax.tree.unflatten(tree, leaves))

  closed, shapes = jax.make_jaxpr(lambda *a: jax.vjp(flat, *a),
                                  return_shape=True)(*leaves)
  jaxpr = closed.jaxpr
  n_res = len(jax.tree.leaves(shapes[1]))
  jaxpr = jaxpr.replace(outvars=jaxpr.outvars[len(jaxpr.outvars) - n_res:])
  see_through = {e.outvars[0]: e.invars[0] for e in jaxpr.eqns
                 if e.primitive.name == "reduce_precision"}
  res = {see_through.get(v, v) for v in jaxpr.outvars
         if isinstance(v, jcore.Var)}
  producer, consumers = {}, {}
  for eqn in jaxpr.eqns:
    for v in eqn.outvars:
      producer[v] = eqn
    for v in eqn.invars:
      if isinstance(v, jcore.Var):
        consumers.setdefault(v, []).append(eqn)

  def root(v):  # the equation that made v, seen through views
    eqn = producer.get(v)
    while eqn is not None and eqn.primitive.name in _VIEW:
      eqn = producer.get(eqn.invars[0])
    return eqn

  def made_as_buffer(v) -> bool:
    """Made by an op that is not fused, or an elementwise op on a matmul's
    output that is not saved itself (XLA fuses the op into the matmul, a
    bias add say, and the result is the matmul's buffer)."""
    eqn = root(v)
    if eqn is None:
      return False
    if not _fusible(eqn):
      return True
    return any(isinstance(u, jcore.Var) and u not in res
               and (r := root(u)) is not None
               and r.primitive.name == "dot_general" for u in eqn.invars)

  def read_as_buffer(v) -> bool:  # some consumer (through views) is not fused
    for eqn in consumers.get(v, ()):
      if eqn.primitive.name in _VIEW:
        if read_as_buffer(eqn.outvars[0]):
          return True
      elif not _fusible(eqn):
        return True
    return False

  named = _residuals_of_jaxpr(jaxpr, ("",) * len(jaxpr.invars))
  # _residuals_of_jaxpr lists literals, constants, arguments, then equation
  # outputs in order; only the last can be fused.
  in_order = [v for e in jaxpr.eqns for v in e.outvars if v in res]
  tail = len(named) - len(in_order)
  out = []
  for i, (aval, source) in enumerate(named):
    fused = False
    if i >= tail:
      v = in_order[i - tail]
      fused = not (made_as_buffer(v) or read_as_buffer(v))
    out.append(Residual(aval, source, fused))
  return tuple(out)


def trace(cfg: ModelConfig, settings: TrainSettings, mesh,
          residuals: bool = True) -> Traced:
  """mesh: a jax.sharding.AbstractMesh with Explicit X/Y axes.

  residuals=False skips the second (VJP) trace when only the program is read.
  """
  step = build_step(cfg, settings, mesh)
  with jax.sharding.use_abstract_mesh(mesh):
    jaxpr = jax.make_jaxpr(step.fn)(*step.args)
    residuals = fused_residuals(step.loss_fn, step.params,
                                step.batch) if residuals else ()
  return Traced(step, jaxpr, residuals)


def trace_probe(cfg: ModelConfig, settings: TrainSettings, mesh,
                residuals: bool = True) -> Traced:
  """The step traced at the probe batch (simulator.batch_probe): what the
  memory and timing estimates read, once, for every batch size."""
  return trace(cfg, probe_settings(cfg, settings, mesh.size), mesh, residuals)
