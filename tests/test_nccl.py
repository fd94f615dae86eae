"""NCCL's collective model: conventions, latencies, choices, published busBw."""

import pytest

from meshes.hardware import get_chip
from meshes.network import network_for
from simulator.timing import nccl

GB = 1e9
LARGE = 8 * 2**30  # nccl-tests' -e 8G: the plateau the published figures read


def _bus(kind, chip, local, hosts, nbytes=LARGE):
  c = get_chip(chip)
  cost = nccl.cost(kind, nbytes, local, hosts, c.ici_link_bandwidth,
                   network_for(chip).bandwidth, chip in nccl.NVLS_CHIPS)
  return nccl.bus_bandwidth(kind, nbytes, local * hosts, cost), cost


def test_bus_factors_are_nccl_tests():
  # nccl-tests PERFORMANCE.md: all-reduce 2(n-1)/n, all-gather and
  # reduce-scatter (n-1)/n.
  assert nccl.bus_factor("all-reduce", 8) == 2 * 7 / 8
  assert nccl.bus_factor("all-gather", 16) == 15 / 16
  assert nccl.bus_factor("reduce-scatter", 4) == 3 / 4
  assert nccl.bus_factor("all-reduce", 1) == 0.0


def test_ring_latency_is_nccls():
  # tuning.cc, Simple: 8.4 + 14 steps x 3.4 us on NVLink for 8 ranks (56 us);
  # over 2 hosts 2 of the 30 steps cross the network at 14 us each.
  assert nccl.ring("all-reduce", 8, 1, 4.5e11, 5e10).latency == pytest.approx(
      56.0e-6)
  assert nccl.ring("all-reduce", 8, 2, 4.5e11, 5e10).latency == pytest.approx(
      (8.4 + 28 * 3.4 + 2 * 14.0) * 1e-6)
  assert nccl.ring("all-gather", 8, 2, 4.5e11, 5e10).latency == pytest.approx(
      (8.4 + 14 * 3.4 + 1 * 14.0) * 1e-6)


def test_ring_across_hosts_is_bound_by_the_nics_of_the_axis():
  # g GPUs of the axis per host leave through g NICs: min(NVLink, g·NIC).
  one = nccl.ring("all-gather", 1, 2, 4.5e11, 5e10)
  eight = nccl.ring("all-gather", 8, 2, 4.5e11, 5e10)
  assert one.per_byte == pytest.approx((1 / 2) / 5e10)
  assert eight.per_byte == pytest.approx((15 / 16) / 4e11)


@pytest.mark.parametrize("chip,local,hosts,low,high", [
    # 8 x H100 SXM, one node, all_reduce_perf busbw at large sizes: 460-480
    # GB/s ("NCCL-tests in practice", Alaya NeW, 2026-05-06,
    # docs.alayanew.com/en/docs/tech-blog/2026-05-06-nccl-tests).
    ("h100-sxm", 8, 1, 460, 480),
    # H100 SXM, NVLink + IB NDR, multi-node all_reduce busbw at 8 GB+:
    # 400-450 GB/s; A100 SXM with IB HDR: 250-300 GB/s (Saturn Cloud,
    # "Validating Multi-Node GPU Clusters with NCCL Tests", 2 nodes).
    ("h100-sxm", 8, 2, 400, 450),
    ("h200", 8, 2, 400, 450),
    ("a100-80gb", 8, 2, 250, 300),
])
def test_all_reduce_bus_bandwidth_against_published_nccl_tests(
    chip, local, hosts, low, high):
  """Within 5% of the published range; the figures the docs quote."""
  bus, _ = _bus("all-reduce", chip, local, hosts)
  assert 0.95 * low * GB <= bus <= 1.05 * high * GB


def test_algorithm_choice_follows_size_and_scale():
  assert _bus("all-reduce", "h100-sxm", 8, 1)[1].algorithm == "nvls"
  assert _bus("all-reduce", "a100-80gb", 8, 1)[1].algorithm == "ring"  # no NVLS
  # 2 hosts: the double tree sends S, not 2(n-1)/n·S, through each host's NICs.
  assert _bus("all-reduce", "h100-sxm", 8, 2)[1].algorithm == "tree"
  # 32 hosts, 8 MiB: the ring's 510 steps of latency lose to the tree's log2.
  small = _bus("all-reduce", "h100-sxm", 8, 32, 8 * 2**20)[1]
  assert small.algorithm == "tree"
  ring = nccl.ring("all-reduce", 8, 32, 4.5e11, 5e10)
  assert small.time(8 * 2**20) < ring.time(8 * 2**20)


def test_hierarchical_moves_one_gth_across_hosts():
  h = nccl.hierarchical("all-reduce", 8, 4, 4.5e11, 5e10)
  inside = 2 * (7 / 8) / 4.5e11
  across = 2 * (3 / 4) / 5e10 / 8
  assert h.per_byte == pytest.approx(inside + across)


def test_point_to_point_kinds():
  c = nccl.cost("permute", 1e6, 8, 2, 4.5e11, 5e10, True)
  assert c.per_byte == pytest.approx(1 / 5e10)
  a = nccl.cost("all-to-all", 1e6, 8, 1, 4.5e11, 5e10, True)
  assert a.per_byte == pytest.approx((7 / 8) / 4.5e11)
  assert nccl.cost("all-gather", 1e6, 1, 1, 4.5e11, 5e10, True).time(1e6) == 0
  with pytest.raises(ValueError, match="'gather'"):
    nccl.bus_factor("gather", 4)


def test_small_messages_take_nccls_low_latency_protocols():
  """tuning.cc's LL: 6.6 us + 0.6 us a step on NVLink, so a 64 KiB
  all-reduce over 8 GPUs takes ~16 us (Simple's 56 us of latency alone);
  its bandwidth is capped at llMaxBw, so 8 GiB stays with Simple."""
  small = nccl.cost("all-reduce", 64 * 2**10, 8, 1, 4.5e11, 5e10, False)
  assert (small.algorithm, small.protocol) == ("ring", "LL")
  assert small.latency == pytest.approx((6.6 + 14 * 0.6) * 1e-6)
  assert small.per_byte == pytest.approx(2 * 7 / 8 / 87.7e9)
  big = nccl.cost("all-reduce", LARGE, 8, 1, 4.5e11, 5e10, False)
  assert big.protocol == "Simple"
  ll128 = nccl.ring_protocol("all-gather", 8, 1, 4.5e11, 5e10, "LL128",
                             87.7e9)
  assert ll128.per_byte == pytest.approx((7 / 8) / (0.92 * 4.5e11))
  # across hosts llMaxBw turns on the host CPU: DGX A100's AMD EPYC
  assert nccl.ll_max_bandwidth(2, nccl.HOST_CPUS["a100-80gb"]) == 22.5e9
  assert nccl.ll_max_bandwidth(4, nccl.HOST_CPUS["h100-sxm"]) == 20.4e9
