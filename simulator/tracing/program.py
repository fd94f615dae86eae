"""Read the sharded train-step jaxpr: every collective its shardings imply, every matmul.

One walk over the traced program (simulator.tracing.trace) under the Explicit X/Y mesh. Rules
(the same XLA's SPMD partitioner applies to these shardings):

- `reshard` src → dst: a mesh axis dropped from a dim is an all-gather over that axis
  (the FSDP weight gather, the TP activation gather); an axis added is a local slice
  (free) unless the value holds partial sums over it (then the preceding all-reduce
  becomes a reduce-scatter, as XLA's reduce-scatter creator does); an axis moved
  between dims is an all-to-all.
- `dot_general`: an axis sharding a contracting dim of both operands leaves partial
  sums: a reduce-scatter when the output is sharded over that axis, else an
  all-reduce. An axis sharding an operand dim that the output (or the other operand's
  use of the axis) cannot keep is an all-gather of that operand. A value gathered
  twice over the same axis in one scope is gathered once (XLA CSE); a scope is
  one HLO computation as XLA makes it: calls inlined, a loop of one trip
  inlined, a cast of one value to one dtype made once (`_Walker._key`).
- reductions (`reduce_sum`, `reduce_max`, ...) over a sharded dim: all-reduce.
- explicit collectives inside shard_map (psum, all_gather, ...): as written.

Loops multiply: a record inside a scan counts `length` times. Phase comes from JAX's
name stack: `transpose(...)` is the backward pass, `jvp(...)` the forward, anything
else (the update, final reshards) the optimizer. Layer: the first module name inside
the outermost scan (e.g. "blocks"), or "top" outside every scan.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from typing import Any, Iterator

import jax
from jax.extend import core as jcore

from meshes.layout import REPLICA_AXIS
from models import scopes
from models.scopes import scopes_of
from simulator.tracing import loops, mesh_class, windowed
from simulator.tracing.batch_probe import carries_batch, matmul_kind
from simulator.tracing.conditions import Condition, SizeTest
from simulator.tracing.trace import fusible

_UNARY = {"convert_element_type", "transpose", "copy", "copy_p", "name",
          "reduce_precision", "squeeze", "expand_dims", "reshape", "neg",
          "optimization_barrier"}
_REDUCE = {"reduce_sum", "reduce_max", "reduce_min", "reduce_prod",
           "reduce_and", "reduce_or", "argmax", "argmin"}


@dataclasses.dataclass
class Collective:
  """One collective of the step.

  bytes_per_device: V of the Scaling Book: the per-device bytes of the gathered array
  (all-gather), of the unreduced input (reduce-scatter), of the array (all-reduce,
  all-to-all). count: executions per step (scan lengths multiplied in).
  x_exp / y_exp: how many times X / Y divide those bytes (for rescaling to other
  meshes: bytes ∝ X^-x_exp · Y^-y_exp at fixed global batch).
  prefetchable: the operand does not depend on the data (a weight gather: can be
  issued ahead of the matmul that needs it). deferrable: nothing on the layer's
  critical path waits for the result (a gradient reduce-scatter).
  """

  kind: str  # all-gather | reduce-scatter | all-reduce | all-to-all | permute
  axis: str
  bytes_per_device: int
  count: int
  source: str
  layer: str
  phase: str  # forward | backward | optimizer
  prefetchable: bool
  deferrable: bool
  dtype: str
  shape: tuple[int, ...]  # global shape of the array V refers to
  x_exp: int
  y_exp: int
  # libtpu's windowed einsum (simulator.tracing.windowed): collective-permutes
  # over Y that its loop overlaps with the matmul's own partial products.
  windowed: bool = False
  # made only where this holds (None: always); `present`
  present_if: Condition | None = None

  @property
  def overlappable(self) -> bool:
    return self.prefetchable or self.deferrable or self.windowed

  def present(self, t: float = 1.0, x: float = 1.0, y: float = 1.0) -> bool:
    """Made at T/T0 = t, X/X0 = x, Y/Y0 = y (the traced step: all 1)."""
    return self.present_if is None or self.present_if.holds(t, x, y)


@dataclasses.dataclass(frozen=True)
class _Accumulated:
  """A pending partial-sum record a scan body adds into a carried
  accumulator (`_Walker._moved_out`)."""

  record: Collective


@dataclasses.dataclass
class Dot:
  """One dot_general: FLOPs per execution, globally and on one device."""

  flops_global: int
  flops_per_device: int
  count: int
  source: str
  layer: str
  phase: str
  x_exp: int  # per-device FLOPs ∝ X^-x_exp · Y^-y_exp at fixed global batch
  y_exp: int
  dims: tuple[int, ...]  # output then contracting dims: FLOPs = 2·their product
  kind: str = "activation"  # simulator.tracing.batch_probe.matmul_kind
  # (K, N) on one device: the contracting and the rhs's free dims' products,
  # per dot_general batch instance: the [K, N] operand the MXU holds in
  # tiles (TPU Scaling Book, "How to Think About TPUs": the MXU does
  # bf16[8,128] @ bf16[128,128] every 8 cycles); () when not known.
  mxu_dims: tuple[int, ...] = ()
  # HBM bytes one execution moves on one device, (those of operands that
  # do not carry the batch, those that do, at the traced batch): both
  # operands read once and the result written once (a GEMM streams its
  # tiles through on-chip memory); (0, 0) when not known.
  hbm_bytes: tuple[int, int] = (0, 0)


@dataclasses.dataclass(frozen=True)
class Traffic:
  """The HBM bytes one fusion moves per execution on one device: the
  buffers it writes and reads (simulator.memory.liveness.hbm_traffic), for
  work that is neither a matmul nor a collective."""

  fixed: int
  linear: int  # the bytes that carry the batch, at the traced batch
  count: int
  layer: str
  phase: str


@dataclasses.dataclass(frozen=True)
class HostCopy:
  """A value copied between host memory and HBM (a device_put across
  memory kinds: remat offload's residuals, offloaded parameters or
  optimizer state) per execution on one device."""

  bytes_per_device: int
  count: int
  layer: str
  phase: str
  to_host: bool
  shape: tuple[int, ...]  # global: whether the bytes carry the batch


@dataclasses.dataclass
class Program:
  collectives: list[Collective]
  dots: list[Dot]
  mesh_sizes: dict[str, int]
  traffic: list[Traffic] = dataclasses.field(default_factory=list)
  host: list[HostCopy] = dataclasses.field(default_factory=list)

  def made(self) -> list[Collective]:
    """The collectives of the step at the mesh and batch it was traced at
    (`collectives` also holds those another batch or mesh would make)."""
    return [c for c in self.collectives if c.present()]

  def hbm_bytes_once(self) -> tuple[int, int]:
    """(matmuls', other fusions') HBM bytes at the traced batch, each loop
    body once, as XLA's HloCostAnalysis counts a while loop."""
    return (sum(sum(d.hbm_bytes) for d in self.dots),
            sum(t.fixed + t.linear for t in self.traffic))


def dot_result_dims(eqn) -> tuple[dict[int, int], dict[int, int]]:
  """Where a dot_general puts each operand's batch and free dims in its
  result ({operand dim: result dim}, lhs then rhs): the batch dims first,
  then the lhs's free dims, then the rhs's, each in operand order."""
  (lc, rc), (lb, rb) = eqn.params["dimension_numbers"]
  lhs, rhs = (v.aval.shape for v in eqn.invars[:2])
  lfree = [d for d in range(len(lhs)) if d not in lc and d not in lb]
  rfree = [d for d in range(len(rhs)) if d not in rc and d not in rb]
  of_l = {d: i for i, d in enumerate(lb)}
  of_l.update({d: len(lb) + i for i, d in enumerate(lfree)})
  of_r = {d: i for i, d in enumerate(rb)}
  of_r.update({d: len(lb) + len(lfree) + i for i, d in enumerate(rfree)})
  return of_l, of_r


def dot_sharding(eqn, axes) -> tuple[dict[str, set], dict[str, int]]:
  """How XLA's SPMD partitioner runs one dot_general over the mesh `axes`
  (those of more than one device): ({"l": axes, "r": axes} each operand is
  all-gathered over, {axis: contracting pair index} left as partial sums).
  An axis sharding a contracting dim of both operands leaves partial sums
  (so does one only one operand shards, the other sliced); one sharding an
  operand's dim that the output cannot keep, or a contracting dim the other
  operand shards elsewhere, is gathered."""
  lhs, rhs = eqn.invars
  out = eqn.outvars[0]
  (lc, rc), _ = eqn.params["dimension_numbers"]
  lc, rc = list(lc), list(rc)
  ls, rs = lhs.aval.shape, rhs.aval.shape
  Ls, Rs = _spec(lhs.aval, len(ls)), _spec(rhs.aval, len(rs))
  Os = _spec(out.aval, len(out.aval.shape))
  out_of_l, out_of_r = dot_result_dims(eqn)
  gather: dict[str, set] = {"l": set(), "r": set()}
  partial: dict[str, int] = {}  # axis -> contracting pair index
  for a in axes:
    loc_l = [d for d in range(len(ls)) if a in Ls[d]]
    loc_r = [d for d in range(len(rs)) if a in Rs[d]]
    for side, locs, other_locs, spec_other, mine, theirs, out_of in (
        ("l", loc_l, loc_r, Rs, lc, rc, out_of_l),
        ("r", loc_r, loc_l, Ls, rc, lc, out_of_r)):
      for d in locs:
        if d in mine:
          i = mine.index(d)
          if a in spec_other[theirs[i]]:
            partial[a] = i
          elif other_locs:
            gather[side].add(a)
          else:
            partial[a] = i
        elif a not in Os[out_of[d]]:
          gather[side].add(a)
  return gather, partial


def _spec(aval, ndim: int) -> tuple[tuple[str, ...], ...]:
  sharding = getattr(aval, "sharding", None)
  spec = getattr(sharding, "spec", None)
  if spec is None:
    return ((),) * ndim
  out = []
  for i in range(ndim):
    entry = spec[i] if i < len(spec) else None
    if entry is None:
      out.append(())
    elif isinstance(entry, str):
      out.append((entry,))
    else:
      out.append(tuple(entry))
  return tuple(out)


def _unreduced(aval) -> frozenset:
  spec = getattr(getattr(aval, "sharding", None), "spec", None)
  return frozenset(getattr(spec, "unreduced", ()) or ())


def _local_bytes(shape, spec, dtype, sizes) -> int:
  n = 1
  for dim, axes in zip(shape, spec):
    n *= -(-dim // math.prod(sizes.get(a, 1) for a in axes))
  return n * jax.numpy.dtype(dtype).itemsize


def _body_shape(aval, sizes) -> tuple[int, ...]:
  """A shard_map body value's per-device shape: its manual dims are per
  device already; a dim it keeps sharded over an axis the shard_map leaves
  to the compiler (a pipeline's X and Y around its manual P) is divided."""
  shape = mesh_class.local_shape(aval.shape)
  spec = tuple(getattr(getattr(aval, "sharding", None), "spec", ()) or ())
  spec += (None,) * (len(shape) - len(spec))
  return tuple(
      d // math.prod(sizes.get(a, 1) for a in mesh_class.entry_axes(e))
      for d, e in zip(shape, spec))


def _exps(spec) -> tuple[int, int]:
  flat = [a for axes in spec for a in axes]
  return flat.count("X"), flat.count("Y")


def subjaxprs(eqn) -> Iterator[tuple[str, jcore.Jaxpr]]:
  """(param name, jaxpr) for every jaxpr an equation carries."""
  return iter(_subjaxprs(eqn))


@functools.lru_cache(maxsize=1 << 14)
def _subjaxprs(eqn) -> tuple[tuple[str, jcore.Jaxpr], ...]:
  """subjaxprs, once per equation: the memory rules ask each equation of a
  program tens of times. Equations hash by identity, and the cache holds
  the ones it keys, so no other equation can take their id."""
  out = []
  for key, value in eqn.params.items():
    for v in value if isinstance(value, (tuple, list)) else (value,):
      if isinstance(v, jcore.ClosedJaxpr):
        out.append((key, v.jaxpr))
      elif isinstance(v, jcore.Jaxpr):
        out.append((key, v))
  return tuple(out)


def _mesh_sizes(closed) -> dict[str, int]:
  resize = mesh_class.current()  # another mesh of the traced one's class
  if resize is not None:
    return dict(resize.target)
  jaxpr = getattr(closed, "jaxpr", closed)
  for v in list(jaxpr.invars) + list(jaxpr.outvars):
    mesh = getattr(getattr(v.aval, "sharding", None), "mesh", None)
    if mesh is not None and getattr(mesh, "axis_names", ()):
      return dict(zip(mesh.axis_names, mesh.axis_sizes))
  return {}


def _critical(jaxpr, carry_out: int) -> set:
  """The values the first `carry_out` outputs (a layer's carried result) or
  a matmul wait on."""
  isvar = lambda v: not isinstance(v, jcore.Literal)
  roots = [v for v in jaxpr.outvars[:carry_out] if isvar(v)]
  for eqn in jaxpr.eqns:
    if eqn.primitive.name == "dot_general":
      roots += [v for v in eqn.invars if isvar(v)]
  producers = {o: e for e in jaxpr.eqns for o in e.outvars}
  critical: set = set()
  stack = list(roots)
  while stack:
    v = stack.pop()
    if v in critical:
      continue
    critical.add(v)
    e = producers.get(v)
    if e is not None:
      stack += [i for i in e.invars if isvar(i)]
  return critical


@functools.lru_cache(maxsize=1 << 12)
def _named(name_stack) -> tuple[bool, bool, str]:
  """Whether a name stack is in a transpose (the backward pass) and in a
  jvp, and its scopes' path: once per name stack (they hash by value)."""
  ns = str(name_stack)
  return (scopes.in_backward(name_stack), "jvp(" in ns,
          "/".join(scopes_of(ns)))


def _where(ctx: dict, name_stack) -> tuple[dict, str]:
  """The context (phase, layer) of an equation made under `name_stack` in
  a jaxpr walked under `ctx`, and its source path ("" when it has none)."""
  transposed, jvp, stripped = _named(name_stack)
  phase = ctx["phase"]
  if transposed:
    phase = "backward"
  elif jvp and phase == "optimizer":
    phase = "forward"
  layer = ctx["layer"]
  if layer is None and ctx["depth"] > 0:
    layer = stripped.split("/")[0] or "scan"
  return (dict(ctx, phase=phase, layer=layer or "top"),
          "/".join(p for p in (ctx["prefix"], stripped) if p))


class _Walker:

  def __init__(self, sizes, record: bool = True, gpu: bool = False,
               windowed_einsum: int = 0, dcn_replicas: bool = False):
    """record=False: only which values depend on the data (a loop's carry
    fixpoint needs no collectives, matmuls or traffic). gpu: XLA:GPU's
    program, whose gathers are made once per value only within one jaxpr
    (`_key`) and shared between matmuls as its partitioner groups them
    (`_grouped_side`). windowed_einsum: the chip's
    `Chip.windowed_einsum_contraction` (simulator.tracing.windowed).
    dcn_replicas: the replicas D are TPU slices (`_gather_back`)."""
    self.sizes = {a: s for a, s in sizes.items()}
    self.record = record
    self.cse = not gpu
    self.windowed_einsum = windowed_einsum
    self.dcn_replicas = dcn_replicas
    # `_gather_back`'s records by id, held so that no later record can take
    # the id of one dropped again (`_reshard`)
    self._gathered_back: dict[int, Collective] = {}
    self.collectives: list[Collective] = []
    self.dots: list[Dot] = []
    self.traffic: list[Traffic] = []
    self.host: list[HostCopy] = []
    self._fusions: dict = {}
    # records reassociation made of two, by id (held, as `_gathered_back`)
    self._summed: dict[int, Collective] = {}
    self._keys: dict = {}  # var -> the value XLA's CSE makes it (`_key`)

  def _traffic(self, jaxpr, i: int, ctx) -> None:
    """The HBM traffic of equation i of `jaxpr`, if it makes a buffer."""
    from simulator.memory.liveness import hbm_traffic
    key = (id(jaxpr), bool(ctx.get("manual")))
    if key not in self._fusions:
      self._fusions[key] = hbm_traffic(jaxpr, local=bool(ctx.get("manual")),
                                       in_loop=ctx["mult"] > 1)
    moved = self._fusions[key].get(i)
    if moved:
      self.traffic.append(Traffic(moved[0], moved[1], ctx["mult"],
                                  ctx["layer"], ctx["phase"]))

  # -- helpers -------------------------------------------------------------
  def _active(self, axis):
    return self.sizes.get(axis, 1) > 1

  def _emit(self, ctx, kind, axis, shape, spec, dtype, source, data, critical,
            nbytes=None, present_if=None):
    if not self._active(axis):
      return None
    ex, ey = _exps(spec)
    c = Collective(
        kind=kind, axis=axis,
        bytes_per_device=(nbytes if nbytes is not None else
                          _local_bytes(shape, spec, dtype, self.sizes)),
        count=ctx["mult"], source=source, layer=ctx["layer"],
        phase=ctx["phase"], prefetchable=not data, deferrable=not critical,
        dtype=str(jax.numpy.dtype(dtype)), shape=tuple(shape), x_exp=ex,
        y_exp=ey, present_if=present_if)
    self.collectives.append(c)
    return c

  @staticmethod
  def _gather_once(gathered: set, key, axis: str, when=()):
    """A gather of `key` over `axis` shared with this scope's earlier ones
    (XLA's CSE; on a GPU the SPMD partitioner's reuse of a reshard), made
    where `when` holds: False if never made, None if always, else the
    Condition under which it is (where no earlier one is); kept for later."""
    earlier = tuple(c for k, a, c in gathered if (k, a) == (key, axis))
    gathered.add((key, axis, tuple(when)))
    if () in earlier:
      return False
    return Condition(tuple(when), earlier) if when or earlier else None

  # -- the walk ------------------------------------------------------------
  def _key(self, v):
    """What `v` is after XLA inlines calls and CSEs identical casts: the
    outer value a call's or an inlined loop's input stands for, a cast's
    (dtype, operand), or `v` itself. Gathers are made once per key and axis
    in one scope: the tied embedding table, cast to bf16 and gathered over X
    for the lookup and again for the output projection (gpt2 v5p-8 4x1,
    corpus #0: one 77 MB all-gather of it in the HLO, two in the program,
    +9.40%), and gathered again by the second micro-batch under
    --grad_accum=2, whose one-trip loop XLA inlines (#169: one where the
    program has four). Not on a GPU, whose HLO gathers that table twice
    (GPU corpus: gpt2 h100:8 8x1, #0, exact without this, -8.58% with it;
    a one-trip loop's gathers again in #70, -12.96%): there `v` itself."""
    return self._keys.get(v, v)

  def _bind(self, inner, outer) -> None:
    """`inner` invars stand for the `outer` values (an inlined call)."""
    for i, o in zip(inner, outer):
      if self.cse and not isinstance(o, jcore.Literal):
        self._keys[i] = self._key(o)

  def walk(self, jaxpr, data_in, ctx, pending_in=None, carry_out=0,
           carry_in=(), gathered=None):
    """Returns (data flags of outvars, pending partial-sum records of
    outvars). `carry_in`: a scan body's carried inputs, in order: a partial
    sum added into one of them and carried out at its place is an
    accumulation (`_moved_out`)."""
    data: dict[Any, bool] = {}
    pending: dict[Any, list] = {}
    accumulated: dict[Any, tuple[int, list]] = {}  # carry out -> (index, recs)
    carried = {v: j for j, v in enumerate(carry_in)}
    for v, d in zip(jaxpr.invars, data_in):
      data[v] = d
    for v, p in zip(jaxpr.invars, pending_in or ()):
      if p:
        pending[v] = p
    isvar = lambda v: not isinstance(v, jcore.Literal)
    get = lambda v: data.get(v, False) if isvar(v) else False

    critical = _critical(jaxpr, carry_out) if self.record else set()
    gathered = set() if gathered is None else gathered  # this scope's gathers
    readers = None  # var -> the equations reading it, made when first asked
    where: dict = {}  # name stack -> _where: the equations share a few
    for index, eqn in enumerate(jaxpr.eqns):
      name = eqn.primitive.name
      if self.record:
        ns = eqn.source_info.name_stack
        if ns not in where:
          where[ns] = _where(ctx, ns)
        ectx, source = where[ns]
        source = source or name
      else:  # a carry fixpoint's walk: it records nothing, so names nothing
        ectx, source = ctx, name
      in_data = [get(v) for v in eqn.invars]
      any_data = any(in_data)
      out_critical = any(o in critical for o in eqn.outvars)

      if name == "scan":
        body = eqn.params["jaxpr"].jaxpr
        length = eqn.params["length"]
        nc, ncarry = loops.scan_counts(eqn)
        sctx = dict(ectx, mult=ectx["mult"] * length, depth=ctx["depth"] + 1,
                    layer=ctx["layer"], prefix=ctx["prefix"])
        flags = list(in_data)
        # carry fixpoint on data dependence (two passes at most; one that
        # turns no flag on ends it), then the real walk
        probe = _Walker(self.sizes, record=False, gpu=not self.cse)
        for _ in range(2):
          if all(flags[nc:nc + ncarry]):
            break
          outs, _p = probe.walk(body, flags, sctx, carry_out=ncarry)
          turned = [f or o for f, o in zip(flags[nc:nc + ncarry], outs)]
          if turned == flags[nc:nc + ncarry]:
            break
          flags[nc:nc + ncarry] = turned
        inlined = length == 1  # XLA inlines a loop of one trip
        if inlined:
          self._bind(body.invars[:nc + ncarry], eqn.invars[:nc + ncarry])
        outs, pend = self.walk(body, flags, sctx, carry_out=ncarry,
                               carry_in=body.invars[nc:nc + ncarry],
                               gathered=gathered if inlined and self.cse
                               else None)
        if self.record:
          self._moved_out(pend, ncarry, ectx)
        for o, d, p in zip(eqn.outvars, outs, pend):
          data[o] = d
          if p and outs is not None:
            pending[o] = p
        continue
      if name == "while":
        bj = eqn.params["body_jaxpr"].jaxpr
        cn, bn = loops.while_counts(eqn)
        carry = in_data[cn + bn:]
        wctx = dict(ectx, depth=ctx["depth"] + 1, layer=ctx["layer"])
        outs, _ = self.walk(bj, in_data[cn:cn + bn] + carry, wctx,
                            carry_out=len(carry))
        for o, d in zip(eqn.outvars, outs):
          data[o] = d or any_data
        continue
      if name == "cond":
        branch = eqn.params["branches"][0].jaxpr
        outs, _ = self.walk(branch, in_data[1:], ectx,
                            carry_out=len(branch.outvars))
        for o, d in zip(eqn.outvars, outs):
          data[o] = d or in_data[0]
        continue
      subs = list(subjaxprs(eqn))
      if subs:
        key, sub = subs[0]
        sctx = dict(ectx)
        if name == "shard_map":  # over every axis, or some (pipeline: P)
          manual = eqn.params.get("newly_manual_axes") or self.sizes
          sctx["manual"] = True
          sctx["manual_mult"] = math.prod(self.sizes.get(a, 1)
                                          for a in manual)
        if len(sub.invars) == len(eqn.invars):
          pin = [pending.get(v) if isvar(v) else None for v in eqn.invars]
          barred = (eqn.params.get("prevent_cse")  # jax.checkpoint's barrier
                    or not self.cse)
          if not barred:
            self._bind(sub.invars, eqn.invars)
          outs, pend = self.walk(sub, in_data, sctx, pending_in=pin,
                                 carry_out=len(sub.outvars) if out_critical else 0,
                                 gathered=None if barred else gathered)
          for o, d, p in zip(eqn.outvars, outs, pend):
            data[o] = d
            if p:
              pending[o] = p
        else:
          k = len(sub.invars)
          self.walk(sub, [any_data] * k, sctx, carry_out=0)
          for o in eqn.outvars:
            data[o] = any_data
        continue

      for o in eqn.outvars:
        data[o] = any_data
      if not self.record:
        continue
      if ctx["mult"] and name not in _NO_TRAFFIC:
        self._traffic(jaxpr, index, ectx)
      if name == "device_put" and ctx["mult"] and not ctx.get("manual"):
        self._host_copies(eqn, ectx)
      if ctx.get("manual"):
        self._manual(eqn, ectx, source, any_data, out_critical, pending)
        continue
      if name == "reshard":
        if readers is None:
          readers = _readers(jaxpr)
        self._reshard(eqn, ectx, source, any_data, out_critical, pending,
                      gathered, readers)
      elif name == "dot_general":
        self._dot(eqn, ectx, source, in_data, out_critical, pending, gathered)
      elif name in _REDUCE:
        self._reduce(eqn, ectx, source, any_data, out_critical, pending)
      elif (name in _UNARY or _bitcast_broadcast(eqn)) and eqn.invars and isvar(
          eqn.invars[0]):
        if name == "reshape":
          self._reshape(eqn, ectx, source, any_data, out_critical)
        if name == "convert_element_type" and self.cse:
          self._keys[eqn.outvars[0]] = (name, str(eqn.outvars[0].aval.dtype),
                                        self._key(eqn.invars[0]))
        p = pending.get(eqn.invars[0])
        if p:
          pending[eqn.outvars[0]] = p
      elif name in ("add", "add_any") and all(map(isvar, eqn.invars)):
        merged = self._reassociate(*(pending.get(v, ()) for v in eqn.invars))
        if merged:
          pending[eqn.outvars[0]] = merged
        acc = [v for v in eqn.invars if v in carried and v not in pending]
        summand = [pending.get(v) for v in eqn.invars if v not in acc]
        if len(acc) == 1 and len(summand) == 1 and summand[0]:
          accumulated[eqn.outvars[0]] = (carried[acc[0]], summand[0])
    outs = [get(v) for v in jaxpr.outvars]
    pend = [pending.get(v) if isvar(v) else None for v in jaxpr.outvars]
    for j, v in enumerate(jaxpr.outvars[:len(carried)]):
      if isvar(v) and accumulated.get(v, (None,))[0] == j:
        pend[j] = [_Accumulated(r) for r in accumulated[v][1]]
    return outs, pend

  def _moved_out(self, pend, ncarry: int, ctx) -> None:
    """XLA's while-loop all-reduce code motion
    (while_loop_all_reduce_code_motion.cc): an all-reduce whose result a
    loop only adds into a carried accumulator runs once, after the loop, on
    the accumulated partial sums, where one all-reduce is added in; a sum
    of two that reassociation makes one (`_reassociate`) stays in the
    loop on a TPU, as libtpu's T5 steps keep the encoder output's
    gradient, the cross-attention's k and v input gradients summed over Y,
    in the decoder's backward loop (#245, t5_3b v6e-16 8x2: collectives
    +0.72%, -4.99% with it moved out), and is moved out on a GPU: XLA:GPU
    reduces it once, after that loop (t5_large h100:8 4x2, GPU corpus #38:
    `all-reduce-start.10 = bf16[8,512,1024]` over Y in the entry
    computation; +3.76% with it in the loop, +0.15% moved out). With a 4-chunk loss the output
    projection's weight gradient, partial over X in each chunk's f32
    matmul, is reduced once in the step where the traced program reduces
    it in each of the loss's backward loop's four iterations: llava_mini
    v5p-8 4x1 (corpus #82) `all-reduce.28 = f32[1024,32064]` in
    all-reduce-scatter.8, qwen2-0.5b v5p-8 4x1 (#264) `all-reduce.17 =
    bf16[896,151936]`, both in the step's entry computation. XLA reduces
    #264's bf16 accumulator, and gemma-2b v4-32 16x1's (#223, 4 chunks:
    `all-reduce.14 = bf16[2048,256000]` of the loop's result), as llava_mini
    2x2's (#84: bf16[1024,16032] in the combined all-reduce.87), but #82's
    cast to f32 (convert.4, then all-reduce-scatter.8); the tiny model with
    a d x V output projection over 4 chunks on v5p-8 4x1 (tied or not)
    keeps f32 at d = 1024 up to V = 147456 and narrows from V = 151808, and
    narrows at d = 896 with V = 32064 (session 31: `compiled.compile_step`
    on such variants of `tiny`, read off their dumps). Which type it keeps
    is not derived, so the record keeps the matmul's f32 (an upper bound
    where XLA narrows: #223 +6.97%, #264 +6.37%). The all-reduce stays
    one: no partial sum is pending after the loop for a reshard to make a
    reduce-scatter of."""
    for j, recs in enumerate(pend[:ncarry]):
      if not recs or not all(isinstance(r, _Accumulated) for r in recs):
        continue
      for acc in recs:
        if ((acc.record.kind == "all-reduce"
             or id(acc.record) in self._gathered_back)
            and (not self.cse or id(acc.record) not in self._summed)):
          acc.record.count = ctx["mult"]
      pend[j] = None

  def _reassociate(self, a: list, b: list) -> list:
    """XLA's all-reduce and reduce-scatter reassociation
    (all_reduce_reassociate.cc, reduce_scatter_reassociate.cc):
    add(all-reduce(x), all-reduce(y)) is all-reduce(add(x, y)), one
    collective where the program had two. Returns the sum's records."""
    if not a or not b:
      return []
    merged = list(a)
    for rec in b:
      twin = next((r for r in merged if (r.kind, r.axis, r.bytes_per_device,
                                         r.count) == (rec.kind, rec.axis,
                                                      rec.bytes_per_device,
                                                      rec.count)), None)
      if twin is None:
        merged.append(rec)
      else:
        self._summed[id(twin)] = twin
        if any(c is rec for c in self.collectives):
          self.collectives = [c for c in self.collectives if c is not rec]
    return merged

  # -- primitives ----------------------------------------------------------
  def _reshard(self, eqn, ctx, source, data, critical, pending, gathered,
               readers):
    x, = eqn.invars
    out, = eqn.outvars
    shape, dtype = x.aval.shape, x.aval.dtype
    src, dst = _spec(x.aval, len(shape)), _spec(out.aval, len(shape))
    # unreduced → reduced: the deferred reduction happens here
    for a in _unreduced(x.aval) - _unreduced(out.aval):
      kind = "reduce-scatter" if any(a in d for d in dst) else "all-reduce"
      spec = tuple(tuple(b for b in d if b != a) for d in dst)
      self._emit(ctx, kind, a, shape, spec, dtype, source, data, critical)
    cur = [list(d) for d in src]
    for a in self.sizes:
      sd = {i for i, d in enumerate(src) if a in d}
      dd = {i for i, d in enumerate(dst) if a in d}
      if sd == dd:
        continue
      if sd and not dd:
        for i in sd:
          cur[i].remove(a)
        if _round_trip(out, a, sd, readers):
          continue
        when = self._gather_once(gathered, self._key(x), a)
        if when is not False:
          self._emit(ctx, "all-gather", a, shape, tuple(map(tuple, cur)),
                     dtype, source, data, critical, present_if=when)
      elif dd and not sd:
        recs = pending.get(x, ())
        if _over_replicas(recs):  # `_replicas_sum_on_shard`
          back = [r for r in recs if id(r) in self._gathered_back]
          if back:  # kept scattered after all: no gather back (`_gather_back`)
            self.collectives = [c for c in self.collectives
                                if not any(c is r for r in back)]
            pending[x] = [r for r in recs if id(r) not in self._gathered_back]
          continue
        for rec in recs:
          if rec.axis == a and rec.kind == "all-reduce":
            rec.kind = "reduce-scatter"
      else:
        self._emit(ctx, "all-to-all", a, shape, src, dtype, source, data,
                   critical)

  def _grouped_side(self, eqn) -> tuple[str | None, SizeTest | None]:
    """The operand ('l' or 'r') on whose non-contracting dims XLA's SPMD
    partitioner groups the devices of a matmul, or None where it would not
    (batch dims sharded: grouped on them first; no operand's non-contracting
    sharding kept whole by the result), and, where that turns on the batch
    or the mesh's sizes, the test that holds where it groups on the lhs.
    Its dot handler
    (`PartitionDotGroupOnNonContractingDims`) reshards the other operand
    first, as any reshard (kept and reused by the matmuls after it), and
    gathers what the grouped operand needs inside the group, for this
    matmul alone. Where both could be grouped it takes the lhs iff lhs
    partitions x the rhs's per-device bytes < rhs partitions x the lhs's
    (`LhsIsBestMatchForNonContractingPartitioning`). gpt2 h100:8 4x2 (GPU
    corpus #75), the recomputed MLP input's product with its weight: at b8
    (1.5 MB of input a device against 2.4 MB of weight) grouped on the
    weight, the input's gather over Y (all-gather.15 after the SPMD
    partitioner) is the one the weight gradient reads again; at b32 (6.3
    MB) grouped on the input, its gather is made inside the group
    (sharding {replicated}) and the weight gradient gathers it again
    (all-gather.32)."""
    lhs, rhs = eqn.invars
    out = eqn.outvars[0]
    (lc, rc), (lb, rb) = eqn.params["dimension_numbers"]
    Ls = _spec(lhs.aval, len(lhs.aval.shape))
    Rs = _spec(rhs.aval, len(rhs.aval.shape))
    Os = _spec(out.aval, len(out.aval.shape))
    of_l, of_r = dot_result_dims(eqn)
    parts = lambda axes: math.prod(self.sizes[a] for a in axes
                                   if self._active(a))
    if any(parts(Os[of_l[d]]) > 1 for d in lb):
      return None, None
    may, nc, nc_exps = {}, {}, {}
    for side, spec, skip, of in (("l", Ls, (*lc, *lb), of_l),
                                 ("r", Rs, (*rc, *rb), of_r)):
      free = [d for d in range(len(spec)) if d not in skip]
      nc[side] = math.prod(parts(spec[d]) for d in free)
      nc_exps[side] = _exps([tuple(a for a in spec[d] if self._active(a))
                             for d in free])
      may[side] = nc[side] > 1 and nc[side] == math.prod(
          parts(Os[of[d]]) for d in free)
    if not (may["l"] and may["r"]):
      return ("l" if may["l"] else "r" if may["r"] else None), None
    def side_of(partitions, exps, v, spec):  # partitions x per-device bytes
      xe, ye = _exps(spec)
      return (partitions * _local_bytes(v.aval.shape, spec, v.aval.dtype,
                                        self.sizes),
              exps[0] - xe, exps[1] - ye, int(carries_batch(v.aval.shape)))
    test = SizeTest(*side_of(nc["l"], nc_exps["l"], rhs, Rs),
                    *side_of(nc["r"], nc_exps["r"], lhs, Ls))
    grouped = "l" if test.holds() else "r"
    if (test.px, test.py, test.pt) == (test.qx, test.qy, test.qt):
      return grouped, None
    return grouped, test

  def _reshape(self, eqn, ctx, source, data, critical) -> None:
    """A reshape that moves a dim's sharding over an axis to a dim with more
    (or fewer) elements before it: each device's rows are not its own
    after it, and the SPMD partitioner moves them with an all-to-all over
    part of the axis and a collective-permute over it, each of the device's
    bytes. The step's query heads split into kv heads x query heads per kv
    head, sharded over Y on the latter, where Y divides the second but not
    the number of kv heads (mixtral_mini v5p-16 2x4, 8 heads over 2 kv
    heads: corpus #126's all-to-all.50 and collective-permute-start, 33.5
    MB each, for each such reshape of a layer; on a GPU #48; the tiny model
    with 8 or 16 heads over 2 kv heads at Y = 4 and 8, probed: one of each
    per reshape). Not where one axis shards two dims, or a dim two axes."""
    x, out = eqn.invars[0], eqn.outvars[0]
    src = _spec(x.aval, len(x.aval.shape))
    dst = _spec(out.aval, len(out.aval.shape))
    for a in self.sizes:
      if not self._active(a):
        continue
      before = [i for i, axes in enumerate(src) if a in axes]
      after = [i for i, axes in enumerate(dst) if a in axes]
      if (len(before) != 1 or len(after) != 1 or src[before[0]] != (a,)
          or dst[after[0]] != (a,)):
        continue
      if (math.prod(x.aval.shape[:before[0]])
          == math.prod(out.aval.shape[:after[0]])):
        continue  # each device's rows are its own after the reshape
      for kind in ("all-to-all", "permute"):
        self._emit(ctx, kind, a, out.aval.shape, dst, out.aval.dtype, source,
                   data, critical)

  def _dot(self, eqn, ctx, source, in_data, critical, pending, gathered):
    lhs, rhs = eqn.invars
    out = eqn.outvars[0]
    (lc, rc), (_, rb) = eqn.params["dimension_numbers"]
    ls, rs = lhs.aval.shape, rhs.aval.shape
    Ls, Rs = _spec(lhs.aval, len(ls)), _spec(rhs.aval, len(rs))
    Os = _spec(out.aval, len(out.aval.shape))
    rfree = [d for d in range(len(rs)) if d not in rc and d not in rb]
    gather, partial = dot_sharding(eqn, [a for a in self.sizes
                                         if self._active(a)])
    # per-device (local) sizes after the gathers
    def local(shape, spec, drop):
      return [dim // math.prod(self.sizes[b] for b in axes if b not in drop)
              for dim, axes in zip(shape, spec)]
    rs_axes = {a for a in partial if any(a in d for d in Os)}
    osh = out.aval.shape
    out_local = [dim // math.prod(self.sizes[b] for b in axes if b not in rs_axes)
                 for dim, axes in zip(osh, Os)]
    Ll = local(ls, Ls, gather["l"])
    Rl = local(rs, Rs, gather["r"])
    contract_local = math.prod(min(Ll[i], Rl[j]) for i, j in zip(lc, rc))
    contract_global = math.prod(ls[i] for i in lc)
    flops_dev = 2 * math.prod(out_local) * contract_local
    flops_glob = 2 * math.prod(osh) * contract_global
    split = {b for axes in Os for b in axes if b not in rs_axes} | set(partial)
    split = {b for b in split if self._active(b)}
    self.dots.append(Dot(flops_glob, flops_dev, ctx["mult"], source,
                         ctx["layer"], ctx["phase"], int("X" in split),
                         int("Y" in split),
                         (*osh, *(ls[i] for i in lc)), matmul_kind(ls, rs, osh),
                         (contract_local, math.prod(Rl[d] for d in rfree)),
                         _hbm_bytes(((Ll, lhs), (Rl, rhs), (out_local, out)))))
    grouped, lhs_grouped = (None, None) if self.cse else self._grouped_side(
        eqn)
    for side, var, shape, spec, d in (("l", lhs, ls, Ls, in_data[0]),
                                      ("r", rhs, rs, Rs, in_data[1])):
      cur = [list(x) for x in spec]
      for a in sorted(gather[side]):
        for x in cur:
          if a in x:
            x.remove(a)
        key, spec_now = self._key(var), tuple(map(tuple, cur))
        emit = functools.partial(self._emit, ctx, "all-gather", a, shape,
                                 spec_now, var.aval.dtype, source, d, True)
        # On a GPU a matmul's gather is shared with other matmuls' only
        # where the SPMD partitioner reshards the operand before grouping
        # the devices on the other operand (`_grouped_side`); one it makes
        # inside the group of this operand is the matmul's own, and so is
        # one where no grouping is known (an upper bound, kept for later
        # reshards). Where the grouping turns on the batch or the mesh, both
        # records are kept, each with its condition.
        if lhs_grouped is not None:
          mine = dataclasses.replace(lhs_grouped, want=side == "l")
          emit(present_if=Condition((mine,)))
          when = self._gather_once(gathered, key, a, (
              dataclasses.replace(mine, want=not mine.want),))
        elif self.cse or grouped not in (None, side):
          when = self._gather_once(gathered, key, a)
        else:
          when = None
          if grouped is None:
            gathered.add((key, a, ()))
        if when is not False:
          emit(present_if=when)
    recs = []
    unred = _unreduced(out.aval)
    for a in partial:
      if a in unred:
        continue
      kind = ("reduce-scatter" if a in rs_axes and REPLICA_AXIS not in partial
              else "all-reduce")  # `_replicas_sum_on_shard`
      spec = tuple(tuple(b for b in axes if b != a) for axes in Os)
      if kind == "reduce-scatter" and self._windowed(a, contract_global,
                                                     out.aval.dtype):
        r = self._emit(ctx, "permute", a, osh, spec, out.aval.dtype, source,
                       any(in_data), critical)
        r.bytes_per_device = round(r.bytes_per_device
                                   * windowed.sent_over_v(self.sizes[a]))
        r.windowed = True
        continue
      r = self._emit(ctx, kind, a, osh, spec, out.aval.dtype, source,
                     any(in_data), critical)
      if r is not None:
        recs.append(r)
    if recs:
      sharded = any("X" in axes for axes in Os)
      _replicas_sum_on_shard(recs, sharded, self.sizes.get("X", 1))
      self._gather_back(recs, sharded)
      pending[out] = recs

  def _gather_back(self, recs: list, sharded_over_x: bool) -> None:
    """Across TPU slices, a replicas' sum the step keeps whole over X is
    gathered back over X after the slices' sum of each device's 1/X shard:
    llama2_7b v5p-32x2 D2x8x2 zero1 (#294) runs, for each layer's MLP
    weight gradient in its backward loop, all-reduce.127-129 over X
    (bf16[5760,4096], padded, 47 MB), MegaScale ALL_REDUCE sends of the 1/8
    shard over DCN (send.31-33, 5.6 MB) and all-gather.140-142 over X back
    to bf16[5504,4096] (45 MB). Where the step keeps the sum scattered over
    X (zero3, #290) or reshards it so (`_reshard`) no gather is made, and
    inside one slice (#291) the sum is one all-reduce over D and X. Added
    to the sum's pending records, so a reassociated twin or a loop's code
    motion (`_moved_out`) carries it along."""
    if not self.dcn_replicas or sharded_over_x or not _over_replicas(recs):
      return
    for rec in [r for r in recs if r.axis == "X" and r.kind == "all-reduce"]:
      back = dataclasses.replace(rec, kind="all-gather")
      self.collectives.append(back)
      self._gathered_back[id(back)] = back
      recs.append(back)

  def _windowed(self, axis, contraction, dtype) -> bool:
    """libtpu runs this reduce-scatter over Y as its windowed einsum loop
    (simulator.tracing.windowed)."""
    return axis == "Y" and windowed.runs_windowed(
        self.windowed_einsum, self.sizes[axis], contraction,
        jax.numpy.dtype(dtype).itemsize)

  def _reduce(self, eqn, ctx, source, data, critical, pending):
    x, = eqn.invars[:1]
    out = eqn.outvars[0]
    axes = eqn.params.get("axes", ())
    if eqn.primitive.name in ("argmax", "argmin"):
      axes = eqn.params.get("axes", ())
    spec = _spec(x.aval, len(x.aval.shape))
    ospec = _spec(out.aval, len(out.aval.shape))
    recs = []
    for a in self.sizes:
      if any(a in spec[d] for d in axes):
        kind = ("reduce-scatter" if any(a in d for d in ospec)
                else "all-reduce")
        r = self._emit(ctx, kind, a, out.aval.shape, ospec, out.aval.dtype,
                       source, data, critical)
        if r is not None:
          recs.append(r)
    if recs:
      pending[out] = recs
    elif eqn.primitive.name == "reduce_sum" and x in pending:
      pending[out] = pending[x]  # a sum over dims no axis splits: linear

  def _host_copies(self, eqn, ctx) -> None:
    """The values a device_put moves between host memory and HBM."""
    from simulator.memory.xla_rules import on_host
    for x, y in zip(eqn.invars, eqn.outvars):
      if isinstance(x, jcore.Literal) or on_host(x.aval) == on_host(y.aval):
        continue
      shape = tuple(y.aval.shape)
      self.host.append(HostCopy(
          _local_bytes(shape, _spec(y.aval, len(shape)), y.aval.dtype,
                       self.sizes), ctx["mult"], ctx["layer"], ctx["phase"],
          on_host(y.aval), shape))

  def _manual(self, eqn, ctx, source, data, critical, pending):
    name = eqn.primitive.name
    if name == "dot_general":
      lhs, rhs = eqn.invars
      (lc, rc), (_, rb) = eqn.params["dimension_numbers"]
      out_shape, lhs_shape, rhs_shape = (
          mesh_class.local_shape(v.aval.shape)
          for v in (eqn.outvars[0], lhs, rhs))
      dims = (*out_shape, *(lhs_shape[i] for i in lc))
      flops = 2 * math.prod(dims)
      rfree = [d for d in range(len(rhs_shape)) if d not in (*rc, *rb)]
      self.dots.append(Dot(flops * ctx["manual_mult"], flops, ctx["mult"],
                           source, ctx["layer"], ctx["phase"], 1, 1, dims,
                           mxu_dims=(math.prod(lhs_shape[i] for i in lc),
                                     math.prod(rhs_shape[d] for d in rfree)),
                           hbm_bytes=_hbm_bytes(
                               ((lhs_shape, lhs), (rhs_shape, rhs),
                                (out_shape, eqn.outvars[0])))))
      return
    kinds = {"psum": "all-reduce", "psum_invariant": "all-reduce",
             "all_gather": "all-gather", "all_gather_invariant": "all-gather",
             "reduce_scatter": "reduce-scatter", "psum_scatter": "reduce-scatter",
             "all_to_all": "all-to-all", "ppermute": "permute"}
    if name not in kinds:
      return
    axes = eqn.params.get("axes", eqn.params.get("axis_name", ()))
    axes = (axes,) if isinstance(axes, str) else tuple(axes)
    aval = (eqn.outvars[0] if kinds[name] != "reduce-scatter"
            else eqn.invars[0]).aval
    shape = _body_shape(aval, self.sizes)
    nbytes = math.prod(shape) * jax.numpy.dtype(aval.dtype).itemsize
    recs = [self._emit(ctx, kinds[name], a, shape, ((),) * len(shape),
                       aval.dtype, source, data, critical, nbytes=nbytes)
            for a in axes]
    recs = [r for r in recs if r]
    if _over_replicas(recs):
      _replicas_sum_on_shard(recs, False, self.sizes.get("X", 1))
      self._gather_back(recs, False)
      pending[eqn.outvars[0]] = recs


def _readers(jaxpr) -> dict:
  """{var: the equations of `jaxpr` that read it; None for an output}."""
  out: dict = {}
  for e in jaxpr.eqns:
    for v in e.invars:
      if not isinstance(v, jcore.Literal):
        out.setdefault(v, []).append(e)
  for v in jaxpr.outvars:
    if not isinstance(v, jcore.Literal):
      out.setdefault(v, []).append(None)
  return out


def _over_replicas(recs) -> bool:
  """Whether pending partial sums include one over the replicas (D)."""
  return any(r.axis == REPLICA_AXIS and r.kind == "all-reduce" for r in recs)


def _replicas_sum_on_shard(recs, sharded_over_x: bool, x: int) -> None:
  """A sum over the replicas (D) and X: XLA sums over D only the 1/X shard
  of the value, around it the sum over X (an all-reduce of the whole, or
  a reduce-scatter and an all-gather: the same ring time), whether or not
  the step then keeps the value scattered over X; the sum over X stays an
  all-reduce where the step scatters it. qwen2-0.5b v5e-16x2 D2x16x1
  (#290; README, "Data-parallel replicas"): all-reduce.122 of a layer's
  gradients, 29.8 MB, over the slice's 16 devices, then MegaScale
  ALL_REDUCE sends of 544,768 bytes (an MLP weight's 1/16) over DCN;
  llama2_7b v5p-32x2 D2x8x2 zero1 (#294, gradients kept whole over X):
  0.82 GiB over D a step, the gradients' 6.40 GiB over 8. `sharded_over_x`:
  the recs' value is already the X shard."""
  if sharded_over_x or not any(r.axis == "X" for r in recs):
    return
  for rec in recs:
    if rec.axis == REPLICA_AXIS and rec.kind == "all-reduce":
      rec.bytes_per_device //= x
      rec.x_exp += 1


def _round_trip(v, axis: str, dims: set, readers: dict) -> bool:
  """Whether `v`, gathered over `axis` off `dims`, is only read by ops that
  keep those dims element for element (elementwise ops, broadcasts that add
  dims of size 1, a gather that takes `v` as its indices) into reshards
  that split the same dims over `axis` again: XLA's partitioner runs such
  a chain on each device's own part, with no all-gather. QLoRA's NF4
  lookup, `table.at[idx].get(out_sharding=...)`, gathers the int32 indices
  whole, looks them up and splits the result again: llama2_7b v5e-32 16x2
  nf4 (corpus #218) has no all-gather over Y but the activations' in its
  HLO, where the program gathers every layer's indices (48.3 GiB a step).
  On GPUs too: the tiny model's QLoRA step (d_model 512, h100:8 4x2, b8
  and b256) compiled with dumps holds no int32 all-gather, every gather
  over Y an activation's (GPU corpus #151, llama2_7b h100:2x8 8x2 QLoRA:
  +15.19% with them, +7.57% without; the reading that XLA:GPU gathered
  part of them was made while the walker merged every value's gathers)."""
  todo, seen = [v], set()
  while todo:
    u = todo.pop()
    if u in seen:
      continue
    seen.add(u)
    for e in readers.get(u, ()):
      if e is None:  # leaves the jaxpr whole
        return False
      name = e.primitive.name
      out = e.outvars[0]
      if name == "reshard":
        spec = _spec(out.aval, len(out.aval.shape))
        if not all(axis in spec[d] for d in dims if d < len(spec)):
          return False
        continue
      keeps = ((fusible(e) and len(e.outvars) == 1
                and out.aval.shape == u.aval.shape)
               or _bitcast_broadcast(e)
               or (name == "gather" and e.invars[1] is u
                   and not e.params["dimension_numbers"].offset_dims
                   and out.aval.shape == u.aval.shape[:-1]))
      if not keeps:
        return False
      todo.append(out)
  return True


def _bitcast_broadcast(eqn) -> bool:
  """A broadcast that only adds dims of size 1 (a bitcast in the HLO): a
  partial sum stays one through it (T5's relative position bias gradient,
  summed over the batch and broadcast back to its [heads, 1, q, k] carry,
  corpus #74)."""
  return (eqn.primitive.name == "broadcast_in_dim"
          and math.prod(eqn.invars[0].aval.shape)
          == math.prod(eqn.outvars[0].aval.shape))


def _hbm_bytes(operands) -> tuple[int, int]:
  """(fixed, batch-carrying) bytes of a matmul's (local shape, value)
  operands and result, by whether each value's global shape carries the
  batch."""
  out = [0, 0]
  for shape, v in operands:
    out[carries_batch(v.aval.shape)] += (
        math.prod(shape) * jax.numpy.dtype(v.aval.dtype).itemsize)
  return out[0], out[1]


# Not fusions' HBM traffic: matmuls (timed by FLOPs) and collectives.
_NO_TRAFFIC = {"dot_general", "reshard", "psum", "psum_invariant",
               "all_gather", "all_gather_invariant", "reduce_scatter",
               "psum_scatter", "all_to_all", "ppermute"}


def read_program(closed_jaxpr, data_invars: int, gpu: bool = False,
                 windowed_einsum: int = 0, dcn_replicas: bool = False
                 ) -> Program:
  """Walk `closed_jaxpr`; its last `data_invars` inputs are the batch (data);
  `gpu`: as XLA:GPU compiles it, `windowed_einsum`: the chip's windowed
  einsum contraction, `dcn_replicas`: the replicas D are TPU slices
  (`_Walker`)."""
  sizes = _mesh_sizes(closed_jaxpr)
  jaxpr = closed_jaxpr.jaxpr
  n = len(jaxpr.invars)
  flags = [i >= n - data_invars for i in range(n)]
  walker = _Walker(sizes, gpu=gpu, windowed_einsum=windowed_einsum,
                   dcn_replicas=dcn_replicas)
  ctx = dict(mult=1, layer=None, phase="optimizer", depth=0, prefix="")
  walker.walk(jaxpr, flags, ctx)
  return Program(walker.collectives, walker.dots, sizes, walker.traffic,
                 walker.host)


def read_traced(traced, gpu: bool = False) -> Program:
  """The Program of a simulator.tracing.trace.Traced step (`gpu`: as
  XLA:GPU compiles it)."""
  n_data = len(jax.tree.leaves(traced.step.batch))
  return read_program(traced.jaxpr, n_data, gpu)


def read_for_plan(traced, plan, windowed_einsum: bool = True) -> Program:
  """The Program as the compiler for `plan`'s chip runs it on `plan`
  (meshes.layout.MeshPlan): XLA:GPU's or libtpu's, and on a TPU the
  replicas' sums across slices (`_Walker`); `windowed_einsum=False`: every
  reduce-scatter a ring, libtpu's windowed einsum left out
  (simulator.tracing.windowed), as seed 004's closed forms assume."""
  chip = plan.topology.chip
  n_data = len(jax.tree.leaves(traced.step.batch))
  return read_program(
      traced.jaxpr, n_data, chip.kind == "gpu",
      chip.windowed_einsum_contraction if windowed_einsum else 0,
      dcn_replicas=(chip.kind == "tpu" and plan.D > 1
                    and plan.topology.hosts > 1))


def collectives(traced, plan=None) -> list[Collective]:
  """Every collective the traced step's shardings imply.

  The mesh sizes are read from the program itself; a `plan`
  (meshes.layout.MeshPlan) says by its chip which compiler runs it
  (XLA:GPU, or libtpu with its windowed einsum: `read_for_plan`).
  """
  if plan is None:
    return read_traced(traced).made()
  return read_for_plan(traced, plan).made()
