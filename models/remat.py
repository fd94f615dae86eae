"""Remat policies by name: what the backward pass keeps versus recomputes."""

from __future__ import annotations

from typing import Callable

import jax

CHECKPOINT_NAMES = ("qkv", "attn_out", "out_proj", "mlp_in", "mlpwi",
                    "mlp_hidden", "mlpwo")
POLICIES = ("none", "full", "dots", "names:<list>", "offload:<list>")

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
  bad = [n for n in names if n not in CHECKPOINT_NAMES]
  if not names or bad:
    raise ValueError(f"remat {spec!r}: {bad[0] if bad else 'empty list'!r} is "
                     f"not a checkpoint name; valid: {', '.join(CHECKPOINT_NAMES)}")
  return names


def canonical(spec: str) -> str:
  """A MaxText policy name in this module's terms; any other spec as is."""
  return MAXTEXT_POLICIES.get(spec, spec)


def policy(spec: str) -> Callable | None:
  """none: save everything (no remat); full: save only block inputs;
  dots: save matmul outputs; names:a,b save those; offload:a,b put those in
  pinned host memory and recompute the rest; MaxText's names as mapped in
  MAXTEXT_POLICIES."""
  cp = jax.checkpoint_policies
  spec = canonical(spec)
  if spec == "none":
    return None
  if spec == "full":
    return cp.nothing_saveable
  if spec == "dots":
    return cp.dots_with_no_batch_dims_saveable
  if spec.startswith("names:"):
    return cp.save_only_these_names(*_names(spec))
  if spec.startswith("offload:"):
    return cp.save_and_offload_only_these_names(
        names_which_can_be_saved=[], names_which_can_be_offloaded=_names(spec),
        offload_src="device", offload_dst="pinned_host")
  raise ValueError(f"unknown remat {spec!r}; valid: {', '.join(POLICIES)} or "
                   f"MaxText's {', '.join(MAXTEXT_POLICIES)}")
