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
  second layout   a GEMM merges each group of an operand's dims into one,
                  so a group's dims lie in one order in memory; a value one
                  matmul contracts over two or more dims and another keeps
                  as rows its result holds in another order is made in both
                  layouts by the fusion that makes it. With grouped queries
                  the flash backward's ds (bf16[b,k,g,s,t]: dK contracts
                  (g, s), dQ's result is read as [b,s,k,g,h]) is made three
                  ways with p (fused_convert_transpose: [b,k,g,s,t] twice,
                  [b,k,t,s,g]) at the peaks of mistral_7b h100:4x8 16x2
                  (#119: -6.14% -> -4.24%) and in llama3_8b h100:2x8 8x2
                  (#97, #133) and mixtral_mini h100:2x8 8x2 (#128: -5.99%
                  -> -3.86%); two ways (loop_convert_fusion.10) at two
                  sequences a device (mistral_7b h100:2x8 8x2 b16, #6), where
                  it is an upper bound of one block, though the same plan
                  at one and at four sequences a device (b8, b32) makes
                  three; at three a device too (llama3_8b h100:4x8 16x2
                  b48, #145, held out after the rule). With one query per kv
                  head no group has two dims of more than one element and
                  the gpt2 and llama2_7b dumps make two.
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
  one device      on one GPU (mesh 1x1, no collective in the step) the
  order           output projection's weight gradient is made in the
                  loss's backward, before the layers' backward loop, in all
                  ten h100:1 compiles (#21-#30; entry schedule positions of
                  the gradient's GEMM / the backward loop: gemm_fusion_dot.40
                  bf16[768,50257] 133 / while.114 149 in gpt2 b32 full #22,
                  gemm_fusion_dot.45 bf16[4096,32000] 58 / while.100 104 in
                  llama2_7b b4 #26, and 115/170, 217/235, 60/86, 65/96,
                  58/108, 58/105, 58/105, 72/137 in #21, #23, #24, #25,
                  #27-#30), so the deferred schedule, which holds the f32
                  logits gradient through the layers' backward (6.1 GiB in
                  #22, where XLA's peak is in the loss's backward at
                  gemm_fusion_dot.37), is not simulated there, the traced
                  and late ones are (#22 +37.0% -> -2.8%). Why XLA:GPU's
                  scheduler keeps the program's order with nothing to
                  overlap is not derived; 8 to 16 H100s and H200s keep the
                  deferred bound as above.
  eager update    on one GPU the optimizer's update of a parameter whose
                  gradient a matmul outside the loops makes (the output
                  projection's, untied) runs as soon as that gradient is
                  made, before the layers' backward loop, and writes the
                  new parameter and state there. In llama2_7b h100:1 b4
                  full adafactor bf16 (#26) the head's gradient GEMM
                  gemm_fusion_dot.45 (bf16[4096,32000]) is at entry
                  schedule position 59, its second moments' reductions at
                  60-73, the new parameter loop_add_fusion.21 at 84 and the
                  layers' backward loop while.100 at 105: at XLA's peak
                  inside the loop the gradient and the old parameter are
                  dead and the new one (250 MiB) is live in their place;
                  the same on an A100 (#35: gemm_fusion_dot.45 at 58, the
                  new parameter loop_convert_fusion.17 at 84, while.100 at
                  105). The traced order held the GEMM's f32 result (0.49
                  GiB) to the update after the loop, and on a GPU a written
                  output's operands to the step's end: #26 +3.39% ->
                  +1.72%. Simulated in every schedule on one GPU (the
                  update, and what it reads that the parameters and state
                  alone make, where the gradient is made), and the
                  late schedule is not (no collective to be late); #35
                  +3.17% -> +1.51%. Held out (compiled before the rule, their
                  dumps not read): #27-#30, #172-#174, #176, +8.51/+6.51/
                  +6.71/-0.04/-0.09/-0.46/+3.18/+3.39% -> +3.28/+5.37/+5.63/
                  -0.72/-0.77/-0.87/+2.05/+1.72%; a tied head (gpt2,
                  qwen2-0.5b: its gradient adds into the embedding's, made
                  after the loop) does not move.
  leaf by leaf    what the step runs after its last loop (the optimizer's
                  update) XLA:GPU runs one parameter at a time: in llama3_8b
                  a100:1 b2 s4096 full adamw_8bit bf16 (#177) XLA's peak, at
                  loop_divide_fusion.3, holds one leaf's f32 blocks (two
                  f32[32,14336,2,2048], 7 GiB each) beside the arguments
                  and gradients, where optax's tree maps make every leaf's
                  new moments before any leaf's update, so the traced
                  order holds each leaf's f32 moments (f32[32,4096,14336],
                  7 GiB each) until its update. Simulated on every GPU
                  plan: the equations after the last loop grouped by the
                  values made before it (a gradient) they depend on, one
                  group whole after another; what the parameters and state
                  alone make runs in its readers' group.
  written step    the step's new parameters and state are written into
  outputs         their donated buffers where they are made, their operands
                  dead there (#26: the head's new value loop_add_fusion.21
                  at 84, its gradient and old value dead in the layers'
                  backward after it; #177: each leaf's blocks dead after its
                  own update), where a loop body's written values keep their
                  operands to the body's end (xla_rules, written outputs).
                  With the leaf-by-leaf rule: #177 +84.23% -> +25.71% (left:
                  the quantization's search, an int32 [32,4096,7,2048]
                  index and the f32 blocks gathered through it, which XLA
                  fuses); no other GPU row moved. Held out after both:
                  mistral_7b a100:1 names:qkv 8-bit AdamW (#180) +27.18%
                  (+88.57% with the rules before session 43), llama2_7b
                  a100:2x8 16x1 8-bit AdamW (#181) +5.90%.
  sunk loss       the sunk-loss rule (xla_rules, deferred weight gradients)
  on a GPU        holds on an H100 too: in llama3_8b h100:2x8 16x1 b32
                  loss_chunks=4 (#41) the chunked loss's forward loop, which
                  only the loss value reads, runs after the layers' backward
                  loop (while.255 at schedule position 106, while.238 at 100),
                  with the gathered bf16 output weight (all-gather-done.14,
                  bf16[4096,128256], 1002 MiB) live from 72 to it, and so does
                  mistral_7b h100:2x8 8x2 loss_chunks=4 (#52, the gathered
                  weight all-gather-start.18 and the loop's iota and constant
                  fill, s32 and f32[4,1024,16000], live at XLA's peak in the
                  layers' backward); the deferred schedule on a GPU sinks that
                  loop. Its iota and fill stay where they are made (early in
                  #52 and #49; in #41 the iota is made just before the loop,
                  the fill early). An upper bound where XLA runs the loop
                  before the layers' backward: llava_mini h100:8 8x1 (#49,
                  while.239 at 148, the layers' backward at 158), +24.59%,
                  where the traced schedule is -24.44%.
  early           the zero fill the embedding's gradient is scatter-added into
  scatter fill    (a broadcast of a literal, no operands) is made when the
                  backward pass starts, not at the scatter: XLA:GPU's sibling
                  multi-output fusion makes it with the chunked loss's
                  accumulator fill of the same shape (loop_broadcast_fusion.6,
                  two bf16[4096,128256], at 63 in #41, before the loss's
                  backward loop at 75; its scatter, input_scatter_fusion, at
                  112; in #49 at 122, before the loss's backward loop at 135),
                  and with nothing to share it with it is still early (gpt2
                  h100:8 8x1 adamw_8bit, #42: loop_broadcast_fusion.16,
                  bf16[768,50257], live at XLA's peak in the layers'
                  backward). Simulated in the deferred schedule, from the
                  backward pass's first equation to the call that scatters
                  into it (#42 -5.18% -> -0.39%, #0 -4.18% -> +0.39%), and
                  in each micro-batch of a gradient accumulation, whose loop
                  body is the step over again (gpt2 h100:8 8x1
                  grad_accum=4, #71: bf16[768,50257] from .../grad_
                  accumulation/while/body/.../Decoder._embed/.../
                  broadcast_in_dim live at XLA's peak in the body's loss
                  backward; -7.21% -> -0.02%).
  GEMM epilogue   the one exception to no output fusion: in a loop body a
                  weight-gradient GEMM whose f32 result is only cast to bf16
                  and added into the loop's accumulator (a chunked loss's
                  output-weight gradient) takes the cast and the add in, as
                  XLA:TPU's narrowed-weight-gradients rule has it:
                  gemm_fusion_dot.89 bf16[128256,4096] = add(accumulator,
                  convert(dot)) in #41's loss backward loop,
                  gemm_fusion_dot.136 bf16[32064,1024] in #49's; no f32 [V, d]
                  buffer (2004 MiB in #41) is made. #38, #41 and #42 were
                  compiled as held-out rows and came out more than 5% under
                  (-5.46%, -5.92%, -5.18%); these three rules were read off
                  their dumps, which moved them to the tuned part (now -3.67%,
                  +2.60%, -0.39%). Held out after the rules: #44-#48 (t5, 8
                  and 2 loss chunks, 8-bit AdamW on h200, a mixture of
                  experts) +0.64% to +4.27%; #50-#55 (4 hosts at seq 8192, 13B
                  on H200s, mistral_7b 8x2 with 4 loss chunks and names remat,
                  A100s with 8-bit AdamW, LoRA and a mixture of experts)
                  -4.39% to +9.19%.
  cuBLAS logits   on a real GPU XLA:GPU's GemmFusionAutotuner times each
                  Triton GEMM fusion against cuBLAS on the device and may
                  hand the loss's logits matmul to cuBLAS (a custom call
                  whose f32 result is a tuple element): the f32 logits
                  gradient is then not written over the forward logits,
                  and both are live at the add that makes it. qwen2-0.5b
                  b8 s2048 full on an H100 (#24, experiments/data/
                  executed_gpu.jsonl): 26,879,040,372 B autotuned, XLA's
                  peak at loop_add_fusion.14 (the gradient,
                  f32[8,2048,151936]) beside custom-call.4{0}
                  (f32[16384,151936], jvp(Decoder)/loss/bsd,dv->bsv), and
                  17,193,900,916 B with --xla_gpu_autotune_level=0, equal
                  to the deviceless compile (the gradient alone there,
                  written over gemm_fusion_dot.39's logits); the same in
                  #25. The choice is measured on the device, not derived:
                  the variant is simulated as a schedule of its own (the
                  traced order with the logits gradient a buffer apart from
                  the logits, where the simulation otherwise computes it
                  inside the gradient matmuls' fusions from the logits; at
                  the top level only: a chunked loss's logits are inside
                  its loop) on every GPU plan, and the peak and
                  `fits` take the largest; the deviceless corpus, the
                  autotune-off program, is compared without it
                  (MemoryEstimate.deviceless). Against the H100 runs the
                  estimate is -0.0% on #24 and #25 (-34.9%, -37.2%
                  without the variant), +1.8% to +5.5% on the llama and
                  mistral rows (the variant adds nothing there), and an
                  upper bound where the autotuner kept the logits GEMM in
                  Triton: gpt2 #21-#23 +27.4%, +62.8%, +44.3% (-4.5% to
                  +7.8% without it; their real peaks -6.3% to +1.7% of the
                  deviceless ones).
  split K         XLA:GPU's SplitkRewriter (xla/backends/gpu/transforms/
                  splitk_rewriter.cc; the CUDA plugin 0.10.2 is XLA
                  5a9e73cb, jax's third_party/xla/revision.bzl at jaxlib's
                  git hash, and holds the pass and its nine cost weights)
                  runs in hlo_normalization, after the gemv rewriter and
                  before the Triton GEMM rewriter, on every dot: it splits
                  the contracting dim K into s chunks by a cost model
                  (ChooseSplitK: s of 1, 2, ..., 2048, the cheapest of
                  128x128-tile waves over the SMs, bytes moved, and a
                  reduction's launch and bytes). The GEMM writes f32
                  partials [s, M, N] and a reduce sums them; where s x 16
                  bytes of the narrower operand (before its casts) does
                  not divide K, both operands are padded copies in the
                  GEMM's dtype (GetPaddedK), and what only the matmul read
                  dies at its pad, after the pad fusion that reads it has
                  written its copy: the copies are taken made one at a
                  time, the largest dying source last, so it is live beside
                  all of them (gpt2 h100:8 8x1 b8, #72: XLA's peak is at
                  loop_pad_fusion.1, the bf16[50257,768] weight beside its
                  f32[768,50272] copy and the padded f32[1024,50272]
                  d(logits); -9.52% -> -2.90%; an upper bound where XLA
                  pads the dying operand first, #1 +4.25% -> +6.02%). An HLO pass, not autotuning (the Triton
                  autotuner refuses split_k > 1 in this XLA): a real GPU
                  of the same SMs runs the same split. In gpt2 h100:2x8 4x4
                  (#1) the loss's d(h) = d(logits) . W (M 2048, N 768, K
                  12565) is split in 2 and K padded to 12576: at XLA's peak
                  loop_pad_fusion f32[2048,12576] and loop_pad_fusion.1
                  f32[768,12576] (the gathered bf16 W dead) beside the
                  partials gemm_fusion_dot.131 f32[2,2048,768]. The cost
                  model replayed on the dots dumped before the pass picks
                  XLA's split for all 602 dots of the 19 GPU corpus rows
                  (47 split: small weight gradients, #1's d(h), #7's
                  flash d(v) on an A100; `python -m
                  experiments.split_k_replay --corpus_rows=all`). Not
                  modelled: XLA's DotMerger first merges small dots
                  sharing an operand, which the rule reads apart: in #1
                  the forward q, k, v (2048 x 192 x 768 apart, split 4: 6
                  MiB of partials each) are one 2048 x 576 x 768 GEMM,
                  not split; their weight gradients one split in 4 (6.75
                  MiB), apart split in 8 (4.5 MiB each, one at a time).

  memory-         the deferred and late schedules above are what XLA:GPU's
  scheduler       latency-hiding scheduler makes of the memory scheduler's
  order           order. The CUDA plugin 0.10.2 runs it for the H100 and H200
                  targets (their optimized modules' instructions carry
                  `scheduling_name`; TF_CPP_VMODULE=gpu_hlo_schedule=1 logs
                  "Using unified latency estimator") and not for the A100
                  (sm_80), where the memory scheduler's order stands (#16 and
                  its H100 twin #19 both pick its DFS sequence, 14.05 GiB,
                  TF_CPP_VMODULE=hlo_memory_scheduler=2). There the output
                  projection's weight-gradient GEMM runs in the loss's
                  backward in all 8 A100 compiles (#7, #11, #16, #20, three
                  variants of #16, and #16 with XLA_FLAGS=
                  --xla_gpu_enable_latency_hiding_scheduler=true), against 16
                  of 17 H100/H200 compiles after the layers' backward, and
                  the late schedule is not simulated on an A100. The
                  deferred one is: in held-out mistral_7b a100:2x8 4x4 b32
                  s4096 names:qkv,mlp_hidden adafactor (#110) the memory
                  scheduler runs that GEMM (gemm_fusion_dot.75) after the
                  layers' backward loop (while.211), the loss's f32
                  [8,4096,8000] live at XLA's peak in it (-12.07% with the
                  traced and memory schedules alone, -2.81% with it), so
                  the A100 rows take the deferred bound too (#55
                  mixtral_mini a100:8 +0.07% -> +48.13%, #32 +5.49% ->
                  +25.53%; the 23 earlier A100 rows' median |error| 1.42%
                  -> 6.27%: the price of not saying "fits" where #110's
                  schedule would not).
                  What the memory scheduler moves as well is the zero-filled
                  buffers of the loops' stacked outputs (JAX lowers a scan's
                  ys to a while loop writing into a broadcast zero; the
                  broadcast has no operands): in #20, #11 and #7 every one of
                  them is made at the start of the step, before the forward
                  loop (loop_broadcast_fusion.8-.12 at schedule positions
                  81-97 of #20, the forward while.195 at 102; 77-115 and
                  while.222 at 120 in #11; 61-90 and while.210 at 107 in #7),
                  so the layers' f32 weight-gradient stacks are live through
                  the forward and the loss, where XLA's peak is
                  (gemm_fusion_dot.80 in #20, .77 in #11); in #16 they are
                  made just before the backward loop (140-151, while.211 at
                  153), as the traced order has them. Which of the two the
                  scheduler's heuristics (list, DFS, post-order, the smallest
                  peak kept) give is not derived, so both are simulated (the
                  "memory" schedule: each top-level loop's stacked outputs
                  live from the step's first equation to their loop) and the
                  larger peak kept: #20 +10.45% -> +2.04%, #16 +14.80% ->
                  +7.79% (an upper bound: XLA's peak is in the backward loop),
                  #11 +7.29% -> -1.29% (the traced order alone: -15.65%), #7
                  +4.39% -> 0.00%. Held out (compiled after the rule was
                  written, #31-#36: 8x2, 4x2, 16x1, 8x1, 1x1 and 2x8 zero1 on
                  A100s): -2.06% to +5.49% (the rules before: +0.78% to
                  +23.28%).
  one schedule    XLA:GPU's memory scheduler (DefaultMemoryScheduler,
  per module      xla/hlo/transforms/simplifiers/hlo_memory_scheduler.cc)
                  runs each of its list, DFS and post-order algorithms on
                  every computation of the module and keeps the algorithm
                  whose module heap (HeapSimulator::MinimumMemoryForModule)
                  is smallest, so a loop's body is scheduled the way the
                  step is: in the traced order its weight gradients run
                  where the program makes them, where the TPU rules defer
                  them past the attention's backward in every schedule (the
                  layer-body deferral bound). In mistral_7b h100:1 b8 s4096
                  adafactor bf16 (#29) the layers' backward body runs the
                  MLP's weight-gradient GEMMs (gemm_fusion_dot.22-.25, body
                  positions 75-85) before the attention's backward loop
                  (while.39 at 113), and XLA's peak, in that loop, holds
                  no MLP hidden value (+5.63% -> -0.46%). Only the one-GPU
                  rows move (#27 +3.28% -> +0.07%, #28 +5.37% -> +0.17%,
                  #26 +1.72% -> +0.54%, the dots rows by under a point,
                  to -1.62% at most): elsewhere the deferred schedule,
                  bodies deferred, is the larger one kept. Held out after
                  (#190, #191): gemma-2b a100:1 adafactor +5.85%, llama2_13b
                  a100:1 sgd_momentum +0.08%.
  inlined calls   a shard_map (or jit) body made only of elementwise ops,
                  views, broadcasts and gathers, whose results only
                  elementwise ops, views and reductions read, is computed
                  inside its readers' loop fusions: XLA inlines the call
                  before fusing, and XLA:GPU fuses a gather with the index
                  arithmetic that makes its indices. 8-bit AdamW's
                  dequantization (codes widened to s32, a gather from the
                  256-value map, times the block's absmax) is a shard_map
                  whose f32 moments the update reads: in llama3_8b a100:1
                  b2 s4096 adamw_8bit bf16 (#177) one kLoop fusion,
                  loop_divide_fusion.3 (fused_divide.3: convert.119,
                  select_n.79, gather.18, mul.1427, then the moment update
                  and its division by the new absmax), reads wo's u8 codes
                  and f32[256] map and writes the two divided moments,
                  f32[32,14336,2,2048], at XLA's peak; no s32 index or
                  dequantized f32 moment is a buffer there, where the
                  simulation held three 7 GiB ones (+25.71% -> +0.04%;
                  held out, mistral_7b a100:1 names:qkv #180: +27.18% ->
                  +0.04%; after it, #188 llama2_7b a100:1 -0.33%, #189
                  qwen2-0.5b a100:1 +1.09%). GPU only: TPU dumps make the
                  dequantized moments gather_fusion outputs of their own
                  (xla_rules, early dequantized state).
  host operands   a fusion reads an operand in host memory where it lies
  in place        (pinned host memory, S(5) in the layout): an offloaded
                  argument that only elementwise ops read is fetched into
                  no device buffer. In llama2_7b h100:8 8x1 b16
                  --offload=optimizer (#65) each leaf's AdamW update is one
                  multi-output fusion reading its moments from host memory
                  (loop_add_fusion.15 reads param.43 and param.44,
                  f32[32,512,11008]{2,1,0:S(5)}) and writing the new
                  parameter and moments to device buffers, whose copies back
                  to host (copy-start.18.0, .19.0) are issued after it and
                  done after the next leaf's update (loop_add_fusion.15's
                  outputs live at loop_add_fusion.25, schedule positions
                  643-659); the step's program fetches every moment before
                  the forward pass and writes them all back at its end.
                  So the fetch has no buffer and the update streams leaf by
                  leaf as with gradients in host memory (xla_rules,
                  streamed offloaded update, which takes the previous
                  leaf's copies back to end after the next leaf's update):
                  #65 +30.53% -> +1.83%. Read off the moments; no GPU row
                  offloads parameters, whose forward casts the rule would
                  read in host memory too.
  relaid cache    a serving step's layer loop reads its KV cache stacks
  stacks          (models.decode: [layers, batch, positions, kv heads,
                  head dim]) or writes into them what its GEMMs read, and
                  XLA:GPU's layout assignment (gpu/transforms/
                  layout_assignment.cc, AddDotBackendConstraints: a GEMM's
                  batch dims consecutive and major, else SetDotOperandLayout
                  imposes (batch, rows, columns)) and its split-K rewrite
                  (the contracting positions minor) can give the loop a
                  stack in another order: a copy of the whole stack
                  (wrapped_transpose, kind kInput) made before the loop
                  from the argument and live through it, the loop's own
                  stack in that order copied back after. Seen in the
                  steps compiled deviceless for GPU targets
                  (experiments/data/inference_compiled_gpu.jsonl): the k
                  stack with positions minor in the llama2_7b h100:8 8x1
                  and 2x4 prefills (bf16[32,2,32,128,1280], 640 MiB) and,
                  int8 with its scales, llama2_13b h200:8 1x8's
                  (s8[40,8,5,128,2560]: the quantized k is made from the k
                  the GEMMs read); at decode steps with several queries per
                  kv head, mixtral_mini 4x2's v (bf16[4,8,1,128,2304],
                  split K over the positions) and llama3_8b 1x8's int8 k
                  (s8[32,32,1,128,2304]); t5_3b 4x2's decode its cross-
                  attention v, which the loop only reads, with the layers
                  inward (bf16[8,1024,16,24,128], 768 MiB). Where the
                  loop's matmuls over the stack are matrix-vector products
                  (one query per kv head at a decode step: llama2_7b's,
                  llama2_13b's, T5's self-attention), XLA's algebraic
                  simplifier makes them a multiply and a reduction, and no
                  stack is copied. Which stack and whether is otherwise not
                  derived: the prefills with grouped queries keep theirs
                  (llama3_8b 1x8 and 2x4, mixtral_mini 4x2). So a serving
                  step on a GPU holds one copy of the largest cache stack a
                  loop reads only, or whose slice or written value a matmul
                  that is not a matrix-vector product reads, while the loop
                  runs (from the step's start in the memory scheduler's
                  order, which makes a copy of an argument first as it
                  makes a zero fill: llama3_8b h100:8 2x4's decode, the
                  copy at schedule position 9 beside the embedding's
                  all-to-all): an upper bound by that stack in the prefills
                  that keep theirs (llama3_8b a100:8 1x8 int8 +6.6%).
  serving         the memory-scheduler-order rule's schedule (the loops'
  memory order    stacked outputs zero-filled at the step's start) is also
                  what XLA:GPU keeps for a serving step on an H100: the
                  decode steps of llama2_7b h100:8 2x4 and llama3_8b h100:8
                  2x4 make their cache stacks (loop_broadcast_fusion, 640 /
                  576 MiB each) at schedule positions 6 and 9, before the
                  embedding's all-to-all, XLA's peak there. So a serving
                  step is simulated in that order too on every GPU, the
                  largest peak kept (t5_3b 4x2's prefill +5.0%: its
                  decoder's stacks live through the encoder there).
  copied weight   a loop body's slice of a stacked weight that a GEMM reads
  slices          with no cast between (a serving step's bf16 weights, a
                  bf16 training step's; a mixed-precision step's f32 ones
                  are cast, and the GEMM fusion takes the slice and the
                  cast in: no hoisted weight stacks) is a dynamic-slice
                  fusion of its own (kind kCustom, fused_dynamic_slice), a
                  buffer of the slice's bytes: the MLP slices
                  loop_dynamic_slice_fusion.6 and .8 (bf16[1,4096,11008],
                  bf16[1,11008,4096], 86 MiB) at the peak of llama2_7b
                  h100:8 8x1 b16's decode, the experts' slices (.5, .10,
                  bf16[1,8,1024,1792], 28 MiB) at mixtral_mini h100:8
                  4x2's prefill peak. A slice reads nothing the body makes
                  but its counter, and XLA's scheduler makes it anywhere
                  before its GEMM: just before (mixtral_mini's decode: the
                  experts' wi and wi_gate slices .4 and .2 before
                  gemm_fusion_dot.36, the one GEMM XLA's DotMerger makes of
                  the two, wo's .8 before its own), or well ahead (all
                  three expert slices of qwen1.5-moe-4l h100:8 4x2's
                  prefill, bf16[1,60,2048,704], 165 MiB each, before the
                  tokens' dispatch: XLA's peak; -5.4% with each made before
                  the first matmul reading its operand). So a body's slices
                  are simulated from its start to their last GEMM: an upper
                  bound (mixtral_mini 4x2 decode -9.9% -> +5.1%, qwen1.5-
                  moe-4l prefill -5.4% -> +1.5%). Of the training corpus,
                  the bf16 rows rise by up to 0.3 points (#26 +0.54% ->
                  +0.86%).
  relaid GEMM     a matmul's result transposed so that its batch dims are
  results         no longer major, read by a matmul with batch dims of its
                  own, is a copy (input_transpose_fusion): XLA:GPU's
                  layout assignment makes a GEMM write its batch dims
                  major and read them major, so no layout makes the
                  transpose a bitcast. The tokens' dispatch
                  (gsec,gsd->egcd, a GEMM over the groups g, transposed to
                  the experts major for egcd,edf->egcf): gemm_fusion_dot.28
                  and input_transpose_fusion (bf16[8,2048,4140] and
                  bf16[60,8,69,2048], 129 MiB each) both live at
                  qwen1.5-moe-4l h100:8 4x2's prefill peak. A matmul with
                  no batch dims reads a transposed operand in place (the
                  attention output into its projection): no copy, and no
                  training corpus row moves.
  reductions      an elementwise value a GEMM reads that is made from a
  before GEMMs    reduction's result (broadcast or cast) is not taken into
                  the GEMM: XLA:GPU fuses the reduction with the values made
                  from it into one fusion (a Triton block-level fusion)
                  whose output is a buffer. The experts' combine weights
                  (models.moe.combine_weights: a sum over the k choices,
                  broadcast over the slots) are fusion.72,
                  bf16[8,2048,8,512] (128 MiB), at the peak of mixtral_mini
                  h100:8 4x2's prefill, read by the dispatch and the
                  combine GEMMs (gemm_fusion_dot.21, .26): -17.9% ->
                  -5.3%. The MoE training rows rise (#94 +0.78% ->
                  +4.15%, #128 -3.86% -> -1.33%, #48 +6.15% -> +12.65%).
  sliced from     a value all-gathered whole onto every device (X = 1: the
  the gather      TP residual gathered over Y for its norm) whose other
                  readers are elementwise (the residual adds) is read by
                  them as a slice of the gathered buffer, at the device's
                  partition id, so the gathered buffer lives to the last
                  of them and the sharded one dies at the gather: in
                  llama3_8b a100:8 1x8's prefill the residual adds
                  loop_convert_fusion.4 and .3 read all-gather-done and
                  partition-id.3.0, and both layer gathers
                  (bf16[32,2048,4096], 512 MiB each) are live at XLA's peak
                  in the MLP norm: -10.4% -> +0.5% (before the int8 stack
                  copy); the same in llama2_7b h100:8 1x8 (loop_add_fusion.5
                  and .4). With X > 1 the adds read the sharded residual
                  (llama2_7b h100:8 2x4).
"""

from __future__ import annotations

import dataclasses
import functools
import math

import jax.numpy as jnp
import numpy as np
from jax.extend import core as jcore

from models import scopes
from simulator.tracing import loops
from simulator.tracing.batch_probe import PROBE, carries_batch
from simulator.memory import xla_rules
from simulator.tracing.program import dot_result_dims, subjaxprs
from simulator.tracing.trace import fusible, layout_of, made_by_backward


def matmul_fusion_chain(eqns, readers, outs: set, gpu: bool,
                        in_loop: bool = False,
                        consumers: dict | None = None) -> set:
  """The values made inside matmuls' output fusions
  (xla_rules.matmul_fusion_chain); on a GPU only a loop's narrowed weight
  gradients (the GEMM-epilogue rule; otherwise the no-output-fusion rule),
  where no dump has shown the matmul-reductions rule (`consumers`: each
  value's readers where it applies on the TPU, None where it does not)."""
  if gpu and not in_loop:
    return set()
  return xla_rules.matmul_fusion_chain(eqns, readers, outs, in_loop,
                                       narrowed_only=gpu,
                                       consumers=None if gpu else consumers)


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
  -> -7.10% under XLA:GPU's peak). The gathered-casts rule (xla_rules,
  read off TPU dumps) finds a cast's reshard source through the same
  producers, so it does not apply on a GPU either."""
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
    first_xs = sum(loops.scan_counts(eqn))
    outer = {a: b for a, b in zip(body.invars[first_xs:],
                                  eqn.invars[first_xs:])
             if isinstance(b, jcore.Var) and b in arguments}
    for stack in _gathered_off_major(body, outer):
      shape = xla_rules.shape_of(stack.aval, local)
      if carries_batch(shape):  # a pipeline's stacked activations: no weight
        continue
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
      before, after = (layout_of(v.aval) for v in (eqn.invars[0],
                                                    eqn.outvars[0]))
      if any(set(a) - set(b) for a, b in list(zip(before, after))[1:]):
        found.add(slices[ins[0]])
    elif name not in ("scan", "while"):  # another loop's slices are its own
      for sub in (s for _, s in subjaxprs(eqn)):
        if len(sub.invars) == len(eqn.invars):
          found |= _gathered_off_major(sub, {
              a: slices[b] for a, b in zip(sub.invars, eqn.invars)
              if isinstance(b, jcore.Var) and b in slices})
  return found


def host_operands_in_place(eqns, readers, gpu: bool) -> set:
  """The host-operands-in-place rule: the values fetched from host memory
  that only elementwise ops read (through views), which a GPU's fusions
  read where they lie; empty off a GPU."""
  if not gpu:
    return set()
  return {v for e in eqns if xla_rules.fetches_host_value(e)
          for v in e.outvars
          if all(fusible(r) for r in readers(v))}


# What an inlined call's body may hold beside elementwise ops (broadcasts and
# iotas among them) and views (the inlined-calls rule): a gather, which
# XLA:GPU fuses with the index arithmetic that makes its indices.
_INLINED_OPS = {"gather"}


def inlined_calls(eqns, readers, outs: set, gpu: bool) -> set:
  """The inlined-calls rule: ids of the call equations among `eqns` whose
  body XLA:GPU computes inside its results' readers (`readers(v)`: through
  views; `outs`: the jaxpr's outputs, written whole); empty off a GPU."""
  if not gpu:
    return set()
  found = set()
  for e in eqns:
    if e.primitive.name not in ("shard_map", "jit", "pjit", "closed_call"):
      continue
    bodies = [b for _, b in subjaxprs(e)]
    if not bodies or not all(
        fusible(b) or xla_rules.is_view(b) or b.primitive.name in _INLINED_OPS
        for body in bodies for b in body.eqns):
      continue
    if all(v not in outs and (rs := list(readers(v)))
           and all(map(xla_rules.absorbs, rs)) for v in e.outvars):
      found.add(id(e))
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


def orders(simulated: tuple[str, ...], one_device: bool,
           sms: "Sms | None" = None, serving: bool = False
           ) -> tuple[str, ...]:
  """The schedules of the step's own weight gradients simulated on a GPU:
  all of `simulated`, or on one device all but the deferred one (the one-
  device-order rule) and the late one (no collective to be late; the
  eager-update rule instead); where XLA:GPU's latency-hiding scheduler
  does not run (`sms` older than Hopper), the deferred one and the memory
  scheduler's two placements of the loops' zero-filled outputs, the traced
  one and "memory" (the memory-scheduler-order rule), not the late one;
  for a serving step (`serving`) "memory" on every GPU."""
  if sms is not None and not sms.latency_hiding:
    simulated = tuple(o for o in ("deferred", "traced")
                      if o in simulated) + ("memory",)
  elif serving:
    simulated += ("memory",)
  return tuple(o for o in simulated
               if not (one_device and o in ("deferred", "late")))


def _state_only(jaxpr) -> set:
  """The step's values its batch does not reach: made from the parameters,
  the optimizer's state and literals alone (a dequantized moment, the
  step count's scalars), at any position in the step."""
  found = {v for v in (*jaxpr.invars, *jaxpr.constvars)
           if not carries_batch(v.aval.shape)}
  for e in jaxpr.eqns:
    if all(v in found for v in e.invars if isinstance(v, jcore.Var)):
      found.update(e.outvars)
  return found


def eager_updates(jaxpr):
  """`jaxpr` (the step's own) with the optimizer's update of each parameter
  whose gradient a matmul outside the loops makes (the output
  projection's), what is made from that gradient and the step's state
  alone, moved to just after that matmul; what the state alone makes (the
  step count's scalars) runs before them where they read it (the
  eager-update rule, one GPU). Itself when nothing moves."""
  eqns = jaxpr.eqns
  free = _state_only(jaxpr)
  producer: dict = {}
  anchor: dict = {}  # a value made from a gradient -> its matmul's index
  moved: dict[int, int] = {}  # equation -> the matmul it runs after
  for i, e in enumerate(eqns):
    reads = [v for v in e.invars if isinstance(v, jcore.Var)]
    producer.update((v, i) for v in e.outvars)
    if xla_rules.matmul_kind_of(e) == "weight_grad":
      anchor.update((v, i) for v in e.outvars)
    elif any(v in anchor for v in reads) and all(
        v in anchor or v in free for v in reads) and not xla_rules.is_loop(e):
      moved[i] = max(anchor[v] for v in reads if v in anchor)
      anchor.update((v, moved[i]) for v in e.outvars)
  if not moved:
    return jaxpr
  first = min(moved.values())
  needed: set = set()
  stack = [v for k in moved for v in eqns[k].invars
           if isinstance(v, jcore.Var) and v in free]
  while stack:  # the state-only values they read, made after `first`
    k = producer.get(stack.pop())
    if k is not None and k > first and k not in needed:
      needed.add(k)
      stack += [v for v in eqns[k].invars if isinstance(v, jcore.Var)]
  after: dict[int, list[int]] = {}
  for k in sorted(needed | set(moved)):
    after.setdefault(moved.get(k, first), []).append(k)
  order = [k for i in range(len(eqns)) if i not in moved and i not in needed
           for k in (i, *after.get(i, ()))]
  if order == list(range(len(eqns))):
    return jaxpr  # each already where its gradient is made
  return jaxpr.replace(eqns=[eqns[k] for k in order])


def leaf_by_leaf(jaxpr):
  """`jaxpr` (the step's own) with what runs after its last loop regrouped
  by the values made before it that each equation depends on (a
  parameter's gradient): one group whole after another, those depending on
  no such value first, then each gradient's in the order the program first
  meets it, then those depending on several; an equation the parameters
  and state alone make runs in its readers' group where they are all in
  one (the leaf-by-leaf update rule). Itself when nothing moves."""
  eqns = jaxpr.eqns
  loops_at = [i for i, e in enumerate(eqns) if xla_rules.is_loop(e)]
  if not loops_at:
    return jaxpr
  start = loops_at[-1] + 1
  before = {v for e in eqns[:start] for v in e.outvars} - _state_only(jaxpr)
  deps: dict = {}
  key: dict[int, frozenset] = {}
  readers: dict = {}
  for i in range(start, len(eqns)):
    found: set = set()
    for v in eqns[i].invars:
      if isinstance(v, jcore.Var):
        readers.setdefault(v, []).append(i)
        found |= {v} if v in before else deps.get(v, frozenset())
    key[i] = frozenset(found)
    deps.update((v, key[i]) for v in eqns[i].outvars)
  for i in range(len(eqns) - 1, start - 1, -1):
    if not key[i]:
      theirs = {key[k] for v in eqns[i].outvars for k in readers.get(v, ())}
      if len(theirs) == 1:
        key[i] = theirs.pop()
  first: dict = {}
  for i in range(start, len(eqns)):
    first.setdefault(key[i], i)
  tail = sorted(range(start, len(eqns)),
                key=lambda i: (min(len(key[i]), 2), first[key[i]], i))
  if tail == list(range(start, len(eqns))):
    return jaxpr
  return jaxpr.replace(eqns=[*eqns[:start], *(eqns[i] for i in tail)])


def early_loop_outputs(jaxpr, size: dict) -> dict:
  """The memory-scheduler-order rule's buffers, as weight stacks are kept
  ({(value, dtype, "early"): (0, last index before its loop, bytes)}): the
  stacked outputs of each of `jaxpr`'s loops, zero-filled at the step's
  start and live from there to their loop, which holds them from then on."""
  out = {}
  for i, eqn in enumerate(jaxpr.eqns):
    if eqn.primitive.name != "scan" or i == 0:
      continue
    for v in eqn.outvars[loops.scan_counts(eqn)[1]:]:
      if size.get(v, (0, 0)) != (0, 0):
        out[(v, np.dtype(v.aval.dtype), "early")] = (0, i - 1, size[v])
  return out


def early_scatter_fills(jaxpr) -> dict:
  """The early-scatter-fill rule's buffers, as weight stacks are kept
  ({(fill, dtype, "fill" if its aval is per device else "early"): (the
  backward pass's first index, last index before its call, bytes)}): the
  zero fill each of `jaxpr`'s calls scatter-adds into (the embedding's
  gradient), made when the backward pass starts."""
  first = next((i for i, e in enumerate(jaxpr.eqns) if made_by_backward(e)),
               len(jaxpr.eqns))
  out = {}
  for i, eqn in enumerate(jaxpr.eqns[first + 1:], first + 1):
    if xla_rules.is_loop(eqn):
      continue
    for fill, local in _scattered_fills(eqn, False):
      shape = xla_rules.shape_of(fill.aval, local)
      nbytes = math.prod(shape) * fill.aval.dtype.itemsize
      out[(fill, np.dtype(fill.aval.dtype), "fill" if local else "early")
          ] = (first, i - 1, (nbytes, 0))
  return out


def second_layouts(eqns, size: dict, local: bool) -> dict:
  """The second-layout rule's buffers (module docstring), as weight stacks
  are kept: {(value, dtype, "layout"): (the index that makes it, its last
  matmul, bytes)} for each value with a buffer that one matmul contracts
  over two or more dims of more than one element on a device and another
  keeps as rows that its result, read only through a transpose, holds in
  another order."""
  made = {v: i for i, e in enumerate(eqns) for v in e.outvars}
  readers: dict = {}
  for eqn in eqns:
    for v in eqn.invars:
      if isinstance(v, jcore.Var):
        readers.setdefault(v, []).append(eqn)
  reads: dict = {}  # value -> [(matmul index, contracted, row -> place)]
  for i, eqn in enumerate(eqns):
    if eqn.primitive.name != "dot_general":
      continue
    contracting, batch = eqn.params["dimension_numbers"]
    after = readers.get(eqn.outvars[0], [])
    perm = (list(after[0].params["permutation"]) if len(after) == 1
            and after[0].primitive.name == "transpose" else None)
    for side, (var, dims) in enumerate(zip(eqn.invars[:2],
                                           dot_result_dims(eqn))):
      if not isinstance(var, jcore.Var) or size.get(var, (0, 0)) == (0, 0):
        continue
      shape = xla_rules.shape_of(var.aval, local)
      place = {d: o if perm is None else perm.index(o)  # rows only
               for d, o in dims.items() if d not in batch[side]}
      reads.setdefault(var, []).append(
          (i, [d for d in contracting[side] if shape[d] > 1], place))
  found = {}
  for var, uses in reads.items():
    for i, group, _ in uses:
      if len(group) >= 2 and any(
          j != i and set(group) <= set(place)
          and sorted(group) != sorted(group, key=place.get)
          for j, _, place in uses):
        found[(var, np.dtype(var.aval.dtype), "layout")] = (
            made[var], max(j for j, _, _ in uses), size[var])
        break
  return found


def reduced_for_matmuls(eqn, readers, producer: dict) -> bool:
  """The reductions-before-GEMMs rule (module docstring): `eqn` makes an
  elementwise value that a matmul reads (`readers`: its readers through
  views) from a reduction's result, broadcast or cast (through views)."""
  if not (fusible(eqn) and any(c.primitive.name == "dot_general"
                               for c in readers)):
    return False
  for u in eqn.invars:
    made = producer.get(u) if isinstance(u, jcore.Var) else None
    while made is not None and (
        xla_rules.is_view(made) or made.primitive.name in (
            "broadcast_in_dim", "convert_element_type")):
      u = made.invars[0]
      made = producer.get(u) if isinstance(u, jcore.Var) else None
    if made is not None and made.primitive.name.startswith("reduce_"):
      return True
  return False


def slices_passed(eqn, subs: list, arguments, slices: frozenset) -> dict:
  """{id(body): its inputs that are one layer's slice of a stacked step
  argument} for the bodies `subs` that `eqn` runs: a scan's per-iteration
  slices of the step's `arguments` (a top-level loop's), and a call's
  inputs that are such slices in its caller (`slices`)."""
  if eqn.primitive.name == "scan":
    first = sum(loops.scan_counts(eqn))
    marked = {b for b, o in zip(subs[0].invars[first:], eqn.invars[first:])
              if isinstance(o, jcore.Var) and o in set(arguments)}
    return {id(subs[0]): frozenset(marked)} if marked else {}
  if not slices or xla_rules.is_loop(eqn):
    return {}
  return {id(sub): frozenset(b for b, o in zip(sub.invars, eqn.invars)
                             if isinstance(o, jcore.Var) and o in slices)
          for sub in subs if len(sub.invars) == len(eqn.invars)}


def copied_weight_slices(eqns, slices, local: bool) -> dict:
  """The copied-weight-slices rule's buffers (module docstring), as weight
  stacks are kept: {(slice, dtype, "slice"): (0, last index, bytes)} for
  each layer's slice of a weight (`slices`, the body's inputs; a KV
  cache's, which carries the batch, left out) a matmul reads with no cast
  between (through views), live from the body's start to its last
  matmul."""
  consumers: dict = {}
  for i, eqn in enumerate(eqns):
    for v in eqn.invars:
      if isinstance(v, jcore.Var):
        consumers.setdefault(v, []).append(i)

  def matmuls(v) -> list:  # their indices, through views
    out = []
    for i in consumers.get(v, ()):
      if xla_rules.is_view(eqns[i]):
        out += [m for w in eqns[i].outvars for m in matmuls(w)]
      elif eqns[i].primitive.name == "dot_general":
        out.append(i)
    return out

  found = {}
  for v in slices:
    reads = matmuls(v)
    shape = xla_rules.shape_of(v.aval, local)
    if not reads or carries_batch(shape):  # a weight's, not a cache's
      continue
    found[(v, np.dtype(v.aval.dtype), "slice")] = (
        0, max(reads), (math.prod(shape) * np.dtype(v.aval.dtype).itemsize,
                        0))
  return found


def read_from_gathered(eqns, consumers: dict) -> dict:
  """The sliced-from-the-gather rule (module docstring): {source: (index,
  gathered)} for each reshard at `index` that all-gathers `source` into a
  value whole on every device (no mesh axis of more than one device left
  in its layout), an activation (a weight's FSDP gather is not), where
  every other reader of `source` is elementwise (the
  residual adds): those read their slice of the gathered value, which
  lives to the last of them, and `source` dies at the gather."""
  out = {}
  for i, eqn in enumerate(eqns):
    if eqn.primitive.name != "reshard" or not isinstance(eqn.invars[0],
                                                          jcore.Var):
      continue
    source, gathered = eqn.invars[0], eqn.outvars[0]
    if (any(layout_of(gathered.aval)) or not any(layout_of(source.aval))
        or not carries_batch(source.aval.shape)):  # an activation
      continue
    others = [c for c in consumers.get(source, ()) if c is not eqn]
    if others and all(xla_rules.elementwise(c) for c in others):
      out[source] = (i, gathered)
  return out


def relaid_gemm_result(eqn, producer: dict, local: bool, readers) -> bool:
  """The relaid-GEMM-results rule (module docstring): `eqn` transposes a
  matmul's result so that a batch dim of more than one element is no
  longer among its major-most dims (a GEMM writes its batch dims major),
  and a matmul with batch dims of its own reads it (`readers`, through
  views), which needs those major in its operand: a copy of its own."""
  if eqn.primitive.name != "transpose" or not any(
      c.primitive.name == "dot_general"
      and c.params["dimension_numbers"][1][0] for c in readers):
    return False
  made = producer.get(eqn.invars[0])
  if made is None or made.primitive.name != "dot_general":
    return False
  batch = len(made.params["dimension_numbers"][1][0])
  shape = xla_rules.shape_of(eqn.invars[0].aval, local)
  kept = [d for d in eqn.params["permutation"] if shape[d] > 1]
  wide = {d for d in range(batch) if shape[d] > 1}
  return set(kept[:len(wide)]) != wide


def relaid_cache_stacks(jaxpr, donated, local: bool, early: bool) -> dict:
  """The relaid-cache-stack rule's buffer (module docstring), as weight
  stacks are kept: {(stack, dtype, "relaid"): (the loop's index, or 0
  where `early` (the memory-scheduler-order rule's schedule, which makes
  the copy of an argument at the step's start, as it makes a zero fill),
  the loop's index, bytes)} for the largest stacked argument a top-level
  loop of a serving step reads that has the aval of a cache leaf (an
  output written into a donated argument: `donated`, the step's outputs
  returned into them) and that the loop reads only (a cross-attention
  cache at a decode step) or whose slice, or the value written into it, a
  matmul reads that is not a matrix-vector product (`_cache_matmuls`); a
  stack the loop overwrites whole it does not read
  (xla_rules.overwritten_argument)."""
  cache = {(v.aval.shape, v.aval.dtype) for v in donated
           if isinstance(v, jcore.Var)}
  arguments = set(jaxpr.invars)
  found = {}
  for i, eqn in enumerate(jaxpr.eqns):
    if eqn.primitive.name != "scan":
      continue
    first_xs = sum(loops.scan_counts(eqn))
    written = {xla_rules.overwritten_argument(eqn, v)
               for v in eqn.outvars[loops.scan_counts(eqn)[1]:]}
    body = next(subjaxprs(eqn))[1]
    sized = []
    for b, v in zip(body.invars[first_xs:], eqn.invars[first_xs:]):
      if not (isinstance(v, jcore.Var) and v in arguments
              and v not in written
              and (v.aval.shape, v.aval.dtype) in cache):
        continue
      updated, matmuls = _cache_matmuls(body, b)
      if updated and all(map(_matrix_vector, matmuls)):
        continue
      shape = xla_rules.shape_of(v.aval, local)
      sized.append((math.prod(shape) * np.dtype(v.aval.dtype).itemsize,
                    shape, v))
    if sized:
      n, shape, v = max(sized, key=lambda x: x[0])
      found[(v, np.dtype(v.aval.dtype), "relaid")] = (
          0 if early else i, i, (0, n) if carries_batch(shape) else (n, 0))
  return found


def _cache_matmuls(body, stack_slice) -> tuple[bool, list]:
  """(whether the loop updates the slice, the matmuls that read it or the
  value written into it, or what that is made from up to a matmul): what
  reads them is followed through every op but a matmul, into the calls and
  loops it makes, by position."""
  tainted = {stack_slice}
  updated = False
  matmuls = []

  def walk(jaxpr) -> None:
    nonlocal updated
    producer = {v: e for e in jaxpr.eqns for v in e.outvars}
    for eqn in jaxpr.eqns:
      ins = [v for v in eqn.invars if isinstance(v, jcore.Var)]
      if eqn.primitive.name == "dynamic_update_slice" and (
          eqn.invars[0] in tainted):
        updated = True
        # the value written into it and what that is made from (an int8
        # cache's quantized k from the bf16 k), up to the matmuls
        todo = [eqn.invars[1]]
        while todo:
          v = todo.pop()
          if isinstance(v, jcore.Var) and v not in tainted:
            tainted.add(v)
            made = producer.get(v)
            if made is not None and made.primitive.name != "dot_general":
              todo += made.invars
      if not any(v in tainted for v in ins):
        continue
      if eqn.primitive.name == "dot_general":
        matmuls.append(eqn)
        continue
      for _, sub in subjaxprs(eqn):
        if len(sub.invars) == len(eqn.invars):
          tainted.update(b for b, o in zip(sub.invars, eqn.invars)
                         if isinstance(o, jcore.Var) and o in tainted)
          walk(sub)
      tainted.update(eqn.outvars)

  walk(body)
  # the value written may be made before the slice is read: once more
  walk(body)
  return updated, list({id(e): e for e in matmuls}.values())


def _matrix_vector(eqn) -> bool:
  """A matmul one of whose operands keeps no dim of more than one element
  (one query per kv head at a decode step): XLA's algebraic simplifier
  makes it a multiply and a reduction, no GEMM."""
  (contract_l, contract_r), (batch_l, batch_r) = eqn.params[
      "dimension_numbers"]
  return any(all(d in contract or d in batch or n == 1
                 for d, n in enumerate(v.aval.shape))
             for v, contract, batch in ((eqn.invars[0], contract_l, batch_l),
                                        (eqn.invars[1], contract_r, batch_r)))


def _scattered_fills(eqn, local: bool) -> list[tuple]:
  """(value, whether its aval is per device) of each zero fill (a
  broadcast of a literal) a call's bodies scatter-add into, through views,
  not inside loops."""
  found = []
  for sub, sub_local, _ in xla_rules.calls(eqn, local):
    made = {v: e for e in sub.eqns for v in e.outvars}
    for e in sub.eqns:
      if e.primitive.name == "scatter-add":
        v = e.invars[0]
        while (isinstance(v, jcore.Var) and v in made
               and (xla_rules.is_view(made[v])
                    or made[v].primitive.name == "pvary")):
          v = made[v].invars[0]
        fill = made.get(v) if isinstance(v, jcore.Var) else None
        if (fill is not None and fill.primitive.name == "broadcast_in_dim"
            and not any(isinstance(u, jcore.Var) for u in fill.invars)):
          found.append((v, sub_local))
      elif not xla_rules.is_loop(e):
        found += _scattered_fills(e, sub_local)
  return found


def cublas_logits(eqns) -> tuple[set, set]:
  """The cuBLAS-logits rule's values: the logits (the forward loss's
  activation matmul outputs) and their gradients (what the backward loss's
  matmuls read of the logits' shape, through views): in the autotuned
  schedule each gradient is a buffer of its own, not written over the
  logits."""
  def loss_matmuls(backward: bool):
    return [e for e in eqns if e.primitive.name == "dot_general"
            and scopes.LOSS in scopes.scopes_of(e.source_info.name_stack)
            and made_by_backward(e) == backward]

  logits = {v for e in loss_matmuls(False) if xla_rules.activation_matmul(e)
            for v in e.outvars}
  shapes = {v.aval.shape for v in logits}
  producer = {v: e for e in eqns for v in e.outvars}
  grads = set()
  for e in loss_matmuls(True):
    for u in e.invars:
      while (isinstance(u, jcore.Var) and u in producer
             and xla_rules.is_view(producer[u])):
        u = producer[u].invars[0]
      if isinstance(u, jcore.Var) and u.aval.shape in shapes:
        grads.add(u)
  return logits, grads - logits


def weight_gradient_reduction(eqn) -> bool:
  """A backward reduce_sum that sums the batch away: the weight gradient of
  a norm's scale (or a bias)."""
  return (eqn.primitive.name == "reduce_sum"
          and made_by_backward(eqn)
          and carries_batch(eqn.invars[0].aval.shape)
          and not carries_batch(eqn.outvars[0].aval.shape))


def defer_step_weight_grads(jaxpr, results: tuple = ()):
  """The step's own jaxpr in the deferred order on a GPU: its weight-
  gradient matmuls and reductions, and what is made from them alone, as
  late as their readers allow (the deferred-scale-gradients rule), and a
  loop only the outputs `results` need last (the sunk-loss rule)."""
  return xla_rules.defer_weight_grads(jaxpr, also=weight_gradient_reduction,
                                      results=results)



# --------------------------------------------------------------------------
# Split K (XLA's SplitkRewriter cost model, splitk_rewriter.cc).
# --------------------------------------------------------------------------

_SPLITS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048)
_TILE = 128  # kMTileSize = kNTileSize
_ACC_BYTES = 4  # GetGemmAccumulatorType: f32 for f32, bf16 and f16 GEMMs


@dataclasses.dataclass(frozen=True)
class Sms:
  """A GPU as XLA's split-K cost model sees it (meshes.gpu_target)."""

  cores: int  # SMs: DeviceDescription::core_count
  major: int  # CUDA compute capability major

  @property
  def latency_hiding(self) -> bool:
    """Whether XLA:GPU (the CUDA plugin 0.10.2) runs its latency-hiding
    scheduler for this GPU: for Hopper (sm_90) and later, not for the A100
    (the memory-scheduler-order rule)."""
    return self.major >= 9

  def weights(self) -> tuple[float, float, float, float]:
    """GetCostWeights: compute, memory, reduction memory, reduction launch."""
    if self.major >= 10:  # Blackwell
      return (100.0, 0.0848863, 189.711, 1.21563e+08)
    if self.major >= 9:  # Hopper
      return (100.0, 0.194136, 193.1384, 4.36e+07)
    return (100.0, 0.0666955, 467.815, 5.65307e+07)


def split_cost(dims: tuple[int, int, int, int], bits: tuple[int, int, int],
               split: int, sms: Sms) -> float:
  """EstimateGemmCostAfterSplitK for a [b, m, k] x [b, k, n] matmul with
  operand and result element bits `bits` (lhs, rhs, out)."""
  b, m, n, k = dims
  lhs, rhs, out = bits
  compute_w, memory_w, reduce_w, launch = sms.weights()
  batch = b * split
  mt, nt = min(m, _TILE), min(n, _TILE)
  tiles = batch * -(-m // _TILE) * -(-n // _TILE)
  waves = max(1.0, tiles / (sms.cores * _TILE * _TILE / (mt * nt)))
  compute = 2.0 * mt * nt * -(-k // split) * waves * compute_w
  written = m * n * batch * (_ACC_BYTES * 8 if split > 1 else out) / 8
  memory = (m * k * b * lhs / 8 + n * k * b * rhs / 8 + written) * memory_w
  cost = max(compute, memory)
  if split == 1:
    return cost
  reduction = (batch * m * n * _ACC_BYTES + b * m * n * out / 8) * reduce_w
  return cost + launch + reduction


@functools.lru_cache(maxsize=4096)
def choose_split(dims: tuple[int, int, int, int], bits: tuple[int, int, int],
                 sms: Sms) -> int:
  """ChooseSplitK: the cheapest split (the first of equal costs)."""
  costs = [split_cost(dims, bits, s, sms) for s in _SPLITS]
  return _SPLITS[costs.index(min(costs))]


def padded_k(k: int, split: int, bits: tuple[int, int, int]) -> int:
  """GetPaddedK: K rounded up to a multiple of split x 16 bytes of the
  narrower operand."""
  step = split * 128 // min(128, bits[0], bits[1])
  return -(-k // step) * step


@dataclasses.dataclass(frozen=True)
class SplitMatmul:
  """One matmul as the split-K rule reads it, at the traced batch: its
  bytes beyond its result depend on the split, which depends on the batch
  (M or K carries it), so they are evaluated at each batch (`extra`)."""

  dims: tuple[int, int, int, int]  # b, m, n, k per device (probe batch)
  bits: tuple[int, int, int]  # lhs, rhs (before their casts), result
  operand_bytes: int  # itemsize of the operands as the GEMM reads them
  result: tuple[int, int]  # the result's buffer (fixed, linear)
  dying: tuple[tuple[int, int], ...]  # buffers only the matmul still reads
  sms: Sms
  label = "split-K partials and padded operands (net)"
  dtype = "float32"  # the partials' (the padded operands are the GEMM's)

  def split_at(self, num: int, den: int) -> tuple[tuple[int, ...], int]:
    """(b, m, n, k) at batch scale num/den and the split XLA picks."""
    dims = tuple(d * num // den if d % PROBE == 0 else d for d in self.dims)
    return dims, choose_split(dims, self.bits, self.sms)

  def extra(self, num: int, den: int) -> int:
    """Bytes live at the matmul beyond its result: the padded operand
    copies while they are made, each dying buffer live until its own copy
    is written (a pad fusion reads its source while it writes; the largest
    last: #72's peak is at loop_pad_fusion.1, the bf16 output weight
    beside its f32 padded copy and the padded d(logits)), then the f32
    partials beside the copies while the GEMM runs, the result beside the
    partials while the reduce runs."""
    (b, m, n, k), split = self.split_at(num, den)
    if split == 1:
      return 0
    partials = split * b * m * n * _ACC_BYTES
    padded = padded_k(k, split, self.bits)
    if padded == k:
      return partials
    at = lambda x: x[0] + x[1] * num // den
    pads = (b * m + b * n) * padded * self.operand_bytes
    dying = [at(d) for d in self.dying]
    held = pads - sum(dying)
    return max(held + max(dying, default=0), held + partials,
               partials + at(self.result)) - at(self.result)


def _bits_before_casts(v, producer: dict) -> int:
  """An operand's element bits through the one-input elementwise ops that
  make it (GetDotDimensions' get_side_size: what the GEMM fuses in) and
  its transposes (XLA's TransposeFolding takes them into the dot first)."""
  while True:
    eqn = producer.get(v)
    ins = [u for u in eqn.invars if isinstance(u, jcore.Var)] if eqn else []
    if not (eqn and len(eqn.invars) == 1 and ins and (
        xla_rules.elementwise(eqn) or eqn.primitive.name == "transpose")):
      return np.dtype(v.aval.dtype).itemsize * 8
    v = ins[0]


def split_matmul(eqn, local: bool, producer: dict, result: tuple[int, int],
                 dying: tuple[tuple[int, int], ...], sms: Sms
                 ) -> SplitMatmul | None:
  """The split-K rule's view of a dot_general (None: no GEMM the rewriter
  splits: an integer matmul (it skips s32), or a batch of vector dot
  products, which XLA makes a multiply and a reduce: the flash backward's
  row sums bskgh,bskgh->bkgs are no dot in any corpus dump)."""
  lhs, rhs = eqn.invars
  if not all(jnp.issubdtype(v.aval.dtype, jnp.floating) for v in (lhs, rhs)):
    return None
  (lc, _), (lb, _) = eqn.params["dimension_numbers"]
  ls, rs = xla_rules.shape_of(lhs.aval, local), xla_rules.shape_of(rhs.aval,
                                                                   local)
  b = math.prod(ls[d] for d in lb)
  k = math.prod(ls[d] for d in lc)
  m, n = math.prod(ls) // (b * k), math.prod(rs) // (b * k)
  if m == 1 and n == 1:
    return None
  out = np.dtype(eqn.outvars[0].aval.dtype).itemsize * 8
  bits = (_bits_before_casts(lhs, producer), _bits_before_casts(rhs, producer),
          out)
  width = max(np.dtype(v.aval.dtype).itemsize for v in (lhs, rhs))
  return SplitMatmul((b, m, n, k), bits, width, result, dying, sms)
