"""Vision-language LM (LLaVA-1.5 style): a ViT over image patches, a projector,
the decoder over [image tokens; text tokens].

As Hugging Face's LlavaForConditionalGeneration with a CLIPVisionModel
tower: the patch embedding is CLIP's stride-p convolution without bias,
written as a Dense over each flattened p×p×3 patch (the same weights and
FLOPs); a learned class embedding is put before the patches and a learned
position embedding added to all P+1; a LayerNorm before the blocks
(`pre_norm`), pre-norm non-causal blocks with biased projections and a GELU
MLP (CLIP's quick_gelu is a sigmoid GELU: the same shapes), scanned under the
named scopes `vision/layers`. LLaVA-1.5 reads the patch features (the class
token dropped) into a 2-layer GELU projector (`mm_projector_type:
mlp2x_gelu`) to the LM's width. CLIP's `post_layernorm` is held as a
parameter, as the checkpoint and an optimizer training the tower hold it,
though LLaVA never reads it; LLaVA reads the penultimate layer's output
(`mm_vision_select_layer: -2`), here the last layer's: the tower runs one
layer more than LLaVA needs (the same parameters, 1/L more tower work).
Serving (a KV cache given): the prefill runs the tower and the projector
on the images and the LM over [image tokens; prompt], writing the cache
from position 0; a decode step runs the LM alone (the images are in the
cache).
The tower's attention is materialized whatever the LM's kernel: its P+1
positions (577 at 336 px) are no multiple of a flash block, and HF's CLIP
attention is the plain softmax(QK^T)V.

Every tower and projector weight has the LM's logical axis names (embed,
heads, kv, mlp), so FSDP over X and TP over Y lay them out as the LM's. The
LM is models.transformer.Decoder (`language_model`), given the projected
image tokens as its prefix; the loss is over the text positions only.
"""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp

from models import decode, scopes
from models.config import ModelConfig, image_tokens
from models.layers import Dense, Mlp, Norm, activation, weight
from models.rules import FSDP_TP, AxisRules, data_parallel_rules
from models.transformer import (GATHERED, RESIDUAL, Attention, Decoder,
                                _reshape, scanned)


def tokens_line(cfg: ModelConfig, seq: int, images: int, trained: bool,
                sharding: str = "sharded") -> str:
  """What a report header says of a vision-language step's sequence."""
  n = image_tokens(cfg, images)
  return (f"; LM sequence {n + seq} = {images} image(s) x "
          f"({cfg.image_size}/{cfg.patch_size})^2 = {n} image tokens + "
          f"{seq} text, vision tower {'trained' if trained else 'frozen'}"
          f"{', replicated' if sharding == 'replicated' else ''}")


def replicated_tower(names):
  """The tree of the parameters' logical axis names with the vision tower's
  named by no axis: stored, trained and updated whole on every device (the
  layout `--vision_sharding=replicated` gives it)."""
  return {k: (jax.tree.map(lambda n: (None,) * len(n), v,
                           is_leaf=lambda x: isinstance(x, tuple))
              if k == "vision_tower" else v) for k, v in names.items()}


def tower_config(cfg: ModelConfig) -> ModelConfig:
  """The ViT's layer shapes as a ModelConfig for the shared Attention and
  Mlp: LayerNorm, biases, GELU, no rotary positions (learned ones are
  added to the patches before the blocks)."""
  return ModelConfig(
      f"{cfg.name}/vision", d_model=cfg.vision_d_model,
      n_layers=cfg.vision_layers, d_ff=cfg.vision_d_ff,
      n_heads=cfg.vision_heads, n_kv_heads=cfg.vision_heads,
      head_dim=cfg.vision_d_model // cfg.vision_heads, norm="layer",
      positions="none", mlp="gelu", bias=True, embeddings=False)


class VisionBlock(nn.Module):
  """One ViT layer: non-causal self-attention and MLP, each pre-normed and
  added to the residual."""

  cfg: ModelConfig  # tower_config's
  rules: AxisRules
  attention: str
  dtype: jnp.dtype
  param_dtype: jnp.dtype

  @nn.compact
  def __call__(self, x_BxSxD: jax.Array) -> tuple[jax.Array, None]:
    c = self.cfg
    norm = lambda name: Norm(c.norm, c.norm_eps, self.rules, self.param_dtype,
                             name=name)
    mods = dict(rules=self.rules, dtype=self.dtype,
                param_dtype=self.param_dtype)
    h = norm("attn_norm")(activation(x_BxSxD, GATHERED, self.rules))
    x_BxSxD = x_BxSxD + Attention(c, impl=self.attention, causal=False,
                                  name="attn", **mods)(h)[0]
    h = norm("mlp_norm")(activation(x_BxSxD, GATHERED, self.rules))
    return x_BxSxD + Mlp(c.mlp, c.d_model, c.d_ff, c.bias, name="mlp",
                         **mods)(h), None


class VisionTower(nn.Module):
  """Images [B, N, H, W, C] → patch features [B, N·P, vision_d_model] (class
  tokens dropped), each sample's images one after another."""

  cfg: ModelConfig  # the vision-language model's
  rules: AxisRules
  remat: str
  dtype: jnp.dtype
  param_dtype: jnp.dtype

  @nn.compact
  def __call__(self, images_BxNxHxWxC: jax.Array) -> jax.Array:
    c, t, rules = self.cfg, tower_config(self.cfg), self.rules
    b, n, *_, ch = images_BxNxHxWxC.shape
    side, p = c.image_size // c.patch_size, c.patch_size
    args = (rules, self.dtype, self.param_dtype)
    x = _reshape(images_BxNxHxWxC.astype(self.dtype),
                 (b * n, side, p, side, p, ch), rules,
                 ("batch", None, None, None, None, None))
    x = jnp.swapaxes(x, 2, 3)  # (image, row, column, p, p, channel)
    x = _reshape(x, (b * n, side * side, p * p * ch), rules,
                 ("batch", "length", None))
    x = Dense((p * p * ch, t.d_model), (None, "embed"), "bsc,cd->bsd",
              RESIDUAL, rules=rules, dtype=self.dtype,
              param_dtype=self.param_dtype, name="patch_embedding")(x)
    cls = weight(self, "class_embedding", (t.d_model,), ("embed",), *args,
                 init=nn.initializers.normal(1.0))
    x = jnp.concatenate([activation(jnp.broadcast_to(
        cls, (b * n, 1, t.d_model)), RESIDUAL, rules), x], axis=1)
    pos = weight(self, "position_embedding", (side * side + 1, t.d_model),
                 (None, "embed"), *args, init=nn.initializers.normal(1.0))
    x = x + activation(pos[None], (None, None, "embed"), rules)
    x = Norm(t.norm, t.norm_eps, rules, self.param_dtype, name="pre_norm")(
        activation(x, GATHERED, rules))
    blocks = scanned(VisionBlock, t.n_layers, self.remat)
    with jax.named_scope(scopes.LAYERS):
      x, _ = blocks(t, rules, "materialized", self.dtype, self.param_dtype,
                    name="layers")(activation(x, RESIDUAL, rules))
    for name in ("scale", "bias"):  # CLIP's post_layernorm, unread
      weight(self, f"post_norm_{name}", (t.d_model,), ("embed",), *args,
             init=nn.initializers.zeros)
    x = x[:, 1:]  # LLaVA's "default" feature: the patches, no class token
    return _reshape(x, (b, n * side * side, t.d_model), rules, RESIDUAL)


class VisionLanguage(nn.Module):
  """(text ids, images [B, N, H, W, 3], targets) → mean loss over the text.
  Attributes as models.transformer.Decoder's. Parameters: `vision_tower`,
  `projector_in`, `projector_out`, `language_model` (a Decoder's)."""

  cfg: ModelConfig
  rules: AxisRules = FSDP_TP
  remat: str = "none"
  attention: str = "materialized"
  loss_chunks: int = 1
  dtype: jnp.dtype = jnp.bfloat16
  param_dtype: jnp.dtype = jnp.float32
  lora: tuple = (0, ())
  quant: str = "none"
  tower_replicated: bool = False  # the tower whole on every device

  @nn.compact
  def __call__(self, inputs: jax.Array, images: jax.Array | None,
               targets: jax.Array | None = None,
               cache: decode.KVCache | None = None,
               pos: jax.Array | int = 0):
    """Training: the loss. Serving (`cache` given): `images` at the
    prefill, None at a decode step → (next-token logits [B, V] f32, the
    updated cache), as models.transformer.Decoder serves."""
    tokens = None
    if images is not None:
      tower_rules = (data_parallel_rules(self.rules) if self.tower_replicated
                     else self.rules)
      with jax.named_scope("vision"):
        features = VisionTower(self.cfg, tower_rules, self.remat, self.dtype,
                               self.param_dtype,
                               name="vision_tower")(images)
        tokens = self._project(features)
    return Decoder(self.cfg, self.rules, self.remat, self.attention,
                   self.loss_chunks, dtype=self.dtype,
                   param_dtype=self.param_dtype, lora=self.lora,
                   quant=self.quant, name="language_model")(
                       inputs, targets, cache=cache, pos=pos,
                       prefix_BxPxD=tokens)

  def _project(self, x_BxPxE: jax.Array) -> jax.Array:
    """Patch features → LM-width image tokens: Linear, GELU, Linear."""
    c = self.cfg
    mods = dict(rules=self.rules, dtype=self.dtype,
                param_dtype=self.param_dtype, bias=True)
    with jax.named_scope("projector"):
      h = Dense((c.vision_d_model, c.d_model), ("embed", "mlp"),
                "bse,ed->bsd", ("batch", "length", "mlp"),
                name="projector_in", **mods)(
                    activation(x_BxPxE, GATHERED, self.rules))
      return Dense((c.d_model, c.d_model), ("mlp", "embed"), "bsf,fd->bsd",
                   RESIDUAL, name="projector_out", **mods)(jax.nn.gelu(h))
