"""results.jsonl: one JSON line per config, appended as each finishes.

Each line is flushed to the operating system as it is written, so a sweep
whose process is interrupted or killed loses at most the line being written;
`sync` (after the sweep's loop) puts them on disk, one fsync for the sweep
rather than one per line (320 fsyncs took 1.2 s of a profiled
whole-process sweep of llama2_70b on v5p-1024, python -m cProfile). `load` skips
a torn last line and any line that is not a record, and `--resume`
evaluates only the keys not yet present. Compile
confirmation adds fields to lines already written: `update` rewrites the file
atomically (temp file + os.replace), so it stays one line per config.
"""

from __future__ import annotations

import contextlib
import json
import os
from typing import Any, Callable, Hashable, Iterable, Iterator

FILENAME = "results.jsonl"


@contextlib.contextmanager
def naming(path: str) -> Iterator[None]:
  """An OSError that names no file (a full disk on write) named `path`,
  the file or folder being written, for the one-line error."""
  try:
    yield
  except OSError as e:
    if e.filename:
      raise
    raise OSError(e.errno, e.strerror or str(e), path) from None


class ResultsFile:
  """Lines that are not records of this file (a comment, a row of another
  shape, bytes that are not UTF-8) are not results: `load` skips them and
  `update` writes them back where they were, so nothing written is lost."""

  def __init__(self, path: str, key: Callable[[dict], Hashable]):
    self.path, self.key = path, key

  def _lines(self) -> list[str]:
    """The file's lines as written (bytes that are not UTF-8 kept as they
    are, surrogate-escaped)."""
    if not os.path.exists(self.path):
      return []
    with open(self.path, encoding="utf-8", errors="surrogateescape") as f:
      return f.readlines()

  def _record(self, line: str) -> tuple[Hashable, dict] | None:
    """(key, record) of a record line, else None."""
    try:
      record = json.loads(line)
      return self.key(record), record
    except (ValueError, KeyError, TypeError, AttributeError):
      return None  # torn by an interruption, or not a record

  def load(self) -> list[dict[str, Any]]:
    """Every record, in order; a later line for a key replaces an earlier."""
    by_key: dict[Hashable, dict] = {}
    for line in self._lines():
      if (parsed := self._record(line)) is not None:
        by_key[parsed[0]] = parsed[1]
    return list(by_key.values())

  def done(self) -> set[Hashable]:
    return {self.key(r) for r in self.load()}

  def append(self, record: dict[str, Any]) -> None:
    self._repair_tail()
    with naming(self.path), open(self.path, "a") as f:
      f.write(json.dumps(record, sort_keys=True) + "\n")

  def sync(self) -> None:
    """Puts the appended lines on disk (they survive a machine crash too)."""
    if os.path.exists(self.path):
      with open(self.path, "a") as f:
        os.fsync(f.fileno())

  def update(self, updates: Iterable[dict[str, Any]]) -> None:
    """Merges each update's fields into the line with the same key (a new
    key's line added at the end); every other line kept as it is."""
    lines = [(line, self._record(line)) for line in self._lines()]
    if lines and not lines[-1][0].endswith("\n") and lines[-1][1] is None:
      lines.pop()  # torn by an interruption
    records = dict(parsed for _, parsed in lines if parsed is not None)
    for u in updates:
      records.setdefault(self.key(u), {}).update(u)
    tmp = self.path + ".tmp"
    with naming(tmp), open(tmp, "w", encoding="utf-8",
                           errors="surrogateescape") as f:
      for line, parsed in lines:
        if parsed is None:
          f.write(line if line.endswith("\n") else line + "\n")
        elif parsed[0] in records:  # its last value, where it first was
          f.write(json.dumps(records.pop(parsed[0]), sort_keys=True) + "\n")
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
