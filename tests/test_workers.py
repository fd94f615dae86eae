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
