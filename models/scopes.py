"""Named scopes a model puts around its parts, so the simulator finds them.

The simulator reads the traced program's structure: each jaxpr equation
carries the stack of named scopes it was traced under (`jax.named_scope`,
and Flax's module names). A model wraps its layer stack and its loss in the
scopes below; `simulator.tracing.trace` finds them there, never in source-file text,
frame names or tracebacks (which change with where packages are installed).

  LAYERS  the layer stack: one scan whose body is one layer and whose
          per-layer parameters are stacked on the `layers` logical axis.
  LOSS    the loss from the last hidden state: the output projection's
          logits and the loss over them (seed 004's XXL stack, which has no
          output layer, a stand-in that reads every output).
  ROUTING the mixture-of-experts dispatch and combine (models.moe): moving
          tokens to expert slots and back, work the step does but not model
          FLOPs (MFU leaves it out, as MaxText's count does).
  EXPERTS the experts' matmuls over their capacity slots, of which only the
          routed tokens' share is model FLOPs (models.moe.active_fraction).
  ACCUMULATION the gradient-accumulation loop over the micro-batches after
          the first (simulator.step; the memory model's interleaved-micro-
          batches rule, simulator.memory.xla_rules).

One scope is JAX's own: jax.checkpoint names the forward it recomputes in
the backward pass RECOMPUTED ('rematted_computation', ad_checkpoint's
`extend_name_stack`); `in_recompute` reads it.
"""

from __future__ import annotations

import functools
import re

LAYERS = "layers"
LOSS = "loss"
ROUTING = "moe_routing"
EXPERTS = "moe_experts"
ACCUMULATION = "grad_accumulation"
RECOMPUTED = "rematted_computation"  # JAX's, not a model's

_TRANSFORM = re.compile(r"\w+\(|\)")  # jvp(...), transpose(...), remat(...)


@functools.lru_cache(maxsize=1 << 14)
def scopes_of(name_stack) -> tuple[str, ...]:
  """The named scopes of a name stack, JAX's transformation wrappers removed:
  'transpose(jvp(Decoder))/layers' -> ('Decoder', 'layers'). Cached: a
  program's equations share a few hundred name stacks (immutable, hashable)
  and the memory and timing readers ask for each one's scopes many times."""
  return tuple(p for p in _TRANSFORM.sub("", str(name_stack)).split("/") if p)


def in_recompute(name_stack) -> bool:
  """Recomputed in the backward pass by jax.checkpoint (RECOMPUTED)."""
  return RECOMPUTED in scopes_of(name_stack)


@functools.lru_cache(maxsize=1 << 14)
def in_backward(name_stack) -> bool:
  """Traced by the backward pass: JAX's transpose names what it makes
  'transpose(...)'. Cached as scopes_of is."""
  return "transpose(" in str(name_stack)
