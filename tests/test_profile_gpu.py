"""experiments.profile_gpu: kernel time by kind from a profiler trace (the
profiling itself needs a GPU)."""

import subprocess
import sys

from experiments import profile_gpu


def _meta(pid, tid, process, thread):
  return [{"ph": "M", "name": "process_name", "pid": pid,
           "args": {"name": process}},
          {"ph": "M", "name": "thread_name", "pid": pid, "tid": tid,
           "args": {"name": thread}}]


def test_kinds():
  assert profile_gpu.kind("nvjet_sm90_tst_256x128_64x4_1x2_h_bz_coopA_NNT") == "gemm"
  assert profile_gpu.kind("void cutlass::Kernel2<cutlass_80_tensorop>") == "gemm"
  assert profile_gpu.kind("gemm_fusion_dot_40") == "gemm_fusion"
  assert profile_gpu.kind("input_reduce_select_fusion") == "input"
  assert profile_gpu.kind("loop_convert_fusion") == "loop"


def test_summary_counts_the_gpu_compute_stream_only():
  events = (_meta(1, 10, "/device:GPU:0", "Stream #14(MemcpyD2D,Compute)")
            + _meta(1, 11, "/device:GPU:0", "Stream #72(MemcpyD2D)")
            + _meta(2, 20, "/host:CPU", "python"))
  x = lambda pid, tid, name, dur: {"ph": "X", "pid": pid, "tid": tid,
                                   "name": name, "dur": dur, "ts": 0}
  events += [x(1, 10, "nvjet_sm90_a", 3000), x(1, 10, "loop_add_fusion", 1000),
             x(1, 10, "nvjet_sm90_a", 2000), x(1, 11, "MemcpyD2D", 500),
             x(2, 20, "PjitFunction(step)", 9000)]
  s = profile_gpu.summarise(events, steps=2)
  assert s["gpu_kernel_ms_per_step"] == 3.0  # (3000+1000+2000) µs / 2
  assert s["kernels_per_step"] == 1.5
  assert s["by_kind_ms"] == {"gemm": 2.5, "loop": 0.5}
  assert s["top_kernels_ms"]["nvjet_sm90_a"] == 2.5


def test_bad_case_is_a_one_line_error():
  proc = subprocess.run([sys.executable, "-m", "experiments.profile_gpu",
                         "--case=0"], capture_output=True, text=True)
  assert proc.returncode == 2 and "Traceback" not in proc.stderr
  assert "--case=0: give a single-GPU case of experiments.gpu_corpus" in proc.stderr
