"""Collectives of the traced train step and their time on ICI.

The collectives are read off the sharded program (simulator.tracing.program); this module
times them.

Ring cost (TPU Scaling Book, "Sharded Matrices" / "Training"): an all-gather over a
mesh axis of n devices whose per-device result is V bytes moves (n-1)/n·V bytes into
every device. On a ring with wraparound both directions carry data, so one physical
axis delivers W_ici = 2·w_link B/s per device (w_link: one-way bandwidth of one link);
without wraparound the axis is a line and effectively delivers w_link. A mesh axis laid
over M physical axes runs M rings at once. Hence

    T_all-gather = T_reduce-scatter = f · V / (M · W_axis),  W_axis = 2·w_link (wrap)
                                                                    or w_link (no wrap)
    T_all-reduce = 2 · T_reduce-scatter,   T_all-to-all = T_all-gather / 4,

with f = (n-1)/n (ring="exact") or f = 1 (ring="book", the Book's and seed 004's
large-n convention, the default). V is the per-device bytes of the gathered array
(all-gather) or of the unreduced input (reduce-scatter).

Seed 004 writes T = (total bytes)/W_ici with W_ici = 2·9e10 B/s for v5p and divides
by M_X / M_Y: exactly the formula above with f = 1, wraparound, w_link = 9e10.

Across TPU slices (an axis spanning h slices of l chips each, meshes.layout) the
collective is hierarchical, as XLA runs multi-slice collectives: the ICI ring
over l on V, plus the DCN ring over h on V/l with f = (h-1)/h, at the slice's
per-chip DCN bandwidth (meshes.network). GPU topologies are timed as NCCL times
them (simulator.timing.nccl): ring, tree, NVLS and hierarchical algorithms with
per-hop latencies. `collective_cost` picks the model for the topology.

Data-parallel replicas (mesh axis D, meshes.layout) are laid out as stages
are: their sums (the gradients', on each device's shard: simulator.tracing.
program._replicas_sum_on_shard) are rings over one physical axis without wraparound
inside a slice, and across slices the DCN ring over the slices.

Pipeline stages (mesh axis P, meshes.layout): a stage's send to the next
(a collective permute) is point to point, V bytes over one link to the
neighbouring chip (w_link, one way), or over the network between hosts
(per-chip DCN / InfiniBand bandwidth) where the stages span hosts; other
collectives over P (the finished micro-batch's sum) are rings over one
physical axis without wraparound (M_P = 1: P takes the major part of X's
axes, meshes.layout).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from meshes.layout import MeshPlan
from simulator.timing import nccl
from simulator.timing.nccl import Cost

if TYPE_CHECKING:
  from simulator.tracing.program import Collective

RINGS = ("book", "exact")


def axis_bandwidth(plan: MeshPlan, axis: str, link_bandwidth: float,
                   wraparound: bool | None = None) -> float:
  """Bytes/s one device moves over `axis`: M · (2·w_link with wraparound, else w_link)."""
  if axis in ("P", "D"):  # stages, replicas: see the module doc
    return link_bandwidth
  m = plan.M_X if axis == "X" else plan.M_Y
  wrap = (plan.wrap_x if axis == "X" else plan.wrap_y) if wraparound is None \
      else wraparound
  return max(m, 1) * link_bandwidth * (2 if wrap else 1)


def ring_time(kind: str, nbytes: float, n: float, bandwidth: float,
              ring: str = "book") -> float:
  """Seconds for one collective of `kind` over n devices at `bandwidth` (B/s)."""
  if ring not in RINGS:
    raise ValueError(f"ring={ring!r}; valid: {', '.join(RINGS)}")
  if n <= 1:
    return 0.0
  f = (n - 1) / n if ring == "exact" else 1.0
  base = f * nbytes / bandwidth
  if kind in ("all-gather", "reduce-scatter", "permute"):
    return base
  if kind == "all-reduce":
    return 2 * base
  if kind == "all-to-all":
    return base / 4
  raise ValueError(f"unknown collective kind {kind!r}")


def collective_cost(kind: str, axis: str, plan: MeshPlan, link_bandwidth: float,
                    ring: str = "book", wraparound: bool | None = None,
                    nbytes: float = 0.0, n: float | None = None) -> Cost:
  """The cost of one `kind` collective over mesh axis `axis` (n devices; default
  the plan's size of the axis, spread over the plan's hosts). `nbytes` (V)
  picks NCCL's algorithm on GPUs; TPU costs are linear in V."""
  n = plan.size(axis) if n is None else n
  hosts = plan.hosts(axis)
  topo = plan.topology
  if kind == "permute" and axis == "P":  # one send to the next stage
    over = topo.network.bandwidth if hosts > 1 else link_bandwidth
    return Cost(0.0, 1.0 / over if n > 1 else 0.0,
                "p2p" if hosts == 1 else "network")
  if topo.chip.kind == "gpu":
    return nccl.cost(kind, nbytes, n / hosts, hosts, link_bandwidth,
                     topo.network.bandwidth, topo.chip.name in nccl.NVLS_CHIPS,
                     nccl.HOST_CPUS.get(topo.chip.name, "intel"))
  bw = axis_bandwidth(plan, axis, link_bandwidth, wraparound)
  per_byte = ring_time(kind, 1.0, n / hosts, bw, ring)
  if hosts > 1:
    per_byte += ring_time(kind, hosts / n, hosts, topo.network.bandwidth,
                          "exact")
  return Cost(0.0, per_byte, "ring" if hosts == 1 else "ici+dcn")


def collective_time(c: Collective, plan: MeshPlan, link_bandwidth: float,
                    ring: str = "book", wraparound: bool | None = None) -> float:
  """Seconds for ONE execution of `c` (multiply by c.count for the step)."""
  return collective_cost(c.kind, c.axis, plan, link_bandwidth, ring, wraparound,
                         c.bytes_per_device).time(c.bytes_per_device)
