"""The step's live set in program order: a heap simulation of the traced jaxpr.

Every value the step makes is a buffer from the equation that makes it to
the last equation that reads it; the step's arguments are live throughout
(the caller adds them). Loops and calls nest: a scan allocates its stacked
outputs whole before its first iteration, its per-iteration inputs are
slices (views) of the stacked operands, its per-iteration outputs are
written in place into the stacked buffers, its carry is one buffer (the
initial value's, when that dies at the loop), and its body's own values are
transient within one iteration; a jit, checkpoint, custom_vjp or shard_map
body's values are transient within the call. The updated params and
optimizer state (a serving step's KV cache) are written into their
donated argument buffers, unless a loop stacks them. Where XLA
holds a value differently, a rule of simulator.memory.xla_rules says so.

The transient peak is the largest live set over program points, as XLA's
heap simulator computes it over its schedule. Sizes are per device
(`sharding.shard_shape`), split into fixed and batch-linear bytes by the
probe batch (simulator.tracing.batch_probe), so the peak at any batch is the
maximum over points of fixed + linear * scale, without retracing; only the
points that can be that maximum for some batch are kept. On a GPU a matmul
XLA splits along K adds bytes that follow the split it picks for the batch's
shapes (xla_gpu_rules, split K): its points are kept and their bytes
evaluated at each batch.
"""

from __future__ import annotations

import collections
import dataclasses
import functools
import math
from typing import Iterable

import numpy as np
from jax.extend import core as jcore

from models.scopes import in_backward, scopes_of
from simulator.memory import xla_gpu_rules, xla_rules
from simulator.memory.tiling import tiled_in_order_bytes
from simulator.memory.points import (AUTOTUNED, ORDER_NOTES, ORDERS, Bytes,
                                     LiveBuffer, Points)
from simulator.tracing import loops
from simulator.tracing.batch_probe import carries_batch
from simulator.tracing.program import subjaxprs
from simulator.tracing.trace import made_by_backward

def _nbytes(aval, local: bool, in_hbm: bool = False,
            slices_minor: bool = False) -> Bytes:
  """Its HBM bytes (none in host memory; `in_hbm`: as if copied there;
  `slices_minor`: in TPU tiles with its dims in order, a gather's result,
  xla_rules.gathered_slices_minor)."""
  if xla_rules.on_host(aval) and not in_hbm:
    return (0, 0)
  shape = xla_rules.shape_of(aval, local)
  n = (tiled_in_order_bytes(shape, aval.dtype) if slices_minor
       else math.prod(shape) * np.dtype(aval.dtype).itemsize)
  return (0, n) if carries_batch(shape) else (n, 0)


def _add(a: Bytes, b: Bytes) -> Bytes:
  return a[0] + b[0], a[1] + b[1]


def _sub(a: Bytes, b: Bytes) -> Bytes:
  return a[0] - b[0], a[1] - b[1]


def _prune(points: list[tuple]) -> list[tuple]:
  """The points (fixed, linear, ...) that are the maximum of fixed + linear
  * s for some s >= 0: the upper convex hull of (linear, fixed) from the
  largest fixed onwards; a point with split-K matmuls (its fifth item), not
  affine in the batch, is always kept."""
  split = lambda p: len(p) > 4 and p[4]
  if any(map(split, points)):
    return ([p for p in points if split(p)]
            + _prune([p for p in points if not split(p)]))
  if len(points) <= 1:
    return points
  best: dict[int, tuple] = {}
  for p in points:  # per linear value, the largest fixed
    if p[1] not in best or p[0] > best[p[1]][0]:
      best[p[1]] = p
  first = max(best.values(), key=lambda p: (p[0], p[1]))
  hull: list[tuple] = []
  for p in sorted((p for p in best.values() if p[1] >= first[1]),
                  key=lambda p: p[1]):
    while len(hull) >= 2:
      (f1, l1, *_), (f2, l2, *_) = hull[-2], hull[-1]
      if (f2 - f1) * (p[1] - l1) <= (p[0] - f1) * (l2 - l1):
        hull.pop()  # on or below the segment from hull[-2] to p
      else:
        break
    hull.append(p)
  return hull


def _where(eqn) -> str:
  """'backward Decoder/layers: scan': the pass, the named scopes, the op."""
  stack = str(eqn.source_info.name_stack)
  stage = ("backward " if in_backward(stack) else
           "forward " if "jvp(" in stack else "")
  where = "/".join(scopes_of(stack))
  return f"{stage}{where}: {eqn.primitive.name}" if where else (
      f"{stage}{eqn.primitive.name}")


@dataclasses.dataclass
class _Plan:
  """One jaxpr's buffers: each value's bytes (0: no buffer of its own), the
  values freed after each equation, the values whose buffer another takes
  over (in place), and the hoisted weight casts of its loops."""

  jaxpr: object
  size: dict
  frees: dict
  reuses: dict
  stacks: dict
  reads: dict  # equation index -> the buffers its fusion reads
  dead: set  # ids of the equations the dead-code rule removes
  splits: dict  # equation index -> its xla_gpu_rules.SplitMatmul
  # accumulation loop's index -> the buffers of its initial carry
  first_micro_batch: dict = dataclasses.field(default_factory=dict)
  # ids of the calls computed inside their readers (xla_gpu_rules, inlined
  # calls): their bodies make no buffer
  inlined: set = dataclasses.field(default_factory=set)
  # equation index -> a buffer live while it runs beside its operands and
  # results: (bytes, its value's aval, what it is); the copy an all-to-all
  # stages its operand in (xla_rules, all-to-all staging), a gather's
  # tile-padded result copied into its readers' layout (xla_rules, gathered
  # slices minor)
  beside: dict = dataclasses.field(default_factory=dict)
  # the schedule it was made for (ORDERS), which the bodies it runs follow
  # (`_inner_order`): a body with nothing to defer shares the deferred plan
  order: str = "deferred"


def _plan(jaxpr, local: bool, in_place_out: Iterable, hoisted: set,
          stacks: dict, held: dict | None = None, gpu: bool = False,
          sms: xla_gpu_rules.Sms | None = None, in_loop: bool = False,
          apart: bool = False, sole_matmul_in: bool = False,
          written: frozenset = frozenset(), arguments: bool = True,
          matmul_reductions: bool = False) -> _Plan:
  # sole_matmul_in: xla_rules.fused_away's (off a GPU: XLA:GPU makes a
  # GEMM's operand in a loop fusion of its own); written: in-place outputs
  # written where they are made on a GPU too (xla_gpu_rules, the step's
  # written outputs); arguments: jaxpr's inputs are the step's arguments,
  # laid out by its caller (xla_rules, all-to-all staging);
  # matmul_reductions: xla_rules.writes_matmul_reductions
  # An output copied to host memory (--offload) is a host buffer: the
  # donated HBM buffer is not written, and what it is copied from dies there.
  in_place = {v for v in in_place_out  # a literal output has no buffer
              if isinstance(v, jcore.Var) and not xla_rules.on_host(v.aval)}
  eqns = jaxpr.eqns
  n = len(eqns)
  consumers: dict = {}
  last = {v: n for v in jaxpr.outvars if isinstance(v, jcore.Var)}
  for i, eqn in enumerate(eqns):
    for v in eqn.invars:
      if isinstance(v, jcore.Var):
        consumers.setdefault(v, []).append(eqn)
        last[v] = max(last.get(v, -1), i)
  for i, values in (held or {}).items():  # read by the fusion made there
    for v in values:
      last[v] = max(last.get(v, -1), i)
  outs = {v for v in jaxpr.outvars if isinstance(v, jcore.Var)}

  def readers(v) -> Iterable:  # through views
    for c in consumers.get(v, ()):
      if xla_rules.is_view(c):
        for w in c.outvars:
          if w in outs:
            yield c
          yield from readers(w)
      else:
        yield c

  # each value's readers for the matmul-reductions rule, None where it
  # does not apply
  reduced = consumers if matmul_reductions else None
  chained = xla_gpu_rules.matmul_fusion_chain(eqns, readers, outs, gpu,
                                              in_loop, reduced)
  accumulated = xla_rules.accumulated_stacks(eqns, readers, in_place,
                                             set(jaxpr.invars))
  dead = xla_rules.dead_equations(jaxpr)
  shared = {} if gpu else xla_rules.shared_reshards(eqns)
  no_buffer = (accumulated | {v for e in eqns if id(e) in dead
                              for v in e.outvars} | set(shared)
               | xla_gpu_rules.host_operands_in_place(eqns, readers, gpu))
  producer = {v: eqn for eqn in eqns for v in eqn.outvars}
  sunk = xla_gpu_rules.sunk_into_loops(eqns, readers, producer, gpu)
  inlined = xla_gpu_rules.inlined_calls(eqns, readers, outs, gpu)
  chain_producers = xla_gpu_rules.chain_producers(producer, gpu)
  kept_apart, gradients = (xla_gpu_rules.cublas_logits(eqns) if apart
                           else (set(), set()))
  size: dict = {}
  relaid: set = set()  # xla_gpu_rules, relaid GEMM results
  for i in range(n - 1, -1, -1):  # readers of a fused value read its inputs
    eqn = eqns[i]
    for v in eqn.outvars:
      if v in no_buffer:
        size[v] = (0, 0)
        continue
      if gpu and xla_gpu_rules.relaid_gemm_result(eqn, producer, local,
                                                  readers(v)):
        relaid.add(v)
      fused = v not in relaid and v not in gradients and (
          id(eqn) in hoisted or id(eqn) in inlined or xla_rules.is_view(eqn)
          or v in sunk or (
              v not in outs and xla_rules.fused_away(
                  eqn, v, consumers.get(v, []), list(readers(v)), local,
                  v in chained, chain_producers, sole_matmul_in, reduced)))
      if fused and gpu and xla_gpu_rules.reduced_for_matmuls(
          eqn, readers(v), producer):
        fused = False  # xla_gpu_rules, reductions before GEMMs
      # xla_rules, written outputs: on a TPU an output written into the
      # caller's buffer is made where it is; on a GPU what it reads is held
      # to the body's end, as a fused value's is to its readers', but for
      # the step's own outputs (`written`: xla_gpu_rules, written step
      # outputs).
      if fused or (v in in_place and gpu and v not in written):
        size[v] = (0, 0)
        end = i if v in written else last.get(v, i)
        for u in eqn.invars:
          if isinstance(u, jcore.Var) and last.get(u, -1) < end:
            last[u] = end
      elif v in in_place:
        size[v] = (0, 0)
      else:
        size[v] = _nbytes(v.aval, local)

  for v, made in shared.items():  # xla_rules, shared reshards
    last[made] = max(last.get(made, -1), last.get(v, -1))
  for source, (i, gathered) in (xla_gpu_rules.read_from_gathered(
      eqns, consumers) if gpu else {}).items():
    last[gathered] = max(last[gathered], last[source])
    if source not in outs:
      last[source] = i
  # value -> buffers_read(value), each found once
  through: dict = {v: (made,) for v, made in shared.items()}

  def buffers_read(v) -> tuple:
    """The buffers a fusion reads through its operand v, in the order a
    depth-first walk of the values computed inside it first meets them."""
    if not isinstance(v, jcore.Var):
      return ()
    if v not in through:
      eqn = producer.get(v)
      if eqn is None or size[v] != (0, 0) or v in in_place:
        through[v] = (v,)
      else:
        through[v] = tuple(dict.fromkeys(
            b for u in eqn.invars for b in buffers_read(u)))
    return through[v]

  reads = {i: list(dict.fromkeys(b for w in eqn.invars
                                 for b in buffers_read(w)))
           for i, eqn in enumerate(eqns)}
  if gpu:
    for v, i in xla_gpu_rules.multi_output_fusions(eqns, size,
                                                   producer).items():
      last[v] = max(last.get(v, -1), i)
  reuses: dict = {}  # the in-place rule
  taken: set = set()
  fusions_reading = collections.Counter(
      u for i, eqn in enumerate(eqns)
      if any(size[w] != (0, 0) for w in eqn.outvars) for u in reads[i])
  for i, eqn in enumerate(eqns):
    if not (xla_rules.loop_fusible(eqn) or xla_rules.updates_in_place(eqn)):
      continue
    for v in eqn.outvars:
      if size[v] == (0, 0) or v in relaid:  # a transpose reads all it writes
        continue
      for u in xla_rules.shareable(eqn, v, reads[i], chained,
                                   fusions_reading.__getitem__):
        if (u in size and u not in taken and u not in kept_apart
            and size[u] == size[v] and last.get(u) == i):
          reuses[v] = u
          taken.add(u)
          break
  for i, eqn in enumerate(eqns):  # a loop's carry: the init's buffer
    if eqn.primitive.name != "scan":
      continue
    first, carries = loops.scan_counts(eqn)
    for u, v in zip(eqn.invars[first:first + carries], eqn.outvars):
      if (isinstance(u, jcore.Var) and u in size and u not in taken
          and size[u] == size[v] != (0, 0) and last.get(u) == i):
        reuses[v] = u
        taken.add(u)
  frees: dict[int, list] = {}
  for v, i in last.items():
    if v in size and v not in taken and size[v] != (0, 0):
      frees.setdefault(i, []).append(v)
  splits: dict = {}  # the split-K rule (xla_gpu_rules)
  for i, eqn in enumerate(eqns):
    if sms is None or eqn.primitive.name != "dot_general" or id(eqn) in dead:
      continue
    dying = tuple(size[u] for u in reads[i]
                  if u in size and last.get(u) == i and u not in taken)
    split = xla_gpu_rules.split_matmul(eqn, local, producer,
                                       size[eqn.outvars[0]], dying, sms)
    if split is not None:
      splits[i] = split
  first_micro_batch = {
      i: tuple(dict.fromkeys(b for v in xla_rules.first_micro_batch(eqn)
                             for b in buffers_read(v)))
      for i, eqn in enumerate(eqns) if xla_rules.accumulation_loop(eqn)}
  inputs = set(jaxpr.invars) if arguments else set()
  beside = {i: (_nbytes(eqn.invars[0].aval, local), eqn.invars[0].aval,
                "copied into the all-to-all's layout")
            for i, eqn in enumerate(eqns) if id(eqn) not in dead
            and xla_rules.moves_between_dims(eqn)
            and isinstance(eqn.invars[0], jcore.Var)
            and eqn.invars[0] in inputs  # its layout is not the fusion's
            and size[eqn.outvars[0]] != (0, 0)}
  if not gpu:
    beside |= {i: (padded, v.aval, "as gathered, its slices minor in tiles")
               for i, eqn in enumerate(eqns) if id(eqn) not in dead
               for v in eqn.outvars if size[v] != (0, 0)
               and xla_rules.gathered_slices_minor(eqn, v)
               for padded in [_nbytes(v.aval, local, slices_minor=True)]
               if sum(padded) > sum(size[v])}
  return _Plan(jaxpr, size, frees, reuses, stacks, reads, dead, splits,
               first_micro_batch, inlined, beside=beside)


def _free_when_gathered(plan: _Plan, replaced: dict) -> None:
  """The operands only gathering matmuls read die where their gathered
  copy is made ({operand: that index}: xla_rules.gathered_operands)."""
  for values in list(plan.frees.values()):
    for v in [v for v in values if v in replaced]:
      values.remove(v)
      plan.frees.setdefault(replaced[v], []).append(v)


def _inner_order(eqn, order: str, gpu: bool) -> str:
  """The schedule of the bodies `eqn` runs: XLA inlines a call and a loop
  of one iteration, so the step's schedule runs through them (#141: both
  inlined micro-batches of an accumulation in the traced order, each
  output projection's gradient right after its logits' gradient, in the
  optimized module's ENTRY); a loop's body is scheduled on its own, as the
  deferred-weight-gradients rule reads it, on a TPU whatever the step's
  schedule (the layer-body deferral bound). On a GPU the body runs in the
  step's own: XLA:GPU's memory scheduler (DefaultMemoryScheduler) runs one
  algorithm on every computation of the module and keeps the one whose
  module heap is smallest, so a body's weight gradients are deferred in
  the deferred schedule and in the traced order otherwise (xla_gpu_rules,
  one schedule per module)."""
  if not xla_rules.runs_whole(eqn):
    return order
  return "deferred" if not gpu or order == "deferred" else "traced"


class _Simulation:
  """One walk of a jaxpr and everything it calls. A point is (fixed, linear,
  where, path, splits): path indexes the equations from the top jaxpr down,
  splits are the split-K matmuls there (`transient`)."""

  def __init__(self, gpu: bool = False,
               sms: xla_gpu_rules.Sms | None = None, one_device: bool = False,
               dequantize_early: bool = True,
               batch_scale: float | None = None,
               matmul_reductions: bool = False):
    self.gpu = gpu  # the target is a GPU: xla_gpu_rules apply
    # the batch the points are read at over the traced one, where a rule's
    # choice turns on it (xla_rules, stacks made first); None: no such rule
    self.batch_scale = batch_scale
    # the early-dequantized-state rule applies (TPU: xla_rules)
    self.dequantize_early = dequantize_early and not gpu
    # the matmul-reductions rule applies (TPU: xla_rules)
    self.matmul_reductions = matmul_reductions and not gpu
    self.sms = sms  # its SMs: the split-K rule applies (GPU only)
    self.one_device = one_device  # the mesh is one device
    self.top = None  # id of the step's own jaxpr (simulate sets it)
    self.results: tuple = ()  # its outputs other than the new state
    self.plans: dict = {}
    self.points: dict = {}
    self.hoisted: set = set()  # cast equations the hoisted-casts rule moved
    self.looped: set = set()  # ids of the jaxprs run inside a loop
    # id of a jaxpr -> its inputs that are one layer's slice of a stacked
    # step argument (GPU: xla_gpu_rules, copied weight slices)
    self.slices: dict = {}
    # ids of the jaxprs that run one micro-batch of a gradient accumulation
    # (the accumulation loop's body and the calls it makes): on a GPU the
    # early scatter fill applies there as in the step (xla_gpu_rules)
    self.micro_batch: set = set()
    self.deferred: dict = {}  # id of a body -> it with weight grads deferred
    self.one_trip: dict = {}  # id of a jaxpr -> (it, its one-trip loops inlined)
    self.same: dict = {}  # id of a body -> `_defers_nothing`

  def plan(self, jaxpr, local: bool, in_place_out,
           order: str = "deferred") -> _Plan:
    """`order` (ORDERS): "deferred", weight gradients moved late (the
    deferred-weight-gradients rule); "traced", the traced program's order;
    "late", that order with their collectives late; "cublas", the traced
    order with the logits apart from their gradient; "memory", the traced
    order with the step's loops' stacked outputs zero-filled at its start
    (xla_gpu_rules)."""
    top = id(jaxpr) == self.top  # the step's own jaxpr, in any schedule
    if (order == "traced" and not top and id(jaxpr) not in self.micro_batch
        and self._defers_nothing(jaxpr)):
      order = "deferred"  # a body with no weight gradient to defer: the same
    key = (id(jaxpr), local, tuple(map(id, in_place_out)), order)
    if key not in self.plans:
      if not self.gpu:  # xla_rules, one-trip loops (read off TPU dumps)
        jaxpr = self._inlined(jaxpr)
      if order == "deferred" and self.gpu and top:
        jaxpr = xla_gpu_rules.defer_step_weight_grads(jaxpr, self.results)
      elif order == "deferred":
        jaxpr = self._deferred(jaxpr) if not top else (
            xla_rules.defer_weight_grads(jaxpr, results=self.results))
      elif order == "late":
        jaxpr = xla_gpu_rules.late_gradient_collectives(jaxpr)
      written = frozenset()
      if top and self.gpu and self.one_device and order != "deferred":
        jaxpr = xla_gpu_rules.eager_updates(jaxpr)
      if top and self.gpu:
        jaxpr = xla_gpu_rules.leaf_by_leaf(jaxpr)
        written = frozenset(v for v in in_place_out
                            if isinstance(v, jcore.Var))
      if not self.gpu:
        jaxpr = xla_rules.reductions_where_made(jaxpr)
      if top and self.dequantize_early:
        jaxpr = xla_rules.hoist_dequantized_state(jaxpr)
      if not self.gpu:
        jaxpr = xla_rules.prefetch_host_weights(jaxpr)
      jaxpr, held = xla_rules.stream_offloaded_update(jaxpr, self.gpu)
      if top and not self.gpu and not held:
        jaxpr = xla_rules.prefetch_host_state(jaxpr)
      stacks, hoisted = xla_gpu_rules.weight_stacks(jaxpr, local, self.gpu)
      self.hoisted |= hoisted
      plan = _plan(jaxpr, local, in_place_out, self.hoisted, stacks, held,
                   self.gpu, self.sms if self.gpu else None,
                   key[0] in self.looped, order == "cublas",
                   sole_matmul_in=not self.gpu, written=written,
                   arguments=top, matmul_reductions=self.matmul_reductions)
      gathered, replaced = xla_rules.gathered_operands(plan.jaxpr.eqns,
                                                       local, plan.size)
      plan.stacks.update(gathered)
      _free_when_gathered(plan, replaced)
      if key[0] == self.top and order == "memory":
        plan.stacks.update(xla_gpu_rules.early_loop_outputs(plan.jaxpr,
                                                            plan.size))
      elif self.gpu and order == "deferred" and (
          key[0] == self.top or key[0] in self.micro_batch):
        plan.stacks.update(xla_gpu_rules.early_scatter_fills(plan.jaxpr))
      if self.gpu:
        plan.stacks.update(xla_gpu_rules.second_layouts(
            plan.jaxpr.eqns, plan.size, local))
        plan.stacks.update(xla_gpu_rules.copied_weight_slices(
            plan.jaxpr.eqns, self.slices.get(key[0], ()), local))
        if top and self.batch_scale is not None:  # a serving step
          outs = plan.jaxpr.outvars
          plan.stacks.update(xla_gpu_rules.relaid_cache_stacks(
              plan.jaxpr, outs[:len(outs) - len(self.results)], local,
              early=order == "memory"))
      elif top and self.batch_scale is not None:
        plan.stacks.update(xla_rules.stacks_made_first(
            plan.jaxpr, plan.size, plan.beside, in_place_out,
            self.batch_scale))
      plan.order = key[3]
      self.plans[key] = plan
    return self.plans[key]

  def _defers_nothing(self, jaxpr) -> bool:
    """Whether `jaxpr` is the same in the traced and the deferred schedule:
    no weight gradient of its own to defer, and on a GPU, where the bodies
    it runs follow its schedule (`_inner_order`), none in them either."""
    if id(jaxpr) not in self.same:
      self.same[id(jaxpr)] = self._deferred(jaxpr) is jaxpr and (
          not self.gpu or all(self._defers_nothing(sub) for eqn in jaxpr.eqns
                              for _, sub in subjaxprs(eqn)))
    return self.same[id(jaxpr)]

  def _inlined(self, jaxpr):
    """`jaxpr` with its one-trip loops inlined (xla_rules), made once (the
    original kept, so its id is not reused)."""
    if id(jaxpr) not in self.one_trip:
      self.one_trip[id(jaxpr)] = (
          jaxpr, xla_rules.inline_one_trip_loops(jaxpr))
    return self.one_trip[id(jaxpr)][1]

  def _deferred(self, jaxpr):
    """A body (not the step's own jaxpr) with its weight gradients deferred
    (xla_rules.defer_weight_grads), made once."""
    if id(jaxpr) not in self.deferred:
      self.deferred[id(jaxpr)] = xla_rules.defer_weight_grads(jaxpr)
    return self.deferred[id(jaxpr)]

  @staticmethod
  def _walk(plan: _Plan) -> Iterable[tuple[int, Bytes, list]]:
    """(index, live bytes before it, values live before it) per equation;
    a hoisted cast stack is live from its first loop to its last."""
    live: Bytes = (0, 0)
    values: list = []
    starts: dict = {}
    ends: dict = {}
    for key, (first, last, _) in plan.stacks.items():
      starts.setdefault(first, []).append(key)
      ends.setdefault(last, []).append(key)
    for i, eqn in enumerate(plan.jaxpr.eqns):
      for key in starts.get(i, ()):
        live = _add(live, plan.stacks[key][2])
        values.append(key)
      yield i, live, values
      for v in eqn.outvars:
        if v in plan.reuses:  # takes over a dying buffer of its size
          values[values.index(plan.reuses[v])] = v
        elif plan.size[v] != (0, 0):
          live = _add(live, plan.size[v])
          values.append(v)
      for v in plan.frees.get(i, ()):
        live = _sub(live, plan.size[v])
        values.remove(v)
      for key in ends.get(i, ()):
        live = _sub(live, plan.stacks[key][2])
        values.remove(key)

  @classmethod
  def _at_each(cls, plan: _Plan) -> Iterable[tuple[int, object, Bytes]]:
    """(index, equation, live bytes while it runs: what is live before it
    and its outputs' own buffers) per equation."""
    for i, live, _ in cls._walk(plan):
      eqn = plan.jaxpr.eqns[i]
      for v in eqn.outvars:
        if v not in plan.reuses:
          live = _add(live, plan.size[v])
      if i in plan.beside:
        live = _add(live, plan.beside[i][0])
      yield i, eqn, live

  def transient(self, jaxpr, local: bool = False, in_place_out=(),
                prune: bool = True, order: str = "deferred") -> list[tuple]:
    """Live bytes of the values `jaxpr` makes, at each of its points that
    can be its peak (every equation's, unless `prune`), not counting its
    inputs (the caller holds them) nor the outputs in `in_place_out`
    (written into the caller's buffers). A point is (fixed, linear, where,
    path, splits): `splits`, the split-K matmuls whose batch-dependent bytes
    (xla_gpu_rules.SplitMatmul.extra) add to it."""
    plan = self.plan(jaxpr, local, in_place_out, order)
    if id(plan) in self.points:
      return self.points[id(plan)]
    points = []
    ats: list = []  # each equation's live bytes while it runs, so far
    for i, eqn, at in self._at_each(plan):
      inner = []
      calls = ([] if id(eqn) in plan.dead or id(eqn) in plan.inlined
               else xla_rules.calls(eqn, local))
      if calls and (id(jaxpr) in self.looped or xla_rules.is_loop(eqn)):
        self.looped.update(id(sub) for sub, _, _ in calls)
      if calls and self.gpu:
        self.slices.update(xla_gpu_rules.slices_passed(
            eqn, [sub for sub, _, _ in calls], jaxpr.invars
            if id(jaxpr) == self.top else (),
            self.slices.get(id(jaxpr), frozenset())))
      if calls and self.gpu and (
          xla_rules.accumulation_loop(eqn) or (
              id(jaxpr) in self.micro_batch and not xla_rules.is_loop(eqn))):
        self.micro_batch.update(id(sub) for sub, _, _ in calls)
      inner_order = _inner_order(eqn, plan.order, self.gpu)
      for k, (sub, sub_local, in_place) in enumerate(calls):
        inner += [(f, l, w, (k, *path), s) for f, l, w, path, s in
                  self.transient(sub, sub_local, in_place, order=inner_order)]
      where = _where(eqn)
      other = {}  # the interleaved-micro-batches rule (xla_rules)
      if xla_rules.interleaved_micro_batches(eqn, id(jaxpr) == self.top):
        done = (0, 0) if self.gpu else functools.reduce(
            _add, (plan.size[v] for v in plan.first_micro_batch[i]), (0, 0))
        other = {edges: xla_rules.InterleavedMicroBatch(tuple(
            point for sub, sub_local, in_place in calls
            for point in self.between_loops(sub, sub_local, in_place,
                                            order, edges)), edges, done)
                 for edges in ((False, True) if self.gpu else (True,))}
      for f, l, w, path, s in _prune(inner) if inner else ():
        if other:  # the other waits at a loop's edge: on a TPU always, on
          # a GPU while this one is inside a loop (xla_rules)
          edges = not self.gpu or self._in_loop(calls[path[0]], path[1:],
                                                inner_order)
          s = (*s, other[edges])
        points.append((at[0] + f, at[1] + l, f"{where} > {w}", (i, *path),
                       s))
      if not inner:
        split = plan.splits.get(i)
        points.append((*at, where, (i,), (split,) if split else ()))
      relaid = [] if self.gpu else xla_rules.relaid_host_stacks(eqn)
      if relaid and id(eqn) not in plan.dead:  # after the loss, before the
        # loop's outputs are made
        rule = xla_rules.RelaidStack(*max(
            ((_nbytes(v.aval, local, in_hbm=True), str(v.aval.dtype))
             for v in relaid), key=lambda b: sum(b[0])))
        before = functools.reduce(_sub, (plan.size[v] for v in eqn.outvars
                                         if v not in plan.reuses), at)
        points += [(*ats[k], _where(plan.jaxpr.eqns[k]), (k,), (rule,))
                   for k in xla_rules.relay_stretch(plan.jaxpr.eqns, i)]
        points.append((*before, where, (i,), (rule,)))
      ats.append(at)
    result = _prune(points) if prune else points
    self.points[id(plan)] = result
    return result

  def _in_loop(self, call: tuple, path: tuple, order: str) -> bool:
    """Whether the point `path` of the body `call` (jaxpr, local,
    in_place_out) is inside one of its loops' bodies."""
    sub, local, in_place = call
    plan = self.plan(sub, local, in_place, order)
    eqn = plan.jaxpr.eqns[path[0]]
    if len(path) == 1:
      return False
    if xla_rules.runs_whole(eqn):
      return True
    return self._in_loop(xla_rules.calls(eqn, local)[path[1]], path[2:],
                         _inner_order(eqn, plan.order, self.gpu))

  def between_loops(self, jaxpr, local: bool = False, in_place_out=(),
                    order: str = "deferred", edges: bool = False
                    ) -> list[tuple]:
    """The live bytes of the values `jaxpr` makes at each of its points
    outside its loops' bodies (a loop's inputs and outputs counted, what
    its body makes not): what the program holds while it waits between two
    of its instructions, as a loop is one instruction XLA runs whole
    (kWhile); with `edges`, only at its loops (before, while or after one
    runs: its edges). Each point (fixed, linear, splits), as `transient`'s:
    a split-K matmul's padded operands and partials are other
    instructions' outputs (xla_gpu_rules), held while it waits; the upper
    hull over batches (`_prune`)."""
    plan = self.plan(jaxpr, local, in_place_out, order)
    points: list[tuple] = []
    for i, eqn, at in self._at_each(plan):
      loop = xla_rules.runs_whole(eqn)
      split = plan.splits.get(i)
      if loop or not edges:
        points.append((*at, "", (), (split,) if split else ()))
      if id(eqn) in plan.dead or id(eqn) in plan.inlined or loop:
        continue
      for sub, sub_local, in_place in xla_rules.calls(eqn, local):
        points += [(at[0] + f, at[1] + l, "", (), s) for f, l, s in
                   self.between_loops(sub, sub_local, in_place, order,
                                      edges)]
    return [(f, l, s) for f, l, _, _, s in _prune(points)]

  def live_at(self, jaxpr, path: tuple, local: bool = False, in_place_out=(),
              backward: bool = False, order: str = "deferred"
              ) -> list[LiveBuffer]:
    """The buffers live at the point `path`."""
    plan = self.plan(jaxpr, local, in_place_out, order)
    target, rest = path[0], path[1:]
    producer = {v: e for e in plan.jaxpr.eqns for v in e.outvars}

    def buffer(v, eqn) -> LiveBuffer:
      back = backward or made_by_backward(eqn)
      return LiveBuffer(_where(eqn), xla_rules.shape_of(v.aval, local),
                        str(v.aval.dtype), plan.size[v],
                        scopes_of(eqn.source_info.name_stack), back)

    for i, _, values in self._walk(plan):
      if i != target:
        continue
      eqn = plan.jaxpr.eqns[i]
      out = []
      for v in values:
        if v in plan.stacks:  # (stacked weight, dtype, rule)
          stack, dtype, rule = v
          what = {"cast": f"cast to {dtype}",
                  "matmul": "copied to the transposed layout",
                  "copy": "copied (its own layout)",
                  "gathered": "copied heads-major for its gathered matmuls",
                  "gather": "transposed for its all-gather",
                  "operand": "all-gathered for its matmuls",
                  "early": "zero-filled early",
                  "fill": "zero-filled early for its scatter-add",
                  "layout": "made in a second layout for its other matmul",
                  "relaid": "copied into another order for its loop",
                  "slice": "one layer's slice, copied for its matmul",
                  }[rule]
          out.append(LiveBuffer(
              f"{stack.aval.str_short()} {what}"
              + ("" if rule in ("fill", "operand", "layout", "slice")
                 else " outside its loop"),
              xla_rules.shape_of(stack.aval, local or rule == "fill"),
              str(dtype),
              plan.stacks[v][2], (), False, hoisted=True))
        else:
          out.append(buffer(v, producer[v]))
      out += [buffer(v, eqn) for v in eqn.outvars
              if v not in plan.reuses and plan.size[v] != (0, 0)]
      if target in plan.beside:  # xla_rules: all-to-all staging, ...
        nbytes, aval, what = plan.beside[target]
        out.append(LiveBuffer(
            f"{_where(eqn)}: {aval.str_short()} {what}",
            xla_rules.shape_of(aval, local), str(aval.dtype), nbytes,
            scopes_of(eqn.source_info.name_stack),
            backward or made_by_backward(eqn)))
      if rest:
        sub, sub_local, in_place = xla_rules.calls(eqn, local)[rest[0]]
        back = backward or made_by_backward(eqn)
        inner_order = _inner_order(eqn, plan.order, self.gpu)
        out += [dataclasses.replace(b, where=f"{_where(eqn)} > {b.where}")
                for b in self.live_at(sub, rest[1:], sub_local, in_place,
                                      back, inner_order)]
      return out
    raise ValueError(f"no program point {path}")


def hbm_traffic(jaxpr, local: bool = False, in_loop: bool = False
                ) -> dict[int, Bytes]:
  """Per equation of `jaxpr` that makes a buffer of its own (a fusion's
  output, by xla_rules), the HBM bytes that fusion moves: the buffers it
  writes and the buffers it reads, through the values computed inside it.
  Equations computed inside another's fusion, views and equations that make
  no buffer are left out, and so is a matmul's output fusion (its operands
  stream under its FLOPs); a call's or loop's body is its own jaxpr
  (`in_loop`: one run inside a loop, for the narrowed-weight-gradients
  rule)."""
  # Without the hoisted-casts rule here, the sole-reader part of the
  # into-matmuls rule would take every layer's bf16 weight cast into its
  # matmul, where XLA makes the cast stack once, outside the loop: each
  # cast stays a fusion of its own, as before that part was read.
  plan = _plan(jaxpr, local, (), set(), {}, in_loop=in_loop)
  producer = {v: e for e in jaxpr.eqns for v in e.outvars}

  from_matmul: dict = {}  # value -> whether it is made in a matmul's fusion

  def fuses_matmul(eqn) -> bool:
    """Whether a value computed inside eqn's fusion (no buffer of its own)
    is a matmul's output, or made from one."""
    for u in eqn.invars:
      if isinstance(u, jcore.Var) and u not in from_matmul:
        e = producer.get(u)
        from_matmul[u] = (e is not None and plan.size[u] == (0, 0) and (
            e.primitive.name == "dot_general" or fuses_matmul(e)))
      if isinstance(u, jcore.Var) and from_matmul[u]:
        return True
    return False

  out: dict[int, Bytes] = {}
  for i, eqn in enumerate(jaxpr.eqns):
    written: Bytes = (0, 0)
    for v in eqn.outvars:
      written = _add(written, plan.size.get(v, (0, 0)))
    if (written == (0, 0) or eqn.primitive.name == "dot_general"
        or fuses_matmul(eqn)):
      continue
    for u in plan.reads[i]:
      written = _add(written, plan.size.get(u) or _nbytes(u.aval, local))
    out[i] = written
  return out


def simulate(jaxpr, donated_outputs: int, gpu: bool = False,
             sms: xla_gpu_rules.Sms | None = None,
             one_device: bool = False, dequantize_early: bool = True,
             batch_scale: float | None = None,
             matmul_reductions: bool = False) -> Points:
  """The heap simulation of the whole step. The first `donated_outputs`
  outputs are written into donated argument buffers; `gpu`: compiled for a
  GPU (simulator.memory.xla_gpu_rules), `sms` its SMs (the split-K rule;
  None: not applied); `one_device`: the mesh is one device;
  `dequantize_early`: the TPU's schedules make 8-bit moments' f32 values
  first (xla_rules.dequantizes_early); `batch_scale`: the one batch the
  caller reads the points at, over the traced one, where a rule's choice
  turns on it (a serving step's: xla_rules, stacks made first); given, the
  step is a serving step (xla_gpu_rules: relaid cache stacks, the serving
  memory order); `matmul_reductions`: the TPU's matmul fusions write a
  reduction of their chain beside it (xla_rules.writes_matmul_reductions).
  The step's own
  weight gradients (the output projection's) are simulated deferred and in
  the traced order (on a GPU also with their collectives late; on one GPU
  neither deferred nor late, the updates they feed eager: xla_gpu_rules),
  and the points of each kept, so the peak is the largest of the schedules
  XLA is seen to pick (xla_rules: deferred weight gradients)."""
  jaxpr = getattr(jaxpr, "jaxpr", jaxpr)
  sim = _Simulation(gpu, sms, one_device, dequantize_early, batch_scale,
                    matmul_reductions)
  sim.top = id(jaxpr)
  sim.results = tuple(jaxpr.outvars[donated_outputs:])
  in_place = tuple(xla_rules.donated_in_place(
      jaxpr, jaxpr.outvars[:donated_outputs]))
  orders = ORDERS[:1]  # deferring moves nothing: one schedule
  if xla_rules.defer_weight_grads(jaxpr, results=sim.results) is not jaxpr:
    orders = ORDERS[:3] if gpu else ORDERS[:2]
  if gpu:
    orders = xla_gpu_rules.orders(orders, one_device, sms,
                                  serving=batch_scale is not None)
  if gpu and xla_gpu_rules.cublas_logits(jaxpr.eqns)[1]:
    orders += AUTOTUNED
  points: list = []
  order: list = []
  for o in orders:
    note = f" ({ORDER_NOTES[o]})" if o in ORDER_NOTES else ""
    more = [(f, l, f"{w}{note}", path, s) for f, l, w, path, s in
            sim.transient(jaxpr, in_place_out=in_place, prune=False, order=o)]
    points += more
    order += [o] * len(more)
  names = [_part(p[2]) for p in points]
  parts = tuple(dict.fromkeys(names))
  return Points(np.array([p[0] for p in points], dtype=np.int64),
                np.array([p[1] for p in points], dtype=np.int64),
                tuple(p[2] for p in points), tuple(p[3] for p in points),
                np.array([parts.index(n) for n in names], dtype=np.int64),
                parts, tuple(order),
                {i: p[4] for i, p in enumerate(points) if p[4]},
                sim, jaxpr, in_place)


def _part(where: str) -> str:
  """The part of the step a point is in: its top-level equation's pass and
  scope ('backward Decoder/layers'); the optimizer update has neither."""
  top = where.split(" > ")[0]
  return top.rsplit(": ", 1)[0] if ": " in top else "update"
