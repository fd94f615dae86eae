"""Mesh search: enumerate X x Y (x P pipeline stages) x batch x remat x shard x
optimizer, evaluate, rank.

The expensive part of evaluating a config is tracing the step (~0.4 s for a 70B
model); everything per batch size is arithmetic. So the step is traced once per
(remat, shard, optimizer) and structural class of meshes (simulator.tracing.mesh_class:
the other meshes of the class are read off that trace at their own sizes, ~50
ms each, or traced where one is not provably in it), at the probe batch
(simulator.tracing.batch_probe), and each batch size rescales that memory estimate and
timing fit. A PlanError (raised while building the step: a dimension that Y or
X does not divide) cannot depend on remat, so it is cached per
(mesh, shard, optimizer) and the other remat policies fail without retracing.

Estimates come through simulator.group_estimate, the one adapter onto
simulator.memory and simulator.timing.roofline, imported (with the tracer and
jax) only when a config is not in the cache: a sweep read from its cache
imports neither. The cache keeps each group's records (one entry for its
batches) and its estimator (the trace as data: a sweep of other batches
reads it instead of tracing); with `workers` > 1 helper processes take
whole groups of a cold sweep (simulator.sweep_workers).
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import gc
import itertools
import math
import time
from typing import Any, Iterable, Iterator

from meshes.hardware import GiB
from meshes.layout import (MeshPlan, abstract_mesh, divisors, mesh_name,
                           mesh_shapes, plan_mesh)
from meshes.topology import Topology, parse_topology
from models.config import ModelConfig
from models.registry import load_model
from simulator.cache import Cache
from simulator.memory.capacity import (HBM_FRACTION, capacity_bytes,
                                       check_hbm_fraction, pool_share)
from simulator.model_checks import (PlanError, check_heads_over_y,
                                     check_model_settings, check_pipeline,
                                     check_stage_settings,
                                     check_seq, with_images)
from simulator.settings import TrainSettings, settings_from

KEY_FIELDS = ("X", "Y", "batch", "remat", "shard", "optimizer", "P", "D")
_OUTER = ("P", "D")  # fields a record from before them lacks: 1


@dataclasses.dataclass(frozen=True)
class Config:
  X: int
  Y: int
  batch: int
  remat: str
  shard: str
  optimizer: str
  P: int = 1  # pipeline stages (the mesh's third axis, meshes.layout)
  D: int = 1  # data-parallel replicas (a third axis too; not with P)

  @property
  def key(self) -> tuple:
    return tuple(getattr(self, f) for f in KEY_FIELDS)

  @property
  def trace_key(self) -> tuple:
    return (self.X, self.Y, self.remat, self.shard, self.optimizer, self.P,
            self.D)

  def label(self) -> str:
    return (f"{mesh_name(self.X, self.Y, self.P, self.D)} b{self.batch} "
            f"{self.remat} {self.shard} {self.optimizer}")


def record_key(record: dict) -> tuple:
  """A record's Config fields (a record from before pipeline stages or
  replicas: P=1, D=1)."""
  return tuple(record.get(f, 1) if f in _OUTER else record[f]
               for f in KEY_FIELDS)


def _records_of_group(entry: dict) -> dict[str, dict]:
  """A group's cache entry, {batch: record}, each a record of its batch;
  raises on anything else (the cache then recomputes the group)."""
  records = entry["records"]
  for batch, record in records.items():
    if Config(*record_key(record)).batch != int(batch):
      raise ValueError(f"a record of batch {record['batch']} under {batch}")
  return records


def record_mesh(record: dict) -> str:
  """'XxY', 'P2xXxY' with pipeline stages, 'D2xXxY' with replicas."""
  return mesh_name(record["X"], record["Y"], record.get("P", 1),
                   record.get("D", 1))


@dataclasses.dataclass(frozen=True)
class SweepSpec:
  """What to sweep. meshes=None means every factorization of the slice."""

  model: str
  topology: str
  batches: tuple[int, ...]
  remats: tuple[str, ...] = ("full",)
  shards: tuple[str, ...] = ("zero3",)
  optimizers: tuple[str, ...] = ("adamw",)
  seq: int = 2048
  target_seq: int = 0  # an encoder-decoder's decoder length; 0: seq
  attention: str = "flash"
  precision: str = "mixed"
  meshes: tuple[tuple[int, int], ...] | None = None
  grad_accum: int = 1
  lora_rank: int = 0
  lora_targets: tuple[str, ...] = ("q", "k", "v", "o")
  base_quant: str = "none"
  offload: tuple[str, ...] = ()
  moe_dispatch: str = "capacity"  # mixture of experts (models.moe)
  capacity_factor: float = 1.0
  expert_axis: str = "none"
  images_per_sample: int = 0  # a vision-language model's (models.vision)
  image_size: int = 0
  patch_size: int = 0
  train_vision: bool = False
  vision_sharding: str = "sharded"
  pps: tuple[int, ...] = (1,)  # pipeline stages to sweep (models.pipeline)
  dps: tuple[int, ...] = (1,)  # data-parallel replicas to sweep (--dp)
  microbatches: int = 1  # with pp > 1
  schedule: str = "gpipe"
  # Each plan's largest batch is the largest whose peak stays within this
  # share of the capacity (the playbook's 15-20% headroom; max_batch's).
  hbm_fraction: float = HBM_FRACTION

  def validate(self) -> tuple[ModelConfig, Topology]:
    """Raises ValueError naming the bad value, before any tracing."""
    cfg, topo = load_model(self.model), parse_topology(self.topology)
    for name in ("batches", "remats", "shards", "optimizers", "pps", "dps"):
      values = getattr(self, name)
      if not values:
        raise ValueError(f"{name} is empty; give at least one value")
      twice = [v for v in values if values.count(v) > 1]
      if twice:
        raise ValueError(f"{name}: {twice[0]} is given twice; give each "
                         "value once")
    check_hbm_fraction(self.hbm_fraction)
    pool_share(topo)  # a GPU's allocator pool share, from the environment
    for b in self.batches:
      if not isinstance(b, int) or b <= 0:
        raise ValueError(f"batch {b!r} must be a positive integer")
    for name, values in (("pp", self.pps), ("dp", self.dps)):
      for p in values:
        if not isinstance(p, int) or p <= 0 or topo.chips % p:
          raise ValueError(f"{name} {p!r} must be a positive divisor of "
                           f"{topo.name}'s {topo.chips} chips: "
                           f"{', '.join(map(str, divisors(topo.chips)))}")
    multiple = self.whole_micro_batches
    for r in self.remats:
      for s in self.shards:
        for o in self.optimizers:
          for p in self.pps:  # validates each value
            check_pipeline(cfg, self.settings(multiple, r, s, o, p),
                           topo.chips)
    first = self.settings(self.batches[0], self.remats[0], self.shards[0],
                          self.optimizers[0])
    check_seq(with_images(cfg, first), first)
    check_model_settings(cfg, first)
    for x, y in self.meshes or ():
      if not any(x * y * p * d == topo.chips for p, d in self.outer_sizes):
        plan_mesh(topo, x, y)  # its one-line error names the valid meshes
    return cfg, topo

  @property
  def whole_micro_batches(self) -> int:
    """The smallest batch (per X shard) that every swept step divides into
    whole micro-batches: gradient accumulation's and a pipeline's."""
    return math.lcm(self.microbatches, self.grad_accum)

  def settings(self, batch: int, remat: str, shard: str, optimizer: str,
               pp: int = 1) -> TrainSettings:
    staged = ({"pp": pp} if pp > 1 else
              {"pp": 1, "microbatches": 1, "schedule": "gpipe"})
    return settings_from({**dataclasses.asdict(self), "batch": batch,
                          "remat": remat, "shard": shard,
                          "optimizer": optimizer, **staged})

  @property
  def outer_sizes(self) -> list[tuple[int, int]]:
    """The (stages, replicas) swept: a plan has one or the other."""
    return [(p, d) for p in self.pps for d in self.dps if p == 1 or d == 1]

  def meshes_for(self, topo: Topology, outer: int) -> list[tuple[int, int]]:
    """The X x Y meshes under an outer axis of `outer` (stages or
    replicas): --mesh's where outer·X·Y is the chips, else every X x Y
    whose outer·X x Y mesh lays out (meshes.layout)."""
    if self.meshes:
      return [(x, y) for x, y in self.meshes if x * y * outer == topo.chips]
    return mesh_shapes(topo, outer)

  def configs(self, topo: Topology) -> list[Config]:
    """Ordered so each traced key's batch sizes are consecutive."""
    return [Config(x, y, b, r, s, o, p, d) for p, d in self.outer_sizes
            for x, y in self.meshes_for(topo, p * d) for s in self.shards
            for o in self.optimizers for r in self.remats for b in self.batches]


# --------------------------------------------------------------------------
# The sweep.
# --------------------------------------------------------------------------


@contextlib.contextmanager
def _gc_paused():
  """Tracing allocates millions of short-lived objects that the cyclic GC
  scans over and over (~20% of a trace); their cycles are collected after."""
  was_enabled = gc.isenabled()
  gc.disable()
  try:
    yield
  finally:
    if was_enabled:
      gc.enable()


class Sweep:
  """Evaluates configs, tracing once per trace key; `evaluate` yields records."""

  def __init__(self, spec: SweepSpec, cfg: ModelConfig | None = None,
               topo: Topology | None = None, cache: Cache | None = None,
               share_traces: bool = True, workers: int = 1):
    """share_traces=False traces every mesh (to check the classes);
    workers: processes evaluating (this one and helpers), `evaluate`'s."""
    if cfg is None or topo is None:
      cfg, topo = spec.validate()
    self.spec, self.cfg, self.topo = spec, cfg, topo
    self.share_traces = share_traces
    self.workers = workers
    self.cache = cache or Cache(None)
    self._estimators: dict[tuple, Any] = {}
    self._build_errors: dict[tuple, str] = {}
    # (remat, shard, optimizer, class key) -> [(traced step, its plan)]
    self._classes: dict[tuple, list] = {}
    self.traces = 0  # steps traced
    self.groups_cached = 0  # group estimators read from the cache
    self.records_cached = 0  # records read from the cache
    self._fresh: dict[str, Any] = {}  # cache key -> a group built here
    # The cache's records by their group's key (`cached`), and the groups
    # with records made here and not yet written.
    self._records: dict[str, dict[str, dict]] = {}
    self._record_keys: dict[tuple, str] = {}
    self._unkept: set[str] = set()
    self.read_off = 0  # (mesh, remat, ...) groups read off a class's trace
    # Where evaluating went, seconds: "trace" (the traces), "estimate" (the
    # program walks and heap simulations of every group), for benchmarks.
    self.seconds: collections.Counter = collections.Counter()
    # What every config's cache key shares, made once (asdict is not free).
    # On a GPU what a plan may use turns on the allocator pool's share of
    # the device (capacity.mem_fraction), which the
    # records' verdicts and the groups' estimates hold.
    self._key_parts = dict(
        model=dataclasses.asdict(cfg), topology=topo.name,
        memory_fraction=pool_share(topo),
        spec={k: v for k, v in dataclasses.asdict(spec).items() if k not in (
            "batches", "remats", "shards", "optimizers", "meshes")})

  def cache_key(self, c: Config, kind: str) -> str:
    """Everything a config's compile is a function of (its record's:
    `_records_key`)."""
    return self.cache.key(kind=kind, **self._key_parts,
                          config=dataclasses.asdict(c))

  def _estimator(self, c: Config, cached: bool = True):
    """The config's group estimator (or the ValueError building it gave):
    read from the cache, where an earlier sweep kept it (the trace as
    data), unless `cached` is False; else built here, traced or read off
    its class's trace, and kept by `keep`."""
    if c.trace_key not in self._estimators or not cached:
      build_key = (c.X, c.Y, c.shard, c.optimizer, c.P, c.D)
      if build_key in self._build_errors:
        self._estimators[c.trace_key] = ValueError(self._build_errors[build_key])
      else:
        plan = plan_mesh(self.topo, c.X, c.Y, P=c.P, D=c.D)
        # Any valid batch: trace_probe replaces it with the probe batch.
        settings = self.spec.settings(c.D * c.X * self.spec.whole_micro_batches,
                                      c.remat, c.shard, c.optimizer, c.P)
        key = self._group_key(c, settings)
        from simulator.group_estimate import GroupEstimate
        est = (self.cache.get_object("groups", key, GroupEstimate)
               if cached and key else None)
        if est is not None:
          self.groups_cached += 1
        else:
          try:
            # A mesh its heads refuse, found without tracing (the step's
            # build would raise the same PlanError).
            check_heads_over_y(with_images(self.cfg, settings), c.Y)
            check_stage_settings(settings)
            with _gc_paused():
              est = self._estimate(c, plan, settings)
            if key:
              self._fresh[key] = est
          except ValueError as e:
            if isinstance(e, PlanError):
              self._build_errors[build_key] = str(e)
            est = e
        self._estimators[c.trace_key] = est
    return self._estimators[c.trace_key]

  def _group_key(self, c: Config, settings: TrainSettings) -> str | None:
    """What a group's estimator is a function of: the model, topology,
    mesh and settings but the batch (None: no cache)."""
    if not self.cache.directory:
      return None
    return self.cache.key(
        kind="group", model=self._key_parts["model"], topology=self.topo.name,
        memory_fraction=self._key_parts["memory_fraction"],
        mesh=(c.X, c.Y, c.P, c.D),
        settings={k: v for k, v in dataclasses.asdict(settings).items()
                  if k != "batch"})

  def keep(self) -> None:
    """Puts what this sweep made and has not kept yet into the cache: its
    records, and its group estimators with what is live at each peak the
    sweep asked for (points.Points as data)."""
    self._keep_records()
    for key, est in self._fresh.items():
      self.cache.put_object("groups", key, est)
    self._fresh.clear()

  def _values(self, c: Config) -> tuple[Any, dict[str, Any]]:
    """The config's group estimator and its figures at the config's batch;
    a group from the cache that never walked this batch's peak is traced
    again (one built here answers every batch)."""
    for cached in (True, False):
      est = self._estimator(c, cached)
      if isinstance(est, Exception):
        raise est
      values = est.at(c.batch)
      if values is not None:
        return est, values
    raise AssertionError("a group built here answers every batch")

  def _estimate(self, c: Config, plan: MeshPlan,
                settings: TrainSettings):
    """Read off a trace of a mesh of the same structural class
    (simulator.tracing.mesh_class) when the mesh is provably in its class; else
    traced, and kept for the class too (a trace whose shard_map dims are
    ambiguous cannot be read at some meshes that another can)."""
    # pylint: disable=g-import-not-at-top  (the estimators and jax: module doc)
    from simulator.group_estimate import GroupEstimate
    from simulator.tracing import mesh_class
    from simulator.tracing.trace import trace_probe
    group = (c.remat, c.shard, c.optimizer,
             mesh_class.class_key(self.cfg, settings, plan)
             if self.share_traces else (c.X, c.Y, c.P, c.D))
    for traced, traced_plan in self._classes.get(group, ()):
      try:
        with self._timed("estimate"):
          resize = mesh_class.resize_for(traced, traced_plan, plan)
          estimator = GroupEstimate(self.cfg, traced, plan, settings, resize)
      except mesh_class.NotInClass:
        continue
      self.read_off += 1
      return estimator
    with self._timed("trace"):
      traced = trace_probe(self.cfg, settings, abstract_mesh(plan))
    self.traces += 1
    self._classes.setdefault(group, []).append((traced, plan))
    with self._timed("estimate"):
      return GroupEstimate(self.cfg, traced, plan, settings)

  @contextlib.contextmanager
  def _timed(self, what: str):
    start = time.perf_counter()
    try:
      yield
    finally:
      self.seconds[what] += time.perf_counter() - start

  def evaluate_one(self, c: Config) -> dict[str, Any]:
    """The config's record: from the cache, or evaluated (and kept)."""
    record = self.cached(c)
    if record is None:
      record = self._evaluate(c)
      if self.cache.directory:
        key = self._records_key(c)
        self._records[key][str(c.batch)] = record
        self._keep_records(but=key)
        self._unkept.add(key)
    return record

  def cached(self, c: Config) -> dict[str, Any] | None:
    """The config's record if the cache has it. The records of a mesh,
    remat, shard and optimizer (their batches) are one entry: a sweep
    writes one file per group, not one per config (creating a file cost
    0.4-0.8 ms here, as much as evaluating a config from a kept trace)."""
    if not self.cache.directory:
      return None
    key = self._records_key(c)
    if key not in self._records:
      self._records[key] = self.cache.get("records", key,
                                          _records_of_group) or {}
    record = self._records[key].get(str(c.batch))
    self.records_cached += record is not None
    return record

  def _records_key(self, c: Config) -> str:
    """Everything a config's record is a function of, but its batch."""
    if c.trace_key not in self._record_keys:
      self._record_keys[c.trace_key] = self.cache.key(
          kind="records", **self._key_parts,
          config={k: v for k, v in dataclasses.asdict(c).items()
                  if k != "batch"})
    return self._record_keys[c.trace_key]

  def _keep_records(self, but: str | None = None) -> None:
    """Writes the records made here of every group but `but`'s (the sweep
    goes on with that one)."""
    for key in [k for k in self._unkept if k != but]:
      # Another sweep of other batches may have kept this group meanwhile.
      kept = self.cache.get("records", key, _records_of_group) or {}
      self.cache.put("records", key,
                     {"records": {**kept, **self._records[key]}})
      self._unkept.discard(key)

  def _evaluate(self, c: Config) -> dict[str, Any]:
    start = time.perf_counter()
    record: dict[str, Any] = dataclasses.asdict(c)
    record.update(model=self.cfg.name, topology=self.topo.name, seq=self.spec.seq,
                  tokens=c.batch * self.spec.seq)
    try:
      shards, axes = (c.X, "X") if c.D == 1 else (c.D * c.X, "D x X")
      if c.batch % shards:
        raise ValueError(f"batch {c.batch} is not divisible by {axes}="
                         f"{shards}; the batch is sharded over {axes}")
      m, flag = ((self.spec.microbatches, "microbatches") if c.P > 1 else
                 (self.spec.grad_accum, "grad_accum"))
      if c.batch % (shards * m):
        raise ValueError(f"batch {c.batch} is not divisible by {axes}="
                         f"{shards} x {flag}={m}; each micro-batch is "
                         f"sharded over {axes}")
      est, values = self._values(c)
    except ValueError as e:
      record.update(status="failed", error=str(e).splitlines()[0], fits=False,
                    eval_s=time.perf_counter() - start)
      return record
    hbm = est.base_memory.hbm_bytes  # simulator.memory.capacity
    values.setdefault("compute_bound", values["t_math_s"] >= values["t_comm_s"])
    record.update(status="ok", **values,
                  hbm_bytes=hbm, fits=bool(values["peak_bytes"] <= hbm),
                  max_batch=est.largest_batch(self.spec.hbm_fraction),
                  tokens_per_s=c.batch * self.spec.seq / values["step_time_s"],
                  eval_s=time.perf_counter() - start)
    if not math.isfinite(record["threshold_tokens_global"]):
      record["threshold_tokens_global"] = None  # JSON has no inf
    return record

  def evaluate(self, configs: Iterable[Config]) -> Iterator[dict[str, Any]]:
    """Each config's record: in order in this process alone; with
    `workers` > 1, those in the cache first, then the rest as they are made,
    groups of them by helper processes (simulator.sweep_workers). What was
    made is kept in the cache when the sweep ends or is stopped."""
    try:
      yield from self._evaluate_all(configs)
    finally:
      self.keep()

  def _evaluate_all(self, configs: Iterable[Config]
                    ) -> Iterator[dict[str, Any]]:
    if self.workers <= 1:
      for c in configs:
        yield self.evaluate_one(c)
      return
    groups: dict[tuple, list[Config]] = {}  # one traced group: one process
    for c in configs:
      record = self.cached(c)
      if record is not None:
        yield record
      else:
        groups.setdefault((c.remat, c.shard, c.optimizer, c.P, c.D),
                          []).append(c)
    if len(groups) < 2:
      for c in (c for group in groups.values() for c in group):
        yield self.evaluate_one(c)
    else:
      # pylint: disable=g-import-not-at-top  (processes: only here)
      from simulator import sweep_workers
      yield from sweep_workers.evaluate(self, list(groups.values()),
                                        min(self.workers, len(groups)) - 1)


def replicas_that_lay_out(spec: SweepSpec, most: int = 2) -> list[int]:
  """Where no plan of a sweep lays out (every X x Y leaves a factor of the
  chips that no sharded dim takes: 6144 = 3 x 2048 chips for a model 20480
  wide), the smallest numbers of data-parallel replicas D > 1 not swept
  (`--dps`) under which one of its D x X x Y plans does, at most `most`:
  each plan tried as the step is built (its layout checks), the step not
  traced."""
  # pylint: disable=g-import-not-at-top  (jax only on this failure path)
  from simulator.step import build_step
  cfg, topo = spec.validate()
  found: list[int] = []
  for d in divisors(topo.chips)[1:]:
    if d in spec.dps:
      continue
    for (x, y), shard, batch in itertools.product(
        spec.meshes_for(topo, d), spec.shards, spec.batches):
      try:
        build_step(cfg, spec.settings(batch, spec.remats[0], shard,
                                      spec.optimizers[0]),
                   abstract_mesh(plan_mesh(topo, x, y, D=d)))
      except ValueError:  # a PlanError, or a mesh that cannot be laid out
        continue
      found.append(d)
      break
    if len(found) == most:
      break
  return found


def refuted(record: dict) -> bool:
  """Whether compiling the plan for its topology said it does not fit."""
  return (record.get("compiled_fits") is False
          or "memory" in record.get("compile_error", "").lower())


def rank(records: list[dict]) -> list[dict]:
  """Best first: fitting configs by tokens/s (then less memory); then
  configs that do not fit (by the estimate, or by the compiler for those
  confirmed), least memory first; failed configs last."""
  def order(r):
    if r.get("status") != "ok":
      return (2, 0.0, 0.0)
    if r["fits"] and not refuted(r):
      return (0, -r["tokens_per_s"], r["peak_bytes"])
    return (1, r["peak_bytes"], 0.0)
  return sorted(records, key=order)


# What X does under each --shard: the recommendation's words for it.
X_ROLE = {"zero3": "X FSDP", "zero2": "X data-parallel, ZeRO-2",
          "zero1": "X data-parallel, ZeRO-1", "dp": "X data-parallel"}


def recommendation(ranked: list[dict], fraction: float = HBM_FRACTION,
                   precision: str = "mixed") -> str:
  """One paragraph: the chosen plan and why; `fraction`: the headroom its
  records' max_batch was found for; `precision`: the sweep's, named where
  it is not the default."""
  best = ranked[0] if ranked else None
  if (best is None or best.get("status") != "ok" or not best["fits"]
      or refuted(best)):
    ok = [r for r in ranked if r.get("status") == "ok"]
    if not ok:
      return "no config could be evaluated; see the errors above"
    r = ok[0]
    return (f"nothing fits: the smallest is {record_mesh(r)} batch {r['batch']} "
            f"remat {r['remat']} at {r['peak_bytes'] / GiB:.1f} GiB per device > "
            f"the {r['hbm_bytes'] / GiB:.1f} GiB it may use (a TPU's HBM, a "
            f"GPU's allocator pool); use more devices, more remat or a smaller "
            f"batch")
  fitting = [r for r in ranked if r.get("fits") and not refuted(r)]
  bound = ("compute-bound" if best["compute_bound"] else
           "communication-bound (the compute-bound plans that fit are slower)"
           if any(r.get("compute_bound") for r in fitting) else
           "communication-bound (no fitting plan is compute-bound)")
  thr = best.get("threshold_tokens_global")
  thr_text = ("; no collectives: compute-bound at any batch" if thr == 0 else
              f"; compute-bound from {thr:,.0f} tokens per step"
              if thr is not None else "; never compute-bound on this mesh")
  stages = (f", {best['P']} pipeline stages on P" if best.get("P", 1) > 1
            else f", {best['D']} data-parallel replicas on D"
            if best.get("D", 1) > 1 else "")
  text = (f"recommended: mesh {record_mesh(best)} ({X_ROLE[best['shard']]}, "
          f"Y tensor{stages}), batch {best['batch']}, remat {best['remat']}, "
          f"{best['shard']}, {best['optimizer']}"
          + ("" if precision == "mixed" else f", {precision} precision")
          + f": fits at {best['peak_bytes'] / GiB:.1f} of "
          f"{best['hbm_bytes'] / GiB:.1f} GiB, {best['tokens_per_s']:,.0f} tokens/s, "
          f"predicted MFU {best['mfu']:.1%} (roofline bound "
          f"{_percent(best.get('roofline_mfu'))}), {bound}{thr_text}; the highest "
          f"tokens/s of the {len(fitting)} plans that fit")
  hbm = (best.get("t_hbm_s") or 0) + (best.get("t_matmul_hbm_s") or 0)
  if best.get("step_time_s") and hbm > max(best.get("t_math_s") or 0,
                                           best.get("exposed_comm_s") or 0):
    text += (f"; HBM traffic (fusions' bytes, byte-bound matmuls) is the "
             f"largest part of its step, {hbm / best['step_time_s']:.0%}")
  if best.get("compiled_peak_bytes") is not None:
    text += (f"; the compiler confirms {best['compiled_peak_bytes'] / GiB:.1f} GiB "
             f"peak")
  if best.get("max_batch"):
    text += (f"; on this mesh, remat, shard and optimizer up to batch "
             f"{best['max_batch']} stays within {fraction:.0%} of the "
             f"capacity")
  return text


def _percent(x: float | None) -> str:
  """A fraction as a percentage; a record from before the field: '-'."""
  return "-" if x is None else f"{x:.1%}"


def table(ranked: list[dict], limit: int | None = None) -> str:
  """The ranked table, plain text (also valid markdown); a failed config
  points to its reason, printed whole under the table. MFU is the step-time
  model's prediction; MFU bound the roofline's (simulator.timing.roofline);
  max batch the largest batch of the plan's mesh, remat, shard and optimizer
  within --hbm_fraction of the capacity (0: none; '-': a record from before
  the field)."""
  head = ("| rank | mesh | batch | remat | shard | optimizer | peak GiB | fits | "
          "max batch | step s | tokens/s | MFU | MFU bound | bound by | "
          "compiled GiB |")
  lines = [head, "|" + "|".join(["---"] * (head.count("|") - 1)) + "|"]
  reasons: list[str] = []
  for i, r in enumerate(ranked[:limit] if limit else ranked, 1):
    mesh = record_mesh(r)
    common = f"| {i} | {mesh} | {r['batch']} | {r['remat']} | {r['shard']} | " \
             f"{r['optimizer']} |"
    if r.get("status") != "ok":
      reason = r.get("error", "")
      if reason not in reasons:
        reasons.append(reason)
      lines.append(f"{common} failed [{reasons.index(reason) + 1}] "
                   "| | | | | | | | |")
      continue
    comp = r.get("compiled_peak_bytes")
    lines.append(
        f"{common} {r['peak_bytes'] / GiB:.2f} | {'yes' if r['fits'] else 'no'} | "
        f"{r.get('max_batch', '-')} | {r['step_time_s']:.3g} | {r['tokens_per_s']:,.0f} | {r['mfu']:.1%} | "
        f"{_percent(r.get('roofline_mfu'))} | "
        f"{'compute' if r['compute_bound'] else 'comm'} | "
        f"{'' if comp is None else f'{comp / GiB:.2f}'} |")
  lines += [f"[{n}] {reason}" for n, reason in enumerate(reasons, 1)]
  return "\n".join(lines)


# --------------------------------------------------------------------------
# Compile confirmation.
# --------------------------------------------------------------------------


def compiled_peak_bytes(cfg: ModelConfig, settings: TrainSettings,
                        plan: MeshPlan) -> int:
  """The compiler's per-device peak for the step on the real topology (libtpu)."""
  from simulator.xla import compiled
  report = compiled.compile_report(cfg, settings, plan.topology.name, plan.X,
                                   plan.Y, progress=None,
                                   D=plan.D)  # P: settings.pp
  return int(report.peak_bytes)


def cached_confirmation(sweep: Sweep, record: dict) -> dict | None:
  """A confirmation compiled before for this exact plan (`from_cache`)."""
  result = sweep.cache.get(
      "compiles", sweep.cache_key(Config(*record_key(record)), "compile"),
      lambda hit: dict(hit["result"]))
  return None if result is None else {**result, "from_cache": True}


def compile_job(sweep: Sweep, record: dict) -> tuple:
  """What a worker process needs to compile the record's plan."""
  c = Config(*record_key(record))
  return (sweep.cfg, sweep.spec.settings(c.batch, c.remat, c.shard,
                                         c.optimizer, c.P), sweep.topo.name,
          c.X, c.Y, c.D)


def run_compile_job(cfg: ModelConfig, settings: TrainSettings, topology: str,
                    x: int, y: int, d: int = 1) -> dict:
  """compile_result for a compile_job (module level: a worker runs it)."""
  return compile_result(cfg, settings, plan_mesh(parse_topology(topology), x,
                                                 y, P=settings.pp, D=d))


def keep_confirmation(sweep: Sweep, record: dict, result: dict) -> None:
  sweep.cache.put("compiles", sweep.cache_key(Config(*record_key(record)),
                                              "compile"), {
      "result": result, "model": sweep.cfg.name, "topology": sweep.topo.name,
      "compile_s": result["compile_s"]})


def confirm(sweep: Sweep, record: dict) -> dict:
  """compiled_peak_bytes and compile_s for one evaluated record: from the
  cache (`from_cache`), or compiled for the topology (and kept)."""
  hit = cached_confirmation(sweep, record)
  if hit is not None:
    return hit
  result = run_compile_job(*compile_job(sweep, record))
  keep_confirmation(sweep, record, result)
  return result


def compile_result(cfg: ModelConfig, settings: TrainSettings,
                   plan: MeshPlan) -> dict:
  """Compile the step for the plan's topology: its peak and whether it
  fits, or the compile's error; a compile failure is a result, not a crash."""
  start = time.perf_counter()
  try:
    peak = compiled_peak_bytes(cfg, settings, plan)
  except Exception as e:  # noqa: BLE001
    return {"compile_error": f"{type(e).__name__}: {str(e).splitlines()[0][:200]}",
            "compile_s": time.perf_counter() - start}
  return {"compiled_peak_bytes": peak,
          "compiled_fits": peak <= capacity_bytes(plan),
          "compile_s": time.perf_counter() - start}


def expected_compile_s(sweep: Sweep) -> float | None:
  """The median time of this model's compiles on this topology, from the
  cache's history (None: none made yet)."""
  return sweep.cache.expected("compiles", "compile_s", model=sweep.cfg.name,
                              topology=sweep.topo.name)
