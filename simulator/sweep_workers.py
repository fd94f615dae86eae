"""A cold sweep's trace groups evaluated in worker processes beside this one.

A sweep's cold time is its traces and the program walks and heap simulations
of their groups, one group after another on one core. The groups (a remat,
shard, optimizer, stages and replicas: every mesh of one shares that
group's traces, simulator.search) are independent, so helpers take some:
fresh interpreters (`python -m simulator.sweep_workers`: no jax state
forked, nothing of the caller's __main__ run again) that import the
estimators while this process starts, then take groups from the end of the
list while this process takes them from the front. A helper slow to start
costs only its own core: this process never waits for a group no helper has
taken, and a helper that fails hands its group back. Each group is
evaluated by the same code as here, so the records are the same; each
process keeps what it makes in the sweep's cache (whole files renamed into
place: simulator.cache), a helper before it reports the group done.
"""

from __future__ import annotations

import collections
import os
import signal
import subprocess
import sys
from multiprocessing.connection import Connection, wait
from typing import Any, Iterator

from simulator.workers import exit_with_parent, module_process


def available_cores() -> int:
  """The cores this process may run on."""
  try:
    return len(os.sched_getaffinity(0))
  except AttributeError:  # not Linux
    return os.cpu_count() or 1


# The most processes --trace_workers=0 starts: each holds its own jax, flax
# and traces (a helper's peak resident set after llama2_70b's ten v5p-1024
# meshes under one remat: 0.2 GB), and a sweep seldom has more groups.
DEFAULT_MOST = 8


def check_trace_workers(n: int) -> int:
  """--trace_workers: n >= 1 processes in all, or 0 for one per core (at
  most DEFAULT_MOST)."""
  if n < 0:
    raise ValueError(f"--trace_workers={n} must be >= 0 (0: one per core, "
                     f"at most {DEFAULT_MOST}: {default_workers()} here; 1: "
                     "this process alone)")
  return n or default_workers()


def default_workers() -> int:
  return min(available_cores(), DEFAULT_MOST)


def _serve(commands: Connection, reports: Connection, parent: int) -> None:
  """A helper: evaluate each list of configs received, until its pipe
  closes or the parent is gone."""
  signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent handles ^C
  exit_with_parent(parent)
  spec, cache_dir = commands.recv()
  # pylint: disable=g-import-not-at-top  (a helper process: loaded here)
  from simulator import search
  from simulator.cache import Cache
  import simulator.group_estimate  # noqa: F401  pylint: disable=unused-import
  import simulator.tracing.trace  # noqa: F401  pylint: disable=unused-import
  sweep = search.Sweep(spec, cache=Cache(cache_dir))
  reports.send(None)  # ready
  while True:
    try:
      configs = commands.recv()
    except EOFError:
      return
    sweep.traces = sweep.read_off = sweep.groups_cached = 0
    sweep.seconds.clear()
    try:
      records = [sweep.evaluate_one(c) for c in configs]
      sweep.keep()
    except Exception:  # noqa: BLE001 - the parent evaluates it instead
      reports.send(("failed",))
      continue
    reports.send(("done", records, sweep.traces, sweep.read_off,
                  sweep.groups_cached, dict(sweep.seconds)))


class _Helper:
  """One helper process and its two pipes."""

  def __init__(self, spec, cache_dir: str | None):
    from_parent, to_helper = os.pipe()
    from_helper, to_parent = os.pipe()
    self.proc = module_process(
        "simulator.sweep_workers", str(from_parent), str(to_parent),
        str(os.getpid()), pass_fds=(from_parent, to_parent),
        stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL)
    os.close(from_parent)
    os.close(to_parent)
    self.commands = Connection(to_helper, readable=False)
    self.reports = Connection(from_helper, writable=False)
    self.commands.send((spec, cache_dir))


class Helpers:
  """Up to `n` helper processes for one sweep, each keeping what it makes
  in the cache at `cache_dir`; `close()` when done."""

  def __init__(self, spec, n: int, cache_dir: str | None = None):
    self._helpers: dict[Connection, _Helper] = {}  # by their reports' pipe
    for _ in range(n):
      try:
        helper = _Helper(spec, cache_dir)
      except (OSError, ValueError):  # no process (or no pass_fds) to be
        break  # had here: fewer helpers, or none
      self._helpers[helper.reports] = helper
    self._ready: set[Connection] = set()
    self._given: dict[Connection, list] = {}  # a helper -> its group

  def _receive(self, conn: Connection, returned: list) -> Iterator[tuple]:
    """What `conn` sent: ready (nothing), a group done (its report), a
    group failed or the helper gone (its group into `returned`)."""
    try:
      message = conn.recv()
    except (EOFError, OSError):
      message = ("gone",)
    group = self._given.pop(conn, None)
    if message is None or message[0] != "gone":
      self._ready.add(conn)
    else:
      self._end(self._helpers.pop(conn))
    if message is not None and message[0] == "done":
      yield message[1:]
    elif group is not None:
      returned.append(group)

  def poll(self, queue: collections.deque, returned: list) -> Iterator[tuple]:
    """Without waiting: the reports of groups done, and each ready helper
    given the last group of `queue`."""
    for conn in list(self._helpers):
      while conn in self._helpers and conn.poll():
        yield from self._receive(conn, returned)
    for conn in list(self._ready):
      if not queue:
        break
      self._ready.discard(conn)
      try:
        self._helpers[conn].commands.send(queue[-1])
      except OSError:  # gone: the group stays here
        self._end(self._helpers.pop(conn))
        continue
      self._given[conn] = queue.pop()

  def wait(self, returned: list) -> Iterator[tuple]:
    """The reports of the groups still with helpers, as each finishes."""
    while self._given:
      for conn in wait(list(self._given)):
        yield from self._receive(conn, returned)

  def release_idle(self) -> None:
    """Ends the helpers holding no group (the queue is empty: one still
    starting would take the cores the sweep and its painters need)."""
    for conn in [c for c in self._helpers if c not in self._given]:
      self._end(self._helpers.pop(conn))
      self._ready.discard(conn)

  def close(self) -> None:
    """Ends every helper now: what each made is here, and in the cache
    before it reported."""
    for helper in self._helpers.values():
      self._end(helper)
    self._helpers.clear()

  @staticmethod
  def _end(helper: _Helper) -> None:
    helper.proc.kill()
    helper.proc.wait()
    helper.commands.close()
    helper.reports.close()


def evaluate(sweep, groups: list[list], helpers: int
             ) -> Iterator[dict[str, Any]]:
  """Every group's records (each group a list of configs not in the
  cache), as each is made: the front groups here, the back ones by
  `helpers` processes, which keep theirs in the sweep's cache."""
  queue = collections.deque(groups)
  pool = Helpers(sweep.spec, helpers, sweep.cache.directory)
  returned: list = []

  def reports(source) -> Iterator[dict[str, Any]]:
    for records, traces, read_off, cached, seconds in source:
      sweep.traces += traces
      sweep.read_off += read_off
      sweep.groups_cached += cached
      sweep.seconds.update(seconds)
      yield from records

  try:
    while queue or returned:
      group = returned.pop() if returned else queue.popleft()
      if not queue:
        pool.release_idle()
      for c in group:
        yield from reports(pool.poll(queue, returned))
        yield sweep.evaluate_one(c)
      if not queue and not returned:
        yield from reports(pool.wait(returned))
  finally:
    pool.close()


if __name__ == "__main__":
  _serve(Connection(int(sys.argv[1]), writable=False),
         Connection(int(sys.argv[2]), readable=False), int(sys.argv[3]))
