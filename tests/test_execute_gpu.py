"""experiments.execute_gpu: the runs kept from a real H100 against the
symbolic side, the deviceless compiles and the GPU memory budget."""

import difflib
import json
import os
import subprocess
import sys

import pytest

from experiments import execute_gpu, gpu_corpus
from meshes import gpu_target
from meshes.layout import plan_mesh
from meshes.topology import parse_topology
from simulator.memory import capacity

DATA = os.path.join(os.path.dirname(execute_gpu.__file__), "data")
RUNS = os.path.join(DATA, "executed_gpu.jsonl")


@pytest.fixture(scope="module")
def rows():
  with open(RUNS) as f:
    return [execute_gpu.recheck(json.loads(line)) for line in f]


def test_runs_cover_every_single_gpu_case(rows):
  assert {r["config"]["index"] for r in rows} == set(
      gpu_corpus.single_gpu_cases())


def test_arguments_exact_on_the_gpu(rows):
  """params + optimizer state + batch from the step's shardings are the
  argument bytes XLA:GPU allocated on the device."""
  ran = [r for r in rows if "compiled" in r]
  assert len(ran) >= 9
  assert all(r["relative_error"]["arguments"] == 0 for r in ran)


def test_deviceless_compile_is_the_gpu_program_without_autotuning(rows):
  """With XLA:GPU's autotuner off, the H100's compiled peak is the deviceless
  compile's to the byte (another jax release); autotuned, it moves."""
  off = [r for r in rows if not execute_gpu.autotuned(r["config"])]
  assert off
  for r in off:
    assert r["compiled"]["peak_bytes"] == r["deviceless"]["peak_bytes"]


def test_allocator_holds_the_compiled_peak(rows):
  """peak_bytes_in_use is never below XLA's peak: the compiled program's
  buffers are all the allocator's."""
  for r in rows:
    if "compiled" in r:
      m = r["compiled"]["measured"]
      assert m["peak_bytes_in_use"] >= r["compiled"]["peak_bytes"]
      assert m["losses"][-1] < m["losses"][0]


def test_out_of_memory_run_is_said_not_to_fit(rows):
  oom = [r for r in rows if "error" in r]
  assert oom and all(execute_gpu.OOM in r["error"] and not r["fits"]
                     for r in oom)


def test_step_time_against_the_measured_runs(rows):
  """Every autotuned run that completed: the predicted step (each matmul at
  the longer of its FLOPs at the measured 804 TFLOP/s and its bytes at
  2.53 TB/s, the fusions' bytes, nothing fitted) within 0.8x-1.1x of the
  median measured step; at the datasheet's rates with matmuls timed by
  FLOPs alone it was 0.50x-0.69x."""
  ran = [r for r in rows if "compiled" in r and execute_gpu.autotuned(
      r["config"])]
  assert len(ran) >= 9
  for r in ran:
    ratio = (r["predicted_step_seconds"]
             / r["compiled"]["measured"]["step_seconds"])
    assert 0.8 <= ratio <= 1.1, (r["config"]["index"], ratio)


def test_measured_rates_are_the_probes():
  """The H100's measured rates (meshes.hardware) are the ones
  experiments.probe_gpu wrote for the lent device."""
  with open(os.path.join(DATA, "h100_device.json")) as f:
    device = json.load(f)
  chip = parse_topology("h100:1").chip
  assert chip.measured_bf16_flops == pytest.approx(
      device["matmul_8192_bf16_tflops_median"] * 1e12, rel=1e-4)
  assert chip.measured_hbm_bandwidth == pytest.approx(
      device["hbm_read_write_GBps_median"] * 1e9, rel=1e-4)


def test_doc_table_matches_the_kept_runs(rows):
  with open(execute_gpu.DEFAULT_OUT) as f:
    text = f.read()
  for r in rows:
    assert "| " + " | ".join(execute_gpu.table_row(r)) + " |" in text
  for line in execute_gpu.summary(rows):
    assert line in text


def _device_info(text: str) -> list[str]:
  """The lines of the config's gpu_device_info block (what the hardware is;
  the rest names the software of the machine it was read on)."""
  out, depth = [], 0
  for line in (l.strip() for l in text.splitlines()):
    if not line or line.startswith("#"):
      continue
    if depth or line.startswith("gpu_device_info"):
      out.append(line)
      depth += line.count("{") - line.count("}")
      if not depth:
        return out
  return out


def _same(a: str, b: str) -> bool:
  """Two text-proto lines equal, numbers to 1e-6 (the spec rounds floats)."""
  (ka, _, va), (kb, _, vb) = a.partition(":"), b.partition(":")
  try:
    return ka == kb and abs(float(va) - float(vb)) <= 1e-6 * abs(float(vb))
  except ValueError:
    return a == b


# Fields where the device's description may differ from XLA's spec: the
# memory size, the model string that repeats it, and the software versions
# of the machine it was read on.
MAY_DIFFER = {"device_memory_size", "model_str", "driver_version",
              "runtime_version", "compile_time_toolkit_version", "dnn_version",
              "cub_version"}


def test_device_target_config_is_xlas_h100_spec():
  """The H100's own target config (experiments.probe_gpu) is XLA's h100_sxm
  spec that deviceless compiles use: every field both name agrees (SM count,
  clocks, caches, shared memory, per-unit rates) but for the memory size the
  driver reports; the spec's is the smaller, so the budget errs low."""
  with open(os.path.join(DATA, "h100_device_target_config.txtpb")) as f:
    device = _device_info(f.read())
  spec = _device_info(gpu_target.target_config("h100-sxm"))
  key = lambda line: line.partition(":")[0]
  blocks = difflib.SequenceMatcher(None, [key(l) for l in spec],
                                   [key(l) for l in device]).get_matching_blocks()
  pairs = [(spec[b.a + k], device[b.b + k]) for b in blocks for k in range(b.size)]
  assert len(pairs) >= 150
  differ = {key(a) for a, b in pairs if not _same(a, b)}
  assert "device_memory_size" in differ and differ <= MAY_DIFFER, differ
  memory = [(a, b) for a, b in pairs if key(a) == "device_memory_size"]
  assert all(int(a.split(":")[1]) <= int(b.split(":")[1]) for a, b in memory)


def test_gpu_budget_against_the_measured_pool():
  """The planned pool (75% of the spec's memory) is the allocator's
  bytes_limit within 0.1% and not above it; what the driver held beside the
  pool (CUDA context, cuBLAS handles) is under the budget's 3 GiB line."""
  with open(os.path.join(DATA, "h100_device.json")) as f:
    device = json.load(f)
  limit = device["memory_stats_after_init"]["bytes_limit"]
  budget = capacity.gpu_budget(plan_mesh(parse_topology("h100:1"), 1, 1))
  assert budget.pool_bytes <= limit < budget.pool_bytes * 1.001
  used_mib = int(device["smi_after_matmul"].split(",")[2])
  outside = used_mib * 2**20 - limit
  assert 0 < outside <= capacity.CUDA_CONTEXT_BYTES


def test_bad_inputs_are_one_line_errors(tmp_path):
  out = tmp_path / "e.md"
  bad = tmp_path / "bad.jsonl"
  bad.write_text('{"config": {"model": "gpt2"}}\n')
  single = gpu_corpus.single_gpu_cases()
  for args, message in (
      ([f"--from_jsonl={bad}"], "not a --jsonl file of execute_gpu"),
      ([f"--from_jsonl={tmp_path / 'none.jsonl'}"], "No such file"),
      (["--only=0", f"--jsonl={tmp_path / 'r.jsonl'}"],
       f"'0' is not a single-GPU case; valid: {single[0]}"),
      ([], "give --jsonl=FILE")):
    proc = subprocess.run([sys.executable, "-m", "experiments.execute_gpu",
                           *args, f"--out={out}"], capture_output=True,
                          text=True)
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert message in proc.stderr and "Traceback" not in proc.stderr
    assert not out.exists()


def test_single_gpu_cases_are_one_gpu_topologies():
  for i in gpu_corpus.single_gpu_cases():
    assert parse_topology(gpu_corpus.CASES[i].topology).chips == 1
