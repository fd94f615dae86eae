"""Run settings: everything about a training step that is not the model."""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping

REMAT_HELP = "none, full, dots, names:<list>, offload:<list>"
ATTENTIONS = ("materialized", "flash")
OPTIMIZERS = ("adamw", "adamw_bf16_mu", "adamw_8bit", "adafactor", "sgd",
              "sgd_momentum")
PRECISIONS = ("mixed", "bf16_master", "bf16")
SHARDS = ("dp", "zero1", "zero2", "zero3")
LORA_TARGETS = ("q", "k", "v", "o", "wi", "wi_gate", "wo")
# How the frozen base may be stored: as trained, or models.quant's NF4 or int8.
BASE_QUANTS = ("none", "nf4", "int8")
OFFLOADS = ("optimizer", "params")  # state kept in pinned host memory
MOE_DISPATCHES = ("capacity",)  # models.moe
EXPERT_AXES = ("none", "x")  # experts unsplit, or split over X (all-to-all)
# A vision tower laid out like the LM, or whole on every device.
VISION_SHARDINGS = ("sharded", "replicated")
SCHEDULES = ("gpipe", "1f1b")  # pipeline schedules (models.pipeline)


@dataclasses.dataclass(frozen=True)
class TrainSettings:
  """batch is the global batch in sequences; seq the sequence length (an
  encoder-decoder's encoder length; its decoder's is target_seq, 0: seq)."""

  batch: int = 8
  seq: int = 2048
  target_seq: int = 0
  remat: str = "full"
  attention: str = "flash"
  optimizer: str = "adamw"
  precision: str = "mixed"
  shard: str = "zero3"
  loss_chunks: int = 1
  grad_accum: int = 1  # micro-batches per step (batch = micro x this)
  lora_rank: int = 0  # > 0: train rank-r adapters only, the base frozen
  lora_targets: tuple[str, ...] = ("q", "k", "v", "o")
  base_quant: str = "none"  # the frozen base's projections stored quantized
  offload: tuple[str, ...] = ()  # OFFLOADS kept in host memory between steps
  # Mixture of experts (a dense model refuses all but the defaults,
  # simulator.step.build_step): how tokens reach experts,
  # each expert's slots per sequence relative to an even share, and the mesh
  # axis the experts are split over.
  moe_dispatch: str = "capacity"
  capacity_factor: float = 1.0
  expert_axis: str = "none"
  # Vision-language models (models.vision; a text model refuses them):
  # images per sequence (0: one), their side and patch side in pixels (0:
  # the model's), whether the vision tower trains (LLaVA-1.5 keeps it
  # frozen in both its stages: no gradient, no optimizer state), and how its
  # weights are laid out: like the LM's (`sharded`: FSDP over X, TP over Y)
  # or whole on every device (`replicated`: the tower runs data-parallel).
  images_per_sample: int = 0
  image_size: int = 0
  patch_size: int = 0
  train_vision: bool = False
  vision_sharding: str = "sharded"
  # Pipeline parallelism (models.pipeline): pp stages on the mesh's P axis,
  # the batch run as `microbatches` micro-batches through them, scheduled
  # GPipe (every forward, then every backward) or 1F1B.
  pp: int = 1
  microbatches: int = 1
  schedule: str = "gpipe"

  def __post_init__(self):
    for field in ("lora_targets", "offload"):  # JSON gives lists
      object.__setattr__(self, field, tuple(getattr(self, field)))
    for field in ("batch", "seq", "loss_chunks", "grad_accum", "pp",
                  "microbatches"):
      value = getattr(self, field)
      if not isinstance(value, int) or value <= 0:
        raise ValueError(f"{field}={value!r} must be a positive integer")
    for field, valid in (("attention", ATTENTIONS), ("optimizer", OPTIMIZERS),
                         ("precision", PRECISIONS), ("shard", SHARDS),
                         ("moe_dispatch", MOE_DISPATCHES),
                         ("expert_axis", EXPERT_AXES),
                         ("vision_sharding", VISION_SHARDINGS),
                         ("schedule", SCHEDULES)):
      if getattr(self, field) not in valid:
        raise ValueError(f"{field}={getattr(self, field)!r}; valid: "
                         f"{', '.join(valid)}")
    cf = self.capacity_factor
    if not (isinstance(cf, (int, float)) and 0 < cf < float("inf")):
      raise ValueError(f"capacity_factor={cf!r} must be a positive number "
                       "(1.0: each expert takes an even share of the tokens)")
    if self.batch % self.grad_accum:
      raise ValueError(f"batch={self.batch} is not a multiple of grad_accum="
                       f"{self.grad_accum}; the step runs batch/grad_accum "
                       f"sequences per micro-batch")
    if self.batch % self.microbatches:
      raise ValueError(f"batch={self.batch} is not a multiple of microbatches="
                       f"{self.microbatches}; each micro-batch runs "
                       "batch/microbatches sequences")
    if self.pp == 1 and (self.microbatches > 1 or self.schedule != "gpipe"):
      raise ValueError(f"microbatches={self.microbatches}, schedule="
                       f"{self.schedule}: these schedule pipeline stages; "
                       "give pp > 1 (or grad_accum for micro-batches "
                       "without stages)")
    if self.pp > 1 and self.grad_accum > 1:
      raise ValueError(f"grad_accum={self.grad_accum} with pp={self.pp}: a "
                       "pipeline runs its micro-batches itself; use "
                       "microbatches")
    _check_image_fields(self)
    if not isinstance(self.target_seq, int) or self.target_seq < 0:
      raise ValueError(f"target_seq={self.target_seq!r} must be an integer >= "
                       "0 (0: the same as seq)")
    if not isinstance(self.lora_rank, int) or self.lora_rank < 0:
      raise ValueError(f"lora_rank={self.lora_rank!r} must be an integer >= 0"
                       " (0: full fine-tuning)")
    twice = [t for t in self.lora_targets if self.lora_targets.count(t) > 1]
    if twice:
      raise ValueError(f"lora_targets={','.join(self.lora_targets)!r}: "
                       f"{twice[0]!r} is given twice; give each once")
    bad = [t for t in self.lora_targets if t not in LORA_TARGETS]
    if bad or (self.lora_rank and not self.lora_targets):
      raise ValueError(f"lora_targets={','.join(self.lora_targets)!r}: "
                       f"{bad[0] if bad else 'empty'!r} is not a projection; "
                       f"valid: {', '.join(LORA_TARGETS)}")
    if self.base_quant not in BASE_QUANTS:
      raise ValueError(f"base_quant={self.base_quant!r}; valid: "
                       f"{', '.join(BASE_QUANTS)}")
    if self.base_quant != "none" and not self.lora_rank:
      raise ValueError(f"base_quant={self.base_quant} needs lora_rank > 0: a "
                       "quantized base is frozen, only adapters train (QLoRA)")
    bad = [o for o in self.offload if o not in OFFLOADS]
    if bad:
      raise ValueError(f"offload={','.join(self.offload)!r}: {bad[0]!r}; "
                       f"valid: {', '.join(OFFLOADS)}")
    from models.remat import check  # validates the remat spec
    check(self.remat)

  @property
  def batch_splits(self) -> int:
    """Micro-batches per step: grad_accum's, or the pipeline's."""
    return self.microbatches if self.pp > 1 else self.grad_accum

  @property
  def decoder_seq(self) -> int:
    """An encoder-decoder's target (decoder) length."""
    return self.target_seq or self.seq

  @property
  def images(self) -> int:
    """Images per sequence of a vision-language model."""
    return self.images_per_sample or 1

  @property
  def tokens(self) -> int:
    return self.batch * self.seq


def settings_from(values: Mapping[str, Any]) -> TrainSettings:
  """TrainSettings from anything that names its fields (parsed flags, a sweep
  spec, a kept corpus row's config); a field it does not name keeps its
  default, a name that is no field is ignored."""
  names = {f.name for f in dataclasses.fields(TrainSettings)}
  return TrainSettings(**{k: v for k, v in values.items() if k in names})


def _check_image_fields(settings) -> None:
  """A one-line ValueError for a negative (or non-integer) image setting."""
  for field in ("images_per_sample", "image_size", "patch_size"):
    value = getattr(settings, field)
    if not isinstance(value, int) or value < 0:
      raise ValueError(f"{field}={value!r} must be an integer >= 0 (0: "
                       "the model's)")


KV_DTYPES = ("bf16", "int8")


@dataclasses.dataclass(frozen=True)
class ServeSettings:
  """Serving with a KV cache: `batch` sequences, each a prompt of `prompt`
  tokens (one prefill) then `generate` tokens (one decode step each); the
  cache holds prompt + generate positions (a vision-language model's, its
  image tokens too: the images, as in training, at the model's resolution
  where 0)."""

  batch: int = 8
  prompt: int = 1024
  generate: int = 256
  kv_dtype: str = "bf16"
  attention: str = "flash"  # the prefill's kernel
  images_per_sample: int = 0
  image_size: int = 0
  patch_size: int = 0

  def __post_init__(self):
    for field in ("batch", "prompt", "generate"):
      value = getattr(self, field)
      if not isinstance(value, int) or value <= 0:
        raise ValueError(f"{field}={value!r} must be a positive integer")
    _check_image_fields(self)
    for field, valid in (("kv_dtype", KV_DTYPES), ("attention", ATTENTIONS)):
      if getattr(self, field) not in valid:
        raise ValueError(f"{field}={getattr(self, field)!r}; valid: "
                         f"{', '.join(valid)}")

  @property
  def length(self) -> int:
    """The text's positions per sequence."""
    return self.prompt + self.generate

  @property
  def images(self) -> int:
    """Images per sequence of a vision-language model."""
    return self.images_per_sample or 1
