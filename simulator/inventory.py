"""Parameter inventory: every group's logical axes, mesh layout and bytes."""

from __future__ import annotations

import collections
import dataclasses
import math
from typing import Any

import jax

from meshes.layout import MeshPlan, abstract_mesh
from models.config import ModelConfig
from models.params import abstract_params, module_class
from simulator.settings import TrainSettings
from simulator.model_checks import check_pipeline
from simulator.step import (build_step, device_bytes,
                            device_shape,
                            kv_heads_replicated,
                            lay_out_params, make_model, pad_vocab,
                            params_and_names, step_rules,
                            trainable_paths, with_images)


def describe_params(cfg: ModelConfig, plan: MeshPlan,
                    settings: TrainSettings = TrainSettings()) -> dict[str, Any]:
  """What `experiments.describe` prints: counts, dtypes, layouts, bytes."""
  mesh = abstract_mesh(plan)
  cfg = with_images(cfg, settings)
  check_pipeline(cfg, settings, plan.topology.chips)
  rules = step_rules(cfg, settings, mesh)[0]
  padded, padding = pad_vocab(cfg, rules, mesh)
  leaves, names = params_and_names(make_model(padded, settings, rules),
                                   settings)
  laid = lay_out_params(leaves, names, rules, mesh)
  groups, by_dtype = [], collections.Counter()
  flat = jax.tree_util.tree_flatten_with_path(laid)[0]
  flat_names = jax.tree.leaves(names, is_leaf=lambda x: isinstance(x, tuple))
  for (path, sds), logical in zip(flat, flat_names):
    local = device_shape(sds)
    by_dtype[str(sds.dtype)] += math.prod(sds.shape) * sds.dtype.itemsize
    groups.append({
        "path": jax.tree_util.keystr(path, simple=True, separator="/"),
        "shape": list(sds.shape),
        "dtype": str(sds.dtype),
        "logical_axes": [n or None for n in logical],
        "partition_spec": [a for a in sds.sharding.spec] + [None] * (
            len(sds.shape) - len(sds.sharding.spec)),
        "per_device_shape": list(local),
        "per_device_bytes": device_bytes(sds),
    })
  topo = plan.topology
  full = leaves
  if settings.base_quant != "none":  # count the weights the codes stand for
    full = abstract_params(make_model(padded, dataclasses.replace(
        settings, base_quant="none"), rules))[0]
  num_params = sum(math.prod(x.shape) for x in jax.tree.leaves(full)) - (
      padding * cfg.d_model * (1 if cfg.tie_embeddings else 2))
  trainable = trainable_paths(leaves, settings)
  return {
      "model": cfg.name,
      "num_params": num_params,
      "active_params": num_params - sum(
          math.prod(g["shape"]) for g in groups if "exp" in g["logical_axes"]
      ) * (cfg.n_experts - cfg.experts_per_token) // max(cfg.n_experts, 1),
      "trainable_params": num_params if len(trainable) == len(flat) else
                          sum(math.prod(leaf.shape) for path, leaf in flat
                              if path in trainable),
      "quantized_base": quantized_base(full, leaves, settings.base_quant),
      "vocab_padding": padding,
      "kv_heads_replicated": kv_heads_replicated(cfg, plan.Y),
      "topology": {"name": topo.name, "chips": topo.chips,
                   "shape": list(topo.shape), "hosts": topo.hosts},
      "mesh": {"X": plan.X, "Y": plan.Y, "M_X": plan.M_X, "M_Y": plan.M_Y,
               "wrap_x": plan.wrap_x, "wrap_y": plan.wrap_y,
               "x_hosts": plan.x_hosts, "y_hosts": plan.y_hosts,
               "P": plan.P, "D": plan.D},
      "shard": settings.shard,
      "precision": settings.precision,
      "bytes_by_dtype": dict(by_dtype),
      "params": groups,
      "per_device_param_bytes": sum(g["per_device_bytes"] for g in groups),
      "optimizer": settings.optimizer,
      **optimizer_state_bytes(cfg, plan, settings),
  }


def optimizer_state_bytes(cfg: ModelConfig, plan: MeshPlan,
                          settings: TrainSettings) -> dict[str, int]:
  """The optimizer's state as the step holds it (jax.eval_shape(tx.init) on
  the trained parameters, laid out like the optimizer): bytes in all and
  per device."""
  seq = settings.seq  # nor a length: one the model's positions allow
  if cfg.positions == "learned":
    seq = min(seq, cfg.max_len)
  any_batch = dataclasses.replace(  # the state has no batch
      settings, batch=plan.data * plan.Y * settings.microbatches,
      grad_accum=1, seq=seq)
  leaves = jax.tree.leaves(build_step(cfg, any_batch,
                                      abstract_mesh(plan)).opt_state)
  return {"optimizer_state_bytes": sum(math.prod(x.shape) * x.dtype.itemsize
                                       for x in leaves),
          "per_device_optimizer_bytes": sum(device_bytes(x) for x in leaves)}


def quantized_base(full, stored, kind: str) -> dict[str, Any] | None:
  """The base weights stored quantized and their bytes (models.quant): the
  arrays of the unquantized tree that the stored tree replaced, and those
  that replaced them."""
  if kind == "none":
    return None
  paths = lambda tree: dict(jax.tree_util.tree_flatten_with_path(tree)[0])
  full, stored = paths(full), paths(stored)
  weights = sum(math.prod(x.shape) for p, x in full.items() if p not in stored)
  nbytes = sum(math.prod(x.shape) * x.dtype.itemsize
               for p, x in stored.items() if p not in full)
  return {"kind": kind, "weights": weights, "bytes": nbytes,
          "bytes_per_weight": nbytes / weights}


def largest_module_params(cfg: ModelConfig) -> int:
  """The most parameters one module holds directly, as DeepSpeed's ZeRO-3
  estimator finds its "largest layer": a module's own leaves (a Dense's
  kernel and bias), one layer's share of the scanned stack (its leading
  `layers` dim divided out); the embedding table is a module of its own."""
  leaves, names = abstract_params(module_class(cfg)(cfg))
  flat = jax.tree_util.tree_flatten_with_path(leaves)[0]
  flat_names = jax.tree.leaves(names, is_leaf=lambda x: isinstance(x, tuple))
  by_module: dict[tuple, int] = collections.Counter()
  for (path, leaf), logical in zip(flat, flat_names):
    n = math.prod(leaf.shape)
    if logical and logical[0] == "layers":
      n //= leaf.shape[0]
    by_module[tuple(getattr(k, "key", k) for k in path[:-1]) or
              (path[-1].key,)] += n
  return max(by_module.values())
