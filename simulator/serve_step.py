"""The serving steps, built once for any mesh: abstract (trace) or real (compile).

  prefill(params, cache, tokens_BxP)     -> (cache, logits_BxV)
  decode(params, cache, tokens_Bx1, pos) -> (cache, logits_BxV)

Both run the training code's Decoder (models.transformer) with a KV cache
(models.decode): the prefill writes the prompt's k and v at positions
0..P-1, a decode step one token's at `pos` and attends over the whole cache.
An encoder-decoder (models.encoder_decoder) serves as Hugging Face's T5
generates:

  prefill(params, cache, prompt_BxP, start_Bx1) -> (cache, logits_BxV)
  decode(params, cache, tokens_Bx1, pos)        -> (cache, logits_BxV)

the prefill encodes the prompt once, writes each decoder layer's
cross-attention k and v of it into the cache (over the prompt's P
positions) and runs the decoder's first position on the start token; a
decode step runs the decoder alone, its own k and v cached over the
`generate` positions. A vision-language model (models.vision) serves as
LLaVA generates:

  prefill(params, cache, images_BxNxHxWx3, prompt_BxP) -> (cache, logits_BxV)

the vision tower and projector on the images, the LM over [image tokens;
prompt] written into a cache of image tokens + prompt + generate
positions; its decode steps are the LM's alone.
The cache is donated to each step and comes back updated, as a serving loop
runs them. Layouts, from the rules tables: weights in bf16, replicated over X
(data-parallel serving) and TP over Y; the cache's batch over X and kv heads
over Y, replicated over Y where Y does not divide them, as in training
(simulator.step.kv_heads_replicated).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Callable

import jax
import jax.numpy as jnp
from jax.sharding import NamedSharding

from meshes.layout import divisors
from models import decode
from models.config import ModelConfig, at_resolution, image_tokens
from models.params import abstract_params, module_class
from models.rules import FSDP_TP, AxisRules, rules_for
from simulator.model_checks import PlanError, check_flash_length
from simulator.settings import ServeSettings
from simulator.step import (check_divisible, lay_out_params, mesh_rules,
                            pad_vocab)

Tree = Any
PHASES = ("prefill", "decode")


@dataclasses.dataclass(frozen=True)
class ServeStep:
  """One serving step and its abstract arguments (with shardings)."""

  phase: str  # "prefill" or "decode"
  fn: Callable
  params: Tree
  cache: decode.KVCache | decode.Seq2SeqCache
  tokens: jax.ShapeDtypeStruct  # what the decoder reads
  pos: jax.ShapeDtypeStruct | None  # decode only
  rules: AxisRules
  model: Any  # the Decoder, the EncoderDecoder or the VisionLanguage
  vocab_padding: int
  # what the prefill reads besides the tokens: an encoder-decoder's prompt,
  # a vision-language model's images
  context: jax.ShapeDtypeStruct | None = None

  @property
  def args(self) -> tuple:
    return (self.params, self.cache) + self.data

  @property
  def data(self) -> tuple:
    """The arguments after the weights and the cache: the prefill's
    context (prompt or images), the step's tokens and a decode step's
    position."""
    return tuple(x for x in (self.context, self.tokens, self.pos)
                 if x is not None)

  @property
  def donated_outputs(self) -> int:
    """The outputs written into donated argument buffers: the cache's."""
    return len(jax.tree.leaves(self.cache))


def serve_rules(cfg: ModelConfig, mesh,
                base_rules: AxisRules = FSDP_TP) -> AxisRules:
  """Weights replicated over X (`rules_for(False)`), kv heads as training
  lays them out on this mesh."""
  return mesh_rules(cfg, rules_for(False, base_rules), mesh)


def serve_config(cfg: ModelConfig, serve: ServeSettings) -> ModelConfig:
  """`cfg` at the serving images' resolution (models.config.at_resolution);
  image settings for a text model are a one-line ValueError."""
  if not cfg.vision and serve.images_per_sample:
    raise ValueError(f"images_per_sample={serve.images_per_sample}: "
                     f"{cfg.name} has no vision tower; images go with a "
                     "vision-language model (e.g. llava_1_5_7b)")
  return at_resolution(cfg, serve.image_size, serve.patch_size)


def cache_positions(cfg: ModelConfig, serve: ServeSettings) -> int:
  """A decoder's cache positions per sequence: the image tokens (a
  vision-language model's), the prompt and the generated tokens."""
  return image_tokens(cfg, serve.images) + serve.length


def check_serve(cfg: ModelConfig, serve: ServeSettings) -> None:
  """Refuse what this model cannot serve: no attention, no embeddings, or
  more positions than its learned position table has."""
  if not (cfg.attention and cfg.embeddings):
    raise ValueError(f"model {cfg.name!r} has no attention or no token "
                     f"embeddings: there is no KV cache to serve it with")
  if cfg.positions == "learned" and serve.length > cfg.max_len:
    raise ValueError(
        f"prompt + generate = {serve.prompt} + {serve.generate} = "
        f"{serve.length} exceeds {cfg.name}'s {cfg.max_len} learned "
        f"positions; choose prompt + generate <= {cfg.max_len}")
  check_flash_length(cfg, serve.attention, serve.prompt, serve.images,
                     "prompt")


def _sds(shape, dtype, mesh, spec) -> jax.ShapeDtypeStruct:
  return jax.ShapeDtypeStruct(shape, dtype, sharding=NamedSharding(mesh, spec))


def cache_args(cfg: ModelConfig, serve: ServeSettings, rules: AxisRules,
               mesh) -> decode.KVCache | decode.Seq2SeqCache:
  """The KV cache's ShapeDtypeStructs, laid out by the `activations` table:
  a decoder's over prompt + generate positions; an encoder-decoder's
  decoder's own over the generated ones and its cross-attention's over the
  prompt's."""
  def kv(length: int, label: str) -> decode.KVCache:
    layout = decode.cache_layout(cfg.n_layers, serve.batch, length,
                                 cfg.n_kv_heads, cfg.head_dim, serve.kv_dtype)
    fields = {}
    for name, (shape, dtype, axes) in layout.items():
      spec = rules.spec("activations", axes)
      check_divisible(f"{label} {name} {shape}", shape, spec, mesh)
      fields[name] = _sds(shape, dtype, mesh, spec)
    return decode.KVCache(**fields)

  if cfg.encoder_decoder:
    return decode.Seq2SeqCache(kv(serve.generate, "kv cache"),
                               kv(serve.prompt, "cross-attention cache"))
  return kv(cache_positions(cfg, serve), "kv cache")


def build_serve_steps(cfg: ModelConfig, serve: ServeSettings, mesh,
                      base_rules: AxisRules = FSDP_TP
                      ) -> dict[str, ServeStep]:
  """The prefill and decode steps for `mesh` (abstract or real)."""
  cfg = serve_config(cfg, serve)
  check_serve(cfg, serve)
  shape = dict(mesh.shape)
  x, devices = shape.get("X", 1), math.prod(shape.values())
  if serve.batch % x:
    meshes = [f"{d}x{devices // d}" for d in divisors(serve.batch)
              if devices % d == 0]
    raise PlanError(f"batch={serve.batch} must be a positive multiple of "
                    f"{x} (the sequences and their KV cache are split over "
                    f"X={x}); or a mesh whose X divides it: "
                    f"{', '.join(meshes)}")
  rules = serve_rules(cfg, mesh, base_rules)
  cfg, vocab_padding = pad_vocab(cfg, rules, mesh)
  model = module_class(cfg)(cfg, rules=rules, attention=serve.attention,
                            param_dtype=jnp.bfloat16)
  leaves, names = abstract_params(model)
  params = lay_out_params(leaves, names, rules, mesh)
  cache = cache_args(cfg, serve, rules, mesh)
  token_spec = rules.spec("activations", ("batch", "length"))

  def ids(label: str, length: int) -> jax.ShapeDtypeStruct:
    shape = (serve.batch, length)
    check_divisible(f"{label} {shape}", shape, token_spec, mesh)
    return _sds(shape, jnp.int32, mesh, token_spec)

  pos = _sds((), jnp.int32, mesh, jax.sharding.PartitionSpec())
  prompt = ids("prefill tokens", serve.prompt)
  if cfg.encoder_decoder:  # the prompt encoded, the decoder from its start
    context, first = prompt, ids("decoder start tokens", 1)
    call = lambda p, c, x, t, at: model.apply({"params": p}, x, t, cache=c,
                                              pos=at)
  elif cfg.vision:  # the images before the prompt
    shape = (serve.batch, serve.images, cfg.image_size, cfg.image_size, 3)
    spec = rules.spec("activations", ("batch",))
    check_divisible(f"images {shape}", shape, spec, mesh)
    context, first = _sds(shape, jnp.bfloat16, mesh, spec), prompt
    call = lambda p, c, x, t, at: model.apply({"params": p}, t, x, cache=c,
                                              pos=at)
  else:
    context, first = None, prompt
    call = lambda p, c, x, t, at: model.apply({"params": p}, t, cache=c,
                                              pos=at)

  def run(p, c, x, tokens, at):
    logits, c = call(p, c, x, tokens, at)
    return c, logits

  prefill = ((lambda p, c, t: run(p, c, None, t, 0)) if context is None
             else (lambda p, c, x, t: run(p, c, x, t, 0)))
  step = lambda phase, fn, tokens, at, x=None: ServeStep(
      phase, fn, params, cache, tokens, at, rules, model, vocab_padding, x)
  return {"prefill": step("prefill", prefill, first, None, context),
          "decode": step("decode", lambda p, c, t, at: run(p, c, None, t, at),
                         ids("decode tokens", 1), pos)}
