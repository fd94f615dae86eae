"""Trace the train step once under a mesh: the program every estimate reads.

`jax.make_jaxpr` of the step under an Explicit X/Y mesh gives every value with
its NamedSharding; `saved_residuals` reads off that same program what its
backward pass keeps from the forward under the remat policy, each with its
sharding (JAX's saved residuals), so one trace serves every estimate.

`saved_residuals` says which of the residuals XLA would keep as a
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
import functools

import jax
from jax.extend import core as jcore

from models import scopes as model_scopes
from models.config import ModelConfig
from simulator.tracing import loops, mesh_class
from simulator.tracing.batch_probe import probe_settings
from simulator.settings import TrainSettings
from simulator.step import Step, build_step


@dataclasses.dataclass(frozen=True)
class Residual:
  """One value the backward pass keeps, found by the program's structure."""

  aval: jax.core.ShapedArray  # carries .sharding under an Explicit mesh
  name: str  # what it is, for people: "blocks/attn: 'qkv', 32 layers"
  fused: bool = False  # see saved_residuals
  argument: bool = False  # an input of the function (a param, the batch)
  op: str = ""  # the primitive that made it ("scan", "dot_general", ...)
  scopes: tuple[str, ...] = ()  # the named scopes it was made under


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
# pvary, shard_map's mark that a value varies over manual mesh axes, lowers
# to nothing: no copy of the embedding table a serving step's lookup reads
# through it at XLA's peaks (mixtral_mini v5p-8 4x1 b8, both steps;
# experiments/data/inference_compiled.jsonl).
VIEW_OPS = {"reshape", "squeeze", "expand_dims", "transpose", "name",
         "reduce_precision", "copy", "copy_p", "pvary"}


def _inner_jaxpr(eqn):
  inner = eqn.params.get("jaxpr")
  return getattr(inner, "jaxpr", inner)


def spec_of(aval) -> tuple:
  sharding = getattr(aval, "sharding", None)
  spec = tuple(getattr(sharding, "spec", ()))
  return spec + (None,) * (len(aval.shape) - len(spec))


def layout_of(aval) -> tuple:
  """`spec_of` without the mesh axes of size 1, per dim a tuple of axes: a
  dim sharded over an axis of one device is whole on it, so two avals of
  one layout are the same buffer and a reshard between them moves nothing
  (XLA partitions for one device: at mesh 1x1 none of the FSDP gathers of
  a GPU corpus row (#21-#30) is a buffer in XLA's assignment)."""
  sharding = getattr(aval, "sharding", None)
  return _layout(len(aval.shape), sharding,
                 mesh_class.axis_sizes(getattr(sharding, "mesh", None)))


@functools.lru_cache(maxsize=4096)
def _layout(ndim: int, sharding, sizes: tuple) -> tuple:
  """layout_of of an aval of `ndim` dims and `sharding` at the mesh axis
  `sizes`, memoized: the memory rules ask tens of thousands of times per
  sweep, for a few dozen shardings (equal shardings name the same axes of
  the same mesh)."""
  spec = tuple(getattr(sharding, "spec", ()))
  spec += (None,) * (ndim - len(spec))
  sizes = dict(sizes)
  return tuple(tuple(a for a in mesh_class.entry_axes(e)
                     if sizes.get(a, 1) > 1) for e in spec)


def fusible(eqn) -> bool:
  """Elementwise, or a jitted function made only of elementwise ops; a
  reshard that moves nothing (a scalar, the same spec) is one too."""
  name = eqn.primitive.name
  if name in _ELEMENTWISE:
    return True
  if name == "reshard":
    aval = eqn.invars[0].aval
    return not aval.shape or layout_of(aval) == layout_of(eqn.outvars[0].aval)
  inner = _inner_jaxpr(eqn) if name in ("jit", "pjit", "closed_call") else None
  return inner is not None and all(
      fusible(e) or e.primitive.name in VIEW_OPS for e in inner.eqns)


def read_inputs(jaxpr) -> list[bool]:
  """Which inputs of `jaxpr` the program reads, as jit's dead-code pass sees
  it: an input nothing live reads is dropped from the compiled arguments
  (Adafactor's (1,) placeholder moments), so it takes no argument memory.
  A scan's operand its body does not read is dropped too (JAX's scan
  dead-code rule): an encoder-decoder's decode step, whose decoder scan is
  handed every layer's cross-attention k and v projections, reads none."""
  jaxpr = getattr(jaxpr, "jaxpr", jaxpr)
  read = {v for v in jaxpr.outvars if isinstance(v, jcore.Var)}
  for eqn in reversed(jaxpr.eqns):
    if not eqn.effects and not any(v in read for v in eqn.outvars):
      continue  # dead: jit drops it
    inner = _inner_jaxpr(eqn) if eqn.primitive.name in (
        "jit", "pjit", "closed_call", "scan") else None
    if inner is not None and len(inner.invars) == len(eqn.invars):
      reads = read_inputs(inner)
    else:  # other higher-order ops: assume every operand is read
      reads = [True] * len(eqn.invars)
    read.update(v for v, r in zip(eqn.invars, reads)
                if r and isinstance(v, jcore.Var))
  return [v in read for v in jaxpr.invars]


def made_by_backward(eqn) -> bool:
  """Made by the backward pass: JAX's transpose names its equations so."""
  return model_scopes.in_backward(eqn.source_info.name_stack)


def saved_residuals(closed, arg_names: list[str]) -> tuple[Residual, ...]:
  """What the backward pass of a traced program reads from its forward pass
  (the residuals jax.vjp would save), in the order
  jax.ad_checkpoint.saved_residuals lists them (constants, arguments,
  then equation outputs in program order), each named by the
  program's structure (named scopes, checkpoint names, the equation that made
  it) and marked `fused` when XLA recomputes it inside the fusion that uses it
  rather than holding a buffer (see the module doc).

  Read off the program's top level, where the forward and the backward of the
  step (or of its first micro-batch, with grad_accum) meet, so the train step
  needs no trace of its own for them; `arg_names` name its inputs."""
  jaxpr = closed.jaxpr
  producer, consumers = {}, {}
  for eqn in jaxpr.eqns:
    for v in eqn.outvars:
      producer[v] = eqn
    if not made_by_backward(eqn):  # the forward's own readers
      for v in eqn.invars:
        if isinstance(v, jcore.Var):
          consumers.setdefault(v, []).append(eqn)
  see_through = {e.outvars[0]: e.invars[0] for e in jaxpr.eqns
                 if e.primitive.name == "reduce_precision"}
  forward = lambda v: v not in producer or not made_by_backward(producer[v])
  res = {see_through.get(v, v) for e in jaxpr.eqns if made_by_backward(e)
         for v in e.invars if isinstance(v, jcore.Var) and forward(v)}

  def root(v):  # the equation that made v, seen through views
    eqn = producer.get(v)
    while eqn is not None and eqn.primitive.name in VIEW_OPS:
      eqn = producer.get(eqn.invars[0])
    return eqn

  def made_as_buffer(v) -> bool:
    """Made by an op that is not fused, or an elementwise op on a matmul's
    output that is not saved itself (XLA fuses the op into the matmul, a
    bias add say, and the result is the matmul's buffer)."""
    eqn = root(v)
    if eqn is None:
      return False
    if not fusible(eqn):
      return True
    return any(isinstance(u, jcore.Var) and u not in res
               and (r := root(u)) is not None
               and r.primitive.name == "dot_general" for u in eqn.invars)

  def read_as_buffer(v) -> bool:  # some consumer (through views) is not fused
    for eqn in consumers.get(v, ()):
      if eqn.primitive.name in VIEW_OPS:
        if read_as_buffer(eqn.outvars[0]):
          return True
      elif not fusible(eqn):
        return True
    return False

  out = [Residual(v.aval, "a constant") for v in jaxpr.constvars if v in res]
  out += [Residual(v.aval, f"argument {name}", argument=True)
          for v, name in zip(jaxpr.invars, arg_names) if v in res]
  for eqn in jaxpr.eqns:  # in program (forward) order
    for v in eqn.outvars:
      if v in res:
        scopes = model_scopes.scopes_of(eqn.source_info.name_stack)
        out.append(Residual(
            v.aval, _describe(eqn, v, scopes),
            fused=not (made_as_buffer(v) or read_as_buffer(v)),
            op=eqn.primitive.name, scopes=scopes))
  return tuple(out)


def arg_names(args) -> list[str]:
  """A program's flat inputs named by their pytree paths ("0/blocks/...")."""
  return [jax.tree_util.keystr(path, simple=True, separator="/")
          for path, _ in jax.tree_util.tree_flatten_with_path(args)[0]]


def fused_residuals(fn, *args) -> tuple[Residual, ...]:
  """saved_residuals of fn's gradient with respect to every argument, the
  output's cotangent an input of the program (not a forward value)."""
  leaves, tree = jax.tree.flatten(args)
  flat = lambda *a: fn(*jax.tree.unflatten(tree, a))
  cotangents = jax.tree.leaves(jax.eval_shape(flat, *leaves))

  def grads(leaves, cotangents):
    out, vjp = jax.vjp(flat, *leaves)
    return vjp(jax.tree.unflatten(jax.tree.structure(out), cotangents))

  closed = jax.make_jaxpr(grads)(leaves, cotangents)
  return saved_residuals(closed, arg_names(args)
                         + ["cotangent"] * len(cotangents))


def _what(eqn, producer=None) -> str:
  """What an equation's output is, in a few words; `producer` (variable ->
  equation) lets a host transfer name what it moves."""
  name = eqn.primitive.name
  if name == "name":  # jax.ad_checkpoint.checkpoint_name
    return repr(eqn.params["name"])
  if name in ("jit", "pjit"):
    return f"{eqn.params['name']}()"
  if name == "dot_general":
    return "matmul output"
  if name == "convert_element_type":
    return f"cast to {jax.numpy.dtype(eqn.params['new_dtype'])}"
  if name == "reshard":
    before, after = (spec_of(v.aval) for v in (eqn.invars[0], eqn.outvars[0]))
    gathered = sum(a is not None for a in after) < sum(
        b is not None for b in before)
    return "gathered copy" if gathered else "resharded copy"
  if name == "device_put" and producer is not None:
    made = producer.get(eqn.invars[0])
    return (f"{_what(made, producer)} (to host)" if made is not None
            else "input (to host)")
  return f"{name} output"


def _describe(eqn, v, scopes: tuple[str, ...]) -> str:
  """A residual's name: its scope path and what made it; for a scan's
  stacked output, what the loop body made (or carried) and the trip count."""
  where = "/".join(scopes)
  if eqn.primitive.name != "scan":
    return f"{where}: {_what(eqn)}" if where else _what(eqn)
  body = _inner_jaxpr(eqn)
  inner = body.outvars[eqn.outvars.index(v)]
  length = eqn.params["length"]
  count = (f"{length} layers" if model_scopes.LAYERS in scopes
           else f"{length} iterations")
  producer = {w: e for e in body.eqns for w in e.outvars}
  made = producer.get(inner)
  if made is not None:
    origin = made  # a host transfer is named where its operand was made
    while origin.primitive.name == "device_put" and origin.invars[0] in producer:
      origin = producer[origin.invars[0]]
    inner_where = "/".join(model_scopes.scopes_of(origin.source_info.name_stack))
    return f"{inner_where or where}: {_what(made, producer)}, {count}"
  n_consts, n_carry = loops.scan_counts(eqn)
  i = body.invars.index(inner) if inner in body.invars else -1
  role = ("loop constant" if 0 <= i < n_consts else
          "layer input" if i < n_consts + n_carry and model_scopes.LAYERS
          in scopes else "loop carry" if i < n_consts + n_carry
          else "per-iteration input")
  return f"{where}: {role}, {count}"


def trace(cfg: ModelConfig, settings: TrainSettings, mesh) -> Traced:
  """mesh: a jax.sharding.AbstractMesh with Explicit X/Y axes. One trace:
  the residuals are read off the step's own program (saved_residuals)."""
  step = build_step(cfg, settings, mesh)
  with jax.sharding.use_abstract_mesh(mesh):
    jaxpr = jax.make_jaxpr(step.fn)(*step.args)
  return Traced(step, jaxpr, saved_residuals(jaxpr, arg_names(step.args)))


def trace_probe(cfg: ModelConfig, settings: TrainSettings, mesh) -> Traced:
  """The step traced at the probe batch (simulator.tracing.batch_probe): what the
  memory and timing estimates read, once, for every batch size."""
  # P (stages) holds no batch; D (replicas) splits it with X
  devices = mesh.shape["X"] * mesh.shape["Y"] * dict(mesh.shape).get("D", 1)
  return trace(cfg, probe_settings(cfg, settings, devices), mesh)
