"""Per-device HBM by category, read off the traced program (never a hand formula).

Every figure is a traced shape times its NamedSharding's per-device shape
(`sharding.shard_shape`) times the dtype's itemsize:

  params       step.params (stored layout: X-sharded under zero3, TP over Y).
  grads        step.grads (after reduce-scatter: X-sharded under zero2/zero3).
  optimizer    step.opt_state = jax.eval_shape(tx.init) of the real optax
               optimizer (moments, Adafactor factors, master copy, counters).
  activations  the residuals JAX saves for backward under the remat policy
               (`fused_residuals` of the loss), scan-stacked ones with their
               leading layers dim; plus the batch arguments (inputs, targets;
               also reported alone as `batch_bytes`). Residuals "from the
               argument ..." are params or batch, already counted, and skipped.
               Offloaded residuals (memory space host) go to `host_bytes`.
               The final norm's f32 intermediates (after the layer scan) are
               fused by XLA and left out.
  logits       the loss's live set in its backward, as XLA keeps it: one f32
               logits-shaped buffer (the loss's elementwise residuals, exp,
               the one-hot compare and the select, are functions of the
               logits matmul output that XLA fuses into their consumers, and
               d(logits) is computed in place into that buffer), the row
               statistics, the output projection's weight gradient (f32,
               compute layout) and, with loss_chunks > 1, the saved chunk
               inputs plus one chunk's logits recomputed in the backward.
  temporaries  the transient of the worst (any: blocks are identical) layer's
               backward: its recomputed activations (one Block traced alone
               with remat none, only the residuals XLA keeps as buffers, see
               simulator.trace.fused_residuals, minus what the policy saved
               for it), its weights gathered into the compute layout (unless
               saved; one layer's worth: XLA prefetches the next layer's
               gather as the current layer's weights die), and one weight's
               gradient in the compute layout before its reduce-scatter (XLA
               makes and scatters them one at a time). Also the embedding
               lookup's whole-table gradient, live only in the embedding's
               backward.
  param_casts  every layer's weight shards cast to the compute dtype, when
               stored wider: XLA hoists the layer loop's cast out of the loop
               and casts the whole stack once, live through the forward and
               the layers' backward.

The peak is liveness-aware, not a sum of the categories. Arguments (params +
optimizer + batch + their TPU tile padding, `tile_padding_bytes`; see
`tpu_tiled_bytes`, off TPU none) are live throughout. On top, the step's
transient live set is the largest of its phases (`phase_bytes`):

  loss             residuals (activations - batch) + param_casts + logits:
                   every layer's residuals are still saved while the loss
                   runs forward and backward; no layer gradient exists yet.
  layers_backward  residuals + grads + temporaries + param_casts, less the
                   residuals saved only for what runs after the layer scan
                   (final norm, output projection, loss: `top_only`, freed
                   once their backward is done, before the layers'): at the
                   last layer's backward (the first one run) every layer's
                   residuals are live, the scan's stacked gradient buffer is
                   allocated whole, and one layer's transient is on top.
  embedding_backward  grads + the lookup's table gradient.
  On a 1-D mesh XLA makes the output projection's weight gradient after the
  layers' backward (`defers_output_grad`), and the f32 logits buffer it is
  made from is live in layers_backward and embedding_backward too. Untied
  embeddings: it comes once the lookup's table gradient is reduced, in a
  last phase, output_projection_backward (grads + logits buffer + itself);
  tied: it is summed with the lookup's gradient, in embedding_backward.
  (the optimizer update holds grads plus fused elementwise temporaries, below
  layers_backward.)

  compiled_comparable_peak = arguments + max(phases): what XLA's
               memory_analysis peak (its heap simulation of the schedule)
               measures; simulator.compiled.compare compares this figure, and
               simulator.xla_peak lists the buffers behind XLA's.
  overhead     OVERHEAD_FRACTION of compiled_comparable_peak: runtime and
               allocator fragmentation, which XLA's static figure does not
               contain; kept as its own category for planning only.
  peak         compiled_comparable_peak + overhead: what to plan HBM with
               (fits, headroom_bytes and eta_mem use it).

To compare with XLA's compiled memory_analysis: argument bytes = params +
optimizer + batch_bytes + tile_padding_bytes (`arguments_bytes`, exact on TPU);
temp bytes ≈ compiled_comparable_peak - arguments_bytes; peak ≈
compiled_comparable_peak.

Batch rescaling: every tensor's bytes are either fixed or linear in the
global batch at fixed mesh (per-device batch = batch / shards). The step is
traced once, at the probe batch (simulator.batch_probe), which tells the two
apart by shape; `estimate_memory` returns the estimate at the probe batch and
`estimate.at_batch(b)` is exact for any b the mesh divides, without
retracing (`memory_report` does both).
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from typing import Any, Iterable

import flax.linen as nn
import jax
import jax.numpy as jnp
from jax.sharding import NamedSharding, PartitionSpec as P

from meshes.layout import MeshPlan, abstract_mesh
from models import scopes, transformer
from models.config import ModelConfig
from models.remat import policy as remat_policy
from simulator.batch_probe import carries_batch, require_probe, rescale
from simulator.settings import TrainSettings
from simulator.step import device_bytes, device_shape
from simulator.trace import (Residual, Traced, fused_residuals, read_inputs,
                             trace_probe)

# Runtime and fragmentation overhead as a fraction of the compiled-comparable
# peak. Seed 001 gives 5-20% ("typically"), and its worked estimator uses 10%;
# XLA's compiled peak contains none of it, so it is reported apart (the
# `overhead` category, inside `peak`) and left out of the compared figure.
# A named, documented default rather than a measured figure.
OVERHEAD_FRACTION = 0.10

CATEGORIES = ("params", "grads", "optimizer", "activations", "logits",
              "temporaries", "param_casts", "overhead", "peak")
TOP_CONTRIBUTORS = 5


@dataclasses.dataclass(frozen=True)
class Tensor:
  """One accounted value: bytes = fixed + linear * (batch / traced batch)."""

  category: str  # a CATEGORIES entry, or "host"
  name: str
  shape: tuple[int, ...]  # per device, at the traced batch
  dtype: str
  fixed: int
  linear: int
  # Saved for the backward of what runs after the layer scan (final norm,
  # output projection, loss): used and freed before the layers' backward.
  top_only: bool = False
  # What `_phases` places in time: "logits_buffer" (the loss's f32 logits),
  # "output_grad" (the output projection's weight gradient; with tied
  # embeddings "tied_output_grad") or "lookup_grad" (the embedding lookup's
  # table gradient).
  role: str = ""

  def bytes_at(self, scale_num: int, scale_den: int) -> int:
    return self.fixed + self.linear * scale_num // scale_den


@dataclasses.dataclass(frozen=True)
class Contributor:
  name: str
  shape: tuple[int, ...]  # per device
  dtype: str
  bytes: int


@dataclasses.dataclass(frozen=True)
class MemoryEstimate:
  """Per-device bytes (ints) by category; see the module docstring."""

  per_device_bytes: dict[str, int]
  host_bytes: int  # offloaded residuals in pinned host memory, per device
  hbm_bytes: int  # the chip's (user-allocatable) HBM
  fits: bool
  headroom_bytes: int  # hbm_bytes - peak (negative: does not fit)
  eta_mem: float  # param bytes / peak
  batch_bytes: int  # the batch arguments, inside `activations`
  contributors: dict[str, tuple[Contributor, ...]]  # top tensors per category
  batch: int  # global batch in sequences
  batch_shards: int  # how many ways the batch is split (per-device batch = batch / this)
  tensors: tuple[Tensor, ...] = dataclasses.field(repr=False, default=())
  arguments_bytes: int = 0  # params + optimizer + batch + tile padding
  tile_padding_bytes: int = 0  # TPU tile padding of the arguments (in peak)
  compiled_comparable_peak: int = 0  # peak - overhead: what XLA's peak is
  phase_bytes: dict[str, int] = dataclasses.field(default_factory=dict)
  traced_batch: int = 0  # the batch `tensors` were traced at (the probe)
  output_grad_deferred: bool = False  # see `defers_output_grad`

  def at_batch(self, batch: int) -> "MemoryEstimate":
    """The same mesh and program at another global batch, without retracing."""
    if not isinstance(batch, int) or batch <= 0 or batch % self.batch_shards:
      raise ValueError(f"batch={batch!r} must be a positive multiple of "
                       f"{self.batch_shards} (the batch's shards)")
    return _assemble(self.tensors, batch, self.traced_batch, self.hbm_bytes,
                     self.batch_shards, self.output_grad_deferred)


# --------------------------------------------------------------------------
# Per-device bytes of one value.
# --------------------------------------------------------------------------


def _on_host(aval) -> bool:
  space = getattr(aval, "memory_space", None)
  return space is not None and "host" in str(space).lower()


def _leaves_with_names(tree, prefix: str) -> list[tuple[str, Any]]:
  flat, _ = jax.tree_util.tree_flatten_with_path(tree)
  return [(prefix + jax.tree_util.keystr(path, simple=True, separator="/"),
           leaf) for path, leaf in flat if hasattr(leaf, "shape")]


# --------------------------------------------------------------------------
# One layer and one loss chunk traced alone; TPU tile padding.
# --------------------------------------------------------------------------


def _mesh_of(traced: Traced):
  leaf = jax.tree.leaves(traced.step.params)[0]
  return leaf.sharding.mesh


def _sds(shape, dtype, mesh, spec) -> jax.ShapeDtypeStruct:
  return jax.ShapeDtypeStruct(tuple(shape), dtype,
                              sharding=NamedSharding(mesh, spec))


def _block_params(step, mesh):
  """One layer's params: the scan-stacked leaves without the layers dim."""
  def one(x):
    spec = tuple(x.sharding.spec) + (None,) * (len(x.shape) - len(x.sharding.spec))
    return _sds(x.shape[1:], x.dtype, mesh, P(*spec[1:]))
  return jax.tree.map(one, step.params["blocks"])


def layer_residuals(traced: Traced, remat: str = "none"
                    ) -> tuple[Residual, ...]:
  """What one Block saves for backward under `remat`, traced alone.

  The stacked residuals of the blocks scan are anonymous ("output of scan");
  this names each tensor by the op and line that made it.
  """
  step, mesh = traced.step, _mesh_of(traced)
  model = step.model
  cfg = model.cfg
  batch, seq = step.batch["inputs"].shape[:2]
  block_cls = transformer.Block
  if remat != "none":
    block_cls = nn.remat(transformer.Block, policy=remat_policy(remat),
                         prevent_cse=False)
  block = block_cls(cfg, model.rules, model.attention, model.dtype,
                    model.param_dtype)
  x = _sds((batch, seq, cfg.d_model), model.dtype, mesh,
           model.rules.spec("activations", transformer.RESIDUAL))

  def f(p, x):
    return block.apply({"params": p}, x, None)[0]

  with jax.sharding.use_abstract_mesh(mesh):
    return fused_residuals(f, _block_params(step, mesh), x)


def _loss_chunk_residuals(traced: Traced) -> tuple[Residual, ...]:
  """One loss chunk traced alone (what the chunked loss recomputes)."""
  step, mesh = traced.step, _mesh_of(traced)
  model, cfg = step.model, step.model.cfg
  batch, seq = step.batch["inputs"].shape
  seq //= model.loss_chunks
  rules = model.rules
  x = _sds((batch, seq, cfg.d_model), model.dtype, mesh,
           rules.spec("activations", transformer.GATHERED))
  w = _sds((cfg.d_model, cfg.vocab_size), model.dtype, mesh,
           rules.spec("compute", ("embed", "vocab")))
  t = _sds((batch, seq), jnp.int32, mesh,
           rules.spec("activations", ("batch", "length")))
  with jax.sharding.use_abstract_mesh(mesh):
    return fused_residuals(lambda x, w, t: transformer._loss(x, w, t, rules),
                           x, w, t)


# TPU arrays are stored in tiles: the two minor dims of a rank >= 2 array in
# (8, 128) tiles (second-minor 1, 2 or 4 when it is that small); a rank-1
# array of n elements in tiles of n rounded up to a power of two, at least
# 512 bytes and at most 1024 elements (f32[384]: T(512), f32[768] and
# f32[50257]: T(1024), bf16[24]: T(256), read off the compiled layouts of
# gpt2, llama and tiny steps); a scalar in one 512-byte tile. The compiler also picks which dims are minor (major_to_minor), to
# waste least: e.g. a (50257, 192) f32 shard is stored with 50257 minor.
# Checked leaf by leaf against the compiled input layouts (see
# simulator.compiled.layout_argument_bytes): exact on gpt2 (f32, bf16 master),
# tiny (f32, bf16) and llama2_7b shards on v5p.
_TILE_MINOR, _TILE_SECOND = 128, 8
_TILE_BYTES_1D = 512  # the least rank-1 tile (and a scalar's)
_TILE_MAX_1D = 1024  # elements


def tpu_tiled_bytes(shape: tuple[int, ...], dtype) -> int:
  """Bytes of one per-device array in the TPU's tiled layout."""
  itemsize = jnp.dtype(dtype).itemsize
  up = lambda x, t: -(-x // t) * t
  if len(shape) == 0:
    return _TILE_BYTES_1D
  if len(shape) == 1:
    n = shape[0]
    tile = min(max(1 << max(n - 1, 0).bit_length(), _TILE_BYTES_1D // itemsize),
               _TILE_MAX_1D)
    return up(n, tile) * itemsize
  best = None
  for i in range(len(shape)):  # i: the minor dim, j: the second-minor dim
    for j in range(len(shape)):
      if i == j:
        continue
      rest = math.prod(d for k, d in enumerate(shape) if k not in (i, j))
      second = shape[j]
      tile = _TILE_SECOND if second >= _TILE_SECOND else 1 << (
          max(second, 1) - 1).bit_length()
      size = rest * up(second, tile) * up(shape[i], _TILE_MINOR) * itemsize
      best = size if best is None else min(best, size)
  return best


def _padding_tensor(name: str, leaf, tiled: bool, batch: bool = False
                    ) -> Tensor:
  """The tile padding of one argument (0 off TPU).

  A batch argument's padding is not affine in the batch (its per-device
  batch dim is rounded to a tile): category "batch_padding" is recomputed
  from its shape, the leading dim scaled, at every batch (`_batch_padding`).
  """
  shape = device_shape(leaf)
  pad = tpu_tiled_bytes(shape, leaf.dtype) - device_bytes(leaf) if tiled else 0
  if batch:
    return Tensor("batch_padding" if tiled else "padding",
                  f"{name} tile padding", shape, str(leaf.dtype), 0, 0)
  return Tensor("padding", f"{name} tile padding", shape, str(leaf.dtype),
                pad, 0)


def _batch_padding(t: Tensor, batch: int, traced_batch: int) -> int:
  shape = rescale(t.shape, batch, traced_batch)
  return (tpu_tiled_bytes(shape, t.dtype)
          - math.prod(shape) * jnp.dtype(t.dtype).itemsize)


def _split(category: str, name: str, aval) -> Tensor:
  """A value of the probe-batch trace: all fixed or all linear bytes."""
  shape, nbytes = device_shape(aval), device_bytes(aval)
  linear = carries_batch(shape)
  return Tensor(category, name, shape, str(aval.dtype),
                0 if linear else nbytes, nbytes if linear else 0)


def _residual_tensor(category: str, r: Residual, prefix: str = "") -> Tensor:
  return _split(category, prefix + r.name, r.aval)


def _saved(residuals: Iterable[Residual]) -> list[Residual]:
  """Residuals that are not the function's own inputs (params and batch are
  arguments, counted as such)."""
  return [r for r in residuals if not r.argument]


def _is_blocks_scan(r: Residual) -> bool:
  """A stacked output of the layer stack: the scan the model runs under the
  models.scopes.LAYERS named scope."""
  return r.op == "scan" and r.under(scopes.LAYERS)


def _require_layer_stack(saved: list[Residual]) -> None:
  """The layer stack saves at least each layer's input for its backward; if
  no residual comes from it, the model did not declare it (models.scopes)."""
  if not any(_is_blocks_scan(r) for r in saved):
    raise ValueError(
        "the traced step has no layer stack: the memory model needs the "
        f"model's layers under jax.named_scope({scopes.LAYERS!r}) as one scan "
        "(see models.scopes)")


def _layer_weight_tensors(traced: Traced) -> list[tuple[str, tuple, str, int]]:
  """One layer's weights in the compute layout and dtype (what a gather makes).

  Matrices are cast to the model's compute dtype before the gather; norm
  scales and biases are used in f32 (models.layers.Norm) or the compute dtype.
  """
  step, mesh = traced.step, _mesh_of(traced)
  model = step.model
  out = []

  def one(path, leaf, logical):
    spec = model.rules.spec("compute", tuple(logical)[1:])
    dtype = model.dtype if len(leaf.shape) > 2 else jnp.float32
    sds = _sds(leaf.shape[1:], dtype, mesh, spec)
    name = "blocks/" + jax.tree_util.keystr(path, simple=True, separator="/")
    out.append((name, device_shape(sds), str(jnp.dtype(dtype)),
                device_bytes(sds)))

  jax.tree_util.tree_map_with_path(one, step.params["blocks"],
                                   step.param_names["blocks"])
  return out


def _batch_dependent(traced: Traced, tiled: bool = False) -> list[Tensor]:
  """The batch arguments and the loss's saved residuals (probe-batch trace)."""
  step, mesh = traced.step, _mesh_of(traced)
  model = step.model
  tensors: list[Tensor] = []
  for name, leaf in _leaves_with_names(step.batch, "batch/"):
    tensors.append(_split("activations", f"{name} (argument)", leaf))
    tensors.append(_padding_tensor(name, leaf, tiled, batch=True))
  logits_shape = None
  if model.cfg.embeddings:
    batch, seq = step.batch["inputs"].shape
    dlogits = _sds((batch, seq // model.loss_chunks, model.cfg.vocab_size),
                   jnp.float32, mesh,
                   model.rules.spec("activations", ("batch", "length", "vocab")))
    logits_shape = device_shape(dlogits)
  loss_residuals = []
  saved = _saved(traced.residuals)
  _require_layer_stack(saved)
  scans = [i for i, r in enumerate(saved) if _is_blocks_scan(r)]
  after_layers = scans[-1] + 1 if scans else 0  # residuals are in forward order
  for i, r in enumerate(saved):
    if _on_host(r.aval):
      category = "host"
    elif r.under(scopes.LOSS):
      loss_residuals.append(r)
      continue
    else:
      category = "activations"
    if r.fused and i >= after_layers:
      continue  # the final norm's f32 intermediates: fused into their users
    tensors.append(dataclasses.replace(_residual_tensor(category, r),
                                       top_only=i >= after_layers))
  tensors += _loss_live_set(loss_residuals, logits_shape, "")
  # Logits: with loss_chunks > 1, one chunk's residuals recomputed in the
  # backward (its d(logits) again lives in place of its logits buffer).
  if model.cfg.embeddings and model.loss_chunks > 1:
    tensors += _loss_live_set(
        _saved(_loss_chunk_residuals(traced)), logits_shape,
        f"one of {model.loss_chunks} loss chunks, recomputed: ")
  return tensors


def _fixed_linear(tensors: Iterable[Tensor]) -> tuple[int, int]:
  tensors = list(tensors)
  return sum(t.fixed for t in tensors), sum(t.linear for t in tensors)


_LAYER_CACHE: dict[tuple, int] = {}
_LAYER_CACHE_SIZE = 64


def _layer_linear_bytes(traced: Traced, remat: str) -> int:
  """Linear bytes of the buffers one Block, traced alone, saves for its
  backward under `remat` (residuals XLA fuses away and offloaded ones left
  out). Independent of the step's shard mode and optimizer, so a sweep traces
  it once per mesh and policy (cached on what it does depend on)."""
  step = traced.step
  m = step.model
  key = (remat, m.cfg, m.rules, m.attention, m.dtype, m.param_dtype,
         _mesh_of(traced), step.batch["inputs"].shape,
         tuple(str(x.sharding.spec)
               for x in jax.tree.leaves(step.params["blocks"])))
  if key not in _LAYER_CACHE:
    if len(_LAYER_CACHE) >= _LAYER_CACHE_SIZE:
      _LAYER_CACHE.clear()
    _LAYER_CACHE[key] = _fixed_linear(
        _residual_tensor("", r) for r in _saved(layer_residuals(traced, remat))
        if not r.fused and not _on_host(r.aval))[1]
  return _LAYER_CACHE[key]


def _one_layer(traced: Traced) -> tuple[int, int]:
  """(linear bytes one layer's backward recomputes, fixed bytes it kept).

  Recomputed: the buffers of one Block traced alone with nothing
  rematerialized, less those the step's remat policy saved for it (the same
  Block traced alone under the policy). Kept fixed bytes: the batch-free
  residuals the policy saved per layer (gathered weights), from the step's
  scan-stacked residuals.
  """
  n_layers = traced.step.model.cfg.n_layers
  remat = traced.step.model.remat
  recomputed = 0  # remat none: every layer's buffers are saved, none redone
  if remat != "none":
    recomputed = max(0, _layer_linear_bytes(traced, "none")
                     - _layer_linear_bytes(traced, remat))
  kept_fixed, _ = _fixed_linear(
      _residual_tensor("", r) for r in _saved(traced.residuals)
      if _is_blocks_scan(r) and not _on_host(r.aval))
  return recomputed, kept_fixed // n_layers


def _loss_live_set(residuals: list[Residual], logits_shape, prefix: str
                   ) -> list[Tensor]:
  """The loss's residuals as XLA keeps them.

  The jaxpr saves several logits-shaped values (exp(logits - max), the one-hot
  compare of an iota with the targets, the select): all elementwise functions
  of the one f32 logits matmul output, the iota and the targets. XLA
  materializes that matmul output once and fuses the rest into their
  consumers, and computes d(logits) (elementwise, its last use) in place into
  the same buffer. So: one f32 logits-shaped buffer (the largest such
  residual), and every residual of another shape (row statistics, chunk
  inputs) as traced. The others are kept with zero bytes, named.
  """
  out, kept = [], False
  by_size = sorted(residuals, key=lambda r: -device_bytes(r.aval))
  for r in by_size:
    t = _residual_tensor("logits", r, prefix)
    if logits_shape is not None and t.shape == tuple(logits_shape):
      if kept:
        t = dataclasses.replace(t, fixed=0, linear=0,
                                name=t.name + " [fused by XLA]")
      else:
        t = dataclasses.replace(t, name=t.name + " [the f32 logits buffer, "
                                "reused in place for d(logits)]",
                                role="logits_buffer" if not prefix else "")
        kept = True
    out.append(t)
  return out


# --------------------------------------------------------------------------
# The estimate.
# --------------------------------------------------------------------------


def _state_tensors(traced: Traced, tiled: bool = False) -> list[Tensor]:
  """Params, grads and optimizer state; an argument the step never reads
  (Adafactor's placeholder moments) is dropped by jit and left out."""
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
      out.append(Tensor(category, name, device_shape(leaf),
                        str(leaf.dtype), device_bytes(leaf), 0))
      if category != "grads":  # arguments only
        out.append(_padding_tensor(name, leaf, tiled))
  return out


def _output_weight_grad(traced: Traced) -> list[Tensor]:
  """The output projection's weight gradient, f32 in the compute layout.

  The loss backward's x^T·d(logits) is a matmul with an f32 result (the
  transpose of the preferred_element_type=f32 einsum) over the gathered
  [embed, vocab] layout; it is live with the logits buffer until it is cast
  and reduce-scattered into `grads`. Tied embeddings: the same shape, and
  it is summed with the lookup's table gradient into the one table gradient
  (role "tied_output_grad": the two are live together).
  """
  step, mesh = traced.step, _mesh_of(traced)
  model = step.model
  if not model.cfg.embeddings:
    return []
  w = _sds((model.cfg.d_model, model.cfg.vocab_size), jnp.float32, mesh,
           model.rules.spec("compute", ("embed", "vocab")))
  return [Tensor("logits", "output projection's weight gradient (f32, "
                 "compute layout)", device_shape(w), "float32",
                 device_bytes(w), 0, role="tied_output_grad"
                 if model.cfg.tie_embeddings else "output_grad")]


def _temporary_tensors(traced: Traced) -> list[Tensor]:
  """One layer's backward transient: the temporaries category."""
  recompute_linear, kept_fixed = _one_layer(traced)
  weights = _layer_weight_tensors(traced)
  layer_w = sum(b for *_, b in weights)
  # kept_fixed: the batch-free residuals the policy saved per layer, i.e. the
  # gathered weights kept for backward (remat none/dots), not gathered again.
  largest = max(weights, key=lambda w: w[3]) if weights else ("", (), "", 0)
  out = [Tensor("temporaries",
                "one layer's activations recomputed or reloaded in its backward "
                "(Block traced alone, remat none, minus what the policy kept)",
                (), "", 0, recompute_linear)]
  out.append(Tensor("temporaries",
                    f"one layer's weights gathered to the compute layout "
                    f"(largest {largest[0]})", largest[1], largest[2],
                    max(0, layer_w - kept_fixed), 0))
  out.append(Tensor("temporaries",
                    f"one weight's gradient before its reduce-scatter (compute "
                    f"layout, the largest: {largest[0]})", largest[1],
                    largest[2], largest[3], 0))
  return out


def _lookup_grad(traced: Traced) -> list[Tensor]:
  """The embedding lookup's table gradient: a scatter-add into the whole
  table as the lookup reads it (vocab replicated, models.transformer._lookup),
  in the compute dtype, before its all-reduce; made after the layers'
  backward (at the peak of gpt2 v5p-64 32x1: 73.7 MiB, bf16[50257,768])."""
  step, mesh = traced.step, _mesh_of(traced)
  model = step.model
  if not model.cfg.embeddings:
    return []
  table = _sds((model.cfg.vocab_size, model.cfg.d_model),
               model.dtype, mesh, model.rules.spec("activations",
                                                   (None, "embed")))
  return [Tensor("temporaries", "embedding table's gradient from the lookup "
                 "(whole vocab, compute dtype, before its all-reduce)",
                 device_shape(table), str(jnp.dtype(model.dtype)),
                 device_bytes(table), 0, role="lookup_grad")]


def _param_cast_tensors(traced: Traced) -> list[Tensor]:
  """Every layer's weight shards in the compute dtype, when stored wider.

  The layer loop casts its slice of the stacked weights before the gather;
  XLA hoists that cast out of the loop and casts the whole stack once (seen
  in the buffers at the peak of llama2_7b v5p-16 8x1 and v5p-512 64x4 and
  gpt2 v5p-8 1x4), so the cast stack is live from the forward loop to the
  end of the backward one.
  """
  step = traced.step
  model = step.model
  compute = jnp.dtype(model.dtype)
  out = []
  for name, leaf in _leaves_with_names(step.params["blocks"], "blocks/"):
    if len(leaf.shape) <= 2 or jnp.dtype(leaf.dtype) == compute:
      continue  # norm scales and biases are used in f32 (models.layers.Norm)
    shape = device_shape(leaf)
    out.append(Tensor("param_casts", f"{name} cast to {compute} (all layers)",
                      shape, str(compute),
                      math.prod(shape) * compute.itemsize, 0))
  return out


def defers_output_grad(plan: MeshPlan) -> bool:
  """Whether XLA makes the output projection's weight gradient after the
  layers' backward rather than right after the loss.

  Read off the compiled schedules (simulator.xla_peak live ranges of the
  logits buffer and the output projection's gradient against the backward
  layer loop) of sixteen configs: deferred on every 1-D mesh (llama2_7b 8x1,
  64x1; llama3_8b 16x1; gpt2 16x1, 1x4), not on 2-D ones (llama2_7b 4x2,
  16x2, 16x4, 64x4, 32x8; llama3_8b 8x4; gpt2 2x2, 4x2, 8x4) with one
  exception, llama3_8b 32x2 (deferred; validation matrix #22, +8.0%). Why
  is the TPU scheduler's; this is what it does, not a memory-minimizing
  choice we could derive (on 64x1 the other order would peak lower).
  """
  return plan.X == 1 or plan.Y == 1


def estimate_memory(traced: Traced, plan: MeshPlan) -> MemoryEstimate:
  """Per-device bytes by category for the step traced at the probe batch
  (simulator.trace.trace_probe) on `plan`'s chip, at that batch: call
  `at_batch` for a real one."""
  step = traced.step
  batch = step.batch["inputs"].shape[0]
  require_probe(batch, plan.X * plan.Y, "estimate_memory")
  per_device_batch = device_shape(step.batch["inputs"])[0]
  tiled = plan.topology.chip.kind == "tpu"
  tensors = _state_tensors(traced, tiled)
  tensors += _output_weight_grad(traced)
  tensors += _batch_dependent(traced, tiled)
  tensors += _temporary_tensors(traced)
  tensors += _param_cast_tensors(traced)
  tensors += _lookup_grad(traced)
  return _assemble(tuple(tensors), batch, batch, plan.topology.chip.hbm_bytes,
                   batch // per_device_batch, defers_output_grad(plan))


def _phases(totals: dict[str, int], residuals: int, top_only: int,
            by_role: dict[str, int], deferred: bool) -> dict[str, int]:
  """The transient live set of each phase (see the module doc); `deferred`:
  the output projection's weight gradient is made after the layers'
  backward, so the f32 logits buffer it is made from lives through it; with
  untied embeddings it comes after the lookup's table gradient is reduced
  (the two never live together: llama3_8b v5p-32 16x1), tied ones are
  summed into one table gradient (gpt2)."""
  casts = totals["param_casts"]
  lookup = by_role.get("lookup_grad", 0)
  layers = (residuals - top_only + totals["grads"] + totals["temporaries"]
            - lookup + casts)
  loss = residuals + casts + totals["logits"]
  end = totals["grads"] + lookup
  buffer = by_role.get("logits_buffer", 0)
  if not buffer or not deferred:  # chunked loss: made in the chunk loop
    return {"loss": loss, "layers_backward": layers, "embedding_backward": end}
  tied = by_role.get("tied_output_grad", 0)
  if tied:  # one table gradient, the sum of both
    return {"loss": loss - tied, "layers_backward": layers + buffer,
            "embedding_backward": end + buffer + tied}
  grad = by_role.get("output_grad", 0)
  return {"loss": loss - grad, "layers_backward": layers + buffer,
          "embedding_backward": end + buffer,
          "output_projection_backward": totals["grads"] + buffer + grad}


def _assemble(tensors: tuple[Tensor, ...], batch: int, traced_batch: int,
              hbm_bytes: int, shards: int, deferred: bool) -> MemoryEstimate:
  totals = {c: 0 for c in CATEGORIES}
  host = padding = 0
  by_category: dict[str, list[Contributor]] = {}
  batch_bytes = top_only = 0
  by_role: dict[str, int] = {}
  for t in tensors:
    b = t.bytes_at(batch, traced_batch)
    if t.category == "batch_padding":
      b = _batch_padding(t, batch, traced_batch)
      t = dataclasses.replace(t, category="padding")
    if t.category == "host":
      host += b
    elif t.category == "padding":
      padding += b
    else:
      totals[t.category] += b
    if t.category == "activations" and t.name.startswith("batch"):
      batch_bytes += b
    if t.top_only and t.category == "activations":
      top_only += b
    if t.role:
      by_role[t.role] = by_role.get(t.role, 0) + b
    if b:
      by_category.setdefault(t.category, []).append(
          Contributor(t.name, rescale(t.shape, batch, traced_batch), t.dtype,
                      b))
  arguments = totals["params"] + totals["optimizer"] + batch_bytes + padding
  phases = _phases(totals, totals["activations"] - batch_bytes, top_only,
                   by_role, deferred)
  comparable = arguments + max(phases.values())
  totals["overhead"] = int(comparable * OVERHEAD_FRACTION)
  totals["peak"] = comparable + totals["overhead"]
  peak = totals["peak"]
  contributors = {
      c: tuple(sorted(v, key=lambda x: -x.bytes)[:TOP_CONTRIBUTORS])
      for c, v in by_category.items()}
  return MemoryEstimate(
      per_device_bytes=totals, host_bytes=host, hbm_bytes=hbm_bytes,
      fits=peak <= hbm_bytes, headroom_bytes=hbm_bytes - peak,
      eta_mem=totals["params"] / peak if peak else 0.0,
      batch_bytes=batch_bytes, contributors=contributors, batch=batch,
      batch_shards=shards, tensors=tensors, arguments_bytes=arguments,
      tile_padding_bytes=padding, compiled_comparable_peak=comparable,
      phase_bytes=phases, traced_batch=traced_batch,
      output_grad_deferred=deferred)


def memory_report(cfg: ModelConfig, settings: TrainSettings,
                  plan: MeshPlan) -> MemoryEstimate:
  """Trace the step under `plan`'s abstract mesh and estimate its memory."""
  traced = trace_probe(cfg, settings, abstract_mesh(plan))
  return estimate_memory(traced, plan).at_batch(settings.batch)


SCHEMA_VERSION = 1


def to_json(estimate: MemoryEstimate) -> dict:
  """The stable JSON schema (all bytes are ints, per device):

  {"schema_version": 1,
   "per_device_bytes": {"params", "grads", "optimizer", "activations",
                        "logits", "temporaries", "param_casts", "overhead",
                        "peak"},
   "host_bytes": int, "hbm_bytes": int, "headroom_bytes": int,
   "fits": bool, "eta_mem": float, "batch": int, "batch_bytes": int,
   "overhead_fraction": float,
   "contributors": {category: [{"name", "shape", "dtype", "bytes"}, ...]}}
  """
  return {
      "schema_version": SCHEMA_VERSION,
      "per_device_bytes": {c: int(estimate.per_device_bytes[c])
                           for c in CATEGORIES},
      "host_bytes": int(estimate.host_bytes),
      "hbm_bytes": int(estimate.hbm_bytes),
      "headroom_bytes": int(estimate.headroom_bytes),
      "fits": bool(estimate.fits),
      "eta_mem": float(estimate.eta_mem),
      "batch": int(estimate.batch),
      "batch_bytes": int(estimate.batch_bytes),
      "overhead_fraction": OVERHEAD_FRACTION,
      "arguments_bytes": int(estimate.arguments_bytes),
      "tile_padding_bytes": int(estimate.tile_padding_bytes),
      "compiled_comparable_peak": int(estimate.compiled_comparable_peak),
      "phase_bytes": {k: int(v) for k, v in estimate.phase_bytes.items()},
      "contributors": {
          c: [{"name": x.name, "shape": list(x.shape), "dtype": x.dtype,
               "bytes": int(x.bytes)} for x in v]
          for c, v in estimate.contributors.items()},
  }
