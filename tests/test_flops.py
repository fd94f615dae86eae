"""FLOPs from the traced dot_generals against 6·N·tokens."""

import math

import jax

from meshes.layout import abstract_mesh, plan_mesh
from meshes.topology import parse_topology
from models.presets import PRESETS
from simulator.timing.flops import count_flops
from simulator.formulas import ffn_stack_params, training_flops
from simulator.settings import TrainSettings
from simulator.tracing.trace import trace


def _trace(name, x, y, topology="v5p-128", **kw):
  plan = plan_mesh(parse_topology(topology), x, y)
  s = TrainSettings(**{"remat": "none", "attention": "materialized", **kw})
  return trace(PRESETS[name], s, abstract_mesh(plan)), s


def test_xxl_training_flops_are_exactly_6NT():
  tr, s = _trace("xxl_ffn", 16, 4, batch=16, seq=64)
  fc = count_flops(tr)
  n = ffn_stack_params(16384, 53248, 126)
  assert fc.total_global == training_flops(n, s.tokens)
  assert fc.by_phase["forward"] * 3 == fc.total_global
  assert fc.by_phase["optimizer"] == 0
  # Nothing replicated: per-device work is the global work over 64 chips.
  assert fc.total_per_device * 64 == fc.total_global
  # Per block: 4·B·D·F/(X·Y) forward (seed 004 T_math·C), 3x for training.
  assert fc.per_layer_instance["blocks"] == 3 * 4 * s.tokens * 16384 * 53248 // 64


def test_tiny_llama_flops_are_6NT_plus_attention():
  # 6·N·T counts every parameter as a matmul weight and no attention scores.
  # Exactly: matmul weights only (no embedding lookup, no norm scales), plus
  # QK^T and PV: 2·2·B·S²·(heads·head_dim) per layer forward, 3x for training.
  tr, s = _trace("tiny", 2, 2, "v5p-8", batch=4, seq=128)
  cfg = PRESETS["tiny"]
  leaves = jax.tree_util.tree_leaves_with_path(tr.step.params)
  # Block params are stacked over layers; norm scales are [layers, D].
  matmul = sum(math.prod(l.shape) for p, l in leaves
               if not any(k in jax.tree_util.keystr(p)
                          for k in ("embedding", "norm")))
  attn = 12 * s.batch * s.seq**2 * cfg.n_heads * cfg.head_dim * cfg.n_layers
  fc = count_flops(tr)
  assert fc.total_global == 6 * matmul * s.tokens + attn


def test_llama2_7b_within_10_percent_of_6NT():
  # seq 2048: attention adds 12·S·D·L/(6N) ≈ +8%, the input embedding (no
  # matmul) takes away V·D/N ≈ -2%: within 10% of 6·N·T, above it.
  tr, s = _trace("llama2_7b", 16, 4, batch=16, seq=2048)
  n = sum(math.prod(l.shape) for l in jax.tree.leaves(tr.step.params))
  ratio = count_flops(tr).total_global / training_flops(n, s.tokens)
  assert 1.0 < ratio < 1.10
