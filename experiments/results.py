"""results.jsonl: one JSON line per config, appended as each finishes.

Each line is flushed to the operating system as it is written, so a sweep
whose process is interrupted or killed loses at most the line being written;
`sync` (after the sweep's loop) puts them on disk, one fsync for the sweep
rather than one per line (320 fsyncs took 1.2 s of a profiled
whole-process sweep of llama2_70b on v5p-1024, python -m cProfile). `load` skips
a torn last line, and `--resume` evaluates only the keys not yet present. Compile
confirmation adds fields to lines already written: `update` rewrites the file
atomically (temp file + os.replace), so it stays one line per config.
"""

from __future__ import annotations

import json
import os
from typing import Any, Callable, Hashable, Iterable

FILENAME = "results.jsonl"


class ResultsFile:

  def __init__(self, path: str, key: Callable[[dict], Hashable]):
    self.path, self.key = path, key

  def load(self) -> list[dict[str, Any]]:
    """Every complete line, in order; a later line for a key replaces an earlier."""
    if not os.path.exists(self.path):
      return []
    by_key: dict[Hashable, dict] = {}
    with open(self.path) as f:
      for line in f:
        try:
          record = json.loads(line)
        except json.JSONDecodeError:
          continue  # a line torn by an interruption
        by_key[self.key(record)] = record
    return list(by_key.values())

  def done(self) -> set[Hashable]:
    return {self.key(r) for r in self.load()}

  def append(self, record: dict[str, Any]) -> None:
    self._repair_tail()
    with open(self.path, "a") as f:
      f.write(json.dumps(record, sort_keys=True) + "\n")

  def sync(self) -> None:
    """Puts the appended lines on disk (they survive a machine crash too)."""
    if os.path.exists(self.path):
      with open(self.path, "a") as f:
        os.fsync(f.fileno())

  def update(self, updates: Iterable[dict[str, Any]]) -> None:
    """Merges each update's fields into the line with the same key."""
    records = {self.key(r): r for r in self.load()}
    for u in updates:
      records.setdefault(self.key(u), {}).update(u)
    tmp = self.path + ".tmp"
    with open(tmp, "w") as f:
      for r in records.values():
        f.write(json.dumps(r, sort_keys=True) + "\n")
      f.flush()
      os.fsync(f.fileno())
    os.replace(tmp, self.path)

  def _repair_tail(self) -> None:
    """Drops a torn last line (an interrupted write) so the next record starts clean."""
    if not os.path.exists(self.path) or os.path.getsize(self.path) == 0:
      return
    with open(self.path, "rb+") as f:
      data = f.read()
      if not data.endswith(b"\n"):
        f.truncate(data.rfind(b"\n") + 1)
