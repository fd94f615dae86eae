"""How many bytes per device a step's buffers may use: what `fits` holds the
planned peak against.

TPU: the chip's user-allocatable HBM (meshes.hardware; libtpu reserves the rest).

GPU, as a JAX user meets it. Every figure below is a named line with its default
and source; none is fitted:

- device memory: what the driver reports, XLA's `device_memory_size` in its
  target config for the GPU (meshes.gpu_target; an H100 80GB reports
  84,942,979,072 B = 79.11 GiB, not 80 GiB), or a lent device's own figure
  where that is less (the H200: 150,109,880,320 B, not the spec's 141 GiB;
  `device_memory`).
- XLA's allocator pool: JAX preallocates XLA_CLIENT_MEM_FRACTION of it (or
  the name jaxlib 0.10 calls deprecated, XLA_PYTHON_CLIENT_MEM_FRACTION, read
  as jaxlib reads them: `mem_fraction`), default 0.75 (JAX docs, "GPU memory allocation": "JAX will preallocate 75% of
  the total GPU memory when the first JAX operation is run"); XLA's buffers
  (arguments, temporaries: XLA's peak, cuBLAS/cuDNN workspaces included, which
  XLA:GPU assigns as temp buffers) live in it. The env variable is read.
- outside the pool, from the rest: the CUDA context with cuBLAS/cuDNN handles,
  3 GiB (seed 002's "CUDA/cuBLAS (+~2-3 GB) cushion", its upper figure read as
  GiB); NCCL's buffers, one communicator per mesh axis wider than 1 (XLA keys
  its NCCL cliques by replica group: X, Y, and the replica and pipeline
  axes D and P), each at most 32 channels (NCCL's
  MAXCHANNELS) x 2 ring peers x NCCL_BUFFSIZE (default 4 MiB, NCCL's
  environment-variable docs): 256 MiB per communicator, an upper bound.
The step may use min(pool, device - outside): the pool, unless what the runtime
needs beside it does not fit in the rest (a MEM_FRACTION near 1).
"""

from __future__ import annotations

import dataclasses
import os
import re

from meshes.hardware import GiB
from meshes.layout import MeshPlan

MiB = 2**20
# The pool's share: jaxlib 0.10's name, and the older one it still reads
# (xla_client.generate_pjrt_gpu_plugin_options).
FRACTION_ENV = "XLA_CLIENT_MEM_FRACTION"
DEPRECATED_FRACTION_ENV = "XLA_PYTHON_CLIENT_MEM_FRACTION"
DEFAULT_FRACTION = 0.75  # JAX docs, "GPU memory allocation"
CUDA_CONTEXT_BYTES = 3 * GiB  # seed 002: CUDA/cuBLAS cushion, +~2-3 GB
NCCL_CHANNELS = 32  # NCCL MAXCHANNELS
NCCL_BUFFSIZE = 4 * MiB  # NCCL_BUFFSIZE default, 4194304
# XLA's --xla_gpu_memory_limit_slop_factor default: the share of the pool
# beyond the step's arguments that XLA:GPU schedules and rematerializes
# within (see GpuBudget.xla_memory_limit).
XLA_GPU_SLOP_PERCENT = 95


@dataclasses.dataclass(frozen=True)
class Line:
  """One figure of the GPU memory budget, with where its default comes from."""

  name: str
  bytes: int
  source: str


@dataclasses.dataclass(frozen=True)
class GpuBudget:
  """A GPU's memory as JAX divides it (see the module docstring)."""

  device_bytes: int
  fraction: float
  pool_bytes: int
  outside: tuple[Line, ...]

  @property
  def outside_bytes(self) -> int:
    return sum(x.bytes for x in self.outside)

  @property
  def capacity_bytes(self) -> int:
    """What the step's buffers may use: the pool, less any runtime overflow."""
    return min(self.pool_bytes, self.device_bytes - self.outside_bytes)

  def lines(self) -> tuple[Line, ...]:
    return (Line("device memory", self.device_bytes,
                 "the driver's figure: XLA's target config device_memory_size, "
                 "or a lent device's where less"),
            Line(f"XLA pool ({self.fraction:.0%})", self.pool_bytes,
                 f"{FRACTION_ENV} or {DEPRECATED_FRACTION_ENV}, default "
                 f"{DEFAULT_FRACTION} (JAX docs, GPU memory allocation)"),
            *self.outside)

  def xla_memory_limit(self, arguments_bytes: int) -> int:
    """The memory XLA:GPU's scheduler and rematerialization keep the step
    within on a device: its arguments plus XLA_GPU_SLOP_PERCENT of the rest
    of the pool (GetSchedulerMemoryLimit in XLA's gpu_hlo_schedule.cc:
    (base - inputs and outputs) x slop / 100, outputs aliased to donated
    inputs counted once, so for the train step, which donates its params
    and optimizer state, the arguments; base the module's
    device_memory_size, JAX's pool on a device; the rematerialization pass
    logs it with the arguments added). Above it XLA recomputes values, or
    gives up and the allocation fails: the lent H200's log for #173 said
    107,629,834,108 B, this 107,630,096,252 (262,144 B apart, the size of
    the step's two int32 token arrays; how the pass counts them was not
    read); the lent H100's for #30, 57.04 GiB, this 57.045 GiB."""
    rest = self.pool_bytes - arguments_bytes
    return arguments_bytes + rest * XLA_GPU_SLOP_PERCENT // 100

  def to_json(self, arguments_bytes: int | None = None) -> dict:
    out = {"device_bytes": self.device_bytes, "fraction": self.fraction,
           "pool_bytes": self.pool_bytes, "capacity_bytes": self.capacity_bytes,
           "outside": [dataclasses.asdict(x) for x in self.outside]}
    if arguments_bytes is not None:
      out["xla_memory_limit_bytes"] = self.xla_memory_limit(arguments_bytes)
    return out


def mem_fraction() -> float:
  """The pool's share as jaxlib reads it: XLA_CLIENT_MEM_FRACTION, else
  XLA_PYTHON_CLIENT_MEM_FRACTION, an empty value as unset, both set refused
  (jaxlib raises then); JAX's default 0.75 where neither is set."""
  new, old = (os.environ.get(name, "") for name in (FRACTION_ENV,
                                                     DEPRECATED_FRACTION_ENV))
  if new and old:
    raise ValueError(f"{FRACTION_ENV}={new!r} and {DEPRECATED_FRACTION_ENV}="
                     f"{old!r} are both set, which JAX refuses; keep "
                     f"{FRACTION_ENV}")
  name, text = (FRACTION_ENV, new) if new else (DEPRECATED_FRACTION_ENV, old)
  if not text:
    return DEFAULT_FRACTION
  try:
    value = float(text)
  except ValueError:
    raise ValueError(f"{name}={text!r} is not a number") from None
  if not 0 < value <= 1:
    raise ValueError(f"{name}={text!r} must be in (0, 1]")
  return value


def pool_share(topology) -> float | None:
  """The allocator pool's share on a GPU topology (`mem_fraction`), None on
  a TPU: what a plan's verdict turns on beside the plan itself."""
  return mem_fraction() if topology.chip.kind == "gpu" else None


def device_memory(chip_name: str) -> int:
  """The bytes the driver reports for the GPU: XLA's target config, or what
  a lent device of the chip reported where that is less.

  XLA sizes its pool as the fraction of the memory free when it makes it
  (`free_memory * memory_fraction`, the GPU BFC allocator's size in XLA's
  PJRT GPU client), and a device's own target config records that free
  memory as device_memory_size: the lent H100's pool was 0.75 of it to
  0.002%, the lent H200's to 0.001% (experiments/data/h*_device*). XLA's
  h200 spec says 141 GiB exactly, 1.3 GB more than the lent H200 had; a
  budget on the spec's figure would say "fits" for a peak over the pool."""
  from meshes import gpu_target  # pylint: disable=g-import-not-at-top
  from meshes.hardware import get_chip  # pylint: disable=g-import-not-at-top
  match = re.search(r"device_memory_size:\s*(\d+)",
                    gpu_target.target_config(chip_name))
  spec, measured = int(match.group(1)), get_chip(chip_name).measured_memory_bytes
  return min(spec, measured) if measured else spec


def gpu_budget(plan: MeshPlan) -> GpuBudget:
  """The budget of one GPU of `plan`'s topology."""
  device = device_memory(plan.topology.chip.name)
  fraction = mem_fraction()
  communicators = sum(1 for n in (plan.D, plan.P, plan.X, plan.Y) if n > 1)
  nccl = communicators * NCCL_CHANNELS * 2 * NCCL_BUFFSIZE
  return GpuBudget(device, fraction, int(fraction * device), (
      Line("CUDA context, cuBLAS/cuDNN", CUDA_CONTEXT_BYTES,
           "seed 002's CUDA/cuBLAS cushion, +~2-3 GB"),
      Line(f"NCCL buffers ({communicators} communicators)", nccl,
           "32 channels x 2 peers x NCCL_BUFFSIZE 4 MiB each, an upper "
           "bound")))


def capacity_bytes(plan: MeshPlan) -> int:
  """Bytes per device the step's buffers may use on `plan`'s topology."""
  if plan.topology.chip.kind == "gpu":
    return gpu_budget(plan).capacity_bytes
  return plan.topology.chip.hbm_bytes


def remat_limit_bytes(plan: MeshPlan) -> int | None:
  """XLA's rematerialization limit on `plan`'s chip, which the
  rematerialized-logits rule (simulator.memory.xla_rules) holds the step's
  peak against: on a TPU, REMAT_PERCENT of its HBM
  (--xla_jf_rematerialization_percent_shared_memory_limit in libtpu's
  dumped flagfile); None on a GPU (XLA:GPU has other limits)."""
  if plan.topology.chip.kind == "gpu":
    return None
  # The estimate's rule module, imported here: a sweep read from its cache
  # imports this module but not the estimators (simulator.search).
  from simulator.memory import xla_rules  # pylint: disable=g-import-not-at-top
  return plan.topology.chip.hbm_bytes * xla_rules.REMAT_PERCENT // 100


# The share of the capacity a plan's peak may use when asking for the largest
# batch: the fine-tuning playbook (seed 002) keeps 15-20% free.
HBM_FRACTION = 0.85


def check_hbm_fraction(fraction: float) -> None:
  """A one-line ValueError unless 0 < fraction <= 1."""
  if not 0 < fraction <= 1:
    raise ValueError(f"hbm_fraction={fraction} must be in (0, 1] (the share "
                     "of the capacity the peak may use; the playbook keeps "
                     f"15-20% free: {HBM_FRACTION})")
