"""simulator.sweep_workers: a sweep's groups evaluated by helper processes."""

import collections
import time

import pytest

from simulator import search, sweep_workers
from simulator.cache import Cache

SPEC = search.SweepSpec(model="tiny", topology="v5p-8", batches=(4, 8),
                        remats=("none", "full", "dots"), seq=32)


def _plain(records):
  """Records without their evaluation time, in a fixed order."""
  return sorted(({k: v for k, v in r.items() if k != "eval_s"}
                 for r in records), key=search.record_key)


@pytest.fixture(scope="module")
def serial():
  sweep = search.Sweep(SPEC)
  return sweep, list(sweep.evaluate(SPEC.configs(sweep.topo)))


def _groups(sweep):
  groups = collections.defaultdict(list)
  for c in SPEC.configs(sweep.topo):
    groups[c.remat].append(c)
  return list(groups.values())


def _taken(pool, queue, returned, timeout=120):
  """Polls until a helper has taken the last group of `queue`."""
  start = time.monotonic()
  while queue and time.monotonic() - start < timeout:
    assert not list(pool.poll(queue, returned))
    time.sleep(0.05)
  assert not queue, "no helper became ready"


def test_a_helper_makes_the_records_made_here(serial):
  """A helper takes a group from the back of the queue and sends back the
  records this process makes for it, with its trace count."""
  sweep, records = serial
  groups = _groups(sweep)
  pool = sweep_workers.Helpers(SPEC, 1)
  try:
    queue, returned = collections.deque([groups[-1]]), []
    _taken(pool, queue, returned)
    reports = list(pool.wait(returned))
  finally:
    pool.close()
  assert not returned and len(reports) == 1
  made, traces, _, _, seconds = reports[0]
  assert traces >= 1 and seconds["trace"] > 0
  assert _plain(made) == _plain(r for r in records
                                if r["remat"] == groups[-1][0].remat)


def test_a_helper_gone_hands_its_group_back():
  """A helper killed while it holds a group: the group comes back to be
  evaluated here, nothing is lost."""
  sweep = search.Sweep(SPEC)
  group = _groups(sweep)[0]
  pool = sweep_workers.Helpers(SPEC, 1)
  try:
    queue, returned = collections.deque([group]), []
    _taken(pool, queue, returned)
    helper = next(iter(pool._helpers.values()))  # pylint: disable=protected-access
    helper.proc.kill()
    assert not list(pool.wait(returned))
  finally:
    pool.close()
  assert returned == [group]


def test_a_helper_with_nothing_left_to_take_is_ended():
  """Once this process has taken the last group, a helper holding none
  (here: still starting) is ended at once, not left to import and wait."""
  pool = sweep_workers.Helpers(SPEC, 1)
  try:
    helper = next(iter(pool._helpers.values()))  # pylint: disable=protected-access
    pool.release_idle()
    assert helper.proc.returncode is not None  # ended and reaped
    assert not pool._helpers  # pylint: disable=protected-access
  finally:
    pool.close()


def test_two_processes_make_the_same_records_and_fill_the_cache(serial,
                                                                 tmp_path):
  """With workers=2 every config's record is the serial one (whichever
  process made it) and is kept in the cache: the same sweep again traces
  nothing."""
  _, records = serial
  first = search.Sweep(SPEC, cache=Cache(str(tmp_path)), workers=2)
  made = list(first.evaluate(SPEC.configs(first.topo)))
  assert _plain(made) == _plain(records)
  assert first.traces == serial[0].traces  # the helpers' traces counted
  again = search.Sweep(SPEC, cache=Cache(str(tmp_path)), workers=2)
  assert _plain(again.evaluate(SPEC.configs(again.topo))) == _plain(records)
  assert again.traces == 0


def test_trace_workers_values():
  assert sweep_workers.check_trace_workers(3) == 3
  assert sweep_workers.check_trace_workers(0) == min(
      sweep_workers.available_cores(), sweep_workers.DEFAULT_MOST)
  with pytest.raises(ValueError, match=r"--trace_workers=-1 must be >= 0"):
    sweep_workers.check_trace_workers(-1)


_ORPHANED = """
import os, signal, sys
from simulator import search, sweep_workers
spec = search.SweepSpec(model="tiny", topology="v5p-8", batches=(4,), seq=32)
pool = sweep_workers.Helpers(spec, 1)
helper = next(iter(pool._helpers.values()))
helper.reports.recv()  # ready: started, imported, waiting for a group
print(helper.proc.pid, flush=True)
os.kill(os.getpid(), signal.SIGTERM)  # no close(), no finally
"""


def test_a_helper_exits_when_its_sweep_is_killed(killed_parent):
  """A sweep killed by a signal ends no helper itself: the helper, waiting
  for a group, exits on its own (its pipe closes; exit_with_parent)."""
  assert len(killed_parent(_ORPHANED)) == 1
