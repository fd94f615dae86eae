"""Mesh plans (M_X, M_Y, wraparound) and the meshes built from them."""

import math

# libtpu takes a per-process lock meant for real chips; compile-only topologies do not
# need it, and other processes on this host may hold it.

import jax  # noqa: E402
from jax.sharding import AxisType  # noqa: E402
import pytest  # noqa: E402

from meshes import layout  # noqa: E402
from meshes.topology import parse_topology  # noqa: E402

EXPLICIT = (AxisType.Explicit, AxisType.Explicit)


def _plan(name, x, y, **overrides):
  return layout.plan_mesh(parse_topology(name), x, y, **overrides)


@pytest.mark.parametrize("name,x,y,x_axes,y_axes,wrap_x,wrap_y", [
    # v5p-128 = 4x4x4, a full cube: wraparound on every axis.
    ("v5p-128", 16, 4, (1, 2), (0,), True, True),
    ("v5p-128", 64, 1, (0, 1, 2), (), True, False),
    ("v5p-128", 1, 64, (), (0, 1, 2), False, True),
    ("v5p-128", 8, 8, (1, 2), (0, 1), False, False),  # both split axis 1
    ("v5p-128", 4, 16, (2,), (0, 1), True, True),
    # v5e-256 = 16x16.
    ("v5e-256", 16, 16, (1,), (0,), True, True),
    ("v5e-256", 64, 4, (0, 1), (0,), False, False),
    ("v5e-256", 256, 1, (0, 1), (), True, False),
    # v5p-512 = 4x8x8.
    ("v5p-512", 64, 4, (1, 2), (0,), True, True),
    ("v5p-512", 32, 8, (0, 2), (1,), True, True),
    ("v5p-512", 16, 16, (1, 2), (0, 1), False, False),
    # v5p-64 = 2x4x4, below a cube: whole axes but no wraparound.
    ("v5p-64", 8, 4, (0, 2), (1,), False, False),
    # A switched NVLink domain forms a ring on any subset.
    ("h100:8", 2, 4, (0,), (0,), True, True),
])
def test_plan(name, x, y, x_axes, y_axes, wrap_x, wrap_y):
  plan = _plan(name, x, y)
  assert (plan.x_axes, plan.y_axes) == (x_axes, y_axes)
  assert (plan.M_X, plan.M_Y) == (len(x_axes), len(y_axes))
  assert (plan.wrap_x, plan.wrap_y) == (wrap_x, wrap_y)


@pytest.mark.parametrize("name,x,y,x_hosts,y_hosts", [
    ("h100:2x8", 2, 8, 2, 1),  # TP in the node, data parallel over InfiniBand
    ("h100:2x8", 4, 4, 2, 1),
    ("h100:2x8", 16, 1, 2, 1),
    ("h100:2x8", 1, 16, 1, 2),  # Y larger than a node takes both
    ("h100:4x8", 2, 16, 2, 2),
    ("v5p-256x2", 64, 4, 2, 1),  # MaxText: dcn_data_parallelism=2
])
def test_axes_over_hosts(name, x, y, x_hosts, y_hosts):
  plan = _plan(name, x, y)
  assert (plan.x_hosts, plan.y_hosts) == (x_hosts, y_hosts)
  assert plan.local("X") * plan.x_hosts == x
  assert plan.local("Y") * plan.y_hosts == y


def test_meshes_that_cannot_lay_over_hosts():
  topo = parse_topology("h100:3x8")
  assert (3, 8) in layout.mesh_shapes(topo)
  assert (2, 12) not in layout.mesh_shapes(topo)  # 12 neither divides 8 nor is 8k
  with pytest.raises(ValueError, match="Y=12 must divide a host's 8 GPUs"):
    _plan("h100:3x8", 2, 12)


def test_seed_004_mesh_on_v5p_128():
  plan = _plan("v5p:4x4x4", 16, 4)
  assert (plan.M_X, plan.M_Y, plan.wrap_x, plan.wrap_y) == (2, 1, True, True)
  assert plan.describe() == (
      "mesh 16x4 on v5p-128 (64 chips, 4x4x4): X spans axes (1, 2) "
      "(M_X=2, wraparound); Y spans axes (0,) (M_Y=1, wraparound)")


def test_a_gpu_mesh_says_which_axis_crosses_hosts_in_gpu_words():
  """No torus axes or wraparound on NVSwitch: each axis's GPUs inside a
  host (NVLink) or over hosts (the network)."""
  assert _plan("h100:2x8", 8, 2).describe().endswith(
      ": X=8 (2 hosts x 4: the network between hosts); Y=2 (inside a host: "
      "NVLink)")
  assert _plan("h100:8", 1, 8).describe().endswith(
      ": X=1; Y=8 (inside a host: NVLink)")


def test_overrides_change_only_m():
  plan = _plan("v5p-128", 8, 8, m_x=2, m_y=1)  # seed 004 uses M_X=2, M_Y=1 throughout
  default = _plan("v5p-128", 8, 8)
  assert (plan.M_X, plan.M_Y) == (2, 1) != (default.M_X, default.M_Y)
  assert (plan.x_axes, plan.y_axes) == (default.x_axes, default.y_axes)
  with pytest.raises(ValueError, match="m_y=0"):
    _plan("v5p-128", 8, 8, m_y=0)


@pytest.mark.parametrize("name", ["v5p-128", "v5p-512", "v5e-256", "v6e-128", "v4-32"])
def test_every_factorization_tiles_the_slice(name):
  topo = parse_topology(name)
  for x, y in layout.factorizations(topo.chips):
    plan = layout.plan_mesh(topo, x, y)
    assert math.prod(plan.y_split) == y
    assert math.prod(s // p for s, p in zip(topo.shape, plan.y_split)) == x


def test_wrong_device_count_lists_valid_meshes():
  with pytest.raises(ValueError) as info:
    _plan("v5p-128", 8, 4)
  assert str(info.value) == (
      "mesh 8x4 has 32 devices but v5p-128 has 64 chips; "
      "valid meshes: 1x64, 2x32, 4x16, 8x8, 16x4, 32x2, 64x1")


def test_parse_mesh_and_factorizations():
  assert layout.parse_mesh("16x4") == (16, 4)
  assert layout.parse_mesh(" 1X64 ") == (1, 64)
  assert layout.factorizations(8) == [(1, 8), (2, 4), (4, 2), (8, 1)]
  with pytest.raises(ValueError, match="cannot factor 0 devices"):
    layout.factorizations(0)


@pytest.mark.parametrize("text", ["16", "16x", "x4", "16x4x2", "axb", "0x4", "16x-4"])
def test_parse_mesh_rejects(text):
  with pytest.raises(ValueError, match=repr(text)):
    layout.parse_mesh(text)


def test_abstract_mesh_is_explicit():
  mesh = layout.abstract_mesh(_plan("v5p-128", 16, 4))
  assert mesh.axis_names == ("X", "Y")
  assert tuple(mesh.shape.values()) == (16, 4)
  assert mesh.axis_types == EXPLICIT


def test_device_mesh_v5p_8():
  pytest.importorskip("libtpu")
  mesh = layout.device_mesh(_plan("v5p:2x2x1", 2, 2))
  assert tuple(mesh.shape.values()) == (2, 2)
  assert mesh.axis_types == EXPLICIT
  assert len({d.id for d in mesh.devices.flat}) == 4
  assert mesh.devices[0, 0].device_kind == "TPU v5"


@pytest.mark.parametrize("x,y", layout.factorizations(64))
def test_device_mesh_follows_the_plan(x, y):
  pytest.importorskip("libtpu")
  plan = _plan("v5p:4x4x4", x, y)
  mesh = layout.device_mesh(plan)
  assert tuple(mesh.shape.values()) == (x, y)
  assert mesh.axis_types == EXPLICIT
  assert len({d.id for d in mesh.devices.flat}) == 64
  # Y takes the inner y_split[a] coordinates of axis a and X the outer ones, so moving
  # along Y (a row) keeps X's part of every coordinate, and moving along X keeps Y's.
  for a, part in enumerate(plan.y_split):
    for row in mesh.devices:
      assert len({d.coords[a] // part for d in row}) == 1
    for col in mesh.devices.T:
      assert len({d.coords[a] % part for d in col}) == 1


def test_device_mesh_v4_is_one_device_per_chip():
  pytest.importorskip("libtpu")
  mesh = layout.device_mesh(_plan("v4-32", 4, 4))  # libtpu's default would give 32
  assert mesh.devices.size == 16
  assert {d.core_on_chip for d in mesh.devices.flat} == {0}


def test_device_mesh_refuses_two_devices_per_chip():
  pytest.importorskip("libtpu")
  with pytest.raises(ValueError, match="tpu7x:2x2x1 as 8 devices for 4 chips"):
    layout.device_mesh(_plan("tpu7x:2x2x1", 2, 2))


def test_cpu_mesh():
  n = len(jax.devices("cpu"))
  mesh = layout.cpu_mesh(1, n)
  assert tuple(mesh.shape.values()) == (1, n)
  assert mesh.axis_types == EXPLICIT
  with pytest.raises(ValueError, match="jax_num_cpu_devices"):
    layout.cpu_mesh(n + 1, 1)


def test_multi_slice_device_mesh_puts_x_across_slices():
  # libtpu's num_slices: v5p-8x2 is 2 slices of 4 chips; X = 2 slices x 2.
  mesh = layout.device_mesh(_plan("v5p-8x2", 4, 2))
  slices = [[d.slice_index for d in row] for row in mesh.devices]
  assert slices == [[0, 0], [0, 0], [1, 1], [1, 1]]
  assert len({d.id for d in mesh.devices.flat}) == 8


def test_pipeline_stages_are_the_outermost_axis():
  """P x X x Y: P·X laid out as X alone, P its major part, so across TPU
  slices the stages take the slices (as Megatron puts pipeline ranks across
  nodes); with P = 1 the plan is the X x Y one."""
  plan = layout.plan_mesh(parse_topology("v5p-8x2"), 2, 2, P=2)
  assert plan.axis_names == ("P", "X", "Y") and plan.axis_sizes == (2, 2, 2)
  assert (plan.stage_hosts, plan.x_hosts, plan.local("X")) == (2, 1, 2)
  assert "P=2 pipeline stages outermost (across 2 slices)" in plan.describe()
  assert tuple(layout.abstract_mesh(plan).shape.values()) == (2, 2, 2)
  mesh = layout.device_mesh(plan)
  assert mesh.axis_names == ("P", "X", "Y")
  assert [{d.slice_index for d in mesh.devices[p].flat} for p in (0, 1)] == [
      {0}, {1}]
  one = parse_topology("v5p-8")
  assert layout.plan_mesh(one, 4, 1, P=1) == layout.plan_mesh(one, 4, 1)
  with pytest.raises(ValueError, match="pp=2 x mesh 2x2 has 8 devices but "
                     "v5p-8 has 4 chips"):
    layout.plan_mesh(one, 2, 2, P=2)


def test_data_parallel_replicas_are_laid_out_as_stages_are():
  """D x X x Y: D·X laid out as X alone, D its major part (the slices
  first, as MaxText's dcn_data_parallelism puts its data axis across
  slices); a plan has stages or replicas, not both."""
  plan = layout.plan_mesh(parse_topology("v5e-16x2"), 16, 1, D=2)
  assert plan.axis_names == ("D", "X", "Y") and plan.axis_sizes == (2, 16, 1)
  assert (plan.replica_hosts, plan.x_hosts, plan.chips, plan.data) == (
      2, 1, 32, 32)
  assert "D=2 data-parallel replicas (weights sharded over X alone) " \
         "outermost (across 2 slices)" in plan.describe()
  mesh = layout.device_mesh(plan)
  assert mesh.axis_names == ("D", "X", "Y")
  assert [{d.slice_index for d in mesh.devices[r].flat} for r in (0, 1)] == [
      {0}, {1}]
  inside = layout.plan_mesh(parse_topology("v5e-32"), 16, 1, D=2)
  assert (inside.replica_hosts, inside.size("D"), inside.hosts("D")) == (
      1, 2, 1)
  assert layout.mesh_name(16, 1, D=2) == "D2x16x1"
  assert layout.parse_mesh_name("D2x16x1") == (16, 1, 2)
  assert layout.parse_mesh_name("8x4") == (8, 4, 1)
  n = len(jax.devices("cpu")) + 1
  with pytest.raises(ValueError, match=f"cpu mesh D{n}x1x1 needs {n} CPU"):
    layout.cpu_mesh(1, 1, D=n)
  with pytest.raises(ValueError, match="a plan has pipeline stages or "
                     "data-parallel replicas, not both"):
    layout.plan_mesh(parse_topology("v5p-16"), 2, 1, P=2, D=2)
  with pytest.raises(ValueError, match="dp=3 x mesh 4x1 has 12 devices but "
                     "v5e-16 has 16 chips"):
    layout.plan_mesh(parse_topology("v5e-16"), 4, 1, D=3)


def test_a_plan_says_which_axis_crosses_the_hosts():
  assert _plan("h100:2x8", 1, 16).crossing() == "Y over 2 hosts"
  assert _plan("h100:2x8", 16, 1).crossing() == "X over 2 hosts"
  assert _plan("h100:8", 8, 1).crossing() == "inside one host"
  replicas = layout.plan_mesh(parse_topology("h100:2x8"), 8, 1, D=2)
  assert replicas.crossing() == "D over 2 hosts"
