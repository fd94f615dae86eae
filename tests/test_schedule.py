"""simulator.memory.schedule: the 1F1B rule on the traced GPipe step."""

import dataclasses

import pytest

from meshes.layout import plan_mesh
from meshes.topology import parse_topology
from models.registry import load_model
from simulator import memory
from simulator.memory import schedule
from simulator.settings import TrainSettings

TINY4 = dataclasses.replace(load_model("tiny"), n_layers=4)  # 1 per stage


def test_in_flight_share_is_min_m_k_of_the_iterations():
  """1F1B holds at most K micro-batches (Narayanan et al. 2021, 2.2.1)
  where GPipe's loop holds M + K - 1 iterations' activations."""
  assert schedule.in_flight_share(4, 8) == pytest.approx(4 / 11)
  assert schedule.in_flight_share(4, 2) == pytest.approx(2 / 5)
  assert schedule.in_flight_share(2, 2) == pytest.approx(2 / 3)


def test_one_f_one_b_keeps_k_micro_batches_of_stage_activations():
  """Without remat the stages' saved activations set the peak: the 1F1B
  rule keeps min(M, K)/(M+K-1) of those live there and nothing else."""
  plan = plan_mesh(parse_topology("v5p-8"), 1, 1, P=4)
  run = lambda sched: memory.memory_report(TINY4, TrainSettings(
      batch=16, seq=256, pp=4, microbatches=8, remat="none",
      schedule=sched), plan)
  gpipe, one_f = run("gpipe"), run("1f1b")
  assert one_f.peak_where.endswith("(1F1B rule)")
  assert one_f.compiled_comparable_peak < 0.7 * gpipe.compiled_comparable_peak
  assert one_f.at_peak["params"] == gpipe.at_peak["params"]
  assert (one_f.at_peak["activations"]
          < 0.5 * gpipe.at_peak["activations"])
  assert sum(one_f.at_peak.values()) == pytest.approx(
      one_f.compiled_comparable_peak, rel=1e-6)


def test_a_compile_is_checked_against_the_traced_gpipe_program():
  """XLA compiles the traced GPipe program, so a 1F1B config is checked
  against that program's figures (simulator.xla.crosscheck), not the rule's
  (#131: all nine iterations' stage activations at XLA's peak)."""
  from simulator.xla import crosscheck
  settings = lambda sched: TrainSettings(batch=16, seq=256, pp=4,
                                         microbatches=8, remat="none",
                                         schedule=sched)
  checked = crosscheck._symbolic(TINY4, settings("1f1b"), "v5p-8", 1, 1)[0]
  gpipe = crosscheck._symbolic(TINY4, settings("gpipe"), "v5p-8", 1, 1)[0]
  one_f = memory.memory_report(TINY4, settings("1f1b"), plan_mesh(
      parse_topology("v5p-8"), 1, 1, P=4))
  assert checked.compiled_comparable_peak == gpipe.compiled_comparable_peak
  assert one_f.compiled_comparable_peak < checked.compiled_comparable_peak
