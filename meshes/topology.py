"""Slice topologies: which chips, in what physical shape, with which torus wraparounds.

Two spellings are accepted and the chip count is always explicit:
- Cloud names ("v5p-128", "v5e-256", "v4-32", "v5litepod-16"): v4 and v5p count
  TensorCores (2 per chip, so v5p-128 is 64 chips); v5e and v6e count chips. The shape
  is the standard one Google Cloud provisions for that size.
- libtpu strings ("v5p:4x4x4", "v6e:8x8", "tpu7x:2x2x1") give the shape in chips;
  GPUs are written "h100:8" (8 GPUs of one NVLink domain) or "h100:NxG" (N hosts
  of G <= 8 GPUs, InfiniBand between them: meshes.network).
- TPU multi-slice: a Cloud name with "xN" ("v5p-256x2": 2 slices of v5p-256),
  the slices joined by DCN (meshes.network), as MaxText's multi-slice runs are.

`shape` is one host's (one slice's) chips; `hosts` counts hosts (slices).

Wraparound (TPU Scaling Book, "How to Think About TPUs", and Cloud's v5p page):
- v4/v5p (and TPU7x, assumed like v5p): wraparound links come from the optical switches
  that join whole 4x4x4 cubes, so a slice whose every axis is a multiple of 4 (4x4x4,
  4x4x8, ...) wraps on all axes, and a smaller slice (2x2x1, 2x2x4, 2x4x4) on none.
  Cloud: "All 4x4x4 and larger slices have full 3D torus connectivity. Slices smaller
  than a full cube ... don't have wrap-around links". (The Book's footnote "an axis
  which is a multiple of 4" is looser; its main text says 2x2x4 has no wraps.)
- v5e/v6e: one 16x16 2D torus; an axis wraps only when it is the full 16
  ("an 8x16 has a wraparound on the long axis").
- GPUs: the NVLink switch connects every pair, so the domain is treated as one
  fully connected axis (wraparound True).
"""

from __future__ import annotations

import dataclasses
import math
import re

from meshes import hardware
from meshes.network import Network, network_for

# Standard slice shapes per chip count (Cloud v4/v5p/v5e/v6e configuration tables).
_SHAPES_3D = {
    4: (2, 2, 1), 8: (2, 2, 2), 16: (2, 2, 4), 32: (2, 4, 4), 64: (4, 4, 4),
    128: (4, 4, 8), 256: (4, 8, 8), 512: (8, 8, 8), 1024: (8, 8, 16),
    2048: (8, 16, 16), 4096: (16, 16, 16), 6144: (16, 16, 24),
}
_SHAPES_2D = {
    1: (1, 1), 4: (2, 2), 8: (2, 4), 16: (4, 4), 32: (4, 8), 64: (8, 8),
    128: (8, 16), 256: (16, 16),
}
# Largest slice per generation: v4 pods are 16x16x16; v5p schedules up to 16x16x24.
_MAX_CHIPS = {"v4": 4096, "v5p": 6144, "v5e": 256, "v6e": 256}
_CLOUD_GENERATIONS = {"v4": "v4", "v5p": "v5p", "v5e": "v5e", "v5litepod": "v5e",
                      "v6e": "v6e"}
_GPU_ALIASES = {"a100": "a100-80gb", "h100": "h100-sxm"}
_GPU_MAX = 8  # one HGX board: 8 GPUs behind NVSwitch
_POD_2D = 16  # v5e/v6e pods are a single 16x16 torus
# Chips one TPU VM host drives (its host RAM serves them): Cloud's v4/v5p
# tables give 4 chips per host (v5p 2x2x1: 4 chips, 1 host; 2x2x2: 8 chips,
# 2 hosts); v5e's ("Chips per host: 8", DRAM per host 512 GiB) and v6e's
# single-host slices hold up to 8, their multi-host slices 4 per host.
_VM_CHIPS, _VM_CHIPS_SINGLE = 4, {"v5e": 8, "v6e": 8}


@dataclasses.dataclass(frozen=True)
class Topology:
  """`hosts` hosts (GPU nodes, TPU slices), each of `shape` chips per physical
  axis with `wraparound` per axis; hosts are joined by `network`."""

  name: str
  chip: hardware.Chip
  shape: tuple[int, ...]
  wraparound: tuple[bool, ...]
  hosts: int = 1

  @property
  def chips_per_host(self) -> int:
    return math.prod(self.shape)

  @property
  def chips(self) -> int:
    return self.hosts * self.chips_per_host

  @property
  def chips_word(self) -> str:
    """What a device is called in messages: "GPUs" or "chips"."""
    return "GPUs" if self.chip.kind == "gpu" else "chips"

  @property
  def chips_per_vm(self) -> int:
    """Devices one host machine (a GPU node, a TPU VM) drives, whose host
    memory it holds: a GPU node's GPUs; a TPU slice's chips up to the
    generation's single-host size, else 4 (_VM_CHIPS)."""
    if self.chip.kind == "gpu":
      return self.chips_per_host
    single = _VM_CHIPS_SINGLE.get(self.chip.name, _VM_CHIPS)
    return (self.chips_per_host if self.chips_per_host <= single
            else _VM_CHIPS)

  @property
  def network(self) -> Network | None:
    """The tier between hosts (None for a single TPU slice)."""
    return network_for(self.chip.name) if (
        self.hosts > 1 or self.chip.kind == "gpu") else None

  @property
  def fully_connected(self) -> bool:
    """True for a switched NVLink domain, where any subset of devices forms a ring."""
    return self.chip.kind == "gpu"

  @property
  def libtpu_name(self) -> str:
    """The string `jax.experimental.topologies.get_topology_desc` accepts."""
    if self.chip.kind != "tpu":
      raise ValueError(f"{self.name} is a GPU topology; it has no libtpu name")
    return f"{self.chip.name}:{_shape_str(self.shape)}"

  def describe(self) -> str:
    """E.g. 'v5p-128 (64 chips, 4x4x4)', whichever spelling it was parsed from."""
    if self.fully_connected and self.hosts == 1 and self.chips == 1:
      return f"{self.name} (1 GPU)"
    if self.fully_connected and self.hosts == 1:
      return f"{self.name} ({self.chips} GPUs, one NVLink domain)"
    if self.fully_connected:
      return (f"{self.name} ({self.chips} GPUs: {self.hosts} hosts x "
              f"{self.chips_per_host}, NVLink inside a host, "
              f"{self.network.name} between hosts)")
    label = self.name
    if self.chip.name in _MAX_CHIPS:  # a generation with Cloud names
      label = f"{self.chip.name}-{self.chips_per_host * self.chip.cores_per_chip}"
    one = f"{label} ({self.chips_per_host} chips, {_shape_str(self.shape)})"
    if self.hosts == 1:
      return one
    return (f"{label}x{self.hosts} ({self.chips} chips: {self.hosts} slices of "
            f"{one}, {self.network.name} between slices)")


def list_topologies() -> list[str]:
  """Cloud names of the standard slices, for help and error messages."""
  return [name for gen in _MAX_CHIPS for name in _cloud_names(gen)]


def parse_topology(name: str) -> Topology:
  """A Cloud name ('v5p-128', multi-slice 'v5p-256x2'), libtpu string
  ('v5p:4x4x4') or GPUs ('h100:8', 'h100:2x8': 2 hosts of 8)."""
  text = name.strip().lower()
  if ":" in text:
    prefix, _, dims = text.partition(":")
    chip = _chip_for_prefix(prefix, name)
    shape = _parse_dims(dims, name)
    if chip.kind == "gpu":
      return _gpu_topology(text, chip, shape, name)
    return _tpu_topology(text, chip, shape, name)
  match = re.fullmatch(r"([a-z][a-z0-9]*)-(-?\d+)(?:x(-?\d+))?", text)
  if match is None:
    raise ValueError(
        f"malformed topology {name!r}; expected a Cloud name like v5p-128 "
        f"(v5p-256x2: 2 slices), a libtpu string like v5p:4x4x4, or GPUs like "
        f"h100:8 or h100:2x8 (2 hosts of 8)")
  topo = _from_cloud_name(match.group(1), int(match.group(2)), name)
  if match.group(3) is None:
    return topo
  return _multi_slice(topo, int(match.group(3)), name)


def _multi_slice(topo: Topology, slices: int, name: str) -> Topology:
  if slices <= 0:
    raise ValueError(f"{slices} slices in {name!r} must be positive")
  if network_for(topo.chip.name) is None:
    known = ", ".join(c for c in _MAX_CHIPS if network_for(c))
    raise ValueError(
        f"{name!r}: no per-chip DCN bandwidth is known for {topo.chip.name}, so "
        f"no multi-slice topology; multi-slice generations: {known}")
  return dataclasses.replace(topo, name=name.strip().lower(), hosts=slices)


def _from_cloud_name(gen: str, count: int, name: str) -> Topology:
  if gen not in _CLOUD_GENERATIONS:
    raise ValueError(
        f"unknown TPU generation {gen!r} in {name!r}; valid Cloud generations: "
        f"{', '.join(_CLOUD_GENERATIONS)} (tpu7x:AxBxC for TPU7x, h100:8 for GPUs)")
  chip = hardware.get_chip(_CLOUD_GENERATIONS[gen])
  valid = ", ".join(_cloud_names(chip.name))
  if count <= 0:
    raise ValueError(f"size {count} in {name!r} must be positive; valid: {valid}")
  if count % chip.cores_per_chip:
    raise ValueError(
        f"{name!r}: {gen} names count TensorCores ({chip.cores_per_chip} per chip), "
        f"so {count} must be even; valid: {valid}")
  shape = _standard_shapes(chip).get(count // chip.cores_per_chip)
  if shape is None or count // chip.cores_per_chip > _MAX_CHIPS[chip.name]:
    raise ValueError(f"{name!r} is not a standard {gen} slice; valid: {valid}")
  return Topology(name.strip().lower(), chip, shape, _wraparound(chip, shape))


def _tpu_topology(text: str, chip: hardware.Chip, shape: tuple[int, ...],
                  name: str) -> Topology:
  if len(shape) != chip.torus_dims:
    raise ValueError(
        f"{name!r} has {len(shape)} axes but {chip.name} is a {chip.torus_dims}D "
        f"torus; e.g. {chip.name}:{'x'.join(['4'] * chip.torus_dims)}")
  if chip.torus_dims == 2:
    if any(d not in (1, 2, 4, 8, _POD_2D) for d in shape):
      raise ValueError(
          f"{name!r}: {chip.name} axes must be 1, 2, 4, 8 or 16 (a 16x16 pod)")
  elif not (all(d <= 4 for d in shape) or all(d % 4 == 0 for d in shape)):
    raise ValueError(
        f"{name!r}: {chip.name} axes must all be <= 4 or all multiples of 4 "
        f"(whole 4x4x4 cubes), e.g. 2x2x4 or 4x4x8")
  chips = math.prod(shape)
  if chip.name in _MAX_CHIPS and chips > _MAX_CHIPS[chip.name]:
    raise ValueError(
        f"{name!r} has {chips} chips; the largest {chip.name} slice has "
        f"{_MAX_CHIPS[chip.name]}")
  return Topology(text, chip, shape, _wraparound(chip, shape))


def _gpu_topology(text: str, chip: hardware.Chip, shape: tuple[int, ...],
                  name: str) -> Topology:
  if len(shape) > 2 or shape[-1] > _GPU_MAX:
    raise ValueError(
        f"{name!r}: a GPU host is one NVLink domain of 1 to {_GPU_MAX} GPUs; "
        f"write GPUs per host or hosts x GPUs per host, e.g. {text.partition(':')[0]}"
        f":8 or {text.partition(':')[0]}:2x8")
  hosts = shape[0] if len(shape) == 2 else 1
  if hosts > 1 and network_for(chip.name) is None:
    raise ValueError(f"{name!r}: no inter-host network is known for {chip.name}")
  return Topology(text, chip, shape[-1:], (True,), hosts)


def _wraparound(chip: hardware.Chip, shape: tuple[int, ...]) -> tuple[bool, ...]:
  if chip.torus_dims == 2:
    return tuple(d == _POD_2D for d in shape)
  full_cubes = all(d % 4 == 0 for d in shape)
  return tuple(full_cubes for _ in shape)


def _chip_for_prefix(prefix: str, name: str) -> hardware.Chip:
  chip_name = _GPU_ALIASES.get(prefix, prefix)
  if chip_name not in hardware.CHIPS:
    valid = sorted(set(hardware.CHIPS) | set(_GPU_ALIASES))
    raise ValueError(
        f"unknown chip {prefix!r} in {name!r}; valid: {', '.join(valid)}")
  return hardware.CHIPS[chip_name]


def _parse_dims(dims: str, name: str) -> tuple[int, ...]:
  if not re.fullmatch(r"-?\d+(x-?\d+)*", dims):
    raise ValueError(
        f"malformed shape {dims!r} in {name!r}; expected sizes joined by 'x', "
        f"e.g. v5p:4x4x4 or h100:8")
  shape = tuple(int(d) for d in dims.split("x"))
  bad = [d for d in shape if d <= 0]
  if bad:
    raise ValueError(f"size {bad[0]} in {name!r} must be positive")
  return shape


def _standard_shapes(chip: hardware.Chip) -> dict[int, tuple[int, ...]]:
  return _SHAPES_3D if chip.torus_dims == 3 else _SHAPES_2D


def _cloud_names(chip_name: str) -> list[str]:
  chip = hardware.get_chip(chip_name)
  return [f"{chip_name}-{n * chip.cores_per_chip}"
          for n in _standard_shapes(chip) if n <= _MAX_CHIPS[chip_name]]


def _shape_str(shape: tuple[int, ...]) -> str:
  return "x".join(str(d) for d in shape)
