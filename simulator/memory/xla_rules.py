"""What XLA (TPU) does with the traced program's values, as named rules.

The heap simulation (simulator.memory.liveness) gives every value a buffer
from the equation that makes it to the last one that reads it. These rules
say where XLA differs from that, each with the compiled dump it was read
off (buffers live at the peak: `python -m experiments.validate ...
--dump_dir=DIR`, rebuilt by simulator.xla.xla_peak):

  fusion          an elementwise value read only by elementwise ops, views or
                  reductions is computed inside its readers' fusion: no
                  buffer, and its operands live until those readers run (the
                  norms' f32 chains, the loss's exp feeding its row sum: at
                  no dumped peak);
  output fusion   a matmul of activations is computed once, with the
                  elementwise chain that reads it while each value has one
                  reader: the chain's last value is the fusion's one buffer,
                  a widening cast ends the chain before it (the flash
                  backward's exp(scores - lse) is an f32 buffer read by two
                  fusions, its ds one bf16 buffer, at the peak of llama2_13b
                  v5p-32 16x1 b512: fusion.548/549; q and k stay bf16 there,
                  their f32 casts fuse into the rope); a weight gradient,
                  summed over the batch, is a buffer of its own (f32[12565,768]
                  at the peak of gpt2 v5p-8 4x4); outside a loop, a matmul
                  contracting a dim sharded over a mesh axis holds partial
                  sums, added up in f32 by a collective before anything
                  reads them, so its f32 result is a buffer and its cast
                  does not fuse: the loss's input gradient over the
                  vocabulary split over Y, f32[32,2048,4096] (.../transpose(
                  jvp(Decoder))/loss/bsd,dv->bsv/dot_general), is at the
                  peak of llama3_8b v5p-64 8x4 b256 offload:qkv,attn_out
                  (fusion.263, #122: the traced schedule -3.1% -> -0.2%);
  into matmuls    an elementwise value read by matmuls (directly or through
                  views) is computed inside each matmul's fusion when the
                  chain of elementwise ops that makes it reads nothing as
                  large as it and wider: the SwiGLU gradients d(gate) = dh *
                  silu(wi) are not buffers at that llama2_13b peak (dh, wi
                  and gate are); nor are the RMS norms' bf16 outputs, made
                  from the bf16 layer input and per-row f32 statistics: the
                  q/k/v and MLP matmuls of the recomputed layer, and their
                  weight gradients, read the saved stack's slice, the
                  statistics and the scale themselves (fusion.433/431/434,
                  fusion.437 with rsqrt_bitcast_fusion.5/.6, fusion.451 at
                  the peak of llama3_8b v5p-32 16x1 b256 s4096, #56); the
                  flash forward's output, f32 acc / l cast to bf16 and read
                  by the output projection through a reshape, is a bf16
                  buffer (broadcast_divide_fusion.2) and the f32 acc dies
                  there (while.330{3}); a value one matmul alone reads,
                  with no view between, is taken into it whatever its
                  chain reads: the flash forward's bf16 p, exp(s - m)
                  cast for p·V, is no buffer
                  at the flash-forward peaks of #121 (the f32 scores live
                  at fusion.467 and nothing of p's size) and llama2_7b
                  v5p-8 4x1 QLoRA nf4 --offload=params (#70, fusion.1387);
  batched-weight  a matmul of activations by a stack of weights batched with
  matmuls         them (the experts' egcd,edf->egcf; XLA:TPU emits it as a
                  convolution) takes no elementwise chain into its fusion:
                  the chain's values are buffers, made as outputs of the
                  fusion of the matmul that makes them. At the peak of
                  mixtral_mini v5e-16 8x2 b128 full (held-out #188,
                  fusion.696, kind=kOutput) the recomputed gate
                  convolution's fusion writes three bf16[8,16,512,1792]
                  outputs, silu(h)*g and the two SwiGLU input gradients,
                  beside h (fusion.844) and the output projection's input
                  gradient (fusion.851): five expert-hidden buffers where
                  the into-matmuls rule left three (-9.35% -> -8.50%; XLA
                  also holds two f32[16,2048,1024] norm inputs, attn_norm
                  and mlp_norm's converts of the recomputed layer, and a
                  second bf16[8,16,512,1024] dispatch, not modelled). The
                  gate's own result, computed inside that fusion, is still
                  counted: an upper bound by one such buffer;
  gathered casts  a widening cast (the norms' f32 inputs) that jax.checkpoint's
                  recompute makes of a value it all-gathers over a mesh
                  axis (the TP residual, gathered over Y for the norm), and
                  that the backward pass reads too, is a buffer held until
                  the backward's last read: XLA makes it once in a fusion of
                  its own from the all-gather's result. In llama3_8b v6e-32
                  16x2 b128 --offload=optimizer (held-out #221) the backward
                  body makes bitcast_convert_fusion.4 =
                  fusion(all-gather.120), f32[8,4096,4096], beside the MLP's
                  weight gradients and reads it at its end (fusion.470, the
                  attention norm's backward), so XLA's peak holds it and the
                  MLP norm's (convert_element_type.1341); so does #199's
                  (bitcast_convert_fusion.14). In every corpus row whose
                  XLA peak holds a recomputed norm's f32 input (23 of 230)
                  Y is more than 1. #218 -6.46% -> -3.28%, #227 -5.31% ->
                  +3.19%, #188 -8.50% -> -5.78%, #221 -10.77% -> -8.37%
                  (it also holds six prefetched optimizer moments, not
                  modelled); rows with TP whose peak is elsewhere rise by up
                  to 6 points (#54 +8.44% -> +14.30%). Off TPU dumps only:
                  it reads the source through the chain producers, which
                  the GPU rules leave empty (xla_gpu_rules.chain_producers),
                  so not on a GPU;
  gathered        a buffer two or more matmuls all-gather over one mesh
  operands        axis their shardings cannot keep (a dim the output, or
                  the other operand's use of the axis, cannot keep:
                  simulator.tracing.program.dot_sharding, the rule the
                  collectives are read by) is gathered once (XLA's CSE)
                  into a buffer of its gathered size, from when the operand
                  exists (the async all-gather starts then) to the last of
                  them; the operand dies there if only they read it. In
                  llama3_8b v6e-32 16x2 (held-out #221) the backward body
                  gathers the residual's gradient over Y at its start,
                  all-gather.126 = bf16[8,4096,4096], read by the MLP
                  output projection's input and weight gradients
                  (fusion.458, fusion.483) and live at XLA's peak between
                  them; llama2_70b v5p-128 8x8 (#120) holds all-gather.129
                  (.../blocks/add_any, bf16[24,4096,8192]) at its peak; in
                  mixtral_mini v5e-16 8x2 (#188) the experts' output
                  gradient, bf16[8,16,512,512] gathered to [8,16,512,1024]
                  (all-gather.248-252 in async collective fusions), is live
                  at XLA's peak (fusion.696). An operand computed inside
                  the matmul's fusion is not gathered itself: the final
                  norm's output, sliced back over Y, is read by #221's
                  logits fusion.294 through all-gather.27, the norm's
                  gathered input. #188 -5.78% -> -3.06%, #221 -8.37% ->
                  -7.17%; every TP row rises, by up to 5 points (#126
                  +58.80% -> +64.19%, the deferred bound; #120's traced
                  schedule -1.2% -> +2.2%), and the corpus medians by
                  about one point (GPU: #128 -8.33% -> -5.99%, #119
                  -7.09% -> -6.14%);
  narrowed weight a weight gradient whose one reader is a cast to a
  gradients       narrower dtype is made by one fusion with the cast, and
                  that fusion goes on into an add that reads the cast while
                  it has one reader, across a call's boundary: a chunked
                  loss's output-projection gradient is computed, cast to
                  bf16 and added into its loop's carry in place by one
                  kOutput fusion (fusion.706 of llava_mini v5p-8 4x1
                  loss_chunks=4: convolution.190, convert, add, writing
                  bf16[1024,32064] over the carry; no f32[32064,1024]
                  product and no second bf16 buffer); the layers' weight
                  gradients there are bf16 fusion outputs too (fusion.698,
                  fusion.696: bf16[1024,2816], bf16[2816,1024]). Outside a
                  loop, a gradient contracting a dim sharded over a mesh
                  axis holds partial sums that an all-reduce adds up from
                  the f32 product first, so the cast does not fuse
                  (fusion.313 f32[25129,768] read by all-reduce.45 at the
                  peak of gpt2 v5p-16 4x2 zero2 bf16_master, #31, before
                  the layers' backward: the tied output projection's
                  gradient, added to the embedding's after it); inside a
                  loop what is only accumulated is reduced after the loop
                  (XLA's WhileLoopAllReduceCodeMotion), as in #82;
  sunk loop       a loop's invariant operand made only by expanding ops
  constants       (iota, broadcasts) through elementwise ops and views is
                  sunk into the loop and fused into its readers there
                  (XLA's WhileLoopFusibleSinking): the chunked loss's
                  one-hot iota and zero fill, [4,192,32064] i32 and f32,
                  are not operands of its forward loop in that dump
                  (while.367 carries the chunks, the weight and the labels);
                  a call's output counts as made by its body's ops (XLA
                  inlines calls before): the flash forward's -1e30 fill, a
                  broadcast JAX's partial evaluation passes out of the
                  attention's call into its key-block loop, is at no
                  dumped peak (mistral_7b v4-64 16x2 s8192, #121: XLA's
                  peak, fusion.467 in the flash forward, holds the scores
                  f32[8,4,4,8192,512] and the stacked masks, no fill);
  views           reshapes, transposes, casts to the same dtype alias their
                  operand;
  in place        a fusion's output takes the buffer of an operand of its size
                  that dies there (d(logits) over the logits: one f32
                  logits-sized buffer at the peak of every gpt2 config);
                  a matmul's output fusion only one no other fusion reads
                  (GeGLU's gate, under gelu(gate) * up: gemma-2b v5p-8 1x4
                  prefill), or the addend of its root add: of two fusions
                  reading a value, which reads it last is the scheduler's
                  choice, and XLA holds the flash backward's f32 p, read by
                  dV's matmul and by d_scores = p * (dO·Vᵀ - delta), beside
                  d_scores (t5_large v5e-32 32x1 b1024 and v4-16 8x1 b1024,
                  #215 and #267: bitcast_multiply_fusion.4 with
                  fusion.1521{1}, and with fusion.1122{1}, `shareable`);
  one-trip loops  a scan of one iteration is its body: XLA's while-loop
                  simplifier replaces a loop of trip count 1 by its body, so
                  there is no carry buffer beside its initial value and no
                  stacked output made before the body's own result (the
                  flash loops of t5_3b v6e-16 8x2 b1024 at seq 512, one key
                  block, are not in its optimized module, which holds four
                  while loops, the encoder's and decoder's layers forward
                  and backward; #245 +33.85% -> +33.60%, t5_large v4-16
                  #267 +13.68% -> +19.18%, #135 +8.83% -> +13.87% and #215
                  +1.49% -> +5.44% with the in-place rule's p, the MLP's
                  deferred weight gradients the rest of #267's; the other
                  gpt2 and T5 rows at seq 512 by at most 1.6 points;
                  `inline_one_trip_loops`). The gradient-accumulation loop
                  keeps its own rule (interleaved micro-batches). Not on a
                  GPU, where no dump has been read for it (t5_large h200:8
                  8x1, #83, -3.79% -> -5.48% with it);
  scatter in      a scatter (and a dynamic-update-slice) writes into its
  place           first operand's buffer when that operand dies there
                  (HloDataflowAnalysis::CanShareOperandBufferWithUser): the
                  embedding gradient's zero fill and its scatter-add are one
                  bf16 [V,D] buffer, scatter_fusion beside the all-reduce's
                  psum_invariant.8, in llama3_8b v5p-32 16x1 b16 (#20,
                  schedule position 867), and gemma-2b v5p-32 16x1 (#48)
                  holds only the all-reduce's at its peak;
  written outputs a value a loop body writes into its caller's buffer (a
                  slice of a stacked output, the carry) is written by the
                  fusion that makes it, where it is made: what it reads is
                  not held to the body's end. In t5_3b v6e-16 8x2 b1024
                  s512 (#245) the flash backward's bias gradient, a stacked
                  output of its key-block loop, is written by fusion.1160
                  (schedule position 1924), and the f32 scores it is summed
                  from are dead at the dq and dk matmuls after it
                  (fusion.1163 at 1930, fusion.1161 at 1934); that key-
                  block loop has one iteration, which XLA inlines (one-
                  trip loops, below), so the bias gradient was a value of
                  the layer's body there: in the loops XLA keeps, the rule
                  has no dump of its own. Not on a
                  GPU, where no dump has shown it: there the written
                  value's operands are held to the body's end (the safe
                  side; with the rule, four GPU rows moved, by half a
                  point at most);
  multi-output    a reduction of values elementwise ops make is written by
  reductions      the fusion that makes them, as a second output, not where
                  the program reads it later: fusion.1160 of #245 writes the
                  bias gradient's per-device sum f32[16,512,512] beside ds,
                  bf16[128,16,1,512,512], so the f32 scores' gradient they
                  both read is no longer held when the dq and dk matmuls
                  run; the traced step makes that sum after them. With the
                  written-outputs rule, eleven T5 rows 0.12 to 2.65 points
                  lower (#245 +36.50% -> +33.85%, #286 +17.81% -> +16.03%),
                  no other row moved;
  matmul          on v6e a matmul's output fusion writes a reduction of its
  reductions      elementwise chain's value as one more output, the chain
                  going on to its one other reader, so that value has no
                  buffer, unless the other reader waits for the reduction
                  (a softmax's row maximum): in #245 fusion.1160 writes the
                  bias gradient's sum beside the bf16 ds from the dp
                  matmul, and the f32 ds (2 GiB) is no buffer, #245 +33.60%
                  -> +23.17%, no other row moved; on v5p and v5e the f32 ds
                  is a buffer the sum reads apart (t5_large #71, #215:
                  bitcast_multiply_fusion.4, reduce.316), so the rule is
                  v6e's alone (MATMUL_REDUCTIONS): applied on the others
                  it reads #215 +5.44% -> -3.19%;
  hoisted casts   a loop that casts each slice of a stacked weight is given the
                  whole stack cast once, outside the loop, live from the first
                  loop that reads it to the last (bf16 [32,512,11008] weight
                  stacks at the peak of llama2_7b v5p-16 8x1, also 64x4 and
                  gpt2 1x4);
  transposed      a backward loop whose matmuls read slices of a stacked
  weights         weight argument directly (no gather, no cast: stored in
                  the compute dtype) that the update reads resharded to
                  this device's slice (ZeRO-1/2, as for copied cast weights
                  below) is given a copy of the whole stack, made where the
                  argument is first read, and every loop reads the copy
                  (gemma-2b v5e-16 4x4 zero2 bf16, held-out #178: copy.575-
                  577 of param.27-29 at the head of ENTRY, read by the
                  forward loop while.318 and the backward loop while.315,
                  live at XLA's peak in the loss, fusion.313; the traced
                  schedule -15.73% -> -2.53%, the copy of the tied
                  embedding, copy.579, the rest) and held to the last
                  reader, the update (multiply_add_fusion.18 reads
                  copy.576), so with two micro-batches the second one's
                  backward reads the same copy (held-out #202, llama2_7b
                  v4-64 8x4 zero1 bf16 grad_accum=2: one set of copied
                  [32,4096,2752] stacks at XLA's peak beside both
                  micro-batches' gradient stacks; -18.57% -> +2.45%, as
                  the copy had died with the first micro-batch's backward
                  loop; the copied-cast-weights rule's copies the same,
                  #29's read by the update fusion.246) (at the peak of llama2_7b
                  v5p-32 8x2 zero1 bf16:
                  copy.518-525 of every bf16 layer stack, in its own layout,
                  in the backward loop's tuple and read by the update
                  fusion.253, beside the gradient stacks in the transposed
                  layout), also where the argument is stored transposed
                  (its last dim not a multiple of 128): in llama2_7b v5e-64
                  16x4 b32 s4096 zero2 bf16 names:qkv (held-out #196) wi
                  and wi_gate, [32,4096,2752]{1,2,0}, are copied in that
                  layout (copy.520, copy.521 of param.27, param.28) and
                  live beside the gradient stacks at the peak (-10.72%
                  -> +0.09%; an exception for them, read off no dump, had
                  left them out). A stack the update
                  writes in place is not copied: in llama2_7b v5p-16 2x4 dp
                  bf16 no parameter is copied (the [32,4096,8,128]{1,3,2,0}
                  values there are the gradient accumulators);
  copied cast     a backward loop whose matmuls read casts of slices of a
  weights         stacked weight argument (stored f32: mixed precision)
                  that the update reads resharded to this device's slice
                  (ZeRO-1/2: replicated over X, updated on a slice and
                  gathered back into its donated buffer) is given a copy of
                  the whole stack in its own dtype and layout, made before
                  the loop, beside the hoisted bf16 cast (copy.484-486
                  f32[32,4096,2752]/[32,2752,4096] and copy.479-481
                  f32[32,4096,8,128] with convert.144-146 at the peak of
                  llama2_7b v5p-32 4x4 zero2 mixed, dots, the update
                  fusion.246 reading copy.484; the stacks stored transposed
                  are copied too, in the layout they have). A stack the
                  update writes in place is not copied: gpt2 v5p-8 4x1 dp
                  (no copy of any parameter in its optimized HLO) and
                  mixtral_mini v5p-8 4x1 expert_axis=x, whose expert stacks
                  are split over X and read without a gather (param.26-28
                  read only by their hoisted converts and the update
                  fusion.379; the stacks at its backward peak are the
                  loop's f32 gradient accumulators wide.param.0{8-10});
  head-split      a loop that all-gathers each slice of a stacked weight
  gathered weights argument (FSDP) and reads it, with no cast, in a matmul
                  that keeps more than one of its dims behind the
                  contracted one (q, k, v: [d_model, heads, head_dim],
                  their outputs laid out heads-major for the attention) is
                  given the whole stack copied heads-major before the
                  first loop that gathers it, live to the last: an
                  all-gather and the dynamic slice before it keep their
                  operand's layout, so the layout the matmul wants is
                  assigned to the loop's operand, and an entry argument's
                  layout is fixed. copy.141-143 bf16[32,1024,32,128]
                  {1,3,2,0} and {3,1,2,0} of the frozen k, v, q kernels
                  (param.14/21/24), made before the forward loop while.307
                  and passed on to the backward loop while.304 (live
                  78-797), are at the peak of llama2_7b v5p-8 4x1 zero3
                  bf16 lora_rank=16 (#65: -8.6% under XLA's peak without
                  the rule); the same three (copy.163-165, live 88-731)
                  in that step trained in full (#90); held out, compiled
                  after the rule was written, llama3_8b v5p-16 4x2 zero3
                  bf16 (#91: heads over Y, grouped kv heads) holds
                  copy.159-161 of k, v, q, bf16[32,1024,4,128] and
                  [32,1024,16,128], live 80-812 to the backward loop
                  while.312 (-0.6% without the rule, +1.1% with it).
                  All three recompute the layer in the backward (full
                  remat); where a later loop gathers the stack only for
                  its transposed matmul (dx) the copy is kept to it, an
                  upper bound. Not copied there: o and the MLP's stacks
                  (heads major, or one output dim), the LoRA adapters (not
                  gathered). Stored f32 (mixed) the hoisted cast is made
                  in that layout; dequantized per layer (nf4, int8: #66,
                  #67) there is no stack to copy; not gathered (dp:
                  llama2_7b v5p-16 2x4 bf16) XLA copies each layer's slice
                  in the loop (copy.245, one layer);
  accumulated     a loop's stacked output read only by an add into a caller's
  loop outputs    buffer of its shape, the sum written back in place (the
                  gradient accumulation g_acc + g), is added into that buffer
                  slice by slice: no stack of its own (one set of f32 MLP
                  gradient stacks, not two, at the peak of llama2_7b v5p-8
                  4x1 b32 in 4 micro-batches);
  streamed        with gradients fetched from host memory (--offload=params)
  offloaded       the update runs leaf by leaf, one fusion per leaf, the
  update          next leaf's state fetched before it and the previous
                  leaf's results copied back after it (the peak of
                  llama2_7b v5p-16 4x2 --offload=optimizer,params is one MLP
                  leaf's inputs and outputs and the next leaf's fetches);
                  a value copied to host memory is made whole first (a DMA
                  reads a buffer) and its donated HBM buffer is not written;
  prefetched host with the optimizer's state alone in host memory
  state           (--offload=optimizer; the gradients made on the device, so
                  the update is not streamed), XLA's latency-hiding
                  scheduler issues the fetches of that state (copy-starts
                  from memory space S(5)) ahead of their update, some
                  before the backward loop and some after it, and each
                  fetched value stays in HBM to its update. In llama3_8b
                  v6e-32 16x2 b128 s4096 (held-out #221, dumped again in
                  session 34) all 24 start at live-range positions 88-562,
                  before the backward loop's body, and are live at XLA's
                  peak inside it (position 825: 1.87 GiB, every moment of
                  the device); five small ones (two k/v moments, 16 MiB
                  each, and norm scales) start before the forward loop's
                  body (88-219), the rest after it; in mistral_7b v5e-32
                  16x2 b32 (#172, dumped the same day) only the MLP down
                  projection's two (copy-start.15/16, f32[32,7168,256]),
                  one of the vocabulary table's and the norm scales' start
                  before it (461-568), the rest after it (1390-1668), and
                  its peak (1004) holds two. Which ones cross the loop is
                  the scheduler's cost model, not derived, so the bound is
                  taken: every fetch of a step argument from host memory
                  moves to just before the last loop ahead of it: a bound
                  from there to the update, not before it (#221's five
                  early fetches, 32 MiB, are live in its forward pass,
                  where its peak is not). Program order fetches them after
                  the backward: #221 -7.17% -> +1.82%; #172 -0.8% ->
                  +32.85%, #186 -3.3% -> +18.27%;
  early           what the optimizer's update computes from the step's
  dequantized     arguments alone and that is larger than what it reads (8-bit
  state           AdamW's moments: int8 codes and block scales turned into f32
                  values, gather_fusion over the dynamic map) is made before
                  the forward pass on v5e: in llama3_8b v5e-32 16x2 b32
                  adamw_8bit (#110) the four MLP moments' gather_fusion.11-
                  .14, f32[58720256] (224 MiB each), run at schedule
                  positions 140-188, before the forward loop while.315 at
                  398, and are live at XLA's peak in the loss with the f32
                  logits (-26.01% without the rule, +0.18% with it). The
                  memory scheduler does not put them there: in the module
                  it wrote (the pass dump after hlo-memory-scheduler-with-
                  brkga-fallback) the same gathers are at 139-188, after
                  the backward loop while.312 at 115, the forward loop at
                  54; a later pass of libtpu's final scheduler, its
                  latency-hiding scheduler on v5e, runs the loops after
                  them. On v5p and v6e the gathers stay after the backward:
                  gpt2 v5p-8 4x1 (#81: gather_fusion.32 at 310, while.331
                  at 277; its peak, fusion.289, holds no f32 moment) and
                  llama2_7b v5p-8 2x2 (#80), and the held-out v5p and v6e
                  rows come within 1.9% in the traced order without the
                  rule (#143 +1.87%, #193 +0.41%, #217 +1.54%, #244
                  +0.60%; with it +8.9% to +13.0%). So it applies on v5e,
                  and as a bound on chips no dump has shown (v4, TPU7x;
                  DEQUANTIZED_LATE lists those it does not). Held out after
                  (#298-300): llama3_8b v5p-16 -0.94%, gemma-2b v6e-8
                  +8.90% (its traced schedule), qwen2-0.5b v5e-8 +1.28%
                  (-5.63% with the rule off);
  deferred weight a weight-gradient matmul is made as late as its readers
  gradients       allow: in a layer's backward after the attention backward
                  (the MLP's and attention's weight-gradient fusions come
                  after the flash backward loop in the schedule of llama2_13b
                  v5p-32 16x1 b512, positions 654-662 after while.331 at 580),
                  and in the step itself the output projection's after the
                  layers' and the embedding's backward, with the f32 logits
                  gradient live until then. Both are upper bounds. Inside a
                  layer XLA defers some weight gradients and not others
                  (llama3_8b v5p-32 16x1 b256 s4096: wo's and attention o's
                  after the flash backward loop, wi's and wi_gate's before
                  it), and in the mixtral_mini schedules none (v5p-8 4x1 b32
                  loss_chunks=4 and 2x2 dots: the experts' weight-gradient
                  fusions, fusion.730-733 and 679-684, right after their
                  backward, before the flash backward loop; that 4x1 row is
                  +7.1% over XLA's peak with the deferral, +0.6% without,
                  before the into-matmuls rule; +5.1% with it). A layer
                  body simulated in the traced order wherever the step's
                  schedule is (one schedule per module, as on a GPU)
                  reads under XLA: re-checked on the corpus (session 48,
                  liveness's `_inner_order` following the step's schedule
                  on a TPU too and `_defers_nothing` reading a body's
                  calls; not kept), the check part's median falls from 6.67% to 4.74% but
                  20 of its 233 rows read more than 5% under, down to
                  -12.34% (mixtral_mini v5e-16 8x2 b384, #246), and
                  llama2_70b v5p-256 32x4 b1024 s4096 (#54) holds the MLP's
                  norm, up-projections and down-projection gradient
                  through the flash backward loop at +8.6% but drops them
                  at -2.7%: XLA's DFS body defers some (#56), so on a TPU
                  the body stays deferred, an upper bound.
                  For the output projection: of fifteen dumped schedules XLA
                  holds the logits gradient through the layers' backward in
                  four (llama3_8b 32x2, llama2_7b v5e 16x2, mistral 16x2,
                  llama2_13b 16x1 b512) and makes that gradient first in
                  eleven (gpt2 4x1 dp, llama2_7b 2x4 dp, 4x4 zero2, 32x1 at
                  seq 2048 and 4096 with either attention, llama3_8b 16x1
                  b256 s4096, mistral 16x1 s4096, mixtral_mini v5p-8 4x1,
                  4x1 expert_axis=x and 2x2: fusion.366, 373, 383 before the
                  layers' backward). A chunked loss makes the output
                  projection's gradient inside its backward loop, so what
                  reads it there (its cast to f32, its reduction over X)
                  is what is deferred: the bf16 gradient, while.369{1} of
                  llama3_8b v5p-32 16x1 b16 loss_chunks=4 (#37), is live
                  from that loop (schedule position 343) through the
                  layers' backward to its all-reduce at 918; and what only
                  the loss value needs runs last (the sunk-loss rule: that
                  loss's forward loop, while.368, at 915, after the layers'
                  backward loop while.366 at 777, holding the gathered
                  bf16 output weight all-gather.20 from 288 to 915; in
                  llava_mini v5p-8 4x1 loss_chunks=4 XLA ran it first,
                  before the loss's backward loop). Seventeen gpt2 v5p-8
                  schedules (mixed, flash) show the choice turns on the
                  plan as a whole, not on one setting: with no batch split
                  (1x4, dp or zero3) it is deferred; on 4x1 it comes first
                  under dp (b8 s512, b16 s512, b16 s1024, full remat, adamw)
                  and under zero3 from 4096 tokens a device (b16 s1024 full
                  or dots, b32 s512 full), and is deferred under zero3 up to
                  2048 tokens whatever the remat (full, dots) and optimizer
                  (adamw, adafactor); the llama rows follow no token count
                  (16x1 zero3 full at 65536 tokens a device: deferred in
                  llama2_13b b512 s2048, first in llama3_8b b256 s4096).
                  Where the optimizer's update runs is a choice of the same
                  kind, so the program's order (the update last) is kept:
                  in t5_3b v5p-32 8x2 (#73) the decoder's updates run right
                  after its backward loop (while.873 at 979, its gradient
                  stacks dead by 1072, before the encoder's backward loop
                  while.872 at 1431; the symbolic peak, holding them there,
                  is +28% over XLA's temporaries), in t5_large v5p-8 4x1
                  (#71) after the encoder's backward (while.873{14} live
                  807-1300, through the body of while.872, 863-1084, and
                  XLA's peak at 967 in it), with the output projection's
                  gradient deferred too (convolution_bitcast_fusion.11 at
                  1133).
                  Which order XLA runs is the choice of its memory scheduler
                  (--xla_memory_scheduler=default in the dumped flagfile;
                  OpenXLA's DefaultMemoryScheduler), which makes a list, a
                  DFS and a post-order schedule and keeps the one its own
                  heap simulation finds smallest (OpenXLA's
                  HeapSimulator::MinimumMemoryForModule, fragmentation not
                  counted), on the fused program: of #2's 251 pass dumps
                  (compiled.compile_report(..., dump_passes='.*')) the first
                  scheduled module is the one after
                  hlo-memory-scheduler-with-brkga-fallback (libtpu's
                  final_scheduler pipeline, dump 0201, its BRKGA fallback
                  off in the flagfile), after Main_fusion and the
                  multi-output fusions, before the latency-hiding scheduler
                  (0205-0206) and the final rematerialization (0208); on v5p
                  and v6e the latency-hiding scheduler keeps the order
                  (eight rows, README), on v5e not always (#246: it moves
                  the output projection's weight-gradient fusion after the
                  layers' backward loop, 7.33 GiB with it off, 12.70 on,
                  XLA's own estimate for the DFS schedule it chose 7.33,
                  logged by --vmodule=hlo_memory_scheduler=2): gpt2 v5p-8
                  1x4 b8 dots adafactor (#2) and mixtral_mini v5p-8 4x1 b16
                  (#75) compile to the same peak with
                  --xla_tpu_enable_latency_hiding_scheduler=false, and #2 to
                  the same with its memory limit at 1% or with
                  memory-pressure tracking off. Forced by
                  LIBTPU_INIT_ARGS=--xla_memory_scheduler=..., #75's default
                  peak is the DFS schedule's (2845435584 bytes, the output
                  projection's gradient first; the traced order's simulation
                  +0.56%) and its post-order schedule holds the logits
                  gradient through the layers' backward (3716463296 bytes;
                  the deferred order's simulation +1.07%); #2's default is
                  the post-order schedule (713492320, deferred; DFS
                  713502048), though the list schedule's compiled peak is
                  smaller (707332960): the choice is made on the scheduler's
                  own figure, before the passes after it and without
                  fragmentation, not on the final peak, so the smaller
                  simulated order is not always XLA's. Replayed on the
                  module dumped before the scheduler's pass
                  (simulator.xla.memory_scheduler: the DFS scheduler's
                  operand order, transitive fan-out, then transitive tiled
                  bytes, both capped, then instruction names), the DFS and
                  post-order schedules are XLA's instruction for
                  instruction (#25 and #56 DFS, 290 and 234 entry
                  instructions; #2 and #55 post order, 653 and 212; #138
                  DFS, 423 of 433, ten small additions of its two
                  micro-batches' results apart). In #55 the DFS schedule
                  makes the output projection's gradient before the layers'
                  backward loop too (position 68 against the loop's 125),
                  yet libtpu's estimate of it, 68.51 GiB, is over the post
                  order's 68.10, so XLA keeps the deferred order; the
                  traced order's simulation reads 60.18. What orders the
                  DFS schedule is the fused module's post order, tiled
                  sizes and names, which the traced program does not have,
                  so the simulation runs the step both ways
                  (liveness.simulate: deferred, and in the traced order)
                  and keeps the larger peak (the T5 step
                  t5-v1_1-small v5p-16 8x1, whose traced order holds more:
                  -6.6% with the deferred order alone, -1.5% with both);
                  near that limit see rematerialized logits;
  rematerialized  where the deferred order's peak (arguments included, no
  logits          planning overhead) would be over XLA's rematerialization
                  limit, 95% of the chip's HBM (95 GiB on v5p, the
                  user-allocatable figure: 90.25 GiB;
                  --xla_jf_rematerialization_percent_shared_memory_limit=95
                  in the dumped flagfile; the scheduler's
                  --xla_tpu_scheduler_percent_shared_memory_limit is 95
                  too), XLA's rematerialization recomputes the logits after
                  the layers' backward instead of holding them through it:
                  the order stays (the output projection's weight-gradient
                  fusion after the backward loop) but what it holds is the
                  traced order's. llama2_13b v5p-32 16x1 (#55's step, full
                  remat, zero3, one loss chunk) at b704 and b720 holds the
                  f32 logits gradient through the loop (86.75 and 88.41
                  GiB, no .remat instruction, the deferred order's
                  simulation +1.8% over both); at b736 and b768 the
                  weight-gradient fusion.280 reads fusion.343.remat /
                  fusion.344.remat, f32[46|48,2048,32000], the logits
                  recomputed from the final hidden state and the gathered
                  output weight after the loop, and XLA's peak is 79.14
                  and 81.97 GiB where the deferred order would hold about
                  90.1 and 93.7 (the traced order's simulation: +0.6%);
                  with the limit lifted
                  (--xla_jf_rematerialization_percent_shared_memory_limit=
                  10000) the b736 compile holds the deferred order, 90.07
                  GiB (96707626656 bytes; the deferred simulation +1.85%).
                  So the deferred order is dropped where its peak is over
                  the limit and the traced order's is not (both over: the
                  larger is kept, see b896 below). Only for a loss made by
                  one matmul over the whole batch (the one kind compiled
                  here; a chunked loss's deferred part is a loop's carried
                  gradient, not one matmul to recompute, and keeps the
                  larger order), not on GPUs (other flags), not under the
                  1F1B rule, not where a layer loop's residuals go to host
                  memory (remat offload: #287, llama3_8b v6e-8 8x1 b24
                  s8192 offload:decoder_layer_input,qkv,out_proj, held the
                  f32 logits to its peak, 38.13 GiB at copy.819 in the
                  dump libtpu writes as it refuses the plan, 25% over the
                  limit, and recomputed none; the deferred order's
                  simulation -9.9%, the relaid copies below not modelled).
                  Held out (compiled after the rule was written):
                  llama2_7b v5e-32 16x2 (#45's step; 16 GiB chips) at b256,
                  under the limit, the deferred order kept (-0.85%, #96);
                  at b288, over it, XLA 13.25 GiB where the deferred order
                  would hold 15.5 (the traced order's simulation -1.84%,
                  #97); at b320, the deferred order over the HBM itself,
                  13.20 (+6.52%, #98); llama2_13b b832, the traced order
                  just under the limit (+0.68%, #99); mistral_7b v5p-64
                  16x2 b704 s4096 names:qkv (#52's step), no logits at
                  XLA's peak of 82.49 GiB where the deferred order would
                  hold 93.6 (+4.07%, #101). With both orders
                  over the limit XLA rematerializes more, to just under it
                  (b896: 90.20 GiB against the limit's 90.25, #100), which
                  is not modelled: the larger order is kept (+20.51%).
                  Where XLA's own deferred peak is just under the limit
                  and the simulation's just over it, this would
                  under-estimate: in these compiles the switch fell
                  between the same batches both ways (b720 kept, b736
                  dropped);
  prefetched host with the parameters in host memory (--offload=params), a
  weights         layer's weights are fetched, gathered and dequantized at
                  the start of its loop body, and the output projection's
                  weight at the step's start: XLA issues the host copies
                  first. At #70's peak, in the forward attention
                  (fusion.1387), the current layer's dequantized MLP and
                  output weights (.../blocks/mlp/wi/mul bf16[4096,172,64],
                  .../mlp/wo/mul, .../attn/o/mul) are live, and so is the
                  output projection's f32[1024,32000]: -4.53% -> +2.37%
                  with the fill and p rules above, which had held their
                  place (without this rule those two take #70 to -11.1%);
  relaid stacks   the host stacks a backward loop reads into its attention's
                  loops (remat offload's q, k, v) are relaid out on a TPU
                  before it runs: XLA copies each to HBM, copies it into the
                  layout the backward reads and back to host memory, one at a
                  time, before the loop's gradient stacks are made. In
                  llama2_13b v5p-128 16x4 offload:qkv (#35): copy-start.2,
                  copy.760 (bf16[40,2,2048,10,128] {2,4,3,1,0} to
                  {4,2,3,1,0}), copy-start.3, then the same for a second
                  stack, before broadcast.143-147 and the backward loop
                  while.257; in #168 (16x2 b128 grad_accum=2) XLA's peak,
                  copy.1140, is one of these, beside both residual stacks
                  and both micro-batches' logits. Where between the loss
                  and the loop is the scheduler's choice (#35: after the
                  output projection's gradient; held-out #205, llama2_7b
                  v5p-64 8x4 offload:qkv,mlp_hidden grad_accum=2: copy.1297
                  while the final norm's f32 gradient is live), so two HBM
                  copies of the largest are held at each point after the
                  loss's last equation up to the loop: #168 -9.22% ->
                  +2.99% (it was +1.00% while the interleaved rule counted
                  the other micro-batch twice), #205 -5.72% (held at the
                  loop alone) -> -4.09%, #179 -2.47% -> +1.18%, #34, #35
                  unmoved (their peaks are in the backward loop), and the
                  deferred bound of #122 +24.21% -> +46.79%, #137 +20.66%
                  -> +32.02% and #198 (llama3_8b 16x4, whose dump shows no
                  relayout) +45.40% (their traced schedules -0.17%, -0.89%,
                  +1.72%); which stacks XLA relays (#35: two of q, k, v;
                  #198: none) is not derived: the largest is held. Only
                  where q, k and v are stacks of one shape (MHA): the GQA
                  dumps show no relayout (#198 llama3_8b, #199 and #208
                  mistral_7b: the forward loop writes q, k and v in the
                  layouts the backward reads), the MHA ones do (#35, #168,
                  #179, #205). With the gathered-casts rule: #208 +34.70%
                  -> +7.29%, #199 +5.54% -> -4.16%, #228 +35.23% ->
                  +15.14%, and the deferred bounds of #122 +46.79% ->
                  +30.07%, #137 +32.02% -> +23.08%, #198 +45.40% ->
                  +28.89% (their traced schedules within 1.8%). Stacks
                  of the residual stream's shape are sometimes relaid too,
                  not modelled: #287 (llama3_8b v6e-8 8x1 s8192
                  offload:decoder_layer_input,qkv,out_proj) copies its
                  layer inputs' and out_proj's bf16[32,B,8192,4096] stacks
                  from {2,3,1,0} to {3,2,1,0} (copy.817, copy.820 at b16,
                  XLA's peak 29.94 GiB at copy.820, the simulation -5.5%;
                  copy.816, copy.819 at b24), while #288 (llama2_7b
                  v5p-32 8x2, the layer inputs alone offloaded) relays
                  none, and MaxText's llama3.1-70b recipe on v6e-256
                  (offload:decoder_layer_input,qkv, 50 GiB stacks a device
                  on 32 GiB chips) none: two HBM copies of the largest
                  were 100 GiB there;
  dead code       an equation no live value reads (and with no effects) is
                  removed, as jit's dead-code pass removes it: no buffer and
                  no transient work. Flax's lifted layer scan leaves one
                  behind when serving: a custom_vjp_call with no operands
                  whose outputs, the flash kernel's causal masks and -1e30
                  fills of every key block (bool[2,4,32,1,1024,512],
                  f32[4,32,1,1024,512] in the llama2_7b prefill, v5p-8 4x1,
                  batch 16, prompt 1024), nothing reads; none of them is at
                  XLA's peak of that prefill or of the batch-32, prompt-2048
                  one (its buffers at the peak: weights, the cache, one
                  f32[8,32,1,2048,512] score block);
  stacked outputs a loop's stacked output that the step returns into a
  not donated     donated argument's buffer is still a stack of its own:
                  XLA's while loop writes its slices into a fresh buffer and
                  copies it into the aliased output after the loop (the KV
                  cache scanned over layers, each layer's slice in and out:
                  bf16[32,4,1280,32,128] k and v stacks
                  copy_dynamic-update-slice_fusion.4 and wide.param.0{3}
                  beside the donated cache arguments c.k, c.v at the peak of
                  the llama2_7b decode step, v5p-8 4x1, batch 16, 1024 + 256
                  positions; temp 2.74 GB, 2.68 GB of it those stacks);
                  but a stack whose slices the body overwrites whole, over
                  a donated argument nothing else reads, is written into
                  the argument's buffer (`overwritten_argument`: T5's
                  prefill's cross-attention cache, while.81{4} in the
                  allocation of param.14, t5_3b v5p-8 2x2 batch 32);
  stacks made     a loop's stacked output the step returns with a buffer
  first           of its own (a KV cache stack) is made before what the
                  step makes for another operand of the loop, and live
                  while that is made, where it is the larger: libtpu's DFS
                  memory scheduler visits a loop's operands largest first
                  (`stacks_made_first`, TPU, a serving step's, at its
                  batch; the llava_mini v5p-8 2x2 batch 32 decode: two
                  72 MiB cache stacks, AllocateBuffer, before the
                  embedding lookup's 31 MiB table copy and all-to-all; the
                  gemma-2b 1x4 decode: its 250 MiB copy and all-to-all
                  first, its 180 MiB stacks after);
  shared reshards two reshards of one value into one layout in one
                  computation are one collective (XLA's CSE), its result
                  live to the last reader of either (`shared_reshards`,
                  TPU; the shared embedding table's all-to-all for the
                  encoder's and the decoder's lookups, bf16[16064,2,256],
                  one `all-to-all` in the t5-v1_1-small prefill, v5p-8 2x2
                  batch 64, live at XLA's peak in the encoder between the
                  two lookups);
  updated slices  a loop body's update of part of a slice of a stacked
                  operand (a KV cache layer written at one position) is a
                  buffer of its own: XLA reads the slice out of the stack,
                  updates it and writes it into the output stack
                  (`sliced_updates`; the llava_mini v5p-8 2x2 batch 32
                  decode: one layer's k and v, bf16[16,1152,4,128], 18 MiB
                  each, live in the layer loop's body);
  gathered slices a gather's result (through the calls that return it: a
  minor           lookup's shard_map) keeps its gathered slices' dims
                  minor, in TPU tiles: a slice narrower than 128 lanes is
                  padded to them, live beside the dense copy its readers
                  take while that is made; a gather of single elements
                  (8-bit AdamW's code lookup) has no slice dims and is not
                  read so (`gathered_slices_minor`, TPU; T5's
                  relative position bias, each position pair's row of 8
                  heads: f32[4194304,8]{1,0:T(8,128)}, 2.00 GiB for
                  128 MiB of values, the largest buffer at XLA's peak of the
                  t5_3b prefill, v5p-8 1x4 batch 16, 2048 + 256 positions);
  axes of one     a dim sharded over mesh axes of size 1 only is whole on
  device          every device, so a reshard that changes only such axes
                  is the same buffer (a view: simulator.tracing.trace's
                  layout_of), not a gathered copy: at mesh 1x1 no FSDP
                  gather of the traced step is a buffer of XLA's (GPU
                  corpus #21-#30, h100:1; in llama2_7b b4 full bf16, #26,
                  no bf16[4096,32,128] gathered q, k, v weights and no
                  transposed weight stacks at the peak, loop_convert_fusion:
                  +17.97% -> +5.27%); on meshes with an axis of size 1
                  the reshards over it alone move 13 TPU rows by at most
                  1.2 points
                  (#94 llama2_13b v5p-32 16x1 b736 +0.60% -> +1.74%, #82
                  llava_mini 4x1 +22.61% -> +21.77%) and five GPU rows by
                  at most 0.4;
  all-to-all      a reshard that moves a mesh axis from one dim to another
  staging         (an all-to-all) copies its operand into the collective's
                  layout first, so at the all-to-all the operand, that copy
                  and the result are all live: in gemma-2b's decode
                  step (v5p-8 1x4 b16, 1024 + 256 positions; kept in
                  experiments/data/inference_compiled.jsonl) the embedding
                  table's reshard from vocab-split to width-split for its
                  lookup is copy.25 (bf16[8000,4,8,512], 250 MiB) then
                  all-to-all (bf16[64000,4,512], 250 MiB) beside the table
                  argument,
                  XLA's peak there (`moves_between_dims`; liveness's
                  `_Plan.beside`). Only an operand the program is given
                  (an argument, laid out by the caller) is copied so: one a
                  fusion makes is made in the collective's layout, as the
                  experts' combine over X, [e@X, g, c, d] to [e, g@X, c, d],
                  is (staged too, #280 mixtral_8x7b v5p-64 8x4
                  `--expert_axis=x` reads traced +7.31% -> +9.65%, #250
                  qwen1.5-moe-4l deferred +36.30% -> +40.88%); nor one
                  split on its major dim, whose chunks are contiguous. On a
                  GPU the same (XLA:GPU's layout assignment puts an
                  all-to-all's split dim most major): the table's
                  loop_transpose_fusion (bf16[4,8000,1024]) and all-to-all.2
                  (bf16[8000,4,1024]) at the peak of llama2_7b h100:8 2x4's
                  decode, 250 MiB each in llama3_8b h100:8 2x4's (-3.5% ->
                  -0.0%; experiments/data/inference_compiled_gpu.jsonl);
  interleaved     the step runs the first micro-batch of a gradient
  micro-batches   accumulation on its own and the others in a loop
                  (simulator.step, scope models.scopes.ACCUMULATION); with
                  two micro-batches that loop has one iteration, XLA
                  inlines it, and its scheduler interleaves the two
                  independent micro-batches' work. On a GPU: in gpt2
                  h100:8 8x1 b32 grad_accum=2 (GPU corpus #70) both
                  micro-batches' f32 logits gradients (f32[2,1024,50257]
                  .../loss/add_any, twice, and their padded
                  f32[2048,50272] copies) are live at XLA's peak
                  (loop_pad_fusion.1); in llama2_13b h100:4x8 16x2 b32
                  grad_accum=2 (#63) both residual stacks (bf16[40,1,4096,
                  2560] from jvp(Decoder)/layers/while and from
                  while/body/closed_call/jvp(Decoder)/layers/while), the
                  optimized module's ENTRY holding both forward loops
                  (while.500, while.498) before both backward ones. On a
                  TPU the same (found by held-out #129, llama3_8b v5p-64
                  16x2 b256 s4096 dots grad_accum=2, out of HBM at 107.00G
                  of temporaries where the simulation held 58.4 GiB in
                  all): gpt2 v5p-8 4x1 b32 s1024 dots grad_accum=2 holds
                  both micro-batches' f32[4,1024,50257] logits (.../loss/
                  bsd,dv->bsv/dot_general, from jit(step)/jvp(Decoder) and
                  from grad_accumulation/while/body/closed_call) and both
                  residual stacks bf16[12,4,1024,3072] at its peak
                  (fusion.942; -36.70% without the rule); #129's step at
                  half its batch (b128, #145, which fits) both residual
                  stacks bf16[32,4,4096,7168] and both f32[4,4096,64128]
                  logits at fusion.813. How the two line up is not
                  derived; two things bound it. XLA cannot run two loops
                  at once (a while loop is one instruction, kWhile, its
                  body run whole), so while one micro-batch runs, the
                  other waits between two of its own instructions,
                  outside its loops' bodies (`InterleavedMicroBatch`,
                  liveness's `between_loops`). And on a TPU it waits at an
                  edge of one of its loops (before, while or after one
                  runs), never inside its loss: #141's ENTRY runs both
                  forward loops (while.955, while.957), then each
                  micro-batch's loss whole, its logits, logits gradient
                  and output projection gradient (fusion.810, .729, then
                  .809, .728), then both backward loops (while.952,
                  .949); #160 gpt2 v6e-8 8x1 b64 names grad_accum=2 holds
                  at its peak (fusion.559) one micro-batch's loss, its
                  f32[4,1024,50257] logits beside its f32[50257,768]
                  output projection gradient, and both residual stacks,
                  the other waiting after its forward loop; #138's and
                  #145's peaks, inside a backward loop (a flash attention
                  block's f32 scores live), hold the other's residual
                  stack and logits, as it waits before its backward loop
                  in the deferred schedule. On a GPU two losses run at
                  once (#70's peak, loop_pad_fusion.1, holds both
                  micro-batches' padded logits gradients), so there the
                  other waits at a loop's edge only while this one is
                  inside a loop, and anywhere outside its loops
                  otherwise; split-K padded operands and partials count
                  as what it holds. The step's schedule of the weight
                  gradients runs through both micro-batches (liveness
                  `_inner_order`: #141's ENTRY runs both in the traced
                  order, each output projection's gradient right after
                  its logits gradient). TPU: #129 -0.8% of the bytes XLA
                  needed, says does not fit; #138 gpt2 +3.82%, #145
                  +1.75%; #160 +6.80% in the traced schedule, the one its
                  ENTRY runs, +39.16% kept (the deferred schedule's
                  bound, both logits gradients held). Loose where the
                  other micro-batch's edge holds more than XLA's peak
                  does: #141 mixtral_mini full +78.29%, #140 llama2_13b
                  16x4 +28.42%. Before the loop's edges were read, with
                  the other anywhere outside its loops: #138 +9.60%,
                  #145 +5.66%, #146 +29.28% (both losses at once) -> now
                  +9.12%; counting its same point: #140 +47.13%, #141
                  +102.65%; counting only what its forward leaves for its
                  backward, the values forward equations make that
                  backward ones read, is under XLA: #138 -19.10%, #145
                  -5.39%, #129 -8.35% of the bytes it needed. GPU: #70
                  -45.18% -> +8.49%, #63 -12.56% -> +3.68% with the
                  micro-batch scatter fill (xla_gpu_rules), #76
                  qwen2-0.5b +16.03% (both losses at once), held out
                  #85-#88 (their dumps not read) +8.38%, +4.26%, +4.68%,
                  -0.85%. Held out on TPUs: compiled with the other
                  anywhere outside its loops, #158, #159, #161-#163
                  +33.12%, +18.06%, +5.38%, +29.76%, +23.80%; after the
                  edges were read, #164-#169 +6.07%, +19.11%, +11.96%,
                  +36.54%, +1.00%, +1.99%. The other is waiting or done,
                  never both: on a TPU its gradients, the accumulation's
                  initial carry, are made only as it finishes, so what it
                  holds waiting counts beyond them (held-out #159, llama2_7b
                  v5e-16 8x2 b32 grad_accum=2: ENTRY runs both forward loops
                  while.904 and .902, both losses, then one backward loop,
                  while.899, its f32 gradient carries broadcast.420-424
                  .clone made just before it, then the other's, while.896,
                  where XLA's peak, fusion.839, holds the first's finished
                  gradient stacks beside the second's carries; +18.06% ->
                  +2.25%, #140 +28.42% -> +19.31%, #162 +29.76% -> +14.72%,
                  #163 +23.80% -> +11.15%). On a GPU the loops' gradient
                  outputs are zero-filled at the step's start, so waiting it
                  holds them too (#63's peak, loop_convert_fusion.18: both
                  residual stacks and two sets of f32[40,320,6912] gradient
                  stacks, broadcast.154; -9.26% if counted once). With
                  three or more micro-batches the
                  loop stays a loop and runs after the first (GPU #56 and
                  TPU #64, grad_accum=4: -0.50%, +1.13%).
"""

from __future__ import annotations

import dataclasses
import functools
import math

import jax
import numpy as np
from jax.extend import core as jcore

from models import scopes
from simulator.tracing import loops, mesh_class
from simulator.tracing.batch_probe import (bytes_at, carries_batch,
                                            matmul_kind)
from simulator.tracing.program import dot_sharding, subjaxprs
from simulator.step import device_shape
from simulator.tracing.trace import (VIEW_OPS, fusible, layout_of,
                                     made_by_backward, spec_of)

# Ops XLA puts in a loop fusion besides elementwise ones.
_LOOP_OPS = {"slice", "dynamic_slice", "concatenate", "pad", "split", "rev",
             "select_n", "iota"}
# Reductions take elementwise producers into their own fusion.
_REDUCE_OPS = {"reduce_sum", "reduce_max", "reduce_min", "reduce_prod",
               "argmax", "argmin", "reduce_and", "reduce_or"}


def shape_of(aval, local: bool) -> tuple[int, ...]:
  """Per-device shape (inside a shard_map body, avals already are)."""
  return mesh_class.local_shape(aval.shape) if local else device_shape(aval)


_NAME_COLUMNS = 18  # a rule's name in the docstring: its first columns


def rules() -> list[tuple[str, str]]:
  """(name, what XLA does and where it was seen) for each rule above, read
  off this module's docstring (the one place they are written), for the
  validation table's rule list."""
  out: list[tuple[str, str]] = []
  for line in __doc__.splitlines():
    if not line.startswith("  ") or len(line) <= _NAME_COLUMNS:
      continue
    name, text = line[2:_NAME_COLUMNS].strip(), line[_NAME_COLUMNS:].strip()
    if name and (not out or out[-1][1].endswith((";", "."))):
      out.append((name, text))
    elif out:
      prev_name, prev_text = out[-1]
      out[-1] = (f"{prev_name} {name}".strip(), f"{prev_text} {text}".strip())
  return out


@dataclasses.dataclass(frozen=True)
class InterleavedMicroBatch:
  """The interleaved-micro-batches rule at one point of the accumulation
  loop's micro-batch: the other micro-batch's largest live set while it
  waits between two of its instructions (`between`: each candidate's fixed
  and linear bytes at the traced batch and its split-K matmuls, as
  simulator.memory.liveness gives them; the largest at the batch), at an
  edge of one of its loops (`edges`) or anywhere outside them."""

  between: tuple[tuple[int, int, tuple], ...]
  edges: bool
  done: tuple[int, int] = (0, 0)  # its bytes when it has run whole
  dtype = "mixed"  # whatever the other micro-batch holds

  @property
  def label(self) -> str:
    where = "at a loop's edge" if self.edges else "outside its loops"
    return f"the other micro-batch, waiting {where} (interleaved)"

  def extra(self, num: int, den: int) -> int:
    """What it holds waiting beyond what it holds done (its gradients, the
    loop's initial carry, which the step's live set already counts: the
    first micro-batch is either done or waiting, never both)."""
    waiting = max((bytes_at(f, l, num, den)
                   + sum(s.extra(num, den) for s in splits)
                   for f, l, splits in self.between), default=0)
    return max(0, waiting - bytes_at(*self.done, num, den))


def accumulation_loop(eqn) -> bool:
  """Whether `eqn` is the step's gradient-accumulation loop (the scan over
  the micro-batches after the first, scope models.scopes.ACCUMULATION)."""
  return (eqn.primitive.name == "scan" and scopes.ACCUMULATION
          in scopes.scopes_of(eqn.source_info.name_stack))


def first_micro_batch(eqn) -> list:
  """The accumulation loop's initial carry: what the first micro-batch
  leaves it (its loss and gradients), made before the loop."""
  start = eqn.params["num_consts"]
  return eqn.invars[start:start + eqn.params["num_carry"]]


@dataclasses.dataclass(frozen=True)
class RelaidStack:
  """The relaid-stacks rule at a backward loop: two HBM copies of
  the largest host stack it reads that XLA relays out first (`bytes`:
  fixed, linear at the traced batch)."""

  bytes: tuple[int, int]
  dtype: str = "bfloat16"  # the stack's
  label = "an offloaded stack copied to HBM and relaid out (relaid stacks)"

  def extra(self, num: int, den: int) -> int:
    return 2 * bytes_at(*self.bytes, num, den)


def relaid_host_stacks(eqn) -> list:
  """The relaid-stacks rule: the host-memory stacks a backward
  loop reads into its attention's loops (remat offload's q, k, v), when
  they are all of one shape (MHA); q wider than k and v (GQA): none."""
  if not (runs_whole(eqn) and made_by_backward(eqn)):
    return []
  body = _subjaxprs(eqn)[0]
  stacks = [v for v, b in zip(eqn.invars, body.invars)
            if isinstance(v, jcore.Var) and on_host(v.aval)
            and _read_by_loop(body, b)]
  return stacks if len({v.aval.shape for v in stacks}) == 1 else []


def relay_stretch(eqns, loop: int) -> range:
  """The equations before the backward loop at `loop` during which the
  relaid-stacks rule's copies can be made: after the last equation of the
  loss (XLA schedules them there: #35 after the output projection's
  gradient, #205 while the final norm's gradient is live)."""
  loss = [k for k in range(loop) if scopes.LOSS in scopes.scopes_of(
      eqns[k].source_info.name_stack)]
  return range(loss[-1] + 1 if loss else loop, loop)


def _read_by_loop(jaxpr, v) -> bool:
  """Whether `v` reaches a loop of `jaxpr` (or of what it calls) through
  moves alone: views, transfers, reshapes and transposes."""
  for e in jaxpr.eqns:
    if not any(u is v for u in e.invars):
      continue
    if is_loop(e):
      return True
    if e.primitive.name in ("device_put", "transpose", "reshape") or is_view(e):
      if any(_read_by_loop(jaxpr, w) for w in e.outvars):
        return True
    for sub in _subjaxprs(e):
      if any(_read_by_loop(sub, s) for u, s in zip(e.invars, sub.invars)
             if u is v):
        return True
  return False


def interleaved_micro_batches(eqn, top: bool) -> bool:
  """Whether the top-level `eqn` is an accumulation loop of one iteration,
  which XLA inlines beside the first micro-batch (the interleaved-
  micro-batches rule)."""
  return top and accumulation_loop(eqn) and not runs_whole(eqn)


def on_host(aval) -> bool:
  """A value in host memory (remat offload's pinned_host, an offloaded
  argument): no HBM. An aval says so by its memory space, an argument's
  ShapeDtypeStruct by its sharding's memory kind."""
  space = getattr(aval, "memory_space", None) or getattr(
      getattr(aval, "sharding", None), "memory_kind", None)
  return space is not None and "host" in str(space).lower()


def is_view(eqn) -> bool:
  """An alias of its operand: a view op, a cast to the dtype it has, a
  reshard to the layout it has."""
  name = eqn.primitive.name
  if name in VIEW_OPS:
    return True
  if name == "convert_element_type":
    return eqn.invars[0].aval.dtype == eqn.outvars[0].aval.dtype
  return name == "reshard" and (layout_of(eqn.invars[0].aval)
                                == layout_of(eqn.outvars[0].aval))


def elementwise(eqn) -> bool:
  """One output, element for element from its operands."""
  return fusible(eqn) and len(eqn.outvars) == 1


# Ops whose output XLA writes into their first operand's buffer when that
# operand dies there (the scatter-in-place rule).
_UPDATE_OPS = {"scatter-add", "scatter_add", "scatter", "scatter-mul",
               "dynamic_update_slice"}


def updates_in_place(eqn) -> bool:
  return eqn.primitive.name in _UPDATE_OPS


def loop_fusible(eqn) -> bool:
  return fusible(eqn) or eqn.primitive.name in _LOOP_OPS


def absorbs(eqn) -> bool:
  """Whether a reader takes an elementwise producer into its fusion."""
  return loop_fusible(eqn) or is_view(eqn) or eqn.primitive.name in _REDUCE_OPS


def matmul_kind_of(eqn) -> str | None:
  """simulator.tracing.batch_probe.matmul_kind of a dot_general (None otherwise)."""
  if eqn.primitive.name != "dot_general":
    return None
  return matmul_kind(*(v.aval.shape for v in (*eqn.invars, eqn.outvars[0])))


# XLA's rematerialization limit in percent of the chip's HBM: the
# rematerialized-logits rule (--xla_jf_rematerialization_percent_shared_
# memory_limit=95 in the flagfile of every dumped TPU compile).
REMAT_PERCENT = 95


def logits_recomputable(jaxpr) -> bool:
  """Whether the step's own jaxpr makes the output projection's weight
  gradient by one matmul (an unchunked loss): what its deferred order holds
  is then the logits' gradient, which XLA recomputes near its limit (the
  rematerialized-logits rule). Not where the step offloads residuals to
  host memory (remat offload): llama3_8b v6e-8 8x1 b24 s8192
  offload:decoder_layer_input,qkv,out_proj (corpus #287) keeps the f32
  logits live to its peak, 38.13 GiB at copy.819 (the deferred order, 25%
  over the limit; libtpu refuses the plan for HBM), and recomputes none."""
  jaxpr = getattr(jaxpr, "jaxpr", jaxpr)
  if any(on_host(v.aval) for e in jaxpr.eqns if is_loop(e)
         for v in e.outvars):  # a layer loop's residual stacks in host memory
    return False
  return any(matmul_kind_of(e) == "weight_grad"
             and scopes.LOSS in scopes.scopes_of(e.source_info.name_stack)
             for e in jaxpr.eqns)


def activation_matmul(eqn) -> bool:
  """A matmul whose result carries the batch (not a weight gradient)."""
  return matmul_kind_of(eqn) in ("weight", "activation")


def fused_away(eqn, v, readers: list, through_views: list, local: bool,
               in_matmul_fusion: bool = False, producer: dict | None = None,
               sole_matmul_in: bool = False,
               consumers: dict | None = None) -> bool:
  """Whether `v`, made by `eqn`, has no buffer of its own: `readers` are the
  equations that read it, `through_views` the same seen through views;
  `in_matmul_fusion`: `v` is an activation matmul's result or made from one
  by the elementwise chain its output fusion takes in; `producer`: the
  equation that makes each value of the jaxpr (the into-matmuls rule reads
  the chain that makes `v` through it); `sole_matmul_in`: a value one
  matmul alone reads, with no view between, is taken into it whatever it
  reads (the into-matmuls rule's sole-reader part); `consumers`: each
  value's readers, where the matmul-reductions rule applies (None: it does
  not; `chain_readers`)."""
  if is_view(eqn):
    return True
  if eqn.primitive.name == "dot_general" and not in_matmul_fusion:
    return False  # a weight gradient: summed over the batch in f32
  if in_matmul_fusion:  # the matmul is not recomputed: one reader goes on
    rest = (through_views if consumers is None
            else chain_readers(eqn, through_views, consumers))
    return (len({id(c) for c in rest}) == 1 and elementwise(rest[0])
            and not widening(rest[0]))
  if any(c.primitive.name == "device_put" for c in through_views):
    return False  # a copy to another memory (a DMA) reads a whole buffer
  if gathered_cast(eqn, producer or {}, through_views):
    return False  # the gathered-casts rule
  matmul = lambda c: c.primitive.name == "dot_general"
  if any(map(_batched_weight_matmul, through_views)):
    return False  # the batched-weight-matmuls rule
  return (loop_fusible(eqn) and all(absorbs(c) or matmul(c) for c in readers)
          and (not any(map(matmul, through_views))
               or _chain_no_wider(eqn, producer or {})
               or (sole_matmul_in and len(readers) == 1
                   and matmul(readers[0]))))


def chain_readers(eqn, readers: list, consumers: dict) -> list:
  """`readers` of what elementwise `eqn` makes in a matmul's output fusion,
  less the reductions of that value alone that nothing else among them
  waits for (through elementwise ops and views, by `consumers`: each
  value's readers): the multi-output-reductions rule moves each beside
  `eqn`, and the fusion writes it as one more output (the
  matmul-reductions rule). t5_3b v6e-16 8x2 b1024 (corpus #245):
  `fusion.1160`, the encoder attention backward's dp matmul, writes the
  bf16 ds the dq and dk matmuls read and the f32 sum over the batch of the
  relative-position bias gradient; the f32 ds both read has no buffer. A
  softmax's scores, which the exponent reads after their row maximum, stay
  a buffer: llama2_7b v5p-8 4x1 QLoRA (#70), `fusion.1387{1}`, the f32
  scores beside the maximum the same fusion writes."""
  if not loop_fusible(eqn):
    return readers
  alone = lambda c: (c.primitive.name in _REDUCE_OPS and [
      u for u in c.invars if isinstance(u, jcore.Var)] == eqn.outvars)
  rest = [c for c in readers if not alone(c)]
  others = {id(c) for c in rest}
  return rest + [c for c in readers if alone(c)
                 and others & _reached(c.outvars, consumers)]


def _reached(values, consumers: dict) -> set:
  """The ids of the equations that read `values`, and of those that read
  what they make, through elementwise ops and views."""
  seen: set = set()
  todo = list(values)
  while todo:
    for c in consumers.get(todo.pop(), ()):
      if id(c) not in seen:
        seen.add(id(c))
        if loop_fusible(c) or is_view(c):
          todo.extend(c.outvars)
  return seen


def gathered_cast(eqn, producer: dict, readers: list) -> bool:
  """The gathered-casts rule: `eqn` widens, in the recompute, a value made
  by a reshard that gathers over a mesh axis of more than one device, and
  a reader outside the recompute (the backward pass) reads it."""
  if not (widening(eqn) and scopes.in_recompute(eqn.source_info.name_stack)):
    return False
  source = eqn.invars[0]
  made = producer.get(source) if isinstance(source, jcore.Var) else None
  return (made is not None and made.primitive.name == "reshard"
          and _gathers(made)
          and any(not scopes.in_recompute(c.source_info.name_stack)
                  for c in readers))


def moves_between_dims(eqn) -> bool:
  """A reshard that moves a mesh axis (of more than one device) from one
  dim to another, an all-to-all, splitting a dim that is not its operand's
  major one: its chunks are not contiguous, so an operand in a layout of
  its own is copied into the collective's first (the all-to-all-staging
  rule). Split on the major dim, each chunk is one already."""
  if eqn.primitive.name != "reshard":
    return False
  shape = eqn.invars[0].aval.shape
  before, after = (layout_of(v.aval) for v in (eqn.invars[0], eqn.outvars[0]))
  for axis in {a for dim in before for a in dim}:
    src = {i for i, dim in enumerate(before) if axis in dim}
    dst = {i for i, dim in enumerate(after) if axis in dim}
    if dst and src != dst and any(shape[i] > 1 for i in range(min(dst))):
      return True
  return False


def _gathers(eqn) -> bool:
  """A reshard whose result is sharded over fewer axes of more than one
  device than its operand (an all-gather)."""
  before, after = (layout_of(v.aval) for v in (eqn.invars[0], eqn.outvars[0]))
  return sum(map(len, after)) < sum(map(len, before))


def _batched_weight_matmul(eqn) -> bool:
  """A matmul of activations by a stack of weights batched with them (the
  experts' `egcd,edf->egcf`, a pipeline's stages'): batch dims, one
  operand that carries the batch and one that does not (the
  batched-weight-matmuls rule)."""
  if eqn.primitive.name != "dot_general" or not eqn.params[
      "dimension_numbers"][1][0]:
    return False
  carry = [carries_batch(u.aval.shape) for u in eqn.invars]
  return any(carry) and not all(carry)


def _itemsize(v) -> int:
  return np.dtype(v.aval.dtype).itemsize


def _chain_no_wider(eqn, producer: dict) -> bool:
  """The into-matmuls rule: an elementwise op whose chain of elementwise
  producers (through views, by `producer`) reads, from outside the chain,
  nothing as large as its result and wider (a matmul takes the chain into
  its fusion: no more bytes read than the result's; smaller operands, a
  norm's per-row statistics and scale, are broadcast inside it)."""
  if not elementwise(eqn):
    return False
  out = eqn.outvars[0]
  size, width = math.prod(out.aval.shape), _itemsize(out)
  seen: set = set()
  chain = [eqn]
  while chain:
    for u in chain.pop().invars:
      if not isinstance(u, jcore.Var) or u in seen:
        continue
      seen.add(u)
      made_by = producer.get(u)
      if made_by is not None and (loop_fusible(made_by) or is_view(made_by)):
        chain.append(made_by)
      elif math.prod(u.aval.shape) >= size and _itemsize(u) > width:
        return False
  return True


def widening(eqn) -> bool:
  """A cast to a wider dtype: it ends a matmul's output fusion (the
  narrower matmul result is the buffer; the cast fuses into its readers)."""
  return (eqn.primitive.name == "convert_element_type"
          and _itemsize(eqn.outvars[0]) > _itemsize(eqn.invars[0]))


def matmul_fusion_chain(eqns, readers, outs: set, in_loop: bool = False,
                        narrowed_only: bool = False,
                        consumers: dict | None = None) -> set:
  """The values made inside matmuls' output fusions: each activation
  matmul's result, a weight gradient's whose one reader is a narrowing cast
  (the narrowed-weight-gradients rule), either, outside a loop (`in_loop`),
  only with no partial sums to reduce across devices; a call's output made
  inside such a fusion in its body, and what the elementwise ops reading
  them make while each value has one reader (`readers(v)`: v's readers
  through views) and is not one of the jaxpr's outputs `outs`; the chain's
  last value is the fusion's output. `narrowed_only`: the narrowed weight
  gradients alone (a GPU's GEMM epilogue: xla_gpu_rules). `consumers`:
  each value's readers, where the matmul-reductions rule applies (None: it
  does not; `chain_readers`)."""
  chained: set = set()
  made_by = {} if consumers is None else {
      v: e for e in eqns for v in e.outvars}
  for eqn in eqns:
    one = lambda u: len({id(c) for c in (
        chain_readers(made_by[u], list(readers(u)), consumers)
        if u in made_by else readers(u))}) == 1
    if (activation_matmul(eqn) and not narrowed_only
        and (in_loop or not partial_sums(eqn))) or (
        matmul_kind_of(eqn) == "weight_grad" and one(eqn.outvars[0])
        and (in_loop or not partial_sums(eqn))
        and _narrowed(next(iter(readers(eqn.outvars[0]))), readers)) or (
        (elementwise(eqn) and not widening(eqn) or is_view(eqn))
        and any(isinstance(u, jcore.Var) and u in chained and u not in outs
                and one(u) for u in eqn.invars)):
      chained.update(eqn.outvars)
    elif eqn.primitive.name not in ("scan", "while", "cond"):
      for body in _subjaxprs(eqn):
        if len(body.outvars) == len(eqn.outvars):
          ends = _chain_ends(body, in_loop)
          chained.update(v for v, w in zip(eqn.outvars, body.outvars)
                         if isinstance(w, jcore.Var) and w in ends
                         and one(v))
  return chained


def partial_sums(eqn) -> bool:
  """A matmul contracting a dim both operands shard over one mesh axis of
  more than one device: each device holds a partial sum, which a collective
  (all-reduce or reduce-scatter) must add up before anything else reads it."""
  (lc, rc), _ = eqn.params["dimension_numbers"]
  lhs, rhs = eqn.invars
  sizes = dict(mesh_class.axis_sizes(
      getattr(getattr(lhs.aval, "sharding", None), "mesh", None)))
  ls, rs = spec_of(lhs.aval), spec_of(rhs.aval)
  for a, b in zip(lc, rc):
    axes = (set(mesh_class.entry_axes(ls[a]))
            & set(mesh_class.entry_axes(rs[b])))
    if any(sizes.get(x, 1) > 1 for x in axes):
      return True
  return False


@dataclasses.dataclass(frozen=True)
class GatheredOperand:
  """A value some matmul all-gathers (the gathered-operands rule): the
  gathered copy's aval, its sharding without the gathered axes."""

  value: object  # the jaxpr value gathered
  aval: object = dataclasses.field(compare=False)


def gathered_operands(eqns, local: bool, size: dict) -> tuple[dict, dict]:
  """The gathered-operands rule's buffers, kept as weight stacks are
  ({(GatheredOperand, dtype, "operand"): (first index, last, bytes)}), and
  {operand: the index it dies at} for the operands only those matmuls
  read (nothing reads them once their gathered copy is made). Each buffer
  (`size`: the plan's, through views) that two or more matmuls of `eqns`
  all-gather over a mesh axis their shardings cannot keep
  (simulator.tracing.program.dot_sharding) is gathered once for them
  (XLA's CSE), from when it is made (the gather starts as soon as its
  operand exists) to the last of them. One matmul's gather is not held: no
  dump read shows one, and holding it moved no corpus row. An operand
  computed inside the matmul's fusion is not gathered itself: XLA gathers
  what the fusion reads (the final norm's output, sliced back over Y after
  its input's gather, is read by the logits fusion.294 of #221 through
  all-gather.27, the gathered input, and no second gather)."""
  if local:  # a shard_map body: its collectives are written out
    return {}, {}
  made = {v: i for i, e in enumerate(eqns) for v in e.outvars}

  def is_buffer(v) -> bool:
    while v in made and is_view(eqns[made[v]]):
      v = eqns[made[v]].invars[0]
    return v not in made or size.get(v, (0, 0)) != (0, 0)

  gathering: dict = {}  # operand -> (its gathered aval, the matmuls)
  for i, eqn in enumerate(eqns):
    if eqn.primitive.name != "dot_general":
      continue
    sharding = getattr(eqn.invars[0].aval, "sharding", None)
    sizes = dict(mesh_class.axis_sizes(getattr(sharding, "mesh", None)))
    gather, _ = dot_sharding(eqn, [a for a, n in sizes.items() if n > 1])
    for var, axes in zip(eqn.invars, (gather["l"], gather["r"])):
      if not axes or not isinstance(var, jcore.Var) or not is_buffer(var):
        continue
      spec = [tuple(a for a in mesh_class.entry_axes(e) if a not in axes)
              or None for e in spec_of(var.aval)]
      aval = var.aval.update(sharding=var.aval.sharding.update(
          spec=type(var.aval.sharding.spec)(*spec)))
      gathering.setdefault(var, (aval, []))[1].append(i)
  out: dict = {}
  replaced: dict = {}
  for var, (aval, dots) in gathering.items():
    if len(dots) < 2:
      continue
    shape = shape_of(aval, local)
    key = (GatheredOperand(var, aval), np.dtype(aval.dtype), "operand")
    nbytes = math.prod(shape) * key[1].itemsize
    first = made.get(var, -1) + 1
    out[key] = (first, dots[-1], (0, nbytes) if carries_batch(shape)
                else (nbytes, 0))
    if var in made and all(var not in e.invars for k, e in enumerate(eqns)
                           if k not in dots):
      replaced[var] = first
  return out, replaced


def _narrowed(eqn, readers) -> bool:
  """A cast to a narrower dtype that a matmul's output fusion takes in:
  one whose value goes on into elementwise ops or out of the jaxpr (into a
  loop's carry or stacked output). Read by a collective instead, the cast
  is a fusion of its own and the matmul's f32 result its buffer: the
  output projection's gradient f32[32128,512] at the peak of
  t5-v1_1-small v5p-16 8x1 (#74), cast to bf16 for its reduce-scatter."""
  if not (eqn.primitive.name == "convert_element_type"
          and _itemsize(eqn.outvars[0]) < _itemsize(eqn.invars[0])):
    return False
  return all(elementwise(c) and not widening(c)
             for c in readers(eqn.outvars[0]))


@functools.lru_cache(maxsize=1 << 10)
def _chain_ends(jaxpr, in_loop: bool) -> frozenset:
  """The outputs of a call's body made inside a matmul's output fusion,
  which goes on into what the caller does with them (the narrowed-weight-
  gradients rule, across a checkpoint's boundary). Once per body: every
  schedule of the step plans its callers again (jaxprs hash by identity,
  and the cache holds the ones it keys, so no other body takes their id)."""
  consumers: dict = {}
  for e in jaxpr.eqns:
    for u in e.invars:
      if isinstance(u, jcore.Var):
        consumers.setdefault(u, []).append(e)

  def readers(v):
    for c in consumers.get(v, ()):
      if is_view(c):
        yield from readers(c.outvars[0])
      else:
        yield c
  outs = {v for v in jaxpr.outvars if isinstance(v, jcore.Var)}
  return frozenset(matmul_fusion_chain(jaxpr.eqns, readers, set(), in_loop)
                   & outs)


def accumulated_stacks(eqns, readers, in_place: set, inputs: set) -> set:
  """The accumulated-loop-outputs rule: a loop's stacked output whose one
  reader adds it to a caller's buffer of its shape (a jaxpr input) and whose
  sum is written back in place (gradient accumulation: g_acc + g) is added
  into that buffer slice by slice; it has no buffer of its own."""
  out = set()
  for eqn in eqns:
    if eqn.primitive.name != "scan":
      continue
    for v in eqn.outvars[loops.scan_counts(eqn)[1]:]:
      users = {id(c): c for c in readers(v)}
      if len(users) != 1:
        continue
      add, = users.values()
      if (add.primitive.name in ("add", "add_any")
          and all(w in in_place for w in add.outvars)
          and any(u in inputs and u.aval.shape == v.aval.shape
                  and u.aval.dtype == v.aval.dtype for u in add.invars
                  if isinstance(u, jcore.Var) and u is not v)):
        out.add(v)
  return out


_EXPANDING = {"iota", "broadcast_in_dim"}  # XLA's IsPurelyExpanding
_SINK_LIMIT = 100  # WhileLoopFusibleSinking's largest subgraph


def sunk_into_loops(eqns, readers, producer: dict) -> set:
  """The sunk-loop-constants rule: the values a loop reads as constants
  that are made only by expanding ops (iota, broadcasts) through
  elementwise ops and views (XLA's IsSinkableFusion), and that nothing
  else reads as a buffer."""
  def as_constant(loop, v) -> bool:  # read by `loop` only as a constant
    return (loop.primitive.name == "scan"
            and v not in loop.invars[loops.scan_counts(loop)[0]:])

  sunk: set = set()
  for eqn in eqns:
    if eqn.primitive.name != "scan":
      continue
    for v in eqn.invars[:loops.scan_counts(eqn)[0]]:
      if (isinstance(v, jcore.Var) and v not in sunk
          and _sinkable(v, producer, [0])
          and all(as_constant(c, v) or absorbs(c) for c in readers(v))):
        sunk.add(v)
  return sunk


def _sinkable(v, producer: dict, seen: list, outer: tuple = ()) -> bool:
  """Whether `v` is made by a graph IsSinkableFusion accepts: expanding
  ops at its leaves, elementwise ops, views and elementwise calls inside;
  `outer`: (a call body's inputs -> the call's operands, the caller's
  producers)."""
  if not isinstance(v, jcore.Var):
    return True  # a literal
  if outer and v in outer[0]:
    return _sinkable(outer[0][v], outer[1], seen, outer[2])
  eqn = producer.get(v)
  seen[0] += 1
  if eqn is None or seen[0] > _SINK_LIMIT:
    return False  # an argument: not fusible
  name = eqn.primitive.name
  if name in _EXPANDING:
    return True
  if name in ("jit", "pjit", "closed_call"):  # inlined: its own producers
    body = _subjaxprs(eqn)[0]
    inner = {w: e for e in body.eqns for w in e.outvars}
    call = (dict(zip(body.invars, eqn.invars)), producer, outer)
    return _sinkable(body.outvars[eqn.outvars.index(v)], inner, seen, call)
  if elementwise(eqn) or is_view(eqn):
    return all(_sinkable(u, producer, seen, outer) for u in eqn.invars)
  return False


def dead_equations(jaxpr) -> set:
  """The dead-code rule: the ids of the equations of `jaxpr` with no
  effects whose outputs no live equation reads and the jaxpr does not
  return."""
  read = {v for v in jaxpr.outvars if isinstance(v, jcore.Var)}
  dead = set()
  for eqn in reversed(jaxpr.eqns):
    if not eqn.effects and not any(v in read for v in eqn.outvars):
      dead.add(id(eqn))
      continue
    read.update(v for v in eqn.invars if isinstance(v, jcore.Var))
  return dead


def gathered_slices_minor(eqn, v) -> bool:
  """The gathered-slices-minor rule: whether `v`, a result of `eqn`, is a
  gather's, stored with its slices' dims minor in tiles (TPU). Seen
  through the calls that return it."""
  if eqn.primitive.name == "gather":  # rows of a table, not its elements
    rank = len(v.aval.shape)
    offset = tuple(eqn.params["dimension_numbers"].offset_dims)
    return rank >= 2 and bool(offset) and offset == tuple(
        range(rank - len(offset), rank))
  if eqn.primitive.name not in ("jit", "pjit", "closed_call", "shard_map"):
    return False
  bodies = _subjaxprs(eqn)
  if len(bodies) != 1:
    return False
  inner = getattr(bodies[0], "jaxpr", bodies[0])
  out = inner.outvars[eqn.outvars.index(v)]
  made = next((e for e in inner.eqns if out in e.outvars), None)
  return made is not None and gathered_slices_minor(made, out)


def stacks_made_first(jaxpr, size: dict, beside: dict, in_place_out,
                      scale: float) -> dict:
  """The stacks-made-first rule's buffers, as weight stacks are kept
  ({(stack, dtype, "early"): (first index, the loop's index - 1, bytes)}),
  with bytes read at `scale` times the traced batch. A loop's stacked
  output the step returns with a buffer of its own (a serving step's KV
  cache stack: the stacked-outputs-not-donated rule) is an operand of
  XLA's while loop, an AllocateBuffer; libtpu's DFS memory scheduler visits
  a loop's operands largest first (the bytes made for each, transitively),
  so where a stack is larger than what the step makes for another operand
  of the loop, it is made first and live while that is made (TPU). The
  llava_mini v5p-8 2x2 batch-32 decode, DFS kept: its two 72 MiB cache
  stacks (custom-call.2 and .3, AllocateBuffer) before the embedding
  lookup's table copy and all-to-all (31 MiB each); the gemma-2b v5p-8 1x4
  batch-16 decode: its 250 MiB copy and all-to-all first, the 180 MiB
  stacks after. The choice turns on the batch, so the points hold for the
  batch `scale` reads them at only."""
  eqns = jaxpr.eqns
  at = lambda b: b[0] + b[1] * scale
  producer = {v: i for i, e in enumerate(eqns) for v in e.outvars}
  outs = {v for v in jaxpr.outvars if isinstance(v, jcore.Var)}
  in_place = set(in_place_out)

  def made_for(u) -> set:  # the equations that make u, transitively
    seen, todo = set(), [u]
    while todo:
      v = todo.pop()
      if isinstance(v, jcore.Var) and v in producer and producer[v] not in seen:
        seen.add(producer[v])
        todo += eqns[producer[v]].invars
    return seen

  out = {}
  for i, eqn in enumerate(eqns):
    if eqn.primitive.name != "scan":
      continue
    stacks = [v for v in eqn.outvars[loops.scan_counts(eqn)[1]:]
              if v in outs and v not in in_place
              and size.get(v, (0, 0)) != (0, 0)]
    if not stacks:
      continue
    trees = [t for t in map(made_for, eqn.invars) if t]
    made = [sum(at(size[w]) for j in t for w in eqns[j].outvars)
            + sum(at(beside[j][0]) for j in t if j in beside) for t in trees]
    for v in stacks:
      after = [t for t, m in zip(trees, made) if at(size[v]) > m]
      if not after:
        continue
      before = max((j for t, m in zip(trees, made) if at(size[v]) <= m
                    for j in t), default=-1)
      first = max(min(j for t in after for j in t), before + 1)
      if first < i:
        out[(v, np.dtype(v.aval.dtype), "early")] = (first, i - 1, size[v])
  return out


def shared_reshards(eqns) -> dict:
  """The shared-reshards rule: each reshard of a value into a layout an
  earlier equation of the same computation already resharded it into ->
  that earlier result. XLA's CSE merges the two collectives into one, whose
  buffer lives to the last reader of either (TPU)."""
  first: dict = {}
  shared: dict = {}
  for eqn in eqns:
    if eqn.primitive.name != "reshard" or not isinstance(eqn.invars[0],
                                                          jcore.Var):
      continue
    out = eqn.outvars[0]
    key = (eqn.invars[0], spec_of(out.aval), out.aval.dtype)
    if key in first:
      shared[out] = first[key]
    else:
      first[key] = out
  return shared


def donated_in_place(jaxpr, donated: list) -> list:
  """The stacked-outputs-not-donated rule: of the outputs returned into
  donated buffers, those a loop stacks are left out (a buffer of their
  own), but for a stack written whole over a donated argument nothing else
  reads (`overwritten_argument`)."""
  readers: dict = {}
  for e in jaxpr.eqns:
    for v in e.invars:
      if isinstance(v, jcore.Var):
        readers.setdefault(v, []).append(e)
  arguments = set(jaxpr.invars)
  stacked = set()
  for e in jaxpr.eqns:
    if e.primitive.name != "scan":
      continue
    for v in e.outvars[loops.scan_counts(e)[1]:]:
      operand = overwritten_argument(e, v)
      if not (operand in arguments and readers.get(operand) == [e]):
        stacked.add(v)
  return [v for v in donated if v not in stacked]


def overwritten_argument(scan, out):
  """The stacked operand of `scan` whose slices its body overwrites whole
  to make the stacked output `out` (None if none): each iteration's slice a
  dynamic_update_slice of an update of the slice's own shape, which XLA's
  algebraic simplifier replaces by the update, so the body never reads the
  operand. The written-whole stacks rule: XLA's while loop then writes the
  output's slices into the operand's buffer, in place (T5's prefill, which
  writes the cross-attention cache over the prompt whole: while.81{4} and
  {5}, bf16[24,16,1024,16,128], share allocation 6 and 7 with the donated
  cache arguments param.14 and param.15, t5_3b v5p-8 2x2 batch 32, 1024 +
  256 positions; the decoder's own cache, written one position at a time,
  keeps its own stacks)."""
  body = scan.params["jaxpr"].jaxpr
  v = body.outvars[scan.outvars.index(out)]
  j = _updated_slice(scan, v)
  return scan.invars[j] if j is not None and _updated(body, v)[1] else None


def _updated_slice(scan, v):
  """The index among `scan`'s operands of the stacked operand whose slice
  its body's output `v` updates by a dynamic_update_slice (through jit
  calls), or None."""
  consts, carries = loops.scan_counts(scan)
  body = scan.params["jaxpr"].jaxpr
  operand, _ = _updated(body, v)
  if operand is None or operand not in body.invars:
    return None
  j = body.invars.index(operand)
  return j if j >= consts + carries else None


def _updated(jaxpr, v):
  """(The input of `jaxpr` that `v` is a dynamic_update_slice of, through
  jit calls, or None; whether the update covers it whole)."""
  producer = next((e for e in jaxpr.eqns if v in e.outvars), None)
  if producer is None:
    return None, False
  name = producer.primitive.name
  if name == "dynamic_update_slice":
    operand, update = producer.invars[:2]
    return operand, update.aval.shape == operand.aval.shape
  bodies = _subjaxprs(producer)
  if name in ("jit", "pjit", "closed_call") and len(bodies) == 1:
    inner = getattr(bodies[0], "jaxpr", bodies[0])
    operand, whole = _updated(inner,
                              inner.outvars[producer.outvars.index(v)])
    if operand is not None and operand in inner.invars:
      return producer.invars[inner.invars.index(operand)], whole
  return None, False


def sliced_updates(scan) -> list:
  """The updated slices rule: the outputs of `scan`'s body that update
  part of their stacked operand's slice (a dynamic_update_slice of fewer
  positions than the slice has). XLA's loop reads the slice out of the
  operand's stack into a buffer of its own, updates it there and writes it
  into the output stack, so the updated slice is a buffer in the body, not
  written in place (the llava_mini v5p-8 2x2 batch 32 decode step: one
  layer's k and v, bf16[16,1152,4,128], 18 MiB each, live in the layer
  loop's body beside the stacks; a decoder's decode step alike)."""
  body = scan.params["jaxpr"].jaxpr
  return [v for v in body.outvars if isinstance(v, jcore.Var)
          and _updated_slice(scan, v) is not None
          and not _updated(body, v)[1]]


def is_loop(eqn) -> bool:
  """A loop: its body runs once per iteration (scan, while)."""
  return eqn.primitive.name in ("scan", "while")


def runs_whole(eqn) -> bool:
  """A loop XLA keeps: one instruction (kWhile) it runs whole, its body
  scheduled on its own; a loop of one iteration it inlines."""
  return is_loop(eqn) and eqn.params.get("length") != 1


def shareable(eqn, v, read: list, chained: set, fusions_reading) -> list:
  """The buffers `eqn`'s fusion may write its result `v` into (the in-place
  rule, where one dies there): any it reads; but where `v` ends a matmul's
  output fusion (`chained`), only those no other fusion reads
  (`fusions_reading(u)`: how many fusions read u), or an addend the root add
  reads directly: which of two fusions reads a value last is the
  scheduler's choice, which the traced order does not give. The flash
  backward's f32 p = exp(s - lse), read by dV's matmul (through its bf16
  cast) and by d_scores = p * (dO·Vᵀ - delta), that matmul's output fusion,
  is live beside d_scores at the peaks of t5_large v5e-32 32x1 b1024 and
  v4-16 8x1 b1024 (corpus #215, #267: bitcast_multiply_fusion.4 with
  fusion.1521{1}, and with fusion.1122{1}), dV made after it; GeGLU's gate,
  read by the up projection's output fusion alone, is written over there
  (gemma-2b v5p-8 1x4 prefill, experiments/data/inference_compiled.jsonl:
  +0.66% sharing it, +6.56% not)."""
  if v not in chained:
    return read
  return [u for u in read if fusions_reading(u) == 1
          or (eqn.primitive.name == "add" and u in eqn.invars)]


def inline_one_trip_loops(jaxpr):
  """The one-trip loops rule: `jaxpr` with each scan of one iteration
  replaced by its body, as XLA's while-loop simplifier replaces a loop of
  trip count 1 by its body (TryRemoveWhileLoop): no carry buffer beside
  its initial value (a zero-filled accumulator, added into, is the sum
  itself), no stacked output made before the body's own result; the slice
  it reads and the stacked output it writes are views. The flash loops of
  t5_3b v6e-16 8x2 b1024 at seq 512 (one block; corpus #245) are not in
  its optimized module, which has four while loops, the encoder's and the
  decoder's layers forward and backward. The gradient-accumulation loop
  keeps its own rule (interleaved micro-batches)."""
  if not any(_one_trip(e) for e in jaxpr.eqns):
    return jaxpr
  eqns = []
  for e in jaxpr.eqns:
    if not _one_trip(e):
      eqns.append(e)
      continue
    body = e.params["jaxpr"].jaxpr
    consts, carries = loops.scan_counts(e)
    head = consts + carries
    for k, (u, w) in enumerate(zip(e.invars, body.invars)):
      eqns.append(_view(e, u, w, slice_of=k >= head))
    eqns += [loops.inlined(b, e) for b in body.eqns]
    for k, (w, v) in enumerate(zip(body.outvars, e.outvars)):
      eqns.append(_view(e, w, v, stacked=k >= carries))
  return jaxpr.replace(eqns=eqns)


def _one_trip(eqn) -> bool:
  """A scan XLA replaces by its body (inline_one_trip_loops)."""
  return (eqn.primitive.name == "scan" and eqn.params.get("length") == 1
          and not eqn.params["jaxpr"].consts and not accumulation_loop(eqn))


def _view(loop, u, v, slice_of: bool = False, stacked: bool = False):
  """`v` as a view of `u` made where `loop` was: the one slice of a scanned
  operand, the stacked output of one slice, or the value itself."""
  if slice_of:
    prim, params = jax.lax.squeeze_p, {"dimensions": (0,)}
  elif stacked:
    prim, params = jax.lax.reshape_p, {"new_sizes": tuple(v.aval.shape),
                                       "dimensions": None, "sharding": None}
  else:
    prim, params = jax.lax.copy_p, {}
  return jcore.new_jaxpr_eqn([u], [v], prim, params, set(), loop.source_info)


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
    copied = set(sliced_updates(eqn))
    return [(body, local, [v for v in body.outvars if v not in copied])]
  inner_local = local or eqn.primitive.name == "shard_map"
  return [(sub, inner_local, sub.outvars) for sub in subs]


def _heads_behind(eqn, operand) -> bool:
  """Whether a matmul keeps more than one of `operand`'s dims (its result
  split, as heads x head_dim) with a contracted dim stored before the
  first of them: the operand is not laid out with that dim major."""
  (contract_l, contract_r), (batch_l, batch_r) = eqn.params[
      "dimension_numbers"]
  left = eqn.invars[0] is operand
  contract, batch = (contract_l, batch_l) if left else (contract_r, batch_r)
  kept = [d for d in range(len(operand.aval.shape))
          if d not in contract and d not in batch]
  return len(kept) > 1 and min(contract, default=kept[0]) < kept[0]


def _slice_readers(body, outer: dict, found: list,
                   outer_cast: dict | None = None,
                   outer_gathered: dict | None = None) -> None:
  """What reads a loop's per-iteration slices in `body` (and the calls it
  makes): ("cast", stacked operand, dtype, cast equation) for a cast of a
  slice, ("matmul", stacked operand, dtype, None) for a matmul reading a
  slice directly, ("copy", stacked operand, its dtype, None) for a matmul
  reading a cast of a slice (through views); for a matmul reading an
  all-gather of a slice (a reshard to another layout, through views, no
  cast), ("gathered", stacked operand, its dtype, None) where the matmul
  keeps more than one of the slice's dims and ("gathered read", ...)
  where it keeps one. `outer` maps a body input to the stacked operand it
  slices."""
  views: dict = dict(outer)
  cast: dict = dict(outer_cast or {})  # a cast slice (or its view) -> stack
  gathered: dict = dict(outer_gathered or {})  # a gathered slice -> stack
  for eqn in body.eqns:
    ins = [v for v in eqn.invars if isinstance(v, jcore.Var) and v in views]
    casts = [v for v in eqn.invars if isinstance(v, jcore.Var) and v in cast]
    gathers = [v for v in eqn.invars
               if isinstance(v, jcore.Var) and v in gathered]
    if is_view(eqn) and ins:
      views[eqn.outvars[0]] = views[ins[0]]
    elif is_view(eqn) and casts:
      cast[eqn.outvars[0]] = cast[casts[0]]
    elif is_view(eqn) and gathers:
      gathered[eqn.outvars[0]] = gathered[gathers[0]]
    elif eqn.primitive.name == "reshard" and ins:  # not a view: a gather
      gathered[eqn.outvars[0]] = views[ins[0]]
    elif eqn.primitive.name == "convert_element_type" and ins:
      found.append(("cast", views[ins[0]], eqn.params["new_dtype"], eqn))
      cast[eqn.outvars[0]] = views[ins[0]]
    elif eqn.primitive.name == "dot_general":
      found += [("matmul", views[v], v.aval.dtype, None) for v in ins]
      found += [("copy", cast[v], cast[v].aval.dtype, None) for v in casts]
      found += [("gathered" if _heads_behind(eqn, v) else "gathered read",
                 gathered[v], gathered[v].aval.dtype, None) for v in gathers]
    if eqn.primitive.name in ("scan", "while"):
      continue  # another loop's slices are its own
    for sub, _, _ in calls(eqn, False):
      if len(sub.invars) == len(eqn.invars):
        pairs = [(a, b) for a, b in zip(sub.invars, eqn.invars)
                 if isinstance(b, jcore.Var)]
        _slice_readers(sub, {a: views[b] for a, b in pairs if b in views},
                       found, {a: cast[b] for a, b in pairs if b in cast},
                       {a: gathered[b] for a, b in pairs if b in gathered})


def sliced_for_update(jaxpr) -> set:
  """The arguments of `jaxpr` it also reads resharded to another layout:
  under ZeRO-1/2 the update runs on this device's slice of a parameter
  replicated over X, and the new value is gathered back into its donated
  buffer (simulator.step); the copied-cast-weights rule's stacks."""
  arguments = set(jaxpr.invars)
  return {u for e in jaxpr.eqns
          if e.primitive.name == "reshard" and not is_view(e)
          for u in e.invars if isinstance(u, jcore.Var) and u in arguments}


def hoisted_stacks(jaxpr, local: bool) -> tuple[dict, set]:
  """The hoisted-casts, transposed-weights, copied-cast-weights and
  head-split-gathered-weights rules for the loops of `jaxpr`: {(stacked
  weight, dtype, rule): (first loop index, last loop index, (fixed,
  linear) bytes)}, and the ids of the cast equations inside the loops that
  the hoisted casts replace."""
  stacks: dict = {}
  hoisted: set = set()
  sliced = sliced_for_update(jaxpr)
  first_read: dict = {}  # an argument's first reader: a copy is made there
  last_read: dict = {}  # and its last, the update: every reader reads it
  for i, eqn in enumerate(jaxpr.eqns):
    for v in eqn.invars:
      if isinstance(v, jcore.Var):
        first_read.setdefault(v, i)
        last_read[v] = i
  for i, eqn in enumerate(jaxpr.eqns):
    if eqn.primitive.name != "scan":
      continue
    body = _subjaxprs(eqn)[0]
    first_xs = sum(loops.scan_counts(eqn))
    outer = {a: b for a, b in zip(body.invars[first_xs:],
                                  eqn.invars[first_xs:])
             if isinstance(b, jcore.Var)}
    backward = made_by_backward(eqn)
    found: list = []
    _slice_readers(body, outer, found)
    for rule, stack, dtype, cast in found:
      shape = shape_of(stack.aval, local)
      if rule == "gathered read":  # a later loop that gathers the copy
        key = (stack, np.dtype(dtype), "gathered")
        if key in stacks:
          stacks[key] = (stacks[key][0], i, stacks[key][2])
        continue
      if carries_batch(shape) or rule in ("matmul", "copy") and not (
          backward and stack in sliced):
        continue  # activations; for a copy: a forward loop, a stack the
        # update writes in place (or the program makes)
      if cast is not None:
        hoisted.add(id(cast))
      key = (stack, np.dtype(dtype), rule)
      first = (stacks.get(key, (i,))[0] if rule in ("cast", "gathered")
               else first_read.get(stack, i) if rule == "matmul" else i)
      last = last_read.get(stack, i) if rule in ("matmul", "copy") else i
      stacks[key] = (first, last, (math.prod(shape)
                                   * np.dtype(dtype).itemsize, 0))
  return stacks, hoisted


def defer_weight_grads(jaxpr, keep_matmuls: bool = False, also=None,
                       results: tuple = ()):
  """`jaxpr` with every weight-gradient matmul (and equation `also` says
  is one), what reads a backward loop's weight gradient (the output
  projection's, accumulated over a chunked loss's loop), and what is made
  from them alone, moved as late as its readers allow (the deferred-weight-
  gradients rule); a loop only the outputs `results` need (a chunked
  loss's forward loop: only the loss value reads it) is moved there too.
  With `keep_matmuls`, only what is made from them is moved (xla_gpu_rules:
  late gradient collectives)."""
  eqns = list(jaxpr.eqns)
  deferred: set = set()
  made: set = set()
  loop_grads = _loop_weight_grads(eqns)
  loss_loops = {i for i in _only_for(eqns, jaxpr.outvars, results)
                if eqns[i].primitive.name == "scan"}
  for i, e in enumerate(eqns):
    reads = [v for v in e.invars if isinstance(v, jcore.Var)]
    seed = (matmul_kind_of(e) == "weight_grad" or (also is not None and also(e))
            or any(v in loop_grads for v in reads) or i in loss_loops)
    if seed and keep_matmuls:
      made.update(e.outvars)
    elif seed or (reads and any(v in made for v in reads) and (
        len(reads) == 1 or all(v in made for v in reads))
        and not any(True for _ in subjaxprs(e))):  # a call reads on
      deferred.add(i)
      made.update(e.outvars)
  if not deferred:
    return jaxpr
  producer = {v: i for i, e in enumerate(eqns) for v in e.outvars}
  order: list = []
  emitted: set = set()

  def emit(i):
    if i in emitted:
      return
    for v in eqns[i].invars:
      if isinstance(v, jcore.Var) and v in producer and producer[v] in deferred:
        emit(producer[v])
    emitted.add(i)
    order.append(i)

  for i, e in enumerate(eqns):
    if i in deferred:
      continue
    emit(i)
  for i in sorted(deferred):
    emit(i)
  return jaxpr.replace(eqns=[eqns[i] for i in order])


def _loop_weight_grads(eqns) -> set:
  """The weight gradients backward loops accumulate in their carry: batch-
  free carried outputs of two or more dims."""
  return {v for e in eqns if e.primitive.name == "scan"
          and made_by_backward(e)
          for v in e.outvars[:loops.scan_counts(e)[1]]
          if len(v.aval.shape) >= 2 and not carries_batch(v.aval.shape)}


def _only_for(eqns, outvars, results: tuple) -> list[int]:
  """The equations whose values only the outputs `results` need, not the
  jaxpr's other outputs (the sunk-loss part of the deferred-weight-
  gradients rule: a loop among them runs last)."""
  if not results:
    return []
  wanted = {id(v) for v in results}
  needed = {v for v in outvars
            if isinstance(v, jcore.Var) and id(v) not in wanted}
  only: list[int] = []
  for i in range(len(eqns) - 1, -1, -1):
    e = eqns[i]
    if any(v in needed for v in e.outvars):
      needed.update(v for v in e.invars if isinstance(v, jcore.Var))
    else:
      only.append(i)
  return only


def fetches_host_value(eqn) -> bool:
  """A device_put of a value in host memory to the device (an offloaded
  argument fetched for the update)."""
  return (eqn.primitive.name == "device_put"
          and any(isinstance(v, jcore.Var) and on_host(v.aval)
                  for v in eqn.invars)
          and not any(on_host(v.aval) for v in eqn.outvars))


def stream_offloaded_update(jaxpr, gpu: bool = False) -> tuple[object, dict]:
  """The streamed-offloaded-update rule: `jaxpr` with what reads state
  fetched from host memory outside the forward pass (gradients made in host
  memory where the parameters live, moments, parameters for the update) and
  what is made from it done leaf by leaf, after everything else; and, per
  leaf, the equation after which its fetched values die (its update is one
  fusion: they are read until its last value is made).

  optax's program updates every leaf's moments, then every leaf's
  parameters, so in program order every fetched copy is live at once. XLA
  fuses each leaf's update into one multi-output fusion that reads the
  leaf's fetched parameter, gradient and moments and writes the three new
  values without reusing their buffers, issues the next leaf's fetches
  before it runs, and copies the results back to host after it. In the
  schedule of llama2_7b v5p-16 4x2 b16 --offload=optimizer,params
  (experiments/data/compiled_corpus.jsonl #69) the peak, at fusion.371, is
  12 f32[32,1024,5504]: its 4 fetched inputs (copy-done.39-42), its 3
  outputs, the next leaf's 4 fetches in flight (copy-start.44-47, issued
  before it) and 1 of the previous leaf's 3 outputs still being copied back
  (fusion.367{1}; {0} and {2} were done before). Which of the previous
  leaf's copies the scheduler finishes first is not derived, so the rule
  takes the bound: the previous leaf's copies back end after the next
  leaf's update (14 such buffers).

  Only where the update fetches a value the step made in host memory (the
  gradients of parameters kept there): a leaf's update cannot start before
  the backward makes its gradient. With the moments alone in host memory
  XLA fetches them during the backward, several leaves at once (#68
  --offload=optimizer: 6 copy-starts, the moments of all three MLP leaves,
  at its peak in the layers' backward): the prefetched-host-state rule
  (`prefetch_host_state`).
  On a GPU (`gpu`) the update streams with the moments alone in host memory
  too: XLA:GPU's fusions read them there (xla_gpu_rules, host operands in
  place), so nothing is fetched ahead."""
  eqns = list(jaxpr.eqns)
  producer = {v: i for i, e in enumerate(eqns) for v in e.outvars}
  loss = [i for i, e in enumerate(eqns)
          if scopes.LOSS in scopes.scopes_of(e.source_info.name_stack)]
  forward: set = set()  # what the loss is made from: not the update's
  while loss:
    i = loss.pop()
    if i not in forward:
      forward.add(i)
      loss += [producer[v] for v in eqns[i].invars
               if isinstance(v, jcore.Var) and v in producer]
  streamed: set = set()
  made: set = set()
  for i, e in enumerate(eqns):
    if i in forward:
      continue
    if fetches_host_value(e) or any(
        isinstance(v, jcore.Var) and v in made for v in e.invars):
      streamed.add(i)
      made.update(e.outvars)
  inputs = set(jaxpr.invars)
  if not any(fetches_host_value(eqns[i]) and (gpu or any(
      isinstance(v, jcore.Var) and v not in inputs for v in eqns[i].invars))
             for i in streamed):
    return jaxpr, {}  # no gradient fetched from host: moments prefetched
  order = [i for i in range(len(eqns)) if i not in streamed]
  emitted = set(order)

  def emit(i, group):
    if i in emitted:
      return
    emitted.add(i)
    for v in eqns[i].invars:
      if isinstance(v, jcore.Var) and v in producer:
        emit(producer[v], group)
    group.append(i)

  back = {i for i in streamed if eqns[i].primitive.name == "device_put"
          and all(on_host(v.aval) for v in eqns[i].outvars)}
  groups: list[list[int]] = []  # per output: what it needs, then write-backs
  for v in [*jaxpr.outvars, None]:
    group: list = []
    if v is None:  # whatever is left
      for i in sorted(streamed):
        emit(i, group)
    elif isinstance(v, jcore.Var) and producer.get(v) in streamed:
      emit(producer[v], group)
      for i in sorted(back):  # copies back to host whose values are made
        if i not in emitted and all(
            not isinstance(u, jcore.Var) or u not in producer
            or producer[u] in emitted for u in eqns[i].invars):
          emit(i, group)
    if group:
      groups.append(group)
  # One leaf ahead: a leaf's fetches are issued before the previous leaf's
  # update runs. The update is one fusion: what it fetched stays live until
  # its last value is made (before the copies back to host).
  fetch = lambda g: [i for i in g if fetches_host_value(eqns[i])]
  write = lambda g: [i for i in g if i in back]
  order += fetch(groups[0])
  held: dict = {}
  for k, group in enumerate(groups):
    if k + 1 < len(groups):
      order += fetch(groups[k + 1])
    update = [i for i in group if i not in back
              and not fetches_host_value(eqns[i])]
    order += update
    if update:
      held[update[-1]] = [v for i in fetch(group) for v in eqns[i].outvars]
    if k:
      order += write(groups[k - 1])
  order += write(groups[-1])
  position = {i: n for n, i in enumerate(order)}
  return (jaxpr.replace(eqns=[eqns[i] for i in order]),
          {position[i]: vs for i, vs in held.items()})


def reductions_where_made(jaxpr):
  """`jaxpr` with each reduction of values elementwise ops make moved to
  just after the last of those ops (the multi-output-reductions rule; TPU,
  where it was seen)."""
  eqns = list(jaxpr.eqns)
  producer = {v: i for i, e in enumerate(eqns) for v in e.outvars}
  after: dict[int, list[int]] = {}
  for i, e in enumerate(eqns):
    if e.primitive.name not in _REDUCE_OPS:
      continue
    made = [producer.get(v) for v in e.invars if isinstance(v, jcore.Var)]
    if made and None not in made and max(made) < i - 1 and all(
        loop_fusible(eqns[k]) for k in made):
      after.setdefault(max(made), []).append(i)
  return _moved_beside(jaxpr, {}, after)


def prefetch_host_state(jaxpr):
  """`jaxpr` with each fetch of a step argument kept in host memory (the
  optimizer's state under --offload=optimizer) moved to just before the
  last loop ahead of it (the prefetched-host-state rule; TPU, where the
  update is not streamed)."""
  eqns = list(jaxpr.eqns)
  inputs = set(jaxpr.invars)
  before: dict[int, list[int]] = {}  # loop -> the fetches moved before it
  loop = None  # the last loop so far
  for i, e in enumerate(eqns):
    if runs_whole(e):
      loop = i
    elif loop is not None and fetches_host_value(e) and all(
        isinstance(v, jcore.Var) and v in inputs for v in e.invars):
      before.setdefault(loop, []).append(i)
  return _moved_beside(jaxpr, before, {})


def _moved_beside(jaxpr, before: dict[int, list[int]],
                  after: dict[int, list[int]]):
  """`jaxpr` with the equations `before[i]` moved to just before equation
  i and those `after[i]` to just after it, in their order; itself when
  nothing moves."""
  if not before and not after:
    return jaxpr
  eqns = jaxpr.eqns
  moved = {k for found in (*before.values(), *after.values()) for k in found}
  order = []
  for i, e in enumerate(eqns):
    order += [eqns[k] for k in before.get(i, ())]
    if i not in moved:
      order.append(e)
    order += [eqns[k] for k in after.get(i, ())]
  return jaxpr.replace(eqns=order)


def prefetch_host_weights(jaxpr):
  """`jaxpr` with each batch-free value fetched from host memory (the
  weights under --offload=params), and what is made from it, the jaxpr's
  batch-free inputs and literals alone (its gather and dequantization),
  moved to the jaxpr's start where one of them feeds a matmul here (the
  prefetched-host-weights rule; the matmuls of calls made here read the
  others)."""
  eqns = list(jaxpr.eqns)
  given = {v for v in (*jaxpr.invars, *jaxpr.constvars)
           if not carries_batch(v.aval.shape)}
  made: set = set()
  moved: list = []
  for i, e in enumerate(eqns):
    ins = [v for v in e.invars if isinstance(v, jcore.Var)]
    seed = (fetches_host_value(e)
            and not any(carries_batch(v.aval.shape) for v in e.outvars))
    if (seed or (ins and any(v in made for v in ins)
                 and all(v in made or v in given for v in ins)
                 and not any(True for _ in subjaxprs(e))
                 and not any(carries_batch(v.aval.shape)
                             for v in e.outvars))):
      moved.append(i)
      made.update(e.outvars)
  for_matmul = {v for e in eqns if e.primitive.name == "dot_general"
                for v in e.invars}
  if not moved or not made & for_matmul:
    return jaxpr
  first = set(moved)
  return jaxpr.replace(eqns=[eqns[i] for i in moved]
                       + [e for i, e in enumerate(eqns) if i not in first])


# TPU generations whose compiled schedules make 8-bit moments' dequantization
# after the backward pass, where the program has it (the early-dequantized-
# state rule: v5p dumps #80, #81; v6e rows #217, #244).
DEQUANTIZED_LATE = ("v5p", "v6e")


# TPU generations whose compiled matmul fusions write a reduction of their
# elementwise chain as one more output (the matmul-reductions rule: v6e,
# #245's fusion.1160). On v5p and v5e the f32 value is a buffer the
# reduction reads apart: t5_large v5p-8 4x1 b16 (#71) and v5e-32 32x1 b1024
# (#215), the encoder attention backward's `bitcast_multiply_fusion.4`
# writes the f32 ds that `reduce.316` sums and two matmul fusions cast (in
# #71 the decoder's 128x128 ds is written beside its sum, by fusion.1251:
# not modelled, the buffer kept is the safe side).
MATMUL_REDUCTIONS = ("v6e",)


def writes_matmul_reductions(chip: str) -> bool:
  """Whether the matmul-reductions rule applies on TPU `chip`
  (meshes.hardware's chip name)."""
  return chip in MATMUL_REDUCTIONS


def dequantizes_early(chip: str) -> bool:
  """Whether the early-dequantized-state rule applies on TPU `chip`
  (meshes.hardware's chip name)."""
  return chip not in DEQUANTIZED_LATE


def hoist_dequantized_state(jaxpr):
  """`jaxpr` with the update's dequantized state made at the step's start
  (the early-dequantized-state rule): each equation after the backward
  pass that reads only the step's arguments and constants (or what such an
  equation made) and writes more bytes than it reads of them (an 8-bit
  moment's codes and block scales turned into f32 values), with what is
  made from it alone, moved first."""
  eqns = list(jaxpr.eqns)
  backward = [i for i, e in enumerate(eqns) if made_by_backward(e)]
  if not backward:
    return jaxpr
  consts = set(jaxpr.constvars)
  given = set(jaxpr.invars) | consts
  hoisted: set = set()
  moved = []
  nbytes = lambda vs: sum(math.prod(v.aval.shape) * v.aval.dtype.itemsize
                          for v in vs if isinstance(v, jcore.Var))
  for i in range(backward[-1] + 1, len(eqns)):
    e = eqns[i]
    ins = [v for v in e.invars if isinstance(v, jcore.Var)]
    if not ins or not all(v in given or v in hoisted for v in ins):
      continue
    if any(v in hoisted for v in ins) or nbytes(e.outvars) > nbytes(
        v for v in ins if v not in consts):
      moved.append(i)
      hoisted.update(e.outvars)
  if not moved:
    return jaxpr
  first = set(moved)
  return jaxpr.replace(eqns=[eqns[i] for i in moved]
                       + [e for i, e in enumerate(eqns) if i not in first])
