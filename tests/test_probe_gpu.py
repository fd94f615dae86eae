"""experiments.probe_gpu: it measures a local GPU, and says so without one."""

import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_without_a_gpu_it_says_it_needs_one_and_writes_nothing(tmp_path):
  out = tmp_path / "probe"
  p = subprocess.run(  # no nvidia-smi on this PATH: the interpreter's only
      [sys.executable, "-m", "experiments.probe_gpu", f"--out_dir={out}"],
      cwd=ROOT, capture_output=True, text=True, timeout=120,
      env={**os.environ, "PATH": os.path.dirname(sys.executable)})
  assert p.returncode == 2 and p.stderr == (
      "error: no NVIDIA GPU here (no nvidia-smi): probe_gpu measures the "
      "local GPU; run it on a machine with one\n")
  assert not out.exists()
