"""GPU clusters compiled without a GPU through the CUDA plugin (the `gpu`
extra): XLA's target configs load, 2 hosts x 8 GPUs lay out host-major, and a
small train step compiles for h100:2x8 with its arguments exact."""

import pytest

from meshes import gpu_target
from meshes.layout import device_mesh, plan_mesh
from meshes.topology import parse_topology

pytest.importorskip("jax_plugins.xla_cuda12",
                    reason='the gpu extra: pip install -e ".[gpu]"')


@pytest.mark.parametrize("chip,name,memory", [
    ("h100-sxm", "NVIDIA H100 80GB HBM3", 84942979072),
    ("h200", "NVIDIA H200 141GB HBM3e", 151397597184),
    ("a100-80gb", "NVIDIA A100-SXM4-80GB", 85100068864),
])
def test_target_configs_are_xlas_less_the_unknown_field(chip, name, memory):
  text = gpu_target.target_config(chip)
  assert f'device_description_str: "{name}"' in text
  assert f"device_memory_size: {memory}" in text
  assert "collective_memory_granularity:" not in text


@pytest.mark.parametrize("chip,sms", [("h100-sxm", (132, 9)),
                                      ("h200", (132, 9)),
                                      ("a100-80gb", (108, 8))])
def test_the_split_k_cost_model_reads_sms_and_generation(chip, sms):
  assert gpu_target.sm_count_and_major(chip) == sms


def test_two_hosts_of_eight():
  devices = gpu_target.devices(parse_topology("h100:2x8"))
  assert [d.process_index for d in devices] == [0] * 8 + [1] * 8
  assert devices[0].device_kind == "NVIDIA H100 80GB HBM3"
  mesh = device_mesh(plan_mesh(parse_topology("h100:2x8"), 4, 4))
  # Y (TP) inside a host, X over hosts: each row of Y is one host's GPUs.
  for row in mesh.devices:
    assert len({d.process_index for d in row}) == 1
  assert {d.process_index for d in mesh.devices[:, 0]} == {0, 1}


def test_unknown_gpu_is_refused():
  with pytest.raises(ValueError, match="no XLA target config"):
    gpu_target.target_config("v5p")


def test_step_compiles_for_h100_2x8_with_arguments_exact():
  from models.presets import PRESETS
  from simulator.xla import compiled
  from simulator.settings import TrainSettings
  settings = TrainSettings(batch=8, seq=128, remat="full")
  rep = compiled.compile_report(PRESETS["tiny"], settings, "h100:2x8", 8, 2,
                                progress=None)
  assert rep.mesh == (8, 2)
  assert rep.argument_bytes == rep.symbolic_arguments["arguments"]
  assert rep.peak_bytes >= rep.argument_bytes
  assert rep.collectives  # FSDP gathers over X, TP over Y, in the HLO
