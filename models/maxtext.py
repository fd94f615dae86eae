"""MaxText runs as input: its `global_parameter_scale` models and its
command-line overrides mapped onto this project's flags.

Model dims follow MaxText's get_individual_scales (pyconfig.py, now
configs/types.py): with log2(scale) = 3·b + r, heads and MLP width scale by
2^(b + (r > 0)), the embedding by 2^(b + (r > 1)), layers by 2^b; head_dim
and vocab stay. Two base configs (base.yml): `maxtext-<N>b` is today's
(llama2 decoder: emb 2048, 16 heads of 128, SwiGLU 7168, 16 layers, vocab
32000, untied), `maxtext2023-<N>b` the one MaxText's published v5e (Oct 2023)
and v5p (Dec 2023) tables ran on (its "default" decoder: PaLM-style
parallel block, emb 2560, 8 heads of 256, ReLU 8192, 16 layers, vocab
32768, logits through the tied embedding).
"""

from __future__ import annotations

import dataclasses
import math
import re
import shlex

from models.config import GATED_MLPS, ModelConfig
from models.remat import MAXTEXT_POLICIES

BASES = {
    "maxtext": dict(d_model=2048, n_heads=16, n_kv_heads=16, head_dim=128,
                    d_ff=7168, n_layers=16, vocab_size=32000, mlp="swiglu",
                    tie_embeddings=False, parallel_block=False),
    "maxtext2023": dict(d_model=2560, n_heads=8, n_kv_heads=8, head_dim=256,
                        d_ff=8192, n_layers=16, vocab_size=32768, mlp="relu",
                        tie_embeddings=True, parallel_block=True),
}
_NAME = re.compile(r"(maxtext(?:2023)?)-(\d+)b")


def scaled_model(base: str, scale: int, overrides: dict | None = None
                 ) -> ModelConfig:
  """MaxText's model at `global_parameter_scale` = scale over `base`."""
  if scale < 1 or scale & (scale - 1):
    raise ValueError(f"global_parameter_scale={scale} must be a power of 2")
  b, r = divmod(int(math.log2(scale)), 3)
  dims = {**BASES[base], **(overrides or {})}
  heads = 2 ** (b + (r > 0))
  return ModelConfig(
      f"{base}-{scale}b", d_model=dims["d_model"] * 2 ** (b + (r > 1)),
      n_layers=dims["n_layers"] * 2 ** b, d_ff=dims["d_ff"] * heads,
      n_heads=dims["n_heads"] * heads, n_kv_heads=dims["n_kv_heads"] * heads,
      head_dim=dims["head_dim"], vocab_size=dims["vocab_size"],
      max_len=dims.get("max_len", 2048), mlp=dims["mlp"],
      tie_embeddings=dims["tie_embeddings"],
      parallel_block=dims["parallel_block"])


def model_by_name(name: str) -> ModelConfig | None:
  """`maxtext-32b` or `maxtext2023-32b`; None for other names."""
  m = _NAME.fullmatch(name)
  return scaled_model(m.group(1), int(m.group(2))) if m else None


# MaxText keys that change nothing this simulator models (bookkeeping, data).
_BOOKKEEPING = {"run_name", "base_output_directory", "dataset_path", "steps",
                "dataset_type", "enable_checkpointing", "reuse_example_batch",
                "async_checkpointing", "log_period", "enable_profiler",
                "skip_first_n_steps_for_profiler", "profiler_steps",
                "metrics_file", "gcs_metrics", "tokenizer_path"}
# remat_policy=custom: MaxText's tensors (pyconfig's
# validate_and_assign_remat_tensors; each `remat`, `device` or `offload`,
# decoder_layer_input `device` by default and never `remat` under scanned
# layers, the rest `remat`) and the checkpoint names they are here
# (models.remat.CHECKPOINT_NAMES). A gated MLP names its two input
# projections mlpwi_0 and mlpwi_1, an ungated one mlpwi; this project names
# both halves mlpwi, and q, k and v together qkv (after the rotary
# embedding, as MAXTEXT_POLICIES says), so each group needs one location.
_CUSTOM_DEFAULTS = {"decoder_layer_input": "device", "context": "remat",
                    "mlpwi": "remat", "mlpwi_0": "remat", "mlpwi_1": "remat",
                    "mlpwo": "remat", "query_proj": "remat",
                    "key_proj": "remat", "value_proj": "remat",
                    "qkv_proj": "remat", "out_proj": "remat"}
_LOCATIONS = ("remat", "device", "offload")
# Keys maxtext_run reads (the parallelism ones other than fsdp and tensor are
# named as unexpressed unless they are 1).
_READ = {"per_device_batch_size", "max_target_length", "remat_policy",
         "ici_fsdp_parallelism", "ici_tensor_parallelism", "attention",
         "ici_fsdp_transpose_parallelism",
         "global_parameter_scale", "model_name", "decoder_block", "dtype",
         "weight_dtype", "opt_type", "ici_data_parallelism",
         "dcn_data_parallelism", "dcn_fsdp_parallelism",
         "dcn_tensor_parallelism", "enable_flash_attention",
         "mlp_activations", "logits_via_embedding", "fused_qkv",
         "capacity_factor", "megablox", "sparse_matmul",
         "ici_pipeline_parallelism", "dcn_pipeline_parallelism",
         "num_pipeline_microbatches", "num_layers_per_pipeline_stage",
         *_CUSTOM_DEFAULTS}
# Dim overrides MaxText applies before scaling.
_DIMS = {"base_emb_dim": "d_model", "base_num_query_heads": "n_heads",
         "base_num_kv_heads": "n_kv_heads", "base_mlp_dim": "d_ff",
         "base_num_decoder_layers": "n_layers", "head_dim": "head_dim",
         "vocab_size": "vocab_size"}
_OPTIMIZERS = {"adamw": "adamw", "adam_pax": "adamw", "sgd": "sgd"}
# A serving run's keys (MaxText's decode.py and MaxEngine): the prompt's
# static length (prefill), the cache's whole length (prompt and generated
# tokens), the int8 KV cache; their defaults are MaxText's base.yml's
# (max_prefill_predict_length 64, quantize_kvcache false, kv_quant_dtype
# int8).
_SERVING = {"max_prefill_predict_length", "quantize_kvcache", "kv_quant_dtype"}


@dataclasses.dataclass(frozen=True)
class MaxTextRun:
  """A MaxText run in this project's terms."""

  flags: dict[str, str]  # flag name -> value
  mapping: tuple[str, ...]  # "key=value -> --flag=value (why)", in order
  unexpressed: tuple[str, ...]  # keys this simulator cannot express


def parse_overrides(text: str) -> dict[str, str]:
  """`key=value key2=value2 ...` (a MaxText command line's overrides, or a
  file of them: one or more per line, `#` comments) into a dict; values
  quoted as a shell quotes them (`run_name="my run"`)."""
  out: dict[str, str] = {}
  for line in text.splitlines():
    try:
      items = shlex.split(line, comments=True)
    except ValueError as e:  # an unclosed quote
      raise ValueError(f"MaxText overrides {line.strip()!r}: {e}") from None
    for item in items:
      key, sep, value = item.partition("=")
      if not sep or not key:
        raise ValueError(f"MaxText override {item!r} is not key=value")
      out[key] = value
  if not out:
    raise ValueError("--maxtext has no key=value overrides")
  return out


def _int(overrides: dict, key: str, default: int) -> int:
  value = overrides.get(key, str(default))
  try:
    return int(value)
  except ValueError:
    raise ValueError(f"MaxText {key}={value!r} must be an integer") from None


def _float(overrides: dict, key: str) -> float:
  value = overrides[key]
  try:
    return float(value)
  except ValueError:
    raise ValueError(f"MaxText {key}={value!r} must be a number") from None


def _model(o: dict) -> tuple[str, str, ModelConfig | None]:
  """(model flag, why, the scaled config or None for a preset)."""
  if "model_name" in o and o["model_name"] != "default":
    name = o["model_name"].replace("-", "_").replace(".", "_")
    return name, f"model_name={o['model_name']}", None
  base = "maxtext2023" if o.get("decoder_block") == "default" else "maxtext"
  dims = {}
  for key, field in _DIMS.items():
    if key in o:
      dims[field] = _int(o, key, 0)
  if "mlp_activations" in o:
    acts = o["mlp_activations"].strip("[]").replace(" ", "").split(",")
    kinds = {("silu", "linear"): "swiglu", ("gelu", "linear"): "geglu",
             ("relu",): "relu", ("gelu",): "gelu"}
    if tuple(acts) not in kinds:
      raise ValueError(f"MaxText mlp_activations={o['mlp_activations']!r}; "
                       f"valid here: {', '.join(map(str, kinds))}")
    dims["mlp"] = kinds[tuple(acts)]
  if "logits_via_embedding" in o:
    dims["tie_embeddings"] = o["logits_via_embedding"].lower() == "true"
  scale = _int(o, "global_parameter_scale", 1)
  cfg = scaled_model(base, scale, dims)
  why = f"global_parameter_scale={scale}" + (
      " decoder_block=default (the 2023 base)" if base == "maxtext2023" else "")
  return cfg.name, why, cfg


def _config(name: str, cfg: ModelConfig | None) -> ModelConfig | None:
  """The run's model: a scaled config as is, a preset by its name (None if
  neither: the model flag's loader says why later)."""
  if cfg is None:
    from models.presets import PRESETS
    cfg = PRESETS.get(name)
  return cfg


def _gated(cfg: ModelConfig | None) -> bool:
  """Whether the run's MLP is gated (MaxText's mlpwi_0/mlpwi_1, not mlpwi)."""
  return cfg is None or cfg.mlp in GATED_MLPS


def custom_remat(o: dict, gated: bool) -> tuple[str, str]:
  """MaxText's remat_policy=custom as a names:/offload: spec, and the
  tensor keys it was read from. Raises ValueError naming a location that is
  not remat/device/offload, decoder_layer_input=remat, or a group of
  MaxText tensors this project names as one given different locations."""
  where = {}
  for key, default in _CUSTOM_DEFAULTS.items():
    where[key] = o.get(key, default)
    if where[key] not in _LOCATIONS:
      raise ValueError(f"MaxText {key}={where[key]!r}; valid: "
                       f"{', '.join(_LOCATIONS)}")
  if where["decoder_layer_input"] == "remat":
    raise ValueError("MaxText decoder_layer_input=remat: a scanned layer's "
                     "input is its remat's start; valid: device, offload")
  qkv = (("qkv_proj",) if o.get("fused_qkv", "false").lower() == "true"
         else ("query_proj", "key_proj", "value_proj"))
  groups = {"decoder_layer_input": ("decoder_layer_input",),
            "qkv": qkv, "attn_out": ("context",), "out_proj": ("out_proj",),
            "mlpwi": ("mlpwi_0", "mlpwi_1") if gated else ("mlpwi",),
            "mlpwo": ("mlpwo",)}
  saved, offloaded = [], []
  for name, keys in groups.items():
    places = {where[k] for k in keys}
    if len(places) > 1:
      raise ValueError(
          "MaxText " + " ".join(f"{k}={where[k]}" for k in keys)
          + f": this project saves or offloads them together (`{name}`); "
          "give them one location")
    place = places.pop()
    if name == "decoder_layer_input" and place == "device":
      continue  # the layer scan saves every layer's input anyway
    {"device": saved, "offload": offloaded, "remat": []}[place].append(name)
  parts = ([f"names:{','.join(saved)}"] if saved else []) + (
      [f"offload:{','.join(offloaded)}"] if offloaded else [])
  given = " ".join(f"{k}={o[k]}" for k in _CUSTOM_DEFAULTS if k in o)
  return "+".join(parts) or "full", given


def _axes(o: dict, tier: str, defaults: dict, devices: int) -> dict:
  """MaxText's `tier` (ici: a slice's chips, dcn: the slices) parallelisms,
  its -1 (at most one) resolved to the rest of `devices`; a ValueError where
  they do not multiply to them."""
  axes = {k: _int(o, f"{tier}_{k}_parallelism", d)
          for k, d in defaults.items()}
  if any(v == -1 for k, v in axes.items() if f"{tier}_{k}_parallelism" in o):
    axes = {k: 1 if v == -1 and f"{tier}_{k}_parallelism" not in o else v
            for k, v in axes.items()}  # a -1 given takes the default's place
  rest = [k for k, v in axes.items() if v == -1]
  if len(rest) > 1:
    raise ValueError("MaxText " + " and ".join(
        f"{tier}_{k}_parallelism=-1" for k in rest) + ": one of them may be "
        "-1 (the rest), not more")
  known = math.prod(v for v in axes.values() if v != -1)
  what = f"{devices} " + ("chips (a slice's)" if tier == "ici" else "slices")
  if rest and (known <= 0 or devices % known):
    given = " x ".join(f"{tier}_{k}_parallelism={v}" for k, v in axes.items()
                       if v not in (1, -1))
    divisors = ", ".join(str(d) for d in range(1, devices + 1)
                         if devices % d == 0)
    raise ValueError(f"MaxText {given} does not divide {what}, so "
                     f"{tier}_{rest[0]}_parallelism=-1 has no value; give "
                     f"degrees whose product divides {devices}: {divisors}")
  if rest:
    axes[rest[0]] = devices // known
  if math.prod(axes.values()) != devices:
    given = " x ".join(f"{tier}_{k}_parallelism={v}" for k, v in axes.items()
                       if v != 1)
    raise ValueError(f"MaxText {given or f'{tier} parallelism 1'} is not "
                     f"{what}; give degrees whose product is {devices}")
  return axes


def maxtext_run(text: str, chips: int, slices: int = 1,
                serving: bool = False) -> MaxTextRun:
  """The flags for a MaxText run on `chips` chips in `slices` slices (TPU
  multi-slice; GPU nodes): the ici_* parallelisms multiply to a slice's
  chips, the dcn_* ones to the slices. MaxText's `data` axis (ici and dcn
  data parallelism) is --dp, replicas the batch is split over with X and
  the weights are not; fsdp (and fsdp_transpose, dcn_fsdp) is X, tensor
  Y. With `serving`, a decode run's lengths and KV cache (`_SERVING`) are
  --prompt, --generate and --kv_dtype instead of a training --seq."""
  o = parse_overrides(text)
  flags: dict[str, str] = {}
  mapping: list[str] = []

  def put(flag: str, value, why: str) -> None:
    flags[flag] = str(value)
    mapping.append(f"{why} -> --{flag}={value}")

  name, why, cfg = _model(o)
  if _config(name, cfg) is None:
    from models.registry import load_model  # registry imports this module
    try:
      load_model(name)  # an unknown name: ValueError, with the valid ones
    except ValueError as e:
      raise ValueError(f"MaxText {why}: {e}") from None
  put("model", name, why)
  per_device = _float(o, "per_device_batch_size") if (
      "per_device_batch_size" in o) else 12
  batch = per_device * chips  # MaxText's global batch: may be fractional
  if not (math.isfinite(batch) and batch > 0 and batch == int(batch)):
    raise ValueError(f"MaxText per_device_batch_size={per_device:g} x {chips} "
                     f"chips = {batch:g} is not a whole positive number of "
                     "sequences")
  put("batch", int(batch),
      f"per_device_batch_size={per_device:g} ({per_device:g} x {chips} chips)")
  target = _int(o, "max_target_length", 2048)
  given_target = (f"max_target_length="
                  f"{o.get('max_target_length', '2048 (default)')}")
  if serving:
    _serving(o, target, given_target, put)
  else:
    put("seq", target, given_target)
  ici = _axes(o, "ici", {"data": 1, "fsdp": -1, "fsdp_transpose": 1,
                         "tensor": 1, "pipeline": 1}, chips // slices)
  dcn_tensor = _int(o, "dcn_tensor_parallelism", 1)
  if dcn_tensor != 1 and ici["tensor"] != chips // slices:
    # Y over hosts is laid here over whole ones (meshes.layout: Y takes a
    # host's devices, then whole hosts), as MaxText's tensor axis would be
    # with every chip of a slice in it.
    raise ValueError(f"MaxText dcn_tensor_parallelism={dcn_tensor} with "
                     f"ici_tensor_parallelism={ici['tensor']}: tensor "
                     "parallelism across slices or hosts is laid over whole "
                     f"ones here; give ici_tensor_parallelism={chips // slices}"
                     " (a slice's or host's chips) or dcn_tensor_parallelism=1")
  dcn = _axes(o, "dcn", {"data": -1, "fsdp": 1, "fsdp_transpose": 1,
                         "tensor": 1, "pipeline": 1}, slices)
  # fsdp_transpose is FSDP over a second mesh axis (MaxText shards the
  # batch over it too, and each weight on its other dim): the same bytes
  # gathered and reduced, so it joins X.
  x = math.prod(a["fsdp"] * a["fsdp_transpose"] for a in (ici, dcn))
  def resolved(level: str, axes: dict, axis: str) -> str:
    """`key=degree` as the mesh has it, a -1 named as resolved."""
    key = f"{level}_{axis}_parallelism"
    raw = str(o.get(key, -1 if (level, axis) == ("ici", "fsdp") else 1))
    return f"{key}={axes[axis]}" + (" (-1 resolved)" if raw == "-1" else "")
  put("mesh", f"{x}x{ici['tensor'] * dcn['tensor']}", " ".join(
      [resolved("ici", ici, "fsdp")]
      + [resolved(k.split("_")[0], ici if k.startswith("ici") else dcn,
                  k.split("_", 1)[1].rsplit("_", 1)[0])
         for k in ("ici_fsdp_transpose_parallelism", "dcn_fsdp_parallelism",
                   "dcn_fsdp_transpose_parallelism") if k in o]
      + [resolved("ici", ici, "tensor")]
      + ([resolved("dcn", dcn, "tensor")] if dcn["tensor"] > 1 else [])))
  if ici["data"] * dcn["data"] > 1:
    put("dp", ici["data"] * dcn["data"],
        f"ici_data_parallelism={ici['data']} dcn_data_parallelism="
        f"{dcn['data']} (replicas: weights sharded over X alone)")
  if ici["pipeline"] * dcn["pipeline"] > 1:
    _pipeline(o, ici["pipeline"], dcn["pipeline"], _config(name, cfg), put)
  remat = o.get("remat_policy", "full")
  if remat == "custom":
    spec, given = custom_remat(o, _gated(_config(name, cfg)))
    put("remat", spec, f"remat_policy=custom {given}".rstrip())
  elif remat not in MAXTEXT_POLICIES and remat != "none":
    raise ValueError(f"MaxText remat_policy={remat!r}; valid: "
                     f"{', '.join(MAXTEXT_POLICIES)}, custom, none")
  else:
    put("remat", remat, f"remat_policy={remat}")
  attention = o.get("attention", "flash" if o.get(
      "enable_flash_attention", "true").lower() == "true" else "dot_product")
  kernels = {"flash": "flash", "autoselected": "flash",
             "dot_product": "materialized"}
  if attention not in kernels:
    raise ValueError(f"MaxText attention={attention!r}; valid here: "
                     f"{', '.join(kernels)}")
  put("attention", kernels[attention], f"attention={attention}")
  weight_dtype, dtype = o.get("weight_dtype", "float32"), o.get(
      "dtype", "bfloat16")
  if weight_dtype not in ("float32", "bfloat16"):
    raise ValueError(f"MaxText weight_dtype={weight_dtype!r}; valid here: "
                     "float32, bfloat16")
  if dtype != "bfloat16":  # the activations' dtype: bf16 in every plan here
    raise ValueError(f"MaxText dtype={dtype!r}; valid here: bfloat16")
  put("precision", "mixed" if weight_dtype == "float32" else "bf16",
      f"weight_dtype={weight_dtype} dtype={dtype}")
  opt = o.get("opt_type", "adamw")
  if opt not in _OPTIMIZERS:
    raise ValueError(f"MaxText opt_type={opt!r}; valid here: "
                     f"{', '.join(_OPTIMIZERS)}")
  put("optimizer", _OPTIMIZERS[opt], f"opt_type={opt}")
  unexpressed = []
  if "capacity_factor" in o:  # MaxText's token dropping (a mixture of experts)
    if _float(o, "capacity_factor") > 0:
      put("capacity_factor", o["capacity_factor"],
          f"capacity_factor={o['capacity_factor']}")
    else:  # MaxText's dropless dense path: every expert on every token
      unexpressed.append(f"capacity_factor={o['capacity_factor']} (dropless)")
  model = _config(name, cfg)
  if model is not None and model.moe:
    # MaxText's default dispatch is ragged and dropless (megablox,
    # sparse_matmul true); this project's is its dense capacity dispatch.
    for key in ("megablox", "sparse_matmul"):
      if o.get(key, "true").lower() != "false":
        unexpressed.append(f"{key}={o.get(key, 'true (default)')}")
  for key, value in o.items():
    if key not in _BOOKKEEPING and key not in _READ and key not in _DIMS and (
        not serving or key not in _SERVING):
      unexpressed.append(f"{key}={value}")
  return MaxTextRun(flags, tuple(mapping), tuple(unexpressed))


def _pipeline(o: dict, ici: int, dcn: int, model, put) -> None:
  """MaxText's pipeline stages as --pp and --microbatches (its
  num_pipeline_microbatches -1: one per stage). Here a stage holds its
  layers whole (one repeat: num_layers_per_pipeline_stage x stages = the
  layers); MaxText's circular pipeline, more repeats of fewer layers, is
  not built here and is refused."""
  pp = ici * dcn
  per_stage = _int(o, "num_layers_per_pipeline_stage", 1)
  if model is not None and per_stage * pp != model.n_layers:
    raise ValueError(
        f"MaxText num_layers_per_pipeline_stage={per_stage} with {pp} "
        f"pipeline stages runs {model.n_layers} layers in "
        f"{model.n_layers / (per_stage * pp):g} repeats (a circular "
        "pipeline); stages here hold their layers whole (one repeat): give "
        f"num_layers_per_pipeline_stage={model.n_layers // pp}")
  put("pp", pp, f"ici_pipeline_parallelism={ici} dcn_pipeline_parallelism="
      f"{dcn} (stages on a mesh axis P)")
  microbatches = _int(o, "num_pipeline_microbatches", -1)
  put("microbatches", pp if microbatches == -1 else microbatches,
      "num_pipeline_microbatches="
      + o.get("num_pipeline_microbatches", "-1 (default: one per stage)"))


def _serving(o: dict, target: int, given_target: str, put) -> None:
  """A decode run's --prompt, --generate and --kv_dtype: the prompt is
  max_prefill_predict_length, the cache max_target_length long (MaxText's
  decode state), so max_target_length - prompt tokens are generated."""
  prompt = _int(o, "max_prefill_predict_length", 64)
  if not 0 < prompt < target:
    raise ValueError(f"MaxText max_prefill_predict_length={prompt} with "
                     f"{given_target}: the prompt must be positive and "
                     "shorter than max_target_length (the cache's length, "
                     "prompt and generated tokens)")
  put("prompt", prompt, "max_prefill_predict_length="
      + o.get("max_prefill_predict_length", "64 (default)"))
  put("generate", target - prompt, f"{given_target} (the cache: {prompt} "
      f"prompt + {target - prompt} generated)")
  quantized = o.get("quantize_kvcache", "false").lower() == "true"
  kind = o.get("kv_quant_dtype", "int8")
  if quantized and kind != "int8":
    raise ValueError(f"MaxText kv_quant_dtype={kind!r}; valid here: int8")
  put("kv_dtype", "int8" if quantized else "bf16",
      f"quantize_kvcache={o.get('quantize_kvcache', 'false (default)')}")
