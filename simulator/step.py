"""The train step, built once for any mesh: abstract (trace) or real (compile).

FSDP/ZeRO layouts, as shardings over X:
  params    stored X-sharded under zero3, else replicated over X;
  grads     X-sharded (reduce-scattered) under zero2/zero3;
  optimizer X-sharded under zero1/2/3, replicated under dp.
TP over Y applies to all three, from the rules' `params` table.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax.sharding import NamedSharding, PartitionSpec as P

from models import scopes
from models.config import ModelConfig
from models.params import abstract_params, module_class
from models.rules import FSDP_TP, AxisRules, expert_rules, rules_for
from models.transformer import RESIDUAL
from models.vision import replicated_tower
from simulator.tracing import mesh_class
from simulator.optimizers import PRECISION, make_optimizer
from simulator.model_checks import (PlanError, check_heads_over_y,
                                     check_model_settings, check_pipeline,
                                     check_seq, kv_heads_replicated,
                                     with_images)
from simulator.settings import TrainSettings

Tree = Any
HOST = "pinned_host"  # the memory kind offloaded state lives in


@dataclasses.dataclass(frozen=True)
class Step:
  """A train step and its abstract arguments (ShapeDtypeStructs with shardings).

  grads is what the step holds after reduce-scatter; opt_state comes from
  jax.eval_shape(tx.init) on params laid out like the optimizer.
  """

  fn: Callable[[Tree, Tree, Tree], tuple[Tree, Tree, jax.Array]]
  loss_fn: Callable[[Tree, Tree], jax.Array]
  params: Tree
  grads: Tree
  opt_state: Tree
  batch: Tree
  param_names: Tree  # logical axis names per param leaf
  model: Any  # models.params.module_class(cfg)
  rules: AxisRules
  vocab_padding: int  # rows added so Y divides the vocabulary, as Megatron does
  grad_accum: int = 1  # micro-batches per step
  micro_batch: Tree = None  # one micro-batch's abstract arrays
  microbatches: int = 1  # a pipeline's, inside the loss (models.pipeline)
  stages: int = 1  # pipeline stages
  schedule: str = "gpipe"  # the pipeline schedule (simulator.memory.schedule)

  @property
  def args(self) -> tuple[Tree, Tree, Tree]:
    return self.params, self.opt_state, self.batch


def make_model(cfg: ModelConfig, settings: TrainSettings, rules: AxisRules):
  """The decoder, or the encoder-decoder, for these settings."""
  staged = ({"stages": settings.pp, "microbatches": settings.microbatches}
            if settings.pp > 1 else {})  # models.pipeline
  return module_class(cfg)(
      cfg, rules=rules, remat=settings.remat, attention=settings.attention,
      loss_chunks=settings.loss_chunks,
      param_dtype=PRECISION[settings.precision].param_dtype,
      lora=(settings.lora_rank, tuple(settings.lora_targets)),
      quant=settings.base_quant,
      **({"capacity_factor": settings.capacity_factor} if cfg.moe else {}),
      **({"tower_replicated": settings.vision_sharding == "replicated"}
         if cfg.vision else {}),
      **staged)


def params_and_names(model, settings: TrainSettings) -> tuple[Tree, Tree]:
  """The model's abstract parameters and the logical axis names they are
  laid out by (a replicated vision tower's by none)."""
  leaves, names = abstract_params(model)
  if settings.vision_sharding == "replicated":
    names = replicated_tower(names)
  return leaves, names


def batch_shapes(cfg: ModelConfig, settings: TrainSettings,
                 rules: AxisRules) -> dict[str, tuple[tuple[int, ...], Any, P]]:
  """Token ids and targets (an encoder-decoder's: encoder ids of `seq`,
  decoder ids and targets of `decoder_seq`); for the embedding-free XXL
  stack, activations. The keys are the model's keyword arguments."""
  b, s = settings.batch, settings.seq
  ids = lambda length: ((b, length), jnp.int32,
                        rules.spec("activations", ("batch", "length")))
  tokens = ids(s)
  if cfg.encoder_decoder:
    target = ids(settings.decoder_seq)
    return {"inputs": tokens, "decoder_inputs": target, "targets": target}
  if cfg.vision:  # pixels, as a processor hands them over (bf16)
    images = ((b, settings.images, cfg.image_size, cfg.image_size, 3),
              jnp.bfloat16, rules.spec("activations", ("batch",)))
    return {"inputs": tokens, "images": images, "targets": tokens}
  if cfg.embeddings:
    return {"inputs": tokens, "targets": tokens}
  acts = ((b, s, cfg.d_model), jnp.bfloat16, rules.spec("activations",
                                                          RESIDUAL))
  return {"inputs": acts, "targets": acts}


def device_shape(x) -> tuple[int, ...]:
  """Per-device shape of an aval or ShapeDtypeStruct; unsharded values (e.g.
  optax's scalar step counts from eval_shape) are whole on every device."""
  sharding = getattr(x, "sharding", None)
  if sharding is None or not hasattr(sharding, "shard_shape"):
    return tuple(x.shape)
  resize = mesh_class.current()  # another mesh of the traced one's class
  if resize is not None and hasattr(sharding, "spec"):
    return resize.shard_shape(tuple(x.shape), sharding.spec)
  return tuple(sharding.shard_shape(tuple(x.shape)))


def device_bytes(x) -> int:
  return math.prod(device_shape(x)) * np.dtype(x.dtype).itemsize


def _sds(shape, dtype, mesh, spec, memory_kind=None) -> jax.ShapeDtypeStruct:
  return jax.ShapeDtypeStruct(shape, dtype, sharding=NamedSharding(
      mesh, spec, memory_kind=memory_kind))


def _in_memory(tree: Tree, kind: str) -> Tree:
  """`tree` moved to memory `kind` ("device" or "pinned_host"): a
  device_put the traced program shows and XLA's host offloading runs."""
  return jax.tree.map(lambda x: jax.device_put(
      x, jax.typeof(x).sharding.update(memory_kind=kind)), tree)


def check_divisible(path: str, shape, spec: P, mesh) -> None:
  for dim, entry in zip(shape, spec):
    axes = mesh_class.entry_axes(entry)
    size = math.prod(mesh.shape[a] for a in axes)
    if dim % size:
      axis = "x".join(axes)
      raise PlanError(
          f"{path}: dimension {dim} is sharded over {axis}={size},"
          f" which does not divide it; choose {axis} dividing {dim}")


def pad_vocab(cfg: ModelConfig, rules: AxisRules,
              mesh) -> tuple[ModelConfig, int]:
  """Pad the vocabulary so its mesh axis divides it (Megatron does the same).

  Other dims that a mesh axis does not divide are rejected instead: padding
  heads or the MLP would change the model.
  """
  axis = dict(rules.params)["vocab"]
  size = mesh.shape[axis] if axis else 1
  if not cfg.embeddings or cfg.vocab_size % size == 0:
    return cfg, 0
  padding = -cfg.vocab_size % size
  return dataclasses.replace(cfg, vocab_size=cfg.vocab_size + padding), padding


def kv_heads_note(cfg: ModelConfig, y: int, training: bool = True) -> str:
  """What a report says when `kv_heads_replicated` (a training report also
  how their gradients are summed; a serving one, the cache)."""
  return (f"kv heads replicated over Y={y}: Y does not divide the "
          f"{cfg.n_kv_heads} kv head(s), so every Y shard holds all of them "
          f"and {cfg.n_heads // y} of the {cfg.n_heads} query heads (as MaxText"
          f" does); " + ("their gradients are all-reduced over Y" if training
                         else "each shard's KV cache holds every kv head too"))


def _replicate_kv_heads(rules: AxisRules) -> AxisRules:
  for table in ("params", "compute", "activations"):
    rules = rules.replace(table, kv_heads=None)
  return rules


def lay_out_params(leaves: Tree, names: Tree, rules: AxisRules,
                   mesh) -> Tree:
  """ShapeDtypeStructs with the rules' stored (`params` table) shardings."""

  def one(path, leaf, logical):
    spec = rules.spec("params", logical)
    check_divisible("params/" + jax.tree_util.keystr(path, simple=True,
                                                      separator="/"),
                     leaf.shape, spec, mesh)
    return _sds(leaf.shape, leaf.dtype, mesh, spec)

  return jax.tree_util.tree_map_with_path(one, leaves, names)


def step_rules(cfg: ModelConfig, settings: TrainSettings, mesh,
               base_rules: AxisRules = FSDP_TP
               ) -> tuple[AxisRules, AxisRules, AxisRules]:
  """The rules for params, the optimizer's slice and grads on `mesh`: what X
  shards per shard mode, and kv heads replicated where Y does not divide
  them (`kv_heads_replicated`)."""
  shard = settings.shard
  if cfg.moe and settings.expert_axis == "x":
    base_rules = expert_rules(base_rules, "X")
  if settings.pp > 1:  # the layer stack's stage dim (models.pipeline)
    for table in ("params", "compute", "activations"):
      base_rules = base_rules.replace(table, stage="P")
  if dict(mesh.shape).get("D", 1) > 1:  # replicas split the batch with X
    base_rules = base_rules.replace(
        "activations", batch=("D", dict(base_rules.activations)["batch"]))
  return tuple(mesh_rules(cfg, rules_for(fsdp, base_rules), mesh)
               for fsdp in (shard == "zero3", shard != "dp",
                            shard in ("zero2", "zero3")))


def mesh_rules(cfg: ModelConfig, rules: AxisRules, mesh) -> AxisRules:
  """`rules` with the kv heads replicated where Y does not divide them
  (`kv_heads_replicated`); PlanError where Y divides neither the kv heads
  nor the query heads per kv head."""
  y = mesh.shape["Y"]
  if not kv_heads_replicated(cfg, y):
    return rules
  check_heads_over_y(cfg, y)
  return _replicate_kv_heads(rules)


def build_step(cfg: ModelConfig, settings: TrainSettings, mesh,
               base_rules: AxisRules = FSDP_TP) -> Step:
  """Abstract arguments and the step function for `mesh` (abstract or real)."""
  cfg = with_images(cfg, settings)
  check_seq(cfg, settings)
  check_model_settings(cfg, settings)
  check_pipeline(cfg, settings, mesh.size)
  if dict(mesh.shape).get("P", 1) != settings.pp:
    raise PlanError(f"pp={settings.pp} needs a mesh with P={settings.pp}; "
                    f"this mesh is {dict(mesh.shape)}")
  rules, opt_rules, grad_rules = step_rules(cfg, settings, mesh, base_rules)
  cfg, vocab_padding = pad_vocab(cfg, rules, mesh)
  model = make_model(cfg, settings, rules)
  shapes = batch_shapes(cfg, settings, rules)
  accum = settings.grad_accum
  split, flag = ((accum, "grad_accum") if settings.pp == 1 else
                 (settings.microbatches, "microbatches"))
  for key, (shape, _, spec) in shapes.items():
    check_divisible(f"batch {key} {shape}", shape, spec, mesh)
    micro_shape = (shape[0] // split, *shape[1:])
    check_divisible(f"micro-batch {key} {micro_shape} ({flag}={split})",
                     micro_shape, spec, mesh)

  leaves, names = params_and_names(model, settings)
  trainable = trainable_paths(leaves, settings)
  train_leaves = _subtree(leaves, trainable)
  train_names = _subtree(names, trainable,
                         is_leaf=lambda x: isinstance(x, tuple))

  params = lay_out_params(leaves, names, rules, mesh)
  grads, opt_params = (lay_out_params(train_leaves, train_names, r, mesh)
                       for r in (grad_rules, opt_rules))
  specs = lambda tree: jax.tree.map(lambda x: x.sharding.spec, tree)
  param_specs = specs(_subtree(params, trainable))
  grad_specs, opt_specs = specs(grads), specs(opt_params)
  batch = {k: _sds(s, d, mesh, spec) for k, (s, d, spec) in shapes.items()}
  micro_batch = {k: _sds((s[0] // accum, *s[1:]), d, mesh, spec)
                 for k, (s, d, spec) in shapes.items()}
  tx = make_optimizer(settings.optimizer, settings.precision)
  with jax.sharding.use_abstract_mesh(_abstract(mesh)):
    opt_state = jax.eval_shape(tx.init, opt_params)
  on_host = lambda tree: jax.tree.map(lambda x: _sds(
      x.shape, x.dtype, mesh, getattr(x.sharding, "spec", P()), HOST), tree)
  if "optimizer" in settings.offload:  # kept in host memory between steps
    opt_state = on_host(opt_state)
  if "params" in settings.offload:
    params = on_host(params)

  def loss_fn(p, batch):
    return model.apply({"params": p}, **batch)

  def reshard_tree(tree, tree_specs):
    return jax.tree.map(jax.sharding.reshard, tree, tree_specs)

  def loss_and_grads(p, train, batch):
    """Over the whole batch, or summed over grad_accum micro-batches in a
    loop whose carry is the accumulated gradient."""
    value = jax.value_and_grad(
        lambda t, b: loss_fn(_merged(p, t, trainable), b))

    def one(b):  # zero2/3: the gradient reduce-scatter, per micro-batch
      loss, g = value(train, b)
      if "params" in settings.offload:  # made where the params live
        g = _in_memory(g, "device")
      return loss, reshard_tree(g, grad_specs)

    if accum == 1:
      return one(batch)
    micro = jax.tree.map(_micro_batches(accum), batch)
    first = one(jax.tree.map(lambda x: x[0], micro))

    def add(carry, b):
      loss, g = one(b)
      return (carry[0] + loss, jax.tree.map(jnp.add, carry[1], g)), None

    with jax.named_scope(scopes.ACCUMULATION):
      (loss, g), _ = jax.lax.scan(add, first,
                                  jax.tree.map(lambda x: x[1:], micro))
    return loss / accum, jax.tree.map(lambda x: x / accum, g)

  def step(p, opt_state, batch):
    train = _subtree(p, trainable)  # the base stays as it is (LoRA)
    loss, g = loss_and_grads(p, train, batch)  # layers fetch their params
    if "params" in settings.offload:  # the update runs on the device
      train = _in_memory(train, "device")
    p_opt = reshard_tree(train, opt_specs)  # zero1/2: this device's slice
    if "optimizer" in settings.offload:
      opt_state = _in_memory(opt_state, "device")
    updates, opt_state = tx.update(reshard_tree(g, opt_specs), opt_state,
                                   p_opt)
    if "optimizer" in settings.offload:
      opt_state = _in_memory(opt_state, HOST)
    new_p = optax.apply_updates(p_opt, updates)
    new_p = reshard_tree(new_p, param_specs)  # ZeRO all-gather
    if "params" in settings.offload:
      new_p = _in_memory(new_p, HOST)
    return _merged(p, new_p, trainable), opt_state, loss

  return Step(step, loss_fn, params, grads, opt_state, batch, names, model,
              rules, vocab_padding, accum, micro_batch,
              settings.microbatches, settings.pp, settings.schedule)


def _micro_batches(accum: int) -> Callable[[jax.Array], jax.Array]:
  """[B, ...] -> [accum, B/accum, ...], micro-batch j the rows i·accum + j:
  each device splits the rows it holds, so no data moves."""
  def split(x: jax.Array) -> jax.Array:
    shape = (x.shape[0] // accum, accum, *x.shape[1:])
    if jax.sharding.get_abstract_mesh().empty:
      return jnp.moveaxis(jnp.reshape(x, shape), 1, 0)
    spec = tuple(jax.typeof(x).sharding.spec)
    spec += (None,) * (x.ndim - len(spec))
    y = jnp.reshape(x, shape, out_sharding=P(spec[0], None, *spec[1:]))
    return jnp.moveaxis(y, 1, 0)
  return split


def trainable_paths(params: Tree, settings: TrainSettings) -> set:
  """The paths of the parameters the step trains: every one, or with
  `lora_rank` the adapters alone (the base is frozen: no gradient, no
  optimizer state); a vision tower only with `train_vision`."""
  paths = [path for path, _ in jax.tree_util.tree_flatten_with_path(params)[0]
           if settings.train_vision or path[0].key != "vision_tower"]
  if not settings.lora_rank:
    return set(paths)
  return {p for p in paths
          if any(str(getattr(k, "key", k)).startswith("lora_") for k in p)}


def _subtree(tree: Tree, paths: set, is_leaf=None) -> Tree:
  """The leaves of `tree` at `paths`, as a nested dict of the same keys."""
  out: dict = {}
  for path, leaf in jax.tree_util.tree_flatten_with_path(tree,
                                                          is_leaf=is_leaf)[0]:
    if path in paths:
      node = out
      for k in path[:-1]:
        node = node.setdefault(k.key, {})
      node[path[-1].key] = leaf
  return out


def _merged(tree: Tree, sub: Tree, paths: set) -> Tree:
  """`tree` with its leaves at `paths` taken from `sub` (same order)."""
  taken = dict(jax.tree_util.tree_flatten_with_path(sub)[0])
  flat, treedef = jax.tree_util.tree_flatten_with_path(tree)
  return jax.tree_util.tree_unflatten(
      treedef, [taken.get(path, leaf) if path in paths else leaf
                for path, leaf in flat])


def trainable_params(step: Step) -> int:
  """How many parameters the step trains (its gradients' elements)."""
  return sum(math.prod(g.shape) for g in jax.tree.leaves(step.grads))


def _abstract(mesh):
  return getattr(mesh, "abstract_mesh", mesh)
