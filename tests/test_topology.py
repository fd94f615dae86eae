"""Topology parsing: Cloud names count TensorCores or chips, libtpu strings count chips."""

import pytest

from meshes import topology
from meshes.topology import parse_topology


@pytest.mark.parametrize("name,chips,shape", [
    ("v5p-128", 64, (4, 4, 4)),  # v5p counts 2 TensorCores per chip
    ("v5p-8", 4, (2, 2, 1)),
    ("v5p-512", 256, (4, 8, 8)),
    ("v4-32", 16, (2, 2, 4)),
    ("v5e-256", 256, (16, 16)),  # v5e counts chips
    ("v5litepod-16", 16, (4, 4)),
    ("v6e-64", 64, (8, 8)),
    (" V5P-128 ", 64, (4, 4, 4)),
])
def test_cloud_names(name, chips, shape):
  topo = parse_topology(name)
  assert (topo.chips, topo.shape) == (chips, shape)


@pytest.mark.parametrize("name,chips,libtpu", [
    ("v5p:4x4x4", 64, "v5p:4x4x4"),
    ("v6e:8x8", 64, "v6e:8x8"),
    ("v5e:16x16", 256, "v5e:16x16"),
    ("tpu7x:2x2x1", 4, "tpu7x:2x2x1"),
    ("v5p-128", 64, "v5p:4x4x4"),
    ("v4-32", 16, "v4:2x2x4"),
])
def test_libtpu_names(name, chips, libtpu):
  topo = parse_topology(name)
  assert topo.chips == chips
  assert topo.libtpu_name == libtpu


@pytest.mark.parametrize("name,text", [
    ("v5p-128", "v5p-128 (64 chips, 4x4x4)"),
    ("v5p:4x4x4", "v5p-128 (64 chips, 4x4x4)"),
    ("v5e-256", "v5e-256 (256 chips, 16x16)"),
    ("tpu7x:2x2x1", "tpu7x:2x2x1 (4 chips, 2x2x1)"),
    ("h100:8", "h100:8 (8 GPUs, one NVLink domain)"),
    ("h100:1", "h100:1 (1 GPU)"),
    ("h100:2x8", "h100:2x8 (16 GPUs: 2 hosts x 8, NVLink inside a host, "
     "InfiniBand NDR, 400 Gb/s per GPU between hosts)"),
    ("v5p-256x2", "v5p-256x2 (256 chips: 2 slices of v5p-256 (128 chips, "
     "4x4x8), DCN, 50 Gb/s per chip between slices)"),
])
def test_describe_always_prints_chip_count(name, text):
  assert parse_topology(name).describe() == text


@pytest.mark.parametrize("name,wrap", [
    ("v5p-128", (True, True, True)),  # a full cube wraps on every axis
    ("v5p-512", (True, True, True)),
    ("v5p:4x4x12", (True, True, True)),
    ("v5p-64", (False, False, False)),  # 2x4x4: no optical switch, no wraps
    ("v4-32", (False, False, False)),  # 2x2x4: Scaling Book's own example
    ("v5e-256", (True, True)),
    ("v6e-128", (False, True)),  # 8x16 wraps on the 16 axis only
    ("v5e-64", (False, False)),
    ("h100:8", (True,)),
])
def test_wraparound(name, wrap):
  assert parse_topology(name).wraparound == wrap


def test_gpu_domain():
  topo = parse_topology("h100:8")
  assert topo.chip.name == "h100-sxm"
  assert (topo.shape, topo.fully_connected) == ((8,), True)
  assert parse_topology("h200:4").chip.name == "h200"
  with pytest.raises(ValueError, match="GPU topology"):
    topo.libtpu_name


@pytest.mark.parametrize("name,chip,hosts,per_host,network", [
    ("h100:2x8", "h100-sxm", 2, 8, 5e10),  # DGX H100: ConnectX-7 400 Gb/s per GPU
    ("h200:4x8", "h200", 4, 8, 5e10),
    ("a100:2x4", "a100-80gb", 2, 4, 2.5e10),  # DGX A100: HDR 200 Gb/s per GPU
    ("h100:1x8", "h100-sxm", 1, 8, 5e10),
    ("v5p-256x2", "v5p", 2, 128, 6.25e9),  # Cloud v5p: DCN 50 Gbps per chip
])
def test_hosts_and_their_network(name, chip, hosts, per_host, network):
  topo = parse_topology(name)
  assert (topo.chip.name, topo.hosts, topo.chips_per_host) == (
      chip, hosts, per_host)
  assert topo.chips == hosts * per_host
  assert topo.network.bandwidth == network


def test_single_slice_has_no_network_and_h100_8_is_one_host():
  assert parse_topology("v5p-128").network is None
  assert parse_topology("h100:8").hosts == 1
  assert parse_topology("v5p-256x2").libtpu_name == "v5p:4x4x8"


def test_every_listed_cloud_name_round_trips():
  names = topology.list_topologies()
  assert {"v5p-128", "v5e-256", "v4-32", "v6e-256"} <= set(names)
  for name in names:
    assert parse_topology(name).describe().startswith(f"{name} (")


@pytest.mark.parametrize("name,named", [
    ("v9-128", "'v9'"),  # unknown generation
    ("tpu7x-8", "'tpu7x'"),  # TPU7x only as a libtpu string
    ("v5p-127", "127"),  # odd TensorCore count
    ("v5p-96", "'v5p-96'"),  # not a standard slice
    ("v5e-512", "'v5e-512'"),  # bigger than a pod
    ("v5p-0", "size 0"),
    ("v5p--8", "size -8"),
    ("v5p:0x4x4", "size 0"),
    ("v5p:4x-4x4", "size -4"),
    ("v5p:4x4", "'v5p:4x4'"),  # wrong rank
    ("v5p:2x4x8", "'v5p:2x4x8'"),  # not whole cubes
    ("v5e:3x3", "'v5e:3x3'"),
    ("v5p:4xx4", "'4xx4'"),
    ("foo:4x4", "'foo'"),
    ("h100:16", "'h100:16'"),  # more than one NVLink domain: write h100:2x8
    ("h100:2x16", "e.g. h100:8 or h100:2x8"),
    ("h100:1x2x8", "'h100:1x2x8'"),
    ("h100:0x8", "size 0"),
    ("v6e-16x2", "no per-chip DCN bandwidth is known for v6e"),
    ("v5p-8x0", "0 slices"),
    ("v5p-8xx2", "'v5p-8xx2'"),
    ("garbage", "'garbage'"),
    ("", "''"),
    ("v5p:4096x4096x4096", "the largest v5p slice has 6144"),
])
def test_bad_input_names_the_value(name, named):
  with pytest.raises(ValueError) as info:
    parse_topology(name)
  message = str(info.value)
  assert named in message
  assert "\n" not in message


def test_bad_cloud_name_lists_valid_choices():
  with pytest.raises(ValueError, match=r"valid: v5p-8, v5p-16, .*v5p-128"):
    parse_topology("v5p-96")


@pytest.mark.parametrize("name,per_vm", [
    ("v5p-8", 4), ("v5p-16", 4), ("v5p-256x2", 4), ("v4-32", 4),
    ("v5e-8", 8), ("v5e-16", 4), ("v6e-4", 4), ("v6e-8", 8),
    ("h100:8", 8), ("h100:2x8", 8), ("a100:2x4", 4)])
def test_devices_per_host_machine(name, per_vm):
  """Cloud's tables: v4/v5p VMs drive 4 chips; v5e/v6e up to 8 in a
  single-host slice, 4 per host beyond; a GPU node its GPUs."""
  assert parse_topology(name).chips_per_vm == per_vm
