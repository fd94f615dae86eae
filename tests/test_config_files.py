"""simulator.config_files and --config: training configs as input."""

import json
import os
import subprocess
import sys

import pytest

from simulator.config_files import read_config

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _write(tmp_path, name, text):
  path = tmp_path / name
  path.write_text(text)
  return str(path)


def test_a_deepspeed_json(tmp_path):
  path = _write(tmp_path, "ds.json", json.dumps({
      "train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 4,
      "train_batch_size": 64, "bf16": {"enabled": True},
      "zero_optimization": {"stage": 2, "offload_optimizer": {"device": "cpu"}},
      "gradient_clipping": 1.0}))
  run = read_config(path, devices=8)
  assert run.kind == "DeepSpeed JSON"
  assert run.flags == {"batch": "64", "grad_accum": "4", "shard": "zero2",
                       "offload": "optimizer", "precision": "bf16_master",
                       "optimizer": "adamw"}
  assert run.ignored == ("gradient_clipping=1.0",)
  with pytest.raises(ValueError, match="train_batch_size=64 is not"):
    read_config(path, devices=4)


def test_deepspeed_auto_values_nvme_and_two_half_precisions(tmp_path):
  """The Trainer's "auto" values set nothing (the run's flags say them),
  named as the launcher's; ZeRO-Infinity's NVMe offload is not expressed;
  bf16 and fp16 together are refused, as DeepSpeed refuses them."""
  run = read_config(_write(tmp_path, "auto.json", json.dumps({
      "train_micro_batch_size_per_gpu": "auto", "train_batch_size": "auto",
      "gradient_accumulation_steps": "auto", "bf16": {"enabled": "auto"},
      "zero_optimization": {"stage": 3, "offload_param": {"device": "nvme"}}
  })), devices=8)
  assert run.flags == {"shard": "zero3", "optimizer": "adamw"}
  assert "bf16.enabled=auto (the launcher's: give the flag)" in run.ignored
  assert not any(i.startswith("bf16=") for i in run.ignored)  # once
  assert "train_micro_batch_size_per_gpu=auto (the launcher's: give the flag)" in (
      run.ignored)
  assert any(i.startswith("zero_optimization.offload_param=") for i in
             run.ignored)
  with pytest.raises(ValueError, match="bf16 and fp16 are both enabled"):
    read_config(_write(tmp_path, "both.json", json.dumps({
        "train_micro_batch_size_per_gpu": 1, "bf16": {"enabled": True},
        "fp16": {"enabled": True}})), devices=8)


def test_llama_factory_pure_bf16_and_a_paged_8bit_optimizer(tmp_path):
  run = read_config(_write(tmp_path, "lf.yaml", "per_device_train_batch_size: "
                           "2\npure_bf16: true\noptim: paged_adamw_8bit\n"),
                    devices=4)
  assert (run.flags["precision"], run.flags["optimizer"]) == (
      "bf16", "adamw_8bit")
  assert not run.ignored


def test_hugging_face_training_arguments_with_peft(tmp_path):
  path = _write(tmp_path, "hf.json", json.dumps({
      "per_device_train_batch_size": 4, "gradient_accumulation_steps": 2,
      "bf16": True, "gradient_checkpointing": False, "optim": "adafactor",
      "lora_r": 8, "target_modules": ["q_proj", "k_proj", "v_proj",
                                      "o_proj"], "output_dir": "x"}))
  run = read_config(path, devices=4)
  assert run.flags == {"batch": "32", "grad_accum": "2", "precision": "mixed",
                       "remat": "none", "optimizer": "adafactor",
                       "lora_rank": "8", "lora_targets": "q,k,v,o"}
  assert run.ignored == ("output_dir=x",)


def test_a_llama_factory_yaml(tmp_path):
  path = _write(tmp_path, "lf.yaml", "finetuning_type: lora\nlora_rank: 16\n"
                "lora_target: q_proj,v_proj\nper_device_train_batch_size: 1\n"
                "gradient_accumulation_steps: 8\ncutoff_len: 2048\nbf16: true\n"
                "flash_attn: disabled\nquantization_bit: 4\n")
  run = read_config(path, devices=2)
  assert run.flags == {"batch": "16", "grad_accum": "8", "precision": "mixed",
                       "seq": "2048", "attention": "materialized",
                       "lora_rank": "16", "lora_targets": "q,v",
                       "base_quant": "nf4"}
  assert run.ignored == ()


@pytest.mark.parametrize("text,quant", [
    ('{"per_device_train_batch_size": 1, "load_in_4bit": true, '
     '"bnb_4bit_quant_type": "nf4"}', "nf4"),
    ('{"per_device_train_batch_size": 1, "load_in_8bit": true}', "int8"),
    ("finetuning_type: lora\nquantization_bit: 8\n", "int8"),
])
def test_a_quantized_base(tmp_path, text, quant):
  name = "q.yaml" if "finetuning_type" in text else "q.json"
  run = read_config(_write(tmp_path, name, text), devices=1)
  assert run.flags["base_quant"] == quant and not run.ignored


@pytest.mark.parametrize("name,text", [
    ("hf.json", '{"per_device_train_batch_size": 1, "optim": "adamw_bnb_8bit"}'),
    ("hf.json", '{"per_device_train_batch_size": 1, "optim": "adamw_8bit"}'),
    ("lf.yaml", "finetuning_type: full\noptim: adamw_bnb_8bit\n"),
])
def test_bitsandbytes_8bit_adamw(tmp_path, name, text):
  """transformers' adamw_bnb_8bit / adamw_8bit (LLaMA-Factory passes `optim`
  on to TrainingArguments) is --optimizer=adamw_8bit."""
  run = read_config(_write(tmp_path, name, text), devices=1)
  assert run.flags["optimizer"] == "adamw_8bit"
  assert not any(i.startswith("optim=") for i in run.ignored)


@pytest.mark.parametrize("name,text,match", [
    ("x.json", "{not json", "not valid JSON"),
    ("x.json", "[1, 2]", "a list, not a mapping"),
    ("x.json", '{"learning_rate": 1}', "not a DeepSpeed JSON"),
    ("x.json", '{"per_device_train_batch_size": true}', "must be a positive"),
    ("x.yaml", "finetuning_type: lora\nlora_target: wq\n", "'wq' is not one"),
    ("x.yaml", "quantization_bit: 4\nquantization_type: fp4\n",
     "4-bit fp4 base is not modelled"),
    ("x.yaml", "quantization_bit: 2\n", "2-bit nf4 base is not modelled"),
])
def test_bad_files(tmp_path, name, text, match):
  with pytest.raises(ValueError, match=match):
    read_config(_write(tmp_path, name, text), devices=4)


def _memory_report(*args):
  return subprocess.run(
      [sys.executable, "-m", "experiments.memory_report", "--model=tiny",
       "--seq=64", *args], cwd=ROOT,
      env={**os.environ, "JAX_PLATFORMS": "cpu"}, capture_output=True,
      text=True, timeout=120)


def test_the_flag_maps_and_explicit_flags_win(tmp_path):
  path = _write(tmp_path, "ds.json", json.dumps({
      "train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": 2,
      "zero_optimization": {"stage": 1}}))
  out = _memory_report("--topology=v5p-8", "--mesh=2x2", f"--config={path}",
                       "--grad_accum=1")
  assert out.returncode == 0, out.stderr
  assert "config: --grad_accum=1 given explicitly wins over 2" in out.stderr
  assert "tiny: batch 4 x seq 64" in out.stdout  # 1 x 2 x X=2
  assert "X shards zero1" in out.stdout and "micro-batches" not in out.stdout
  bad = _memory_report("--topology=v5p-8", "--config=/no/such.json")
  assert bad.returncode == 2 and bad.stderr.strip() == (
      "error: --config=/no/such.json: No such file or directory")


def test_replicas_count_as_data_parallel_devices_and_maxtext_is_refused(
    tmp_path):
  """With --dp the batch is split over D x X devices; --maxtext beside
  --config is refused (both describe the run)."""
  path = _write(tmp_path, "ds.json", json.dumps({
      "train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 1,
      "zero_optimization": {"stage": 1}}))
  out = _memory_report("--topology=v5p-16", "--dp=2", "--mesh=4x1",
                       f"--config={path}")
  assert "x 8 devices -> --batch=16" in out.stderr, out.stderr
  both = _memory_report("--topology=v5p-8", f"--config={path}",
                        "--maxtext=model_name=tiny")
  assert both.returncode == 2 and both.stderr.strip().startswith(
      "error: --maxtext and --config=")
