"""Remat policies by name: what the backward pass keeps versus recomputes."""

from __future__ import annotations

from typing import Callable

# decoder_layer_input: a layer's input (models.transformer.Block), which
# the layer scan saves for every layer anyway; naming it lets a policy
# offload that stack to host memory (MaxText's `decoder_layer_input:
# offload`).
CHECKPOINT_NAMES = ("qkv", "attn_out", "out_proj", "mlp_in", "mlpwi",
                    "mlp_hidden", "mlpwo", "decoder_layer_input")
POLICIES = ("none", "full", "dots", "names:<list>", "offload:<list>",
            "names:<list>+offload:<list>")

# MaxText's remat_policy names (layers/decoders.py get_remat_policy) in these
# terms. `minimal` is what MaxText's published runs used:
# checkpoint_dots_with_no_batch_dims until Aug 2025 (the weight matmuls'
# outputs, not the attention einsums), i.e. `dots`; its `query_proj`,
# `key_proj`, `value_proj` are saved here after the rotary embedding (`qkv`),
# its `context` is `attn_out`.
MAXTEXT_POLICIES = {
    "full": "full",
    "minimal": "dots",
    "minimal_with_context": "names:qkv,attn_out,out_proj,mlpwi,mlpwo",
    "save_dot_with_context_except_mlp": "names:qkv,attn_out,out_proj",
    "save_dot_except_mlpwi": "names:qkv,out_proj,mlpwo",
    "save_dot_except_mlp": "names:qkv,out_proj",
    "save_qkv_proj": "names:qkv",
    "save_out_proj": "names:out_proj",
    "qkv_proj_offloaded": "offload:qkv",
    "minimal_offloaded": "offload:qkv,out_proj,mlpwi,mlpwo",
}


def _names(spec: str) -> list[str]:
  names = [n for n in spec.split(":", 1)[1].split(",") if n]
  if len(set(names)) < len(names):
    raise ValueError(f"remat {spec!r}: a name given twice")
  bad = [n for n in names if n not in CHECKPOINT_NAMES]
  if not names or bad:
    raise ValueError(f"remat {spec!r}: {bad[0] if bad else 'empty list'!r} is "
                     f"not a checkpoint name; valid: {', '.join(CHECKPOINT_NAMES)}")
  return names


def split(spec: str) -> tuple[list[str] | None, list[str] | None]:
  """(saved names, offloaded names) of a names:/offload: spec, None where
  the spec has no such part; (None, None) for any other spec."""
  saved = offloaded = None
  parts = spec.split("+")
  if len(parts) == 2 and not (parts[0].startswith("names:")
                              and parts[1].startswith("offload:")):
    raise ValueError(f"remat {spec!r}: a combined policy is "
                     "names:<list>+offload:<list>")
  if len(parts) > 2:
    raise ValueError(f"remat {spec!r}: at most one names: and one offload: "
                     "part")
  for part in parts:
    if part.startswith("names:"):
      saved = _names(part)
    elif part.startswith("offload:"):
      offloaded = _names(part)
  both = set(saved or ()) & set(offloaded or ())
  if both:
    raise ValueError(f"remat {spec!r}: {sorted(both)[0]!r} is both saved "
                     "and offloaded")
  return saved, offloaded


def canonical(spec: str) -> str:
  """A MaxText policy name in this module's terms; any other spec as is."""
  return MAXTEXT_POLICIES.get(spec, spec)


def check(spec: str) -> str:
  """The spec in this module's terms (`canonical`), or a ValueError naming
  what is wrong with it; needs no jax (a cached sweep validates its flags
  without importing it)."""
  spec = canonical(spec)
  if spec not in ("none", "full", "dots") and split(spec) == (None, None):
    raise ValueError(f"unknown remat {spec!r}; valid: {', '.join(POLICIES)} "
                     f"or MaxText's {', '.join(MAXTEXT_POLICIES)}")
  return spec


def policy(spec: str) -> Callable | None:
  """none: save everything (no remat); full: save only block inputs;
  dots: save matmul outputs; names:a,b save those; offload:a,b put those in
  pinned host memory and recompute the rest; names:a+offload:b both (what
  MaxText's `custom` policy builds); MaxText's names as mapped in
  MAXTEXT_POLICIES."""
  spec = check(spec)
  import jax  # pylint: disable=g-import-not-at-top  (`check` needs none)
  cp = jax.checkpoint_policies
  if spec == "none":
    return None
  if spec == "full":
    return cp.nothing_saveable
  if spec == "dots":
    return cp.dots_with_no_batch_dims_saveable
  saved, offloaded = split(spec)
  if offloaded is None:
    return cp.save_only_these_names(*saved)
  return cp.save_and_offload_only_these_names(
      names_which_can_be_saved=saved or [],
      names_which_can_be_offloaded=offloaded,
      offload_src="device", offload_dst="pinned_host")
