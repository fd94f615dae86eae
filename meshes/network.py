"""The tier between hosts: InfiniBand between GPU nodes, DCN between TPU slices.

A GPU topology `h100:NxG` is N hosts of G GPUs; inside a host every GPU reaches
every other through NVSwitch (one NVLink domain, `Chip.ici_link_bandwidth`
one-way per GPU), between hosts each GPU has its own NIC on a rail-optimised
fabric (NVIDIA's DGX SuperPOD design: GPU i of every node on leaf switch i). A
TPU multi-slice topology `v5p-256x2` is N slices joined by the data-center
network (DCN), as MaxText's `dcn_*_parallelism` lays its outer mesh axes.

Figures are one-way bytes/s per device (GPU or chip):

  [dgxh100]  NVIDIA DGX H100 datasheet: "8x NVIDIA ConnectX-7 ... up to 400 Gb/s
             InfiniBand/Ethernet" for the 8 GPUs: 400 Gb/s = 5e10 B/s per GPU
  [dgxh200]  NVIDIA DGX H200 datasheet: the same 8x ConnectX-7 at 400 Gb/s
  [dgxa100]  NVIDIA DGX A100 datasheet: "8x Single-Port Mellanox ConnectX-6 VPI
             200Gb/s HDR InfiniBand" for compute: 2.5e10 B/s per GPU
  [v5p]      https://cloud.google.com/tpu/docs/v5p: "Data center network (DCN)
             bandwidth per chip (Gbps) 50" = 6.25e9 B/s per chip
  [v5e]      https://cloud.google.com/tpu/docs/v5e: "Data center network
             bandwidth per Pod 6.4 Tbps" over its 256 chips, and "Per-host NIC
             configuration 2 x 100 Gbps NIC" over a host's 8 chips: both 25
             Gb/s = 3.125e9 B/s per chip
Generations without a published per-chip DCN figure here have no multi-slice
topology.
"""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True)
class Network:
  """The inter-host tier of a topology: its name and one-way B/s per device."""

  name: str
  bandwidth: float  # one-way bytes/s per GPU (its NIC) or per TPU chip (DCN)
  hosts_word: str  # "hosts" (GPU nodes) or "slices" (TPU)


NETWORKS: dict[str, Network] = {
    "h100-sxm": Network("InfiniBand NDR, 400 Gb/s per GPU", 5e10, "hosts"),  # [dgxh100]
    "h200": Network("InfiniBand NDR, 400 Gb/s per GPU", 5e10, "hosts"),  # [dgxh200]
    "a100-80gb": Network("InfiniBand HDR, 200 Gb/s per GPU", 2.5e10, "hosts"),  # [dgxa100]
    "v5p": Network("DCN, 50 Gb/s per chip", 6.25e9, "slices"),  # [v5p]
    "v5e": Network("DCN, 25 Gb/s per chip", 3.125e9, "slices"),  # [v5e]
}


def network_for(chip_name: str) -> Network | None:
  """The inter-host tier for `chip_name`'s systems, or None where none is known."""
  return NETWORKS.get(chip_name)
