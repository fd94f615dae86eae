"""simulator.memory against the seeds' closed forms (simulator.formulas).

Byte splits JAX actually has (optax on our precision policies):
  mixed  adamw        f32 params 4 + f32 grads 4 + f32 mu, nu 8      = 16 B/param
  mixed  sgd_momentum 4 + 4 + f32 trace 4                             = 12
  mixed  sgd          4 + 4 + nothing                                 =  8
  bf16_master adamw   bf16 params 2 + bf16 grads 2 + f32 master, mu, nu 12 = 16
plus optax's int32 step counts (4 bytes each), which the closed forms omit.
"""

import contextlib
import itertools
import math
import os
import re
import types

import flax
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from meshes.layout import abstract_mesh, plan_mesh
from meshes.topology import parse_topology
from models import scopes, transformer
from models.config import ModelConfig
from models.params import num_params
from models.registry import load_model
from models.rules import FSDP_TP
from simulator import formulas, memory
from simulator.memory import estimate as estimate_module, liveness
from simulator.memory.points import Points
from simulator.settings import TrainSettings
from simulator.tracing.batch_probe import PROBE
from simulator.step import device_bytes
from simulator.tracing.trace import fused_residuals, trace

MiB, GiB = 2**20, 2**30
ONE = plan_mesh(parse_topology("v5p:1x1x1"), 1, 1)


def _estimate(cfg, plan=ONE, **kw):
  settings = TrainSettings(**{"batch": 2, "seq": 64, **kw})
  return memory.memory_report(cfg, settings, plan)


def _state(e):
  b = e.per_device_bytes
  return b["params"], b["grads"], b["optimizer"]


@pytest.fixture(scope="module")
def tiny():
  return load_model("tiny")


@pytest.mark.parametrize("optimizer,precision,split,counts", [
    ("adamw", "mixed", (4, 4, 8), 4),  # formulas' adamw_fp32 = 16Ψ
    ("sgd_momentum", "mixed", (4, 4, 4), 0),  # 12Ψ
    ("sgd", "mixed", (4, 4, 0), 0),  # 8Ψ
    ("adamw", "bf16_master", (2, 2, 12), 4),  # formulas' adamw = 16Ψ
    ("adamw", "bf16", (2, 2, 4), 4),
])
def test_model_state_per_param(tiny, optimizer, precision, split, counts):
  psi = num_params(tiny)
  e = _estimate(tiny, optimizer=optimizer, precision=precision)
  assert _state(e) == (split[0] * psi, split[1] * psi, split[2] * psi + counts)
  if (optimizer, precision) == ("adamw", "mixed"):
    ref = formulas.model_state_bytes(psi, "adamw_fp32")
    assert sum(_state(e)) - counts == ref.total == 16 * psi


def test_adamw_bf16_moments_and_adafactor(tiny):
  psi = num_params(tiny)
  bf16_mu = _estimate(tiny, optimizer="adamw_bf16_mu")
  assert bf16_mu.per_device_bytes["optimizer"] == (2 + 4) * psi + 4
  ada = _estimate(tiny, optimizer="adafactor")
  # optax factors only dims >= 128; tiny's are smaller, so Adafactor keeps a
  # full f32 second moment (4 B/param) plus small factor stand-ins and counts.
  assert 4 * psi <= ada.per_device_bytes["optimizer"] < 4 * psi + 1024


def test_calculon_linear_bf16_1024x4096():
  # Seed 000: a 1024x4096 bf16 linear: 8 MiB weights, 48 MiB Adam state
  # (m, v, f32 master). One block of two such linears, bf16 params + master.
  cfg = ModelConfig("lin", d_model=1024, n_layers=1, d_ff=4096,
                    attention=False, embeddings=False, norm="none",
                    positions="none", mlp="linear", final_norm=False)
  e = _estimate(cfg, optimizer="adamw", precision="bf16_master", seq=8)
  ref = formulas.calculon_linear_static_bytes(1024, 4096)
  assert (ref.weight, ref.optimizer) == (8 * MiB, 48 * MiB)
  tensors = [t for t in e.tensors if "mlp/wi/" in t.name]
  weight = sum(t.fixed for t in tensors if t.category == "params")
  opt = sum(t.fixed for t in tensors if t.category == "optimizer")
  assert (weight, opt) == (ref.weight, ref.optimizer)


@pytest.fixture(scope="module")
def xxl():
  cfg = load_model("xxl_ffn")
  plan = plan_mesh(parse_topology("v5p-512"), 256, 1)
  settings = TrainSettings(batch=256, seq=2048, remat="none", shard="zero3")
  return cfg, plan, memory.memory_report(cfg, settings, plan)


def test_seed_004a_xxl_state(xxl):
  # 4 B x 219.8e9 params = 819 GiB per f32 copy; 4 copies = 3276 GiB.
  cfg, plan, e = xxl
  psi = formulas.ffn_stack_params(cfg.d_model, cfg.d_ff, cfg.n_layers)
  assert round(4 * psi / GiB) == 819
  total = sum(_state(e)) * plan.X - 4 * plan.X  # less the replicated count
  assert total == 16 * psi
  assert round(total / GiB) == 3276


def test_seed_004a_xxl_saved_per_token(xxl):
  # Seed 004(a): 2*126*(d_ff + d_model) = 17,547,264 B/token saved, no remat.
  # The traced blocks' batch-proportional residuals match it exactly
  # (mlp_in x and W_in x per block); on top JAX keeps (i) the bf16 gathered
  # W_in, W_out of every block (batch-independent: 2 B/param = 2*Psi, because
  # remat none saves the gather's output instead of re-gathering), and (ii)
  # the stand-in loss's f32 square (not part of seed 004's model).
  cfg, plan, e = xxl
  per_token = formulas.ffn_stack_saved_bytes_per_token(cfg.d_model, cfg.d_ff,
                                                       cfg.n_layers)
  assert per_token == 17_547_264
  tokens_per_device = 256 * 2048 // plan.X
  blocks = [t for t in e.tensors
            if t.category == "activations" and t.name.endswith(" layers")]
  assert (sum(t.linear * 256 // e.traced_batch for t in blocks)
          == per_token * tokens_per_device)
  psi = formulas.ffn_stack_params(cfg.d_model, cfg.d_ff, cfg.n_layers)
  assert sum(t.fixed for t in blocks) == 2 * psi  # gathered bf16 weights


def test_seed_004b_fsdp_state_per_device(xxl):
  cfg, plan, e = xxl
  psi = formulas.ffn_stack_params(cfg.d_model, cfg.d_ff, cfg.n_layers)
  per_device = formulas.fsdp_bytes_per_device(16 * psi, 0, 0, plan.X)
  assert sum(_state(e)) == per_device + 4  # + the replicated step count


def test_gpt2_layer_residuals_vs_memory_equation():
  """Which tensors one GPT-2 layer saves (remat none, materialized), B=2 S=1024.

  S^2 terms: JAX keeps the causal mask (bool, 1 B), the masked scores (f32,
  4), exp(scores) (f32, 4) and the bf16 probabilities (2) = 11 B per B·A·S²;
  seed 001 counts one 2-byte copy (B·A·S² elements), Korthikanti 5 B (2
  softmax + 1 dropout mask + 2 dropout output). Linear terms: JAX keeps both
  LayerNorms' f32 centred input and output (16 B/elt each), their bf16
  outputs, q and k (v is not needed: the p·v backward uses p and the
  cotangent), the attention output, and the 4H-wide pre-activation plus
  GELU-tanh's five bf16 intermediates (nothing is fused at trace time; XLA
  may fuse some away after compilation).
  """
  cfg = load_model("gpt2")
  b, s, h, a = 2, 1024, cfg.d_model, cfg.n_heads
  block = transformer.Block(cfg, FSDP_TP, "materialized", jnp.bfloat16,
                            jnp.float32)
  x = jax.ShapeDtypeStruct((b, s, h), jnp.bfloat16)
  params = jax.eval_shape(block.init, jax.random.key(0), x, None)["params"]
  layer = [r for r in fused_residuals(
      lambda p, x: block.apply({"params": p}, x, None)[0], params, x)
           if not r.argument]
  at_b = lambda r: device_bytes(r.aval)
  quadratic = sum(at_b(r) for r in layer if r.aval.shape[-2:] == (s, s))
  weights = sum(at_b(r) for r in layer if r.aval.ndim >= 2
                and r.aval.shape[0] not in (1, b))  # bf16 weight casts
  linear = sum(at_b(r) for r in layer) - quadratic - weights
  assert quadratic == 11 * b * a * s * s
  seed = formulas.activation_bytes_11bsh(b, s, h, a)
  kort = formulas.activation_bytes_korthikanti(b, s, h, a)
  assert seed.quadratic == 2 * b * a * s * s and kort.quadratic == 5 * b * a * s * s
  # 76 bytes per B·S·H (+ small per-row stats) versus seed 2*11 = 22,
  # Korthikanti 34: norm 1 f32 centred x and x·rsqrt (8) + bf16 out (2);
  # rope'd q, k and the grouped q reshape (6); attention output (2); norm 2
  # (8) + mlp_in (2); the 4H-wide dense output, GELU-tanh's mul, tanh, sub,
  # mul and mlp_hidden, six bf16 copies (6·8 = 48).
  assert linear // (b * s * h) == 76
  assert seed.linear == 22 * b * s * h and kort.linear == 34 * b * s * h
  assert weights == 2 * 12 * h * h  # bf16 copies of the four matrices (12H^2)


def test_comparable_peak_at_is_at_batchs(tiny):
  """The bisection's shortcut gives at_batch's compiler-comparable peak, the
  1F1B rule and TPU batch-tile padding included."""
  plan = plan_mesh(parse_topology("v5p-8"), 2, 2)
  e = memory.memory_report(tiny, TrainSettings(batch=4, seq=64), plan)
  pp_plan = plan_mesh(parse_topology("v5p-16"), 2, 2, P=2)
  pp = memory.memory_report(tiny, TrainSettings(
      batch=8, seq=64, pp=2, microbatches=2, schedule="1f1b"), pp_plan)
  for est in (e, pp):
    for b in (4, 8, 12, 36, 1000):
      assert est.comparable_peak_at(b) == (
          est.at_batch(b).compiled_comparable_peak)


def _same_summary(est, batch: int) -> None:
  full, summary = est.at_batch(batch), est.summary_at(batch)
  assert summary.at_peak == full.at_peak
  assert summary.compiled_comparable_peak == full.compiled_comparable_peak
  assert summary.peak_bytes == full.per_device_bytes["peak"]
  assert summary.overhead_bytes == full.per_device_bytes["overhead"]
  assert summary.peak_where == full.peak_where


def test_summary_at_is_at_batchs(tiny):
  """What a sweep records (summary_at) is at_batch's peak, what is live
  there by category and where: on a TPU with batch-tile padding, under the
  1F1B rule, and on a GPU with its point-wise rules; a bad batch is
  at_batch's error."""
  plan = plan_mesh(parse_topology("v5p-8"), 2, 2)
  e = memory.memory_report(tiny, TrainSettings(batch=4, seq=64), plan)
  pp = memory.memory_report(tiny, TrainSettings(
      batch=8, seq=64, pp=2, microbatches=2, schedule="1f1b"),
      plan_mesh(parse_topology("v5p-16"), 2, 2, P=2))
  gpu = memory.memory_report(tiny, TrainSettings(batch=4, seq=64),
                             plan_mesh(parse_topology("h100:8"), 4, 2))
  for est in (e, pp, gpu):
    for b in (4, 8, 12, 36, 1000):
      _same_summary(est, b)
      # what a report names reads at the batch, not the probe batch
      named = est.at_batch(b)
      for c in (*named.peak_buffers,
                *itertools.chain(*named.contributors.values())):
        assert not any(int(n) % PROBE == 0 for n in re.findall(r"\d+",
                                                               c.name)
                       if int(n)), c.name
  with pytest.raises(ValueError, match="positive multiple of 2"):
    e.summary_at(3)


def _two_orders(deferred: int, traced: int, limit: int):
  """A synthetic estimate with no arguments, traced at batch 1: one point
  per schedule of the weight gradients, `deferred` and `traced` bytes a
  sequence, and XLA's rematerialization limit `limit`."""
  points = Points(
      fixed=np.zeros(2, dtype=np.int64),
      linear=np.array([deferred, traced], dtype=np.int64),
      where=("backward Decoder/layers: scan",
             "backward Decoder/layers: scan (weight gradients in traced "
             "order)"), paths=((0,), (0,)), part=np.zeros(2, dtype=np.int64),
      parts=("backward Decoder/layers",), order=("deferred", "traced"),
      splits={}, _sim=None, _jaxpr=None, _in_place=(), _live={0: [], 1: []})
  return estimate_module.assemble((), points, 1, 1, 10**6, 1, 1, None, limit)


def test_the_deferred_order_over_the_limit_gives_way():
  """The rematerialized-logits rule at a batch: the deferred schedule (10
  bytes a sequence) is the peak up to the limit (100), the traced one (8)
  while it alone is under it, the larger once both are over; with the
  traced schedule the larger one nothing is dropped; the report says why,
  and the bisection's shortcut agrees."""
  est = _two_orders(10, 8, 100)
  peak = lambda e, b: e.at_batch(b).compiled_comparable_peak
  assert [peak(est, b) for b in (10, 11, 12, 13)] == [100, 88, 96, 130]
  assert "rematerialized logits" in est.at_batch(11).peak_where
  assert "rematerialized" not in est.at_batch(10).peak_where
  reverse = _two_orders(8, 10, 100)
  assert [peak(reverse, b) for b in (10, 11, 13)] == [100, 110, 130]
  unlimited = _two_orders(10, 8, None)
  assert peak(unlimited, 11) == 110
  for e in (est, reverse, unlimited):
    for b in range(1, 30):
      assert e.comparable_peak_at(b) == peak(e, b)
      _same_summary(e, b)


@pytest.mark.parametrize("cap", [1, 50, 99, 100, 150, 1000])
def test_the_largest_batch_follows_the_limit_rule(cap):
  """Over the deferred schedule's drop the peak falls (100 at b10, 88 at
  b11): the largest batch that fits is still found, as a search of every
  batch finds it."""
  est = _two_orders(10, 8, 100)
  every = [b for b in range(1, 400)
           if est.at_batch(b).compiled_comparable_peak <= cap]
  assert memory.largest_batch(est, cap, 1) == max(every, default=0)


def test_at_batch_rescales_shapes_and_chains(tiny):
  plan = plan_mesh(parse_topology("v5p-8"), 2, 2)
  small = _estimate(tiny, plan, batch=2, remat="offload:qkv")
  big = small.at_batch(6)
  assert big.at_batch(2).per_device_bytes == small.per_device_bytes
  assert big.host_bytes == 3 * small.host_bytes > 0
  # per-device batch 1 -> 3 in the shapes users read
  scan = lambda e: next(c for c in e.contributors["activations"]
                       if c.name.endswith(" layers"))
  a, b = scan(small), scan(big)
  assert a.name == b.name and 1 in a.shape
  assert b.shape == tuple(3 if d == 1 else d for d in a.shape)
  with pytest.raises(ValueError, match="batch=3 must be a positive multiple of 2"):
    small.at_batch(3)
  # Each micro-batch is split over X: with 2 of them on X=2, a batch of 2
  # would leave each device a micro-batch of half a sequence (held-out
  # #194 was refused by the compile path; the estimate read zero-size
  # shapes).
  accum = _estimate(tiny, plan, batch=4, remat="full", grad_accum=2)
  with pytest.raises(ValueError, match="batch=2 must be a positive multiple "
                     "of 4 .each micro-batch split over X"):
    accum.at_batch(2)
  with pytest.raises(ValueError, match="probe batch"):
    memory.estimate_memory(trace(tiny, TrainSettings(batch=2, seq=64),
                                 abstract_mesh(plan)), plan)


def test_policies_attention_loss_chunks_offload(tiny):
  plan = plan_mesh(parse_topology("v5p-8"), 2, 2)
  est = lambda **kw: _estimate(tiny, plan, **{"batch": 4, "seq": 128, **kw})
  none, full = est(remat="none", attention="materialized"), est(remat="full")
  assert full.per_device_bytes["activations"] < none.per_device_bytes["activations"]
  assert full.compiled_comparable_peak < none.compiled_comparable_peak
  names, off = est(remat="names:qkv,mlp_hidden"), est(remat="offload:qkv,mlp_hidden")
  assert off.host_bytes > 0 and names.host_bytes == 0
  assert (names.per_device_bytes["activations"] - off.per_device_bytes["activations"]
          == off.host_bytes)
  # The layer scan saves each layer's input (decoder_layer_input) under any
  # policy; offloading it moves that stack, and only it, to host memory,
  # and names:+offload: keeps the saved names in HBM beside it.
  stack = est(remat="offload:decoder_layer_input")
  assert stack.host_bytes > 0 and (
      full.per_device_bytes["activations"]
      - stack.per_device_bytes["activations"] == stack.host_bytes)
  both = est(remat="names:qkv,mlp_hidden+offload:decoder_layer_input")
  assert both.host_bytes == stack.host_bytes
  assert (both.per_device_bytes["activations"] + both.host_bytes
          == names.per_device_bytes["activations"])
  mat = none
  flash = est(remat="none", attention="flash")
  assert flash.per_device_bytes["activations"] < mat.per_device_bytes["activations"]


def test_chunked_loss(tiny):
  """A chunked loss holds one chunk's logits at a time: the loss's largest
  live set shrinks; rescaling stays exact."""
  plan = plan_mesh(parse_topology("v5p-8"), 2, 2)
  est = lambda **kw: _estimate(tiny, plan, **{"batch": 4, "seq": 128, **kw})
  loss = lambda e: max(v for k, v in e.phase_bytes.items() if "loss" in k)
  full, chunked = est(), est(loss_chunks=4)
  assert loss(chunked) < loss(full)
  assert chunked.at_batch(8).per_device_bytes == est(
      batch=8, loss_chunks=4).per_device_bytes


def test_shards_and_estimate_fields(tiny):
  plan = plan_mesh(parse_topology("v5p-8"), 4, 1)
  by = {s: _estimate(tiny, plan, shard=s, batch=4) for s in
        ("dp", "zero1", "zero2", "zero3")}
  opt = {s: e.per_device_bytes["optimizer"] for s, e in by.items()}
  grads = {s: e.per_device_bytes["grads"] for s, e in by.items()}
  params = {s: e.per_device_bytes["params"] for s, e in by.items()}
  assert opt["dp"] > opt["zero1"] == opt["zero2"] == opt["zero3"]
  assert grads["zero1"] > grads["zero2"] == grads["zero3"]
  assert params["zero2"] > params["zero3"]
  e = by["zero3"]
  b = e.per_device_bytes
  assert tuple(b) == memory.CATEGORIES
  assert all(isinstance(v, int) for v in b.values())
  # peak = compiled-comparable peak (arguments + the largest live set) +
  # overhead; what is live at the peak sums to it.
  arguments = b["params"] + b["optimizer"] + e.batch_bytes + e.tile_padding_bytes
  assert e.arguments_bytes == arguments
  assert e.compiled_comparable_peak == max(e.phase_bytes.values())
  assert sum(e.at_peak.values()) == e.compiled_comparable_peak
  assert tuple(e.at_peak) == memory.PEAK_CATEGORIES
  assert b["peak"] == e.compiled_comparable_peak + b["overhead"]
  assert b["overhead"] == int(memory.OVERHEAD_FRACTION
                              * e.compiled_comparable_peak)
  assert e.fits and e.headroom_bytes == e.hbm_bytes - b["peak"]
  assert e.eta_mem == pytest.approx(b["params"] / b["peak"])
  assert math.isclose(e.hbm_bytes / GiB, 95)


def test_peak_is_a_live_set_in_the_step(tiny):
  """The peak is one program point of the step: where it is, what is live
  there (summing to it), and each part's largest live set; rescaling to
  another batch equals estimating there."""
  for x, y in ((4, 1), (2, 2)):
    plan = plan_mesh(parse_topology("v5p-8"), x, y)
    for remat in ("none", "full"):
      e = _estimate(tiny, plan, batch=8, seq=128, remat=remat)
      assert e.peak_where and e.peak_buffers
      assert sum(e.at_peak.values()) == e.compiled_comparable_peak
      assert sum(x.bytes for x in e.peak_buffers) <= (
          e.compiled_comparable_peak - e.arguments_bytes)
      parts = set(e.phase_bytes)
      assert {"forward Decoder/layers", "backward Decoder/layers",
              "forward Decoder/loss", "update"} <= parts, parts
      again = e.at_batch(16)
      assert again.compiled_comparable_peak == _estimate(
          tiny, plan, batch=16, seq=128, remat=remat).compiled_comparable_peak


@pytest.mark.parametrize("shape,dtype,expected", [
    ((), "int32", 512),  # a scalar fills one tile
    ((32,), "float32", 512), ((192,), "float32", 1024),  # 128 x 32-bit
    ((32,), "bfloat16", 512),  # 256 x 16-bit
    ((384,), "float32", 2048), ((768,), "float32", 4096),  # T(512), T(1024)
    ((50257,), "float32", 50 * 1024 * 4), ((1536,), "bfloat16", 2048 * 2),
    ((4, 512), "int32", 4 * 512 * 4),  # small second-minor tile
    ((12, 12, 64), "float32", 12 * 16 * 128 * 4),
    ((50257, 192), "float32", 192 * 50304 * 4),  # 50257 stored minor
    ((12, 192, 12, 64), "float32", 12 * 12 * 64 * 256 * 4),
    ((1024, 192), "float32", 1024 * 192 * 4),
])
def test_tpu_tiled_bytes(shape, dtype, expected):
  # Figures read off libtpu's compiled input layouts for gpt2 and tiny on v5p.
  assert memory.tpu_tiled_bytes(shape, dtype) == expected


def test_tile_padding_only_on_tpu(tiny):
  tpu = _estimate(tiny, plan_mesh(parse_topology("v5p-8"), 4, 1), batch=8)
  assert tpu.tile_padding_bytes > 0
  assert tpu.arguments_bytes == (tpu.per_device_bytes["params"]
                                 + tpu.per_device_bytes["optimizer"]
                                 + tpu.batch_bytes + tpu.tile_padding_bytes)
  assert tpu.at_batch(16).tile_padding_bytes >= tpu.tile_padding_bytes
  gpu = _estimate(tiny, plan_mesh(parse_topology("h100:4"), 4, 1), batch=8)
  assert gpu.tile_padding_bytes == 0
  assert gpu.arguments_bytes == (gpu.per_device_bytes["params"]
                                 + gpu.per_device_bytes["optimizer"]
                                 + gpu.batch_bytes)


@contextlib.contextmanager
def _flax_frames(user: bool):
  """Make JAX's source info treat flax's frames as user code (`user`, as in a
  virtualenv) or as library code (as when flax sits in the interpreter's own
  site-packages, under the stdlib directory). Private JAX state, touched only
  here: this is the install-location difference the estimate must not see."""
  from jax._src import source_info_util as siu
  flax_dir = os.path.dirname(flax.__file__)
  paths = siu._include_paths if user else siu._exclude_paths
  paths.append(flax_dir)
  caches = (siu._include_path_regex, siu._exclude_path_regex,
            siu.is_user_filename)
  for cache in caches:
    cache.cache_clear()
  try:
    yield
  finally:
    paths.remove(flax_dir)
    for cache in caches:
      cache.cache_clear()


def _layer_scan_frame(cfg, settings, plan) -> str:
  from jax._src import source_info_util as siu
  jaxpr = trace(cfg, settings, abstract_mesh(plan)).jaxpr.jaxpr
  scan = next(e for e in jaxpr.eqns if e.primitive.name == "scan")
  return siu.summarize(scan.source_info)


@pytest.mark.parametrize("remat,loss_chunks", [("full", 1), ("dots", 2),
                                               ("offload:qkv", 1)])
def test_estimate_does_not_depend_on_install_location(tiny, remat,
                                                      loss_chunks):
  """In a virtualenv JAX names flax's axes_scan.py as the layer scan's user
  frame; with flax under the stdlib directory, the model's own file. The
  estimate (every byte, every name) is the same either way: the layer stack
  and the loss are found by named scope, not by frame text."""
  plan = plan_mesh(parse_topology("v5p-8"), 2, 2)
  settings = TrainSettings(batch=8, seq=128, remat=remat,
                           loss_chunks=loss_chunks)
  out = {}
  for user in (True, False):
    with _flax_frames(user):
      frame = _layer_scan_frame(tiny, settings, plan)
      out[user] = (frame, memory.to_json(
          memory.memory_report(tiny, settings, plan)))
  assert out[True][0] != out[False][0]  # the frames do differ ...
  assert "flax" in out[True][0] and "flax" not in out[False][0]
  assert out[True][1] == out[False][1]  # ... the estimate does not
  assert out[True][1]["per_device_bytes"]["activations"] > 0


def test_missing_loss_scope_is_an_error(tiny, monkeypatch):
  """A model that does not run its loss under the LOSS scope gets a clear
  error, not a silently wrong peak."""
  monkeypatch.setattr(transformer, "scopes", types.SimpleNamespace(
      LAYERS=scopes.LAYERS, LOSS="elsewhere"))
  with pytest.raises(ValueError, match="no loss scope"):
    _estimate(tiny)
