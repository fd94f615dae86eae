"""experiments.describe end to end, as a user runs it."""

import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def describe(*flags):
  return subprocess.run([sys.executable, "-m", "experiments.describe", *flags],
                        cwd=ROOT, capture_output=True, text=True, timeout=120)


def test_json_schema_and_layouts():
  out = describe("--model=llama2_7b", "--topology=v5p-128", "--mesh=16x4",
                 "--format=json")
  assert out.returncode == 0, out.stderr
  info = json.loads(out.stdout)
  assert info["num_params"] == 6_738_415_616
  assert info["topology"] == {"name": "v5p-128", "chips": 64,
                              "shape": [4, 4, 4], "hosts": 1}
  assert info["mesh"]["X"] == 16 and info["mesh"]["Y"] == 4
  assert (info["mesh"]["M_X"], info["mesh"]["M_Y"]) == (2, 1)
  wi = next(g for g in info["params"] if g["path"] == "blocks/mlp/wi/kernel")
  assert wi["logical_axes"] == ["layers", "embed", "mlp"]
  assert wi["partition_spec"] == [None, "X", "Y"]
  assert wi["per_device_shape"] == [32, 256, 2752]
  # zero3 mixed precision: f32 params, each device holds 1/64 of every matrix.
  assert info["per_device_param_bytes"] == sum(
      g["per_device_bytes"] for g in info["params"])
  assert info["bytes_by_dtype"] == {"float32": 4 * 6_738_415_616}


def test_text_output_names_the_count_and_chips():
  out = describe("--model=tiny", "--topology=v5p:2x2x1", "--mesh=2x2")
  assert out.returncode == 0, out.stderr
  assert "106,816 parameters" in out.stdout and "4 chips" in out.stdout
  assert "optimizer state (adamw, mixed): 854,532 bytes" in out.stdout
  assert "8.000 bytes per trained parameter" in out.stdout


def test_a_model_with_learned_positions_is_described():
  """gpt2 holds 1024 learned positions, fewer than the default sequence;
  describe needs no sequence (the optimizer state has none)."""
  out = describe("--model=gpt2", "--topology=v5p-8", "--mesh=4x1",
                 "--format=json")
  assert out.returncode == 0, out.stderr
  info = json.loads(out.stdout)
  assert info["num_params"] == 124_439_808
  assert info["optimizer_state_bytes"] == 8 * info["num_params"] + 4


def test_8bit_optimizer_state_bytes():
  """adamw_8bit: a uint8 code per parameter for each moment and an f32
  absmax per block: llama2_7b on 2x2, 2.044 bytes per parameter (blocks of
  2048 over a 2048-wide slice, 128 over 5504-wide MLP slices); adamw 8."""
  flags = ("--model=llama2_7b", "--topology=v5p-8", "--mesh=2x2",
           "--format=json")
  full = json.loads(describe(*flags).stdout)
  eight = json.loads(describe(*flags, "--optimizer=adamw_8bit").stdout)
  assert full["optimizer_state_bytes"] == 8 * full["num_params"] + 4
  per = eight["optimizer_state_bytes"] / eight["num_params"]
  assert 2 < per < 2.05
  assert eight["per_device_optimizer_bytes"] == 3_443_705_356


def test_gpu_hosts_in_json():
  out = describe("--model=tiny", "--topology=h100:2x8", "--mesh=8x2",
                 "--format=json")
  assert out.returncode == 0, out.stderr
  info = json.loads(out.stdout)
  assert info["topology"] == {"name": "h100:2x8", "chips": 16, "shape": [8],
                              "hosts": 2}
  assert (info["mesh"]["x_hosts"], info["mesh"]["y_hosts"]) == (2, 1)


@pytest.mark.parametrize("flags, message", [
    (["--model=nope"], "unknown model 'nope'"),
    (["--topology=v9-8"], "v9-8"),
    (["--topology=v5p-127"], "v5p-127"),
    (["--mesh=8x4"], "mesh 8x4 has 32 devices but v5p-128 has 64 chips"),
    (["--mesh=0x64"], "0x64"),
    (["--mesh=banana"], "banana"),
    (["--model=tiny", "--mesh=1x64"], "Y=64 divides neither the 2 kv heads"),
    (["--model=/no/such/config.json"], "cannot read model config"),
    (["--shard=zero4"], "zero4"),
    (["--topology=h100:16"], "write GPUs per host or hosts x GPUs per host"),
    (["--topology=h100:3x8", "--mesh=2x12"], "Y=12 must divide a host's 8"),
    # adapters on a projection the model lacks would train nothing
    (["--model=gpt2", "--lora_rank=8", "--lora_targets=wi_gate"],
     "gpt2 has no 'wi_gate' projection; valid: q, k, v, o, wi, wo"),
    (["--model=tiny", "--lora_targets=q"], "lora_targets=q without lora_rank"),
])
def test_bad_input_is_one_line_exit_2(flags, message):
  out = describe(*flags)
  assert out.returncode == 2
  assert out.stderr.count("\n") == 1 and "Traceback" not in out.stderr
  assert message in out.stderr



def test_replicas_hold_their_x_shard_of_every_weight():
  """--dp (or a --maxtext run on two slices, base.yml's
  dcn_data_parallelism=-1 making each slice a replica) lays out D x X x Y:
  each weight over X alone, twice the per-device bytes of X over all 32."""
  r = describe("--topology=v5e-16x2",
               "--maxtext=model_name=tiny per_device_batch_size=1",
               "--format=json")
  assert r.returncode == 0, r.stderr
  replicas = json.loads(r.stdout)
  flat = json.loads(describe("--model=tiny", "--topology=v5e-16x2",
                             "--mesh=32x1", "--format=json").stdout)
  assert (replicas["mesh"]["D"], replicas["mesh"]["X"]) == (2, 16)
  assert replicas["per_device_param_bytes"] == 2 * flat["per_device_param_bytes"]


@pytest.mark.parametrize("model", ["tiny_vlm", "llava_mini"])
def test_a_vision_language_model_is_described_at_the_defaults(model):
  """Its parameters do not turn on the sequence: the image tokens plus the
  default seq, which flash attention would refuse, do not stop it."""
  out = describe(f"--model={model}", "--topology=v5p-8")
  assert out.returncode == 0, out.stderr
  assert out.stdout.startswith(f"model {model}: ")
