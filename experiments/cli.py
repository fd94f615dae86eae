"""What every experiment shares: its flags, and one-line errors with exit code 2.

Experiments are thin absl apps: parse flags, call one library function, print.
"""

from __future__ import annotations

import dataclasses
import gc
import os
import sys
from typing import Callable

# The CPU is the only local backend; TPU targets compile through libtpu's
# topology API, which works under this setting too. A JAX_PLATFORMS the user
# set is kept (see `use_local_gpus`).
_USER_PLATFORMS = os.environ.get("JAX_PLATFORMS")
os.environ.setdefault("JAX_PLATFORMS", "cpu")

# Errors stay one line with the gpu extra installed: importing meshes loads
# jax's plugins with their native logs hidden (meshes.quiet).
import meshes  # noqa: E402,F401  pylint: disable=unused-import

from absl import app, flags  # noqa: E402

from simulator import settings as S  # noqa: E402

USAGE_ERROR = 2


def define_model_flags() -> None:
  flags.DEFINE_string("model", "llama2_7b",
                      "preset name or path to a Hugging Face config.json")
  flags.DEFINE_string("topology", "v5p-128",
                      "Cloud name (v5p-128 counts TensorCores) or libtpu string "
                      "(v5p:4x4x4)")
  flags.DEFINE_string("mesh", None, "XxY, e.g. 16x4 (X: FSDP/data, Y: tensor);"
                      " default: all chips on X")
  flags.DEFINE_enum("format", "text", ["text", "json"], "output format")
  flags.DEFINE_string("maxtext", None, "a MaxText run's overrides, 'key=value "
                      "...' or @FILE (e.g. 'global_parameter_scale=32 "
                      "per_device_batch_size=6 remat_policy=minimal "
                      "ici_tensor_parallelism=4'): sets --model, --mesh, "
                      "--batch, --seq, --remat, --attention, --precision and "
                      "--optimizer for --topology, prints the mapping and what "
                      "it cannot express")


def define_train_flags() -> None:
  d = S.TrainSettings()
  flags.DEFINE_integer("batch", d.batch, "global batch in sequences")
  flags.DEFINE_integer("seq", d.seq, "sequence length in tokens (an "
                       "encoder-decoder's encoder length)")
  define_target_seq_flag()
  flags.DEFINE_string("remat", d.remat, f"remat policy: {S.REMAT_HELP}")
  flags.DEFINE_enum("attention", d.attention, list(S.ATTENTIONS),
                    "attention kernel")
  flags.DEFINE_enum("optimizer", d.optimizer, list(S.OPTIMIZERS), "optimizer")
  flags.DEFINE_enum("precision", d.precision, list(S.PRECISIONS),
                    "mixed: f32 params+grads, bf16 compute; bf16_master: bf16 "
                    "params+grads, f32 master copy in the optimizer; bf16: all")
  flags.DEFINE_enum("shard", d.shard, list(S.SHARDS),
                    "what X shards: dp nothing, zero1 optimizer, zero2 +grads,"
                    " zero3 +params (FSDP)")
  flags.DEFINE_integer("loss_chunks", d.loss_chunks,
                       "compute logits and loss in this many sequence chunks")
  define_moe_flags()
  define_finetune_flags()
  define_vision_flags()
  define_pipeline_flags()
  flags.DEFINE_integer("dp", 1, "data-parallel replicas on a mesh axis D "
                       "outermost (D x X x Y = chips; --mesh gives X x Y): "
                       "the batch split over D x X, the weights and "
                       "optimizer state sharded over X alone (hybrid "
                       "sharding; MaxText's dcn_data_parallelism across "
                       "slices)")


def define_memory_scheduler_flag() -> None:
  """--memory_scheduler: libtpu's, for a compile confirmation on a TPU."""
  from simulator.xla.memory_scheduler import SCHEDULERS
  flags.DEFINE_enum("memory_scheduler", "default", list(SCHEDULERS),
                    "TPU: the memory scheduler libtpu runs (its "
                    "--xla_memory_scheduler): default keeps the smallest of "
                    "its list, DFS and post-order schedules by its own "
                    "estimate, which is not always the smallest peak")


def define_hbm_fraction_flag() -> None:
  """--hbm_fraction: the headroom a largest-batch answer keeps."""
  from simulator.memory.capacity import HBM_FRACTION
  flags.DEFINE_float("hbm_fraction", HBM_FRACTION, "the share of HBM (on "
                     "GPUs: of JAX's pool, simulator.memory.capacity) the "
                     "peak may use when finding the largest batch that fits "
                     "(the playbook keeps 15-20% free)")


def define_pipeline_flags() -> None:
  """--pp, --microbatches, --schedule: pipeline stages (models.pipeline)."""
  d = S.TrainSettings()
  flags.DEFINE_integer("pp", d.pp, "pipeline stages on a mesh axis P "
                       "outermost (P x X x Y = chips; --mesh gives X x Y); "
                       "each stage holds n_layers/pp layers")
  flags.DEFINE_integer("microbatches", d.microbatches, "with --pp: "
                       "micro-batches of batch/microbatches sequences "
                       "through the stages")
  flags.DEFINE_enum("schedule", d.schedule, list(S.SCHEDULES), "with --pp: "
                    "gpipe (every forward, then every backward) or 1f1b (at "
                    "most pp micro-batches in flight)")


def define_worker_flags() -> None:
  """--workers, --ray_address: where compiles run (simulator.workers)."""
  flags.DEFINE_integer("workers", 1, "compile this many at once (local "
                       "processes, or Ray tasks with --ray_address)")
  flags.DEFINE_string("ray_address", None, "compile on Ray: ray://HOST:PORT "
                      "or auto (a running cluster), local (start one here "
                      "with --workers CPUs); needs pip install -e '.[ray]'")


def define_corpus_flags() -> None:
  """--only, --jsonl, --from_jsonl, --out: which cases of a corpus run, where
  their rows are kept, and the table (validation_matrix, execute_gpu; defined
  once when both are imported)."""
  if "from_jsonl" in flags.FLAGS:
    return
  flags.DEFINE_string("only", None, "comma-separated case indices to run")
  flags.DEFINE_string("jsonl", None, "append each result as a JSON line here "
                      "(with --from_jsonl: the re-checked rows, the file "
                      "written whole)")
  flags.DEFINE_string("from_jsonl", None, "re-check these kept results (a "
                      "--jsonl of an earlier run) instead of running them")
  flags.DEFINE_string("out", None, "the results table (markdown); default: "
                      "the experiment's own under experiments/")


def read_kept_rows(path: str, flag: str = "from_jsonl",
                   what: str = "a --jsonl file of an earlier run",
                   keys: tuple[str, ...] = ()) -> list[dict]:
  """The JSON lines of a file of kept rows (`flag` names it: a --jsonl file
  for --from_jsonl), each an object with `keys`, or a one-line error
  naming the line and saying it wants `what`."""
  import json  # pylint: disable=g-import-not-at-top
  rows, n = [], 0
  try:
    with open(path) as f:
      for n, line in enumerate(f, 1):
        if line.strip():
          rows.append((n, json.loads(line)))
  except ValueError as e:  # JSON's own position is within the line
    fail(f"--{flag}={path!r}: line {n + 1 if isinstance(e, UnicodeError) else n}"
         f" is not JSON ({e}); give {what}")
  except OSError as e:
    fail(f"--{flag}={path!r}: {e.strerror or e}; give {what}")
  if not rows:
    fail(f"--{flag}={path!r} holds no rows; give {what}")
  for n, row in rows:
    missing = [k for k in keys if k not in row] if isinstance(row, dict) else []
    if missing or not isinstance(row, dict):
      fault = (f"has no {missing[0]!r}" if missing else
               f"is a JSON {type(row).__name__}, not an object")
      fail(f"--{flag}={path!r}: line {n} {fault}; give {what}"
           + (f" (each line a JSON object with {', '.join(map(repr, keys))})"
              if keys else ""))
  return [row for _, row in rows]


def define_target_seq_flag() -> None:
  """--target_seq (the sweep's too)."""
  flags.DEFINE_integer("target_seq", S.TrainSettings().target_seq,
                       "an encoder-decoder's decoder (target) length in "
                       "tokens; 0: the same as --seq")


def define_moe_flags() -> None:
  """--moe_dispatch, --capacity_factor, --expert_axis (mixture of experts)."""
  d = S.TrainSettings()
  flags.DEFINE_enum("moe_dispatch", d.moe_dispatch, list(S.MOE_DISPATCHES),
                    "mixture of experts: capacity = GShard einsum dispatch, "
                    "each expert takes --capacity_factor x an even share of "
                    "a sequence's tokens, the rest dropped")
  flags.DEFINE_float("capacity_factor", d.capacity_factor, "mixture of "
                     "experts: slots per expert per sequence over an even "
                     "share (MaxText's capacity_factor)")
  flags.DEFINE_enum("expert_axis", d.expert_axis, list(S.EXPERT_AXES),
                    "mixture of experts: none = experts laid out like a dense"
                    " MLP (no all-to-all); x = experts split over X, tokens "
                    "moved to them by all-to-all over X")


def define_image_flags() -> None:
  """--images_per_sample, --image_size, --patch_size: a vision-language
  model's images (a text model refuses them)."""
  d = S.TrainSettings()
  flags.DEFINE_integer("images_per_sample", d.images_per_sample,
                       "vision-language model: images per sequence, each "
                       "(image_size/patch_size)^2 tokens before the text; 0: "
                       "one")
  flags.DEFINE_integer("image_size", d.image_size, "vision-language model: "
                       "image side in pixels; 0: the model's")
  flags.DEFINE_integer("patch_size", d.patch_size, "vision-language model: "
                       "patch side in pixels; 0: the model's")


def define_vision_flags() -> None:
  """--images_per_sample, --image_size, --patch_size, --train_vision,
  --vision_sharding (a vision-language model's images and tower; a text
  model refuses them)."""
  d = S.TrainSettings()
  define_image_flags()
  flags.DEFINE_boolean("train_vision", d.train_vision, "vision-language "
                       "model: train the vision tower too (default: frozen, "
                       "as LLaVA-1.5; the projector and LM train)")
  flags.DEFINE_enum("vision_sharding", d.vision_sharding, S.VISION_SHARDINGS,
                    "vision-language model: the tower's weights laid out "
                    "like the LM's (sharded: FSDP over X, TP over Y) or "
                    "whole on every device (replicated: the tower runs "
                    "data-parallel over X, no gather, no TP collective)")


def define_finetune_flags() -> None:
  """--config, --grad_accum, --offload and the adapter flags (the sweep's
  too)."""
  d = S.TrainSettings()
  flags.DEFINE_string("config", None, "a DeepSpeed JSON, Hugging Face "
                      "TrainingArguments JSON (PEFT's lora_r, target_modules "
                      "too), LLaMA-Factory YAML or axolotl YAML (their "
                      "deepspeed: file read too): sets the run flags it "
                      "says (flags given explicitly win), prints the mapping "
                      "and the keys it ignores; devices: --mesh's X, else "
                      "every chip")
  flags.DEFINE_integer("grad_accum", d.grad_accum, "run the step as this "
                       "many micro-batches of batch/grad_accum sequences, "
                       "summing their gradients (DeepSpeed's gradient "
                       "accumulation steps)")
  flags.DEFINE_list("offload", list(d.offload), "state kept in pinned host "
                    f"memory between steps: {', '.join(S.OFFLOADS)} "
                    "(optimizer: moments and master copy, moved to the device"
                    " for the update; params: fetched per layer)")
  define_adapter_flags()


def define_adapter_flags() -> None:
  """--lora_rank, --lora_targets, --base_quant: what the parameters are."""
  d = S.TrainSettings()
  flags.DEFINE_integer("lora_rank", d.lora_rank, "LoRA: train rank-r adapters"
                       " on --lora_targets, the base frozen (no gradient, no "
                       "optimizer state); 0: full fine-tuning")
  flags.DEFINE_list("lora_targets", list(d.lora_targets),
                    f"projections that get an adapter: {', '.join(S.LORA_TARGETS)}")
  flags.DEFINE_enum("base_quant", d.base_quant, list(S.BASE_QUANTS),
                    "QLoRA: store the frozen base's layer projections as "
                    "nf4 (4-bit NormalFloat, blocks of 64, double-quantized "
                    "absmax) or int8 (absmax per output feature), "
                    "dequantized per layer; needs --lora_rank")


def train_settings() -> S.TrainSettings:
  """The run settings the parsed flags name (flags are named as its fields)."""
  from simulator.model_checks import check_stage_settings
  f = flags.FLAGS
  check_lora_flags()
  settings = S.settings_from({name: f[name].value for name in f})
  check_stage_settings(settings)
  return settings


def check_lora_flags() -> None:
  """--lora_targets given without --lora_rank: a ValueError (the targets
  would be dropped silently, the run a full fine-tuning)."""
  f = flags.FLAGS
  if "lora_targets" in f and f["lora_targets"].present and not f.lora_rank:
    raise ValueError(f"lora_targets={','.join(f.lora_targets)} without "
                     "lora_rank: adapters need a rank; give lora_rank > 0")


def check_folder(flag: str, path: str | None) -> None:
  """A file flag whose folder is not there or cannot be written: a
  one-line error before any work (nothing is written until the run's
  end)."""
  if path is None:
    return
  folder = os.path.dirname(os.path.abspath(path))
  if not os.path.isdir(folder):
    fail(f"--{flag}={path!r}: no folder {folder!r}; give a file in an "
         "existing folder")
  if os.path.isdir(path):
    fail(f"--{flag}={path!r} is a folder; give a file")
  if not os.access(folder, os.W_OK):  # the file is written whole, renamed in
    fail(f"--{flag}={path!r}: the folder {folder!r} cannot be written; give "
         "a file in a folder that can")


def write_whole(path: str, text: str) -> None:
  """`text` written to a temporary file beside `path`, then moved over it:
  a reader (or a link to the old file) sees the old file or the new one
  whole, never a half-written one."""
  tmp = f"{path}.tmp"
  try:
    with open(tmp, "w") as f:
      f.write(text)
    os.replace(tmp, path)
  finally:
    if os.path.exists(tmp):
      os.remove(tmp)


def fail(message: str) -> None:
  print(f"error: {message}", file=sys.stderr)
  sys.exit(USAGE_ERROR)


def _repeated(argv: list[str]) -> str | None:
  """The first flag given more than once (absl would keep the last
  silently): --name=value, --name value, --flag and --noflag alike."""
  seen: dict[str, str] = {}
  for arg in argv[1:]:
    if not arg.startswith("--") or arg == "--":
      continue
    name = arg[2:].split("=", 1)[0]
    if name.startswith("no") and name[2:] in flags.FLAGS:
      name = name[2:]
    if name in seen:
      return f"--{name} is given twice ({seen[name]} and {arg}); give it once"
    seen[name] = arg
  return None


# A flag --maxtext or --config sets, by the name an experiment (the sweep)
# may give it instead.
_PLURAL = {"batch": "batches", "remat": "remats", "optimizer": "optimizers",
           "shard": "shards", "dp": "dps"}


def _set(values: dict, mapping, ignored, source: str, explicit_wins: bool
         ) -> None:
  """Set the flags `values` names (by an experiment's own name for them);
  print the mapping and what was ignored to stderr."""
  f = flags.FLAGS

  def used(line: str) -> bool:
    """Whether this experiment has the flag a "why -> --flag=value" line
    sets."""
    name = line.rsplit(" -> --", 1)[-1].split("=")[0]
    return name in f or _PLURAL.get(name) in f

  lines = [f"{source}: {m}" for m in mapping if used(m)]
  unused = [m.split(" -> ")[0] for m in mapping if not used(m)]
  for name, value in values.items():
    flag = name if name in f else _PLURAL.get(name)
    if flag not in f:
      if name == "dp" and value != "1":  # the plan would change silently
        raise ValueError(f"--{source} sets dp={value} (data-parallel "
                         "replicas), which this experiment does not take; "
                         "memory_report, compute_bound, validate, max_batch, "
                         "describe and mesh_sweep do")
      continue
    if f[flag].present:
      given = f[flag].value
      given = ",".join(map(str, given)) if isinstance(given, list) else given
      if explicit_wins:
        lines.append(f"{source}: --{flag}={given} given explicitly "
                     f"wins over {value}")
        continue
      raise ValueError(f"--{flag}={given} and --{source} (which sets "
                       f"--{flag}={value}) are both given; give one")
    f[flag].parse(value)
  if unused:
    lines.append(f"{source}: not used by this experiment: "
                 + ", ".join(unused))
  if ignored:
    lines.append(f"{source}: not expressed here (ignored): "
                 + ", ".join(ignored))
  print("\n".join(lines), file=sys.stderr)


def _apply_maxtext() -> None:
  """Set the flags a --maxtext run maps to; a flag also given on the
  command line is an error, naming both."""
  from meshes.topology import parse_topology
  from models.maxtext import maxtext_run
  f = flags.FLAGS
  text = f.maxtext
  if text.startswith("@"):
    try:
      with open(text[1:], encoding="utf-8") as fh:
        text = fh.read()
    except OSError as e:
      raise ValueError(f"--maxtext={text}: {e.strerror or e}; give "
                       f"@FILE of key=value overrides") from None
    except UnicodeDecodeError as e:
      raise ValueError(f"--maxtext={text}: not UTF-8 text (byte {e.start})"
                       ) from None
  topology = parse_topology(f.topology)
  run = maxtext_run(text, topology.chips, topology.hosts,
                    serving="prompt" in f)
  _set(run.flags, run.mapping, run.unexpressed, "maxtext", False)


def _apply_config() -> None:
  """Set the run flags a --config file says; explicit flags win."""
  from meshes.layout import parse_mesh
  from meshes.topology import parse_topology
  from simulator.config_files import read_config
  f = flags.FLAGS
  mesh = f.mesh if "mesh" in f else None
  # The data-parallel devices a micro-batch is split over: X times the
  # replicas (--dp), or every chip with no mesh given.
  replicas = f.dp if "dp" in f else 1
  devices = (parse_mesh(mesh)[0] * replicas if mesh
             else parse_topology(f.topology).chips)
  run = read_config(f.config, devices)
  article = "an" if run.kind[0] in "aeiou" else "a"  # an axolotl YAML
  print(f"config: {f.config} read as {article} {run.kind}", file=sys.stderr)
  _set(run.flags, run.mapping, run.ignored, "config", True)


def _parse(argv: list[str]) -> list[str]:
  repeated = _repeated(argv)
  if repeated:
    fail(repeated)
  try:
    rest = flags.FLAGS(argv)
  except flags.UnrecognizedFlagError as e:
    experiment = os.path.splitext(os.path.basename(argv[0]))[0]
    training = e.flagname in {f.name for f in
                              dataclasses.fields(S.TrainSettings)}
    fail(f"{str(e).splitlines()[0]}"
         + (" (a training setting)" if training else "")
         + f"; python -m experiments.{experiment} --help lists the flags "
         "it takes")
  except flags.Error as e:
    fail(str(e).splitlines()[0])
  try:
    given = [name for name in ("maxtext", "config")
             if name in flags.FLAGS and flags.FLAGS[name].value]
    empty = [name for name in ("maxtext", "config") if name in flags.FLAGS
             and flags.FLAGS[name].present and not flags.FLAGS[name].value]
    if empty:
      raise ValueError(f"--{empty[0]} is given empty; give "
                       + ("MaxText's key=value overrides or @FILE"
                          if empty[0] == "maxtext" else "a config file"))
    if len(given) == 2:
      raise ValueError(f"--maxtext and --config={flags.FLAGS.config} both "
                       "describe the run; give one")
    if "maxtext" in flags.FLAGS and flags.FLAGS.maxtext:
      _apply_maxtext()
    if "config" in flags.FLAGS and flags.FLAGS.config:
      _apply_config()
  except (ValueError, OSError, flags.Error) as e:
    fail(str(e).splitlines()[0])
  return rest


def use_local_gpus() -> None:
  """Lets JAX initialise the local GPUs (validate --target=gpu
  --execute_steps), which the CPU default above hides; call it before any
  backend starts. A JAX_PLATFORMS the user set stays as set."""
  if _USER_PLATFORMS is None:
    os.environ["JAX_PLATFORMS"] = "cuda,cpu"  # worker processes inherit it
    import jax  # pylint: disable=g-import-not-at-top
    jax.config.update("jax_platforms", "cuda,cpu")


def compiler_failed(e: Exception, topology: str) -> None:
  """XLA's own failure to compile a step (a JaxRuntimeError that is no
  out-of-memory answer), not the user's input: one line, exit 1."""
  message = str(e).splitlines()[0]
  print(f"error: XLA could not compile the step for {topology}: "
        f"{message[:300]}", file=sys.stderr)
  raise SystemExit(1) from None


def run(main: Callable[[list[str]], None]) -> None:
  """app.run with bad flags and bad values turned into one line, exit 2.

  The process is short-lived, so the cyclic GC is kept off what lives as
  long as it (gc.freeze): the modules imported before `main` (jax, flax),
  which every full collection would scan again, and, once `main` returns,
  everything left, which the exit frees without a last full collection
  (the sweep's figures: README "Benchmarks")."""

  def guarded(argv):
    if len(argv) > 1:
      fail(f"unexpected arguments {argv[1:]}; all options are --flags")
    gc.freeze()
    try:
      main(argv)
      gc.freeze()
    except ValueError as e:
      fail(str(e).splitlines()[0])
    except OverflowError as e:  # sizes past what int64 arithmetic holds
      fail(f"{str(e).splitlines()[0]}: the model or plan is too large to "
           "simulate")
    except OSError as e:  # a full disk, an unwritable folder: nothing torn
      where = f" ({e.filename})" if e.filename else ""
      fail(f"{e.strerror or e}{where}; what was written before is intact")

  _key_flags_in_help()
  app.run(guarded, flags_parser=_parse)


def _key_flags_in_help() -> None:
  """--help lists the main module's key flags: the flags this module
  defines for the experiments (--model, --topology, --batch, ...) are made
  the main module's too, so --help shows them (--helpfull lists absl's
  own as well). absl names the __main__ module by sys.argv[0]."""
  f = flags.FLAGS
  for flag in f.get_key_flags_for_module(__name__):
    f.register_key_flag_for_module(sys.argv[0], flag)


def model_and_plan():
  """(ModelConfig, MeshPlan) from --model, --topology and --mesh."""
  from meshes.layout import parse_mesh, plan_mesh
  from meshes.topology import parse_topology
  from models.registry import load_model
  f = flags.FLAGS
  cfg = load_model(f.model)
  topology = parse_topology(f.topology)
  pp, dp = outer_size("pp", topology), outer_size("dp", topology)
  x, y = parse_mesh(f.mesh) if f.mesh else (topology.chips // pp // dp, 1)
  return cfg, plan_mesh(topology, x, y, P=pp, D=dp)


def outer_size(flag: str, topology) -> int:
  """--pp or --dp (1 where the experiment has no such flag): a positive
  divisor of the topology's chips, or a one-line ValueError."""
  f = flags.FLAGS
  n = f[flag].value if flag in f else 1
  if n <= 0:
    raise ValueError(f"{flag}={n} must be a positive number of "
                     f"{'stages' if flag == 'pp' else 'replicas'}")
  if topology.chips % n:
    from meshes.layout import divisors
    raise ValueError(f"{flag}={n} does not divide {topology.name}'s "
                     f"{topology.chips} chips; valid: "
                     f"{', '.join(map(str, divisors(topology.chips)))}")
  return n


def settings_line(name: str, settings: S.TrainSettings, cfg=None) -> str:
  """One line naming the model and every train setting, for report headers;
  given a vision-language model's config, the tokens its LM sees."""
  from models.vision import tokens_line
  from simulator.model_checks import with_images
  if cfg is not None:
    cfg = with_images(cfg, settings)
  return (f"{name}: batch {settings.batch} x seq {settings.seq}" + (
              f" (decoder {settings.target_seq})" if settings.target_seq
              else "") + ", remat "
          f"{settings.remat}, attention {settings.attention}, "
          f"{settings.optimizer}/{settings.precision}, X shards {settings.shard},"
          f" loss_chunks {settings.loss_chunks}" + (
              f", {settings.grad_accum} micro-batches of "
              f"{settings.batch // settings.grad_accum}"
              if settings.grad_accum > 1 else "") + (
              f", pp {settings.pp} stages x {settings.microbatches} "
              f"micro-batches ({settings.schedule})" if settings.pp > 1
              else "") + (
              f", LoRA rank {settings.lora_rank} on "
              f"{','.join(settings.lora_targets)}" if settings.lora_rank else "")
          + (f", base {settings.base_quant}" if settings.base_quant != "none"
             else "") + (f", {'+'.join(settings.offload)} offloaded to host"
                         if settings.offload else "")
          + (tokens_line(cfg, settings.seq, settings.images,
                         settings.train_vision, settings.vision_sharding)
             if cfg is not None and cfg.vision else ""))
