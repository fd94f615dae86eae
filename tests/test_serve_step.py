"""simulator.serve_step: the serving steps' layouts and traced programs at a
mesh, and the plans they refuse."""

import jax
import pytest
from jax.sharding import PartitionSpec as P

from meshes.layout import abstract_mesh, plan_mesh
from meshes.topology import parse_topology
from models.registry import load_model
from simulator.serve_step import build_serve_steps
from simulator.settings import ServeSettings
from simulator.step import PlanError


def _mesh(topology, x, y):
  return abstract_mesh(plan_mesh(parse_topology(topology), x, y))


def test_cache_sharded_by_the_rules():
  """Batch over X, kv heads over Y; int8 scales laid out the same way."""
  steps = build_serve_steps(load_model("llama3_8b"), ServeSettings(
      batch=8, prompt=512, generate=128, kv_dtype="int8"), _mesh("v5p-16", 2, 4))
  cache = steps["decode"].cache
  assert cache.k.shape == (32, 8, 640, 8, 128)
  assert cache.k.sharding.spec == P(None, "X", None, "Y", None)
  assert cache.k_scale.shape == (32, 8, 640, 8)
  assert cache.k_scale.sharding.spec == P(None, "X", None, "Y")
  assert cache.k.sharding.shard_shape(cache.k.shape) == (32, 4, 640, 2, 128)


def test_cache_kv_heads_replicated_where_y_does_not_divide_them():
  """gemma-2b's one kv head under Y=4: every Y shard keeps it (and its
  cache), as the training layout does; the query heads stay split."""
  steps = build_serve_steps(load_model("models/configs/gemma-2b.json"),
                            ServeSettings(batch=4, prompt=64, generate=64),
                            _mesh("v5p-8", 1, 4))
  step = steps["decode"]
  assert step.cache.v.shape == (18, 4, 128, 1, 256)
  assert step.cache.v.sharding.spec == P(None, "X", None, None, None)
  assert step.params["blocks"]["attn"]["q"]["kernel"].sharding.spec == P(
      None, None, "Y", None)


def test_decode_step_traced_at_a_mesh():
  """One token per sequence in, [B, V] logits and the cache out, laid out
  like the cache that went in."""
  mesh = _mesh("v5p-8", 2, 2)
  steps = build_serve_steps(load_model("tiny"), ServeSettings(
      batch=4, prompt=16, generate=8, attention="materialized"), mesh)
  step = steps["decode"]
  assert step.tokens.shape == (4, 1) and step.pos.shape == ()
  with jax.sharding.use_abstract_mesh(mesh):
    jaxpr = jax.make_jaxpr(step.fn)(*step.args)
  outs = [v.aval for v in jaxpr.jaxpr.outvars]
  assert [o.shape for o in outs] == [(2, 4, 24, 2, 16)] * 2 + [(4, 256)]
  assert outs[0].sharding.spec == P(None, "X", None, "Y", None)
  assert outs[2].sharding.spec == P("X", "Y")
  prims = {e.primitive.name for e in jaxpr.jaxpr.eqns}
  assert "scan" in prims  # the layer stack, the cache scanned with it
  body = next(e for e in jaxpr.jaxpr.eqns if e.primitive.name == "scan")
  inner = {e.primitive.name for e in body.params["jaxpr"].jaxpr.eqns}
  assert "dynamic_update_slice" in inner


def test_encoder_decoder_steps_cache_both_attentions():
  """t5_3b: the decoder's own cache over the generated positions, the
  cross-attention's over the prompt's, both laid out as a decoder's; the
  prefill takes the prompt and the decoder's start token, a decode step
  one token and its position, and neither runs the other's stack."""
  mesh = _mesh("v5p-8", 2, 2)
  steps = build_serve_steps(load_model("t5_3b"), ServeSettings(
      batch=8, prompt=512, generate=64), mesh)
  prefill, step = steps["prefill"], steps["decode"]
  own, cross = step.cache.self_attn, step.cache.cross
  assert own.k.shape == (24, 8, 64, 32, 128)
  assert cross.v.shape == (24, 8, 512, 32, 128)
  assert cross.v.sharding.spec == P(None, "X", None, "Y", None)
  assert [x.shape for x in prefill.data] == [(8, 512), (8, 1)]
  assert [x.shape for x in step.data] == [(8, 1), ()]
  scopes = lambda s: {e.source_info.name_stack.stack[1].name
                      for e in _jaxpr(s, mesh).eqns
                      if len(e.source_info.name_stack.stack) > 1}
  assert {"encoder", "decoder"} <= scopes(prefill)
  assert "encoder" not in scopes(step) and "decoder" in scopes(step)


def test_vision_language_steps_take_the_images_then_the_prompt():
  """llava_1_5_7b at 336 px: the prefill takes [B, 1, 336, 336, 3] images
  (batch over X) and the prompt, the cache holds 576 image tokens before
  the text; a decode step runs the LM alone, no vision scope in it."""
  mesh = _mesh("v5p-8", 2, 2)
  steps = build_serve_steps(load_model("llava_1_5_7b"), ServeSettings(
      batch=8, prompt=448, generate=64), mesh)  # 576 + 448: flash blocks
  prefill, step = steps["prefill"], steps["decode"]
  assert step.cache.k.shape == (32, 8, 576 + 448 + 64, 32, 128)
  images, prompt = prefill.data
  assert images.shape == (8, 1, 336, 336, 3) and prompt.shape == (8, 448)
  assert images.sharding.spec[0] == "X"
  scopes = lambda s: {e.source_info.name_stack.stack[1].name
                      for e in _jaxpr(s, mesh).eqns
                      if len(e.source_info.name_stack.stack) > 1}
  assert "vision" in scopes(prefill) and "vision" not in scopes(step)


def _jaxpr(step, mesh):
  with jax.sharding.use_abstract_mesh(mesh):
    return jax.make_jaxpr(step.fn)(*step.args).jaxpr


@pytest.mark.parametrize("model,serve,error,message", [
    ("tiny", dict(batch=6, prompt=8, generate=8), PlanError,
     "batch=6 must be a positive multiple of 4 \\(the sequences"),
    ("gpt2", dict(batch=4, prompt=1000, generate=100), ValueError,
     "1000 \\+ 100 = 1100 exceeds gpt2's 1024 learned positions"),
    ("xxl_ffn", {}, ValueError, "no KV cache"),  # no attention
    ("tiny", dict(image_size=64), ValueError, "tiny has no vision tower"),
    ("tiny_vlm", dict(batch=4, prompt=8, generate=8, image_size=36),
     ValueError, "image_size=36"),
])
def test_what_cannot_be_served_is_refused(model, serve, error, message):
  with pytest.raises(error, match=message):
    build_serve_steps(load_model(model), ServeSettings(**serve),
                      _mesh("v5p-8", 4, 1))
