"""Model hyperparameters: one frozen dataclass, separate from run settings."""

from __future__ import annotations

import dataclasses

NORMS = ("rms", "layer", "none")
POSITIONS = ("rope", "learned", "relative", "none")
MLPS = ("swiglu", "geglu", "gelu", "relu", "linear")
GATED_MLPS = ("swiglu", "geglu")  # wi and a gate, wi_gate (models.layers)


@dataclasses.dataclass(frozen=True)
class ModelConfig:
  """A decoder-only LM (or the attention-free XXL FFN stack when attention=False),
  or with `encoder_layers` > 0 an encoder-decoder (T5: models.encoder_decoder),
  whose decoder has `n_layers` layers.

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
  encoder_layers: int = 0  # > 0: an encoder-decoder (T5)
  # T5's relative position buckets (positions="relative"): half of them for
  # each direction in the encoder, distances up to `relative_max_distance`
  # spread over the upper half logarithmically.
  relative_buckets: int = 32
  relative_max_distance: int = 128
  # Mixture of experts (models.moe): n_experts > 0 replaces every block's MLP
  # with n_experts routed MLPs of width expert_d_ff (kind `mlp`), each token
  # sent to experts_per_token of them; shared_expert_d_ff > 0 adds one MLP
  # every token goes through, scaled by a sigmoid gate (Qwen2-MoE).
  n_experts: int = 0
  experts_per_token: int = 0
  expert_d_ff: int = 0
  shared_expert_d_ff: int = 0
  router_renormalize: bool = True  # top-k weights summed to 1 (Mixtral)
  router_aux_loss_coef: float = 0.01  # load-balancing loss weight
  # Vision-language (models.vision, LLaVA-style): vision_layers > 0 adds a
  # ViT over image patches (CLIP's layout: a class token, learned positions,
  # pre-norm LayerNorm blocks with biases, GELU MLP) and a 2-layer GELU
  # projector into d_model; the LM runs over [image tokens; text tokens].
  vision_layers: int = 0
  vision_d_model: int = 0
  vision_d_ff: int = 0
  vision_heads: int = 0
  image_size: int = 0  # pixels per side
  patch_size: int = 0  # pixels per patch side

  @property
  def encoder_decoder(self) -> bool:
    return self.encoder_layers > 0

  @property
  def moe(self) -> bool:
    return self.n_experts > 0

  @property
  def vision(self) -> bool:
    return self.vision_layers > 0

  def __post_init__(self):
    if not isinstance(self.n_experts, int) or self.n_experts < 0:
      raise ValueError(f"model {self.name!r}: n_experts={self.n_experts!r} "
                       "must be an integer >= 0 (0: a dense MLP)")
    positive = ["d_model", "n_layers"] + ([] if self.moe else ["d_ff"])
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
    if self.moe:
      self._check_moe()
    if not isinstance(self.vision_layers, int) or self.vision_layers < 0:
      raise ValueError(f"model {self.name!r}: vision_layers="
                       f"{self.vision_layers!r} must be an integer >= 0 (0: "
                       "no vision tower)")
    if self.vision:
      self._check_vision()
    if self.parallel_block and not self.attention:
      raise ValueError(f"model {self.name!r}: parallel_block needs attention")
    if not isinstance(self.encoder_layers, int) or self.encoder_layers < 0:
      raise ValueError(f"model {self.name!r}: encoder_layers="
                       f"{self.encoder_layers!r} must be an integer >= 0")
    if (self.positions == "relative") != self.encoder_decoder:
      raise ValueError(f"model {self.name!r}: relative positions go with an "
                       f"encoder (T5) and only there; got positions="
                       f"{self.positions!r}, encoder_layers={self.encoder_layers}")
    if self.encoder_decoder and (not self.attention or not self.embeddings
                                 or self.parallel_block):
      raise ValueError(f"model {self.name!r}: an encoder-decoder needs "
                       "attention and embeddings, and no parallel_block")
    if self.positions == "relative" and not (
        self.relative_buckets >= 4 and self.relative_buckets % 2 == 0
        and self.relative_max_distance > self.relative_buckets // 2):
      raise ValueError(f"model {self.name!r}: relative_buckets="
                       f"{self.relative_buckets} must be even and >= 4, and "
                       f"relative_max_distance={self.relative_max_distance} "
                       f"above half of it")
    if self.tie_embeddings and not self.embeddings:
      raise ValueError(f"model {self.name!r}: tie_embeddings needs embeddings")

  def _check_vision(self) -> None:
    for field in ("vision_d_model", "vision_d_ff", "vision_heads",
                  "image_size", "patch_size"):
      value = getattr(self, field)
      if not isinstance(value, int) or value <= 0:
        raise ValueError(f"model {self.name!r}: {field}={value!r} must be a "
                         f"positive integer with vision_layers="
                         f"{self.vision_layers}")
    if self.image_size % self.patch_size:
      raise ValueError(f"model {self.name!r}: image_size={self.image_size} is "
                       f"not a multiple of patch_size={self.patch_size}; "
                       "choose a patch size dividing the image side")
    if self.vision_d_model % self.vision_heads:
      raise ValueError(f"model {self.name!r}: vision_d_model="
                       f"{self.vision_d_model} is not a multiple of "
                       f"vision_heads={self.vision_heads}")
    if self.encoder_decoder or not (self.attention and self.embeddings):
      raise ValueError(f"model {self.name!r}: a vision tower goes with a "
                       "decoder-only LM with attention and embeddings")

  def _check_moe(self) -> None:
    for field in ("experts_per_token", "expert_d_ff"):
      value = getattr(self, field)
      if not isinstance(value, int) or value <= 0:
        raise ValueError(f"model {self.name!r}: {field}={value!r} must be a "
                         f"positive integer with n_experts={self.n_experts}")
    if self.experts_per_token > self.n_experts:
      raise ValueError(f"model {self.name!r}: experts_per_token="
                       f"{self.experts_per_token} exceeds n_experts="
                       f"{self.n_experts}; choose 1..{self.n_experts}")
    if not isinstance(self.shared_expert_d_ff, int) or self.shared_expert_d_ff < 0:
      raise ValueError(f"model {self.name!r}: shared_expert_d_ff="
                       f"{self.shared_expert_d_ff!r} must be an integer >= 0")
    if self.bias:
      raise ValueError(f"model {self.name!r}: bias=True with n_experts="
                       f"{self.n_experts}; experts have no biases here")
    coef = self.router_aux_loss_coef
    if not (isinstance(coef, (int, float)) and 0 <= coef < float("inf")):
      raise ValueError(f"model {self.name!r}: router_aux_loss_coef={coef!r} "
                       "must be a finite number >= 0")


def at_resolution(cfg: ModelConfig, image_size: int, patch_size: int
                  ) -> ModelConfig:
  """`cfg` with its images at `image_size` pixels in patches of `patch_size`
  (0: the model's own); the position table grows or shrinks with the patch
  count. One-line ValueError for a text model given either."""
  if not (image_size or patch_size):
    return cfg
  if not cfg.vision:
    raise ValueError(f"image_size={image_size}, patch_size={patch_size}: "
                     f"{cfg.name} has no vision tower; these set a vision-"
                     "language model's images")
  return dataclasses.replace(cfg, image_size=image_size or cfg.image_size,
                             patch_size=patch_size or cfg.patch_size)


# Flash attention's query and key block (models.attention): a sequence it
# runs over is a multiple of it, or shorter.
FLASH_BLOCK = 512


def patches(cfg: ModelConfig) -> int:
  """Patches per image: (image_size / patch_size)^2 (the class token not
  counted: LLaVA drops it)."""
  return (cfg.image_size // cfg.patch_size) ** 2


def image_tokens(cfg: ModelConfig, images: int) -> int:
  """The tokens `images` images add to each sequence the LM sees."""
  return images * patches(cfg) if cfg.vision else 0
