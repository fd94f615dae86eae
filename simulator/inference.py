"""Serving with a KV cache: per-device memory and time of the prefill and
decode steps, read off their traced programs (simulator.serve_step).

Memory per device (bytes):
  weights   the params' per-device bytes (bf16; replicated over X, TP over Y);
  kv_cache  the cache at full length, from its sharded ShapeDtypeStructs:
            2·L·(B/X)·T·(K/Y)·H·itemsize, plus int8's scales 2·L·(B/X)·T·(K/Y)·2
            (K/Y is K where Y does not divide the kv heads: replicated); an
            encoder-decoder's T positions are the generated ones in its
            decoder's cache and the prompt's in its cross-attention cache;
  peak      per step, what XLA's peak_memory_in_bytes is: the arguments
            (weights, cache, tokens, in their TPU tiled layouts) live
            throughout plus the largest transient live set of the heap
            simulation the training path uses (simulator.memory.liveness,
            with XLA:GPU's rules on a GPU and its serving rules:
            simulator.memory.xla_gpu_rules, relaid cache stacks ...), the
            cache written in place into its donated buffer; the step is
            simulated as traced at the probe batch and read at its own, as a
            training step is (`probe_serve`), the rules whose choice turns on
            the batch deciding at its own (`batch_scale`);
  fits      the larger peak plus the planning overhead
            (simulator.memory.OVERHEAD_FRACTION) within what the steps
            may use (simulator.memory.capacity: the chip's HBM on a TPU,
            JAX's allocator pool on a GPU).

Time per device, a roofline (the TPU Scaling Book's inference chapter): a
decode step reads every weight its program reads (an encoder-decoder's, no
encoder weight: `weights_read`) and the whole fixed-size cache once (the
dense masked attention of models.decode reads all T positions, written or
not), so

  decode step = max(FLOPs / C, (weight bytes + KV cache bytes) / W_hbm) + T_comm
  prefill     = max(FLOPs / C, (weight bytes + KV cache bytes) / W_hbm) + T_comm

with FLOPs the traced program's matmuls per device (simulator.tracing.program), C
the chip's bf16 FLOP/s and W_hbm its HBM bandwidth (meshes.hardware); the
prefill writes the cache once. T_comm: the collectives the traced step's
shardings make (with TP over Y, each layer's activations gathered over
Y before its attention and MLP and their outputs reduced), each timed as
the training step's are (simulator.timing.comms: ICI rings on TPUs, NCCL
on GPUs) and all exposed: the next matmul reads each result, as the
training model leaves the TP activation collectives exposed. On a TPU
each reduction is the all-reduce libtpu compiles, with no windowed-einsum
loop (`_as_libtpu_serves`). Throughput:
batch / decode step while generating, and batch·generate / (prefill +
generate·decode step) end to end.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax

from meshes import gpu_target
from meshes.layout import MeshPlan, abstract_mesh, plan_mesh
from meshes.topology import parse_topology
from models.config import ModelConfig
from models.registry import load_model
from simulator.xla import compiled as compiled_lib
from simulator.xla import hlo_collectives
from simulator.memory import (OVERHEAD_FRACTION, capacity, liveness,
                              tpu_tiled_bytes, xla_gpu_rules, xla_rules)
from simulator.memory.estimate import Contributor
from simulator.timing.comms import collective_time
from simulator.tracing.batch_probe import PROBE, bytes_at, rescale
from simulator.tracing.program import read_program
from simulator.tracing.trace import read_inputs
from simulator.serve_step import PHASES, ServeStep, build_serve_steps
from simulator.settings import ServeSettings
from simulator.model_checks import kv_heads_replicated
from simulator.step import device_bytes, device_shape

PEAK_BUFFERS = 8


@dataclasses.dataclass(frozen=True)
class PhaseEstimate:
  """One serving step on one device."""

  phase: str
  arguments_bytes: int  # weights + cache + tokens, tile padding included
  peak_bytes: int  # arguments + the largest transient live set: XLA's peak
  peak_where: str
  peak_buffers: tuple[Contributor, ...]  # the largest transients there
  flops: int  # matmul FLOPs per device
  hbm_bytes: int  # the roofline's bytes: weights + KV cache
  t_math: float
  t_hbm: float
  t_comm: float  # the step's collectives, exposed
  # the traced step's collectives (simulator.tracing.program), every one
  collectives: tuple

  @property
  def comm_bytes(self) -> int:
    """The collectives' bytes per device (V summed over executions)."""
    return sum(c.count * c.bytes_per_device for c in self.collectives)

  @property
  def seconds(self) -> float:
    return max(self.t_math, self.t_hbm) + self.t_comm

  @property
  def bound(self) -> str:
    """What the step's time is most: "compute", "memory" or
    "communication"."""
    return max((self.t_math, "compute"), (self.t_hbm, "memory"),
               (self.t_comm, "communication"))[1]


@dataclasses.dataclass(frozen=True)
class InferenceEstimate:
  model: str
  serve: ServeSettings
  plan: MeshPlan
  weights_bytes: int  # per device
  kv_cache_bytes: int  # per device, full length, untiled
  kv_heads_replicated: bool
  phases: dict[str, PhaseEstimate]
  # What the steps' buffers may use (simulator.memory.capacity): the chip's
  # HBM on a TPU, JAX's allocator pool on a GPU, as `fits` in training.
  hbm_bytes: int

  @property
  def peak_bytes(self) -> int:
    """The larger step peak (XLA's terms, no overhead)."""
    return max(p.peak_bytes for p in self.phases.values())

  @property
  def planned_bytes(self) -> int:
    return int(self.peak_bytes * (1 + OVERHEAD_FRACTION))

  @property
  def fits(self) -> bool:
    return self.planned_bytes <= self.hbm_bytes

  @property
  def decode_tokens_per_s(self) -> float:
    return self.serve.batch / self.phases["decode"].seconds

  @property
  def total_seconds(self) -> float:
    return (self.phases["prefill"].seconds
            + self.serve.generate * self.phases["decode"].seconds)

  @property
  def tokens_per_s(self) -> float:
    """Generated tokens per second end to end, prefill included."""
    return self.serve.batch * self.serve.generate / self.total_seconds


def argument_bytes(step: ServeStep, reads: list[bool], tiled: bool) -> int:
  """Per-device bytes of the arguments the step's program reads (`reads`,
  one per argument leaf: jit drops the rest,
  simulator.tracing.trace.read_inputs), in the TPU tiled layout when
  `tiled` (simulator.memory.tiling)."""
  leaves = [x for x, read in zip(jax.tree.leaves(step.args), reads) if read]
  if not tiled:
    return sum(map(device_bytes, leaves))
  return sum(tpu_tiled_bytes(device_shape(x), x.dtype) for x in leaves)


def weights_read(step: ServeStep, reads: list[bool]) -> int:
  """Per-device bytes of the weights the step reads (`reads`, as
  `argument_bytes` takes them): all of a decoder's; an encoder-decoder's
  decode step no encoder weight and no cross-attention k or v projection
  (the prefill cached their products)."""
  return sum(device_bytes(x) for x, read in zip(
      jax.tree.leaves(step.params), reads) if read)


def probe_serve(serve: ServeSettings, x: int) -> ServeSettings:
  """`serve` at the probe batch (simulator.tracing.batch_probe): PROBE
  sequences on each of the X devices that split the batch. The memory rules
  tell the batch's values by it, as in training (an activation matmul's
  output fusion, the into-matmuls rule of simulator.memory.xla_rules); a
  step traced at its own batch has none, so every matmul read as one of
  weights alone."""
  return dataclasses.replace(serve, batch=PROBE * x)


def trace_phase(step: ServeStep, mesh) -> jax.core.ClosedJaxpr:
  with jax.sharding.use_abstract_mesh(mesh):
    return jax.make_jaxpr(step.fn)(*step.args)


def _phase(step: ServeStep, jaxpr, probed: ServeStep, probe_jaxpr,
           plan: MeshPlan, cache: int) -> PhaseEstimate:
  """The step's figures: its memory from the heap simulation of `probed`,
  the same step at the probe batch (`probe_jaxpr`), evaluated at the step's
  batch, the rest from its own program `jaxpr`."""
  chip = plan.topology.chip
  reads = read_inputs(jaxpr)
  args = argument_bytes(step, reads, chip.kind == "tpu")
  batch, probe = step.tokens.shape[0], probed.tokens.shape[0]
  gpu = chip.kind == "gpu"
  sms = (xla_gpu_rules.Sms(*gpu_target.sm_count_and_major(chip.name))
         if gpu else None)
  points = liveness.simulate(probe_jaxpr, probed.donated_outputs, gpu=gpu,
                             sms=sms, one_device=plan.chips == 1,
                             batch_scale=batch / probe,
                             matmul_reductions=(
                                 xla_rules.writes_matmul_reductions(chip.name)))
  transient, index = points.peak_at(batch, probe)
  live = sorted(points.live(index) if index >= 0 else (),
                key=lambda b: -bytes_at(*b.bytes, batch, probe))
  buffers = tuple(Contributor(b.where, rescale(b.shape, batch, probe),
                              b.dtype, bytes_at(*b.bytes, batch, probe))
                  for b in live[:PEAK_BUFFERS])
  tpu = chip.kind == "tpu"
  program = read_program(jaxpr, len(step.data), not tpu)
  flops = sum(d.flops_per_device * d.count for d in program.dots)
  made = tuple(map(_as_libtpu_serves, program.made()) if tpu
               else program.made())
  hbm = weights_read(step, reads) + cache
  return PhaseEstimate(
      step.phase, args, args + max(transient, 0),
      points.where[index] if index >= 0 else "nothing transient", buffers,
      flops, hbm, flops / chip.bf16_flops, hbm / chip.hbm_bandwidth,
      sum(c.count * collective_time(c, plan, chip.ici_link_bandwidth)
          for c in made), made)


def _as_libtpu_serves(c):
  """A serving step's reduce-scatter as libtpu compiles it: an all-reduce
  of the whole activation (its slice kept after), and no windowed-einsum
  loop (the program is read without one). llama2_7b v5p-8 1x4 b16
  1024+256 (`inference_report --compile`): the decode body's
  `all-reduce.8 = bf16[16,4096]` and `all-reduce.9` for the attention's
  and the MLP's output projections, 8.000 GiB of all-reduces in the
  prefill where the traced shardings imply 4.000 GiB of reduce-scatters
  and the MLP's windowed loop; 2x2 the same. The training step's time
  model keeps the traced kinds: its compiles also list no reduce-scatter
  over Y (#88), but whose op that is there (an all-reduce, or libtpu's
  all-reduce-scatter) was not read, and its anchors were matched with
  them."""
  if c.kind != "reduce-scatter":
    return c
  return dataclasses.replace(c, kind="all-reduce")


def inference_report(cfg: ModelConfig, serve: ServeSettings,
                     plan: MeshPlan) -> InferenceEstimate:
  """Trace prefill and decode under `plan`'s abstract mesh and estimate."""
  mesh = abstract_mesh(plan)
  steps = build_serve_steps(cfg, serve, mesh)
  probed = build_serve_steps(cfg, probe_serve(serve, plan.X), mesh)
  first = steps["prefill"]
  weights = sum(map(device_bytes, jax.tree.leaves(first.params)))
  cache = sum(map(device_bytes, jax.tree.leaves(first.cache)))
  phases = {phase: _phase(steps[phase], trace_phase(steps[phase], mesh),
                          probed[phase], trace_phase(probed[phase], mesh),
                          plan, cache) for phase in PHASES}
  return InferenceEstimate(cfg.name, serve, plan, weights, cache,
                           kv_heads_replicated(cfg, plan.Y), phases,
                           capacity.capacity_bytes(plan))


def compile_serve(cfg: ModelConfig, serve: ServeSettings, target: str, X: int,
                  Y: int, progress=None) -> dict[str, dict[str, Any]]:
  """Each serving step compiled for `target` (simulator.xla.compiled), the
  cache donated: memory_analysis's figures, the buffers at XLA's peak and
  the HLO's collectives (simulator.xla.hlo_collectives)."""
  mesh = compiled_lib.make_mesh(target, X, Y)
  out = {}
  for phase, step in build_serve_steps(cfg, serve, mesh).items():
    label = f"[{cfg.name} {phase} {target} {X}x{Y}] "
    c = compiled_lib.compile_fn(step, step.fn, step.args, (1,), mesh,
                                progress, label)
    fig = compiled_lib.memory_figures(c, target)
    colls, _ = hlo_collectives.parse_collectives(
        c.hlo_text, tuple(mesh.shape.values()), tuple(mesh.axis_names))
    out[phase] = {**dataclasses.asdict(fig), "compile_seconds": c.seconds,
                  "collectives": hlo_collectives.summarize(colls),
                  "layout_argument_bytes":
                      compiled_lib.layout_argument_bytes(c),
                  "peak_buffers": [dataclasses.asdict(b) for b in
                                   c.xla_peak.buffers[:PEAK_BUFFERS]]
                  if c.xla_peak else [],
                  **({"workaround": c.workaround} if c.workaround else {})}
  return out


def compare(estimate: InferenceEstimate,
            compiled: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
  """Symbolic vs XLA per step: peak and arguments, relative error
  (symbolic - XLA) / XLA; the collectives' bytes by kind and axis
  (compiled.compare_collectives)."""
  rel = lambda s, x: (s - x) / x if x else None
  out = {}
  for phase, comp in compiled.items():
    p = estimate.phases[phase]
    out[phase] = {"symbolic_peak_bytes": p.peak_bytes,
                  "xla_peak_bytes": comp["peak_bytes"],
                  "peak_error": rel(p.peak_bytes, comp["peak_bytes"]),
                  "symbolic_argument_bytes": p.arguments_bytes,
                  "xla_argument_bytes": comp["argument_bytes"],
                  "argument_error": rel(p.arguments_bytes,
                                        comp["argument_bytes"]),
                  "collectives": compiled_lib.compare_collectives(
                      p.collectives, comp.get("collectives", {})),
                  "workaround": comp.get("workaround", "")}
  return out


def recheck(rows: list[dict]) -> list[dict]:
  """Today's estimate against each kept compile (rows as
  `inference_report --keep` writes them): per row its plan, its part and,
  per step, the peak's and the arguments' relative errors (`compare`)."""
  out = []
  for n, row in enumerate(rows, 1):
    try:
      plan = plan_mesh(parse_topology(row["topology"]), *row["mesh"])
      e = inference_report(load_model(row["model"]),
                           ServeSettings(**row["serve"]), plan)
    except (TypeError, ValueError) as err:  # the row's plan, not the user's
      raise ValueError(f"row {n} ({row['model']} {row['topology']}): "
                       f"{str(err).splitlines()[0]}") from None
    c = compare(e, row["compiled"])
    out.append({**{k: row[k] for k in ("model", "topology", "mesh", "serve")},
                "part": row.get("part"),
                "peak_error": {p: c[p]["peak_error"] for p in c},
                "argument_error": {p: c[p]["argument_error"] for p in c}})
  return out


def _buffers(xs) -> list[dict]:
  return [{"name": x.name, "shape": list(x.shape), "dtype": x.dtype,
           "bytes": int(x.bytes)} for x in xs]


def to_json(e: InferenceEstimate) -> dict[str, Any]:
  """Bytes are ints per device, times in seconds."""
  return {
      "model": e.model, "mesh": [e.plan.X, e.plan.Y],
      "topology": e.plan.topology.describe(),
      "serve": dataclasses.asdict(e.serve),
      "weights_bytes": e.weights_bytes, "kv_cache_bytes": e.kv_cache_bytes,
      "kv_heads_replicated": e.kv_heads_replicated,
      "peak_bytes": e.peak_bytes, "planned_bytes": e.planned_bytes,
      "overhead_fraction": OVERHEAD_FRACTION, "hbm_bytes": e.hbm_bytes,
      "fits": e.fits,
      "phases": {name: {"arguments_bytes": p.arguments_bytes,
                        "peak_bytes": p.peak_bytes, "peak_where": p.peak_where,
                        "peak_buffers": _buffers(p.peak_buffers),
                        "flops": p.flops, "hbm_bytes": p.hbm_bytes,
                        "t_math_s": p.t_math, "t_hbm_s": p.t_hbm,
                        "t_comm_s": p.t_comm,
                        "comm_bytes": p.comm_bytes,
                        "seconds": p.seconds, "bound": p.bound}
                 for name, p in e.phases.items()},
      "decode_tokens_per_s": e.decode_tokens_per_s,
      "total_seconds": e.total_seconds, "tokens_per_s": e.tokens_per_s,
  }
