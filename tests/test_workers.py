"""simulator.workers: where compile jobs run."""

import pytest

from simulator.workers import Pool


def _half(x):
  return x // 2


def _fail(x):
  raise ValueError(f"bad {x}")


def test_here_and_in_processes_the_same_futures():
  for workers in (1, 2):
    pool = Pool(workers)
    try:
      assert [pool.submit(_half, n).result() for n in (4, 10)] == [2, 5]
      with pytest.raises(ValueError, match="bad 3"):
        pool.submit(_fail, 3).result()
    finally:
      pool.close()


def test_bad_workers():
  with pytest.raises(ValueError, match="--workers=0 must be >= 1"):
    Pool(0)


_STARTED: list = []


def _started(x):
  _STARTED.append(x)
  return x


def test_each_result_comes_back_before_the_next_job_starts_here():
  """One worker: a job runs only after the previous result was handed back
  (validation_matrix appends each row as it comes), and every job's result
  comes back once."""
  _STARTED.clear()
  pool = Pool(1)
  seen = []
  for args, future in pool.as_completed(_started, [(1,), (2,), (3,)]):
    assert _STARTED == [1, 2, 3][:len(seen) + 1]
    seen.append((args, future.result()))
  assert seen == [((1,), 1), ((2,), 2), ((3,), 3)]


def test_workers_run_every_job_once():
  pool = Pool(2)
  try:
    got = sorted(f.result() for _, f in pool.as_completed(
        _half, [(n,) for n in range(10)]))
  finally:
    pool.close()
  assert got == sorted(n // 2 for n in range(10))


_ORPHANED = """
import os, signal, time
from simulator.workers import Pool

def spin(_):
  while True:
    time.sleep(0.1)

if __name__ == "__main__":
  pool = Pool(2)
  futures = [pool.submit(spin, i) for i in range(2)]
  while len(os.popen(f"pgrep -P {os.getpid()}").read().split()) < 2:
    time.sleep(0.2)
  print(" ".join(os.popen(f"pgrep -P {os.getpid()}").read().split()),
        flush=True)
  os.kill(os.getpid(), signal.SIGTERM)  # no close(), no finally
"""


def test_workers_exit_when_their_parent_is_killed(killed_parent):
  """A parent killed by a signal runs no close(): its workers, busy on a job
  that never ends, exit on their own within seconds (with multiprocessing's
  resource tracker, which exits with its parent anyway)."""
  assert len(killed_parent(_ORPHANED)) >= 2
