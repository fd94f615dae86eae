"""experiments.validate: JSON schema and exit code 2 on a bad mesh."""

import json
import os
import re
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ENV = dict(os.environ, JAX_PLATFORMS="cpu", ALLOW_MULTIPLE_LIBTPU_LOAD="1",
           PYTHONPATH=ROOT)


def _run(*args, env: dict | None = None):
  return subprocess.run([sys.executable, "-m", "experiments.validate", *args],
                        cwd=ROOT, env={**ENV, **(env or {})},
                        capture_output=True, text=True, timeout=300)


def test_json_schema_tpu_v5p():
  p = _run("--model=tiny", "--topology=v5p-8", "--mesh=2x2", "--batch=8",
           "--seq=128", "--remat=full", "--format=json")
  assert p.returncode == 0, p.stderr[-3000:]
  r = json.loads(p.stdout)
  for k in ("argument_bytes", "output_bytes", "alias_bytes", "temp_bytes",
            "peak_bytes"):
    assert isinstance(r["compiled"][k], int)
  assert isinstance(r["relative_error"]["arguments"], float)
  assert isinstance(r["relative_error"]["peak"], float)
  assert r["compiled"]["layout_argument_bytes"] == r["compiled"]["argument_bytes"]
  assert "params" in r["symbolic"] and "peak" in r["symbolic"]
  assert r["hbm_bytes"]["xla"] == r["compiled"]["bytes_accessed"]
  # each of libtpu's three schedules replayed on the module before its
  # scheduler (simulator.xla.heap_replay): its own estimates, within 2%
  logged, replayed = r["compiled"]["memory_scheduler"], r["compiled"][
      "replayed_schedules"]
  assert set(replayed) == {"list", "dfs", "post_order"}
  for s in replayed:
    assert abs(replayed[s] / logged[s.replace("_", " ")] - 1) < 0.02, (
        s, replayed, logged)


def test_a_forced_memory_scheduler():
  """--memory_scheduler=list compiles with libtpu's list scheduler: no
  choice is logged, the report says which one ran."""
  p = _run("--model=tiny", "--topology=v5p-8", "--mesh=2x2", "--batch=8",
           "--seq=128", "--memory_scheduler=list")
  assert p.returncode == 0, p.stderr[-3000:]
  assert "compiled with libtpu's list memory scheduler" in p.stdout
  assert "kept the" not in p.stdout


def test_bad_input_exit_2():
  for args, needle in ((["--model=tiny", "--mesh=3x2"], "3x2"),
                       (["--model=tiny", "--target=tpu9"], "--target=tpu9"),
                       (["--model=tiny", "--execute_steps=-1"],
                        "--execute_steps=-1"),
                       (["--model=gpt2", "--seq=2048"], "learned positions"),
                       (["--model=tiny", "--seq=64", "--seq=128"],
                        "--seq is given twice"),
                       (["--model=tiny", "--dump_passes=memory-scheduler"],
                        "needs --dump_dir"),
                       (["--model=tiny", "--dump_dir=/tmp/shardsim-dumps",
                         "--dump_passes=("], "is not a regular expression"),
                       (["--model=tiny", "--memory_scheduler=fast"],
                        "--memory_scheduler=fast"),
                       (["--model=tiny", "--memory_scheduler=list",
                         "--target=cpu"], "needs a TPU --topology"),
                       (["--model=tiny", "--mesh=2x2", "--batch=8",
                         "--seq=64", "--execute_steps=2"],
                        "--execute_steps=2 runs steps on local devices")):
    p = _run("--topology=v5p-8", *args)
    assert p.returncode == 2, (args, p.stderr[-2000:])
    last = p.stderr.strip().splitlines()[-1]
    assert last.startswith("error:") and needle in last, (args, last)
    assert "Traceback" not in p.stderr


def test_text_report_is_quiet_and_names_the_peak():
  """No libtpu RET_CHECK noise on stderr; the symbolic peak says where."""
  p = _run("--model=tiny", "--topology=v5p-8", "--mesh=2x2", "--batch=8",
           "--seq=128")
  assert p.returncode == 0, p.stderr[-3000:]
  assert "RET_CHECK" not in p.stderr and "stack trace" not in p.stderr
  assert "symbolic peak at " in p.stdout
  # libtpu's own estimates of its three schedules, read off its log
  assert re.search(r"XLA's memory scheduler .*: list [\d.]+, DFS [\d.]+, "
                   r"post-order [\d.]+ GiB; kept the (list|DFS|post-order) "
                   r"schedule", p.stdout), p.stdout
  # the step-time model's FLOPs and HBM bytes beside XLA's cost analysis
  assert re.search(r"matmul FLOPs per device, .*: symbolic [\d.e+]+, XLA "
                   r"[\d.e+]+ .*\([+-][\d.]+%\)", p.stdout), p.stdout
  assert re.search(r"HBM bytes per device, .* [\d.e+]+, XLA's bytes "
                   r"accessed [\d.e+]+ .*\([+-][\d.]+%\)", p.stdout), p.stdout


def test_a_cpu_compile_reports_what_its_cost_analysis_gives():
  """XLA:CPU's cost analysis has no optimal time: the report says what it
  has (it raised a TypeError formatting None). The mesh line names the
  replicas (D) as the other tools do."""
  p = _run("--model=tiny", "--topology=v5p-16", "--dp=2", "--mesh=2x2",
           "--batch=8", "--seq=64", "--target=cpu")
  assert p.returncode == 0, p.stderr[-3000:]
  assert "\nmesh D2x2x2 on v5p-16 " in p.stdout
  assert re.search(r"^planned \(symbolic, with the 10% planning overhead, "
                   r"the other tools' verdict\) [\d.]+ GiB: fits$", p.stdout,
                   re.M), p.stdout
  assert re.search(r"^cost: [\d.e+]+ flops.* \(per device\)$", p.stdout,
                   re.M), p.stdout


def test_a_gpu_compile_reports_xla_gpu_s_own_estimates():
  """A deviceless GPU compile logs XLA:GPU's memory-scheduler estimates
  (asked for before jax loads the CUDA plugin) and the report prints them;
  none of the INFO lines asked for reach the user."""
  p = _run("--model=tiny", "--topology=a100:8", "--mesh=4x2", "--batch=8",
           "--seq=128", "--format=json")
  assert p.returncode == 0, p.stderr[-3000:]
  result = json.loads(p.stdout)
  got = result["compiled"]["memory_scheduler"]
  # the deviceless path's cost analysis (if any) is not compared
  assert result["flops"] is None and result["hbm_bytes"] is None
  assert set(got) == {"list", "dfs", "post order", "chose"}, got
  assert got[got["chose"]] == min(got["list"], got["dfs"], got["post order"])
  assert not re.search(r"^I\d{4} ", p.stderr, re.M), p.stderr[-2000:]


def test_a_plan_over_hbm_is_an_answer():
  """XLA refuses llama2_7b on 4 chips at batch 32 without remat: the report
  says how much it needed, what XLA held at its peak as it refused (read
  off the dump libtpu writes then), and that the estimate agrees, exit 0."""
  p = _run("--model=llama2_7b", "--topology=v5p-8", "--mesh=4x1",
           "--batch=32", "--seq=2048", "--remat=none")
  assert p.returncode == 0, p.stderr[-3000:]
  assert "XLA: does not fit: needs" in p.stdout
  heap = [l for l in p.stdout.splitlines()
          if l.startswith("XLA's heap at its peak: ")]
  assert heap and float(heap[0].split()[5]) > 95  # GiB, over v5p's HBM
  assert "jit(step)/" in p.stdout  # a buffer named by the op that made it
  assert "its memory schedules replayed on the module before that pass" in (
      p.stdout)
  assert "does not fit" in p.stdout.splitlines()[-1]
  assert "Traceback" not in p.stderr


@pytest.mark.long
def test_a_triton_tiling_failure_compiles_with_cublas_gemms():
  """XLA:GPU (the pinned CUDA plugin) finds no Triton tiling for the TP-
  sharded vision tower of llava_mini on h100:8 4x2 (the GPU corpus's #39):
  the step is compiled again with Triton GEMMs off, its GEMMs in cuBLAS,
  and the report says so; with that option in XLA_FLAGS the first compile
  succeeds and nothing is said."""
  plan = ("--model=llava_mini", "--topology=h100:8", "--mesh=4x2",
          "--batch=16", "--seq=768", "--remat=full", "--loss_chunks=4")
  p = _run(*plan)
  assert p.returncode == 0, p.stderr[-2000:]
  assert ("compiled with --xla_gpu_enable_triton_gemm=false: XLA:GPU's "
          "Triton GEMM emitter found no tiling") in p.stdout
  assert "compiling again with --xla_gpu_enable_triton_gemm=false" in p.stderr
  assert "Traceback" not in p.stderr
  again = _run(*plan, env={"XLA_FLAGS": "--xla_gpu_enable_triton_gemm=false"})
  assert again.returncode == 0, again.stderr[-2000:]
  assert "compiled with --xla_gpu" not in again.stdout
  peak = lambda out: next(l for l in out.splitlines() if l.startswith("peak "))
  assert peak(p.stdout) == peak(again.stdout)  # the same program
