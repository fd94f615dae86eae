"""Run settings: everything about a training step that is not the model."""

from __future__ import annotations

import dataclasses

REMAT_HELP = "none, full, dots, names:<list>, offload:<list>"
ATTENTIONS = ("materialized", "flash")
OPTIMIZERS = ("adamw", "adamw_bf16_mu", "adafactor", "sgd", "sgd_momentum")
PRECISIONS = ("mixed", "bf16_master", "bf16")
SHARDS = ("dp", "zero1", "zero2", "zero3")
LORA_TARGETS = ("q", "k", "v", "o", "wi", "wi_gate", "wo")


@dataclasses.dataclass(frozen=True)
class TrainSettings:
  """batch is the global batch in sequences; seq the sequence length."""

  batch: int = 8
  seq: int = 2048
  remat: str = "full"
  attention: str = "flash"
  optimizer: str = "adamw"
  precision: str = "mixed"
  shard: str = "zero3"
  loss_chunks: int = 1
  grad_accum: int = 1  # micro-batches per step (batch = micro x this)
  lora_rank: int = 0  # > 0: train rank-r adapters only, the base frozen
  lora_targets: tuple[str, ...] = ("q", "k", "v", "o")

  def __post_init__(self):
    for field in ("batch", "seq", "loss_chunks", "grad_accum"):
      value = getattr(self, field)
      if not isinstance(value, int) or value <= 0:
        raise ValueError(f"{field}={value!r} must be a positive integer")
    for field, valid in (("attention", ATTENTIONS), ("optimizer", OPTIMIZERS),
                         ("precision", PRECISIONS), ("shard", SHARDS)):
      if getattr(self, field) not in valid:
        raise ValueError(f"{field}={getattr(self, field)!r}; valid: "
                         f"{', '.join(valid)}")
    if self.batch % self.grad_accum:
      raise ValueError(f"batch={self.batch} is not a multiple of grad_accum="
                       f"{self.grad_accum}; the step runs batch/grad_accum "
                       f"sequences per micro-batch")
    if not isinstance(self.lora_rank, int) or self.lora_rank < 0:
      raise ValueError(f"lora_rank={self.lora_rank!r} must be an integer >= 0"
                       " (0: full fine-tuning)")
    bad = [t for t in self.lora_targets if t not in LORA_TARGETS]
    if bad or (self.lora_rank and not self.lora_targets):
      raise ValueError(f"lora_targets={','.join(self.lora_targets)!r}: "
                       f"{bad[0] if bad else 'empty'!r} is not a projection; "
                       f"valid: {', '.join(LORA_TARGETS)}")
    from models.remat import policy  # validates the remat spec
    policy(self.remat)

  @property
  def tokens(self) -> int:
    return self.batch * self.seq


KV_DTYPES = ("bf16", "int8")


@dataclasses.dataclass(frozen=True)
class ServeSettings:
  """Serving with a KV cache: `batch` sequences, each a prompt of `prompt`
  tokens (one prefill) then `generate` tokens (one decode step each); the
  cache holds prompt + generate positions."""

  batch: int = 8
  prompt: int = 1024
  generate: int = 256
  kv_dtype: str = "bf16"
  attention: str = "flash"  # the prefill's kernel

  def __post_init__(self):
    for field in ("batch", "prompt", "generate"):
      value = getattr(self, field)
      if not isinstance(value, int) or value <= 0:
        raise ValueError(f"{field}={value!r} must be a positive integer")
    for field, valid in (("kv_dtype", KV_DTYPES), ("attention", ATTENTIONS)):
      if getattr(self, field) not in valid:
        raise ValueError(f"{field}={getattr(self, field)!r}; valid: "
                         f"{', '.join(valid)}")

  @property
  def length(self) -> int:
    """The cache's positions per sequence."""
    return self.prompt + self.generate
