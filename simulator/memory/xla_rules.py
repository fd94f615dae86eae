"""What XLA (TPU) does with the traced program's values, as named rules.

The heap simulation (simulator.memory.liveness) gives every value a buffer
from the equation that makes it to the last one that reads it. These rules
say where XLA differs from that, each with the compiled dump it was read
off (buffers live at the peak: `python -m experiments.validate ...
--dump_dir=DIR`, rebuilt by simulator.xla_peak):

  fusion          an elementwise value read only by elementwise ops, views or
                  reductions is computed inside its readers' fusion: no
                  buffer, and its operands live until those readers run (the
                  norms' f32 chains, the loss's exp feeding its row sum: at
                  no dumped peak);
  output fusion   a matmul of activations read only by elementwise ops is
                  computed inside their fusion (the flash backward's scores,
                  exp and cast make one bf16 buffer at the peak of gpt2
                  v5p-8 1x4); a weight gradient, summed over the batch, is an
                  f32 buffer of its own (f32[12565,768] at the peak of gpt2
                  v5p-8 4x4);
  views           reshapes, transposes, casts to the same dtype alias their
                  operand;
  in place        a fusion's output takes the buffer of an operand of its size
                  that dies there (d(logits) over the logits: one f32
                  logits-sized buffer at the peak of every gpt2 config);
  hoisted casts   a loop that casts each slice of a stacked weight is given the
                  whole stack cast once, outside the loop, live from the first
                  loop that reads it to the last (bf16 [32,512,11008] weight
                  stacks at the peak of llama2_7b v5p-16 8x1, also 64x4 and
                  gpt2 1x4);
  transposed      a backward loop whose matmuls read slices of a stacked
  weights         weight argument directly (no gather, no cast: parameters
                  not sharded over X, stored in the compute dtype) is given a
                  copy of the whole stack in the transposed layout (the
                  argument's layout is fixed), made before the loop
                  (bf16 [32,4096,5504] stacks in both layouts at the peak of
                  llama2_7b v5p-32 8x2 zero1 bf16), unless the argument is
                  stored transposed already (its last dim not a multiple of
                  128: no [32,4096,2752] copy in llama2_7b v5p-16 2x4 dp);
  deferred output the output projection's weight gradient is made as late as
  gradient        its readers allow on a 1-D mesh (X = 1 or Y = 1), after the
                  layers' and the embedding's backward, with the f32 logits
                  gradient live until then (live ranges of sixteen compiled
                  configs: every 1-D mesh, no 2-D one but llama3_8b 32x2;
                  why is the scheduler's, not derived here).
"""

from __future__ import annotations

import math

import numpy as np
from jax.extend import core as jcore

from meshes.layout import MeshPlan
from models import scopes
from simulator.batch_probe import carries_batch
from simulator.memory.tiling import TILE_MINOR
from simulator.program import subjaxprs
from simulator.step import device_shape
from simulator.trace import VIEW_OPS, fusible, spec_of

# Ops XLA puts in a loop fusion besides elementwise ones.
_LOOP_OPS = {"slice", "dynamic_slice", "concatenate", "pad", "split", "rev",
             "select_n", "iota"}
# Reductions take elementwise producers into their own fusion.
_REDUCE_OPS = {"reduce_sum", "reduce_max", "reduce_min", "reduce_prod",
               "argmax", "argmin", "reduce_and", "reduce_or"}


def shape_of(aval, local: bool) -> tuple[int, ...]:
  """Per-device shape (inside a shard_map body, avals already are)."""
  return tuple(aval.shape) if local else device_shape(aval)


def on_host(aval) -> bool:
  """A value in host memory (remat offload's pinned_host): no HBM."""
  space = getattr(aval, "memory_space", None)
  return space is not None and "host" in str(space).lower()


def is_view(eqn) -> bool:
  """An alias of its operand: a view op, a cast to the dtype it has, a
  reshard to the layout it has."""
  name = eqn.primitive.name
  if name in VIEW_OPS:
    return True
  if name == "convert_element_type":
    return eqn.invars[0].aval.dtype == eqn.outvars[0].aval.dtype
  return name == "reshard" and (spec_of(eqn.invars[0].aval)
                                == spec_of(eqn.outvars[0].aval))


def loop_fusible(eqn) -> bool:
  return fusible(eqn) or eqn.primitive.name in _LOOP_OPS


def absorbs(eqn) -> bool:
  """Whether a reader takes an elementwise producer into its fusion."""
  return loop_fusible(eqn) or is_view(eqn) or eqn.primitive.name in _REDUCE_OPS


def fused_away(eqn, v, readers: list, through_views: list, local: bool
               ) -> bool:
  """Whether `v`, made by `eqn`, has no buffer of its own: `readers` are the
  equations that read it, `through_views` the same seen through views."""
  if is_view(eqn):
    return True
  if eqn.primitive.name == "dot_general":  # output fusion
    if not carries_batch(shape_of(v.aval, local)):
      return False  # a weight gradient: summed over the batch in f32
    return bool(through_views) and all(loop_fusible(c) for c in through_views)
  return loop_fusible(eqn) and all(absorbs(c) for c in readers)


def _subjaxprs(eqn) -> list:
  return [jaxpr for _, jaxpr in subjaxprs(eqn)]


def calls(eqn, local: bool) -> list[tuple[object, bool, list]]:
  """The bodies an equation runs: (jaxpr, local sizes, outputs written in
  place into the caller's buffers). A scan's per-iteration outputs go into
  its stacked outputs and its carry into the loop's carry buffer; a call's
  outputs are the call's."""
  subs = _subjaxprs(eqn)
  if eqn.primitive.name == "scan":  # carries and stacked outputs in place
    body = subs[0]
    return [(body, local, body.outvars)]
  inner_local = local or eqn.primitive.name == "shard_map"
  return [(sub, inner_local, sub.outvars) for sub in subs]


def _slice_readers(body, outer: dict, found: list) -> None:
  """What reads a loop's per-iteration slices in `body` (and the calls it
  makes): ("cast", stacked operand, dtype, cast equation) for a cast of a
  slice, ("matmul", stacked operand, dtype, None) for a matmul reading a
  slice directly (through views). `outer` maps a body input to the stacked
  operand it slices."""
  views: dict = dict(outer)
  for eqn in body.eqns:
    ins = [v for v in eqn.invars if isinstance(v, jcore.Var) and v in views]
    if is_view(eqn) and ins:
      views[eqn.outvars[0]] = views[ins[0]]
    elif eqn.primitive.name == "convert_element_type" and ins:
      found.append(("cast", views[ins[0]], eqn.params["new_dtype"], eqn))
    elif eqn.primitive.name == "dot_general":
      found += [("matmul", views[v], v.aval.dtype, None) for v in ins]
    if eqn.primitive.name in ("scan", "while"):
      continue  # another loop's slices are its own
    for sub, _, _ in calls(eqn, False):
      if len(sub.invars) == len(eqn.invars):
        _slice_readers(sub, {a: views[b] for a, b in
                             zip(sub.invars, eqn.invars)
                             if isinstance(b, jcore.Var) and b in views},
                       found)


def _minor_last(shape: tuple[int, ...]) -> bool:
  """Whether a TPU argument of this shape is stored with its last dim
  minor: unless that dim would be padded to the 128-lane tile and the one
  before it would not, where the compiler stores the array transposed
  (simulator.memory.tiling picks the least padding the same way)."""
  return not (len(shape) >= 2 and shape[-1] % TILE_MINOR
              and not shape[-2] % TILE_MINOR)


def hoisted_stacks(jaxpr, local: bool) -> tuple[dict, set]:
  """The hoisted-casts and transposed-weights rules for the loops of
  `jaxpr`: {(stacked weight, dtype, rule): (first loop index, last loop
  index, (fixed, linear) bytes)}, and the ids of the cast equations inside
  the loops that the hoisted casts replace."""
  stacks: dict = {}
  hoisted: set = set()
  arguments = set(jaxpr.invars)
  for i, eqn in enumerate(jaxpr.eqns):
    if eqn.primitive.name != "scan":
      continue
    body = _subjaxprs(eqn)[0]
    first_xs = eqn.params["num_consts"] + eqn.params["num_carry"]
    outer = {a: b for a, b in zip(body.invars[first_xs:],
                                  eqn.invars[first_xs:])
             if isinstance(b, jcore.Var)}
    backward = "transpose(" in str(eqn.source_info.name_stack)
    found: list = []
    _slice_readers(body, outer, found)
    for rule, stack, dtype, cast in found:
      shape = shape_of(stack.aval, local)
      if carries_batch(shape) or (rule == "matmul" and not (
          backward and stack in arguments and _minor_last(shape))):
        continue  # activations; a forward matmul, a stack the program makes
        # (its layout is XLA's to choose), or one already stored transposed
      if cast is not None:
        hoisted.add(id(cast))
      key = (stack, np.dtype(dtype), rule)
      first = stacks.get(key, (i,))[0] if rule == "cast" else i
      stacks[key] = (first, i, (math.prod(shape) * np.dtype(dtype).itemsize,
                                0))
  return stacks, hoisted


def defers_output_grad(plan: MeshPlan) -> bool:
  """Where the deferred-output-gradient rule applies: a 1-D mesh."""
  return plan.X == 1 or plan.Y == 1


def defer_output_grad(jaxpr):
  """The step with the output projection's weight gradient (the loss's
  batch-free matmul) and what is made from it alone moved as late as their
  readers allow (the deferred-output-gradient rule)."""
  eqns = list(jaxpr.eqns)
  grads = [i for i, e in enumerate(eqns) if e.primitive.name == "dot_general"
           and scopes.LOSS in scopes.scopes_of(e.source_info.name_stack)
           and not any(carries_batch(device_shape(v.aval)) for v in e.outvars)]
  if not grads:
    return jaxpr
  start = grads[0]
  chain, made = [eqns[start]], set(eqns[start].outvars)
  reader = len(eqns)
  for i in range(start + 1, len(eqns)):
    e = eqns[i]
    reads = [v for v in e.invars if isinstance(v, jcore.Var)]
    if not any(v in made for v in reads):
      continue
    if len(e.invars) == 1 or all(v in made for v in reads):
      chain.append(e)  # a cast or reshard of the gradient alone
      made.update(e.outvars)
    else:
      reader = i  # the first that needs something else too
      break
  rest = [e for e in eqns[start + 1:reader] if e not in chain]
  return jaxpr.replace(eqns=eqns[:start] + rest + chain + eqns[reader:])
