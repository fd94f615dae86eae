"""Model hyperparameters: one frozen dataclass, separate from run settings."""

from __future__ import annotations

import dataclasses

NORMS = ("rms", "layer", "none")
POSITIONS = ("rope", "learned", "none")
MLPS = ("swiglu", "geglu", "gelu", "relu", "linear")


@dataclasses.dataclass(frozen=True)
class ModelConfig:
  """A decoder-only LM (or the attention-free XXL FFN stack when attention=False).

  `linear` MLP is two matmuls with no activation (seed 004's XXL model).
  `parallel_block`: one norm feeds attention and the MLP, whose outputs are
  added to the residual together (PaLM; MaxText's 2023 default decoder).
  """

  name: str
  d_model: int
  n_layers: int
  d_ff: int
  vocab_size: int = 0
  n_heads: int = 0
  n_kv_heads: int = 0
  head_dim: int = 0
  max_len: int = 2048
  norm: str = "rms"
  positions: str = "rope"
  mlp: str = "swiglu"
  tie_embeddings: bool = False
  bias: bool = False  # biases on every projection (GPT-2/3)
  qkv_bias: bool = False  # biases on q/k/v only (Qwen2)
  attention: bool = True
  embeddings: bool = True  # token embedding and output layer
  final_norm: bool = True
  norm_eps: float = 1e-5
  rope_theta: float = 10000.0
  embed_scale: bool = False  # Gemma multiplies embeddings by sqrt(d_model)
  parallel_block: bool = False  # attention and MLP side by side (PaLM)

  def __post_init__(self):
    positive = ["d_model", "n_layers", "d_ff"]
    if self.attention:
      positive += ["n_heads", "n_kv_heads", "head_dim"]
    if self.embeddings:
      positive += ["vocab_size"]
    if self.positions == "learned":
      positive += ["max_len"]
    for field in positive:
      value = getattr(self, field)
      if not isinstance(value, int) or value <= 0:
        raise ValueError(
            f"model {self.name!r}: {field}={value!r} must be a positive integer")
    for field, valid in (("norm", NORMS), ("positions", POSITIONS),
                         ("mlp", MLPS)):
      if getattr(self, field) not in valid:
        raise ValueError(f"model {self.name!r}: {field}={getattr(self, field)!r};"
                         f" valid: {', '.join(valid)}")
    if self.attention and self.n_heads % self.n_kv_heads:
      raise ValueError(f"model {self.name!r}: n_heads={self.n_heads} is not a "
                       f"multiple of n_kv_heads={self.n_kv_heads}")
    if self.parallel_block and not self.attention:
      raise ValueError(f"model {self.name!r}: parallel_block needs attention")
    if self.tie_embeddings and not self.embeddings:
      raise ValueError(f"model {self.name!r}: tie_embeddings needs embeddings")
