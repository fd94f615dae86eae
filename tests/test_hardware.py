"""The chip registry: figures the seeds rely on, and lookups that fail loudly."""

import dataclasses

import pytest

from meshes import hardware


def test_v5p_figures_match_scaling_book_and_seed_004():
  v5p = hardware.get_chip("v5p")
  assert v5p.hbm_bytes == 95 * 2**30  # Cloud's user-allocatable 95 GiB
  assert v5p.bf16_flops == 4.59e14
  assert v5p.ici_link_bandwidth == 9e10
  # Seed 004's W_ici = 2 * 9e10: the bidirectional bandwidth of one wrapped link.
  assert v5p.ici_bidirectional_bandwidth == 2 * 9e10


@pytest.mark.parametrize("name,cores,dims,links", [
    ("v4", 2, 3, 6), ("v5p", 2, 3, 6), ("v5e", 1, 2, 4), ("v6e", 1, 2, 4),
    ("tpu7x", 2, 3, 6), ("h100-sxm", 1, 0, 1),
])
def test_core_counting_and_torus(name, cores, dims, links):
  chip = hardware.get_chip(name)
  assert (chip.cores_per_chip, chip.torus_dims, chip.ici_links_per_chip) == (
      cores, dims, links)


def test_registry_is_keyed_by_name_and_figures_are_positive():
  for name, chip in hardware.CHIPS.items():
    assert chip.name == name
    assert isinstance(chip.hbm_bytes, int)
    assert min(chip.hbm_bytes, chip.hbm_bandwidth, chip.bf16_flops,
               chip.int8_flops, chip.ici_link_bandwidth) > 0
    assert (chip.torus_dims == 0) == (chip.kind == "gpu")


def test_gpu_nvlink_is_one_way_per_gpu():
  assert hardware.get_chip("h100-sxm").ici_bidirectional_bandwidth == 9e11  # 900 GB/s
  assert hardware.get_chip("a100-80gb").ici_bidirectional_bandwidth == 6e11


def test_unknown_chip_names_value_and_choices():
  with pytest.raises(ValueError, match=r"unknown chip 'v9'; valid: v4, .*v5p.*h200"):
    hardware.get_chip("v9")


def test_chip_is_frozen():
  with pytest.raises(dataclasses.FrozenInstanceError):
    hardware.get_chip("v5p").hbm_bytes = 0


def test_mxu_sizes_follow_the_scaling_book():
  """128x128 MXUs through v5, 256x256 from v6e; GPUs: no MXU tile modelled."""
  from meshes.hardware import CHIPS
  assert [CHIPS[n].mxu_size for n in ("v4", "v5e", "v5p", "v6e")] == [
      128, 128, 128, 256]
  assert all(c.mxu_size == 0 for c in CHIPS.values() if c.kind == "gpu")
