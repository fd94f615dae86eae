"""Collective times on GPU clusters as NCCL models them: ring, tree, NVLS and
hierarchical algorithms, a latency per hop and a bus bandwidth per tier.

Conventions are nccl-tests' (PERFORMANCE.md in NVIDIA/nccl-tests): an operation
of S bytes (all-reduce: the array; all-gather: the gathered output; reduce-
scatter: the unreduced input; simulator.timing.comms' V per device is exactly that S)
that takes t seconds has algBw = S/t and

    busBw = algBw · 2(n-1)/n (all-reduce),  algBw · (n-1)/n (all-gather,
            reduce-scatter),  algBw (permute),

the bytes each GPU's link carries per second, comparable with the hardware's
one-way peak. Here the bus bandwidth of each tier is that peak, one-way per GPU:
NVLink through NVSwitch inside a host (`Chip.ici_link_bandwidth`), the GPU's own
NIC between hosts (`meshes.network`). A ring over an axis with g GPUs in each of
h > 1 hosts runs g rings at once, one leaving each host through each of the g
GPUs' NICs (rail-optimised fabric), so its bus bandwidth is min(NVLink, g·NIC).

Latencies are NCCL's own model constants for the Simple protocol (the one NCCL
uses for the MB-sized collectives of training), from `src/graph/tuning.cc`
(baseLat / hwLat, NCCL 2.2x; microseconds): base 8.4; per step on NVLink 3.4
(ring) and 4.0 (tree), on the network 14.0 (ring and tree); NVLS 25.

    ring   t = 8.4 + (steps - net_steps)·3.4 + net_steps·14.0 µs + S·f/busBw,
           steps = 2(n-1) (all-reduce) or n-1, net_steps = 2(h-1) or h-1,
           f = 2(n-1)/n or (n-1)/n;
    tree   all-reduce only: 8.4 + 2·((g-1)·4.0 + log2(h)·14.0) µs + S·max(
           2/NVLink, c/(g·NIC)), c = 1 for 2 hosts, 2 for more (see `tree`);
    NVLS   all-reduce in one host of NVSwitch Hopper GPUs (NCCL's nvlsEfficiency
           is 0 before Hopper): 25 µs + S·f/NVLink. NCCL's tuner expects
           2·0.85·NVLink·(n-1)/n from NVLS; nccl-tests measure 460-480 GB/s of
           bus bandwidth on 8 H100s, just above the ring's 450 GB/s link bound,
           which is the figure used;
    hierarchical  h > 1: reduce-scatter inside the host, the collective across
           hosts on 1/g of the data (each GPU on its own NIC), all-gather inside.
           Not one of NCCL's algorithms (Ring, Tree, CollNet, NVLS, NVLSTree,
           PAT): a bound for a collective split into its in-host and
           cross-host stages, as a program can issue them; kept as a
           candidate, so a collective is never timed slower than it.

Protocols. NCCL runs each algorithm in one of three protocols and its tuner
models each (the same `tuning.cc`, `ncclTopoTuneModel`); the formulas above
are Simple's. LL (8-byte flag+data stores) and LL128 (128-byte lines) trade
bandwidth for latency, and NCCL picks them for small messages, the KB-sized
collectives of decoding:

    ring LL     base 6.6 µs, 0.6 µs a step on NVLink (1.0 with the network's
                post overhead across hosts), 2.7 across; busBw = min(llMaxBw,
                busBw/4) for an all-reduce or across hosts, else busBw/3;
    ring LL128  base 14.0 µs, 1.9 µs a step on NVLink, 4.0 across; busBw x 0.92
                (x 0.7 with one GPU a host);
    tree LL     base 6.8 µs, 0.6 on NVLink, 5.0 across; min(busBw/3.8, llMaxBw);
    tree LL128  base 14.0 µs, 1.25 on NVLink, 8.5 across; busBw x 7/9 in one
                host, x 120/128 across.

llMaxBw (NCCL's llMaxBws, GB/s): 87.7 in one host of Ampere or Hopper GPUs;
across hosts it turns on the host CPU: 39.0 (2 hosts) and 20.4 (more) on
Intel, 22.5 and 19.0 on AMD; DGX H100 and H200 hosts are Intel Xeon, DGX
A100's AMD EPYC (`HOST_CPUS`). LL128's per-channel caps (perChMax*LL128Bws)
need NCCL's channel count, which is not modelled: the 0.92 stands alone.

As NCCL does, `cost` takes the algorithm and protocol with the least time at
the given size.
"""

from __future__ import annotations

import math
from typing import NamedTuple

US = 1e-6
BASE = 8.4 * US  # baseLat, ring and tree, Simple
RING_HOP = {"nvlink": 3.4 * US, "net": 14.0 * US}  # hwLat ring Simple
TREE_HOP = {"nvlink": 4.0 * US, "net": 14.0 * US}  # hwLat tree Simple
NVLS_LATENCY = 25.0 * US  # hwLat NVLS Simple, NVLink
NVLS_CHIPS = frozenset({"h100-sxm", "h200"})  # NVSwitch gen 3 + Hopper
# getNetOverhead, the floor of a step's latency across hosts: 1 us on Intel
# hosts (2 on AMD ones; the Intel figure is used for both).
NET_OVERHEAD = 1.0 * US


class Protocol(NamedTuple):
  """One of NCCL's protocols for one algorithm (tuning.cc)."""

  base: float  # baseLat
  nvlink_hop: float  # hwLat NVLink
  net_hop: float  # hwLat NET


# LL and LL128 for the ring and the tree (Simple: BASE, RING_HOP, TREE_HOP).
RING_PROTOCOLS = {"LL": Protocol(6.6 * US, 0.6 * US, 2.7 * US),
                  "LL128": Protocol(14.0 * US, 1.9 * US, 4.0 * US)}
TREE_PROTOCOLS = {"LL": Protocol(6.8 * US, 0.6 * US, 5.0 * US),
                  "LL128": Protocol(14.0 * US, 1.25 * US, 8.5 * US)}
# llMaxBws: one host (Ampere, Hopper); across 2 hosts, across more, by the
# host CPU's vendor.
LL_MAX_ONE_HOST = 87.7e9
LL_MAX_HOSTS = {"intel": (39.0e9, 20.4e9), "amd": (22.5e9, 19.0e9)}
# The host CPUs of the DGX systems each GPU ships in (DGX A100: 2 AMD EPYC
# 7742; DGX H100 and H200: 2 Intel Xeon Platinum 8480C).
HOST_CPUS = {"a100-80gb": "amd", "h100-sxm": "intel", "h200": "intel"}


class Cost(NamedTuple):
  """Seconds of one collective: latency + V · per_byte."""

  latency: float
  per_byte: float
  algorithm: str
  protocol: str = "Simple"

  def time(self, nbytes: float) -> float:
    return self.latency + nbytes * self.per_byte


def bus_factor(kind: str, n: float) -> float:
  """nccl-tests' busBw / algBw for `kind` over n ranks."""
  if n <= 1:
    return 0.0
  if kind == "all-reduce":
    return 2 * (n - 1) / n
  if kind in ("all-gather", "reduce-scatter", "all-to-all"):
    return (n - 1) / n
  if kind == "permute":
    return 1.0
  raise ValueError(f"unknown collective kind {kind!r}")


def _steps(kind: str, n: float) -> float:
  return 2 * (n - 1) if kind == "all-reduce" else max(n - 1, 0)


def ring(kind: str, local: float, hosts: int, nvlink: float, nic: float
         ) -> Cost:
  """One ring over `local` GPUs in each of `hosts` hosts."""
  n = local * hosts
  if n <= 1:
    return Cost(0.0, 0.0, "none")
  steps, net_steps = _steps(kind, n), _steps(kind, hosts)
  latency = BASE + (steps - net_steps) * RING_HOP["nvlink"] + (
      net_steps * RING_HOP["net"])
  bus = nvlink if hosts == 1 else min(nvlink, local * nic)
  return Cost(latency, bus_factor(kind, n) / bus, "ring")


def ll_max_bandwidth(hosts: int, host_cpu: str) -> float:
  """NCCL's llMaxBw for `hosts` hosts of that CPU vendor."""
  if hosts <= 1:
    return LL_MAX_ONE_HOST
  two, more = LL_MAX_HOSTS[host_cpu]
  return two if hosts == 2 else more


def ring_protocol(kind: str, local: float, hosts: int, nvlink: float,
                  nic: float, protocol: str, ll_max: float) -> Cost:
  """The ring in LL or LL128: Simple's steps at the protocol's latencies,
  its bus bandwidth scaled as NCCL's tuner scales it."""
  simple = ring(kind, local, hosts, nvlink, nic)
  if simple.algorithm == "none":
    return simple
  n = local * hosts
  steps, net_steps = _steps(kind, n), _steps(kind, hosts)
  p = RING_PROTOCOLS[protocol]
  hop = max(p.nvlink_hop, NET_OVERHEAD) if hosts > 1 else p.nvlink_hop
  latency = p.base + (steps - net_steps) * hop + net_steps * p.net_hop
  bus = bus_factor(kind, n) / simple.per_byte
  if protocol == "LL":
    bus = min(ll_max, bus / (4 if kind == "all-reduce" or hosts > 1 else 3))
  else:
    bus *= 0.7 if local < 2 and hosts > 1 else 0.92
  return Cost(latency, bus_factor(kind, n) / bus, "ring", protocol)


def tree_protocol(local: float, hosts: int, nvlink: float, nic: float,
                  protocol: str, ll_max: float) -> Cost:
  """The double binary tree in LL or LL128 (see `tree`)."""
  simple = tree(local, hosts, nvlink, nic)
  p = TREE_PROTOCOLS[protocol]
  latency = p.base + 2 * ((local - 1) * p.nvlink_hop
                          + math.log2(hosts) * p.net_hop)
  if protocol == "LL":  # algBw = min(busBw/3.8, llMaxBw) / 2
    per_byte = max(3.8 * simple.per_byte, 2 / ll_max)
  else:
    per_byte = simple.per_byte / (7 / 9 if hosts == 1 else 120 / 128)
  return Cost(latency, per_byte, "tree", protocol)


def tree(local: float, hosts: int, nvlink: float, nic: float) -> Cost:
  """NCCL's double binary tree all-reduce, a chain inside each host, the
  stages pipelined so the slower one sets the time: in the chain every GPU
  sends S up and S down (NCCL's algBw = busBw/2); across hosts each host is
  inside one tree and a leaf of the other, so it sends 2S through its
  `local` NICs (S for 2 hosts: a root and a leaf of S/2 each)."""
  latency = BASE + 2 * ((local - 1) * TREE_HOP["nvlink"]
                        + math.log2(hosts) * TREE_HOP["net"])
  per_byte = 2 / nvlink
  if hosts > 1:
    per_byte = max(per_byte, (1 if hosts == 2 else 2) / (local * nic))
  return Cost(latency, per_byte, "tree")


def nvls(local: float, nvlink: float) -> Cost:
  """NVLink SHARP all-reduce: NVSwitch reduces; one host."""
  return Cost(NVLS_LATENCY, bus_factor("all-reduce", local) / nvlink, "nvls")


def hierarchical(kind: str, local: float, hosts: int, nvlink: float,
                 nic: float) -> Cost:
  """In-host reduce-scatter, the collective across hosts on 1/local of the
  data, in-host all-gather (whichever of the stages `kind` needs)."""
  inside = {"all-reduce": ("reduce-scatter", "all-gather"),
            "reduce-scatter": ("reduce-scatter",),
            "all-gather": ("all-gather",)}[kind]
  stages = [ring(k, local, 1, nvlink, nic) for k in inside]
  across = ring(kind, 1, hosts, nic, nic)
  return Cost(sum(s.latency for s in stages) + across.latency,
              sum(s.per_byte for s in stages) + across.per_byte / local,
              "hierarchical")


def candidates(kind: str, local: float, hosts: int, nvlink: float, nic: float,
               nvls_ok: bool, host_cpu: str = "intel") -> list[Cost]:
  """Every algorithm and protocol NCCL could run for `kind` here."""
  ll_max = ll_max_bandwidth(hosts, host_cpu)
  out = [ring(kind, local, hosts, nvlink, nic)]
  if local * hosts > 1:
    out += [ring_protocol(kind, local, hosts, nvlink, nic, p, ll_max)
            for p in RING_PROTOCOLS]
  if kind == "all-reduce" and local * hosts > 1:
    out.append(tree(local, hosts, nvlink, nic))
    out += [tree_protocol(local, hosts, nvlink, nic, p, ll_max)
            for p in TREE_PROTOCOLS]
    if hosts == 1 and nvls_ok and local > 1:
      out.append(nvls(local, nvlink))
  if hosts > 1 and local > 1 and kind in ("all-reduce", "reduce-scatter",
                                          "all-gather"):
    out.append(hierarchical(kind, local, hosts, nvlink, nic))
  return out


def cost(kind: str, nbytes: float, local: float, hosts: int, nvlink: float,
         nic: float, nvls_ok: bool, host_cpu: str = "intel") -> Cost:
  """The fastest algorithm and protocol at `nbytes` (nccl-tests' S) over
  local x hosts GPUs; `host_cpu`: the hosts' CPU vendor (HOST_CPUS).

  all-to-all: each GPU sends (n-1)/n of V, the share for other hosts through
  its NIC; permute: V over one hop (NVLink inside a host, the NIC across).
  """
  n = local * hosts
  if n <= 1:
    return Cost(0.0, 0.0, "none")
  if kind == "all-to-all":
    per_byte = (local - 1) / n / nvlink + (n - local) / n / nic
    hop = RING_HOP["net" if hosts > 1 else "nvlink"]
    return Cost(BASE + hop, per_byte, "p2p")
  if kind == "permute":
    bw, hop = (nic, RING_HOP["net"]) if hosts > 1 else (nvlink,
                                                       RING_HOP["nvlink"])
    return Cost(BASE + hop, 1 / bw, "p2p")
  return min(candidates(kind, local, hosts, nvlink, nic, nvls_ok, host_cpu),
             key=lambda c: (c.time(nbytes), c.latency))


def bus_bandwidth(kind: str, nbytes: float, n: int, c: Cost) -> float:
  """nccl-tests' busBw (B/s) of `c` at nbytes over n ranks."""
  return nbytes / c.time(nbytes) * bus_factor(kind, n)
