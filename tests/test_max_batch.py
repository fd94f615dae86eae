"""simulator.memory.largest_batch and experiments.max_batch."""

import json
import os
import subprocess
import sys

import pytest

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


def test_the_smallest_schedules_answer_is_past_the_bound():
  """The frontier's first guess: where the smaller simulated schedule stops
  fitting, at or past the answer the larger one gives."""
  plan = plan_mesh(parse_topology("v5p-8"), 4, 1)
  e = memory.memory_report(load_model("tiny"), TrainSettings(batch=4, seq=64),
                           plan)
  cap = e.at_batch(4000).compiled_comparable_peak
  guess = memory.largest_batch_any_schedule(e, cap, 4)
  assert guess % 4 == 0 and guess >= memory.largest_batch(e, cap, 4)
  assert min(e.order_peaks_at(guess).values()) <= cap
  assert min(e.order_peaks_at(guess + 4).values()) > cap


def _run(*args):
  """max_batch in a process of its own (--frontier compiles: 30 s idle,
  over 120 s on a loaded 2-core machine, hence the margin)."""
  env = {**os.environ, "JAX_PLATFORMS": "cpu"}
  return subprocess.run([sys.executable, "-m", "experiments.max_batch",
                         "--model=tiny", "--topology=v5p-8", *args], cwd=ROOT,
                        env=env, capture_output=True, text=True, timeout=400)


def test_the_experiment_says_it_in_one_line():
  """With grad_accum=2 on 2x2 the batch is a multiple of X x 2 = 4."""
  out = _run("--mesh=2x2", "--seq=64", "--grad_accum=2")
  assert out.returncode == 0, out.stderr
  words = out.stdout.split()
  assert out.stdout.startswith("largest batch in 85% of 95.00 GiB")
  assert int(words[words.index("sequences") - 1]) % 4 == 0
  none = _run("--mesh=2x2", "--seq=64", "--hbm_fraction=0.000001")
  assert none.stdout.startswith("nothing fits in 0% of 95.00 GiB")
  bad = _run("--hbm_fraction=1.5")
  assert bad.returncode == 2 and bad.stderr.strip() == (
      "error: hbm_fraction=1.5 must be in (0, 1] (the share of the capacity "
      "the peak may use; the playbook keeps 15-20% free: 0.85)")


def test_json_says_the_same_answer():
  """--format=json: the batch the text names, its peak within the budget,
  the next batch's over it."""
  text = _run("--mesh=2x2", "--seq=64").stdout.split()
  out = _run("--mesh=2x2", "--seq=64", "--format=json")
  assert out.returncode == 0, out.stderr
  r = json.loads(out.stdout)
  assert r["largest_batch"] == int(text[text.index("sequences") - 1])
  assert r["peak_bytes"] <= r["budget_bytes"] < r["next_batch_peak_bytes"]
  assert r["largest_batch"] % r["batch_step"] == 0 and "compiles" not in r


@pytest.mark.long
def test_the_frontier_compiles_from_the_simulations_answer():
  """--frontier=2: the first compile is at the simulation's answer, the
  second past it (its smallest schedule's answer, or one step); the last
  line says what two compiles pinned, beside the simulation's answer."""
  out = _run("--mesh=4x1", "--seq=64", "--hbm_fraction=0.0005",
             "--frontier=2")
  assert out.returncode == 0, out.stderr
  lines = out.stdout.splitlines()
  best = int(lines[0].split()[lines[0].split().index("sequences") - 1])
  compiled = [int(l.split()[3].rstrip(":")) for l in lines
              if l.startswith("compiled at batch ")]
  assert compiled[0] == best and compiled[1] > best and len(compiled) == 2
  assert lines[-1].startswith("XLA's largest batch in ")
  assert lines[-1].endswith(f"the simulation's: {best})")
  bad = _run("--frontier=-1")
  assert bad.returncode == 2 and bad.stderr.strip() == (
      "error: frontier=-1 must be a number of compiles, 0 (off) or more")
  bad = _run("--memory_scheduler=list")  # nothing compiled to run it in
  assert bad.returncode == 2 and bad.stderr.count("\n") == 1
  assert "needs a TPU --topology and one of them" in bad.stderr


def test_a_share_above_what_fits_with_the_overhead_is_capped():
  """At --hbm_fraction=1 the largest batch is still one the verdict says
  fits (the peak with the 10% planning overhead within the capacity)."""
  from simulator import memory
  assert memory.peak_budget(110, 1.0) == 100
  assert memory.peak_budget(110, 0.5) == 55
  out = _run("--mesh=4x1", "--seq=64", "--hbm_fraction=1")
  assert out.returncode == 0, out.stderr
  assert "(what fits with the planning overhead)" in out.stdout
