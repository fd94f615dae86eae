"""Hugging Face config.json → ModelConfig, read as data (no network, no code)."""

from __future__ import annotations

import dataclasses
import json
import math
import os

from models.config import ModelConfig

FAMILIES = ("llama", "mistral", "qwen2", "gemma", "mixtral", "qwen2_moe", "t5",
            "llava")
# What HF's LlamaConfig and CLIPVisionConfig give a key a LLaVA config.json
# leaves out (llava-hf/llava-1.5-7b-hf names only the keys that differ).
LLAMA_DEFAULTS = {"vocab_size": 32000, "hidden_size": 4096,
                  "intermediate_size": 11008, "num_hidden_layers": 32,
                  "num_attention_heads": 32, "max_position_embeddings": 2048,
                  "rms_norm_eps": 1e-6}
CLIP_VISION_DEFAULTS = {"hidden_size": 768, "intermediate_size": 3072,
                        "num_hidden_layers": 12, "num_attention_heads": 12,
                        "image_size": 224, "patch_size": 32,
                        "num_channels": 3}
# T5's feed_forward_proj (HF T5Config) → ModelConfig.mlp; "gated-gelu" is
# v1.1's (HF runs it with gelu_new, the tanh approximation, as jax.nn.gelu).
T5_MLPS = {"relu": "relu", "gelu": "gelu", "gated-gelu": "geglu"}


# Sizes a config names: each a positive integer (not a bool, not a float
# like 1e12), below 2**31 (what the traced program's int32 indices reach).
_SIZES = ("hidden_size", "num_attention_heads", "num_hidden_layers",
          "intermediate_size", "vocab_size", "num_key_value_heads", "head_dim",
          "max_position_embeddings", "d_model", "d_kv", "d_ff", "num_layers",
          "num_decoder_layers", "num_heads", "relative_attention_num_buckets",
          "relative_attention_max_distance", "n_positions", "num_local_experts",
          "num_experts", "num_experts_per_tok", "moe_intermediate_size",
          "image_size", "patch_size")


def _require(raw: dict, key: str, path: str):
  if key not in raw:
    raise ValueError(f"{path}: missing {key!r}, which a {raw.get('model_type')}"
                     f" config.json must have")
  return raw[key]


def _check_sizes(raw: dict, path: str) -> None:
  for key in _SIZES:
    value = raw.get(key)
    if value is None:
      continue
    if not (isinstance(value, int) and not isinstance(value, bool)
            and 0 < value < 2**31):
      raise ValueError(f"{path}: {key}={value!r} must be a positive integer "
                       "below 2**31")


def _name(path: str) -> str:
  """The file's name; a checkout's config.json is named by its folder."""
  name = os.path.splitext(os.path.basename(path))[0]
  folder = os.path.basename(os.path.dirname(os.path.abspath(path)))
  return folder if name == "config" and folder else name


def _positive_number(raw: dict, key: str, path: str) -> None:
  value = raw.get(key)
  if value is not None and not (isinstance(value, (int, float))
                                and not isinstance(value, bool)
                                and math.isfinite(value) and value > 0):
    raise ValueError(f"{path}: {key}={value!r} must be a positive finite "
                     "number")


def _flag(raw: dict, key: str, default: bool, path: str) -> bool:
  """A true/false key; a string such as "false" is refused, not read as
  true."""
  value = raw.get(key, default)
  if not isinstance(value, bool):
    raise ValueError(f"{path}: {key}={value!r} must be true or false")
  return value


def _t5(raw: dict, path: str) -> ModelConfig:
  """A T5 config.json (HF T5Config's keys and defaults): v1.0 (t5-large)
  or v1.1 (feed_forward_proj "gated-gelu", tie_word_embeddings false)."""
  get = lambda key: _require(raw, key, path)
  proj = raw.get("feed_forward_proj", "relu")
  if proj not in T5_MLPS:
    raise ValueError(f"{path}: feed_forward_proj={proj!r} is not supported; "
                     f"valid: {', '.join(T5_MLPS)}")
  _positive_number(raw, "layer_norm_epsilon", path)
  n_heads = get("num_heads")
  return ModelConfig(
      name=_name(path),
      d_model=get("d_model"),
      n_layers=raw.get("num_decoder_layers") or get("num_layers"),
      encoder_layers=get("num_layers"),
      d_ff=get("d_ff"),
      vocab_size=get("vocab_size"),
      n_heads=n_heads,
      n_kv_heads=n_heads,
      head_dim=get("d_kv"),
      max_len=raw.get("n_positions", 512),
      norm="rms",
      positions="relative",
      mlp=T5_MLPS[proj],
      tie_embeddings=_flag(raw, "tie_word_embeddings", True, path),
      norm_eps=float(raw.get("layer_norm_epsilon") or 1e-6),
      relative_buckets=raw.get("relative_attention_num_buckets", 32),
      relative_max_distance=raw.get("relative_attention_max_distance", 128),
  )


def from_hf_config(path: str) -> ModelConfig:
  try:
    with open(path, encoding="utf-8") as f:
      raw = json.load(f)
  except OSError as e:
    raise ValueError(f"cannot read model config {path!r}: {e.strerror}") from None
  except json.JSONDecodeError as e:
    raise ValueError(f"{path}: not valid JSON ({e.msg} at line {e.lineno})"
                     ) from None
  except UnicodeDecodeError as e:
    raise ValueError(f"{path}: not UTF-8 text (byte {e.start})") from None
  except RecursionError:
    raise ValueError(f"{path}: JSON nested too deeply to be a config") from None
  if not isinstance(raw, dict):
    raise ValueError(f"{path}: expected a JSON object")
  family = raw.get("model_type")
  if family not in FAMILIES:
    raise ValueError(f"{path}: model_type={family!r} is not supported; valid: "
                     f"{', '.join(FAMILIES)}")
  _check_sizes(raw, path)
  if family == "t5":
    return _t5(raw, path)
  if family == "llava":
    return _llava(raw, path)
  return _decoder(raw, family, path)


def _decoder(raw: dict, family: str, path: str) -> ModelConfig:
  """A decoder-only LM's config.json (llama, mistral, qwen2, gemma, the
  mixtures of experts)."""
  get = lambda key: _require(raw, key, path)
  d_model, n_heads = get("hidden_size"), get("num_attention_heads")
  if not all(isinstance(v, int) and v > 0 for v in (d_model, n_heads)):
    raise ValueError(f"{path}: hidden_size={d_model!r} and num_attention_heads"
                     f"={n_heads!r} must be positive integers")
  if not raw.get("head_dim") and d_model % n_heads:
    raise ValueError(f"{path}: hidden_size={d_model} is not a multiple of "
                     f"num_attention_heads={n_heads}; give head_dim")
  head_dim = raw.get("head_dim") or d_model // n_heads
  if head_dim % 2:  # rotary embeddings rotate pairs of a head's features
    raise ValueError(f"{path}: head_dim={head_dim}"
                     + ("" if raw.get("head_dim") else
                        f" (hidden_size={d_model} / num_attention_heads="
                        f"{n_heads})")
                     + " is odd; rotary position embeddings need an even "
                     "head_dim")
  kv = raw.get("num_key_value_heads", n_heads)
  if isinstance(kv, int) and kv > 0 and n_heads % kv:
    divisors = [d for d in range(1, n_heads + 1) if n_heads % d == 0]
    raise ValueError(f"{path}: num_attention_heads={n_heads} is not a "
                     f"multiple of num_key_value_heads={kv}; valid "
                     f"num_key_value_heads: {', '.join(map(str, divisors))}")
  for key in ("rms_norm_eps", "rope_theta"):
    _positive_number(raw, key, path)
  gemma = family == "gemma"
  return ModelConfig(**_moe_fields(raw, family, path),
      name=_name(path),
      d_model=d_model,
      n_layers=get("num_hidden_layers"),
      d_ff=get("intermediate_size"),
      vocab_size=get("vocab_size"),
      n_heads=n_heads,
      n_kv_heads=raw.get("num_key_value_heads") or n_heads,
      head_dim=head_dim,
      max_len=raw.get("max_position_embeddings", 2048),
      norm="rms",
      positions="rope",
      mlp="geglu" if gemma else "swiglu",
      tie_embeddings=_flag(raw, "tie_word_embeddings", gemma, path),
      qkv_bias=(family in ("qwen2", "qwen2_moe")
                or _flag(raw, "attention_bias", False, path)),
      bias=False,
      norm_eps=float(raw.get("rms_norm_eps") or 1e-6),
      rope_theta=float(raw.get("rope_theta") or 10000.0),
      embed_scale=gemma,
  )


def _llava(raw: dict, path: str) -> ModelConfig:
  """A LLaVA config.json (HF LlavaConfig): a llama `text_config` and a CLIP
  `vision_config` (their keys left out take HF's defaults), the patch
  features without the class token (`vision_feature_select_strategy:
  default`) through a GELU projector (models.vision)."""
  text, vision = (raw.get(k) for k in ("text_config", "vision_config"))
  if not (isinstance(text, dict) and isinstance(vision, dict)):
    raise ValueError(f"{path}: a llava config.json needs text_config and "
                     "vision_config objects")
  checks = (("text_config.model_type", text.get("model_type", "llama"),
             ("llama",)),
            ("vision_config.model_type", vision.get("model_type"),
             ("clip_vision_model",)),
            ("vision_feature_select_strategy",
             raw.get("vision_feature_select_strategy", "default"),
             ("default",)),
            ("projector_hidden_act", raw.get("projector_hidden_act", "gelu"),
             ("gelu",)),
            ("vision_config.num_channels", vision.get("num_channels", 3),
             (3,)))
  for key, value, valid in checks:
    if value not in valid:
      raise ValueError(f"{path}: {key}={value!r} is not supported; valid: "
                       f"{', '.join(map(str, valid))}")
  text = {**LLAMA_DEFAULTS, **text}
  vision = {**CLIP_VISION_DEFAULTS, **vision}
  for part in (text, vision):
    _check_sizes(part, path)
  lm = _decoder(text, "llama", path)
  return dataclasses.replace(
      lm, vision_layers=vision["num_hidden_layers"],
      vision_d_model=vision["hidden_size"],
      vision_d_ff=vision["intermediate_size"],
      vision_heads=vision["num_attention_heads"],
      image_size=vision["image_size"], patch_size=vision["patch_size"])


def _moe_fields(raw: dict, family: str, path: str) -> dict:
  """The ModelConfig fields of a mixtral or qwen2_moe config's experts.

  Mixtral: num_local_experts SwiGLU experts of intermediate_size, top-k
  renormalised. Qwen2-MoE: num_experts of moe_intermediate_size, a shared
  expert of shared_expert_intermediate_size behind a sigmoid gate, top-k
  renormalised only with norm_topk_prob; every layer must be sparse.
  """
  get = lambda key: _require(raw, key, path)
  coef = raw.get("router_aux_loss_coef", 0.001)
  if not (isinstance(coef, (int, float)) and not isinstance(coef, bool)
          and math.isfinite(coef) and coef >= 0):
    raise ValueError(f"{path}: router_aux_loss_coef={coef!r} must be a finite"
                     " number >= 0")
  if family == "mixtral":
    return dict(n_experts=get("num_local_experts"),
                experts_per_token=get("num_experts_per_tok"),
                expert_d_ff=get("intermediate_size"),
                router_aux_loss_coef=float(coef))
  if family != "qwen2_moe":
    return {}
  step = raw.get("decoder_sparse_step", 1)
  if step != 1:
    raise ValueError(f"{path}: decoder_sparse_step={step!r} is not supported;"
                     " valid: 1 (every layer a mixture of experts)")
  dense = raw.get("mlp_only_layers") or []
  if dense:
    raise ValueError(f"{path}: mlp_only_layers={dense!r} is not supported; "
                     "valid: [] (no dense layers)")
  shared = raw.get("shared_expert_intermediate_size", 0)
  if not (isinstance(shared, int) and not isinstance(shared, bool)
          and 0 <= shared < 2**31):
    raise ValueError(f"{path}: shared_expert_intermediate_size={shared!r} "
                     "must be an integer >= 0")
  norm = _flag(raw, "norm_topk_prob", False, path)
  return dict(n_experts=get("num_experts"),
              experts_per_token=get("num_experts_per_tok"),
              expert_d_ff=get("moe_intermediate_size"),
              shared_expert_d_ff=shared, router_renormalize=norm,
              router_aux_loss_coef=float(coef))
