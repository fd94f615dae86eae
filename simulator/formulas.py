"""Closed-form memory, FLOP and communication formulas from the seeds.

These are cross-checks for the traced path (the main path is always the traced
model) and the quick "no model code" path. Pure Python, no JAX. Sizes are in
bytes (ints wherever the quantity is a whole number of bytes), rates in bytes/s
and FLOP/s, batch sizes in tokens. Nothing here converts to GB or GiB: callers
label units when they print.

Seeds (../shared/seeds/): 000 Calculon static memory, 001 the memory equation,
002 estimator playbook, 003 DeepSpeed model-state estimators, 004 communication
accounting for FSDP+TP on TPU v5p. Where a seed prints a wrong number,
tests/test_formulas.py reproduces the correct value and names the seed's figure
and the reason it differs.
"""

from __future__ import annotations

import dataclasses
import math
from typing import NamedTuple


# --------------------------------------------------------------------------
# Model state: params, grads, optimizer (moments + fp32 master copy).
# --------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class StateBytes:
  """Model-state bytes by DESIGN.md category (per parameter, or totals)."""

  params: int
  grads: int
  optimizer: int  # optimizer moments plus the fp32 master copy, if any

  @property
  def total(self) -> int:
    return self.params + self.grads + self.optimizer


# Bytes per parameter for each optimizer recipe.
OPTIMIZERS: dict[str, StateBytes] = {
    # Seed 001 "The Model State Equation" (and exercise 7): bf16 params and
    # grads, fp32 master + m + v: 2 + 2 + (4 + 4 + 4) = 16 bytes.
    "adamw": StateBytes(params=2, grads=2, optimizer=12),
    # Seed 001 exercise 7: bf16 params and grads, fp32 master + momentum = 12.
    "sgd_momentum": StateBytes(params=2, grads=2, optimizer=8),
    # Seed 001 exercise 7: bf16 params and grads, fp32 master only = 8.
    "sgd": StateBytes(params=2, grads=2, optimizer=4),
    # Seed 004(a) and seed 003's "16b for fp32": fp32 params (they are the
    # master weights), fp32 accumulated grads, fp32 m and v; no bf16 copy.
    # This is what optax.adamw holds for fp32 params.
    "adamw_fp32": StateBytes(params=4, grads=4, optimizer=8),
}


def model_state_bytes_per_param(optimizer: str) -> StateBytes:
  """Bytes per parameter of `optimizer` (a key of OPTIMIZERS), by category."""
  try:
    return OPTIMIZERS[optimizer]
  except KeyError:
    raise ValueError(f"optimizer {optimizer!r}; valid: "
                     f"{', '.join(OPTIMIZERS)}") from None


def model_state_bytes(num_params: int, optimizer: str = "adamw") -> StateBytes:
  """Unsharded model state: 16Ψ AdamW, 12Ψ SGD+momentum, 8Ψ SGD (seed 001)."""
  per = model_state_bytes_per_param(optimizer)
  return StateBytes(params=per.params * num_params,
                    grads=per.grads * num_params,
                    optimizer=per.optimizer * num_params)


def zero_model_state_bytes_per_device(num_params: int, stage: int, dp: int,
                                      optimizer: str = "adamw",
                                      tp: int = 1) -> StateBytes:
  """Per-device model state under ZeRO `stage` 0-3 over `dp` ranks.

  Seed 001 exercise 1 and seed 002 "ZeRO scaling" (Rajbhandari et al.):
  stage 1 shards the optimizer state (moments and master copy), stage 2 also
  the grads, stage 3 also the params; e.g. AdamW stage 3 is 16Ψ/dp. Tensor
  parallelism over `tp` shards every category (seed 002). A sharded category
  holds ceil(Ψ / (tp·dp)) parameters per device (flat shards padded to equal
  size), so shards × dp is the total exactly when tp·dp divides Ψ.
  """
  if stage not in (0, 1, 2, 3):
    raise ValueError(f"ZeRO stage {stage}; valid: 0, 1, 2, 3")
  if dp < 1 or tp < 1:
    raise ValueError(f"dp={dp} and tp={tp} must be >= 1")
  per = model_state_bytes_per_param(optimizer)
  replicated = -(-num_params // tp)
  sharded = -(-num_params // (tp * dp))
  return StateBytes(
      params=per.params * (sharded if stage >= 3 else replicated),
      grads=per.grads * (sharded if stage >= 2 else replicated),
      optimizer=per.optimizer * (sharded if stage >= 1 else replicated))


class HostDeviceBytes(NamedTuple):
  """DeepSpeed's estimate: (CPU RAM bytes per node, GPU bytes per GPU)."""

  cpu: int
  gpu: int


def deepspeed_zero2_model_states_mem_needs(
    total_params: int, num_gpus_per_node: int = 1, num_nodes: int = 1,
    cpu_offload: bool = True, additional_buffer_factor: float = 1.5,
    current: bool = False) -> HostDeviceBytes:
  """DeepSpeed's `estimate_zero2_model_states_mem_needs` (seed 003).

  GPU: 2Ψ with the optimizer offloaded, else 4Ψ + 16Ψ/total_gpus as seed
  003 prints it (fp16 params and grads replicated, fp32 params, grads... m, v
  sharded), or with `current` 2Ψ + 18Ψ/total_gpus as DeepSpeed's code reads
  today (deepspeed/runtime/zero/stage_1_and_2.py at 02aa38c: 2 = params_16bit,
  18 = 2 grads_16bit + 4 grads_32bit + 4 params_32bit + 8 optimizer states,
  all sharded but the 16-bit params). CPU: Ψ · max(4·total_gpus, 16) ·
  buffer offloaded, else 4Ψ · gpus_per_node · buffer. Truncates like int().
  """
  total_gpus = num_nodes * num_gpus_per_node
  if cpu_offload:
    gpu = 2 * total_params
    cpu = total_params * max(4 * total_gpus, 16) * additional_buffer_factor
  elif current:
    gpu = 2 * total_params + int(18 * total_params / total_gpus)
    cpu = total_params * 4 * num_gpus_per_node * additional_buffer_factor
  else:
    gpu = 4 * total_params + int(16 * total_params / total_gpus)
    cpu = total_params * 4 * num_gpus_per_node * additional_buffer_factor
  return HostDeviceBytes(cpu=int(cpu), gpu=int(gpu))


def deepspeed_table(stage: int, total_params: int, largest_layer_params: int,
                    num_gpus_per_node: int, num_nodes: int,
                    current: bool = True) -> str:
  """DeepSpeed's `estimate_zero{2,3}_model_states_mem_needs_all_cold` print
  (its "GB" is 2^30 bytes), line for line."""
  nodes = "nodes" if num_nodes > 1 else "node"
  gpus = "GPUs" if num_gpus_per_node > 1 else "GPU"
  sw = f"SW: Model with {int(total_params / 1e6)}M total params"
  if stage == 3:
    sw += f", {int(largest_layer_params / 1e6)}M largest layer params"
  lines = ["Estimated memory needed for params, optim states and gradients "
           "for a:", f"HW: Setup with {num_nodes} {nodes}, "
           f"{num_gpus_per_node} {gpus} per node.", sw + ".",
           "  per CPU  |  per GPU |   Options"]
  row = lambda e, options: (f" {e.cpu / 2**30:7.2f}GB | {e.gpu / 2**30:6.2f}GB"
                            f" | {options}")
  dev = lambda on: "cpu " if on else "none"
  if stage == 2:
    for offload in (True, False):
      lines.append(row(deepspeed_zero2_model_states_mem_needs(
          total_params, num_gpus_per_node, num_nodes, offload,
          current=current), f"offload_optimizer={dev(offload)}"))
    return "\n".join(lines)
  for opt, par in ((True, True), (True, False), (False, False)):
    for zero_init in (True, False):
      lines.append(row(deepspeed_zero3_model_states_mem_needs(
          total_params, largest_layer_params, num_gpus_per_node, num_nodes,
          opt, par, zero_init), f"offload_param={dev(par)}, "
          f"offload_optimizer={dev(opt)}, zero_init={int(zero_init)}"))
  return "\n".join(lines)


def deepspeed_zero3_model_states_mem_needs(
    total_params: int, largest_layer_params: int, num_gpus_per_node: int = 1,
    num_nodes: int = 1, cpu_offload: bool = True,
    cpu_offload_params: bool = True, zero_init: bool = True,
    additional_buffer_factor: float = 1.5) -> HostDeviceBytes:
  """DeepSpeed's `estimate_zero3_model_states_mem_needs` (seed 003).

  GPU: 4·largest_layer (fp16 params gathered + fp16 grads) plus 18Ψ/total_gpus
  (fp32 params, grads, m, v = 16, + fp16 params = 2) with nothing offloaded,
  2Ψ/total_gpus with only the optimizer offloaded, nothing more with both.
  CPU per node: see seed 003 "General RAM" (gpus_factor = 1/num_nodes).
  """
  total_gpus = num_nodes * num_gpus_per_node
  gpus_factor = 1 / num_nodes
  largest_layer_memory = 4 * largest_layer_params
  buffer = additional_buffer_factor
  if cpu_offload and cpu_offload_params:
    gpu = largest_layer_memory
    if zero_init:
      cpu = total_params * 18 * gpus_factor * buffer
    else:
      cpu = total_params * max(4 * num_gpus_per_node, 18 * gpus_factor) * buffer
  elif cpu_offload:
    gpu = largest_layer_memory + int(2 * total_params / total_gpus)
    if zero_init:
      cpu = total_params * 16 * gpus_factor * buffer
    else:
      cpu = total_params * max(4 * num_gpus_per_node, 16 * gpus_factor) * buffer
  else:
    gpu = largest_layer_memory + int(18 * total_params / total_gpus)
    if zero_init:
      cpu = largest_layer_params * 4 * num_gpus_per_node * buffer
    else:
      cpu = total_params * 4 * num_gpus_per_node * buffer
  return HostDeviceBytes(cpu=int(cpu), gpu=int(gpu))


def deepspeed_zero3_pinned_bytes(total_params: int, offload_params: bool,
                                 grad_accum: int = 1,
                                 num_nodes: int = 1) -> int:
  """Seed 003 "Pinned Memory" (ZeRO-3 with cpu_offload_use_pin_memory): the
  part of a node's general RAM that is page-locked. Parameters offloaded:
  6Ψ (2 bytes fp16 params + 4 fp32 grads), 2Ψ more for fp16 grads with
  gradient accumulation; not offloaded: 4Ψ (fp32 grads). Spread over nodes
  as its general RAM is (gpus_factor = 1/num_nodes). ZeRO-2: "can't be
  controlled" (no rule)."""
  per_param = (6 + (2 if grad_accum > 1 else 0)) if offload_params else 4
  return int(total_params * per_param / num_nodes)


def deepspeed_pinned_lines(total_params: int, num_nodes: int = 1,
                           grad_accum: int = 1) -> list[str]:
  """The two pinned-memory cases of seed 003, per node, in its GB (2^30)."""
  out = []
  for offload in (True, False):
    pinned = deepspeed_zero3_pinned_bytes(total_params, offload, grad_accum,
                                          num_nodes)
    rule = (("8" if grad_accum > 1 else "6") if offload else "4") + "Ψ"
    out.append(f"  {pinned / 2**30:7.2f}GB per node | ZeRO-3 "
               f"offload_param={'cpu ' if offload else 'none'}: {rule}"
               + (f"/{num_nodes} nodes" if num_nodes > 1 else ""))
  return out


def deepspeed_zero3_gpu_cases(total_params: int, largest_layer_params: int,
                              total_gpus: int) -> str:
  """Seed 003's ZeRO-3 GPU-memory discussion (its t5-large example), line
  for line: 4·largest_layer, then case 1 (nothing offloaded), case 2
  (params and optimizer offloaded), case 3 (optimizer offloaded) per GPU,
  in its "MB" (bytes >> 20, i.e. MiB)."""
  gpu = lambda opt, par: deepspeed_zero3_model_states_mem_needs(
      total_params, largest_layer_params, total_gpus, 1, opt, par).gpu
  return "\n".join([
      f"total params:         {total_params / 1e6:6.2f}M",
      f"largest layer params: {largest_layer_params / 1e6:6.2f}M",
      f"largest layer memory: {(4 * largest_layer_params) >> 20:6}MB",
      f"case1 gpu memory: {gpu(False, False) >> 20:6}MB",
      f"case2 gpu memory: {gpu(True, True) >> 20:6}MB",
      f"case3 gpu memory: {gpu(True, False) >> 20:6}MB"])


class LinearStaticBytes(NamedTuple):
  """Calculon's static memory of one linear layer, in bytes."""

  weight: int
  optimizer: int  # Adam m, v (fp32) + fp32 master copy when training < fp32


def calculon_linear_static_bytes(c_in: int, c_out: int,
                                 bytes_per_element: int = 2,
                                 optimizer_sharding: int = 1
                                 ) -> LinearStaticBytes:
  """Calculon `Layer.get_weight` / `get_optimizer` for a Linear (seed 000).

  weight = c_in·c_out·bytes; optimizer = (2·c_in·c_out·4 [m, v] + c_in·c_out·4
  [master, only if bytes < 4]) / optimizer_sharding, rounded up to a byte
  (Calculon divides as a float). Calculon's `weight_space` and `optim_space`
  are element counts; seed 000's prose calls `weight_space` bytes.
  """
  elems = c_in * c_out
  moments = 2 * elems * 4
  master = elems * 4 if bytes_per_element < 4 else 0
  return LinearStaticBytes(
      weight=elems * bytes_per_element,
      optimizer=-(-(moments + master) // optimizer_sharding))


# --------------------------------------------------------------------------
# Activations saved for backward, per transformer layer.
# --------------------------------------------------------------------------


class ActivationBytes(NamedTuple):
  """Per-layer activation bytes: terms linear in S, and attention's S² terms."""

  linear: int
  quadratic: int

  @property
  def total(self) -> int:
    return self.linear + self.quadratic


def activation_bytes_11bsh(batch: int, seq_len: int, hidden: int, heads: int,
                           bytes_per_element: int = 2) -> ActivationBytes:
  """Seed 001's (11·B·S·H + B·A·S²) · b_a bytes per layer.

  Element counts from seed 001's table: LayerNorm-1 input BSH, Q, K, V 3BSH,
  attention scores BAS² (one copy: softmax output not counted separately),
  attention output BSH, LayerNorm-2 input BSH, FFN intermediate 4BSH (d_ff =
  4H, one copy: pre- and post-activation not both kept), FFN output BSH. No
  dropout masks. Every element is `bytes_per_element` bytes (2 for bf16),
  which gives seed 001's M_act = 2·L·B·S·H·(11 + A·S/H) over L layers.
  """
  return ActivationBytes(
      linear=11 * batch * seq_len * hidden * bytes_per_element,
      quadratic=batch * heads * seq_len * seq_len * bytes_per_element)


def activation_bytes_korthikanti(batch: int, seq_len: int, hidden: int,
                                 heads: int) -> ActivationBytes:
  """Korthikanti et al. 2022: S·B·H·(34 + 5·A·S/H) bytes per layer (seed 001).

  The coefficients are already bytes: 16-bit activations plus 1-byte dropout
  masks. Attention block 11SBH + 5AS²B (QKV input 2, Q and K 4, softmax
  output 2AS²B, its dropout mask AS²B, dropout output 2AS²B, V 2, projection
  input 2, dropout mask 1), MLP 19SBH (d_ff = 4H: input 2, GeLU input 8,
  second linear input 8, dropout mask 1), two LayerNorm inputs 4SBH. No tensor
  or sequence parallelism, no recomputation, attention scores materialised
  (no FlashAttention). Do not multiply by 2 bytes again.
  """
  return ActivationBytes(
      linear=34 * seq_len * batch * hidden,
      quadratic=5 * heads * seq_len * seq_len * batch)


def kv_cache_bytes_seed002(batch: int, seq_len: int, layers: int, hidden: int,
                           tp: int = 1, bytes_per_element: int = 2) -> int:
  """Seed 002's KV cache per rank: 2·B·S·L·H / T elements of
  bytes(dtype) (its "Core Formulas" line; B the per-rank micro-batch, H
  the hidden size). It counts H = d_model wide keys and values, so it
  overstates a GQA/MQA model's cache by n_heads / n_kv_heads, and it
  divides by T even where T does not divide the kv heads (replicated)."""
  return 2 * batch * seq_len * layers * hidden * bytes_per_element // tp


def kv_cache_bytes(batch: int, seq_len: int, layers: int, kv_heads: int,
                   head_dim: int, bytes_per_element: int = 2,
                   scale_bytes: int = 0) -> int:
  """The KV cache of B sequences of S positions: 2·L·B·S·K·Hd elements,
  plus (int8) one scale of `scale_bytes` per token per kv head for k and
  for v. Per device: pass B/X and K/Y (K where Y does not divide K)."""
  tokens_heads = 2 * layers * batch * seq_len * kv_heads
  return tokens_heads * (head_dim * bytes_per_element + scale_bytes)


# --------------------------------------------------------------------------
# FLOPs.
# --------------------------------------------------------------------------


def forward_flops(num_params: int, tokens: int) -> int:
  """2·N·tokens: one multiply-add per parameter per token (seed 004 T_math)."""
  return 2 * num_params * tokens


def training_flops(num_params: int, tokens: int) -> int:
  """6·N·tokens: forward 2N, backward 4N per token (Scaling Book, training)."""
  return 6 * num_params * tokens


# --------------------------------------------------------------------------
# Seed 004: the XXL FFN stack (two linears per block) under FSDP and FSDP+TP.
# --------------------------------------------------------------------------


def ffn_stack_params(d_model: int, d_ff: int, n_blocks: int) -> int:
  """Seed 004: 2·d_model·d_ff·n_blocks (W_in and W_out in each block)."""
  return 2 * d_model * d_ff * n_blocks


def ffn_stack_saved_bytes_per_token(d_model: int, d_ff: int, n_blocks: int,
                                    bytes_per_element: int = 2) -> int:
  """Seed 004(a): bytes saved for backward per token, no checkpointing.

  Each block keeps its input X (d_model) and W_in·X (d_ff):
  bytes·n_blocks·(d_ff + d_model); 2·126·69632 = 17,547,264 B for XXL in bf16.
  """
  return bytes_per_element * n_blocks * (d_ff + d_model)


def fsdp_bytes_per_device(state_bytes: int, replicated_activation_bytes: int,
                          sharded_activation_bytes: int, n_fsdp: int) -> int:
  """Seed 004(b): state/N + replicated activations + sharded activations/N.

  Seed 004(b) shards the model state and half of the activations (every
  second layer) over N_FSDP devices; shards are rounded up to whole bytes.
  """
  return (-(-state_bytes // n_fsdp) + replicated_activation_bytes
          + -(-sharded_activation_bytes // n_fsdp))


def min_fsdp_devices(state_bytes: int, replicated_activation_bytes: int,
                     sharded_activation_bytes: int,
                     device_bytes: int) -> int | None:
  """Smallest N_FSDP with fsdp_bytes_per_device(...) <= device_bytes.

  Seed 004(b): N >= (S + A_sharded) / (M - A_replicated), here found exactly
  for whole-byte shards by bisection (bytes per device never grow with N).
  None when no N fits: the replicated activations (plus a byte per non-empty
  shard) already exceed the device.
  """
  def fits(n: int) -> bool:
    return fsdp_bytes_per_device(state_bytes, replicated_activation_bytes,
                                 sharded_activation_bytes, n) <= device_bytes

  lo, hi = 1, max(1, state_bytes, sharded_activation_bytes)
  if not fits(hi):  # at hi every shard is at most one byte: the least possible
    return None
  while lo < hi:
    mid = (lo + hi) // 2
    lo, hi = (lo, mid) if fits(mid) else (mid + 1, hi)
  return lo


def fsdp_tp_ffn_forward_times(batch: float, d_model: int, d_ff: int, x: int,
                              y: int, m_x: int, m_y: int, flops_per_s: float,
                              w_ici: float) -> tuple[float, float]:
  """Seed 004(c): (T_math, T_comm) in seconds of one FFN block's forward pass.

  In[B_X, D_Y]·W_in[D_X, F_Y]·W_out[F_Y, D_X] -> Out[B_X, D_Y], bf16:
  T_math = 4·B·D·F / (C·X·Y); T_comm = 4·D·(B/(X·M_Y) + F/(Y·M_X)) / W_ici
  (AllGather_Y of In, AllGather_X of both weights, ReduceScatter_Y of Out;
  an axis spanning M physical ICI axes has M× the bandwidth). `batch` is the
  global batch in tokens, `w_ici` the bidirectional bandwidth of one axis.
  """
  t_math = 4 * batch * d_model * d_ff / (flops_per_s * x * y)
  t_comm = 4 * d_model * (batch / (x * m_y) + d_ff / (y * m_x)) / w_ici
  return t_math, t_comm


def fsdp_tp_min_batch(d_ff: int, x: int, y: int, m_x: int, m_y: int,
                      flops_per_s: float, w_ici: float) -> float:
  """Seed 004(c): global tokens B at which T_math = T_comm under FSDP X × TP Y.

  B >= F·C·X·M_Y / (M_X·(F·M_Y·W_ici - C·Y)); compute bound above it. D
  cancels. math.inf when C·Y >= F·M_Y·W_ici: then the TP activation traffic
  alone outruns the math at any batch size.
  """
  denominator = m_x * (d_ff * m_y * w_ici - flops_per_s * y)
  if denominator <= 0:
    return math.inf
  return d_ff * flops_per_s * x * m_y / denominator


def fsdp_tp_optimal_y(d_ff: int, m_y: int, flops_per_s: float,
                      w_ici: float) -> float:
  """Seed 004(d): the continuous TP degree Y* = F·M_Y·W_ici / (2·C).

  It maximises g(Y) = Y·M_X·(W_ici - C·Y/(F·M_Y)) and so minimises
  fsdp_tp_min_batch at fixed N = X·Y, M_X, M_Y.
  """
  return d_ff * m_y * w_ici / (2 * flops_per_s)


def fsdp_tp_min_batch_at_optimal_y(d_ff: int, n_chips: int, m_x: int, m_y: int,
                                   flops_per_s: float, w_ici: float) -> float:
  """Seed 004(d): B* = 4·C²·N / (F·M_X·M_Y·W_ici²) at Y = Y*.

  g(Y*) = F·M_X·M_Y·W²/(4C); seed 004 then writes F·W²/(2C), which holds
  only for M_X·M_Y = 2. Equals the Scaling Book's B/N > 4α²/(F·M_X·M_Y),
  α = C/W_ici.
  """
  return 4 * flops_per_s**2 * n_chips / (d_ff * m_x * m_y * w_ici**2)


def fsdp_tp_best_mesh(d_ff: int, n_chips: int, m_x: int, m_y: int,
                      flops_per_s: float,
                      w_ici: float) -> tuple[int, int, float]:
  """Seed 004(d): integer search over X·Y = n_chips -> (X, Y, min batch).

  Follows the seed in holding M_X and M_Y fixed across factorizations, and
  in charging the TP traffic even at Y = 1.
  """
  meshes = [(n_chips // y, y) for y in range(1, n_chips + 1)
            if n_chips % y == 0]
  return min(((x, y, fsdp_tp_min_batch(d_ff, x, y, m_x, m_y, flops_per_s,
                                       w_ici)) for x, y in meshes),
             key=lambda mesh: mesh[2])


def dp_min_tokens_per_chip(flops_per_s: float, w_ici: float,
                           num_axes: int = 1) -> float:
  """Pure DP or FSDP is compute bound when B/X > C / (num_axes · W_ici).

  TPU Scaling Book, "Training" (data parallelism and FSDP): per-chip tokens
  must exceed the ICI arithmetic intensity C/W. v5p: C = 4.6e14 FLOP/s and
  W_ici = 2·9e10 = 1.8e11 B/s, the bidirectional figure (9e10 one-way per
  link, book's TPU table), give 2555.6 (the book's "2550") on one axis and
  851.9 ("850") with the batch over all three.
  """
  return flops_per_s / (num_axes * w_ici)
