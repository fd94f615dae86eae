"""simulator.xla.frontier: pinning XLA's largest batch with few compiles."""

import pytest

from meshes.layout import plan_mesh
from meshes.topology import parse_topology
from models.registry import load_model
from simulator.settings import TrainSettings
from simulator.xla import compiled, frontier


def _threshold(limit: int, seen: list):
  """A probe that fits every batch up to `limit`, recording what it ran."""
  def probe(batch):
    seen.append(batch)
    return frontier.Probe(batch, batch, False, batch <= limit)
  return probe


@pytest.mark.parametrize("limit, start, guess", [
    (1000, 800, 960),   # the simulation under XLA's frontier, as usual
    (1000, 800, 1200),  # its smallest schedule past it
    (1000, 800, 0),     # no guess: one step, then doubling strides
    (500, 800, 960),    # the simulation over: bisect down from it
    (800, 800, 960),    # the simulation exact
])
def test_pins_the_largest_fitting_multiple_of_the_step(limit, start, guess):
  seen = []
  found = frontier.search(_threshold(limit, seen), start, guess, 16, 20)
  assert found.exact and found.largest_fit == limit // 16 * 16
  assert found.smallest_over == found.largest_fit + 16
  assert seen[0] == start and all(b % 16 == 0 for b in seen)
  assert len(seen) == len(set(seen)) == len(found.probes) <= 12


def test_doubling_strides_reach_a_frontier_far_out():
  seen = []
  found = frontier.search(_threshold(20000, seen), 800, 960, 16, 40)
  assert found.exact and found.largest_fit == 20000 and len(seen) <= 20


def test_the_guess_saves_compiles():
  near, blind = [], []
  frontier.search(_threshold(1000, near), 800, 992, 16, 20)
  frontier.search(_threshold(1000, blind), 800, 0, 16, 20)
  assert len(near) == 3 and len(blind) > len(near)  # 800, 992, 1008


def test_stops_at_the_budget_and_says_it_is_not_pinned():
  found = frontier.search(_threshold(20000, []), 800, 960, 16, 2)
  assert len(found.probes) == 2 and not found.exact
  assert found.largest_fit == 960 and found.smallest_over is None


def test_nothing_fits():
  found = frontier.search(_threshold(10, []), 0, 0, 16, 5)
  assert found.exact and found.largest_fit == 0 and found.smallest_over == 16


def test_bad_arguments_are_value_errors():
  with pytest.raises(ValueError, match="step=0"):
    frontier.search(_threshold(10, []), 16, 16, 0, 3)


def test_an_out_of_hbm_refusal_is_an_answer_and_other_errors_raise(
    monkeypatch):
  """compile_probe turns libtpu's CompileTimeHbmOom into a probe that does
  not fit, with the bytes XLA said it needed; any other failure raises."""
  message = ("RESOURCE_EXHAUSTED: E1000: CompileTimeHbmOom: Ran out of memory "
             "on HBM, the total memory required for HLO temporaries (104.54G)"
             " exceeds available HBM (95.73G). HLO module: jit_step.")

  def refuse(cfg, settings, *args, **kwargs):
    raise RuntimeError(message if settings.batch > 8 else "something else")

  monkeypatch.setattr(compiled, "compile_report", refuse)
  probe = frontier.compile_probe(load_model("tiny"), TrainSettings(batch=4),
                                 plan_mesh(parse_topology("v5p-8"), 4, 1), 1)
  p = probe(16)
  assert (p.batch, p.refused, p.fits) == (16, True, False)
  assert p.peak_bytes == int(104.54 * 2**30)
  with pytest.raises(RuntimeError, match="something else"):
    probe(8)
