"""The simulator's train step, lowered and compiled for a real target.

The step is `simulator.step.build_step` — the same Flax model, optax optimizer,
precision policy, shardings and remat policy the simulator traces — jitted with
params and optimizer state donated (as a training loop would) and compiled for:

  tpu  a TPU slice through libtpu's compile-only topology API (works on a CPU host):
       target "v5p-128", "v5p:4x4x4", "v5e-16", "v6e:4x4", "v4-32", multi-slice
       "v5p-256x2", ...
  gpu  a GPU cluster without a GPU, through the CUDA plugin's compile-only
       topology (meshes.gpu_target; the `gpu` extra): target "h100:2x8",
       "h200:8", "a100:4x8", ...; XLA:GPU compiles a program larger than the
       GPU's memory with a warning only, so `report` compares the peak with it
  cpu  CPU fake devices ("cpu"); jax_num_cpu_devices must be set before the CPU
       backend initialises (see `ensure_cpu_devices`)
  local GPUs ("gpu"), when present; `run_steps` then executes a few steps on
       random data and reads `device.memory_stats()`.

`compile_fn` compiles any step function the same way (the serving steps of
simulator.serve_step: simulator.inference.compile_serve).

Figures read (per device, bytes):
  memory_analysis(): argument, output, alias, temp, generated_code, host_* and
    peak_memory_in_bytes.
  peak: `peak_memory_in_bytes` when the backend reports it (> 0: the TPU compiler's
    heap simulation of live HBM buffers over the schedule, arguments included;
    less the host arguments, and on a TPU with host temporaries the dumped
    HBM live set's, as `memory_figures` says why); otherwise the bound
    argument + output - alias + temp (every buffer live at once, donated
    outputs sharing their argument's buffer). Both are kept:
    `peak_bytes` / `peak_source`, and `bound_bytes`.
  cost_analysis(): flops, bytes accessed, optimal_seconds (TPU only).
  collectives: `simulator.xla.hlo_collectives.parse_collectives` on the compiled HLO.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import sys
import tempfile
import time
from typing import Any, Callable, Sequence

import jax
import numpy as np

from meshes import layout
from meshes.topology import parse_topology
from models.config import ModelConfig
from simulator.xla import heap_replay, hlo_collectives, memory_scheduler, xla_peak
from simulator.memory.tiling import layout_bytes
from simulator.settings import TrainSettings
from simulator.step import Step, build_step, device_bytes, device_shape
from simulator.tracing.fingerprint import program_fingerprint
from simulator.tracing.trace import read_inputs

Progress = Callable[[str], None]


def _stderr(message: str) -> None:
  print(message, file=sys.stderr, flush=True)


def ensure_cpu_devices(n: int) -> None:
  """Asks for n CPU devices; must run before JAX initialises its backends."""
  try:
    current = jax.config.jax_num_cpu_devices
  except AttributeError:
    current = -1
  if current is not None and current >= n:
    return
  jax.config.update("jax_num_cpu_devices", n)


def target_kind(target: str) -> str:
  """"cpu", "gpu" (local GPUs or a GPU topology) or "tpu"."""
  t = target.strip().lower()
  if t in ("cpu", "gpu"):
    return t
  return parse_topology(t).chip.kind


def make_mesh(target: str, X: int, Y: int, P: int = 1, D: int = 1):
  """A real jax Mesh (Explicit X/Y axes, P first with pipeline stages, D
  with data-parallel replicas) for `target`; see the module docstring."""
  if target == "cpu":
    return layout.cpu_mesh(X, Y, P, D)
  if (P > 1 or D > 1) and target == "gpu":
    raise ValueError("pp > 1 or dp > 1 compiles on a TPU or GPU topology "
                     "name, not on attached GPUs")
  if target == "gpu":
    try:
      devices = jax.devices("gpu")
    except RuntimeError as e:
      raise ValueError(f"target gpu: no GPU backend here ({e})") from None
    if len(devices) < X * Y:
      raise ValueError(f"mesh {X}x{Y} needs {X * Y} GPUs; {len(devices)} present")
    grid = np.array(devices[:X * Y], dtype=object).reshape(X, Y)
    return jax.sharding.Mesh(grid, layout.AXIS_NAMES,
                             axis_types=(jax.sharding.AxisType.Explicit,) * 2)
  topology = parse_topology(target)
  if topology.chip.kind == "tpu":
    memory_scheduler.request_log()  # before libtpu loads
  return layout.device_mesh(layout.plan_mesh(topology, X, Y, P=P, D=D))


def symbolic_argument_bytes(step: Step, reads: Sequence[bool]
                            ) -> dict[str, int]:
  """Per-device bytes of params, optimizer state and batch, from the step's
  ShapeDtypeStructs (`sharding.shard_shape`), leaving out the leaves the step
  never reads (jit drops them): what the compiled argument size is."""
  flags = iter(reads)
  def total(tree) -> int:
    return sum(device_bytes(x) for x in jax.tree.leaves(tree) if next(flags))
  out = {"params": total(step.params), "optimizer": total(step.opt_state),
         "batch": total(step.batch)}
  out["arguments"] = sum(out.values())
  return out


def layout_argument_bytes(c: "Compiled") -> int | None:
  """Per-device argument bytes under the compiled input layouts (tile padding
  included): must equal memory_analysis().argument_size_in_bytes on TPU."""
  try:
    formats = jax.tree.leaves(c.compiled.input_formats,
                              is_leaf=lambda x: hasattr(x, "layout"))
  except Exception:
    return None
  args = jax.tree.leaves(c.step.args)
  if len(formats) != len(args):
    return None
  return sum(layout_bytes(device_shape(a), a.dtype,
                          getattr(f, "layout", None))
             for a, f, read in zip(args, formats, c.reads) if read)


PEAK_BUFFERS = 16  # buffers at XLA's peak kept in the JSON report


@dataclasses.dataclass
class CompiledReport:
  target: str
  mesh: tuple[int, int]
  compile_seconds: float
  argument_bytes: int
  output_bytes: int
  alias_bytes: int
  temp_bytes: int
  generated_code_bytes: int
  host_bytes: dict[str, int]
  peak_bytes: int
  peak_source: str  # "peak_memory_in_bytes", ... (memory_figures)
  bound_bytes: int  # argument + output - alias + temp
  flops: float | None
  bytes_accessed: float | None
  optimal_seconds: float | None
  symbolic_arguments: dict[str, int]
  layout_argument_bytes: int | None  # symbolic arguments with the compiler's tiling
  collectives: list[hlo_collectives.HloCollective]
  trip_counts_known: bool
  measured: dict[str, Any] | None = None  # GPU: run_steps' memory_stats figures
  xla_peak: xla_peak.XlaPeak | None = None  # TPU: what is live at the peak
  program: str = ""  # the compiled program's fingerprint (tracing.fingerprint)
  # XLA's memory-scheduler estimates and choice: libtpu's, or on a GPU the
  # CUDA plugin's where the process asked for them before jax loaded
  # (simulator.xla.memory_scheduler.read_log; {} where it logged none)
  memory_scheduler: dict = dataclasses.field(default_factory=dict)
  # TPU: each of its three schedules' heap replayed (`replayed_schedules`)
  replayed_schedules: dict = dataclasses.field(default_factory=dict)
  scheduler: str = "default"  # the memory scheduler libtpu was told to run
  workaround: str = ""  # compiler options XLA needed (`CUBLAS_GEMMS`)

  def collective_summary(self) -> dict[str, dict[str, int]]:
    return hlo_collectives.summarize(self.collectives)

  def peak_buffers(self, top: int = PEAK_BUFFERS) -> list[dict[str, Any]]:
    """The largest buffers live at XLA's peak (TPU; [] elsewhere)."""
    if self.xla_peak is None:
      return []
    return [dataclasses.asdict(b) for b in self.xla_peak.buffers[:top]]

  def collective_bytes(self) -> int:
    """Per-device bytes out of all collectives per step (loops unrolled)."""
    return sum(c.total_out_bytes for c in self.collectives)

  def to_json(self) -> dict[str, Any]:
    d = {k: v for k, v in dataclasses.asdict(self).items()
         if k not in ("collectives", "xla_peak")}
    d["collectives"] = self.collective_summary()
    d["peak_buffers"] = self.peak_buffers()
    d["collective_bytes"] = self.collective_bytes()
    return d


@dataclasses.dataclass
class Compiled:
  step: Step
  mesh: Any
  compiled: Any  # jax.stages.Compiled
  seconds: float
  reads: tuple[bool, ...]  # per argument leaf: read by the step (else dropped)
  hlo_text: str = ""  # the optimized HLO module ("" if it could not be had)
  xla_peak: xla_peak.XlaPeak | None = None  # TPU: the buffers at the peak
  program: str = ""  # the traced program's fingerprint (tracing.fingerprint)
  memory_scheduler: dict = dataclasses.field(default_factory=dict)
  replayed_schedules: dict = dataclasses.field(default_factory=dict)
  scheduler: str = "default"
  workaround: str = ""  # a compiler option XLA needed (`CUBLAS_GEMMS`)


# XLA:GPU's Triton GEMM emitter finds no tiling for some matmuls (LLaVA's
# vision tower output projection on h100:8 and a100:8, bf16[1028,512] and
# larger: "Couldn't find output tile sizes"); with Triton GEMMs off the same
# step compiles, its GEMMs in cuBLAS (the GPU corpus's #39, #99, #100, #107,
# #108, #154; on a GPU, XLA_FLAGS=--xla_gpu_enable_triton_gemm=false).
TRITON_TILING_FAILURE = "Couldn't find output tile sizes"
CUBLAS_GEMMS = {"xla_gpu_enable_triton_gemm": False}


def workaround_label(options: dict) -> str:
  """The options as XLA_FLAGS would spell them."""
  return " ".join(f"--{k}={str(v).lower()}" for k, v in options.items())


def compile_step(cfg: ModelConfig, settings: TrainSettings, mesh,
                 progress: Progress | None = None, label: str = "",
                 dump_dir: str | None = None, dump_passes: str = "^$",
                 scheduler: str = "default") -> Compiled:
  """Builds, lowers and compiles the train step on `mesh` (a real Mesh).

  On TPU and GPU the compiler dumps the optimized module, its buffer
  assignment and live ranges into `dump_dir` (a temporary directory if None),
  and the module before and after each pass `dump_passes` matches; on a TPU
  `scheduler` is libtpu's memory scheduler (`memory_scheduler.SCHEDULERS`).
  """
  step = build_step(cfg, settings, mesh)
  return compile_fn(step, step.fn, step.args, (0, 1), mesh, progress, label,
                    dump_dir, dump_passes, scheduler)


def compile_fn(step, fn: Callable, args: tuple, donate: tuple[int, ...], mesh,
               progress: Progress | None = None, label: str = "",
               dump_dir: str | None = None, dump_passes: str = "^$",
               scheduler: str = "default") -> Compiled:
  """Lowers and compiles any step function `fn(*args)` on `mesh` (a real
  Mesh), the arguments in `donate` donated; `step` is kept beside it (the
  train step, or a serving step of simulator.serve_step). On a TPU,
  `scheduler` is the memory scheduler libtpu runs (its
  --xla_memory_scheduler; `memory_scheduler.SCHEDULERS`)."""
  say = progress or (lambda _: None)
  t0 = time.perf_counter()
  platform = mesh.devices.flat[0].platform
  if scheduler != "default" and platform != "tpu":
    raise ValueError(f"memory scheduler {scheduler!r}: libtpu's "
                     "--xla_memory_scheduler is for TPU targets; this mesh "
                     f"is on {platform}")
  # TPU and GPU: the buffers live at the peak are read off the dumps; on a
  # TPU the module before the memory scheduler too (`replayed_schedules`).
  dumps = platform in ("tpu", "gpu")
  if platform == "tpu":
    dump_passes = f"{dump_passes}|{memory_scheduler.PASS}"
  keep = contextlib.nullcontext(dump_dir) if dump_dir else None
  with jax.set_mesh(mesh), keep or tempfile.TemporaryDirectory() as dump:
    traced = jax.jit(fn, donate_argnums=donate).trace(*args)
    reads = tuple(read_inputs(traced.jaxpr))
    program = program_fingerprint(traced.jaxpr)
    lowered = traced.lower()
    module = module_name(lowered)
    say(f"{label}lowered in {time.perf_counter() - t0:.1f} s; compiling ...")
    extra: dict = {}
    try:
      try:
        compiled, scheduler_log = _compile(lowered, platform, dump,
                                           dump_passes, scheduler, dumps)
      except Exception as e:
        if platform != "gpu" or TRITON_TILING_FAILURE not in str(e):
          raise
        extra = CUBLAS_GEMMS
        say(f"{label}XLA:GPU's Triton GEMM emitter found no tiling; "
            f"compiling again with {workaround_label(extra)} (cuBLAS GEMMs)")
        dump = os.path.join(dump, "cublas_gemms")
        compiled, scheduler_log = _compile(lowered, platform, dump,
                                           dump_passes, scheduler, dumps,
                                           extra)
    except Exception as e:
      # libtpu refusing a plan for HBM still dumps the module's buffer
      # assignment and live ranges: what it held at its peak goes with
      # the error (`refused_peak`).
      e.xla_peak = refused_peak(dump, module) if dumps else None
      e.replayed_schedules = (replayed_schedules(dump) if platform == "tpu"
                              else {})
      e.program = program
      raise
    seconds = time.perf_counter() - t0
    hlo_text = _optimized_hlo(compiled, dump, module)
    peak = xla_peak.read_peak(dump, module) if dumps else None
    replayed = replayed_schedules(dump) if platform == "tpu" else {}
  say(f"{label}compiled in {seconds:.1f} s")
  return Compiled(step, mesh, compiled, seconds, reads, hlo_text, peak,
                  program, scheduler_log, replayed, scheduler,
                  workaround_label(extra))


def _compile(lowered, platform: str, dump: str, dump_passes: str,
             scheduler: str, dumps: bool, extra: dict | None = None):
  """(the compiled step, XLA's memory-scheduler log) with the dumps in
  `dump` and the compiler options `extra`."""
  with (memory_scheduler.stderr_logged()
        if platform == "gpu" and memory_scheduler.gpu_log_requested()
        else memory_scheduler.logged()) as scheduler_log:
    options = ({"xla_dump_to": dump, "xla_dump_hlo_as_text": True,
                "xla_dump_hlo_pass_re": dump_passes,
                **memory_scheduler.compiler_options(scheduler)}
               if dumps else {})
    options.update(extra or {})
    return lowered.compile(compiler_options=options or None), scheduler_log


def replayed_schedules(dump: str) -> dict[str, int]:
  """{list, dfs, post_order: bytes}: each schedule's heap on the module
  libtpu dumped before its memory scheduler (simulator.xla.heap_replay);
  {} where the dump is not there (one module before and after the pass) or
  holds an instruction form the replay does not read: the figures are a
  reading aid beside the compile, never a reason for it to fail."""
  try:
    before, _ = memory_scheduler.pass_dumps(dump)
    with open(before) as f:
      module = memory_scheduler.read_module(f.read())
    return {s: p.bytes for s, p in heap_replay.peaks(module).items()}
  except (FileNotFoundError, ValueError, KeyError, IndexError):
    return {}


def refused_peak(dump: str, module: str) -> xla_peak.XlaPeak | None:
  """The live set at XLA's peak as libtpu dumped it when it refused the
  plan for HBM (CompileTimeHbmOom), or None where it dumped none."""
  try:
    return xla_peak.read_peak(dump, module)
  except Exception:  # noqa: BLE001 - no dump, or a partial one
    return None


def module_name(lowered) -> str:
  """The lowered program's HLO module name ("jit_" + the function's name),
  which the compiler's dump files carry."""
  attr = lowered.compiler_ir("stablehlo").operation.attributes["sym_name"]
  return str(attr).strip('"')


def _optimized_hlo(compiled, dump: str, module: str) -> str:
  """The optimized HLO: on TPU from the compiler's own dump (libtpu
  0.0.52's Compiled.as_text() logs a RET_CHECK failure about async-update
  operands and a blank stack trace for these modules, then fails), else
  from as_text()."""
  path = xla_peak.dump_file(dump, module, "after_optimizations.txt")
  if path:
    with open(path) as f:
      return f.read()
  try:
    return compiled.as_text() or ""
  except Exception as e:  # noqa: BLE001 - no HLO, no collectives
    _stderr(f"compiled HLO text unavailable, no collectives ({e})"[:300])
    return ""


def _get(obj, name, default=0):
  value = getattr(obj, name, None)
  return default if value is None else value


@dataclasses.dataclass(frozen=True)
class MemoryFigures:
  """memory_analysis() per device, and the peak read from it."""

  argument_bytes: int
  output_bytes: int
  alias_bytes: int
  temp_bytes: int
  peak_bytes: int
  peak_source: str  # "peak_memory_in_bytes", ... (memory_figures)
  bound_bytes: int  # argument + output - alias + temp


LIVE_SET = "the dumped buffer assignment's HBM live set at the peak"


def memory_figures(c: Compiled, target: str) -> MemoryFigures:
  mem = c.compiled.memory_analysis()
  if mem is None:
    raise ValueError(f"{target}: the backend returned no memory_analysis()")
  arg, out, alias, temp = (int(_get(mem, f"{k}_size_in_bytes"))
                           for k in ("argument", "output", "alias", "temp"))
  bound = arg + out - alias + temp
  host = {k: int(_get(mem, f"host_{k}_size_in_bytes"))
          for k in ("argument", "output", "alias", "temp", "generated_code")}
  peak = int(_get(mem, "peak_memory_in_bytes"))
  source = "peak_memory_in_bytes"
  if host["argument"] and peak > 0:
    # The TPU compiler's peak counts the arguments that live in host memory
    # (--offload): llama2_7b v5p-8 4x1 with the optimizer offloaded gives
    # 37.230 GiB = the 24.679 GiB its dumped HBM live set holds at the peak
    # + the 12.551 GiB host_argument_size (4x2, params too: 17.477 = 8.063 +
    # 9.414; there the HBM live set is larger than the host temporaries
    # plus the HBM arguments: see below). HBM's peak is the difference.
    peak -= host["argument"]
    source = "peak_memory_in_bytes - host_argument_size_in_bytes"
  if host["temp"] and c.xla_peak is not None:
    # With temporaries in host memory (remat offload), the compiler's peak
    # is the larger of the HBM live set and the HBM arguments plus the host
    # temporaries. TPU: llama3_8b v4-32 8x2 b32 s8192 offload:qkv,mlp_hidden
    # (#137) gives 25.610 GiB = 5.610 arguments + 20.000 host_temp, its
    # dumped HBM live set 20.642; llama2_13b v6e-64 16x4 (#179) 6.727 =
    # 2.274 + 4.453, live 5.479. XLA:GPU the same: llama3_8b h200:2x8 16x1
    # b128 s4096 offload:qkv,mlp_hidden (GPU #124) 45.610 = 5.609 + 40.000,
    # live 42.771. Where the live set is the larger (TPU #34, #35, #122,
    # #168; GPU #81, #112) the two agree within 0.1%. HBM's peak is the
    # live set's.
    peak, source = c.xla_peak.peak_bytes, LIVE_SET
  # The CPU backend's peak_memory_in_bytes leaves out its temp allocation (it reads
  # about the argument size); there the bound is the figure.
  if peak <= 0 or target_kind(target) == "cpu":
    peak, source = bound, "argument+output-alias+temp"
  return MemoryFigures(arg, out, alias, temp, peak, source, bound)


def report(c: Compiled, target: str) -> CompiledReport:
  fig = memory_figures(c, target)
  mem = c.compiled.memory_analysis()
  arg, out, alias, temp = (fig.argument_bytes, fig.output_bytes,
                           fig.alias_bytes, fig.temp_bytes)
  bound, peak, source = fig.bound_bytes, fig.peak_bytes, fig.peak_source
  host = {k: int(_get(mem, f"host_{k}_size_in_bytes"))
          for k in ("argument", "output", "alias", "temp", "generated_code")}
  cost = None
  try:
    cost = c.compiled.cost_analysis()
  except Exception:  # some backends do not implement it
    cost = None
  if isinstance(cost, (list, tuple)):
    cost = cost[0] if cost else None
  cost = cost or {}
  colls, known = hlo_collectives.parse_collectives(
      c.hlo_text, tuple(c.mesh.shape.values()), tuple(c.mesh.axis_names))
  return CompiledReport(
      target=target, mesh=(c.mesh.shape["X"], c.mesh.shape["Y"]),
      compile_seconds=c.seconds, argument_bytes=arg, output_bytes=out,
      alias_bytes=alias, temp_bytes=temp,
      generated_code_bytes=int(_get(mem, "generated_code_size_in_bytes")),
      host_bytes=host, peak_bytes=peak, peak_source=source, bound_bytes=bound,
      flops=cost.get("flops"), bytes_accessed=cost.get("bytes accessed"),
      optimal_seconds=cost.get("optimal_seconds"),
      symbolic_arguments=symbolic_argument_bytes(c.step, c.reads),
      layout_argument_bytes=layout_argument_bytes(c), collectives=colls,
      trip_counts_known=known, xla_peak=c.xla_peak, program=c.program,
      memory_scheduler=c.memory_scheduler,
      replayed_schedules=c.replayed_schedules, scheduler=c.scheduler,
      workaround=c.workaround)


def compile_report(cfg: ModelConfig, settings: TrainSettings, target: str,
                   X: int, Y: int, progress: Progress | None = _stderr,
                   execute_steps: int = 0, dump_dir: str | None = None,
                   dump_passes: str = "^$", D: int = 1,
                   scheduler: str = "default") -> CompiledReport:
  """Compiles for target (TPU topology name, "cpu" or "gpu") and reads the figures.

  execute_steps > 0 on a GPU (or CPU fake devices, where it checks that the
  step runs; the CPU keeps no memory_stats) also runs that many steps (see
  `run_steps`);
  dump_dir keeps the TPU compiler's dumps (module, buffer assignment, live
  ranges) there, with the module before and after each pass `dump_passes`
  matches; `scheduler`: libtpu's memory scheduler (TPU only).
  """
  label = f"[{cfg.name} {target} {layout.mesh_name(X, Y, D=D)}] "
  if progress:
    progress(f"{label}building and lowering the train step ...")
  c = compile_step(cfg, settings, make_mesh(target, X, Y, settings.pp, D),
                   progress, label,
                   dump_dir, dump_passes, scheduler)
  rep = report(c, target)
  if execute_steps and target in ("gpu", "cpu"):
    rep.measured = run_steps(c, execute_steps)
  return rep


def random_args(step: Step, mesh, seed: int = 0) -> tuple:
  """Concrete arguments matching step.args on `mesh` (the optimizer state's
  shardings name the abstract mesh it was traced under): small random
  floats, valid token ids, zero optimizer state."""
  keys = iter(jax.random.split(jax.random.key(seed), 100000))
  on_mesh = lambda x: jax.sharding.NamedSharding(mesh, getattr(
      x.sharding, "spec", jax.sharding.PartitionSpec()))  # a scalar: None

  def make(x, vocab=None):
    if jnp_issubdtype(x.dtype, np.integer):
      hi = vocab or 2
      arr = jax.random.randint(next(keys), x.shape, 0, hi, dtype=x.dtype)
    else:
      arr = (0.02 * jax.random.normal(next(keys), x.shape, np.float32)).astype(x.dtype)
    return jax.device_put(arr, on_mesh(x))

  vocab = step.model.cfg.vocab_size - step.vocab_padding if hasattr(
      step.model, "cfg") else 2
  params = jax.tree.map(make, step.params)
  opt = jax.tree.map(
      lambda x: jax.device_put(np.zeros(x.shape, x.dtype), on_mesh(x)),
      step.opt_state)
  batch = jax.tree.map(lambda x: make(x, vocab), step.batch)
  return params, opt, batch


def jnp_issubdtype(dtype, kind) -> bool:
  return np.issubdtype(np.dtype(dtype), kind)


def run_steps(c: Compiled, n: int = 3) -> dict[str, Any]:
  """Executes n steps on random data; peak from device.memory_stats() (GPU/TPU)
  and each step's wall time (dispatch to results ready).

  The peak counter covers everything the allocator held since the process started
  (random inputs included); `peak_bytes_in_use` is reported as is, with the
  arguments' bytes beside it. The first step's time includes one-off work
  (kernel loading, cuBLAS handles), so `step_seconds` is the median of the
  others when there are any.
  """
  args = random_args(c.step, c.mesh)
  losses, seconds = [], []
  params, opt, batch = args
  for _ in range(n):
    start = time.perf_counter()
    params, opt, loss = jax.block_until_ready(c.compiled(params, opt, batch))
    seconds.append(time.perf_counter() - start)
    losses.append(float(loss))
  dev = c.mesh.devices.flat[0]
  stats = dev.memory_stats() or {}
  return {"steps": n, "losses": losses, "seconds": seconds,
          "step_seconds": float(np.median(seconds[1:] or seconds)),
          "peak_bytes_in_use": stats.get("peak_bytes_in_use"),
          "bytes_in_use": stats.get("bytes_in_use"),
          "bytes_limit": stats.get("bytes_limit"), "device": str(dev),
          "device_kind": getattr(dev, "device_kind", None),
          "jax": jax.__version__}


def _rel(symbolic: float, compiled: float) -> float | None:
  return None if not compiled else (symbolic - compiled) / compiled


def symbolic_side(estimate, target: str) -> dict[str, Any]:
  """The estimate's figures in the compiler's terms (see `compare`). For a
  GPU topology (a deviceless compile, which does not autotune) they are the
  deviceless program's (`MemoryEstimate.deviceless`); on the local GPUs
  ("gpu"), which autotune, the estimate's own. `peak_no_overhead_autotuned`
  is always the estimate's own peak, with the schedules XLA's autotuner may
  pick on a real GPU (xla_gpu_rules, cuBLAS logits): what `fits` holds."""
  autotuned = int(estimate.compiled_comparable_peak)
  if target_kind(target) == "gpu" and target != "gpu":
    estimate = estimate.deviceless()
  pd = {k: int(v) for k, v in estimate.per_device_bytes.items()}
  batch = int(estimate.batch_bytes)
  sym: dict[str, Any] = dict(pd)
  sym["batch"] = batch
  # params + optimizer + batch, plus their TPU tile padding when the estimate
  # (its plan's chip) and the compile target are both TPUs: a TPU estimate
  # compared with a CPU/GPU compile drops the padding.
  padding = int(estimate.tile_padding_bytes)
  untiled = padding if target_kind(target) != "tpu" else 0
  sym["tile_padding"] = padding - untiled
  sym["arguments"] = pd["params"] + pd["optimizer"] + batch + sym["tile_padding"]
  # The liveness-aware peak without the runtime overhead: XLA's figure, and
  # the transient live set at the peak (peak - arguments).
  sym["peak_no_overhead"] = int(estimate.compiled_comparable_peak) - untiled
  sym["peak_no_overhead_autotuned"] = autotuned - untiled
  sym["temp"] = sym["peak_no_overhead"] - sym["arguments"]
  # Each weight-gradient schedule whose peak the estimate takes the largest
  # of, on the same footing (the summary holds the smaller against XLA too).
  sym["schedule_peaks"] = {o: int(b) - untiled for o, (b, kept)
                           in estimate.schedule_peaks().items() if kept}
  sym["phases"] = dict(estimate.phase_bytes)
  sym["peak_where"] = estimate.peak_where
  sym["at_peak"] = dict(estimate.at_peak)
  sym["host"] = int(estimate.host_bytes)
  return sym


def errors(sym: dict[str, Any], comp: dict[str, Any]) -> dict[str, Any]:
  """Relative errors (symbolic - compiled) / compiled of `compare`'s rows."""
  layout = comp.get("layout_argument_bytes")
  return {"arguments": _rel(sym["arguments"], comp["argument_bytes"]),
          "arguments_layout": _rel(layout, comp["argument_bytes"])
          if layout else None,
          "temp": _rel(sym["temp"], comp["temp_bytes"]),
          "peak": _rel(sym["peak"], comp["peak_bytes"]),
          "peak_no_overhead": _rel(sym["peak_no_overhead"], comp["peak_bytes"]),
          "peak_smaller_schedule": _rel(
              min(sym["schedule_peaks"].values(),
                  default=sym["peak_no_overhead"]),
              comp["peak_bytes"])}


def compiled_side(rep: CompiledReport) -> dict[str, Any]:
  """The compiler's figures of `rep` as kept in a corpus row (JSON-ready);
  `compare` puts the symbolic side beside them, `crosscheck.recheck` does so
  later from the kept row."""
  comp = {"argument_bytes": rep.argument_bytes, "output_bytes": rep.output_bytes,
          "alias_bytes": rep.alias_bytes, "temp_bytes": rep.temp_bytes,
          "peak_bytes": rep.peak_bytes, "peak_source": rep.peak_source,
          "bound_bytes": rep.bound_bytes,
          "generated_code_bytes": rep.generated_code_bytes,
          "host_bytes": rep.host_bytes, "flops": rep.flops,
          "bytes_accessed": rep.bytes_accessed,
          "optimal_seconds": rep.optimal_seconds,
          "compile_seconds": rep.compile_seconds,
          "layout_argument_bytes": rep.layout_argument_bytes,
          "step_argument_bytes": rep.symbolic_arguments["arguments"],
          "collective_bytes": rep.collective_bytes(),
          "collectives": rep.collective_summary(),
          "trip_counts_known": rep.trip_counts_known,
          "peak_instruction": rep.xla_peak.instruction if rep.xla_peak else None,
          "peak_live_bytes": rep.xla_peak.peak_bytes if rep.xla_peak else None,
          "peak_buffers": rep.peak_buffers(),
          "vmem_bytes": rep.xla_peak.vmem_bytes if rep.xla_peak else None,
          "vmem_buffers": [dataclasses.asdict(b) for b in rep.xla_peak.vmem_buffers]
          if rep.xla_peak else [],
          "program": rep.program}
  if rep.memory_scheduler:
    comp["memory_scheduler"] = rep.memory_scheduler
  if rep.replayed_schedules:
    comp["replayed_schedules"] = rep.replayed_schedules
  if rep.scheduler != "default":
    comp["scheduler"] = rep.scheduler
  if rep.workaround:
    comp["workaround"] = rep.workaround
  if rep.measured:
    comp["measured"] = rep.measured
  return comp


def compare(estimate, rep: CompiledReport) -> dict[str, Any]:
  """Symbolic (simulator.memory.MemoryEstimate) vs compiled, where they correspond.

  arguments  = params + optimizer + batch (+ tile padding when both the estimate's
               chip and the target are TPUs)      vs argument_size_in_bytes
  temp       = compiled_comparable_peak - arguments (the live set of the peak
               phase; see simulator.memory)                       vs temp_size
  peak       = the estimate's peak (overhead included) vs the compiled peak; and
               `peak_no_overhead` = the estimate's compiled_comparable_peak
               (arguments + the largest phase live set, no overhead): the
               figure to compare with XLA's peak.
  relative error = (symbolic - compiled) / compiled.
  """
  sym = symbolic_side(estimate, rep.target)
  comp = compiled_side(rep)
  # XLA:GPU compiles a program larger than the device with a warning only:
  # the compiled peak is held against what the step may use here.
  comp["capacity_bytes"] = int(estimate.hbm_bytes)
  comp["fits"] = rep.peak_bytes <= estimate.hbm_bytes
  return {"symbolic": sym, "compiled": comp, "relative_error": errors(sym, comp)}


def compare_flops(dots, xla_flops: float | None) -> dict[str, Any] | None:
  """The traced step's matmul FLOPs on one device vs `cost_analysis()`'s
  flops, counted the way XLA's HloCostAnalysis counts them: a while loop's
  body once, whatever its trip count (so each traced matmul once, nested
  loops included). XLA's figure adds the elementwise ops' FLOPs (one per
  element), the matmuls' are all of the symbolic one; None where the
  compiler gives no cost analysis (the CUDA plugin's deviceless path)."""
  if not xla_flops:
    return None
  s = float(sum(d.flops_per_device for d in dots))
  return {"symbolic": s, "xla": float(xla_flops),
          "relative_error": (s - xla_flops) / xla_flops}


def compare_hbm_bytes(program, xla_bytes: float | None
                      ) -> dict[str, Any] | None:
  """The step-time model's HBM bytes on one device (simulator.timing.
  roofline's: each matmul's operands read and result written, each other
  fusion's reads and writes) vs `cost_analysis()`'s "bytes accessed",
  counted as XLA's HloCostAnalysis counts: a while loop's body once. XLA's
  figure also counts the collectives', copies' and host transfers' bytes,
  which the model times apart, and follows XLA's own fusions, not the
  model's; None where the compiler gives no cost analysis."""
  if not xla_bytes:
    return None
  s = float(sum(program.hbm_bytes_once()))
  return {"symbolic": s, "xla": float(xla_bytes),
          "relative_error": (s - xla_bytes) / xla_bytes}


def compare_collectives(symbolic, hlo_summary: dict[str, dict[str, int]]
                        ) -> dict[str, Any]:
  """Per-device bytes per step by "kind@axis": the traced program's collectives
  (simulator.timing.comms) vs the compiled HLO's, both as V (the gathered result of an
  all-gather, the unreduced input of a reduce-scatter, the array otherwise).

  XLA may rewrite what the shardings imply (an all-reduce plus a slice for a
  reduce-scatter, gathers moved out of or into the layer loop, combined ops),
  so kinds can differ where the totals agree.
  """
  sym: dict[str, int] = {}
  for c in symbolic:
    kind = "collective-permute" if c.kind == "permute" else c.kind
    key = f"{kind}@{c.axis}"
    sym[key] = sym.get(key, 0) + int(c.bytes_per_device) * int(c.count)
  hlo = {k: v["out_bytes"] if k.startswith("all-gather") else v["in_bytes"]
         for k, v in hlo_summary.items()}
  s, h = sum(sym.values()), sum(hlo.values())
  return {"symbolic": dict(sorted(sym.items())), "hlo": hlo,
          "symbolic_bytes": s, "hlo_bytes": h,
          "relative_error": (s - h) / h if h else None}
