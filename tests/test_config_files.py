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
    ("x.yaml", "quantization_bit: 2\n", "quantization_bit=2: the base's bits"),
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


@pytest.mark.parametrize("text,match", [
    # a DeepSpeed section given as a value: named, with its form
    ('{"train_micro_batch_size_per_gpu": 1, "bf16": true}',
     r'bf16=True must be an object like \{"enabled": true\}'),
    ('{"zero_optimization": "stage3"}', "zero_optimization='stage3' must be"),
    ('{"zero_optimization": {"stage": 3, "offload_optimizer": "cpu"}}',
     "zero_optimization.offload_optimizer='cpu' must be an object"),
    ('{"zero_optimization": {"stage": 1}, "optimizer": {"type": 5}}',
     "optimizer.type=5 must be a name"),
    ('{"zero_optimization": {"stage": [3]}}', r"stage=\[3\]; valid: 0, 1, 2"),
    ('{"zero_optimization": {"stage": true}}', "stage=True; valid"),
    ('{"zero_optimization": {"stage": 1}, "bf16": {"enabled": "true"}}',
     "bf16.enabled='true'; valid: true, false"),
    ('{"zero_optimization": {"stage": 1}, "gradient_accumulation_steps": '
     '1000000000000}', "must be a positive integer below 2\\*\\*31"),
    ('{"zero_optimization": {"stage": 1}, "train_micro_batch_size_per_gpu": '
     '65536, "gradient_accumulation_steps": 65536}', "not below 2\\*\\*31"),
    ('{"train_batch_size": 30, "gradient_accumulation_steps": 4, '
     '"zero_optimization": {"stage": 2}}', "train_batch_size=30 is not a "
     "multiple of gradient_accumulation_steps=4 x 4 devices"),
    # Trainer and PEFT keys of the wrong type
    ('{"per_device_train_batch_size": 1, "lora_r": "abc"}',
     "lora_r='abc' must be a positive integer"),
    ('{"per_device_train_batch_size": 1, "lora_r": 8.5}', "lora_r=8.5 must"),
    ('{"per_device_train_batch_size": 1, "lora_r": 8, "target_modules": 5}',
     "LoRA targets 5 must be names"),
    ('{"per_device_train_batch_size": 1, "gradient_checkpointing": "false"}',
     "gradient_checkpointing='false' must be true or false"),
])
def test_values_of_the_wrong_type_are_named(tmp_path, text, match):
  with pytest.raises(ValueError, match=match):
    read_config(_write(tmp_path, "x.json", text), devices=4)


@pytest.mark.parametrize("text,match", [
    ("finetuning_type: lora\nlora_target: 5\n", "LoRA targets 5 must be"),
    ("finetuning_type: lora\nlora_target: [q_proj, 5]\n",
     r"LoRA targets \['q_proj', 5\] must be"),
    ("finetuning_type: lora\nlora_target: ''\n", "LoRA target '' is not one"),
    ("finetuning_type: lora\nquantization_bit: '4'\n",
     "quantization_bit='4': the base's bits must be 4"),
    ("cutoff_len: 1024\nflash_attn: eager\n",
     "flash_attn='eager'; valid: auto, sdpa, fa2, disabled"),
    ("cutoff_len: 1024\n", None),
    ("# only a comment\n", "the file is empty"),
    ("finetuning_type: full\ndeepspeed: missing.json\n",
     "deepspeed=missing.json \\(in x.yaml\\): No such file"),
])
def test_llama_factory_values_named(tmp_path, text, match):
  path = _write(tmp_path, "x.yaml", text)
  if match is None:
    assert read_config(path, devices=1).flags["seq"] == "1024"
  else:
    with pytest.raises(ValueError, match=match):
      read_config(path, devices=1)


def test_deepspeed_derives_the_micro_batch_and_keeps_param_offload_to_stage_3(
    tmp_path):
  """DeepSpeed derives the micro-batch from train_batch_size; it offloads
  parameters only at stage 3 (offload_param below it is named, not
  modelled)."""
  run = read_config(_write(tmp_path, "ds.json", json.dumps({
      "train_batch_size": 32, "gradient_accumulation_steps": 4,
      "zero_optimization": {"stage": 2, "offload_param": {"device": "cpu"},
                            "offload_optimizer": {"device": "cpu"}}})),
      devices=4)
  assert (run.flags["batch"], run.flags["grad_accum"], run.flags["offload"]) \
      == ("32", "4", "optimizer")
  assert any("offload_param (DeepSpeed offloads parameters only at stage 3"
             in i for i in run.ignored)


def test_a_trainer_config_reads_the_deepspeed_file_it_names(tmp_path):
  """LLaMA-Factory's and the Trainer's `deepspeed:` key: its ZeRO stage and
  offloads, the path relative to the config's folder."""
  _write(tmp_path, "z3.json", json.dumps({
      "train_micro_batch_size_per_gpu": "auto", "zero_optimization": {
          "stage": 3, "offload_optimizer": {"device": "cpu"},
          "offload_param": {"device": "cpu"}}}))
  run = read_config(_write(tmp_path, "lf.yaml", "finetuning_type: full\n"
                           "deepspeed: z3.json\nper_device_train_batch_size: 2"
                           "\ndisable_gradient_checkpointing: true\n"),
                    devices=8)
  assert (run.flags["shard"], run.flags["offload"], run.flags["batch"],
          run.flags["remat"]) == ("zero3", "optimizer,params", "16", "none")
  assert "deepspeed=z3.json: zero_optimization.stage=3 -> --shard=zero3" in (
      run.mapping)
  assert not any(i.startswith("deepspeed=") for i in run.ignored)
  hf = read_config(_write(tmp_path, "hf.json", json.dumps({
      "per_device_train_batch_size": 1, "deepspeed": str(tmp_path / "z3.json")
  })), devices=1)
  assert hf.flags["shard"] == "zero3"


def test_an_axolotl_yaml(tmp_path):
  """axolotl's keys: micro_batch_size, sequence_len, adapter qlora with
  lora_target_linear, optimizer, gradient_checkpointing, flash_attention."""
  run = read_config(_write(tmp_path, "ax.yaml", (
      "base_model: meta-llama/Llama-2-7b-hf\nadapter: qlora\nload_in_4bit: "
      "true\nlora_r: 32\nlora_target_linear: true\nsequence_len: 4096\n"
      "micro_batch_size: 2\ngradient_accumulation_steps: 4\noptimizer: "
      "paged_adamw_8bit\ngradient_checkpointing: true\nflash_attention: true\n"
      "bf16: auto\n")), devices=2)
  assert run.kind == "axolotl YAML"
  assert run.flags == {
      "batch": "16", "grad_accum": "4", "precision": "mixed", "seq": "4096",
      "remat": "full", "attention": "flash", "optimizer": "adamw_8bit",
      "lora_rank": "32", "lora_targets": "q,k,v,o,wi,wi_gate,wo",
      "base_quant": "nf4"}
  assert run.ignored == ("base_model=meta-llama/Llama-2-7b-hf",)
  lora = read_config(_write(tmp_path, "ax2.yaml", "adapter: lora\n"
                            "micro_batch_size: 1\nload_in_8bit: true\n"),
                     devices=1)
  assert (lora.flags["lora_targets"], lora.flags["base_quant"]) == (
      "q,v", "int8")
  with pytest.raises(ValueError, match="adapter='ia3'; valid: lora, qlora"):
    read_config(_write(tmp_path, "ax3.yaml", "adapter: ia3\n"), devices=1)
