"""Trace once per structural class of meshes; read every other mesh off it.

All meshes of one slice have the same chip count N, so the step traced at
the probe batch (PROBE·N sequences, simulator.tracing.batch_probe) has the same
global shapes on every X×Y = N. What the mesh's sizes change is only the
per-device shape of each value (its global dims divided by the sizes of the
axes its sharding names) and the sizes the collectives run over; the program
itself (which values exist, their global shapes and shardings, which
collectives run) is the same wherever these are the same:

- whether the kv heads are replicated over Y (simulator.step: Y not
  dividing them changes the shardings), and the vocabulary's padding to its
  axis (simulator.step.pad_vocab changes a global shape);
- the pipeline stages P (a mesh with P has a third axis and the stage loop,
  models.pipeline): each P is a class of its own; so is each number of
  data-parallel replicas D (a third axis the batch is split over with X).

That is the class key (`class_key`). Inside a class, the estimators
(simulator.memory, simulator.timing.roofline) run again on the one traced program
with the target mesh's sizes (`resized`): every size-dependent rule (TPU tile
padding, XLA rules comparing buffer sizes, partial-sum merging, collective
costs, an axis of size 1 read as no axis: its collectives vanish, a reshard
over it alone is a view, a contraction over it is no partial sum;
`axis_sizes`) is evaluated at the target sizes by the same code a real
trace at that mesh runs, so the figures are those of a real trace, not an
approximation; that costs ~50 ms per mesh against ~0.5 s per trace
(llama2_70b). So a mesh with an axis of size 1 is in the class of the
others (JAX's program is the same: a collective over an axis of size 1 is
still in it).

The mesh is refused (`NotInClass`: trace it instead) wherever that could
fail: a sharded dim the target's axes do not divide (the real trace raises a
PlanError there); a dim sharded over X and Y together whose per-device size
is not a shard_map body's (the model's rules shard no dim over two axes
but the batch over the replicas D and X, `BATCH_OVER_REPLICAS`, whose
global size no mesh changes, and JAX's reshape sharding rule,
lax.split_partitions, places the second by the sizes; but JAX stacks a
shard_map's residuals over every axis they vary on: over X and Y, the
body's dim is read; over one axis, the result's whole per-device shape is
its body's, `Resize.tiled`, and a residual of the step's saved-residual
trace not seen there is refused);
a shard_map body dim (a per-device size already, inside the body) that
matches no per-device dim of the body's operands, or two that differ at the
target (seq 4096 and d_model 8192 over Y=2). tests/test_mesh_class.py holds
the figures read off a class's trace equal to real traces' at every other
mesh of the class, meshes with an axis of size 1 among them, and shows
that across classes they differ (an MQA model's kv heads replicated or
not).
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import functools
import math
from typing import TYPE_CHECKING, Iterator

from meshes.layout import REPLICA_AXIS, MeshPlan, abstract_mesh
from models.config import ModelConfig
from simulator.model_checks import kv_heads_replicated
from simulator.settings import TrainSettings

if TYPE_CHECKING:  # simulator.tracing.trace imports simulator.step, which imports this
  from simulator.tracing.trace import Traced


# The one dim the model's rules split over two axes: the batch, over the
# replicas D and X (simulator.step.step_rules); its global size is the
# batch's at every mesh, so its per-device size is divided as one axis's is.
BATCH_OVER_REPLICAS = (REPLICA_AXIS, "X")


class NotInClass(ValueError):
  """The mesh cannot be read off the traced one: trace it."""


def entry_axes(entry) -> tuple[str, ...]:
  """The mesh axes of one PartitionSpec entry (None, a name or a tuple)."""
  if entry is None:
    return ()
  return (entry,) if isinstance(entry, str) else tuple(entry)


def _spec_key(spec) -> tuple:
  key = [entry_axes(e) for e in spec]
  while key and not key[-1]:
    key.pop()
  return tuple(key)


@dataclasses.dataclass(frozen=True)
class Resize:
  """Per-device sizes at the `target` mesh of a program traced at `traced`
  (both {axis: size}); `local`: a shard_map body's per-device dims at the
  traced mesh -> at the target (None: two that differ there); `tiled`: the
  shard_map results whose global shape depends on the mesh."""

  traced: dict
  target: dict
  local: dict
  tiled: dict  # (global shape, spec) -> per-device shape: _shard_map_dims

  @functools.cached_property
  def target_sizes(self) -> tuple[tuple[str, int], ...]:
    return tuple(self.target.items())

  def _divided(self, dim: int, axes: tuple[str, ...]) -> int:
    n = math.prod(self.target[a] for a in axes)
    if dim % n:
      raise NotInClass(f"dim {dim} over {axes}: not divisible at "
                       f"{self.target}")
    if len(axes) > 1 and axes != BATCH_OVER_REPLICAS:  # a shard_map residual
      return self.local_shape((dim // math.prod(self.traced.values()),))[0]
    return dim // n

  def shard_shape(self, shape, spec) -> tuple[int, ...]:
    tiled = self.tiled.get((tuple(shape), _spec_key(spec)))
    if tiled is not None:
      return tiled
    spec = tuple(spec) + (None,) * (len(shape) - len(spec))
    return tuple(self._divided(d, entry_axes(e)) if entry_axes(e) else d
                 for d, e in zip(shape, spec))

  def local_shape(self, shape) -> tuple[int, ...]:
    out = []
    for d in shape:
      if d in self.local:
        if self.local[d] is None:
          raise NotInClass(f"shard_map body dim {d}: ambiguous")
        out.append(self.local[d])
      elif d == 1:
        out.append(1)
      else:
        raise NotInClass(f"shard_map body dim {d}: not an operand's")
    return tuple(out)


_RESIZE: contextvars.ContextVar[Resize | None] = contextvars.ContextVar(
    "resize", default=None)


def current() -> Resize | None:
  """The resize the estimators are running under (None: the traced mesh)."""
  return _RESIZE.get()


@contextlib.contextmanager
def resized(resize: Resize | None) -> Iterator[None]:
  """Run the estimators at `resize.target` (None: as traced)."""
  token = _RESIZE.set(resize)
  try:
    yield
  finally:
    _RESIZE.reset(token)


def axis_sizes(mesh) -> tuple[tuple[str, int], ...]:
  """((axis, size), ...) of the traced `mesh` at the current mesh (the
  target's sizes under `resized`): what a rule reading a size-1 axis as no
  axis, or a contraction as a partial sum, must read; a tuple, to key
  memoized rules by."""
  r = current()
  if r is not None:
    return r.target_sizes
  return tuple((getattr(mesh, "shape", None) or {}).items())


def local_shape(shape) -> tuple[int, ...]:
  """A shard_map body value's per-device shape at the current mesh."""
  r = current()
  return tuple(shape) if r is None else r.local_shape(shape)


def _shard_map_dims(jaxpr, resize: Resize) -> None:
  """Fill `resize.local` (body dim at the traced mesh -> at the target) from
  every shard_map's operands, and `resize.tiled` from its results: one
  whose per-device shape read off its global shape is not its body's (a
  residual JAX stacks over the one axis it varies on: global dim = body dim
  x that axis's size, a global shape that depends on the mesh) is given its
  body's."""
  from simulator.tracing.program import subjaxprs
  local = resize.local
  for eqn in jaxpr.eqns:
    if eqn.primitive.name == "shard_map":
      body = eqn.params["jaxpr"]
      body = getattr(body, "jaxpr", body)
      for inner, outer, spec in zip(body.invars, eqn.invars,
                                    eqn.params["in_specs"]):
        for d0, d in zip(inner.aval.shape,
                         resize.shard_shape(outer.aval.shape, spec)):
          if (d0 == 1) != (d == 1):
            raise NotInClass(f"shard_map dim {d0} -> {d}")
          local[d0] = d if local.get(d0, d) == d else None
      for inner, outer, spec in zip(body.outvars, eqn.outvars,
                                    eqn.params["out_specs"]):
        mine = resize.local_shape(inner.aval.shape)
        if resize.shard_shape(outer.aval.shape, spec) != mine:
          key = (tuple(outer.aval.shape), _spec_key(spec))
          if resize.tiled.get(key, mine) != mine:
            raise NotInClass(f"shard_map result {key}: ambiguous")
          resize.tiled[key] = mine
    for _, sub in subjaxprs(eqn):
      _shard_map_dims(sub, resize)


def resize_for(traced: Traced, traced_plan: MeshPlan,
               target: MeshPlan) -> Resize | None:
  """The resize from the mesh `traced` was traced on to `target` (None: the
  same mesh); NotInClass where a shard_map body cannot be resized, or a
  residual a shard_map made (its global shape may be its body's times the
  sizes of the axes it varies on) is not read off a body: only the
  residuals stacked over every axis are (`Resize._divided`)."""
  if traced_plan.axis_sizes == target.axis_sizes:
    return None
  sizes = lambda p: dict(zip(p.axis_names, p.axis_sizes))
  resize = Resize(sizes(traced_plan), sizes(target), {}, {})
  _shard_map_dims(traced.jaxpr.jaxpr, resize)
  for r in traced.residuals:  # made in a trace of their own
    spec = _spec_key(getattr(r.aval.sharding, "spec", ()))
    if (r.op == "shard_map" and any(len(axes) == 1 for axes in spec)
        and (tuple(r.aval.shape), spec) not in resize.tiled):
      raise NotInClass(f"{r.name}: a shard_map residual over one axis")
  return resize


def class_key(cfg: ModelConfig, settings: TrainSettings,
              plan: MeshPlan) -> tuple:
  """What the traced program's structure depends on besides the model and
  settings (see the module doc). Raises simulator.step.PlanError for a mesh
  the step cannot lay out."""
  from simulator.step import pad_vocab, step_rules
  mesh = abstract_mesh(plan)
  rules, _, _ = step_rules(cfg, settings, mesh)
  padded, _ = pad_vocab(cfg, rules, mesh)
  return (kv_heads_replicated(cfg, plan.Y),
          padded.vocab_size) + (plan.outer[:2] if plan.outer else ())
