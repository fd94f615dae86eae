"""simulator.memory.largest_batch and experiments.max_batch."""

import os
import subprocess
import sys

from meshes.layout import plan_mesh
from meshes.topology import parse_topology
from models.registry import load_model
from simulator import memory
from simulator.settings import TrainSettings

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_the_largest_batch_fits_and_the_next_does_not():
  plan = plan_mesh(parse_topology("v5p-8"), 4, 1)
  e = memory.memory_report(load_model("tiny"), TrainSettings(batch=4, seq=64),
                           plan)
  cap = e.at_batch(4000).compiled_comparable_peak
  best = memory.largest_batch(e, cap, 4)
  assert best % 4 == 0 and best >= 4000
  assert e.at_batch(best).compiled_comparable_peak <= cap
  assert e.at_batch(best + 4).compiled_comparable_peak > cap
  assert memory.largest_batch(e, 1, 4) == 0  # not even one fits


def _run(*args):
  env = {**os.environ, "JAX_PLATFORMS": "cpu"}
  return subprocess.run([sys.executable, "-m", "experiments.max_batch",
                         "--model=tiny", "--topology=v5p-8", *args], cwd=ROOT,
                        env=env, capture_output=True, text=True, timeout=120)


def test_the_experiment_says_it_in_one_line():
  """With grad_accum=2 on 2x2 the batch is a multiple of X x 2 = 4."""
  out = _run("--mesh=2x2", "--seq=64", "--grad_accum=2")
  assert out.returncode == 0, out.stderr
  words = out.stdout.split()
  assert out.stdout.startswith("largest batch in 85% of 95 GiB")
  assert int(words[words.index("sequences") - 1]) % 4 == 0
  none = _run("--mesh=2x2", "--seq=64", "--hbm_fraction=0.000001")
  assert none.stdout.startswith("nothing fits in 0% of 95 GiB")
  bad = _run("--hbm_fraction=1.5")
  assert bad.returncode == 2 and bad.stderr.strip() == (
      "error: hbm_fraction=1.5 must be in (0, 1] (the share of the capacity "
      "the peak may use; the playbook keeps 15-20% free: 0.85)")
