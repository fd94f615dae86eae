"""Vision-language (LLaVA-style): exact counts, image tokens, the frozen or
trained tower, its layout over the mesh, one-line errors."""

import dataclasses
import json
import math
import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import pytest
from jax.sharding import AbstractMesh, AxisType, PartitionSpec as P

from meshes.layout import abstract_mesh, plan_mesh
from meshes.topology import parse_topology
from models.hf_config import from_hf_config
from models.params import abstract_params, module_class, num_params
from models.presets import PRESETS
from models import decode
from models.config import at_resolution
from models.vision import image_tokens
from simulator import memory
from simulator.inventory import describe_params
from simulator.tracing.program import read_traced
from simulator.settings import TrainSettings
from simulator.step import build_step, trainable_params
from simulator.tracing.trace import trace_probe

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MESH = AbstractMesh((2, 2), ("X", "Y"), axis_types=(AxisType.Explicit,) * 2)
TINY = PRESETS["tiny_vlm"]


def _count(tree) -> int:
  return sum(math.prod(x.shape) for x in jax.tree.leaves(tree))


def test_llava_1_5_7b_counts_as_its_modules_hold_them():
  """CLIP ViT-L/14-336 by its modules: conv 3·14·14·1024 + class 1024 +
  positions 577·1024 + pre/post LayerNorms 2·2048 + 24 layers of
  (4 biased 1024² projections + 2 LayerNorms + 1024→4096→1024 biased MLP)
  = 303,507,456 (x 4 bytes = the 1.21 GB of an f32 tower checkpoint);
  projector 1024·4096+4096 + 4096·4096+4096 = 20,979,712; Vicuna-7B at
  32064 tokens 6,738,939,904."""
  cfg = PRESETS["llava_1_5_7b"]
  params, _ = abstract_params(module_class(cfg)(cfg))
  assert _count(params["vision_tower"]) == 303_507_456
  assert _count([params["projector_in"], params["projector_out"]]) == (
      20_979_712)
  assert _count(params["language_model"]) == 6_738_939_904
  assert num_params(cfg) == 7_063_427_072
  assert image_tokens(cfg, 1) == 576 and image_tokens(cfg, 3) == 1728


def test_resolution_changes_the_position_table_and_the_tokens():
  cfg = at_resolution(TINY, 48, 0)
  assert image_tokens(cfg, 2) == 2 * 36
  grown = num_params(cfg) - num_params(TINY)
  assert grown == (36 - 16) * TINY.vision_d_model  # positions only
  assert at_resolution(TINY, 0, 0) is TINY


def test_frozen_tower_has_no_gradient_and_a_trained_one_does():
  st = TrainSettings(batch=4, seq=16, attention="materialized", remat="none")
  frozen = build_step(TINY, st, MESH)
  trained = build_step(TINY, dataclasses.replace(st, train_vision=True), MESH)
  assert "vision_tower" not in frozen.grads
  assert {"projector_in", "projector_out", "language_model"} <= set(
      frozen.grads)
  tower = _count(frozen.params["vision_tower"])
  assert trainable_params(trained) - trainable_params(frozen) == tower
  plan = plan_mesh(parse_topology("v5p-8"), 2, 2)
  info = describe_params(TINY, plan, st)
  assert info["trainable_params"] == info["num_params"] - tower


def test_the_batch_carries_pixels_and_the_lm_sees_image_then_text():
  st = TrainSettings(batch=4, seq=16, images_per_sample=2,
                     attention="materialized", remat="none")
  step = build_step(TINY, st, MESH)
  assert step.batch["images"].shape == (4, 2, 32, 32, 3)
  assert step.batch["images"].sharding.spec == P("X")
  # The loss reads the text positions only, and the images reach it.
  cfg = TINY
  model = module_class(cfg)(cfg, attention="materialized")
  ids = jnp.arange(32, dtype=jnp.int32).reshape(2, 16) % cfg.vocab_size
  images = jnp.zeros((2, 2, 32, 32, 3), jnp.bfloat16)
  params = jax.jit(model.init)(jax.random.key(0), ids, images, ids)["params"]
  loss = jax.jit(lambda im: model.apply({"params": params}, ids, im, ids))
  assert jnp.shape(loss(images)) == ()
  assert loss(images) != loss(images + 1)
  # The LM's residual stream: 2 images x 16 patches + 16 text positions.
  assert "bf16[2,48,64]" in str(jax.make_jaxpr(loss)(images))


def test_tower_is_laid_out_like_the_lm():
  plan = plan_mesh(parse_topology("v5p-8"), 2, 2)
  info = describe_params(TINY, plan, TrainSettings(batch=4, seq=16))
  spec = {g["path"]: g["partition_spec"] for g in info["params"]}
  assert spec["vision_tower/layers/attn/q/kernel"] == [None, "X", "Y", None]
  assert spec["vision_tower/layers/mlp/wi/kernel"] == [None, "X", "Y"]
  assert spec["projector_in/kernel"] == ["X", "Y"]


def test_replicated_tower_is_whole_on_every_device_and_the_lm_is_not():
  """--vision_sharding=replicated: every tower weight unsplit (stored,
  gradient and optimizer slice), the LM's layout unchanged, and the
  per-device parameter bytes grow by exactly the tower's whole less its
  shard."""
  plan = plan_mesh(parse_topology("v5p-8"), 2, 2)
  st = TrainSettings(batch=4, seq=16, train_vision=True)
  split = describe_params(TINY, plan, st)
  whole = describe_params(
      TINY, plan, dataclasses.replace(st, vision_sharding="replicated"))
  tower = lambda info: {g["path"]: g for g in info["params"]
                        if g["path"].startswith("vision_tower/")}
  for g in tower(whole).values():
    assert set(g["partition_spec"]) <= {None}
    assert g["per_device_shape"] == g["shape"]
  lm = lambda info: [(g["path"], g["partition_spec"]) for g in info["params"]
                     if not g["path"].startswith("vision_tower/")]
  assert lm(whole) == lm(split)
  grown = sum(g["per_device_bytes"] for g in tower(whole).values()) - sum(
      g["per_device_bytes"] for g in tower(split).values())
  assert grown > 0
  assert whole["per_device_param_bytes"] - split["per_device_param_bytes"] == (
      grown)
  step = build_step(TINY, dataclasses.replace(st, vision_sharding="replicated"),
                    MESH)
  for tree in (step.params, step.grads):
    for x in jax.tree.leaves(tree["vision_tower"]):
      assert set(x.sharding.spec) <= {None}


def test_replicated_tower_runs_data_parallel_with_no_collective():
  """A frozen replicated tower gathers nothing and needs no TP collective:
  no collective at all in the tower (its patch embedding and the scanned
  `layers`; the LM's are `blocks`); the sharded tower's has FSDP gathers
  over X and TP collectives over Y."""
  plan = plan_mesh(parse_topology("v5p-8"), 2, 2)
  st = TrainSettings(batch=8, seq=64, remat="none", attention="materialized")
  in_tower = lambda s: [
      c for c in read_traced(trace_probe(TINY, s, abstract_mesh(plan))).collectives
      if c.layer == "layers" or "vision_tower" in c.source]
  assert {(c.kind, c.axis) for c in in_tower(st)} == {
      ("all-gather", "X"), ("all-gather", "Y"), ("reduce-scatter", "Y")}
  assert not in_tower(dataclasses.replace(st, vision_sharding="replicated"))


def test_memory_report_runs_the_tower_backward_only_when_trained():
  plan = plan_mesh(parse_topology("v5p-8"), 2, 2)
  st = TrainSettings(batch=8, seq=64, remat="none", attention="materialized")
  frozen = memory.memory_report(TINY, st, plan)
  trained = memory.memory_report(
      TINY, dataclasses.replace(st, train_vision=True), plan)
  tower = lambda r: [k for k in r.phase_bytes
                     if k.startswith("backward") and "vision_tower" in k]
  assert not tower(frozen) and tower(trained)
  assert trained.per_device_bytes["grads"] > frozen.per_device_bytes["grads"]
  assert trained.per_device_bytes["peak"] > frozen.per_device_bytes["peak"]
  more = memory.memory_report(
      TINY, dataclasses.replace(st, images_per_sample=4), plan)
  assert more.per_device_bytes["peak"] > frozen.per_device_bytes["peak"]


@pytest.mark.parametrize("change, message", [
    (dict(image_size=30), "image_size=30 is not a multiple of patch_size=8"),
    (dict(vision_heads=3), "vision_d_model=32 is not a multiple of "
     "vision_heads=3"),
    (dict(patch_size=0), "patch_size=0 must be a positive integer"),
    (dict(vision_layers=-1), "vision_layers=-1 must be an integer >= 0"),
])
def test_bad_configs_are_one_line_errors(change, message):
  with pytest.raises(ValueError, match=message) as e:
    dataclasses.replace(TINY, **change)
  assert "\n" not in str(e.value)


@pytest.mark.parametrize("args, message", [
    (["--model=tiny", "--images_per_sample=2"],
     "error: images_per_sample=2: tiny has no vision tower; images go with a "
     "vision-language model (e.g. llava_1_5_7b)"),
    (["--model=tiny", "--vision_sharding=replicated"],
     "error: vision_sharding=replicated: tiny has no vision tower; images go "
     "with a vision-language model (e.g. llava_1_5_7b)"),
    (["--model=tiny_vlm", "--vision_sharding=tp"],
     "error: flag --vision_sharding=tp: value should be one of "
     "<sharded|replicated>"),
    (["--model=tiny", "--image_size=224"],
     "error: image_size=224, patch_size=0: tiny has no vision tower; these "
     "set a vision-language model's images"),
    (["--model=tiny_vlm", "--image_size=36"],
     "error: model 'tiny_vlm': image_size=36 is not a multiple of "
     "patch_size=8; choose a patch size dividing the image side"),
    (["--model=tiny_vlm", "--images_per_sample=-1"],
     "error: images_per_sample=-1 must be an integer >= 0 (0: the model's)"),
])
def test_cli_refuses_with_one_line(args, message, refused_by_memory_report):
  refused_by_memory_report(args, message)


@pytest.mark.parametrize("kv_dtype, tol", [
    ("bf16", 2e-3),
    # the int8 cache itself: test_decode.py holds a decoder's to full logits.
    pytest.param("int8", 1e-2, marks=pytest.mark.long)])
def test_served_logits_give_the_training_loss(kv_dtype, tol):
  """LLaVA served (the prefill: the tower on the images and the LM over
  [image tokens; the first text token]; then one decode step per later
  text token at its position after the image tokens) reads the training
  loss over the text; one decode step a position too far does not."""
  images = jax.random.normal(jax.random.key(3), (2, 1, 32, 32, 3))
  ids = jax.random.randint(jax.random.key(4), (2, 6), 0, TINY.vocab_size)
  model = module_class(TINY)(TINY, attention="materialized",
                             dtype=jnp.float32, param_dtype=jnp.float32)
  params = jax.jit(model.init)(jax.random.key(0), ids, images, ids)["params"]
  trained = float(jax.jit(lambda p: model.apply({"params": p}, ids, images,
                                                 ids))(params))
  n = image_tokens(TINY, 1)
  # The weights an argument, not constants: each step compiles once, fast.
  serve = jax.jit(lambda p, c, x, t, pos: model.apply(
      {"params": p}, t, x, cache=c, pos=pos))

  def served(skip=None):
    cache = decode.KVCache(**{
        k: jnp.zeros(shape, dtype) for k, (shape, dtype, _) in
        decode.cache_layout(TINY.n_layers, 2, n + ids.shape[1] + 1,
                            TINY.n_kv_heads, TINY.head_dim, kv_dtype).items()})
    logits, cache = serve(params, cache, images, ids[:, :1], jnp.int32(0))
    steps = [logits]
    for i in range(1, ids.shape[1]):
      logits, cache = serve(params, cache, None, ids[:, i:i + 1],
                            jnp.int32(n + i + (i == skip)))
      steps.append(logits)
    logits_BxSxV = jnp.stack(steps, axis=1)
    nll = (jax.nn.logsumexp(logits_BxSxV, axis=-1) - jnp.take_along_axis(
        logits_BxSxV, ids[..., None], axis=-1)[..., 0])
    return float(jnp.mean(nll))

  error = abs(served() - trained)
  assert error <= tol * abs(trained)
  assert abs(served(skip=3) - trained) > 5 * error


def test_inference_report_serves_the_images_then_the_text():
  """tiny_vlm 2x2: 16 image tokens + 64 + 16 text positions cached; the
  prefill reads the weights LLaVA reads, the decode step no tower or
  projector weight."""
  p = subprocess.run(
      [sys.executable, "-m", "experiments.inference_report",
       "--model=tiny_vlm", "--topology=v5p-8", "--mesh=2x2", "--batch=4",
       "--prompt=64", "--generate=16", "--attention=materialized",
       "--format=json"], cwd=ROOT,
      env={**os.environ, "JAX_PLATFORMS": "cpu"}, capture_output=True,
      text=True, timeout=120)
  assert p.returncode == 0, p.stderr
  data = json.loads(p.stdout)
  # k and v, 2 layers, 2 sequences and 1 kv head per device, 16 dims, bf16
  assert data["kv_cache_bytes"] == 2 * 2 * 2 * (16 + 64 + 16) * 1 * 16 * 2
  decode_phase, prefill = data["phases"]["decode"], data["phases"]["prefill"]
  # every weight but CLIP's post_layernorm (scale and bias of 32), which
  # LLaVA never reads
  assert data["weights_bytes"] + data["kv_cache_bytes"] - prefill[
      "hbm_bytes"] == 2 * 32 * 2
  assert decode_phase["hbm_bytes"] < prefill["hbm_bytes"]


def test_inference_report_refuses_images_for_a_text_model():
  p = subprocess.run(
      [sys.executable, "-m", "experiments.inference_report",
       "--model=tiny", "--topology=v5p-8", "--batch=4", "--prompt=64",
       "--generate=16", "--images_per_sample=2"], cwd=ROOT,
      env={**os.environ, "JAX_PLATFORMS": "cpu"}, capture_output=True,
      text=True, timeout=120)
  assert (p.returncode, p.stderr.strip()) == (
      2, "error: images_per_sample=2: tiny has no vision tower; images go "
      "with a vision-language model (e.g. llava_1_5_7b)")


LLAVA_JSON = os.path.join(ROOT, "models", "configs", "llava-1.5-7b-hf.json")


def test_llava_config_json_is_the_preset():
  """llava-hf/llava-1.5-7b-hf's config.json names only what differs from
  HF's LlamaConfig and CLIPVisionConfig defaults; read with them it is the
  preset."""
  cfg = from_hf_config(LLAVA_JSON)
  assert dataclasses.replace(cfg, name="llava_1_5_7b") == PRESETS[
      "llava_1_5_7b"]


@pytest.mark.parametrize("change, message", [
    ({"vision_feature_select_strategy": "full"},
     "vision_feature_select_strategy='full' is not supported; valid: "
     "default"),
    ({"text_config": {"model_type": "mistral"}},
     "text_config.model_type='mistral' is not supported; valid: llama"),
    ({"vision_config": {"model_type": "clip_vision_model", "image_size": 100,
                        "patch_size": 14}},
     "image_size=100 is not a multiple of patch_size=14"),
    ({"vision_config": None}, "a llava config.json needs text_config and "
     "vision_config objects"),
])
def test_bad_llava_config_json_is_one_line(tmp_path, change, message):
  with open(LLAVA_JSON) as f:
    raw = {**json.load(f), **change}
  path = tmp_path / "llava.json"
  path.write_text(json.dumps(raw))
  with pytest.raises(ValueError, match=message) as e:
    from_hf_config(str(path))
  assert "\n" not in str(e.value)
