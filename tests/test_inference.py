"""simulator.inference: KV cache bytes per device, the steps' peaks from the
live-range model, and the decode roofline, on llama2_7b / llama3_8b traced
under abstract meshes (no compile)."""

import functools

import pytest

from meshes.layout import plan_mesh
from meshes.topology import parse_topology
from models.params import num_params
from models.registry import load_model
from simulator import formulas, inference
from simulator.timing import comms
from simulator.settings import ServeSettings


@functools.lru_cache(maxsize=None)
def _report(model, mesh, batch=16, prompt=1024, generate=256, kv="bf16"):
  x, y = mesh
  plan = plan_mesh(parse_topology("v5p-8"), x, y)
  return inference.inference_report(load_model(model), ServeSettings(
      batch, prompt, generate, kv), plan)


@pytest.mark.parametrize("mesh", [(4, 1), (1, 4), (2, 2)])
def test_cache_bytes_per_device_exact(mesh):
  """2·L·(B/X)·T·(K/Y)·Hd·2 bytes, T = prompt + generate."""
  x, y = mesh
  e = _report("llama2_7b", mesh)
  assert e.kv_cache_bytes == 2 * 32 * (16 // x) * 1280 * (32 // y) * 128 * 2
  assert e.kv_cache_bytes == formulas.kv_cache_bytes(16 // x, 1280, 32,
                                                     32 // y, 128)


def test_int8_cache_adds_its_scales():
  e = _report("llama2_7b", (4, 1), kv="int8")
  assert e.kv_cache_bytes == 2 * 32 * 4 * 1280 * 32 * (128 * 1 + 2)


def test_seed002_kv_formula_agrees_for_mha_and_overstates_gqa():
  """Seed 002's 2·B·S·L·H/T·bytes uses the hidden size H: right for an MHA
  model (llama2_7b: 32 kv heads × 128 = 4096), n_heads/n_kv_heads = 4
  times too much for llama3_8b's 8 kv heads."""
  mha = _report("llama2_7b", (2, 2))
  assert mha.kv_cache_bytes == formulas.kv_cache_bytes_seed002(
      8, 1280, 32, 4096, tp=2)
  gqa = _report("llama3_8b", (2, 2))
  seed = formulas.kv_cache_bytes_seed002(8, 1280, 32, 4096, tp=2)
  assert seed == 4 * gqa.kv_cache_bytes


def test_weights_per_device_are_bf16_replicated_over_x():
  n = num_params(load_model("llama2_7b"))
  assert _report("llama2_7b", (4, 1)).weights_bytes == 2 * n
  assert _report("llama2_7b", (1, 4)).weights_bytes < 2 * n // 4 * 1.01


def test_decode_roofline_reads_weights_and_the_whole_cache():
  e = _report("llama2_7b", (4, 1))
  d = e.phases["decode"]
  chip = e.plan.topology.chip
  assert d.hbm_bytes == e.weights_bytes + e.kv_cache_bytes
  assert d.t_hbm == pytest.approx(d.hbm_bytes / chip.hbm_bandwidth)
  assert d.bound == "memory" and d.seconds == d.t_hbm
  # matmul FLOPs per device: 2 per weight (not the embedding lookup, not
  # the norms) per token, plus q·k and p·v over all 1280 positions
  c, tokens = load_model("llama2_7b"), 16 // 4
  matmul_params = (num_params(c) - c.vocab_size * c.d_model
                   - (2 * c.n_layers + 1) * c.d_model)
  attention = 2 * 2 * tokens * 1280 * c.n_heads * c.head_dim * c.n_layers
  assert d.flops == 2 * tokens * matmul_params + attention
  assert e.decode_tokens_per_s == pytest.approx(16 / d.seconds)


def test_tp_steps_pay_their_collectives_replicas_none():
  """With TP over Y the steps' collectives (each layer's activations
  gathered and reduce-scattered over Y) add their ring time to the
  roofline's; replicas over X serve without a collective."""
  tp = _report("llama2_7b", (1, 4))
  plan, chip = tp.plan, tp.plan.topology.chip
  for p in tp.phases.values():
    assert p.t_comm > 0 and p.comm_bytes > 0
    assert p.seconds == pytest.approx(max(p.t_math, p.t_hbm) + p.t_comm)
  # prefill: per layer two all-gathers (V / W each) and two all-reduces
  # (2 V / W each, as libtpu compiles the reductions) of the
  # [16, 1024, 4096] bf16 activations
  layer = 16 * 1024 * 4096 * 2 / comms.axis_bandwidth(
      plan, "Y", chip.ici_link_bandwidth)
  assert 6 * 32 * layer < tp.phases["prefill"].t_comm < 6.1 * 32 * layer
  assert {c.kind for c in tp.phases["decode"].collectives} == {
      "all-gather", "all-reduce", "all-to-all"}
  replicas = _report("llama2_7b", (4, 1))
  assert all(p.t_comm == 0 == p.comm_bytes for p in replicas.phases.values())


def test_compare_sets_the_traced_collectives_beside_the_hlos():
  """--compile's comparison: the traced step's collectives by kind and axis
  against a compiled summary (here one all-gather's, as
  hlo_collectives.summarize gives it)."""
  e = _report("llama2_7b", (1, 4))
  d = e.phases["decode"]
  gathered = sum(c.count * c.bytes_per_device for c in d.collectives
                 if c.kind == "all-gather")
  hlo = {"all-gather@Y": {"ops": 1, "count": 1, "in_bytes": gathered // 4,
                          "out_bytes": gathered}}
  coll = inference.compare(e, {"decode": {
      "peak_bytes": d.peak_bytes, "argument_bytes": d.arguments_bytes,
      "collectives": hlo}})["decode"]["collectives"]
  assert coll["symbolic"]["all-gather@Y"] == gathered == coll["hlo_bytes"]
  assert coll["symbolic_bytes"] == sum(c.count * c.bytes_per_device
                                       for c in d.collectives)


def test_prefill_is_compute_bound_at_a_long_prompt():
  p = _report("llama2_7b", (4, 1)).phases["prefill"]
  assert p.bound == "compute" and p.t_math > 10 * p.t_hbm


def test_decode_peak_holds_the_scanned_cache_stacks():
  """The stacked-outputs-not-donated rule: the cache comes out of the layer
  scan as stacks of its own beside the donated arguments, as XLA holds it."""
  e = _report("llama2_7b", (4, 1))
  d = e.phases["decode"]
  assert d.peak_bytes - d.arguments_bytes >= e.kv_cache_bytes
  assert d.peak_bytes - d.arguments_bytes < 1.1 * e.kv_cache_bytes


def test_encoder_decoder_decode_reads_the_decoder_and_both_caches():
  """t5_3b v5p-8 2x2: the decoder's own cache over the generated
  positions, the cross-attention's over the prompt's; a decode step reads
  neither an encoder weight nor a cross-attention k or v projection (the
  prefill cached their products), so its roofline and its arguments leave
  them out; the prefill reads every weight."""
  import jax
  from meshes.layout import abstract_mesh
  from simulator.serve_step import build_serve_steps
  from simulator.step import device_bytes
  cfg, serve = load_model("t5_3b"), ServeSettings(8, 512, 64)
  plan = plan_mesh(parse_topology("v5p-8"), 2, 2)
  e = inference.inference_report(cfg, serve, plan)
  assert e.kv_cache_bytes == 2 * 24 * 4 * (64 + 512) * 16 * 128 * 2
  params = build_serve_steps(cfg, serve, abstract_mesh(plan))["decode"].params
  skipped = sum(
      device_bytes(x) for path, x in jax.tree_util.tree_leaves_with_path(
          params) if "encoder" in (keys := jax.tree_util.keystr(path))
      or "['cross_attn']['k']" in keys or "['cross_attn']['v']" in keys)
  decode, prefill = e.phases["decode"], e.phases["prefill"]
  assert skipped > 0.45 * e.weights_bytes
  assert decode.hbm_bytes == e.weights_bytes - skipped + e.kv_cache_bytes
  assert prefill.hbm_bytes == e.weights_bytes + e.kv_cache_bytes
  assert decode.arguments_bytes < e.weights_bytes - skipped + 1.01 * (
      e.kv_cache_bytes)


def _kept_peak_errors(name: str, part: str | None = None) -> list[float]:
  """Today's symbolic peak against XLA's, (symbolic - XLA) / XLA, for
  each step of each plan kept in experiments/data/`name` (of `part` only,
  where given; inference.recheck); every step's arguments exact."""
  import json
  import os
  path = os.path.join(os.path.dirname(__file__), "..", "experiments", "data",
                      name)
  with open(path) as f:
    rows = [json.loads(line) for line in f]
  errors = []
  for r in inference.recheck([r for r in rows
                              if part is None or r["part"] == part]):
    assert set(r["argument_error"].values()) == {0}, r
    errors += r["peak_error"].values()
  return errors


def test_kept_compiles_within_the_memory_targets():
  """experiments/data/inference_compiled.jsonl: both steps of sixteen
  plans (two mixtral_mini's, a mixture of experts; four T5
  encoder-decoders'; three LLaVA vision-language models') compiled for
  v5p-8 through libtpu (experiments.inference_report --compile); today's
  symbolic peaks against XLA's: median |error| <= 3%, worst <= 8%, no
  under-estimate below -5%. mixtral_mini 2x2 b32's prefill reads +20.69%
  where its step is traced at its own batch instead of the probe batch
  (inference.probe_serve), llava_mini 2x2's decode -13.5% without the
  updated-slices and stacks-made-first rules (xla_rules)."""
  import statistics
  errors = _kept_peak_errors("inference_compiled.jsonl")
  assert len(errors) == 32
  assert statistics.median(map(abs, errors)) <= 0.03
  assert max(map(abs, errors)) <= 0.08 and min(errors) >= -0.05


def test_kept_gpu_compiles_within_the_memory_targets():
  """experiments/data/inference_compiled_gpu.jsonl: serving plans compiled
  deviceless for H100, H200 and A100 targets (inference_report --compile),
  part "gpu" the XLA:GPU rules were read off (simulator.memory.
  xla_gpu_rules: relaid cache stacks, copied weight slices, ...) and part
  "gpu-check" compiled after the rules of their time and read for none.
  Today's peaks against XLA:GPU's: no step under by more than 5%, the
  held-out median |error| within 3%; the over-estimates are the named
  bounds (a relaid stack in a prefill that keeps its layout, weight
  slices made at the body's start), the largest under 17% (gpt2 h100:8
  8x1 b64's prefill, +16.0%)."""
  import statistics
  tuned = _kept_peak_errors("inference_compiled_gpu.jsonl", "gpu")
  held = _kept_peak_errors("inference_compiled_gpu.jsonl", "gpu-check")
  assert len(tuned) == 20 and len(held) >= 40
  assert min(tuned + held) >= -0.05, (tuned, held)
  assert statistics.median(map(abs, held)) <= 0.03
  assert max(tuned + held) <= 0.17


def test_fits_on_a_gpu_holds_the_allocator_pool():
  """On a GPU the serving steps' buffers live in JAX's allocator pool, as a
  training step's (simulator.memory.capacity), not the whole device (an
  H100's 80 GiB, which the report held serving plans against before)."""
  from simulator.memory import capacity
  plan = plan_mesh(parse_topology("h100:8"), 8, 1)
  e = inference.inference_report(load_model("tiny"),
                                 ServeSettings(8, 128, 64, "bf16"), plan)
  assert e.hbm_bytes == capacity.capacity_bytes(plan)
  assert e.hbm_bytes < 0.76 * plan.topology.chip.hbm_bytes
  assert e.fits


def test_a_batch_x_does_not_split_is_refused_by_name():
  """The sequences and their cache are split over X: a batch X does not
  divide is the user's --batch, said as such (not a cache tensor's dim)."""
  plan = plan_mesh(parse_topology("v5p-8"), 4, 1)
  with pytest.raises(ValueError, match=r"^batch=6 must be a positive "
                     r"multiple of 4 \(the sequences and their KV cache"):
    inference.inference_report(load_model("tiny"),
                               ServeSettings(6, 16, 8, "bf16"), plan)
