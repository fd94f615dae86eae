"""Training config files as input: a DeepSpeed JSON, Hugging Face
TrainingArguments (with PEFT's LoRA and TRL's bitsandbytes keys) as JSON, or a
LLaMA-Factory YAML, mapped onto this project's run flags (seed 002's cheat
sheet). The kind is detected from the keys; every key that sets nothing here
is named.
"""

from __future__ import annotations

import dataclasses
import json
import os
from typing import Any

# Hugging Face / LLaMA-Factory projection names -> models' LoRA targets.
_HF_TARGETS = {"q_proj": "q", "k_proj": "k", "v_proj": "v", "o_proj": "o",
               "gate_proj": "wi_gate", "up_proj": "wi", "down_proj": "wo"}
_ALL = ("q", "k", "v", "o", "wi", "wi_gate", "wo")
_HF_OPTIMIZERS = {"adamw_torch": "adamw", "adamw_hf": "adamw",
                  "adamw_torch_fused": "adamw", "adamw_apex_fused": "adamw",
                  "adafactor": "adafactor", "sgd": "sgd",
                  # bitsandbytes' AdamW8bit (transformers' OptimizerNames);
                  # its paged variants page the same state to the host
                  # under memory pressure (bitsandbytes' paged optimizers)
                  "adamw_bnb_8bit": "adamw_8bit", "adamw_8bit": "adamw_8bit",
                  "paged_adamw_8bit": "adamw_8bit",
                  "paged_adamw_32bit": "adamw"}
# DeepSpeed ZeRO-Offload / ZeRO-Infinity to CPU memory -> --offload.
_DS_OFFLOADS = {"offload_optimizer": "optimizer", "offload_param": "params"}
_ZERO = {0: "dp", 1: "zero1", 2: "zero2", 3: "zero3"}


@dataclasses.dataclass(frozen=True)
class ConfigRun:
  kind: str  # "DeepSpeed JSON", "Hugging Face TrainingArguments", ...
  flags: dict[str, str]
  mapping: tuple[str, ...]  # "key=value -> --flag=value", in order
  ignored: tuple[str, ...]  # keys that set nothing here


def _load(path: str) -> dict:
  try:
    with open(path, encoding="utf-8") as f:
      text = f.read()
  except (OSError, UnicodeDecodeError) as e:
    raise ValueError(f"--config={path}: {getattr(e, 'strerror', None) or e}"
                     ) from None
  try:
    if path.endswith((".yaml", ".yml")):
      import yaml
      data = yaml.safe_load(text)
    else:
      data = json.loads(text)
  except Exception as e:  # noqa: BLE001 - any parse error, one line
    raise ValueError(f"--config={path}: not valid "
                     f"{'YAML' if path.endswith(('.yaml', '.yml')) else 'JSON'}"
                     f" ({str(e).splitlines()[0]})") from None
  if not isinstance(data, dict):
    raise ValueError(f"--config={path}: a {type(data).__name__}, not a "
                     f"mapping of keys")
  return data


def _int(data: dict, key: str, default: int) -> int:
  value = data.get(key, default)
  if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
    raise ValueError(f"{key}={value!r} must be a positive integer")
  return value


def _targets(value: Any) -> str:
  names = value.split(",") if isinstance(value, str) else list(value or ())
  names = [n.strip() for n in names if n.strip()]
  if any(n in ("all", "all-linear") for n in names):
    return ",".join(_ALL)
  bad = [n for n in names if n not in _HF_TARGETS]
  if bad or not names:
    raise ValueError(f"LoRA target {bad[0] if bad else 'list'!r} is not one "
                     f"of {', '.join(_HF_TARGETS)} or all")
  return ",".join(_HF_TARGETS[n] for n in names)


class _Mapper:
  def __init__(self, data: dict):
    self.data, self.flags, self.mapping, self.used = data, {}, [], set()
    self.auto: list[str] = []  # keys DeepSpeed's launcher fills ("auto")

  def put(self, flag: str, value, why: str, *keys: str) -> None:
    self.flags[flag] = str(value)
    self.mapping.append(f"{why} -> --{flag}={value}")
    self.used.update(keys)

  def batch(self, micro_key: str, devices: int) -> None:
    """--batch and --grad_accum; where either is DeepSpeed's "auto" (the
    launcher fills it in), neither: the run's flags say them."""
    keys = (micro_key, "gradient_accumulation_steps")
    if any(self.data.get(k) == "auto" for k in keys):
      self.auto.extend(k for k in keys if self.data.get(k) == "auto")
      return
    micro = _int(self.data, micro_key, 1)
    accum = _int(self.data, "gradient_accumulation_steps", 1)
    given = lambda key, value: (f"{key}={value}" if key in self.data
                                else f"{key}={value} (default)")
    self.put("batch", micro * accum * devices,
             f"{given(micro_key, micro)} x "
             f"{given('gradient_accumulation_steps', accum)} x {devices} "
             f"devices", *keys)
    self.put("grad_accum", accum, given("gradient_accumulation_steps", accum))

  def done(self, kind: str) -> ConfigRun:
    ignored = tuple(f"{k}={v}" for k, v in self.data.items()
                    if k not in self.used and k not in self.auto) + tuple(
        f"{k}=auto (the launcher's: give the flag)" for k in self.auto)
    return ConfigRun(kind, self.flags, tuple(self.mapping), ignored)


def _one_half_precision(enabled: list[str]) -> None:
  """bf16 and fp16 together: DeepSpeed and the Trainer refuse it too."""
  if len(enabled) > 1:
    raise ValueError("bf16 and fp16 are both enabled; DeepSpeed and the "
                     "Hugging Face Trainer refuse that; enable one")


def _deepspeed(data: dict, devices: int) -> ConfigRun:
  m = _Mapper(data)
  m.batch("train_micro_batch_size_per_gpu", devices)
  if data.get("train_batch_size") == "auto":
    m.auto.append("train_batch_size")
  elif "train_batch_size" in data and "batch" in m.flags:
    m.used.add("train_batch_size")
    if str(data["train_batch_size"]) != m.flags["batch"]:
      raise ValueError(f"train_batch_size={data['train_batch_size']} is not "
                       f"micro-batch x accumulation x {devices} devices = "
                       f"{m.flags['batch']}")
  zero = data.get("zero_optimization", {}) or {}
  stage = zero.get("stage", 0)
  if stage not in _ZERO:
    raise ValueError(f"zero_optimization.stage={stage!r}; valid: 0, 1, 2, 3")
  m.put("shard", _ZERO[stage], f"zero_optimization.stage={stage}",
        "zero_optimization")
  to_cpu = [name for key, name in _DS_OFFLOADS.items()
            if ((zero.get(key) or {}).get("device") or "none") == "cpu"]
  if to_cpu:
    m.put("offload", ",".join(to_cpu), " ".join(
        f"zero_optimization.{k}.device=cpu" for k, name in
        _DS_OFFLOADS.items() if name in to_cpu))
  offload = [f"zero_optimization.{k}={zero[k]}" for k, name in
             _DS_OFFLOADS.items() if k in zero and name not in to_cpu
             and ((zero[k] or {}).get("device") or "none") != "none"]
  enabled = {k: (data.get(k) or {}).get("enabled") for k in ("bf16", "fp16")}
  m.auto.extend(f"{k}.enabled" for k, v in enabled.items() if v == "auto")
  m.used.update(k for k, v in enabled.items() if v == "auto")  # named so
  half = [k for k, v in enabled.items() if v is True]
  _one_half_precision(half)
  if "auto" not in enabled.values():
    m.put("precision", "bf16_master" if half else "mixed",
          f"{half[0]}.enabled=true (16-bit params, f32 master)" if half else
          "no bf16/fp16 (f32 params)", "bf16", "fp16")
  opt = ((data.get("optimizer") or {}).get("type") or "AdamW").lower()
  if opt in ("adam", "adamw"):
    m.put("optimizer", "adamw", f"optimizer.type={opt}" if "optimizer" in data
          else "no optimizer section (the client's AdamW assumed)",
          "optimizer")
  run = m.done("DeepSpeed JSON")
  return dataclasses.replace(run, ignored=run.ignored + tuple(offload))


def _huggingface(data: dict, devices: int) -> ConfigRun:
  m = _Mapper(data)
  m.batch("per_device_train_batch_size", devices)
  half = [k for k in ("bf16", "fp16") if data.get(k)]
  _one_half_precision(half)
  m.put("precision", "mixed", (f"{half[0]}=true" if half else "no bf16/fp16")
        + " (f32 params, autocast)", "bf16", "fp16")
  if "gradient_checkpointing" in data:
    m.put("remat", "full" if data["gradient_checkpointing"] else "none",
          f"gradient_checkpointing={data['gradient_checkpointing']}",
          "gradient_checkpointing")
  _optim(m, data)
  for key in ("max_seq_length", "max_length"):
    if key in data:
      m.put("seq", _int(data, key, 1), f"{key}={data[key]}", key)
  rank = data.get("lora_r", data.get("r"))
  if rank:
    m.put("lora_rank", rank, f"lora_r={rank}", "lora_r", "r")
    m.put("lora_targets", _targets(data.get("target_modules", "q_proj,v_proj")),
          f"target_modules={data.get('target_modules', 'q_proj,v_proj')}",
          "target_modules")
  if data.get("load_in_4bit") or data.get("load_in_8bit"):
    _quantized_base(m, 4 if data.get("load_in_4bit") else 8,
                    data.get("bnb_4bit_quant_type", "nf4"),
                    "load_in_4bit" if data.get("load_in_4bit") else
                    "load_in_8bit", "load_in_4bit", "load_in_8bit",
                    "bnb_4bit_quant_type")
  return m.done("Hugging Face TrainingArguments")


def _optim(m: _Mapper, data: dict) -> None:
  """TrainingArguments' `optim` (LLaMA-Factory passes it on as is)."""
  optim = data.get("optim")
  if optim in _HF_OPTIMIZERS:
    m.put("optimizer", _HF_OPTIMIZERS[optim], f"optim={optim}", "optim")


def _quantized_base(m: _Mapper, bits, kind, why: str, *keys: str) -> None:
  """bitsandbytes' 4-bit (NF4) or 8-bit base (models.quant)."""
  if bits == 8:
    m.put("base_quant", "int8", why, *keys)
  elif bits == 4 and kind == "nf4":
    m.put("base_quant", "nf4", f"{why} (nf4)", *keys)
  else:
    raise ValueError(f"a {bits}-bit {kind} base is not modelled; valid: "
                     "4-bit nf4 or 8-bit")


def _llamafactory(data: dict, devices: int) -> ConfigRun:
  m = _Mapper(data)
  m.batch("per_device_train_batch_size", devices)
  _one_half_precision([k for k in ("bf16", "fp16") if data.get(k)])
  if data.get("pure_bf16"):  # LLaMA-Factory: bf16 weights, no f32 master
    m.put("precision", "bf16", "pure_bf16=true (bf16 params and optimizer "
          "state, no f32 master)", "pure_bf16", "bf16")
  else:
    m.put("precision", "mixed", ("bf16=true" if data.get("bf16") else
                                 "no bf16") + " (f32 params, autocast)",
          "bf16", "pure_bf16")
  if "cutoff_len" in data:
    m.put("seq", _int(data, "cutoff_len", 1), f"cutoff_len={data['cutoff_len']}",
          "cutoff_len")
  if "flash_attn" in data:
    kernel = "materialized" if data["flash_attn"] == "disabled" else "flash"
    m.put("attention", kernel, f"flash_attn={data['flash_attn']}", "flash_attn")
  _optim(m, data)
  if data.get("finetuning_type") == "lora":
    rank = _int(data, "lora_rank", 8)
    m.put("lora_rank", rank, f"finetuning_type=lora lora_rank={rank}",
          "finetuning_type", "lora_rank")
    m.put("lora_targets", _targets(data.get("lora_target", "all")),
          f"lora_target={data.get('lora_target', 'all')}", "lora_target")
  if data.get("quantization_bit") is not None:
    bits = data["quantization_bit"]
    _quantized_base(m, bits, data.get("quantization_type", "nf4"),
                    f"quantization_bit={bits}", "quantization_bit",
                    "quantization_type", "double_quantization")
  return m.done("LLaMA-Factory YAML")


def read_config(path: str, devices: int) -> ConfigRun:
  """The run flags a config file sets, for `devices` data-parallel devices."""
  data = _load(path)
  if "zero_optimization" in data or "train_micro_batch_size_per_gpu" in data:
    return _deepspeed(data, devices)
  if "finetuning_type" in data or "cutoff_len" in data or path.endswith(
      (".yaml", ".yml")):
    return _llamafactory(data, devices)
  if "per_device_train_batch_size" in data:
    return _huggingface(data, devices)
  raise ValueError(f"--config={os.path.basename(path)}: not a DeepSpeed JSON "
                   "(zero_optimization), Hugging Face TrainingArguments JSON "
                   "(per_device_train_batch_size) or LLaMA-Factory YAML")
