"""The X (FSDP/data) by Y (tensor) mesh laid over a slice's physical ICI axes.

M_X and M_Y (TPU Scaling Book notation) count the physical axes each mesh axis spans:
collectives over a mesh axis run on that many axes' links at once, so its bandwidth is
M times one axis's. Y (tensor parallelism, the most communication per FLOP) is laid
first, on whole physical axes where the sizes allow, and X takes what is left. A mesh
axis that covers part of a physical axis still counts that axis in its M, but gets no
wraparound there: its ring is a line, which roughly doubles ring-collective time.

Over several hosts (GPU nodes, TPU slices: `Topology.hosts`) Y stays inside a host
where it fits (tensor parallelism on NVLink / ICI, as everyone runs it) and X spans
the hosts: MaxText's `dcn_fsdp_parallelism` = hosts with `ici_tensor_parallelism`
= Y (its `dcn_data_parallelism` is the replicas D, below). A Y larger than a
host takes whole hosts (`y_hosts`) and X the rest (`x_hosts`); the axes'
physical layout inside a host is the single-host one.

Pipeline stages (`P` > 1, --pp) are a third mesh axis, outermost, as MaxText
lays `stage` first in its mesh and Megatron puts pipeline ranks across nodes:
P·X is laid out as X alone would be, and P takes its major part (the hosts
first, then the major physical axes), X the minor part. With P = 1 the mesh
is the X × Y one, unchanged.

Data-parallel replicas (`D` > 1, --dp) are laid out the same way, outermost:
the batch is split over D·X, the weights and optimizer state are sharded
over X alone and replicated over D (hybrid sharding: MaxText's `data` axis,
outermost in its mesh, which `dcn_data_parallelism` puts across slices).
A plan has stages or replicas, not both.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
import os
import re
from typing import TYPE_CHECKING

from meshes.quiet import native_stderr_quiet
from meshes.topology import Topology

# jax and numpy are imported where a mesh is made (the functions at the end):
# planning a layout needs neither, and a sweep whose every result is cached
# makes no mesh (meshes.quiet.quiet_jax_import).
if TYPE_CHECKING:
  import numpy as np
  from jax.sharding import AbstractMesh, Mesh

AXIS_NAMES = ("X", "Y")
STAGE_AXIS = "P"  # pipeline stages, only in a mesh with P > 1
REPLICA_AXIS = "D"  # data-parallel replicas, only in a mesh with D > 1


@dataclasses.dataclass(frozen=True)
class MeshPlan:
  """How the X x Y mesh maps onto `topology`'s physical axes.

  x_axes / y_axes list the physical axes each mesh axis spans, major to minor.
  y_split[a] is how many of axis a's chips Y takes (1: none, shape[a]: all); where
  both share an axis, Y takes the contiguous inner part and X strides over it.
  M_X / M_Y default to len(x_axes) / len(y_axes) (0 for a size-1 mesh axis) and may
  be overridden to reproduce a paper's assumptions. x_hosts / y_hosts: how many
  hosts each mesh axis spans (their product is topology.hosts); the axis's
  devices inside one host are its size divided by that.
  """

  topology: Topology
  X: int
  Y: int
  x_axes: tuple[int, ...]
  y_axes: tuple[int, ...]
  M_X: int
  M_Y: int
  wrap_x: bool
  wrap_y: bool
  y_split: tuple[int, ...]
  x_hosts: int = 1
  y_hosts: int = 1
  P: int = 1  # pipeline stages: the major part of what x_axes span
  stage_hosts: int = 1  # hosts P spans (x_hosts: those X spans, P's minor)
  D: int = 1  # data-parallel replicas, laid out as P is
  replica_hosts: int = 1  # hosts D spans

  @property
  def outer(self) -> tuple[str, int, int] | None:
    """(name, size, hosts) of the outer axis (stages P or replicas D), or
    None for an X x Y mesh."""
    if self.P > 1:
      return STAGE_AXIS, self.P, self.stage_hosts
    if self.D > 1:
      return REPLICA_AXIS, self.D, self.replica_hosts
    return None

  @property
  def axis_names(self) -> tuple[str, ...]:
    """("X", "Y"), or ("P", "X", "Y") with pipeline stages, ("D", "X", "Y")
    with data-parallel replicas."""
    return ((self.outer[0],) if self.outer else ()) + AXIS_NAMES

  @property
  def axis_sizes(self) -> tuple[int, ...]:
    return ((self.outer[1],) if self.outer else ()) + (self.X, self.Y)

  @property
  def chips(self) -> int:
    """Devices in the mesh: P·D·X·Y."""
    return self.P * self.D * self.X * self.Y

  @property
  def data(self) -> int:
    """The data shards the batch is split over: D·X."""
    return self.D * self.X

  def hosts(self, axis: str) -> int:
    """How many hosts mesh axis `axis` spans (1: it stays inside a host)."""
    return {"X": self.x_hosts, "Y": self.y_hosts,
            STAGE_AXIS: self.stage_hosts,
            REPLICA_AXIS: self.replica_hosts}[axis]

  def size(self, axis: str) -> int:
    """The devices along mesh axis `axis` (X, Y, P or D)."""
    return {"X": self.X, "Y": self.Y, STAGE_AXIS: self.P,
            REPLICA_AXIS: self.D}[axis]

  def local(self, axis: str) -> int:
    """The devices of mesh axis `axis` inside one host."""
    return self.size(axis) // self.hosts(axis)

  def crossing(self) -> str:
    """Which of its axes cross hosts (slices on a TPU): 'X over 2 hosts'."""
    word = "hosts" if self.topology.chip.kind == "gpu" else "slices"
    axes = [a for a in (STAGE_AXIS, REPLICA_AXIS, "X", "Y")
            if self.size(a) > 1 and self.hosts(a) > 1]
    return " and ".join(f"{a} over {self.hosts(a)} {word}" for a in axes) or (
        f"inside one {word[:-1]}" if self.topology.hosts == 1
        else f"inside one of the {word}")

  def describe(self) -> str:
    """E.g. 'mesh 16x4 on v5p-128 (64 chips, 4x4x4): X spans axes (1, 2) ...';
    on GPUs, which of an axis's GPUs share a host's NVLink and which talk
    over the network."""
    def axis(name, axes, m, wrap):
      hosts = self.hosts(name)
      if self.topology.fully_connected:  # NVSwitch: no torus axes to span
        size = self.size(name)
        link = ("" if size == 1 else " (inside a host: NVLink)" if hosts == 1
                else f" ({hosts} hosts x {self.local(name)}: the network "
                     "between hosts)")
        return f"{name}={size}{link}"
      ring = "wraparound" if wrap else "no wraparound"
      net = (f", {hosts} {self.topology.network.hosts_word} x "
             f"{self.local(name)}" if hosts > 1 else "")
      return f"{name} spans axes {axes} (M_{name}={m}, {ring}{net})"
    stages = ""
    if self.outer:
      name, size, hosts = self.outer
      where = (f"across {hosts} {self.topology.network.hosts_word}"
               if hosts > 1 else "the major part of X's physical axes")
      what = ("pipeline stages" if name == STAGE_AXIS else
              "data-parallel replicas (weights sharded over X alone)")
      stages = f"; {name}={size} {what} outermost ({where}), X the rest"
    return (f"mesh {mesh_name(self.X, self.Y, self.P, self.D)} on "
            f"{self.topology.describe()}: "
            f"{axis('X', self.x_axes, self.M_X, self.wrap_x)}; "
            f"{axis('Y', self.y_axes, self.M_Y, self.wrap_y)}{stages}")


def crossing_line(topology: Topology, named: list[tuple[str, str]]) -> str:
  """The line reports print under a table of meshes on several hosts (slices):
  which axis of each (name, `MeshPlan.crossing()`) crosses the network."""
  return (f"across {topology.network.hosts_word} ({topology.network.name}): "
          + "; ".join(f"{name} {crossing}" for name, crossing in named))


def mesh_name(X: int, Y: int, P: int = 1, D: int = 1) -> str:
  """'16x4', with pipeline stages 'P2x8x4', with replicas 'D2x8x4'."""
  if P > 1:
    return f"P{P}x{X}x{Y}"
  return f"{X}x{Y}" if D == 1 else f"D{D}x{X}x{Y}"


def factorizations(n: int) -> list[tuple[int, int]]:
  """Every (X, Y) with X * Y == n, X ascending."""
  if n <= 0:
    raise ValueError(f"cannot factor {n} devices; need a positive count")
  return [(x, n // x) for x in range(1, n + 1) if n % x == 0]


def divisors(n: int) -> list[int]:
  """The positive divisors of n, ascending (what pp, dp and an axis's
  degree may be on n chips)."""
  return [x for x, _ in factorizations(n)]


def parse_mesh(text: str) -> tuple[int, int]:
  """'16x4' -> (16, 4)."""
  match = re.fullmatch(r"\s*(-?\d+)\s*x\s*(-?\d+)\s*", text.lower())
  if match is None:
    raise ValueError(f"malformed mesh {text!r}; expected XxY, e.g. 16x4")
  x, y = int(match.group(1)), int(match.group(2))
  if x <= 0 or y <= 0:
    raise ValueError(f"mesh {text!r} has a size <= 0; both X and Y must be positive")
  return x, y


def parse_mesh_name(text: str) -> tuple[int, int, int]:
  """(X, Y, D) from 'XxY' or mesh_name's replicas form 'D2x16x1'."""
  match = re.fullmatch(r"\s*D(\d+)x(.*)", text)
  if match is None:
    return (*parse_mesh(text), 1)
  d = int(match.group(1))
  if d <= 0:
    raise ValueError(f"mesh {text!r} has D={d}; replicas must be positive")
  return (*parse_mesh(match.group(2)), d)


def plan_mesh(topology: Topology, X: int, Y: int, m_x: int | None = None,
              m_y: int | None = None, P: int = 1, D: int = 1) -> MeshPlan:
  """Lays Y, then X, over the physical axes; see the module docstring. With
  P > 1 stages (or D > 1 replicas), P·X is laid out as X and P takes its
  major part."""
  if P != 1 and D != 1:
    raise ValueError(f"pp={P} with dp={D}: a plan has pipeline stages or "
                     "data-parallel replicas, not both; choose pp=1 or dp=1")
  for flag, n, what in (("pp", P, "stages"), ("dp", D, "replicas")):
    if n <= 0:
      raise ValueError(f"{flag}={n} must be a positive number of {what}")
    if n > 1 and (X <= 0 or Y <= 0 or n * X * Y != topology.chips):
      raise ValueError(
          f"{flag}={n} x mesh {X}x{Y} has {n * X * Y} devices but "
          f"{topology.name} has {topology.chips} {topology.chips_word}; "
          f"choose X*Y = "
          f"{topology.chips}/{flag}")
  outer = max(P, D)
  if outer > 1:
    base = plan_mesh(topology, outer * X, Y, m_x, m_y)
    hosts = math.gcd(outer, base.x_hosts)
    held = ({"P": P, "stage_hosts": hosts} if P > 1 else
            {"D": D, "replica_hosts": hosts})
    return dataclasses.replace(base, X=X, x_hosts=base.x_hosts // hosts,
                               **held)
  if X <= 0 or Y <= 0 or X * Y != topology.chips:
    valid = ", ".join(f"{x}x{y}" for x, y in mesh_shapes(topology))
    raise ValueError(
        f"mesh {X}x{Y} has {X * Y} devices but {topology.name} has "
        f"{topology.chips} {topology.chips_word}; valid meshes: {valid}")
  axes = len(topology.shape)
  for name, m in (("m_x", m_x), ("m_y", m_y)):
    if m is not None and not 0 < m <= axes:
      raise ValueError(
          f"{name}={m} must be a positive number of physical axes, at most "
          f"{topology.name}'s {axes} "
          f"({'x'.join(map(str, topology.shape))}); choose 1 to {axes}")
  x_hosts, y_hosts = _host_split(topology, X, Y)
  shape = topology.shape
  y_local = Y // y_hosts
  y_axes, y_split = _lay_out(shape, y_local)
  x_axes = tuple(a for a, s in enumerate(shape) if s // y_split[a] > 1)
  spans_all = topology.fully_connected
  wrap_y = y_local > 1 and all(
      topology.wraparound[a] and (spans_all or y_split[a] == shape[a])
      for a in y_axes)
  wrap_x = X // x_hosts > 1 and all(
      topology.wraparound[a] and (spans_all or y_split[a] == 1) for a in x_axes)
  return MeshPlan(
      topology=topology, X=X, Y=Y, x_axes=x_axes, y_axes=y_axes,
      M_X=len(x_axes) if m_x is None else m_x,
      M_Y=len(y_axes) if m_y is None else m_y,
      wrap_x=wrap_x, wrap_y=wrap_y, y_split=y_split, x_hosts=x_hosts,
      y_hosts=y_hosts)


def _host_split(topology: Topology, X: int, Y: int) -> tuple[int, int]:
  """(x_hosts, y_hosts): Y inside a host when it divides the host's chips, else
  over whole hosts; see the module docstring."""
  per_host, hosts = topology.chips_per_host, topology.hosts
  if per_host % Y == 0:
    return hosts, 1
  if Y % per_host == 0 and hosts % (Y // per_host) == 0:
    return hosts // (Y // per_host), Y // per_host
  valid = ", ".join(f"{x}x{y}" for x, y in mesh_shapes(topology))
  raise ValueError(
      f"mesh {X}x{Y} cannot be laid over {topology.name}: Y={Y} must divide a "
      f"host's {per_host} {topology.chips_word} or be a multiple of them; "
      f"valid meshes: {valid}")


def mesh_shapes(topology: Topology, outer: int = 1) -> list[tuple[int, int]]:
  """Every X x Y mesh `plan_mesh` lays over `topology`, X ascending; under
  an outer axis of `outer` (pipeline stages or replicas), every X x Y whose
  outer·X x Y mesh lays out."""
  per_host, hosts = topology.chips_per_host, topology.hosts
  return [(x // outer, y) for x, y in factorizations(topology.chips)
          if x % outer == 0 and (per_host % y == 0 or (
              y % per_host == 0 and hosts % (y // per_host) == 0))]


def _lay_out(shape: tuple[int, ...], y: int) -> tuple[tuple[int, ...], tuple[int, ...]]:
  """Physical axes for Y and Y's share of each: whole axes whose product is Y (as
  many as possible, for bandwidth), else whole axes that divide Y, then parts."""
  axes = [a for a, s in enumerate(shape) if s > 1]
  for r in range(len(axes), 0, -1):
    for combo in itertools.combinations(axes, r):
      if math.prod(shape[a] for a in combo) == y:
        return combo, tuple(s if a in combo else 1 for a, s in enumerate(shape))
  split = [1] * len(shape)
  order, rest = [], y
  for a in axes:
    if rest % shape[a] == 0:
      split[a], rest = shape[a], rest // shape[a]
      order.append(a)
  for a in axes:
    part = math.gcd(rest, shape[a]) if split[a] == 1 else 1
    if part > 1:
      split[a], rest = part, rest // part
      order.append(a)
  return tuple(order), tuple(split)


def abstract_mesh(plan: MeshPlan) -> AbstractMesh:
  """The device-free mesh for tracing, with Explicit axes named X and Y (and
  P first, with pipeline stages)."""
  from jax.sharding import AbstractMesh, AxisType  # pylint: disable=g-import-not-at-top
  return AbstractMesh(plan.axis_sizes, plan.axis_names,
                      axis_types=(AxisType.Explicit,) * len(plan.axis_names))


def device_mesh(plan: MeshPlan) -> Mesh:
  """The plan over compile-only devices for the topology (no TPU or GPU needed):
  libtpu's for TPU slices (`num_slices` of them for multi-slice), the CUDA
  plugin's for GPU hosts (meshes.gpu_target).

  v4 and v5p are asked for in megacore mode (one device per chip, as on real
  hardware); libtpu 0.0.52's default v4 config exposes each TensorCore as a device.
  TPU7x has no megacore config (2 devices per chip) and is refused.
  """
  import numpy as np  # pylint: disable=g-import-not-at-top
  from jax.sharding import AxisType, Mesh  # pylint: disable=g-import-not-at-top
  topo = plan.topology
  grid = np.empty((topo.hosts,) + topo.shape, dtype=object)
  if topo.chip.kind == "gpu":
    from meshes import gpu_target  # pylint: disable=g-import-not-at-top
    grid[...] = np.array(gpu_target.devices(topo), dtype=object).reshape(
        grid.shape)
  else:
    for d, host in _tpu_devices(topo):
      grid[(host,) + tuple(d.coords[:len(topo.shape)])] = d
  _, outer, outer_hosts = plan.outer or ("", 1, 1)
  px_hosts = plan.x_hosts * outer_hosts  # P·X (D·X) is laid out as X
  px_local = outer * plan.X // px_hosts
  hosts = [_arrange(grid[h], plan, px_local) for h in range(topo.hosts)]
  full = np.array(hosts, dtype=object).reshape(
      px_hosts, plan.y_hosts, px_local, plan.local("Y"))
  grid = full.transpose(0, 2, 1, 3).reshape(plan.axis_sizes)  # P: X's major
  return Mesh(grid, plan.axis_names,
              axis_types=(AxisType.Explicit,) * len(plan.axis_names))


def _tpu_devices(topo: Topology) -> list:
  """(device, slice index) for every chip of every slice, through libtpu."""
  # Compile-only use needs no exclusive hold on libtpu; without this a second
  # process (a test, a sweep beside a validate run) fails on libtpu's lockfile.
  os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")
  from jax.experimental import topologies  # pylint: disable=g-import-not-at-top
  config = "megacore" if topo.chip.megacore else "default"
  with native_stderr_quiet():
    devices = topologies.get_topology_desc(
        platform="tpu", topology_name=topo.libtpu_name,
        chip_config_name=config, num_slices=topo.hosts).devices
  if len(devices) != topo.chips:
    raise ValueError(
        f"libtpu describes {topo.name} as {len(devices)} devices for "
        f"{topo.chips} chips; device_mesh needs one device per chip")
  return [(d, getattr(d, "slice_index", 0)) for d in devices]


def _arrange(grid: np.ndarray, plan: MeshPlan, x_local: int) -> np.ndarray:
  """Reshapes one host's physical (coords-indexed) grid into its part of the
  X x Y mesh of `plan` (local X, P·X's with stages, by local Y)."""
  n = grid.ndim
  split_shape = [d for a, s in enumerate(grid.shape)
                 for d in (s // plan.y_split[a], plan.y_split[a])]
  x_order = plan.x_axes + tuple(a for a in range(n) if a not in plan.x_axes)
  y_order = plan.y_axes + tuple(a for a in range(n) if a not in plan.y_axes)
  perm = [2 * a for a in x_order] + [2 * a + 1 for a in y_order]
  return grid.reshape(split_shape).transpose(perm).reshape(x_local,
                                                          plan.local("Y"))


def cpu_mesh(X: int, Y: int, P: int = 1, D: int = 1) -> Mesh:
  """An X x Y (P x X x Y with stages, D x X x Y with replicas) mesh of CPU
  devices, for tests and small real runs."""
  name = mesh_name(X, Y, P, D)
  if X <= 0 or Y <= 0 or P <= 0 or D <= 0 or (P > 1 and D > 1):
    raise ValueError(f"cpu mesh {name} needs positive sizes, P or D")
  import jax  # pylint: disable=g-import-not-at-top
  import numpy as np  # pylint: disable=g-import-not-at-top
  from jax.sharding import AxisType, Mesh  # pylint: disable=g-import-not-at-top
  n = P * D * X * Y
  devices = jax.devices("cpu")
  if len(devices) < n:
    raise ValueError(
        f"cpu mesh {name} needs {n} CPU devices but "
        f"{len(devices)} exist; call jax.config.update('jax_num_cpu_devices',"
        f" {n}) before JAX initialises its backends")
  outer = ((STAGE_AXIS, P),) if P > 1 else ((REPLICA_AXIS, D),) if D > 1 else ()
  names = tuple(a for a, _ in outer) + AXIS_NAMES
  sizes = tuple(s for _, s in outer) + (X, Y)
  grid = np.array(devices[:n], dtype=object).reshape(sizes)
  return Mesh(grid, names, axis_types=(AxisType.Explicit,) * len(names))
