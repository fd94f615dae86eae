"""Decoder-only LM (and the attention-free XXL stack) with blocks under nn.scan.

The module returns the training loss, so the loss buffer (and its chunking) is
part of the traced program like everything else. The layer stack and the loss
run under the named scopes of models.scopes, which is how the simulator finds
them in the traced program.
"""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp
from jax.ad_checkpoint import checkpoint_name

from models import attention, decode, pipeline, scopes
from models.config import ModelConfig
from models.layers import Dense, Mlp, Norm, activation, weight
from models.offload import on_device
from models.moe import MoeMlp
from models.remat import policy
from models.rules import FSDP_TP, AxisRules, reshard

RESIDUAL = ("batch", "length", "embed")  # the stream between blocks
GATHERED = ("batch", "length", None)  # the same, gathered for a matmul


def _rope(x_BxSxNxH: jax.Array, theta: float, start=0) -> jax.Array:
  """Rotary embedding of tokens at positions start..start+S-1."""
  s, h = x_BxSxNxH.shape[1], x_BxSxNxH.shape[-1]
  freq = theta ** (-jnp.arange(0, h, 2, dtype=jnp.float32) / h)
  pos_S = jnp.arange(s, dtype=jnp.float32)
  if not isinstance(start, int) or start:
    pos_S = pos_S + start
  angle_SxH2 = pos_S[:, None] * freq[None, :]
  sin = jnp.sin(angle_SxH2)[None, :, None, :]
  cos = jnp.cos(angle_SxH2)[None, :, None, :]
  x1, x2 = jnp.split(x_BxSxNxH.astype(jnp.float32), 2, axis=-1)
  out = jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)
  return out.astype(x_BxSxNxH.dtype)


def _reshape(x: jax.Array, shape, rules: AxisRules, names) -> jax.Array:
  """x.reshape(shape), laid out by logical names under a mesh."""
  if jax.sharding.get_abstract_mesh().empty:
    return x.reshape(shape)
  return jnp.reshape(x, shape, out_sharding=rules.spec("activations", names))


def group_heads(x: jax.Array, names, n_kv_heads: int,
                rules: AxisRules) -> jax.Array:
  """x's `heads` dim (x's logical names: `names`) split as (kv head, group):
  q_BxSxNxH → q_BxSxKxGxH, a position bias N×S×T → K×G×S×T. The mesh axis
  that shards the heads lands on the kv-head dim when it shards the kv heads
  too, else on the group dim (kv heads replicated:
  simulator.step.kv_heads_replicated)."""
  i = list(names).index("heads")
  kv = dict(rules.activations).get("kv_heads")
  shape = (*x.shape[:i], n_kv_heads, x.shape[i] // n_kv_heads,
           *x.shape[i + 1:])
  grouped = (*names[:i], "kv_heads", None if kv else "heads", *names[i + 1:])
  return _reshape(x, shape, rules, grouped)


class Attention(nn.Module):
  """Self-attention over x, or with `context_BxTxD` cross-attention (keys
  and values from the context); `bias_KxGxSxT` is added to the scores and
  `scale` multiplies them (models.attention). With a KV cache (serving) it
  also writes the step's k and v at `pos` and returns the updated cache: a
  prefill (S > 1 tokens, from position 0) attends over its own k and v, a
  decode step over the whole cache (models.decode). `cached_context`: a
  cross-attention whose cache holds the context's k and v, written whole
  where the context is given (an encoder-decoder's prefill) and read
  instead of projected where it is not (its decode steps). Returns
  (output, cache or None)."""

  cfg: ModelConfig
  rules: AxisRules
  impl: str
  dtype: jnp.dtype
  param_dtype: jnp.dtype
  lora: tuple = (0, ())  # (rank, the projections that get an adapter)
  quant: str = "none"  # the projections stored quantized (models.quant)
  causal: bool = True
  scale: float | None = None  # None: 1/sqrt(head_dim)
  cached_context: bool = False

  @nn.compact
  def __call__(self, x_BxSxD: jax.Array, context_BxTxD: jax.Array | None = None,
               bias_KxGxSxT: jax.Array | None = None,
               cache: decode.KVCache | None = None, pos: jax.Array | int = 0
               ) -> tuple[jax.Array, decode.KVCache | None]:
    c = self.cfg
    kv_in = x_BxSxD if context_BxTxD is None else context_BxTxD
    common = dict(rules=self.rules, dtype=self.dtype,
                  param_dtype=self.param_dtype, bias_dims=2, quant=self.quant)
    rank = lambda name: self.lora[0] if name in self.lora[1] else 0
    proj = lambda name, heads, axis: Dense(
        (c.d_model, heads, c.head_dim), ("embed", axis, "kv"), "bsd,dnh->bsnh",
        ("batch", "length", axis, "kv"), bias=c.bias or c.qkv_bias, name=name,
        lora_rank=rank(name), **common)
    q = proj("q", c.n_heads, "heads")(x_BxSxD)

    def output(o_BxSxKxGxH):  # the heads back to the residual stream
      o_BxSxNxH = checkpoint_name(_reshape(
          o_BxSxKxGxH, q.shape, self.rules,
          ("batch", "length", "heads", "kv")), "attn_out")
      return checkpoint_name(Dense(
          (c.n_heads, c.head_dim, c.d_model), ("heads", "kv", "embed"),
          "bsnh,nhd->bsd", RESIDUAL, bias=c.bias, name="o",
          lora_rank=rank("o"), **{**common, "bias_dims": 1})(o_BxSxNxH),
                             "out_proj")

    if self.cached_context and context_BxTxD is None:
      q_BxSxKxGxH = group_heads(q, ("batch", "length", "heads", "kv"),
                                c.n_kv_heads, self.rules)
      o = attention.materialized(q_BxSxKxGxH, *decode.read(cache, q.dtype),
                                 bias_KxGxSxT, self.causal, self.scale)
      return output(o), cache
    k = proj("k", c.n_kv_heads, "kv_heads")(kv_in)
    v = proj("v", c.n_kv_heads, "kv_heads")(kv_in)
    if c.positions == "rope":
      q, k = _rope(q, c.rope_theta, pos), _rope(k, c.rope_theta, pos)
    q, k, v = (checkpoint_name(t, "qkv") for t in (q, k, v))
    q_BxSxKxGxH = group_heads(q, ("batch", "length", "heads", "kv"),
                              c.n_kv_heads, self.rules)
    if cache is not None:
      cache = decode.write(cache, k, v, pos)
    if cache is None or x_BxSxD.shape[1] > 1:
      o = attention.attend(self.impl, q_BxSxKxGxH, k, v, bias_KxGxSxT,
                           self.causal, self.scale)
    else:
      o = attention.materialized(q_BxSxKxGxH, *decode.read(cache, k.dtype),
                                 bias_KxGxSxT, self.causal, self.scale,
                                 start=pos)
    return output(o), cache


class Block(nn.Module):
  """One layer; returns the residual stream and, for a mixture of experts,
  its load-balancing loss (None otherwise)."""

  cfg: ModelConfig
  rules: AxisRules
  attention: str
  dtype: jnp.dtype
  param_dtype: jnp.dtype
  lora: tuple = (0, ())
  quant: str = "none"
  capacity_factor: float = 1.0

  @nn.compact
  def __call__(self, x_BxSxD: jax.Array, cache: decode.KVCache | None = None,
               pos: jax.Array | int = 0) -> tuple[jax.Array, tuple]:
    """One layer: (x, (the MoE load-balancing loss or None, this layer's
    updated KV cache slice when serving or None))."""
    c = self.cfg
    x_BxSxD = checkpoint_name(x_BxSxD, "decoder_layer_input")
    norm = lambda name: Norm(c.norm, c.norm_eps, self.rules, self.param_dtype,
                             name=name)
    mods = dict(rules=self.rules, dtype=self.dtype,
                param_dtype=self.param_dtype, lora=self.lora, quant=self.quant)
    if c.moe:
      mlp = MoeMlp(c, self.rules, self.dtype, self.param_dtype,
                   self.capacity_factor, name="moe")
    else:
      dense = Mlp(c.mlp, c.d_model, c.d_ff, c.bias, name="mlp", **mods)
      mlp = lambda h: (dense(h), None)
    if c.parallel_block:
      h = norm("pre_norm")(activation(x_BxSxD, GATHERED, self.rules))
      attn, cache = Attention(c, impl=self.attention, name="attn",
                              **mods)(h, cache=cache, pos=pos)
      y, aux = mlp(h)
      return x_BxSxD + (attn + y), (aux, cache)  # one TP reduction for both
    if c.attention:
      h = norm("attn_norm")(activation(x_BxSxD, GATHERED, self.rules))
      attn, cache = Attention(c, impl=self.attention, name="attn",
                              **mods)(h, cache=cache, pos=pos)
      x_BxSxD = x_BxSxD + attn
    h = norm("mlp_norm")(activation(x_BxSxD, GATHERED, self.rules))
    y, aux = mlp(h)
    return x_BxSxD + y, (aux, cache)


class Decoder(nn.Module):
  """Token ids (or, without embeddings, input activations) → mean loss; or,
  serving (a KV cache given, models.decode; a model with embeddings and
  attention: simulator.serve_step.check_serve), token ids at positions
  pos.. → (next-token logits [B, V] f32, the updated cache).

  remat: a policy name from models.remat. loss_chunks > 1 computes logits and
  loss one sequence chunk at a time, rematerialized, so only one chunk of
  logits is live.
  """

  cfg: ModelConfig
  rules: AxisRules = FSDP_TP
  remat: str = "none"
  attention: str = "materialized"
  loss_chunks: int = 1
  capacity_factor: float = 1.0  # mixture of experts: models.moe.capacity
  dtype: jnp.dtype = jnp.bfloat16
  param_dtype: jnp.dtype = jnp.float32
  lora: tuple = (0, ())  # (rank, projections): LoRA adapters (layers.Dense)
  quant: str = "none"  # the layers' projections stored quantized (QLoRA)
  stages: int = 1  # pipeline stages (models.pipeline): layers as [K, L/K]
  microbatches: int = 1  # micro-batches through the stages

  @nn.compact
  def __call__(self, inputs: jax.Array, targets: jax.Array | None = None,
               cache: decode.KVCache | None = None, pos: jax.Array | int = 0,
               prefix_BxPxD: jax.Array | None = None):
    """prefix_BxPxD: embedded tokens put before the text's (a vision-
    language model's image tokens, models.vision); the loss reads the text
    positions only."""
    c = self.cfg
    args = (self.rules, self.dtype, self.param_dtype)
    if c.embeddings:
      table_VxD = on_device(self.param(
          "embedding", nn.with_logical_partitioning(
              nn.initializers.normal(1.0), ("vocab", "embed")),
          (c.vocab_size, c.d_model), self.param_dtype))
      x = self._embed(table_VxD.astype(self.dtype), inputs, pos)
    else:
      x = activation(inputs.astype(self.dtype), RESIDUAL, self.rules)
    if prefix_BxPxD is not None:
      x = jnp.concatenate([prefix_BxPxD.astype(self.dtype), x], axis=1)
    block_args = (c, self.rules, self.attention, self.dtype,
                  self.param_dtype, self.lora, self.quant, self.capacity_factor)
    if self.stages > 1:
      with jax.named_scope(scopes.LAYERS):
        x = self._pipeline(x, block_args)
      aux_L = None
    else:
      blocks = scanned(Block, c.n_layers, self.remat,
                       in_axes=(0, nn.broadcast))
      with jax.named_scope(scopes.LAYERS):
        x, (aux_L, cache) = blocks(*block_args, name="blocks")(x, cache, pos)
    if prefix_BxPxD is not None:
      x = x[:, prefix_BxPxD.shape[1]:]
    if c.final_norm:
      x = Norm(c.norm, c.norm_eps, self.rules, self.param_dtype,
               name="final_norm")(activation(x, GATHERED, self.rules))
    if not c.embeddings:
      # No output layer (seed 004): a stand-in loss that reads every output.
      with jax.named_scope(scopes.LOSS):
        loss = jnp.mean(jnp.square(x.astype(jnp.float32)) * targets)
    else:
      x = activation(x, GATHERED, self.rules)
      if c.tie_embeddings:
        w_DxV = reshard(table_VxD.astype(self.dtype),
                        self.rules.spec("compute", ("vocab", "embed"))).T
      else:
        w_DxV = weight(self, "output", (c.d_model, c.vocab_size),
                       ("embed", "vocab"), *args)
      if cache is not None:
        with jax.named_scope(scopes.LOSS):
          return next_logits(x[:, -1], w_DxV, self.rules), cache
      with jax.named_scope(scopes.LOSS):
        loss = chunked_loss(x, w_DxV, targets, self.loss_chunks, self.rules)
    if c.moe:  # the layers' load-balancing losses, averaged (Switch)
      loss = loss + c.router_aux_loss_coef * jnp.mean(aux_L)
    return loss

  def _pipeline(self, x_BxSxD: jax.Array, block_args: tuple) -> jax.Array:
    """The layers as `stages` stages of L/K scanned blocks, params stacked
    [K, L/K, ...] on the logical axes (`stage`, `layers`), run over
    `microbatches` micro-batches by a scan over models.pipeline's
    iterations (params broadcast to every iteration)."""
    k, m = self.stages, self.microbatches
    spec = (None if jax.sharding.get_abstract_mesh().empty
            else self.rules.spec("activations", RESIDUAL))
    x_MxBxSxD = pipeline.split(x_BxSxD, m, spec)
    loop = nn.scan(_Iteration, variable_broadcast="params",
                   split_rngs={"params": False}, in_axes=0, out_axes=0,
                   length=pipeline.iterations(k, m))
    _, done = loop(k, self.remat, block_args, name="blocks")(
        pipeline.empty(x_MxBxSxD[0], k, spec),
        pipeline.injected(x_MxBxSxD, k))
    return pipeline.merge(done[k - 1:], spec)  # the fill's zeros dropped

  def _embed(self, table_VxD: jax.Array, ids_BxS: jax.Array,
             start: jax.Array | int = 0) -> jax.Array:
    c = self.cfg
    x = lookup(table_VxD, ids_BxS, self.rules)
    if c.embed_scale:
      x = x * jnp.sqrt(c.d_model).astype(self.dtype)
    if c.positions == "learned":
      pos = weight(self, "positions", (c.max_len, c.d_model), (None, "embed"),
                   self.rules, self.dtype, self.param_dtype,
                   init=nn.initializers.normal(1.0))
      pos_SxD = (pos[:ids_BxS.shape[1]] if isinstance(start, int) else
                 jax.lax.dynamic_slice_in_dim(pos, start, ids_BxS.shape[1]))
      x = x + activation(pos_SxD[None], (None, None, "embed"), self.rules)
    return x


class _Iteration(nn.Module):
  """One pipeline iteration (models.pipeline): every stage's previous output
  to the next stage, stage 0 taking `inject`; every stage's L/K scanned
  blocks on what it holds (a vmap over stages, the stage dim on P); the
  last stage's output to every stage. (outputs [K, B, S, D], finished)."""

  stages: int
  remat: str
  block_args: tuple

  @nn.compact
  def __call__(self, y_KxBxSxD: jax.Array, inject_BxSxD: jax.Array):
    blocks = scanned(Block, self.block_args[0].n_layers // self.stages,
                     self.remat, in_axes=(0, nn.broadcast))
    staged = nn.vmap(
        blocks, variable_axes={"params": 0}, split_rngs={"params": True},
        in_axes=(0, None, None), out_axes=0,
        spmd_axis_name=(None if jax.sharding.get_abstract_mesh().empty
                        else pipeline.STAGE_AXIS),
        metadata_params={nn.PARTITION_NAME: "stage"})(*self.block_args,
                                                       name="stages")
    y, _ = staged(pipeline.pass_on(y_KxBxSxD, inject_BxSxD), None, 0)
    return y, pipeline.finished(y)


def scanned(block: type[nn.Module], n_layers: int, remat: str,
            in_axes=nn.broadcast):
  """`block` under nn.scan over `n_layers` layers (params stacked on the
  `layers` logical axis), rematerialized by the named policy; `in_axes` says
  which arguments after the carried residual stream are sliced per layer (0:
  a KV cache stacked over layers) and which are the same for every layer
  (nn.broadcast). Flax's loop-invariance check is off: it traces the body
  a second time to find broadcast outputs, which this scan has none of,
  and without a remat boundary that trace's constant computations stayed
  in the step as dead equations (remat none: the rope table and the
  blockwise attention's zero accumulators, timed as HBM traffic)."""
  if remat != "none":
    block = nn.remat(block, policy=policy(remat), prevent_cse=False)
  return nn.scan(block, variable_axes={"params": 0},
                 split_rngs={"params": True}, in_axes=in_axes,
                 length=n_layers, metadata_params={nn.PARTITION_NAME: "layers"},
                 check_constancy_invariants=False)


def lookup(table_VxD: jax.Array, ids: jax.Array, rules: AxisRules,
           ids_names=("batch", "length"), width: str = "embed") -> jax.Array:
  """Rows of a table (V rows of width D, the embedding) at integer ids, local
  to each device once the table is laid out by its width.

  The table is resharded to replicate the row dim and shard D like the
  output's last dim (`width`: the residual stream's embed); the lookup then
  needs no collective (shard_map makes that explicit, since Explicit-mode
  gather would replicate everything).
  """
  if jax.sharding.get_abstract_mesh().empty:
    return jnp.take(table_VxD, ids, axis=0)
  table_spec = rules.spec("activations", (None, width))
  ids_spec = rules.spec("activations", ids_names)
  out_spec = rules.spec("activations", (*ids_names, width))
  table_VxD = jax.sharding.reshard(table_VxD, table_spec)
  return jax.shard_map(lambda t, i: jnp.take(t, i, axis=0),
                       in_specs=(table_spec, ids_spec), out_specs=out_spec)(
                           table_VxD, ids)


def next_logits(x_BxD, w_DxV, rules) -> jax.Array:
  """The last position's logits [B, V] in f32: what a sampler reads."""
  spec = None
  if not jax.sharding.get_abstract_mesh().empty:
    spec = rules.spec("activations", ("batch", "vocab"))
  return jnp.einsum("bd,dv->bv", x_BxD, w_DxV, out_sharding=spec,
                    preferred_element_type=jnp.float32)


def _loss(x_BxSxD, w_DxV, targets_BxS, rules):
  spec = None
  if not jax.sharding.get_abstract_mesh().empty:
    spec = rules.spec("activations", ("batch", "length", "vocab"))
  logits = jnp.einsum("bsd,dv->bsv", x_BxSxD, w_DxV, out_sharding=spec,
                      preferred_element_type=jnp.float32)
  logits = checkpoint_name(logits, "logits")
  lse_BxS = jax.nn.logsumexp(logits, axis=-1)
  vocab = jax.lax.broadcasted_iota(jnp.int32, logits.shape, 2,
                                   out_sharding=spec)
  target_BxS = jnp.sum(jnp.where(vocab == targets_BxS[..., None], logits, 0.0),
                       axis=-1)
  return jnp.sum(lse_BxS - target_BxS)


def chunked_loss(x_BxSxD, w_DxV, targets_BxS, chunks: int, rules):
  b, s, d = x_BxSxD.shape
  if chunks == 1:
    return _loss(x_BxSxD, w_DxV, targets_BxS, rules) / float(b * s)
  if chunks <= 0 or s % chunks:
    raise ValueError(f"loss_chunks={chunks} must be a positive divisor of the "
                     f"sequence length {s}")
  step = jax.checkpoint(lambda x, t: _loss(x, w_DxV, t, rules))
  xs = jnp.moveaxis(x_BxSxD.reshape(b, chunks, s // chunks, d), 1, 0)
  ts = jnp.moveaxis(targets_BxS.reshape(b, chunks, s // chunks), 1, 0)
  total, _ = jax.lax.scan(lambda acc, xt: (acc + step(*xt), None),
                          jnp.zeros((), jnp.float32), (xs, ts))
  return total / float(b * s)
