"""models.maxtext: MaxText's scaled models and its overrides as flags."""

import os
import subprocess
import sys

import pytest

from models import maxtext
from models.params import num_params
from models.registry import load_model
from models.remat import MAXTEXT_POLICIES, canonical, policy

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.mark.parametrize("name,dims", [
    # MaxText's get_individual_scales over each base.yml (emb, heads, mlp,
    # layers), worked by hand: log2(scale) = 3b + r.
    ("maxtext2023-16b", (5120, 32, 32768, 32)),  # b=1 r=1
    ("maxtext2023-32b", (10240, 32, 32768, 32)),  # b=1 r=2
    ("maxtext2023-1024b", (20480, 128, 131072, 128)),  # b=3 r=1
    ("maxtext-64b", (8192, 64, 28672, 64)),  # b=2 r=0
    ("maxtext-128b", (8192, 128, 57344, 64)),  # b=2 r=1
])
def test_global_parameter_scale_models(name, dims):
  c = load_model(name)
  assert (c.d_model, c.n_heads, c.d_ff, c.n_layers) == dims


def test_the_2023_base_is_maxtexts_default_decoder_of_then():
  c = load_model("maxtext2023-32b")
  assert (c.parallel_block, c.mlp, c.tie_embeddings, c.head_dim,
          c.vocab_size) == (True, "relu", True, 256, 32768)
  assert 32.4e9 < num_params(c) < 32.7e9  # MaxText's "32B"
  assert 31.6e9 < num_params(load_model("maxtext-32b")) < 31.7e9


def test_a_scale_must_be_a_power_of_two():
  with pytest.raises(ValueError, match="power of 2"):
    maxtext.scaled_model("maxtext", 24)


def test_maxtext_remat_names():
  assert canonical("minimal") == "dots" and canonical("full") == "full"
  for name in MAXTEXT_POLICIES:
    policy(name)  # every one is a valid policy here
  with pytest.raises(ValueError, match="MaxText's"):
    policy("save_everything")


@pytest.mark.parametrize("spec,match", [
    ("names:qkv+offload:qkv", "both saved and offloaded"),
    ("offload:qkv+names:mlpwo", "names:<list>.offload:<list>"),
    ("names:qkv+offload:mlpwo+offload:out_proj", "at most one"),
    ("names:qkv,qkv", "given twice"),
    ("names:qkv+offload:everything", "'everything' is not a checkpoint name"),
])
def test_combined_remat_specs_are_checked(spec, match):
  policy("names:qkv,mlpwi+offload:decoder_layer_input,out_proj")  # valid
  with pytest.raises(ValueError, match=match):
    policy(spec)


# The tuning_params of MaxText's Trillium recipes (benchmarks/
# maxtext_trillium_model_configs.py: llama3_1_70b_8192, and
# llama3_1_8b_8192's with out_proj offloaded too).
_RECIPE = ("remat_policy=custom decoder_layer_input=offload query_proj=offload"
           " key_proj=offload value_proj=offload")


_CUSTOM = "model_name=llama2-70b remat_policy=custom "


@pytest.mark.parametrize("text,remat", [
    (_RECIPE, "offload:decoder_layer_input,qkv"),
    (_RECIPE + " out_proj=offload", "offload:decoder_layer_input,qkv,out_proj"),
    ("remat_policy=custom", "full"),  # every tensor at its default
    ("remat_policy=custom mlpwi_0=device mlpwi_1=device context=offload",
     "names:mlpwi+offload:attn_out"),
    # An ungated MLP's input projection is MaxText's mlpwi.
    ("remat_policy=custom mlpwi=device mlp_activations=gelu", "names:mlpwi"),
    ("remat_policy=custom fused_qkv=true qkv_proj=device", "names:qkv"),
])
def test_custom_remat_maps_maxtext_tensors(text, remat):
  scale = "" if "mlp_activations" in text else "model_name=llama2-70b "
  run = maxtext.maxtext_run(scale + text, chips=64)
  assert run.flags["remat"] == remat and not run.unexpressed
  policy(remat)
  assert any(m.startswith("remat_policy=custom") and m.endswith(
      f"--remat={remat}") for m in run.mapping)


def test_overrides_map_onto_flags():
  run = maxtext.maxtext_run(
      "global_parameter_scale=32 decoder_block=default per_device_batch_size=8"
      " remat_policy=minimal ici_fsdp_parallelism=-1 ici_tensor_parallelism=4"
      " max_target_length=2048 attention='flash' use_iota_embed=true steps=30"
      " int8_training=false", chips=64)
  assert run.flags == {"model": "maxtext2023-32b", "batch": "512",
                       "seq": "2048", "mesh": "16x4", "remat": "minimal",
                       "attention": "flash", "precision": "mixed",
                       "optimizer": "adamw"}
  assert run.unexpressed == ("use_iota_embed=true", "int8_training=false")
  assert "per_device_batch_size=8 (8 x 64 chips) -> --batch=512" in run.mapping
  preset = maxtext.maxtext_run("model_name=llama2-70b per_device_batch_size=4"
                               " ici_fsdp_parallelism=16 "
                               "ici_tensor_parallelism=4", chips=64)
  assert (preset.flags["model"], preset.flags["mesh"]) == ("llama2_70b", "16x4")


@pytest.mark.parametrize("text,mesh", [
    # MaxText's Trillium llama2-70b benchmark: FSDP over fsdp_transpose.
    ("ici_fsdp_parallelism=1 ici_fsdp_transpose_parallelism=-1", "64x1"),
    ("ici_fsdp_transpose_parallelism=-1", "64x1"),
    ("ici_fsdp_parallelism=-1 ici_fsdp_transpose_parallelism=4 "
     "ici_tensor_parallelism=2", "32x2"),
    ("ici_fsdp_parallelism=4 ici_fsdp_transpose_parallelism=4 "
     "ici_tensor_parallelism=4", "16x4"),
])
def test_fsdp_transpose_joins_x(text, mesh):
  run = maxtext.maxtext_run(f"model_name=llama2-70b {text}", chips=64)
  assert run.flags["mesh"] == mesh and not run.unexpressed


@pytest.mark.parametrize("text,slices,mesh,dp", [
    # base.yml's dcn_data_parallelism=-1: each slice a data-parallel replica
    ("ici_fsdp_parallelism=-1", 2, "32x1", "2"),
    ("ici_fsdp_parallelism=16 ici_tensor_parallelism=2", 2, "16x2", "2"),
    ("dcn_data_parallelism=1 dcn_fsdp_parallelism=-1", 2, "64x1", None),
    ("ici_data_parallelism=2 ici_fsdp_parallelism=-1", 1, "32x1", "2"),
    ("ici_data_parallelism=2 dcn_data_parallelism=2", 2, "16x1", "4"),
])
def test_the_data_axis_is_replicas_and_fsdp_is_x(text, slices, mesh, dp):
  """MaxText's ici_* parallelisms multiply to a slice's chips, the dcn_*
  ones to the slices; its data axis (ici and dcn) is --dp, fsdp X (over
  slices too with dcn_fsdp_parallelism)."""
  run = maxtext.maxtext_run(f"model_name=llama2-70b {text}", chips=64,
                            slices=slices)
  assert (run.flags["mesh"], run.flags.get("dp")) == (mesh, dp)
  assert not run.unexpressed


def test_pipeline_stages_are_pp_and_a_circular_pipeline_is_refused():
  """MaxText's ici/dcn_pipeline_parallelism is --pp (its microbatches -1:
  one per stage) where each stage holds its layers whole; its default of
  one layer per stage, a circular pipeline, is refused with the value that
  makes one repeat."""
  run = maxtext.maxtext_run(
      "model_name=llama2-70b ici_pipeline_parallelism=4 "
      "num_layers_per_pipeline_stage=20 num_pipeline_microbatches=8",
      chips=64)
  assert (run.flags["mesh"], run.flags["pp"], run.flags["microbatches"]) == (
      "16x1", "4", "8")
  assert not run.unexpressed
  run = maxtext.maxtext_run("model_name=llama2-70b ici_pipeline_parallelism=2"
                            " num_layers_per_pipeline_stage=40", chips=64)
  assert run.flags["microbatches"] == "2"
  with pytest.raises(ValueError, match="runs 80 layers in 20 repeats .a "
                     "circular pipeline.; .* give num_layers_per_pipeline_"
                     "stage=20"):
    maxtext.maxtext_run("model_name=llama2-70b ici_pipeline_parallelism=4",
                        chips=64)


@pytest.mark.parametrize("text,match", [
    ("ici_fsdp_parallelism=8 ici_tensor_parallelism=4", "is not 64 chips"),
    ("ici_tensor_parallelism=3", "ici_tensor_parallelism=3 does not divide "
     "64 chips .a slice's., so ici_fsdp_parallelism=-1 has no value; give "
     "degrees whose product divides 64: 1, 2, 4, 8, 16, 32, 64"),
    ("model_name=gpt4", "unknown model 'gpt4'; valid: gpt2"),
    ("dcn_tensor_parallelism=2", "dcn_tensor_parallelism=2 with "
     "ici_tensor_parallelism=1: tensor parallelism across slices or hosts is "
     "laid over whole ones here; give ici_tensor_parallelism=64"),
    ("dcn_data_parallelism=3", "dcn_data_parallelism=3 is not 1 slices"),
    ("ici_fsdp_parallelism=2 ici_fsdp_transpose_parallelism=2", "is not 64"),
    ("ici_fsdp_parallelism=-1 ici_fsdp_transpose_parallelism=-1", "one of them may be -1"),
    ("remat_policy=everything", "remat_policy='everything'"),
    ("per_device_batch_size=two", "must be a number"),
    ("per_device_batch_size=0.01", "per_device_batch_size=0.01 x 64 chips = "
     "0.64 is not a whole positive number"),
    ("per_device_batch_size=nan", "is not a whole positive number"),
    ("model_name=gemma-2b", "MaxText model_name=gemma-2b: unknown model "
     "'gemma_2b'"),
    ("weight_dtype=float99", "weight_dtype='float99'; valid here: float32, "
     "bfloat16"),
    ("dtype=float32", "dtype='float32'; valid here: bfloat16"),
    ("just_a_word", "is not key=value"),
    ("", "no key=value"),
    # remat_policy=custom: what this project saves or offloads as one.
    (_CUSTOM + "query_proj=offload",
     "query_proj=offload key_proj=remat value_proj=remat"),
    (_CUSTOM + "mlpwi_0=device", "mlpwi_0=device mlpwi_1=remat"),
    (_CUSTOM + "decoder_layer_input=remat", "valid: device, offload"),
    (_CUSTOM + "context=host", "context='host'; valid: remat, device, offload"),
])
def test_bad_overrides_say_what_is_wrong(text, match):
  with pytest.raises(ValueError, match=match):
    maxtext.maxtext_run(text, chips=64)


def test_a_serving_run_maps_its_lengths_and_cache():
  """MaxText's decode run: the prompt is max_prefill_predict_length, the
  cache max_target_length long (the rest generated), quantize_kvcache the
  int8 cache; training's --seq is not set, and a prompt as long as the
  cache is refused."""
  run = maxtext.maxtext_run(
      "model_name=llama2-7b per_device_batch_size=4 max_target_length=2048 "
      "max_prefill_predict_length=1024 quantize_kvcache=true", chips=4,
      serving=True)
  assert {k: run.flags[k] for k in ("batch", "prompt", "generate",
                                    "kv_dtype")} == {
      "batch": "16", "prompt": "1024", "generate": "1024", "kv_dtype": "int8"}
  assert "seq" not in run.flags and not run.unexpressed
  assert maxtext.maxtext_run("model_name=llama2-7b", chips=4, serving=True
                             ).flags["prompt"] == "64"  # base.yml's default
  trained = maxtext.maxtext_run("model_name=llama2-7b quantize_kvcache=true",
                                chips=4)
  assert trained.unexpressed == ("quantize_kvcache=true",)
  with pytest.raises(ValueError, match="max_prefill_predict_length=2048 with "
                     "max_target_length=2048 .default.: the prompt must be"):
    maxtext.maxtext_run("model_name=llama2-7b max_prefill_predict_length=2048",
                        chips=4, serving=True)


def _memory_report(*args):
  env = {**os.environ, "JAX_PLATFORMS": "cpu"}
  return subprocess.run([sys.executable, "-m", "experiments.memory_report",
                         "--topology=v5p-8", *args], cwd=ROOT, env=env,
                        capture_output=True, text=True, timeout=120)


def test_the_maxtext_flag_prints_its_mapping_and_refuses_a_conflict():
  text = ("--maxtext=model_name=tiny per_device_batch_size=2 "
          "max_target_length=64 ici_tensor_parallelism=2 sa_block_q=512")
  out = _memory_report(text)
  assert out.returncode == 0, out.stderr
  assert ("maxtext: ici_fsdp_parallelism=2 (-1 resolved) "
          "ici_tensor_parallelism=2 -> --mesh=2x2") in out.stderr
  assert "not expressed here (ignored): sa_block_q=512" in out.stderr
  assert "tiny: batch 8 x seq 64" in out.stdout
  missing = _memory_report("--maxtext=@/no/such/file")
  assert missing.returncode == 2 and missing.stderr.strip() == (
      "error: --maxtext=@/no/such/file: No such file or directory; give @FILE "
      "of key=value overrides")
  clash = _memory_report(text, "--batch=16")
  assert clash.returncode == 2
  assert clash.stderr.strip() == ("error: --batch=16 and --maxtext (which "
                                  "sets --batch=8) are both given; give one")


@pytest.mark.parametrize("extra,flag,unexpressed", [
    # GShard capacity dispatch, as this project's: mapped.
    ("capacity_factor=1.25", "1.25", ("megablox=true (default)",
                                      "sparse_matmul=true (default)")),
    # MaxText's dropless dense path (every expert on every token): named.
    ("capacity_factor=-1 megablox=false sparse_matmul=false", None,
     ("capacity_factor=-1 (dropless)",)),
])
def test_capacity_factor_maps_or_is_named(extra, flag, unexpressed):
  run = maxtext.maxtext_run(f"model_name=mixtral-8x7b {extra}", chips=64)
  assert run.flags.get("capacity_factor") == flag
  assert run.unexpressed == unexpressed


def test_a_fractional_per_device_batch_is_a_whole_global_batch():
  """MaxText's per_device_batch_size may be fractional where the global
  batch (it times the chips) is whole."""
  run = maxtext.maxtext_run("model_name=llama2-70b per_device_batch_size=0.5",
                            chips=64)
  assert run.flags["batch"] == "32"
  assert "per_device_batch_size=0.5 (0.5 x 64 chips) -> --batch=32" in (
      run.mapping)


def test_tensor_parallelism_over_whole_hosts():
  """dcn_tensor_parallelism with every GPU of a host in ici's tensor axis:
  Y spans the hosts (--mesh accepts the same plan)."""
  run = maxtext.maxtext_run("model_name=llama2-70b ici_fsdp_parallelism=1 "
                            "ici_tensor_parallelism=8 dcn_tensor_parallelism=2",
                            chips=16, slices=2)
  assert run.flags["mesh"] == "1x16" and "dp" not in run.flags


def test_overrides_are_read_as_a_shell_reads_them():
  """A quoted value keeps its spaces; # starts a comment; an unclosed quote
  is named."""
  assert maxtext.parse_overrides(
      'model_name=llama2-7b run_name="my run"  # a comment\n'
      "per_device_batch_size='2'") == {
          "model_name": "llama2-7b", "run_name": "my run",
          "per_device_batch_size": "2"}
  with pytest.raises(ValueError, match="No closing quotation"):
    maxtext.parse_overrides('run_name="my run')
