"""Abstract parameters from jax.eval_shape of the real module: exact, no FLOPs."""

from __future__ import annotations

import functools
import math
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

from models.config import ModelConfig
from models.encoder_decoder import EncoderDecoder
from models.transformer import Decoder
from models.vision import VisionLanguage


def module_class(cfg: ModelConfig) -> type[nn.Module]:
  """The module that runs `cfg`: both take the same attributes and return
  the loss of the batch passed by keyword (`sample_inputs`' keys)."""
  if cfg.vision:
    return VisionLanguage
  return EncoderDecoder if cfg.encoder_decoder else Decoder


def sample_inputs(cfg: ModelConfig, batch: int = 1, seq: int = 1
                  ) -> dict[str, jax.ShapeDtypeStruct]:
  """Unsharded stand-ins for the model's batch: token ids (an encoder-
  decoder's decoder ids too, a vision-language model's one image each), or
  XXL activations."""
  if cfg.vision:
    ids = jax.ShapeDtypeStruct((batch, seq), jnp.int32)
    return {"inputs": ids, "targets": ids, "images": jax.ShapeDtypeStruct(
        (batch, 1, cfg.image_size, cfg.image_size, 3), jnp.bfloat16)}
  if cfg.encoder_decoder:
    ids = jax.ShapeDtypeStruct((batch, seq), jnp.int32)
    return {"inputs": ids, "decoder_inputs": ids, "targets": ids}
  if cfg.embeddings:
    ids = jax.ShapeDtypeStruct((batch, seq), jnp.int32)
    return {"inputs": ids, "targets": ids}
  acts = jax.ShapeDtypeStruct((batch, seq, cfg.d_model), jnp.bfloat16)
  return {"inputs": acts, "targets": acts}


def abstract_params(model: nn.Module) -> tuple[Any, Any]:
  """(ShapeDtypeStruct tree, tree of logical axis-name tuples).

  Params do not depend on remat, attention kernel or loss chunking (LoRA
  adapters and a quantized base do change them), so one eval_shape serves
  every such variant (a sweep builds many). Callers must
  not mutate the returned trees: they are shared.
  """
  return _abstract_params(model.cfg, model.rules, model.dtype,
                          model.param_dtype, model.lora, model.quant,
                          getattr(model, "stages", 1))


@functools.lru_cache(maxsize=16)
def _abstract_params(cfg, rules, dtype, param_dtype, lora=(0, ()),
                     quant="none", stages=1):
  staged = {"stages": stages} if stages > 1 else {}  # models.pipeline
  model = module_class(cfg)(cfg, rules, dtype=dtype, param_dtype=param_dtype,
                            lora=lora, quant=quant, **staged)
  # The key is made inside the abstract trace: made outside, it would be a
  # concrete array, which starts a backend and compiles (the only device
  # work a sweep would do).
  boxed = jax.eval_shape(lambda inputs: model.init(jax.random.key(0),
                                                   **inputs),
                         sample_inputs(model.cfg))["params"]
  names = jax.tree.map(lambda b: b.names, boxed,
                       is_leaf=lambda x: isinstance(x, nn.Partitioned))
  return nn.unbox(boxed), names


def num_params(cfg: ModelConfig) -> int:
  leaves, _ = abstract_params(module_class(cfg)(cfg))
  return sum(math.prod(p.shape) for p in jax.tree.leaves(leaves))
