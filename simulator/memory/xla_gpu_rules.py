"""What XLA:GPU does differently from XLA:TPU with the traced program's
values, as named rules (simulator.memory.xla_rules holds the TPU-read ones;
these replace some of them when the target is a GPU).

Each was read off the dumps of a GPU corpus row (experiments.gpu_corpus,
compiled deviceless through the CUDA plugin; the buffers live at XLA's peak
rebuilt by simulator.xla.xla_peak: `python -m experiments.validate ...
--dump_dir=DIR`):

  no output       XLA:GPU emits a matmul as a GEMM (a Triton or cuBLAS
  fusion          custom fusion) whose result is a buffer of its own; the
                  elementwise chain that reads it is a separate loop fusion
                  with its own output buffer, where the TPU takes the chain
                  into the matmul's output fusion. In the flash backward of
                  gpt2 h100:2x8 8x2 dots (corpus #2) the two score-sized
                  matmuls' f32 results (gemm_fusion_dot.84/.85,
                  f32[24,512,1024]) are both live at XLA's peak beside the
                  bf16 p and ds made from them (loop_convert_fusion{0}/{1},
                  bf16[4,6,512,1024,1]), where the TPU's output fusions
                  make p and ds and no f32 scores buffer; the biases of
                  gpt2's projections are added by their own fusions
                  (loop_add_fusion.15 .../attn/q/add, bf16[1,4,6,64,1024])
                  after the GEMM.
  no hoisted      XLA:GPU does not take a loop's per-layer weight casts out
  weight stacks   of the loop, nor copy a stacked weight argument into
                  another layout before it: a GEMM fusion reads its operand
                  slice and converts it itself. The dumps of gpt2 a100:8
                  8x1 zero1 names:qkv,mlpwo (#11, MLP stacks
                  f32[12,768,3072] not sharded over X) hold no
                  bf16[12,768,3072] or bf16[12,3072,768] value and no
                  f32 copy of either stack; the TPU rules (hoisted casts,
                  transposed weights, copied cast weights) give both.
  gathered        what XLA:GPU does copy before a loop: a stacked weight
  stacks          argument whose per-layer slice the loop all-gathers over
  transposed      a dim that is not the slice's major-most (FSDP over the
                  d_model dim of attention's output projection
                  [heads, head_dim, d_model] and the MLP's down projection
                  [mlp, d_model]) is transposed whole, in its stored dtype,
                  so the gathered dim is major (NCCL concatenates contiguous
                  chunks): wrapped_transpose.1/.2 f32[512,32,16,128] and
                  f32[512,32,7168] of the parameters attn/o and mlp/wo,
                  live through the layers' forward and backward loops, at
                  the peak of mistral_7b h100:2x8 8x2 (#6); the same two in
                  gpt2 h100:8 8x1 (#0, f32[96,12,12,64], f32[96,12,3072])
                  and h100:2x8 4x4 (#1); the projections gathered on their
                  major dim (q, k, v, wi) are not copied.
  multi-output    two loop fusions that compute the same elementwise value
  fusions         (one the fusion rule gives no buffer) are one
                  multi-output fusion on a GPU (XLA:GPU's MultiOutputFusion
                  pass: the value is computed once), so their outputs are
                  made together, at the later one's place, and the earlier
                  one's live until then. The flash backward's
                  p = exp(s - lse) is read by its bf16 cast (for the dV
                  matmul) and by ds = p * (dp - D) (cast to bf16): XLA:GPU
                  makes both bf16 values in one fusion after both score
                  matmuls, loop_convert_fusion{0}/{1} at the peaks of #0
                  (bf16[4,12,512,1024,1] twice), #3 and mistral_7b
                  h100:2x8 8x2 (#6, loop_convert_fusion.10,
                  bf16[2,4,512,4096,4] twice), where program order frees
                  the cast p at the dV matmul before ds is made.
  deferred scale the step's own norm-scale gradient (a reduction over the
  gradients      batch, not a matmul) is deferred with the weight-gradient
                  matmuls: in mistral_7b h100:2x8 8x2 (#6) and 2x8 (#18)
                  the final norm's scale gradient (input_reduce_fusion.12)
                  runs at schedule position 630 / 650, after the layers'
                  backward loop (while.183 at 621 / 631), so the f32 input
                  gradient it reads (all-reduce-start.4, f32[8,2048,4096]
                  in #18, live 257-650) is held through the layers'
                  backward. Like the deferred weight gradients an upper
                  bound: on the 8x1 meshes (#0, #3, #11) XLA:GPU runs it
                  before the layers' backward (positions 236, 223, 282),
                  so it joins the deferred schedule only, which is
                  simulated beside the traced ones, the largest peak kept.
  late gradient  a weight gradient the step makes outside its loops (the
  collectives    output projection's, in the loss's backward) is reduced
                  over X late: XLA:GPU's scheduler issues its async
                  collective after the layers' backward, so the whole
                  f32 gradient is held until then. In llama2_7b h100:8 8x1
                  (#3) the output projection's gradient gemm_fusion_dot.91,
                  f32[32000,4096], is made at schedule position 233 (the
                  loss's backward) and live until all-reduce-start at 587,
                  after the layers' backward loop (while.168, 352) and the
                  embedding's reduce-scatter (582): 0.49 GiB at XLA's peak
                  in the layers' backward. Simulated as a third schedule
                  (liveness.simulate runs the step with weight gradients
                  deferred and in the traced order, and keeps the largest
                  peak): the traced order with each such matmul where it
                  is and what is made from it alone (its reduce-scatter,
                  the sum into the update) as late as its readers allow.
"""

from __future__ import annotations

import math

import numpy as np
from jax.extend import core as jcore

from simulator.tracing.batch_probe import carries_batch
from simulator.memory import xla_rules
from simulator.tracing.program import subjaxprs
from simulator.tracing.trace import made_by_backward, spec_of


def matmul_fusion_chain(eqns, readers, outs: set, gpu: bool) -> set:
  """The values made inside matmuls' output fusions
  (xla_rules.matmul_fusion_chain); none on a GPU (the no-output-fusion
  rule)."""
  return set() if gpu else xla_rules.matmul_fusion_chain(eqns, readers, outs)


def sunk_into_loops(eqns, readers, producer: dict, gpu: bool) -> set:
  """The loop constants sunk into their loops (xla_rules.sunk_into_loops),
  read off TPU dumps; none on a GPU, where no dump has shown it (a buffer
  kept is the safe side)."""
  return set() if gpu else xla_rules.sunk_into_loops(eqns, readers, producer)


def chain_producers(producer: dict, gpu: bool) -> dict:
  """The producers through which the into-matmuls rule (xla_rules) reads
  the elementwise chain a matmul operand is made by: none on a GPU, where a
  GEMM fusion takes no chain of elementwise producers in (the no-output-
  fusion rule's other side), so only the operand's own operands count
  (with the chain looked through, the norms' bf16 outputs fused into their
  matmuls: gpt2 h100:2x8 4x4 #1 -17.92% -> -18.96%, gpu-check #12 -5.60%
  -> -7.10% under XLA:GPU's peak)."""
  return {} if gpu else producer


def weight_stacks(jaxpr, local: bool, gpu: bool) -> tuple[dict, set]:
  """The weight stacks made outside loops, {(stack, dtype, rule): (first
  loop index, last loop index, (fixed, linear) bytes)}, and the ids of the
  casts they replace: xla_rules.hoisted_stacks on a TPU; on a GPU the
  gathered-stacks-transposed rule's copies, and no hoisted casts."""
  if not gpu:
    return xla_rules.hoisted_stacks(jaxpr, local)
  stacks: dict = {}
  arguments = set(jaxpr.invars)
  for i, eqn in enumerate(jaxpr.eqns):
    if eqn.primitive.name != "scan":
      continue
    body = next(subjaxprs(eqn))[1]
    first_xs = eqn.params["num_consts"] + eqn.params["num_carry"]
    outer = {a: b for a, b in zip(body.invars[first_xs:],
                                  eqn.invars[first_xs:])
             if isinstance(b, jcore.Var) and b in arguments}
    for stack in _gathered_off_major(body, outer):
      shape = xla_rules.shape_of(stack.aval, local)
      key = (stack, np.dtype(stack.aval.dtype), "gather")
      first = stacks.get(key, (i,))[0]
      stacks[key] = (first, i, (math.prod(shape) * key[1].itemsize, 0))
  return stacks, set()


def _gathered_off_major(body, outer: dict) -> set:
  """The stacked arguments (`outer`: a body input -> the stack it slices)
  whose slice, through views and casts, `body` or a call in it reshards
  on a dim other than the slice's first (an all-gather off its major
  dim)."""
  found: set = set()
  slices: dict = dict(outer)
  for eqn in body.eqns:
    ins = [v for v in eqn.invars if isinstance(v, jcore.Var) and v in slices]
    if not ins:
      continue
    name = eqn.primitive.name
    if xla_rules.is_view(eqn) or name == "convert_element_type":
      slices[eqn.outvars[0]] = slices[ins[0]]
    elif name == "reshard":
      before, after = spec_of(eqn.invars[0].aval), spec_of(eqn.outvars[0].aval)
      if any(a is not None and b != a for a, b in
             list(zip(before, after))[1:]):
        found.add(slices[ins[0]])
    elif name not in ("scan", "while"):  # another loop's slices are its own
      for sub in (s for _, s in subjaxprs(eqn)):
        if len(sub.invars) == len(eqn.invars):
          found |= _gathered_off_major(sub, {
              a: slices[b] for a, b in zip(sub.invars, eqn.invars)
              if isinstance(b, jcore.Var) and b in slices})
  return found


def late_gradient_collectives(jaxpr):
  """`jaxpr` in the traced order with what is made from each weight-gradient
  matmul alone moved as late as its readers allow, the matmul kept (the
  late-gradient-collectives rule)."""
  return xla_rules.defer_weight_grads(jaxpr, keep_matmuls=True)


def multi_output_fusions(eqns, size: dict, producer: dict) -> dict:
  """The multi-output-fusion rule: {buffer: the equation index it must live
  to}. Two loop fusions that compute the same fused elementwise value (one
  with no buffer: `size` (0, 0), made by an elementwise op) are one fusion
  on a GPU, so the earlier one's outputs are made with the later one's and
  live at least until it."""
  computed: dict = {}  # a fused value -> the fusions computing it

  def walk(v, i, seen) -> None:
    if not isinstance(v, jcore.Var) or v in seen or size.get(v) != (0, 0):
      return
    seen.add(v)
    eqn = producer.get(v)
    if eqn is None:
      return
    if not xla_rules.is_view(eqn) and xla_rules.elementwise(eqn):
      computed.setdefault(v, set()).add(i)
    for u in eqn.invars:
      walk(u, i, seen)

  for i, eqn in enumerate(eqns):
    if xla_rules.loop_fusible(eqn) and any(size[v] != (0, 0)
                                           for v in eqn.outvars):
      seen: set = set()
      for u in eqn.invars:
        walk(u, i, seen)
  until: dict = {}
  for fusions in computed.values():
    if len(fusions) < 2:
      continue
    later = max(fusions)
    for i in fusions - {later}:
      for v in eqns[i].outvars:
        if size[v] != (0, 0):
          until[v] = max(until.get(v, later), later)
  return until


def weight_gradient_reduction(eqn) -> bool:
  """A backward reduce_sum that sums the batch away: the weight gradient of
  a norm's scale (or a bias)."""
  return (eqn.primitive.name == "reduce_sum"
          and made_by_backward(eqn)
          and carries_batch(eqn.invars[0].aval.shape)
          and not carries_batch(eqn.outvars[0].aval.shape))


def defer_step_weight_grads(jaxpr):
  """The step's own jaxpr in the deferred order on a GPU: its weight-
  gradient matmuls and reductions, and what is made from them alone, as
  late as their readers allow (the deferred-scale-gradients rule)."""
  return xla_rules.defer_weight_grads(jaxpr, also=weight_gradient_reduction)
