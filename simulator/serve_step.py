"""The serving steps, built once for any mesh: abstract (trace) or real (compile).

  prefill(params, cache, tokens_BxP)     -> (cache, logits_BxV)
  decode(params, cache, tokens_Bx1, pos) -> (cache, logits_BxV)

Both run the training code's Decoder (models.transformer) with a KV cache
(models.decode): the prefill writes the prompt's k and v at positions
0..P-1, a decode step one token's at `pos` and attends over the whole cache.
The cache is donated to each step and comes back updated, as a serving loop
runs them. Layouts, from the rules tables: weights in bf16, replicated over X
(data-parallel serving) and TP over Y; the cache's batch over X and kv heads
over Y, replicated over Y where Y does not divide them, as in training
(simulator.step.kv_heads_replicated).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable

import jax
import jax.numpy as jnp
from jax.sharding import NamedSharding

from models import decode
from models.config import ModelConfig
from models.params import abstract_params
from models.rules import FSDP_TP, AxisRules, rules_for
from models.transformer import Decoder
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
  cache: decode.KVCache
  tokens: jax.ShapeDtypeStruct
  pos: jax.ShapeDtypeStruct | None  # decode only
  rules: AxisRules
  model: Decoder
  vocab_padding: int

  @property
  def args(self) -> tuple:
    return ((self.params, self.cache, self.tokens) +
            ((self.pos,) if self.pos is not None else ()))

  @property
  def donated_outputs(self) -> int:
    """The outputs written into donated argument buffers: the cache's."""
    return len(jax.tree.leaves(self.cache))


def serve_rules(cfg: ModelConfig, mesh,
                base_rules: AxisRules = FSDP_TP) -> AxisRules:
  """Weights replicated over X (`rules_for(False)`), kv heads as training
  lays them out on this mesh."""
  return mesh_rules(cfg, rules_for(False, base_rules), mesh)


def check_serve(cfg: ModelConfig, serve: ServeSettings) -> None:
  """Refuse what this model cannot serve: no attention, no embeddings, an
  encoder-decoder or a vision tower (the serving steps are a text
  decoder's), or more positions
  than its learned position table has."""
  if cfg.encoder_decoder:
    raise ValueError(f"model {cfg.name!r} is an encoder-decoder; serving "
                     "with a KV cache is built for decoder-only models")
  if cfg.vision:
    raise ValueError(f"model {cfg.name!r} is a vision-language model; "
                     "serving with a KV cache is built for text decoders "
                     "(its language model's config serves)")
  if not (cfg.attention and cfg.embeddings):
    raise ValueError(f"model {cfg.name!r} has no attention or no token "
                     f"embeddings: there is no KV cache to serve it with")
  if cfg.positions == "learned" and serve.length > cfg.max_len:
    raise ValueError(
        f"prompt + generate = {serve.prompt} + {serve.generate} = "
        f"{serve.length} exceeds {cfg.name}'s {cfg.max_len} learned "
        f"positions; choose prompt + generate <= {cfg.max_len}")


def _sds(shape, dtype, mesh, spec) -> jax.ShapeDtypeStruct:
  return jax.ShapeDtypeStruct(shape, dtype, sharding=NamedSharding(mesh, spec))


def cache_args(cfg: ModelConfig, serve: ServeSettings, rules: AxisRules,
               mesh) -> decode.KVCache:
  """The KV cache's ShapeDtypeStructs, laid out by the `activations` table."""
  layout = decode.cache_layout(cfg.n_layers, serve.batch, serve.length,
                               cfg.n_kv_heads, cfg.head_dim, serve.kv_dtype)
  fields = {}
  for name, (shape, dtype, axes) in layout.items():
    spec = rules.spec("activations", axes)
    check_divisible(f"kv cache {name} {shape}", shape, spec, mesh)
    fields[name] = _sds(shape, dtype, mesh, spec)
  return decode.KVCache(**fields)


def build_serve_steps(cfg: ModelConfig, serve: ServeSettings, mesh,
                      base_rules: AxisRules = FSDP_TP
                      ) -> dict[str, ServeStep]:
  """The prefill and decode steps for `mesh` (abstract or real)."""
  check_serve(cfg, serve)
  rules = serve_rules(cfg, mesh, base_rules)
  cfg, vocab_padding = pad_vocab(cfg, rules, mesh)
  model = Decoder(cfg, rules=rules, attention=serve.attention,
                  param_dtype=jnp.bfloat16)
  leaves, names = abstract_params(model)
  params = lay_out_params(leaves, names, rules, mesh)
  cache = cache_args(cfg, serve, rules, mesh)
  token_spec = rules.spec("activations", ("batch", "length"))
  tokens = {}
  for phase, length in (("prefill", serve.prompt), ("decode", 1)):
    shape = (serve.batch, length)
    check_divisible(f"{phase} tokens {shape}", shape, token_spec, mesh)
    tokens[phase] = _sds(shape, jnp.int32, mesh, token_spec)
  pos = _sds((), jnp.int32, mesh, jax.sharding.PartitionSpec())

  def run(p, c, ids, at):
    logits, c = model.apply({"params": p}, ids, cache=c, pos=at)
    return c, logits

  steps = {"prefill": (lambda p, c, ids: run(p, c, ids, 0), None),
           "decode": (run, pos)}
  return {phase: ServeStep(phase, fn, params, cache, tokens[phase], at,
                           rules, model, vocab_padding)
          for phase, (fn, at) in steps.items()}
