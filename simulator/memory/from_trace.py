"""The memory estimate of a traced step (simulator.memory.estimate): its
tensors read off the step's shardings, its transient live set off a heap
simulation of the traced program (simulator.memory.liveness). The one part
of the memory model that needs the trace, and jax: an estimate it made is
data (a sweep keeps it, simulator.group_estimate)."""

from __future__ import annotations

import dataclasses
import itertools
from typing import Any

import jax

from meshes import gpu_target
from meshes.layout import MeshPlan, abstract_mesh
from models import scopes
from models.config import ModelConfig
from simulator.memory import capacity, liveness, xla_gpu_rules, xla_rules
from simulator.memory.estimate import MemoryEstimate, Tensor, assemble
from simulator.memory.tiling import tpu_tiled_bytes
from simulator.settings import TrainSettings
from simulator.step import (HOST as PINNED, device_bytes, device_shape,
                            trainable_params)
from simulator.tracing.batch_probe import carries_batch, require_probe
from simulator.tracing.trace import Residual, Traced, read_inputs, trace_probe


def _leaves_with_names(tree, prefix: str) -> list[tuple[str, Any]]:
  flat, _ = jax.tree_util.tree_flatten_with_path(tree)
  return [(prefix + jax.tree_util.keystr(path, simple=True, separator="/"),
           leaf) for path, leaf in flat if hasattr(leaf, "shape")]


def _split(category: str, name: str, aval) -> Tensor:
  """A value of the probe-batch trace: all fixed or all linear bytes."""
  shape, nbytes = device_shape(aval), device_bytes(aval)
  linear = carries_batch(shape)
  return Tensor(category, name, shape, str(aval.dtype),
                0 if linear else nbytes, nbytes if linear else 0)


def _padding_tensor(name: str, leaf, tiled: bool, batch: bool = False
                    ) -> Tensor:
  """The tile padding of one argument (0 off TPU). A batch argument's
  padding is not affine in the batch (its per-device batch dim is rounded
  to a tile): "batch_padding" is recomputed from its shape at every batch."""
  shape = device_shape(leaf)
  if batch:
    return Tensor("batch_padding" if tiled else "padding",
                  f"{name} tile padding", shape, str(leaf.dtype), 0, 0)
  pad = tpu_tiled_bytes(shape, leaf.dtype) - device_bytes(leaf) if tiled else 0
  return Tensor("padding", f"{name} tile padding", shape, str(leaf.dtype),
                pad, 0)


def _state_tensors(traced: Traced, tiled: bool) -> list[Tensor]:
  """Params, grads, optimizer state and batch; an argument the step never
  reads (Adafactor's placeholder moments) is dropped by jit and left out."""
  step = traced.step
  reads = read_inputs(traced.jaxpr)  # params, opt_state, batch leaves in order
  n_params = len(jax.tree.leaves(step.params))
  read = {"params": reads[:n_params], "grads": itertools.repeat(True),
          "optimizer": reads[n_params:]}
  out = []
  for category, tree, prefix in (("params", step.params, "params/"),
                                 ("grads", step.grads, "grads/"),
                                 ("optimizer", step.opt_state, "opt_state")):
    for (name, leaf), kept in zip(_leaves_with_names(tree, prefix),
                                  read[category]):
      if not kept:
        continue
      if xla_rules.on_host(leaf):  # --offload: pinned host memory
        out.append(Tensor("host", name, device_shape(leaf), str(leaf.dtype),
                          device_bytes(leaf), 0,
                          pinned=leaf.sharding.memory_kind == PINNED))
        continue
      out.append(Tensor(category, name, device_shape(leaf),
                        str(leaf.dtype), device_bytes(leaf), 0))
      if category != "grads":  # arguments only
        out.append(_padding_tensor(name, leaf, tiled))
  for name, leaf in _leaves_with_names(step.batch, "batch/"):
    out.append(_split("batch", f"{name} (argument)", leaf))
    out.append(_padding_tensor(name, leaf, tiled, batch=True))
  return out


def _saved_tensors(residuals: tuple[Residual, ...]) -> list[Tensor]:
  """What the backward keeps: residuals not fused away and not arguments
  (params and batch are counted as such); offloaded ones on the host, in
  pinned_host memory (models.remat's offload_dst)."""
  out = []
  for r in residuals:
    if r.argument or r.fused:
      continue
    t = _split("host" if xla_rules.on_host(r.aval) else "activations", r.name,
               r.aval)
    out.append(dataclasses.replace(t, pinned=t.category == "host"))
  return out


def _require_loss(jaxpr) -> None:
  """The deferred-output-gradient rule finds the loss by its named scope."""
  if not any(scopes.LOSS in scopes.scopes_of(e.source_info.name_stack)
             for e in jaxpr.jaxpr.eqns):
    raise ValueError(
        "the traced step has no loss scope: the memory model needs the "
        f"model's loss under jax.named_scope({scopes.LOSS!r}) (see "
        "models.scopes)")


def estimate_memory(traced: Traced, plan: MeshPlan) -> MemoryEstimate:
  """The estimate for the step traced at the probe batch
  (simulator.tracing.trace.trace_probe) on `plan`'s chip, at that batch: call
  `at_batch` for a real one."""
  step = traced.step
  batch = step.batch["inputs"].shape[0]
  require_probe(batch, plan.data * plan.Y, "estimate_memory",
                step.grad_accum * step.microbatches)
  _require_loss(traced.jaxpr)
  per_device_batch = device_shape(step.batch["inputs"])[0]
  tiled = plan.topology.chip.kind == "tpu"
  tensors = _state_tensors(traced, tiled) + _saved_tensors(traced.residuals)
  donated = len(jax.tree.leaves(step.params)) + len(
      jax.tree.leaves(step.opt_state))
  gpu = plan.topology.chip.kind == "gpu"
  sms = (xla_gpu_rules.Sms(*gpu_target.sm_count_and_major(
      plan.topology.chip.name)) if gpu else None)
  points = liveness.simulate(
      traced.jaxpr, donated, gpu=gpu, sms=sms, one_device=plan.chips == 1,
      dequantize_early=xla_rules.dequantizes_early(plan.topology.chip.name),
      matmul_reductions=xla_rules.writes_matmul_reductions(
          plan.topology.chip.name))
  rule = ((step.stages, step.microbatches) if step.schedule == "1f1b"
          else None)
  limit = (capacity.remat_limit_bytes(plan) if rule is None
           and xla_rules.logits_recomputable(traced.jaxpr) else None)
  return dataclasses.replace(
      assemble(tuple(tensors), points, batch, batch,
               capacity.capacity_bytes(plan),
               batch // per_device_batch * step.grad_accum * step.microbatches,
               plan.topology.chips_per_vm, rule, limit),
      trainable_params=trainable_params(step))


def memory_report(cfg: ModelConfig, settings: TrainSettings,
                  plan: MeshPlan) -> MemoryEstimate:
  """Trace the step under `plan`'s abstract mesh and estimate its memory."""
  traced = trace_probe(cfg, settings, abstract_mesh(plan))
  return estimate_memory(traced, plan).at_batch(settings.batch)
