"""Tests run on the CPU backend (as the experiments do by default); TPU targets
compile through libtpu's topology API, which needs no TPU. Set before JAX loads,
and inherited by the experiments the tests start as subprocesses."""

import os
import subprocess
import sys
import tempfile
import time

import pytest

os.environ.setdefault("JAX_PLATFORMS", "cpu")
# The experiments' persistent cache (simulator.cache) defaults under
# XDG_CACHE_HOME: the tests' own, never the user's.
os.environ["XDG_CACHE_HOME"] = tempfile.mkdtemp(prefix="shardsim-tests-")


@pytest.fixture
def refused_by_memory_report():
  """Runs memory_report on a small v5p-8 2x2 plan with `args` and checks it
  exits 2 with exactly `message` on stderr (the one-line error)."""
  root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

  def check(args, message):
    p = subprocess.run(
        [sys.executable, "-m", "experiments.memory_report", "--topology=v5p-8",
         "--mesh=2x2", "--batch=8", "--seq=64", *args], cwd=root,
        capture_output=True, text=True, timeout=120)
    assert (p.returncode, p.stderr.strip()) == (2, message)
  return check


@pytest.fixture
def killed_parent(tmp_path):
  """Runs `script` (Python text) as a parent that starts child processes,
  prints their pids and kills itself with SIGTERM (no close, no finally);
  checks every child has exited within 30 s, and returns their pids."""
  root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

  def run(script: str) -> list[int]:
    path = tmp_path / "parent.py"
    path.write_text(script)
    proc = subprocess.run([sys.executable, str(path)], capture_output=True,
                          text=True, timeout=120, cwd=root,
                          env={**os.environ, "PYTHONPATH": root})
    pids = [int(p) for p in proc.stdout.split()]
    assert proc.returncode == -15 and pids, proc.stderr[-2000:]
    alive = lambda: [p for p in pids if os.path.exists(f"/proc/{p}")
                     and "zombie" not in open(f"/proc/{p}/status").read()]
    deadline = time.time() + 30
    while alive() and time.time() < deadline:
      time.sleep(0.2)
    assert not alive()
    return pids
  return run
