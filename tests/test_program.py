"""simulator.tracing.program: which values depend on the data (a loop's
carry fixpoint), and the data-only walk the fixpoint runs, which must find
what the full walk finds."""

import collections
import dataclasses

import jax
import jax.numpy as jnp

from meshes.layout import abstract_mesh, plan_mesh
from meshes.topology import parse_topology
from models.presets import PRESETS
from simulator.settings import TrainSettings
from simulator.tracing import program
from simulator.tracing.batch_probe import carries_batch
from simulator.tracing.trace import trace, trace_probe

_CTX = dict(mult=1, layer=None, phase="optimizer", depth=0, prefix="")


def _data_flags(fn, *args, data: tuple[bool, ...]) -> list[bool]:
  """Which outputs of fn's program depend on the inputs flagged `data`."""
  jaxpr = jax.make_jaxpr(fn)(*args).jaxpr
  outs, _ = program._Walker({}).walk(jaxpr, list(data), _CTX)
  return outs


def _chain(a, b, xs):
  """A loop whose carry a takes each data slice and b takes a: b depends on
  the data only from the second iteration (the fixpoint's second pass)."""
  def body(carry, x):
    a, b = carry
    return (x, a), b
  return jax.lax.scan(body, (a, b), xs)


def test_a_carry_reached_in_the_second_pass_depends_on_the_data():
  a, b, xs = jnp.zeros(4), jnp.zeros(4), jnp.ones((3, 4))
  assert _data_flags(_chain, a, b, xs, data=(False, False, True)) == [
      True, True, True]


def test_a_loop_over_no_data_has_no_data_outputs():
  a, b, xs = jnp.zeros(4), jnp.zeros(4), jnp.ones((3, 4))
  assert _data_flags(_chain, a, b, xs, data=(False, False, False)) == [
      False, False, False]


def test_a_carry_of_data_stays_data_whatever_the_body_does():
  """Every carry flagged already: no pass can change them."""
  a, b, xs = jnp.zeros(4), jnp.zeros(4), jnp.ones((3, 4))
  assert _data_flags(_chain, a, b, xs, data=(True, True, False)) == [
      False, True, True]


def test_the_data_only_walk_finds_what_the_full_walk_finds():
  """On a traced step (its layer loop, flash attention's loops, the loss):
  the same data flags and pending partial sums' absence, and nothing
  recorded."""
  topo = parse_topology("v5p-8")
  plan = plan_mesh(topo, 2, 2)
  settings = TrainSettings(batch=2, seq=128, remat="full", shard="zero3")
  traced = trace_probe(PRESETS["tiny"], settings, abstract_mesh(plan))
  jaxpr = traced.jaxpr.jaxpr
  n_data = len(jax.tree.leaves(traced.step.batch))
  flags = [i >= len(jaxpr.invars) - n_data for i in range(len(jaxpr.invars))]
  sizes = {"X": 2, "Y": 2}
  full = program._Walker(sizes)
  data_only = program._Walker(sizes, record=False)
  full_outs, _ = full.walk(jaxpr, flags, _CTX)
  outs, pending = data_only.walk(jaxpr, flags, _CTX)
  assert outs == full_outs and any(outs) and not all(outs)
  assert not any(pending)
  assert (data_only.collectives, data_only.dots, data_only.traffic) == (
      [], [], [])
  assert full.collectives and full.dots and full.traffic


def test_a_chunked_losss_weight_gradient_is_reduced_once_after_its_loop():
  """XLA's while-loop all-reduce code motion: the output projection's
  weight gradient, partial over X in each chunk and added into the loss
  loop's carry, is all-reduced once after the loop (corpus #82, #264), not
  once per chunk."""
  plan = plan_mesh(parse_topology("v5p-8"), 4, 1)
  settings = TrainSettings(batch=4, seq=128, remat="full", shard="zero3",
                           loss_chunks=4)
  read = program.read_traced(trace_probe(PRESETS["tiny"], settings,
                                         abstract_mesh(plan)))
  grads = [c for c in read.collectives if c.source.endswith("bsd,dv->bsv")]
  assert [(c.kind, c.axis, c.count) for c in grads] == [("all-reduce", "X", 1)]
  cfg = PRESETS["tiny"]
  assert grads[0].bytes_per_device == cfg.d_model * cfg.vocab_size * 4


def test_t5s_relative_bias_gradient_is_reduced_once_after_its_stack():
  """The relative position bias map, shared by a stack's layers: its
  gradient, summed over the batch (partial over X) and broadcast back to
  its [heads, 1, q, k] carry in each layer's backward, is all-reduced once
  after the loop (corpus #74: XLA's all-reduce.70 in the step holds
  f32[6,1,1024,1024], not one per layer)."""
  plan = plan_mesh(parse_topology("v5p-8"), 4, 1)
  settings = TrainSettings(batch=4, seq=64, remat="full", shard="zero3",
                           attention="materialized")
  cfg = PRESETS["tiny_t5"]
  read = program.read_traced(trace_probe(cfg, settings, abstract_mesh(plan)))
  bias = [(c.source, c.count, c.shape) for c in read.collectives
          if c.kind == "all-reduce" and c.source.endswith("/attn")]
  assert sorted(bias) == [("decoder/attn", 1, (cfg.n_heads, 1, 64, 64)),
                          ("encoder/attn", 1, (cfg.n_heads, 1, 64, 64))]


def test_a_tied_table_is_gathered_once_in_a_scope_and_an_inlined_loop():
  """XLA's CSE in one computation: the tied embedding table, cast to bf16
  and gathered over X for the lookup and for the output projection, is one
  all-gather (corpus #0), and the second micro-batch of --grad_accum=2,
  whose one-trip loop XLA inlines, gathers it no more (#169)."""
  cfg = dataclasses.replace(PRESETS["tiny"], tie_embeddings=True)
  plan = plan_mesh(parse_topology("v5p-8"), 4, 1)
  for accum in (1, 2):
    settings = TrainSettings(batch=8, seq=64, remat="full", shard="zero3",
                             grad_accum=accum)
    read = program.read_traced(trace_probe(cfg, settings,
                                           abstract_mesh(plan)))
    table = [c for c in read.collectives if c.kind == "all-gather"
             and c.shape == (cfg.vocab_size, cfg.d_model)]
    assert [(c.axis, c.count) for c in table] == [("X", 1)], accum
  # XLA:GPU gathers it for each use (GPU corpus #0, exact this way).
  gpu = program.read_traced(trace_probe(cfg, TrainSettings(
      batch=8, seq=64, remat="full", shard="zero3"), abstract_mesh(plan)),
                            gpu=True)
  assert [c.count for c in gpu.collectives if c.kind == "all-gather"
          and c.shape == (cfg.vocab_size, cfg.d_model)] == [1, 1]


def test_heads_split_over_replicated_kv_heads_move_between_devices():
  """8 query heads over Y = 4 split into 2 kv heads x 4 query heads per kv
  head, sharded over Y on the latter: each device's heads are not its own
  after the reshape, an all-to-all and a collective-permute of its bytes
  (corpus #126, GPU #48); with Y = 2 dividing the kv heads nothing moves."""
  cfg = dataclasses.replace(PRESETS["tiny"], n_heads=8, n_kv_heads=2)
  settings = TrainSettings(batch=8, seq=64, remat="none", shard="zero3")

  def moved(x, y):
    plan = plan_mesh(parse_topology("v5p-16"), x, y)
    read = program.read_traced(trace(cfg, settings, abstract_mesh(plan)))
    return [(c.kind, c.axis, c.bytes_per_device) for c in read.collectives
            if c.source.endswith("attn") and c.kind in ("all-to-all",
                                                        "permute")]

  local = 8 // 2 * 64 * (8 // 4) * cfg.head_dim * 2  # b, s, heads, bf16
  # forward: the heads split and merged back; backward: their transposes
  assert moved(2, 4) == [("all-to-all", "Y", local), ("permute", "Y", local)] * 4
  assert moved(4, 2) == []


def test_the_encoder_outputs_gradient_leaves_the_decoder_loop_on_a_gpu():
  """The cross-attention's k and v input gradients, partial over Y and
  summed in each decoder layer's backward into the encoder output's
  gradient: libtpu all-reduces that sum in the loop, once a layer (corpus
  #245), XLA:GPU once after it (GPU corpus #38: all-reduce-start.10 of
  bf16[8,512,1024] over Y in the entry computation)."""
  cfg = PRESETS["tiny_t5"]
  settings = TrainSettings(batch=8, seq=64, remat="full", shard="zero3")

  def counts(topology):
    plan = plan_mesh(parse_topology(topology), 2, 2)
    read = program.read_traced(trace_probe(cfg, settings, abstract_mesh(plan)),
                               gpu=topology.startswith("h100"))
    return sorted(c.count for c in read.made() if c.kind == "all-reduce"
                  and c.axis == "Y" and "cross_attn/v/" in c.source)
  layers = cfg.n_layers  # the decoder's
  assert counts("v5p-8") == [layers]
  assert counts("h100:4") == [1]


def test_on_a_gpu_a_gather_made_inside_a_group_is_the_matmuls_own():
  """A layer's output gradient, sharded over Y, read by its input gradient
  and its weight gradient. On a TPU one gather (CSE). On a GPU the SPMD
  partitioner groups the input gradient's devices on the smaller side:
  with a small batch on the weight, the gradient resharded first and that
  reshard reused by the weight gradient (GPU corpus #75, gpt2 4x2 b8: one
  gather); with a large batch on the gradient itself, gathered inside the
  group and again for the weight gradient (#142, b256: all-gather-start.3
  and .6 of one value)."""
  def gathers(topology, batch):
    plan = plan_mesh(parse_topology(topology), 4, 2)
    traced = trace(PRESETS["tiny"], TrainSettings(
        batch=batch, seq=64, remat="none", shard="zero3"), abstract_mesh(plan))
    read = program.read_traced(traced, gpu=topology.startswith("h100"))
    return sum(1 for c in read.made() if c.kind == "all-gather"
               and c.axis == "Y" and c.source.endswith("mlp/wo/bsf,fd->bsd"))
  assert [gathers("v5p-16", b) for b in (8, 256)] == [1, 1]
  assert [gathers("h100:8", b) for b in (8, 256)] == [1, 2]


def test_a_gather_made_at_some_batches_is_read_off_the_probe_trace():
  """The probe-batch trace keeps each grouping's gathers with the
  condition under which the partitioner makes them: read at a batch, they
  are the gathers of the step traced at that batch, bytes and all."""
  plan = plan_mesh(parse_topology("h100:8"), 4, 2)
  settings = lambda b: TrainSettings(batch=b, seq=64, remat="none",
                                     shard="zero3")
  probe = trace_probe(PRESETS["tiny"], settings(8), abstract_mesh(plan))
  traced_batch = probe.step.batch["inputs"].shape[0]
  read = program.read_traced(probe, gpu=True)
  assert any(c.present_if is not None for c in read.collectives)
  for batch in (8, 16, 64, 256):
    t = batch / traced_batch
    at = collections.Counter(
        (c.kind, c.axis, c.source, c.count,
         c.bytes_per_device * (t if carries_batch(c.shape) else 1))
        for c in read.collectives if c.present(t))
    direct = program.read_traced(trace(PRESETS["tiny"], settings(batch),
                                       abstract_mesh(plan)), gpu=True)
    assert at == collections.Counter(
        (c.kind, c.axis, c.source, c.count, c.bytes_per_device)
        for c in direct.made()), batch


def test_qloras_index_lookup_splits_back_without_a_gather():
  """The NF4 lookup gathers its int32 indices whole over Y, looks them up
  and splits the levels over Y again: XLA runs that on each device's own
  part (corpus #218: no such all-gather in its HLO; on a GPU neither, the
  tiny QLoRA step compiled for h100:8 4x2), so the walk emits no all-gather
  of an int32 index array, for either compiler."""
  plan = plan_mesh(parse_topology("v5p-8"), 2, 2)
  settings = TrainSettings(batch=4, seq=64, remat="full", shard="zero3",
                           lora_rank=4, base_quant="nf4")
  cfg = dataclasses.replace(PRESETS["tiny"], d_model=128, head_dim=64,
                            d_ff=256)  # whole NF4 blocks on every device
  read = program.read_traced(trace_probe(cfg, settings, abstract_mesh(plan)))
  gathers = [c for c in read.collectives if c.kind == "all-gather"]
  assert gathers and not [c for c in gathers if c.dtype == "int32"]
  gpu = program.read_traced(trace_probe(cfg, settings, abstract_mesh(plan)),
                            gpu=True)
  assert not [c for c in gpu.collectives if c.kind == "all-gather"
              and c.dtype == "int32"]


def test_a_replicas_sum_runs_on_the_shard_after_a_whole_all_reduce():
  """With replicas (D2x16x1 across two slices) a weight's gradient is
  all-reduced whole over X and then over D on the 1/16 shard each device
  keeps, as libtpu compiles it (qwen2-0.5b v5e-16x2, corpus #290: a
  layer's gradients all-reduced over the slice, then MegaScale ALL_REDUCE
  sends of each weight's shard); one slice, no replicas: a reduce-scatter
  over X."""
  def grads(topology, X, D):
    plan = plan_mesh(parse_topology(topology), X, 1, D=D)
    traced = trace_probe(PRESETS["tiny"], TrainSettings(batch=1, seq=64),
                         abstract_mesh(plan))
    return [c for c in program.read_traced(traced).collectives
            if c.source.startswith("blocks/mlp/wo/")
            and c.phase == "backward"]
  two = {(c.kind, c.axis): c.bytes_per_device for c in grads("v5e-16x2", 16, 2)}
  assert set(two) == {("all-reduce", "X"), ("all-reduce", "D")}
  assert two["all-reduce", "D"] * 16 == two["all-reduce", "X"]
  one = {(c.kind, c.axis): c.bytes_per_device for c in grads("v5e-16", 16, 1)}
  assert one == {("reduce-scatter", "X"): two["all-reduce", "X"]}


def test_a_replicas_sum_is_on_the_shard_where_the_step_keeps_it_whole():
  """zero1 keeps the gradients whole over X (its optimizer state is
  sharded): XLA still sums over D only the 1/X shard (llama2_7b v5p-32x2
  D2x8x2 zero1, corpus #294: 0.82 GiB over D a step for 6.40 GiB of
  gradients over X = 8)."""
  plan = plan_mesh(parse_topology("v5e-16x2"), 16, 1, D=2)
  traced = trace_probe(PRESETS["tiny"], TrainSettings(batch=1, seq=64,
                                                      shard="zero1"),
                       abstract_mesh(plan))
  wo = {(c.kind, c.axis): c.bytes_per_device
        for c in program.read_traced(traced).collectives
        if c.source.startswith("blocks/mlp/wo/") and c.phase == "backward"}
  assert set(wo) == {("all-reduce", "X"), ("all-reduce", "D")}
  assert wo["all-reduce", "D"] * 16 == wo["all-reduce", "X"]


def _wo_grad_collectives(topology, X, D, shard):
  plan = plan_mesh(parse_topology(topology), X, 1, D=D)
  traced = trace_probe(PRESETS["tiny"], TrainSettings(batch=1, seq=64,
                                                      shard=shard),
                       abstract_mesh(plan))
  return sorted((c.kind, c.axis, c.bytes_per_device)
                for c in program.read_for_plan(traced, plan).collectives
                if c.source.startswith("blocks/mlp/wo/")
                and c.phase == "backward")


def test_across_slices_a_sum_kept_whole_is_gathered_back_over_x():
  """Read for the plan: across TPU slices the slices' sum of each
  device's 1/X shard is gathered back over X where the step keeps the
  gradient whole (#294's all-gather.140-142); not where it keeps it
  scattered (zero3), nor inside one slice (#291: one all-reduce)."""
  zero1 = _wo_grad_collectives("v5e-16x2", 16, 2, "zero1")
  whole = next(b for k, a, b in zero1 if (k, a) == ("all-reduce", "X"))
  assert ("all-gather", "X", whole) in zero1
  assert not any(k == "all-gather" for k, _, _ in
                 _wo_grad_collectives("v5e-16x2", 16, 2, "zero3"))
  assert not any(k == "all-gather" for k, _, _ in
                 _wo_grad_collectives("v5e-32", 16, 2, "zero1"))


def test_offloaded_residuals_are_host_copies_out_and_back():
  """remat offload:qkv copies q, k and v to host memory in each layer's
  forward and back in its backward: one device_put each way per tensor
  per layer, the same bytes."""
  plan = plan_mesh(parse_topology("v5p-8"), 4, 1)
  cfg = PRESETS["tiny"]
  traced = trace_probe(cfg, TrainSettings(batch=1, seq=64, remat="offload:qkv"),
                       abstract_mesh(plan))
  host = program.read_traced(traced).host
  out = [h for h in host if h.to_host]
  back = [h for h in host if not h.to_host]
  assert len(out) == len(back) == 3
  assert {h.phase for h in out} == {"forward"}
  assert {h.phase for h in back} == {"backward"}
  assert {h.count for h in host} == {cfg.n_layers}
  assert sorted(h.bytes_per_device for h in out) == sorted(
      h.bytes_per_device for h in back)
  plain = trace_probe(cfg, TrainSettings(batch=1, seq=64, remat="full"),
                      abstract_mesh(plan))
  assert program.read_traced(plain).host == []
