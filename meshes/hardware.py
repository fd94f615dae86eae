"""Per-chip hardware figures: the constants every memory and roofline estimate divides by.

Units: bytes (int) for capacity, B/s for bandwidth, FLOP/s (OP/s for int8) for compute.
Every figure carries its public source. Where sources disagree the choice is said here:

- HBM capacity is in GiB (2**30). Google Cloud lists TPU HBM as GiB (v5p, TPU7x tables
  say "(GiB)"); the Scaling Book writes the same capacities as "GB". NVIDIA's "80GB" /
  "141GB" are also binary capacities (an A100-80GB shows 81920 MiB in nvidia-smi).
- v5p: 95 GiB, not the 96 GiB physical figure. Cloud's v5p page: "Each TPU v5p chip has
  96 GiB of physical HBM. The table lists 95 GiB to account for HBM reserved for the TPU
  system and libtpu runtime ... JAX ... report the user-allocatable HBM." The Scaling
  Book's "96GB" is the physical capacity. Seed 004 says "95GB" and means this 95 GiB.
- Host link (PCIe), one way per chip: the Scaling Book's "PCIe bandwidth for TPU v4
  is 16GB / second each way", "typically around 1.5e10 bytes / second per chip"
  (v5e, v5p) and "Trillium (TPU v6e) has 32GB/s, about 2x higher than v5"; NVIDIA's
  datasheets give "PCIe Gen5: 128GB/s" (H100, H200 SXM) and "PCIe Gen4: 64GB/s"
  (A100 SXM) both ways together, half each way. TPU7x: none published here.
- ICI: one-way bandwidth per link from the Scaling Book's interconnect table (the v5p
  row, 9e10 one-way / 1.8e11 bidirectional, is the W_ici = 2 * 9e10 of seed 004; the
  Cloud page's 100 GB/s differs slightly, which the Book notes; one revision of the
  Book listed 1e11). 4.5e10 one-way / 9e10 bidi is the Book's v4 row, not v5p's.

Sources:
  [book]  TPU Scaling Book, "How to Think About TPUs", https://jax-ml.github.io/scaling-book/tpus/
  [v4]    https://cloud.google.com/tpu/docs/v4
  [v5e]   https://cloud.google.com/tpu/docs/v5e
  [v5p]   https://cloud.google.com/tpu/docs/v5p
  [v6e]   https://cloud.google.com/tpu/docs/v6e
  [7x]    https://cloud.google.com/tpu/docs/tpu7x
  [a100]  NVIDIA A100 Tensor Core GPU datasheet (SXM4 80GB column)
  [h100]  NVIDIA H100 Tensor Core GPU datasheet (H100 SXM column)
  [h200]  NVIDIA H200 Tensor Core GPU datasheet (H200 SXM column)
NVIDIA datasheets print tensor-core FLOP/s "with sparsity"; the dense figures below are
half of those.
"""

from __future__ import annotations

import dataclasses
from typing import Literal

GiB = 2**30


@dataclasses.dataclass(frozen=True)
class Chip:
  """One accelerator chip; `cores_per_chip` is how Cloud accelerator names count it."""

  name: str
  kind: Literal["tpu", "gpu"]
  hbm_bytes: int
  hbm_bandwidth: float  # B/s
  bf16_flops: float  # FLOP/s, dense
  int8_flops: float  # OP/s, dense
  ici_link_bandwidth: float  # one-way B/s per link (GPU: NVLink one-way per GPU)
  ici_links_per_chip: int
  torus_dims: int  # 3 for v4/v5p/TPU7x, 2 for v5e/v6e, 0 for GPUs (switched NVLink)
  cores_per_chip: int  # TensorCores per chip in Cloud names (v5p-128 = 64 chips)
  megacore: bool = False  # libtpu can fuse the chip's 2 TensorCores into one device
  mxu_size: int = 0  # systolic array edge (TPU MXU); 0: no tile padding modelled
  # What the device reached where one was measured (experiments.probe_gpu:
  # an 8192^3 bf16 matmul, a 4 GiB array read and written once); 0: not
  # measured, the datasheet's figure stands. Step times use these; MFU keeps
  # the datasheet's peak as its denominator.
  measured_bf16_flops: float = 0.0
  measured_hbm_bandwidth: float = 0.0
  # device_memory_size in the lent device's own XLA target config
  # (experiments.probe_gpu): the memory free when JAX makes its pool, of
  # which the pool is XLA_CLIENT_MEM_FRACTION (simulator.memory.
  # capacity.device_memory); 0: not measured.
  measured_memory_bytes: int = 0
  # One-way B/s between the chip and its host's memory (PCIe): what host
  # offload moves its bytes over; 0: not known, not timed.
  host_link_bandwidth: float = 0.0
  # libtpu's windowed einsum (simulator.tracing.windowed): the smallest
  # global contraction (at a bf16 result; twice it at f32) of a matmul
  # whose partial sums over Y are reduce-scattered over Y that libtpu runs
  # as a loop of collective-permutes over Y beside partial matmuls.
  # Probed by experiments/probe_windowed.py (single matmuls compiled for
  # the topology: the smallest contraction found windowed; the next
  # multiple of 4 down is not); 0: never (XLA:GPU's
  # --xla_gpu_threshold_for_windowed_einsum_mib defaults to 100000) or not
  # probed (TPU7x: libtpu has no megacore config for it here).
  windowed_einsum_contraction: int = 0

  @property
  def ici_bidirectional_bandwidth(self) -> float:
    """Bytes/s both ways over one link: the Scaling Book's W_ici on a wrapped axis."""
    return 2 * self.ici_link_bandwidth


CHIPS: dict[str, Chip] = {
    c.name: c
    for c in (
        Chip(
            name="v4",
            kind="tpu",
            hbm_bytes=32 * GiB,  # [v4] 32 GiB HBM2
            hbm_bandwidth=1.2e12,  # [book] 1.2e12
            bf16_flops=2.75e14,  # [v4] 275 TFLOPs, [book]
            int8_flops=2.75e14,  # [book] int8 column
            ici_link_bandwidth=4.5e10,  # [book] 4.5e10 one-way
            ici_links_per_chip=6,  # [book] 3D torus, 6 nearest neighbours
            torus_dims=3,
            cores_per_chip=2,  # [v4] v4-128 = 64 chips
            megacore=True,
            mxu_size=128,  # [book] 128x128 MXUs
            host_link_bandwidth=1.6e10,  # [book] 16 GB/s each way
            windowed_einsum_contraction=6120,  # probed, libtpu 0.0.52
        ),
        Chip(
            name="v5e",
            kind="tpu",
            hbm_bytes=16 * GiB,  # [v5e] 16 GB; [book] links it as "16GiB"
            hbm_bandwidth=8.19e11,  # [v5e] 819 GBps ([book] 8.1e11)
            bf16_flops=1.97e14,  # [v5e] 197 TFLOPs, [book]
            int8_flops=3.94e14,  # [book] 3.94e14 ([v5e] 393 TOPs)
            ici_link_bandwidth=4.5e10,  # [book] 4.5e10 one-way
            ici_links_per_chip=4,  # [v5e] 4 ICI ports per chip, 2D torus
            torus_dims=2,
            cores_per_chip=1,  # [v5e] one TensorCore per chip
            mxu_size=128,  # [book] 4 MXUs of 128x128 per TensorCore
            host_link_bandwidth=1.5e10,  # [book] ~1.5e10 per chip
            windowed_einsum_contraction=4224,  # probed, libtpu 0.0.52
        ),
        Chip(
            name="v5p",
            kind="tpu",
            hbm_bytes=95 * GiB,  # [v5p] 95 GiB user-allocatable (96 GiB physical)
            hbm_bandwidth=2.765e12,  # [v5p] 2765 GBps = 2575 GiBps ([book] 2.8e12)
            bf16_flops=4.59e14,  # [v5p] 459 TFLOPs, [book] 4.59e14
            int8_flops=9.18e14,  # [book] 9.18e14
            ici_link_bandwidth=9e10,  # [book] 9e10 one-way, 1.8e11 bidi (seed 004)
            ici_links_per_chip=6,  # [book] 3D torus, 6 nearest neighbours
            torus_dims=3,
            cores_per_chip=2,  # [v5p] "v5p-32 ... 32 TensorCores (16 chips)"
            megacore=True,
            mxu_size=128,  # [book] 4 MXUs of 128x128 per TensorCore
            host_link_bandwidth=1.5e10,  # [book] ~1.5e10 per chip
            windowed_einsum_contraction=4224,  # probed, libtpu 0.0.52
        ),
        Chip(
            name="v6e",
            kind="tpu",
            hbm_bytes=32 * GiB,  # [v6e] 32 GB
            hbm_bandwidth=1.638e12,  # [v6e] 1638 GBps ([book] 1.6e12)
            bf16_flops=9.18e14,  # [v6e] 918 TFLOPs ([book] 9.20e14)
            int8_flops=1.836e15,  # [v6e] 1836 TOPs
            ici_link_bandwidth=9e10,  # [book] 9e10 one-way
            ici_links_per_chip=4,  # [v6e] 4 ICI ports per chip, 2D torus
            torus_dims=2,
            cores_per_chip=1,  # [v6e] one TensorCore per chip
            mxu_size=256,  # [book] Trillium: 256x256 MXUs
            host_link_bandwidth=3.2e10,  # [book] 32 GB/s
            windowed_einsum_contraction=9836,  # probed, libtpu 0.0.52
        ),
        Chip(
            name="tpu7x",  # Ironwood; libtpu 0.0.52 knows "tpu7x:AxBxC"
            kind="tpu",
            hbm_bytes=192 * GiB,  # [7x] 192 GiB
            hbm_bandwidth=7.4e12,  # [book] 7.4e12
            bf16_flops=2.307e15,  # [7x] 2307 TFLOPs ([book] 2.30e15)
            int8_flops=4.614e15,  # [7x] 4614 TFLOPs FP8; [book] int8 column 4.61e15
            ici_link_bandwidth=9e10,  # [book] 9e10 one-way
            ici_links_per_chip=6,  # inferred: 3D torus of 4x4x4 cubes like v5p ([book] pod 4x4x576)
            torus_dims=3,
            cores_per_chip=2,  # [7x] two TensorCores, exposed as 2 devices (no megacore)
            mxu_size=256,  # inferred: 256x256 like v6e
        ),
        Chip(
            name="a100-80gb",
            kind="gpu",
            hbm_bytes=80 * GiB,  # [a100] 80GB HBM2e
            hbm_bandwidth=2.039e12,  # [a100] 2,039 GB/s
            bf16_flops=3.12e14,  # [a100] 312 TFLOPS dense (624 sparse)
            int8_flops=6.24e14,  # [a100] 624 TOPS dense (1248 sparse)
            ici_link_bandwidth=3e11,  # [a100] NVLink 600 GB/s total = 300 GB/s one-way
            ici_links_per_chip=1,  # one logical port into the NVSwitch (12 physical links)
            torus_dims=0,
            cores_per_chip=1,
            host_link_bandwidth=3.2e10,  # [a100] PCIe Gen4 64 GB/s both ways
        ),
        Chip(
            name="h100-sxm",
            kind="gpu",
            hbm_bytes=80 * GiB,  # [h100] 80GB HBM3
            hbm_bandwidth=3.35e12,  # [h100] 3.35 TB/s
            bf16_flops=9.895e14,  # [h100] 1,979 TFLOPS sparse / 2
            int8_flops=1.979e15,  # [h100] 3,958 TOPS sparse / 2
            ici_link_bandwidth=4.5e11,  # [h100] NVLink 900 GB/s total = 450 GB/s one-way
            ici_links_per_chip=1,  # one logical port into the NVSwitch (18 physical links)
            torus_dims=0,
            cores_per_chip=1,
            # experiments/data/h100_device.json (a lent H100 80GB HBM3,
            # jax 0.11.2): 804.1 TFLOP/s, 2,526.7 GB/s; its target config
            # (h100_device_target_config.txtpb): 85,017,493,504 B
            measured_bf16_flops=8.041e14,
            measured_hbm_bandwidth=2.5267e12,
            measured_memory_bytes=85_017_493_504,
            host_link_bandwidth=6.4e10,  # [h100] PCIe Gen5 128 GB/s both ways
        ),
        Chip(
            name="h200",
            kind="gpu",
            hbm_bytes=141 * GiB,  # [h200] 141GB HBM3e
            hbm_bandwidth=4.8e12,  # [h200] 4.8 TB/s
            bf16_flops=9.895e14,  # [h200] 1,979 TFLOPS sparse / 2
            int8_flops=1.979e15,  # [h200] 3,958 TOPS sparse / 2
            ici_link_bandwidth=4.5e11,  # [h200] NVLink 900 GB/s total = 450 GB/s one-way
            ici_links_per_chip=1,  # one logical port into the NVSwitch (18 physical links)
            torus_dims=0,
            cores_per_chip=1,
            # experiments/data/h200_device*.json (a lent NVIDIA H200, jax
            # 0.11.2; three runs of the probe, which read 670.0, 681.9 and
            # 773.7 TFLOP/s, 3,692.0, 3,432.2 and 3,610.3 GB/s): the
            # medians, 681.9 TFLOP/s and 3,610.3 GB/s; its target config
            # (h200_device_target_config.txtpb): 150,109,880,320 B
            measured_bf16_flops=6.819e14,
            measured_hbm_bandwidth=3.6103e12,
            measured_memory_bytes=150_109_880_320,
            host_link_bandwidth=6.4e10,  # [h200] PCIe Gen5 128 GB/s both ways
        ),
    )
}


def get_chip(name: str) -> Chip:
  """The registry entry for `name`; a ValueError lists the valid names."""
  try:
    return CHIPS[name]
  except KeyError:
    raise ValueError(
        f"unknown chip {name!r}; valid: {', '.join(CHIPS)}"
    ) from None
