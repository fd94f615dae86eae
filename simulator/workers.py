"""Where compile jobs run: here, in local worker processes, or on Ray.

Every pool hands back `concurrent.futures.Future`s, so a caller waits on any
of them the same way (`concurrent.futures.wait`). A compile holds one core
for a minute or more; each job is independent (a config in, a dict out).
"""

from __future__ import annotations

import concurrent.futures as cf
import multiprocessing
import os
import subprocess
import sys
import threading
import time
from typing import Any, Callable, Iterable, Iterator


class Pool:
  """`submit(fn, *args)` -> Future; `close()` when done."""

  def __init__(self, workers: int = 1, ray_address: str | None = None):
    if workers < 1:
      raise ValueError(f"--workers={workers} must be >= 1")
    self.workers, self._ray, self._local = workers, None, None
    if ray_address:
      self._ray = _ray_connect(ray_address, workers)
    elif workers > 1:
      self._local = cf.ProcessPoolExecutor(
          workers, multiprocessing.get_context("spawn"),
          initializer=exit_with_parent, initargs=(os.getpid(),))

  @property
  def where(self) -> str:
    if self._ray is not None:
      cpus = int(self._ray.cluster_resources().get("CPU", 0))
      return f"on the Ray cluster ({cpus} CPUs)"
    return f"{self.workers} at a time" if self.workers > 1 else "one at a time"

  def submit(self, fn: Callable[..., Any], *args) -> cf.Future:
    if self._ray is not None:
      return self._ray.remote(num_cpus=1)(fn).remote(*args).future()
    if self._local is not None:
      return self._local.submit(fn, *args)
    future: cf.Future = cf.Future()  # in this process, now
    try:
      future.set_result(fn(*args))
    except Exception as e:  # noqa: BLE001 - handed to the caller as a result
      future.set_exception(e)
    return future

  def as_completed(self, fn: Callable[..., Any], jobs: Iterable[tuple]
                   ) -> Iterator[tuple[tuple, cf.Future]]:
    """(args, its future) for `fn(*args)` over `jobs`, as each finishes,
    with at most `workers` submitted at a time: a caller keeps each result
    before the next job starts here, so an interrupted run loses at most
    the jobs in flight."""
    pending = iter(jobs)
    in_flight: dict = {}
    while True:
      for args in pending:
        in_flight[self.submit(fn, *args)] = args
        if len(in_flight) >= self.workers:
          break
      if not in_flight:
        return
      done, _ = cf.wait(in_flight, return_when=cf.FIRST_COMPLETED)
      for future in done:
        yield in_flight.pop(future), future

  def close(self) -> None:
    if self._local is not None:
      self._local.shutdown(cancel_futures=True)
    if self._ray is not None:
      self._ray.shutdown()


def module_process(module: str, *args: str, **popen) -> subprocess.Popen:
  """`python -m module args` in a fresh interpreter that imports this
  project wherever the caller runs from (its root on PYTHONPATH; the
  working directory kept, so relative paths in arguments hold)."""
  root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  env = dict(os.environ, PYTHONPATH=os.pathsep.join(
      p for p in (root, os.environ.get("PYTHONPATH")) if p))
  return subprocess.Popen([sys.executable, "-m", module, *args], env=env,
                          **popen)


def exit_with_parent(parent: int, every_s: float = 1.0) -> None:
  """In a worker: exit once `parent` is gone. A parent killed by a signal
  runs no `close()`, and its spawned workers otherwise lived on, blocked or
  compiling, for as long as one cared to look (seen: 25 min at 24% CPU each)."""
  def watch() -> None:
    while os.getppid() == parent:
      time.sleep(every_s)
    os._exit(1)
  threading.Thread(target=watch, daemon=True, name="exit-with-parent").start()


def _ray_connect(address: str, workers: int):
  """`address`: a running cluster ("ray://host:10001", "auto") or "local"
  (start one on this machine with `workers` CPUs)."""
  try:
    import ray
  except ImportError:
    raise ValueError(f"--ray_address={address}: Ray is not installed; "
                     "pip install -e '.[ray]'") from None
  kwargs = dict(include_dashboard=False, log_to_driver=False,
                ignore_reinit_error=True)
  try:
    if address == "local":
      ray.init(num_cpus=workers, **kwargs)
    else:
      ray.init(address=address, **kwargs)
  except (ConnectionError, RuntimeError, ValueError) as e:
    raise ValueError(f"--ray_address={address}: cannot connect "
                     f"({str(e).splitlines()[0]}); give ray://HOST:PORT, "
                     "auto or local") from None
  return ray
