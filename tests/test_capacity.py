"""What a step may use per device: TPU HBM, or the GPU's memory as JAX divides
it (pool fraction, CUDA context, NCCL buffers), each figure named."""

import json

import pytest

from meshes.hardware import GiB
from meshes.layout import plan_mesh
from meshes.topology import parse_topology
from simulator.memory import capacity


def _plan(name, x, y):
  return plan_mesh(parse_topology(name), x, y)


def test_tpu_capacity_is_the_chips_hbm():
  assert capacity.capacity_bytes(_plan("v5p-8", 4, 1)) == 95 * GiB


def test_xla_s_remat_limit_is_95_percent_of_a_tpu_s_hbm_only():
  """--xla_jf_rematerialization_percent_shared_memory_limit=95 (libtpu's
  flagfile); XLA:GPU has other limits: none."""
  assert capacity.remat_limit_bytes(_plan("v5p-8", 4, 1)) == 95 * GiB * 95 // 100
  assert capacity.remat_limit_bytes(_plan("v5e-16", 4, 4)) == 16 * GiB * 95 // 100
  assert capacity.remat_limit_bytes(_plan("h100:8", 8, 1)) is None


def test_h100_pool_is_75_percent_of_what_the_driver_reports(monkeypatch):
  for name in (capacity.FRACTION_ENV, capacity.DEPRECATED_FRACTION_ENV):
    monkeypatch.delenv(name, raising=False)
  budget = capacity.gpu_budget(_plan("h100:2x8", 8, 2))
  assert budget.device_bytes == 84942979072  # XLA's h100_sxm target config
  assert budget.pool_bytes == int(0.75 * 84942979072)
  assert budget.capacity_bytes == budget.pool_bytes
  assert [x.name for x in budget.lines()] == [
      "device memory", "XLA pool (75%)", "CUDA context, cuBLAS/cuDNN",
      "NCCL buffers (2 communicators)"]
  assert budget.outside[1].bytes == 2 * 32 * 2 * 4 * 2**20


def test_mem_fraction_is_read_and_the_runtime_binds_near_one(monkeypatch):
  monkeypatch.setenv(capacity.FRACTION_ENV, "0.99")
  budget = capacity.gpu_budget(_plan("h100:8", 8, 1))  # one communicator
  assert budget.fraction == 0.99
  assert budget.capacity_bytes == budget.device_bytes - 3 * GiB - 256 * 2**20
  monkeypatch.setenv(capacity.FRACTION_ENV, "lots")
  with pytest.raises(ValueError, match="'lots' is not a number"):
    capacity.mem_fraction()
  monkeypatch.setenv(capacity.FRACTION_ENV, "1.5")
  with pytest.raises(ValueError, match=r"must be in \(0, 1\]"):
    capacity.mem_fraction()


def test_the_pool_share_is_read_as_jaxlib_reads_it(monkeypatch):
  """jaxlib 0.10 reads XLA_CLIENT_MEM_FRACTION, else the deprecated
  XLA_PYTHON_CLIENT_MEM_FRACTION; an empty value is unset; both set it
  refuses."""
  for name in (capacity.FRACTION_ENV, capacity.DEPRECATED_FRACTION_ENV):
    monkeypatch.delenv(name, raising=False)
  monkeypatch.setenv(capacity.FRACTION_ENV, "0.6")
  assert capacity.mem_fraction() == 0.6
  monkeypatch.setenv(capacity.FRACTION_ENV, "")
  assert capacity.mem_fraction() == capacity.DEFAULT_FRACTION
  monkeypatch.setenv(capacity.DEPRECATED_FRACTION_ENV, "0.5")
  assert capacity.mem_fraction() == 0.5
  monkeypatch.setenv(capacity.FRACTION_ENV, "0.9")
  with pytest.raises(ValueError, match="are both set, which JAX refuses"):
    capacity.mem_fraction()


def test_every_mesh_axis_wider_than_one_has_its_communicator():
  """XLA keys its NCCL cliques by replica group: D and P too."""
  plan = plan_mesh(parse_topology("h100:2x8"), 4, 2, P=1, D=2)
  assert capacity.gpu_budget(plan).outside[1].name == (
      "NCCL buffers (3 communicators)")


def test_h200_memory_is_what_the_lent_h200_reported(monkeypatch):
  """XLA's h200 spec says 141 GiB exactly (151,397,597,184 B); the lent H200's
  own target config 150,109,880,320 B, of which its pool was 0.75: the
  smaller is the budget's (a spec over the device says "fits" for a peak
  over the pool)."""
  for name in (capacity.FRACTION_ENV, capacity.DEPRECATED_FRACTION_ENV):
    monkeypatch.delenv(name, raising=False)
  assert capacity.device_memory("h200") == 150109880320
  assert capacity.capacity_bytes(_plan("h200:8", 8, 1)) == int(
      0.75 * 150109880320)


def _corpus_io(index: int) -> int:
  """A GPU corpus row's arguments and outputs, aliased ones once (what
  XLA's GetSchedulerMemoryLimit counts as the step's inputs and outputs)."""
  from experiments import gpu_corpus  # pylint: disable=g-import-not-at-top
  with open(gpu_corpus.GPU_CORPUS_JSONL) as f:
    rows = [json.loads(line) for line in f]
  c, = [r["compiled"] for r in rows if r["config"]["index"] == index]
  return c["argument_bytes"] + c["output_bytes"] - c["alias_bytes"]


def test_xla_gpu_memory_limit_is_what_xla_logged_on_the_lent_gpus():
  """XLA:GPU's rematerialization pass logged its limit where it could not
  meet it: on the lent H200 (pool 112,583,507,968 B) for #173, "Can't
  reduce memory use below 100.24GiB (107629834108 bytes)"; on the lent H100
  (pool 63,763,906,560 B) for #30, 57.04 GiB. The arguments plus 95% of the
  rest of the pool give both (the H200's 262,144 B over: the size of the
  step's two int32 token arrays)."""
  h200 = capacity.GpuBudget(150109880320, 0.75, 112583507968, ())
  assert h200.xla_memory_limit(_corpus_io(173)) == 107629834108 + 262144
  h100 = capacity.GpuBudget(85017493504, 0.75, 63763906560, ())
  assert f"{h100.xla_memory_limit(_corpus_io(30)) / GiB:.2f}" == "57.04"
  budget = capacity.gpu_budget(_plan("h200:1", 1, 1))
  assert budget.to_json(10 * GiB)["xla_memory_limit_bytes"] == (
      10 * GiB + (budget.pool_bytes - 10 * GiB) * 95 // 100)
  assert "xla_memory_limit_bytes" not in budget.to_json()
