"""T5 encoder-decoder: exact counts, relative buckets, the step at a mesh."""

import dataclasses
import json

import jax
import jax.numpy as jnp
import pytest
from jax.sharding import AbstractMesh, AxisType, PartitionSpec as P

from meshes.layout import plan_mesh
from meshes.topology import parse_topology
from models.config import ModelConfig
from models import decode
from models.encoder_decoder import EncoderDecoder, relative_position_bucket
from models.params import abstract_params, module_class, num_params
from models.presets import PRESETS
from simulator import memory
from simulator.timing import roofline
from simulator.timing.flops import count_flops
from simulator.tracing.program import read_traced
from simulator.settings import TrainSettings
from simulator.step import build_step
from simulator.tracing.trace import trace

MESH = AbstractMesh((2, 2), ("X", "Y"), axis_types=(AxisType.Explicit,) * 2)
TINY = PRESETS["tiny_t5"]


@pytest.mark.parametrize("name, count", [
    ("t5_large", 737_668_096), ("t5_3b", 2_851_598_336),
    ("t5_11b", 11_307_321_344)])
def test_exact_counts_as_hugging_face_gives_them(name, count):
  assert num_params(PRESETS[name]) == count


def test_v1_0_ties_the_head_and_v1_1_does_not():
  untied = dataclasses.replace(TINY, mlp="geglu", tie_embeddings=False)
  names = lambda cfg: {jax.tree_util.keystr(p, simple=True, separator="/")
                       for p, _ in jax.tree_util.tree_leaves_with_path(
                           abstract_params(module_class(cfg)(cfg))[0])}
  assert "lm_head" not in names(TINY) and "lm_head" in names(untied)
  assert "decoder/mlp/wi_gate/kernel" in names(untied)
  assert {"encoder_relative_bias", "decoder_relative_bias",
          "decoder/cross_attn/k/kernel"} <= names(TINY)
  assert not any(n.startswith("encoder/cross_attn") for n in names(TINY))
  d, v = TINY.d_model, TINY.vocab_size
  assert num_params(untied) - num_params(TINY) == d * v + 4 * d * TINY.d_ff


# HF's T5Attention._relative_position_bucket, 32 buckets, max distance 128,
# by hand. Bidirectional: 16 per direction, 8 exact; a key 20 to the left:
# 8 + int(log(20/8)/log(128/8)·8) = 8 + int(2.64) = 10, to the right 16 + 10;
# 200 away is capped at 15 (31). Causal: 32 buckets for the past, 16 exact;
# 50 back: 16 + int(log(50/16)/log(128/16)·16) = 16 + int(8.77) = 24; the
# future is bucket 0.
OFFSETS = [0, 1, -1, -8, -20, 20, -200, 200, 5, -3, -16, -50]
BIDIRECTIONAL = [0, 17, 1, 8, 10, 26, 15, 31, 21, 3, 10, 13]
CAUSAL = [0, 0, 1, 8, 17, 0, 31, 0, 0, 3, 16, 24]


@pytest.mark.parametrize("bidirectional, expected", [
    (True, BIDIRECTIONAL), (False, CAUSAL)])
def test_relative_position_buckets(bidirectional, expected):
  got = relative_position_bucket(jnp.array(OFFSETS), bidirectional, 32, 128)
  assert got.tolist() == expected


def test_the_step_at_a_mesh_lays_out_both_stacks():
  s = TrainSettings(batch=8, seq=32, target_seq=16)
  step = build_step(TINY, s, MESH)
  assert {k: v.shape for k, v in step.batch.items()} == {
      "inputs": (8, 32), "decoder_inputs": (8, 16), "targets": (8, 16)}
  assert step.params["encoder"]["attn"]["q"]["kernel"].sharding.spec == P(
      None, "X", "Y", None)
  assert step.params["decoder_relative_bias"].sharding.spec == P(None, "Y")
  assert step.params["embedding"].sharding.spec == P("Y", "X")


def test_program_names_each_stack_and_counts_every_matmul():
  """Training FLOPs with materialized attention and no remat: exactly 3x
  the forward's matmuls: each stack's projections and MLP over its own
  tokens (cross-attention's k, v over the encoder's), the scores over
  S·S, T·T and T·S, the tied head over the targets. Model FLOPs for MFU
  are the same."""
  b, s, t = 8, 32, 16
  st = TrainSettings(batch=b, seq=s, target_seq=t, remat="none",
                     attention="materialized")
  c = TINY
  nh, d, f, n = c.n_heads * c.head_dim, c.d_model, c.d_ff, c.n_layers
  enc = 2 * s * (4 * d * nh + 2 * d * f) + 4 * s * s * nh
  dec = (2 * t * (6 * d * nh + 2 * d * f) + 2 * s * 2 * d * nh
         + 4 * t * t * nh + 4 * t * s * nh)
  forward = b * (c.encoder_layers * enc + n * dec + 2 * t * d * c.vocab_size)
  traced = trace(TINY, st, MESH)
  assert count_flops(traced).total_global == 3 * forward
  assert {"encoder", "decoder"} <= {d.layer for d in read_traced(traced).dots}
  plan = plan_mesh(parse_topology("v5p-8"), 2, 2)
  model = roofline.fit_mesh(TINY, st, plan)
  assert roofline._model_flops(model, b * s, True) == pytest.approx(
      3 * forward)


def test_memory_rescales_exactly_with_two_lengths():
  """One probe trace serves every batch: encoder and decoder activations
  both carry the batch."""
  plan = plan_mesh(parse_topology("v5p-8"), 2, 2)
  st = TrainSettings(batch=8, seq=64, target_seq=32)
  est = memory.memory_report(TINY, st, plan)
  again = memory.memory_report(TINY, dataclasses.replace(st, batch=16), plan)
  assert est.at_batch(16).per_device_bytes == again.per_device_bytes
  longer = memory.memory_report(
      TINY, dataclasses.replace(st, target_seq=64), plan)
  assert (longer.per_device_bytes["activations"]
          > est.per_device_bytes["activations"])


@pytest.mark.parametrize("change, message", [
    (dict(positions="rope"), "relative positions go with an encoder"),
    (dict(encoder_layers=-1), "encoder_layers=-1 must be an integer >= 0"),
    (dict(relative_buckets=6, relative_max_distance=3),
     "relative_max_distance=3 above half of it"),
    (dict(embeddings=False), "an encoder-decoder needs attention and "
     "embeddings"),
])
def test_bad_configs_are_one_line_errors(change, message):
  with pytest.raises(ValueError, match=message) as e:
    dataclasses.replace(TINY, **change)
  assert "\n" not in str(e.value)


def test_relative_positions_need_an_encoder():
  with pytest.raises(ValueError, match="relative positions go with an "
                     "encoder"):
    ModelConfig("x", d_model=8, n_layers=1, d_ff=8, n_heads=1, n_kv_heads=1,
                head_dim=8, vocab_size=8, positions="relative")


@pytest.mark.parametrize("args, message", [
    (["--model=tiny", "--target_seq=16"],
     "error: target_seq=16: tiny has no encoder; target_seq is an "
     "encoder-decoder's decoder length"),
    (["--model=tiny_t5", "--target_seq=-4"],
     "error: target_seq=-4 must be an integer >= 0 (0: the same as seq)"),
])
def test_cli_refuses_with_one_line(args, message, refused_by_memory_report):
  refused_by_memory_report(args, message)


def test_cli_refuses_a_bad_t5_config_json(tmp_path, refused_by_memory_report):
  path = tmp_path / "t5.json"
  path.write_text(json.dumps({
      "model_type": "t5", "d_model": 64, "d_ff": 128, "d_kv": 16,
      "num_heads": 4, "num_layers": 2, "vocab_size": 256,
      "feed_forward_proj": "gated-swish"}))
  refused_by_memory_report(
      [f"--model={path}"], f"error: {path}: feed_forward_proj="
      "'gated-swish' is not supported; valid: relu, gelu, gated-gelu")


def _served_losses(cfg, kv_dtype, x, y, skips=(None,)):
  """The training loss of targets y read off the served logits, for each
  of `skips`: one prefill (the prompt x encoded, y[:, 0] decoded at 0) then
  a decode step per later decoder position (at position `skip` one slot
  too far); and the training forward pass's. The weights are an argument
  of the two compiled steps, so each compiles once for every skip."""
  model = EncoderDecoder(cfg, attention="materialized", dtype=jnp.float32,
                         param_dtype=jnp.float32)
  params = jax.jit(model.init)(jax.random.key(0), x, y, y)["params"]
  empty = lambda length: decode.KVCache(**{
      n: jnp.zeros(s, d) for n, (s, d, _) in decode.cache_layout(
          cfg.n_layers, x.shape[0], length, cfg.n_kv_heads, cfg.head_dim,
          kv_dtype).items()})
  serve = jax.jit(lambda p, c, x, t, pos: model.apply(
      {"params": p}, x, t, cache=c, pos=pos))
  trained = float(jax.jit(lambda p: model.apply({"params": p}, x, y, y))(
      params))
  losses = []
  for skip in skips:
    cache = decode.Seq2SeqCache(empty(y.shape[1] + 1), empty(x.shape[1]))
    logits, cache = serve(params, cache, x, y[:, :1], jnp.int32(0))
    steps = [logits]
    for i in range(1, y.shape[1]):
      logits, cache = serve(params, cache, None, y[:, i:i + 1],
                            jnp.int32(i + (i == skip)))
      steps.append(logits)
    logits_BxTxV = jnp.stack(steps, axis=1)
    nll = (jax.nn.logsumexp(logits_BxTxV, axis=-1)
           - jnp.take_along_axis(logits_BxTxV, y[..., None], axis=-1)[..., 0])
    losses.append(float(jnp.mean(nll)))
  return losses, trained


@pytest.mark.parametrize("kv_dtype, tol", [
    ("bf16", 2e-3),
    # the int8 cache itself: test_decode.py holds a decoder's to full logits.
    pytest.param("int8", 1e-2, marks=pytest.mark.long)])
def test_served_logits_give_the_training_loss(kv_dtype, tol):
  """T5 served as Hugging Face generates (encoder once, the cross-attention
  k and v cached by the prefill, the decoder's own through its cache, the
  relative position bias of each decode step's position) reads the same
  loss as the training forward pass over the whole decoder sequence; one
  decode step at the wrong position does not."""
  x = jax.random.randint(jax.random.key(1), (2, 7), 0, TINY.vocab_size)
  y = jax.random.randint(jax.random.key(2), (2, 5), 0, TINY.vocab_size)
  (served, wrong), trained = _served_losses(TINY, kv_dtype, x, y,
                                            skips=(None, 3))
  assert abs(served - trained) <= tol * abs(trained)
  assert abs(wrong - trained) > 5 * abs(served - trained)
