"""NVIDIA GPU clusters described without a GPU: deviceless compiles through the
CUDA PJRT plugin (the `gpu` extra: jax-cuda12-plugin and jax-cuda12-pjrt 0.10.2).

`jax.experimental.topologies.get_topology_desc(platform="cuda",
target_config=TEXT, topology="1xNxG")` gives N hosts of G devices of the GPU
that TEXT (XLA's `GpuTargetConfigProto` in text form) describes; a jitted step
lowers and compiles for them and `memory_analysis()` answers, with the CPU as
the only local backend. TEXT comes from XLA's own specs, kept in
`meshes/gpu_specs/` with their source named in each file. On a real GPU,
`xla_client.get_topology_for_devices(jax.devices()).target_config` gives it.
"""

from __future__ import annotations

import importlib.util
import pathlib
import re

from meshes.quiet import native_stderr_quiet
from meshes.topology import Topology

SPECS_DIR = pathlib.Path(__file__).parent / "gpu_specs"
SPECS = {"h100-sxm": "h100_sxm.txtpb", "h200": "h200.txtpb",
         "a100-80gb": "a100_sxm_80.txtpb"}
INSTALL = 'pip install -e ".[gpu]"'
# The CUDA 12 plugin is the `gpu` extra's; a machine with JAX's CUDA 13 build
# (jax-cuda13-plugin) compiles the same way.
PLUGINS = ("xla_cuda12", "xla_cuda13")


def target_config(chip_name: str) -> str:
  """XLA's GpuTargetConfigProto text for `chip_name`."""
  if chip_name not in SPECS:
    raise ValueError(f"no XLA target config for {chip_name!r}; known: "
                     f"{', '.join(SPECS)}")
  return (SPECS_DIR / SPECS[chip_name]).read_text()


def _installed(module: str) -> bool:
  try:
    return importlib.util.find_spec(module) is not None
  except ModuleNotFoundError:  # no jax_plugins package at all
    return False


def devices(topology: Topology) -> list:
  """The topology's devices, host-major (device id = host * G + local)."""
  if topology.chip.kind != "gpu":
    raise ValueError(f"{topology.name} is not a GPU topology")
  if not any(_installed(f"jax_plugins.{name}") for name in PLUGINS):
    raise ValueError(f"compiling for {topology.name} without a GPU needs the "
                     f"CUDA plugin: {INSTALL}")
  from jax.experimental import topologies  # pylint: disable=g-import-not-at-top
  with native_stderr_quiet():  # the plugin logs that this host has no driver
    desc = topologies.get_topology_desc(
        platform="cuda", target_config=target_config(topology.chip.name),
        topology=f"1x{topology.hosts}x{topology.chips_per_host}")
  out = sorted(desc.devices, key=lambda d: d.id)
  if len(out) != topology.chips:
    raise ValueError(f"the CUDA plugin describes {topology.name} as {len(out)} "
                     f"devices for {topology.chips} GPUs")
  return out


def local_target_config() -> str:
  """The local GPUs' GpuTargetConfigProto text, as XLA reads it off the
  device (jax has no public API for it: this is the one place that reaches
  into jax._src for it)."""
  import jax  # pylint: disable=g-import-not-at-top
  from jax._src.lib import xla_client  # pylint: disable=g-import-not-at-top
  return str(xla_client.get_topology_for_devices(jax.devices()).target_config)


def sm_count_and_major(chip_name: str) -> tuple[int, int]:
  """(SMs, compute capability major) of `chip_name`, read off its target
  config: what XLA:GPU's cost models (the split-K rewriter's) see of it."""
  text = target_config(chip_name)
  cores = re.search(r"\bcore_count:\s*(\d+)", text)
  major = re.search(r"cuda_compute_capability\s*{\s*major:\s*(\d+)", text)
  if not cores or not major:
    raise ValueError(f"{SPECS[chip_name]} names no core_count or "
                     f"cuda_compute_capability major")
  return int(cores.group(1)), int(major.group(1))
