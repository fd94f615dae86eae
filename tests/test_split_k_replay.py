"""experiments.split_k_replay: the rule replayed on a compiled GPU step's
dots (tiny on h100:8, deviceless), and a TPU topology refused with exit 2."""

import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ENV = dict(os.environ, JAX_PLATFORMS="cpu", PYTHONPATH=ROOT)


def _run(*args):
  return subprocess.run([sys.executable, "-m", "experiments.split_k_replay",
                         "--model=tiny", "--batch=8", "--seq=128", *args],
                        cwd=ROOT, env=ENV, capture_output=True, text=True,
                        timeout=300)


def test_a_tpu_topology_is_refused():
  p = _run("--topology=v5p-8")
  assert p.returncode == 2, p.stderr[-2000:]
  last = p.stderr.strip().splitlines()[-1]
  assert last.startswith("error:") and "--topology=v5p-8" in last
  assert "Traceback" not in p.stderr


def test_every_dot_gets_xlas_split():
  pytest.importorskip("jax_plugins.xla_cuda12",
                      reason='the gpu extra: pip install -e ".[gpu]"')
  p = _run("--topology=h100:8", "--mesh=4x2")
  assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]
  last = p.stdout.strip().splitlines()[-1]
  got, _, total = last.split(" dots")[0].partition(" of ")
  assert got == total and int(total) > 0, last


def test_a_bad_corpus_row_is_refused():
  p = _run("--corpus_rows=9999")
  assert p.returncode == 2, p.stderr[-2000:]
  last = p.stderr.strip().splitlines()[-1]
  assert last.startswith("error:") and "--corpus_rows='9999'" in last
