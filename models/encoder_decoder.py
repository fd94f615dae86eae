"""Encoder-decoder LM (T5 v1.0 and v1.1) with each stack's blocks under nn.scan.

As Hugging Face's T5ForConditionalGeneration: one token embedding shared by
both stacks; RMS norms without bias or mean (T5LayerNorm) before each
sub-layer and after each stack; no biases on projections; attention scores
not scaled by 1/sqrt(head_dim) (T5 folds that into its initialisation); a
relative position bias added to the self-attention scores, bidirectional in
the encoder and causal in the decoder, cross-attention without one. The bias
table belongs to each stack's first layer in HF and its bias is reused by
every later layer; here the table sits beside the stack's scan
(`encoder_relative_bias`), the bias is computed once and broadcast to every
layer: the same parameters and the same program. Parameters: `embedding`,
`encoder` and `decoder` (the layers, stacked on the `layers` axis),
`encoder_norm`, `decoder_norm`, the two bias tables, v1.1's `lm_head`. T5 v1.0 has a ReLU
MLP and an LM head tied to the embedding, its input rescaled by
d_model**-0.5; v1.1 a gated-GELU MLP and an untied `lm_head`.

The module returns the training loss, like models.transformer.Decoder, with
each layer stack and the loss under the named scopes of models.scopes. Given
a models.decode.Seq2SeqCache it serves, as Hugging Face's T5 generates: the
prefill encodes the prompt once and runs the decoder's first position,
writing each decoder layer's cross-attention k and v of the encoder's output
into the cache; a decode step runs the decoder alone on one token, reading
them. Either returns the next-token logits and the updated cache.
"""

from __future__ import annotations

import math

import flax.linen as nn
import jax
import jax.numpy as jnp

from models import decode, scopes
from models.config import ModelConfig
from models.layers import Mlp, Norm, activation, weight
from models.offload import on_device
from models.rules import FSDP_TP, AxisRules, reshard
from models.transformer import (GATHERED, Attention, chunked_loss,
                                group_heads, lookup, next_logits, scanned)


def relative_position_bucket(relative_SxT: jax.Array, bidirectional: bool,
                             num_buckets: int, max_distance: int) -> jax.Array:
  """T5's bucket of each key-minus-query offset (HF's
  T5Attention._relative_position_bucket): offsets below half the buckets
  (of each direction's half, bidirectional) get a bucket each, larger ones
  share buckets spaced logarithmically up to max_distance; a causal decoder
  sees only offsets <= 0."""
  buckets = jnp.zeros_like(relative_SxT)
  if bidirectional:
    num_buckets //= 2
    buckets = (relative_SxT > 0).astype(relative_SxT.dtype) * num_buckets
    distance = jnp.abs(relative_SxT)
  else:
    distance = -jnp.minimum(relative_SxT, 0)
  exact = num_buckets // 2
  far = jnp.maximum(distance, exact).astype(jnp.float32)
  large = exact + (jnp.log(far / exact) / math.log(max_distance / exact)
                   * (num_buckets - exact)).astype(relative_SxT.dtype)
  large = jnp.minimum(large, num_buckets - 1)
  return buckets + jnp.where(distance < exact, distance, large)


class Block(nn.Module):
  """One T5 layer: self-attention, (in the decoder) cross-attention over the
  encoder's output, MLP; each pre-normed and added to the residual."""

  cfg: ModelConfig
  rules: AxisRules
  attention: str
  dtype: jnp.dtype
  param_dtype: jnp.dtype
  lora: tuple = (0, ())
  decoder: bool = False
  quant: str = "none"

  @nn.compact
  def __call__(self, x_BxSxD: jax.Array, bias_KxGxSxT: jax.Array,
               encoded_BxTxD: jax.Array | None,
               cache: decode.Seq2SeqCache | None = None,
               pos: jax.Array | int = 0
               ) -> tuple[jax.Array, decode.Seq2SeqCache | None]:
    """Serving (the decoder's layer with its cache slice): self-attention
    through the cache at `pos`; cross-attention's k and v written into it
    where `encoded_BxTxD` is given (the prefill), read from it where not."""
    c = self.cfg
    norm = lambda name: Norm(c.norm, c.norm_eps, self.rules, self.param_dtype,
                             name=name)
    mods = dict(rules=self.rules, dtype=self.dtype,
                param_dtype=self.param_dtype, lora=self.lora, quant=self.quant)
    attn = lambda name, causal, **kw: Attention(
        c, impl=self.attention, causal=causal, scale=1.0, name=name, **kw,
        **mods)
    own, cross = (None, None) if cache is None else (cache.self_attn,
                                                     cache.cross)
    h = norm("attn_norm")(activation(x_BxSxD, GATHERED, self.rules))
    y, own = attn("attn", self.decoder)(h, None, bias_KxGxSxT, own, pos)
    x_BxSxD = x_BxSxD + y
    if self.decoder:
      h = norm("cross_norm")(activation(x_BxSxD, GATHERED, self.rules))
      y, cross = attn("cross_attn", False, cached_context=cache is not None)(
          h, encoded_BxTxD, cache=cross)
      x_BxSxD = x_BxSxD + y
    h = norm("mlp_norm")(activation(x_BxSxD, GATHERED, self.rules))
    return x_BxSxD + Mlp(c.mlp, c.d_model, c.d_ff, c.bias, name="mlp",
                         **mods)(h), (
                             None if cache is None
                             else decode.Seq2SeqCache(own, cross))


class EncoderDecoder(nn.Module):
  """(encoder token ids, decoder token ids, targets) → mean loss over the
  targets. Attributes as models.transformer.Decoder's."""

  cfg: ModelConfig
  rules: AxisRules = FSDP_TP
  remat: str = "none"
  attention: str = "materialized"
  loss_chunks: int = 1
  dtype: jnp.dtype = jnp.bfloat16
  param_dtype: jnp.dtype = jnp.float32
  lora: tuple = (0, ())
  quant: str = "none"

  @nn.compact
  def __call__(self, inputs: jax.Array | None, decoder_inputs: jax.Array,
               targets: jax.Array | None = None,
               cache: decode.Seq2SeqCache | None = None,
               pos: jax.Array | int = 0):
    """Training: the loss. Serving (`cache` given): `inputs` the prompt at
    the prefill, None at a decode step; `decoder_inputs` at positions
    pos.. → (next-token logits [B, V] f32, the updated cache)."""
    c = self.cfg
    table_VxD = on_device(self.param(
        "embedding", nn.with_logical_partitioning(
            nn.initializers.normal(1.0), ("vocab", "embed")),
        (c.vocab_size, c.d_model), self.param_dtype))
    table = table_VxD.astype(self.dtype)
    encoded = None
    if inputs is not None:
      encoded, _ = _stack(self, "encoder", c.encoder_layers,
                          lookup(table, inputs, self.rules))
    y_BxTxD, cache = _stack(self, "decoder", c.n_layers,
                            lookup(table, decoder_inputs, self.rules),
                            encoded, cache, pos)
    if c.tie_embeddings:  # HF rescales before the tied head
      y_BxTxD = y_BxTxD * jnp.asarray(c.d_model ** -0.5, self.dtype)
      w_DxV = reshard(table, self.rules.spec("compute", ("vocab", "embed"))).T
    else:
      w_DxV = weight(self, "lm_head", (c.d_model, c.vocab_size),
                     ("embed", "vocab"), self.rules, self.dtype,
                     self.param_dtype)
    if cache is not None:
      with jax.named_scope(scopes.LOSS):
        return next_logits(y_BxTxD[:, -1], w_DxV, self.rules), cache
    with jax.named_scope(scopes.LOSS):
      return chunked_loss(y_BxTxD, w_DxV, targets, self.loss_chunks,
                          self.rules)


def _stack(model: EncoderDecoder, name: str, n_layers: int, x_BxSxD: jax.Array,
           encoded_BxTxD: jax.Array | None = None,
           cache: decode.Seq2SeqCache | None = None, pos: jax.Array | int = 0
           ) -> tuple[jax.Array, decode.Seq2SeqCache | None]:
  """The encoder (bidirectional) or the decoder (causal, cross-attending to
  the encoder's output; `name` "decoder") of `model`: embedded tokens → (its
  final norm's output, gathered; the updated cache when serving). Its
  layers are the scan `name`, under the named scopes `name`/layers (one
  layer kind per stack in the traced program), a cache scanned with them. A
  function rather than a method, so Flax adds no scope of its own."""
  c, rules = model.cfg, model.rules
  decoder = name == "decoder"
  with jax.named_scope(name):
    keys = x_BxSxD.shape[1] if cache is None else cache.self_attn.k.shape[2]
    bias = _position_bias(model, name, x_BxSxD.shape[1], decoder, keys, pos)
    blocks = scanned(Block, n_layers, model.remat,
                     in_axes=(nn.broadcast, nn.broadcast, 0, nn.broadcast))
    with jax.named_scope(scopes.LAYERS):
      x_BxSxD, cache = blocks(c, rules, model.attention, model.dtype,
                              model.param_dtype, model.lora, decoder,
                              model.quant, name=name)(x_BxSxD, bias,
                                                      encoded_BxTxD, cache,
                                                      pos)
    norm = Norm(c.norm, c.norm_eps, rules, model.param_dtype,
                name=f"{name}_norm")
    return activation(norm(activation(x_BxSxD, GATHERED, rules)), GATHERED,
                      rules), cache


def _position_bias(model: EncoderDecoder, name: str, s: int, decoder: bool,
                   t: int, start: jax.Array | int = 0) -> jax.Array:
  """bias_KxGxSxT in f32 of queries at start..start+S-1 over keys at
  0..T-1 (T = S in training; a decode step's one query over the whole
  cache), from the stack's bucket table (buckets × heads), looked up
  locally like the embedding."""
  c, rules = model.cfg, model.rules
  table_RxN = weight(model, f"{name}_relative_bias",
                     (c.relative_buckets, c.n_heads), (None, "heads"), rules,
                     jnp.float32, model.param_dtype,
                     init=nn.initializers.normal(1.0))
  q_pos = k_pos = jnp.arange(s)
  if not isinstance(start, int) or start:
    q_pos = q_pos + start
  if t != s:
    k_pos = jnp.arange(t)
  bucket_SxT = relative_position_bucket(
      k_pos[None, :] - q_pos[:, None], not decoder,
      c.relative_buckets, c.relative_max_distance)
  bias_SxTxN = lookup(table_RxN, bucket_SxT, rules, (None, None), "heads")
  return group_heads(jnp.transpose(bias_SxTxN, (2, 0, 1)),
                     ("heads", None, None), c.n_kv_heads, rules)
