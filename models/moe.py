"""Mixture-of-experts MLP: router, top-k, capacity dispatch, experts.

Dispatch `capacity` (GShard; MaxText's `dense_matmul` path with
capacity_factor > 0): each sequence is a group whose tokens are routed
within it; expert e takes at most C = max(ceil(S·k/E)·cf, cf) of a group's
token choices (MaxText's `expert_capacity_per_batch`), the first ones in
token order, and the rest are dropped (they pass through the residual only).
Dispatch and combine are einsums with one-hot masks, so every shape is
static and every FLOP is a dot_general in the traced program: the expert
matmuls do E·C slots per group where k·S are routed (cf ≥ 1 pads, cf < 1
drops), and dispatch and combine cost 2·S·E·C·D each per group.

Experts' layout (models.rules): by default the `exp` dim is unsplit and an
expert's weights are laid out like a dense MLP's, so routing moves no data;
with experts over X (`expert_rules`) the expert-major values are resharded
from groups over X to experts over X — the all-to-all of tokens — and back.
"""

from __future__ import annotations

import math

import flax.linen as nn
import jax
import jax.numpy as jnp

from models import scopes
from models.config import ModelConfig
from models.layers import Dense, Mlp, activation
from models.rules import AxisRules

DISPATCHES = ("capacity",)


def capacity(cfg: ModelConfig, seq: int, capacity_factor: float) -> int:
  """Slots per expert per group (sequence): MaxText's formula."""
  share = math.ceil(seq * cfg.experts_per_token / cfg.n_experts)
  return int(max(share * capacity_factor, capacity_factor))


def active_fraction(cfg: ModelConfig, seq: int, capacity_factor: float
                    ) -> float:
  """Routed token choices over the expert slots computed (k·S / (E·C))."""
  return (seq * cfg.experts_per_token
          / (cfg.n_experts * capacity(cfg, seq, capacity_factor)))


def route(logits_GxSxE: jax.Array, k: int, renormalize: bool
          ) -> tuple[jax.Array, jax.Array, jax.Array]:
  """(probs_GxSxE, weights_GxSxK, experts_GxSxK): the softmax in f32 and the
  top-k experts, their weights renormalised to sum to 1 when `renormalize`
  (Mixtral; Qwen2-MoE's norm_topk_prob=false keeps the softmax values)."""
  probs = jax.nn.softmax(logits_GxSxE.astype(jnp.float32), axis=-1)
  weights, experts = jax.lax.top_k(probs, k)
  if renormalize:
    weights = weights / jnp.sum(weights, axis=-1, keepdims=True)
  return probs, weights, experts


def load_balancing_loss(probs_GxSxE: jax.Array, experts_GxSxK: jax.Array
                        ) -> jax.Array:
  """Switch/Mixtral auxiliary loss E · Σ_e f_e · P_e: f_e the share of the
  tokens choosing expert e (counted over all k choices), P_e the mean router
  probability of e (Hugging Face's `load_balancing_loss_func`). Uniform
  routing gives k; all tokens on one expert with probability 1 gives E·k."""
  e = probs_GxSxE.shape[-1]
  chosen_GxSxE = jnp.sum(jax.nn.one_hot(experts_GxSxK, e, dtype=jnp.float32),
                         axis=-2)
  f_E = jnp.mean(chosen_GxSxE, axis=(0, 1))
  p_E = jnp.mean(probs_GxSxE, axis=(0, 1))
  return e * jnp.sum(f_E * p_E)


def combine_weights(weights_GxSxK: jax.Array, experts_GxSxK: jax.Array,
                    n_experts: int, slots: int) -> jax.Array:
  """combine_GxSxExC: a token's weight at its slot in each chosen expert.

  Slots go in order of (token, choice) within the group; a choice past the
  expert's `slots` is dropped (all zero), as in MaxText's generate_masks. A
  token chooses an expert at most once, so its k choices are summed into
  one G×S×E position before the one-hot over slots.
  """
  g, s, k = experts_GxSxK.shape
  mask_GxSxKxE = jax.nn.one_hot(experts_GxSxK, n_experts, dtype=jnp.int32)
  position = jnp.cumsum(mask_GxSxKxE.reshape(g, s * k, n_experts), axis=1)
  position_GxSxE = jnp.sum(position.reshape(g, s, k, n_experts) * mask_GxSxKxE,
                           axis=2)  # 1-based slot; 0 where not chosen
  weight_GxSxE = jnp.sum(mask_GxSxKxE.astype(weights_GxSxK.dtype)
                         * weights_GxSxK[..., None], axis=2)
  # one_hot of an index outside [0, slots) is all zero: not chosen, dropped.
  slot_GxSxExC = jax.nn.one_hot(position_GxSxE - 1, slots,
                                dtype=weights_GxSxK.dtype)
  return weight_GxSxE[..., None] * slot_GxSxExC


class MoeMlp(nn.Module):
  """Routed experts (and Qwen2-MoE's gated shared expert) for one block.

  Returns the output and this layer's load-balancing loss. No LoRA
  adapters here (simulator.step refuses MLP targets for an MoE model).
  """

  cfg: ModelConfig
  rules: AxisRules
  dtype: jnp.dtype
  param_dtype: jnp.dtype
  capacity_factor: float = 1.0

  @nn.compact
  def __call__(self, x_GxSxD: jax.Array) -> tuple[jax.Array, jax.Array]:
    c = self.cfg
    e, k = c.n_experts, c.experts_per_token
    common = dict(rules=self.rules, param_dtype=self.param_dtype)
    # The router's expert dim is never split: it is small, and X may already
    # split the tokens it scores.
    logits = Dense((c.d_model, e), ("embed", None), "gsd,de->gse",
                   ("batch", "length", None), dtype=jnp.float32,
                   name="router", **common)(x_GxSxD)
    probs, weights, experts = route(logits, k, c.router_renormalize)
    slots = capacity(c, x_GxSxD.shape[1], self.capacity_factor)
    with jax.named_scope(scopes.ROUTING):
      combine_GxSxExC = combine_weights(weights.astype(self.dtype), experts,
                                        e, slots)
      dispatch_GxSxExC = (combine_GxSxExC > 0).astype(self.dtype)
      by_group = (None, "batch", None, None)  # expert-major, groups over X
      x_ExGxCxD = jnp.einsum("gsec,gsd->egcd", dispatch_GxSxExC, x_GxSxD,
                             out_sharding=self._spec(by_group))
    # Groups over X -> experts over X: the all-to-all under expert parallelism
    # (a no-op when experts are not split).
    x_ExGxCxD = activation(x_ExGxCxD, ("exp", "batch", None, None), self.rules)
    expert_mlps = Mlp(c.mlp, c.d_model, c.expert_d_ff, False, n_experts=e,
                      dtype=self.dtype, name="experts", **common)
    with jax.named_scope(scopes.EXPERTS):
      y_ExGxCxD = expert_mlps(x_ExGxCxD)
    y_ExGxCxD = activation(y_ExGxCxD, (None, "batch", None, "embed"),
                           self.rules)  # back to groups over X
    with jax.named_scope(scopes.ROUTING):
      y_GxSxD = jnp.einsum("gsec,egcd->gsd", combine_GxSxExC, y_ExGxCxD,
                           out_sharding=self._spec(("batch", "length",
                                                    "embed")))
    if c.shared_expert_d_ff:
      shared = Mlp(c.mlp, c.d_model, c.shared_expert_d_ff, False,
                   dtype=self.dtype, name="shared_expert", **common)(x_GxSxD)
      gate_GxSx1 = Dense((c.d_model, 1), ("embed", None), "gsd,do->gso",
                         ("batch", "length", None), dtype=self.dtype,
                         name="shared_expert_gate", **common)(x_GxSxD)
      y_GxSxD = y_GxSxD + jax.nn.sigmoid(gate_GxSx1) * shared
    return y_GxSxD, load_balancing_loss(probs, experts)

  def _spec(self, names):
    if jax.sharding.get_abstract_mesh().empty:
      return None
    return self.rules.spec("activations", names)
