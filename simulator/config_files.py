"""Training config files as input: a DeepSpeed JSON, Hugging Face
TrainingArguments (with PEFT's LoRA and TRL's bitsandbytes keys) as JSON, a
LLaMA-Factory YAML or an axolotl YAML, mapped onto this project's run flags
(seed 002's cheat sheet). The kind is detected from the keys; every key that
sets nothing here is named, and a value of the wrong type is refused by name.
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
# PEFT's default targets for LLaMA-style models (its
# TRANSFORMERS_MODELS_TO_LORA_TARGET_MODULES_MAPPING), used where a config
# names an adapter and no targets.
_PEFT_DEFAULT = "q_proj,v_proj"
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
# LLaMA-Factory's `flash_attn` choices (its AttentionFunction): "disabled"
# is the eager attention, which writes the score matrix.
_LF_ATTENTION = {"auto": "flash", "sdpa": "flash", "fa2": "flash",
                 "disabled": "materialized"}
# What each DeepSpeed section must look like, for the error that names it.
_SECTION_EXAMPLES = {"bf16": '{"enabled": true}', "fp16": '{"enabled": true}',
                     "zero_optimization": '{"stage": 3}',
                     "optimizer": '{"type": "AdamW"}',
                     "offload_optimizer": '{"device": "cpu"}',
                     "offload_param": '{"device": "cpu"}'}
_LIMIT = 2**31  # sizes the traced program indexes with int32


@dataclasses.dataclass(frozen=True)
class ConfigRun:
  kind: str  # "DeepSpeed JSON", "Hugging Face TrainingArguments", ...
  flags: dict[str, str]
  mapping: tuple[str, ...]  # "key=value -> --flag=value", in order
  ignored: tuple[str, ...]  # keys that set nothing here


def _load(path: str, label: str) -> dict:
  """The mapping a JSON or YAML file holds; `label` names it in errors."""
  try:
    with open(path, encoding="utf-8") as f:
      text = f.read()
  except (OSError, UnicodeDecodeError) as e:
    raise ValueError(f"{label}: {getattr(e, 'strerror', None) or e}"
                     ) from None
  yaml_file = path.endswith((".yaml", ".yml"))
  try:
    if yaml_file:
      import yaml
      data = yaml.safe_load(text)
    else:
      data = json.loads(text)
  except Exception as e:  # noqa: BLE001 - any parse error, one line
    raise ValueError(f"{label}: not valid {'YAML' if yaml_file else 'JSON'} "
                     f"({str(e).splitlines()[0]})") from None
  if data is None:
    raise ValueError(f"{label}: the file is empty")
  if not isinstance(data, dict):
    raise ValueError(f"{label}: a {type(data).__name__}, not a mapping of "
                     "keys")
  return data


def _int(data: dict, key: str, default: int) -> int:
  value = data.get(key, default)
  if (isinstance(value, bool) or not isinstance(value, int)
      or not 0 < value < _LIMIT):
    raise ValueError(f"{key}={value!r} must be a positive integer below "
                     "2**31")
  return value


def _bool(data: dict, key: str) -> bool:
  """A true/false key; a string such as "false" is refused, not read as
  true."""
  value = data[key]
  if not isinstance(value, bool):
    raise ValueError(f"{key}={value!r} must be true or false")
  return value


def _section(data: dict, key: str, where: str = "") -> dict:
  """A DeepSpeed section: an object, or absent."""
  value = data.get(key)
  if value is None:
    return {}
  if not isinstance(value, dict):
    raise ValueError(f"{where}{key}={value!r} must be an object like "
                     f"{_SECTION_EXAMPLES[key]}")
  return value


def _targets(value: Any) -> str:
  names = value.split(",") if isinstance(value, str) else value
  if not isinstance(names, list) or not all(isinstance(n, str)
                                            for n in names):
    raise ValueError(f"LoRA targets {value!r} must be names like q_proj,v_proj "
                     "(a list or a comma-separated string)")
  names = [n.strip() for n in names if n.strip()]
  if any(n in ("all", "all-linear") for n in names):
    return ",".join(_ALL)
  bad = [n for n in names if n not in _HF_TARGETS]
  if bad or not names:
    raise ValueError(f"LoRA target {bad[0] if bad else value!r} is not one "
                     f"of {', '.join(_HF_TARGETS)} or all")
  return ",".join(_HF_TARGETS[n] for n in names)


class _Mapper:
  def __init__(self, data: dict):
    self.data, self.flags, self.mapping, self.used = data, {}, [], set()
    self.auto: list[str] = []  # keys DeepSpeed's launcher fills ("auto")
    self.notes: list[str] = []  # keys read and set nothing, with why

  def put(self, flag: str, value, why: str, *keys: str) -> None:
    self.flags[flag] = str(value)
    self.mapping.append(f"{why} -> --{flag}={value}")
    self.used.update(keys)

  def batch(self, micro_key: str, devices: int, total: int | None = None
            ) -> None:
    """--batch and --grad_accum; where either is DeepSpeed's "auto" (the
    launcher fills it in), neither: the run's flags say them. `total`: a
    global batch given without the micro-batch (DeepSpeed's
    train_batch_size), which the micro-batch is derived from."""
    keys = (micro_key, "gradient_accumulation_steps")
    if any(self.data.get(k) == "auto" for k in keys):
      self.auto.extend(k for k in keys if self.data.get(k) == "auto")
      return
    accum = _int(self.data, "gradient_accumulation_steps", 1)
    given = lambda key, value: (f"{key}={value}" if key in self.data
                                else f"{key}={value} (default)")
    if total is not None and micro_key not in self.data:
      if total % (accum * devices):
        raise ValueError(f"train_batch_size={total} is not a multiple of "
                         f"gradient_accumulation_steps={accum} x {devices} "
                         "devices; give train_micro_batch_size_per_gpu")
      micro, why = total // (accum * devices), (
          f"train_batch_size={total} / ({given('gradient_accumulation_steps', accum)}"
          f" x {devices} devices) = micro-batch {total // (accum * devices)}")
      self.used.add("train_batch_size")
    else:
      micro = _int(self.data, micro_key, 1)
      why = (f"{given(micro_key, micro)} x "
             f"{given('gradient_accumulation_steps', accum)} x {devices} "
             "devices")
    if micro * accum * devices >= _LIMIT:
      raise ValueError(f"{why}: a batch of {micro * accum * devices} "
                       "sequences, not below 2**31")
    self.put("batch", micro * accum * devices, why, *keys)
    self.put("grad_accum", accum, given("gradient_accumulation_steps", accum))

  def remat(self, key: str, checkpointing: bool) -> None:
    self.put("remat", "full" if checkpointing else "none",
             f"{key}={str(self.data[key]).lower()}", key)

  def done(self, kind: str) -> ConfigRun:
    ignored = tuple(f"{k}={v}" for k, v in self.data.items()
                    if k not in self.used and k not in self.auto) + tuple(
        f"{k}=auto (the launcher's: give the flag)" for k in self.auto)
    return ConfigRun(kind, self.flags, tuple(self.mapping),
                     ignored + tuple(self.notes))


def _one_half_precision(enabled: list[str]) -> None:
  """bf16 and fp16 together: DeepSpeed and the Trainer refuse it too."""
  if len(enabled) > 1:
    raise ValueError("bf16 and fp16 are both enabled; DeepSpeed and the "
                     "Hugging Face Trainer refuse that; enable one")


def _zero(m: _Mapper, data: dict, where: str = "") -> None:
  """--shard and --offload from a DeepSpeed `zero_optimization`; `where`
  prefixes what is read from a file another config points to."""
  zero = _section(data, "zero_optimization", where)
  stage = zero.get("stage", 0)
  if type(stage) is not int or stage not in _ZERO:  # not a bool, list
    raise ValueError(f"{where}zero_optimization.stage={stage!r}; valid: 0, 1, "
                     "2, 3")
  m.put("shard", _ZERO[stage], f"{where}zero_optimization.stage={stage}",
        "zero_optimization")
  devices = {}
  for key in _DS_OFFLOADS:
    device = _section(zero, key, f"{where}zero_optimization.").get("device")
    if device is not None and not isinstance(device, str):
      raise ValueError(f"{where}zero_optimization.{key}.device={device!r}; "
                       "valid: cpu, nvme, none")
    devices[key] = (device or "none").lower()
  if devices["offload_param"] != "none" and stage < 3:  # DeepSpeed's rule
    m.notes.append(f"{where}zero_optimization.offload_param (DeepSpeed "
                   f"offloads parameters only at stage 3; this is stage "
                   f"{stage})")
    devices["offload_param"] = "none"
  to_cpu = [name for key, name in _DS_OFFLOADS.items()
            if devices[key] == "cpu"]
  if to_cpu:
    m.put("offload", ",".join(to_cpu), " ".join(
        f"{where}zero_optimization.{k}.device=cpu" for k, name in
        _DS_OFFLOADS.items() if name in to_cpu))
  m.notes.extend(f"{where}zero_optimization.{k}={zero[k]}" for k in
                 _DS_OFFLOADS if devices[k] not in ("none", "cpu"))


def _deepspeed(data: dict, devices: int) -> ConfigRun:
  m = _Mapper(data)
  total = data.get("train_batch_size")
  if total not in (None, "auto") and (isinstance(total, bool)
                                      or not isinstance(total, int)
                                      or total <= 0):
    raise ValueError(f"train_batch_size={total!r} must be a positive integer "
                     "or \"auto\"")
  m.batch("train_micro_batch_size_per_gpu", devices,
          total if isinstance(total, int) else None)
  if total == "auto":
    m.auto.append("train_batch_size")
  elif total is not None and "batch" in m.flags:
    m.used.add("train_batch_size")
    if str(total) != m.flags["batch"]:
      raise ValueError(f"train_batch_size={total} is not micro-batch x "
                       f"accumulation x {devices} devices = "
                       f"{m.flags['batch']}")
  _zero(m, data)
  enabled = {k: _section(data, k).get("enabled") for k in ("bf16", "fp16")}
  for k, v in enabled.items():
    if v not in (None, True, False, "auto"):
      raise ValueError(f"{k}.enabled={v!r}; valid: true, false, \"auto\"")
  m.auto.extend(f"{k}.enabled" for k, v in enabled.items() if v == "auto")
  m.used.update(k for k, v in enabled.items() if v == "auto")  # named so
  half = [k for k, v in enabled.items() if v is True]
  _one_half_precision(half)
  if "auto" not in enabled.values():
    m.put("precision", "bf16_master" if half else "mixed",
          f"{half[0]}.enabled=true (16-bit params, f32 master)" if half else
          "no bf16/fp16 (f32 params)", "bf16", "fp16")
  kind = _section(data, "optimizer").get("type", "AdamW")
  if not isinstance(kind, str):
    raise ValueError(f"optimizer.type={kind!r} must be a name like AdamW")
  if kind.lower() in ("adam", "adamw"):
    m.put("optimizer", "adamw", f"optimizer.type={kind.lower()}"
          if "optimizer" in data else
          "no optimizer section (the client's AdamW assumed)", "optimizer")
  return m.done("DeepSpeed JSON")


def _referenced_deepspeed(m: _Mapper, data: dict, path: str) -> None:
  """A trainer config's `deepspeed:` file (a path, relative to the config's
  folder as the launcher is usually run from there, or the JSON itself):
  its ZeRO stage and offloads. Its batch and precision are the trainer's
  own keys (the Trainer fills DeepSpeed's "auto" from them)."""
  ref = data["deepspeed"]
  if isinstance(ref, dict):
    ds, where = ref, "deepspeed."
  elif isinstance(ref, str):
    ds_path = ref if os.path.isabs(ref) else os.path.join(
        os.path.dirname(os.path.abspath(path)), ref)
    ds, where = _load(ds_path, f"deepspeed={ref} (in {os.path.basename(path)})"
                      ), f"deepspeed={ref}: "
  else:
    raise ValueError(f"deepspeed={ref!r} must be the path of a DeepSpeed JSON")
  if "zero_optimization" not in ds:
    raise ValueError(f"deepspeed={ref if isinstance(ref, str) else '{...}'} "
                     "has no zero_optimization section")
  _zero(m, ds, where)
  m.used.add("deepspeed")


def _lora_rank(m: _Mapper, data: dict, key: str, why: str, *keys: str
               ) -> None:
  rank = _int(data, key, 8)
  m.put("lora_rank", rank, why.format(rank=rank), *keys)


def _huggingface(data: dict, devices: int, path: str) -> ConfigRun:
  m = _Mapper(data)
  m.batch("per_device_train_batch_size", devices)
  half = [k for k in ("bf16", "fp16") if k in data and _bool(data, k)]
  _one_half_precision(half)
  m.put("precision", "mixed", (f"{half[0]}=true" if half else "no bf16/fp16")
        + " (f32 params, autocast)", "bf16", "fp16")
  if "gradient_checkpointing" in data:
    m.remat("gradient_checkpointing", _bool(data, "gradient_checkpointing"))
  _optim(m, data)
  for key in ("max_seq_length", "max_length"):
    if key in data:
      m.put("seq", _int(data, key, 1), f"{key}={data[key]}", key)
  key = "lora_r" if "lora_r" in data else "r"
  if data.get(key) is not None:
    _lora_rank(m, data, key, f"{key}={{rank}}", "lora_r", "r")
    targets = data.get("target_modules", _PEFT_DEFAULT)
    m.put("lora_targets", _targets(targets), f"target_modules={targets}",
          "target_modules")
  _bnb_base(m, data)
  if "deepspeed" in data:
    _referenced_deepspeed(m, data, path)
  return m.done("Hugging Face TrainingArguments")


def _bnb_base(m: _Mapper, data: dict) -> None:
  """bitsandbytes' load_in_4bit / load_in_8bit (TRL's and axolotl's keys)."""
  four = "load_in_4bit" in data and _bool(data, "load_in_4bit")
  eight = "load_in_8bit" in data and _bool(data, "load_in_8bit")
  if four or eight:
    _quantized_base(m, 4 if four else 8,
                    data.get("bnb_4bit_quant_type", "nf4"),
                    "load_in_4bit" if four else "load_in_8bit",
                    "load_in_4bit", "load_in_8bit", "bnb_4bit_quant_type")


def _optim(m: _Mapper, data: dict, key: str = "optim") -> None:
  """TrainingArguments' `optim` (LLaMA-Factory passes it on as is; axolotl
  calls it `optimizer`)."""
  optim = data.get(key)
  if isinstance(optim, str) and optim in _HF_OPTIMIZERS:
    m.put("optimizer", _HF_OPTIMIZERS[optim], f"{key}={optim}", key)


def _quantized_base(m: _Mapper, bits, kind, why: str, *keys: str) -> None:
  """bitsandbytes' 4-bit (NF4) or 8-bit base (models.quant)."""
  if isinstance(bits, bool) or bits not in (4, 8):
    raise ValueError(f"{why}: the base's bits must be 4 (nf4) or 8")
  if bits == 8:
    m.put("base_quant", "int8", why, *keys)
  elif kind == "nf4":
    m.put("base_quant", "nf4", f"{why} (nf4)", *keys)
  else:
    raise ValueError(f"a {bits}-bit {kind} base is not modelled; valid: "
                     "4-bit nf4 or 8-bit")


def _llamafactory(data: dict, devices: int, path: str) -> ConfigRun:
  m = _Mapper(data)
  m.batch("per_device_train_batch_size", devices)
  _one_half_precision([k for k in ("bf16", "fp16")
                       if k in data and _bool(data, k)])
  if "pure_bf16" in data and _bool(data, "pure_bf16"):
    # LLaMA-Factory: bf16 weights, no f32 master
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
    kind = data["flash_attn"]
    if kind not in _LF_ATTENTION:
      raise ValueError(f"flash_attn={kind!r}; valid: "
                       f"{', '.join(_LF_ATTENTION)}")
    m.put("attention", _LF_ATTENTION[kind], f"flash_attn={kind}", "flash_attn")
  if "disable_gradient_checkpointing" in data:  # on by default
    m.remat("disable_gradient_checkpointing",
            not _bool(data, "disable_gradient_checkpointing"))
  _optim(m, data)
  if data.get("finetuning_type") == "lora":
    _lora_rank(m, data, "lora_rank", "finetuning_type=lora lora_rank={rank}",
               "finetuning_type", "lora_rank")
    m.put("lora_targets", _targets(data.get("lora_target", "all")),
          f"lora_target={data.get('lora_target', 'all')}", "lora_target")
  if data.get("quantization_bit") is not None:
    bits = data["quantization_bit"]
    _quantized_base(m, bits, data.get("quantization_type", "nf4"),
                    f"quantization_bit={bits!r}", "quantization_bit",
                    "quantization_type", "double_quantization")
  if "deepspeed" in data:
    _referenced_deepspeed(m, data, path)
  return m.done("LLaMA-Factory YAML")


def _axolotl(data: dict, devices: int, path: str) -> ConfigRun:
  """An axolotl YAML: micro_batch_size, sequence_len, adapter lora/qlora
  (lora_r, lora_target_modules or lora_target_linear), load_in_4bit/8bit,
  optimizer (transformers' names), gradient_checkpointing,
  flash_attention, deepspeed."""
  m = _Mapper(data)
  m.batch("micro_batch_size", devices)
  half = [k for k in ("bf16", "fp16") if data.get(k) in (True, "auto")]
  m.put("precision", "mixed", (f"{half[0]}={data[half[0]]}" if half else
                               "no bf16/fp16") + " (f32 params, autocast)",
        "bf16", "fp16")
  if "sequence_len" in data:
    m.put("seq", _int(data, "sequence_len", 1),
          f"sequence_len={data['sequence_len']}", "sequence_len")
  if "gradient_checkpointing" in data:
    m.remat("gradient_checkpointing", _bool(data, "gradient_checkpointing"))
  if "flash_attention" in data and _bool(data, "flash_attention"):
    m.put("attention", "flash", "flash_attention=true", "flash_attention")
  _optim(m, data, "optimizer")
  adapter = data.get("adapter")
  if adapter not in (None, "lora", "qlora"):
    raise ValueError(f"adapter={adapter!r}; valid: lora, qlora")
  if adapter:
    _lora_rank(m, data, "lora_r", f"adapter={adapter} lora_r={{rank}}",
               "adapter", "lora_r")
    if "lora_target_linear" in data and _bool(data, "lora_target_linear"):
      m.put("lora_targets", ",".join(_ALL), "lora_target_linear=true",
            "lora_target_linear", "lora_target_modules")
    else:
      targets = data.get("lora_target_modules") or _PEFT_DEFAULT
      m.put("lora_targets", _targets(targets), f"lora_target_modules="
            f"{targets}" + (" (PEFT's default)" if targets == _PEFT_DEFAULT
                            else ""), "lora_target_modules",
            "lora_target_linear")
  if adapter == "qlora" and not data.get("load_in_4bit"):
    _quantized_base(m, 4, "nf4", "adapter=qlora", "adapter")
  _bnb_base(m, data)
  if "deepspeed" in data:
    _referenced_deepspeed(m, data, path)
  return m.done("axolotl YAML")


def read_config(path: str, devices: int) -> ConfigRun:
  """The run flags a config file sets, for `devices` data-parallel devices."""
  data = _load(path, f"--config={path}")
  if "zero_optimization" in data or "train_micro_batch_size_per_gpu" in data:
    return _deepspeed(data, devices)
  if any(k in data for k in ("micro_batch_size", "sequence_len", "adapter")):
    return _axolotl(data, devices, path)
  if "finetuning_type" in data or "cutoff_len" in data or path.endswith(
      (".yaml", ".yml")):
    return _llamafactory(data, devices, path)
  if "per_device_train_batch_size" in data:
    return _huggingface(data, devices, path)
  raise ValueError(f"--config={os.path.basename(path)}: not a DeepSpeed JSON "
                   "(zero_optimization), Hugging Face TrainingArguments JSON "
                   "(per_device_train_batch_size), LLaMA-Factory YAML "
                   "(finetuning_type, cutoff_len) or axolotl YAML "
                   "(micro_batch_size, sequence_len)")
