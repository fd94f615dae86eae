"""A persistent cache of results, keyed by everything that determines them.

A sweep's evaluated configs, its groups' estimators (the traces read as
data: simulator.group_estimate), its compile confirmations and its pictures
are pure functions of the model config, the run settings, the topology and mesh
(a picture: of the data it draws), the library versions and this project's
own code (experiments/ too: the pictures are drawn there); the key hashes
all of them, so a repeated sweep or confirmation returns what was computed
before, and any change (a new jax, an edited rule) misses. Entries are JSON
files (estimators: pickles) under `directory/kind/`, written whole (a
temporary file renamed into place).
"""

from __future__ import annotations

import functools
import glob
import hashlib
import importlib.metadata
import json
import os
import pickle
import statistics
import sys
import tempfile
from typing import Any, Callable

_LIBRARIES = ("jax", "jaxlib", "libtpu", "flax", "optax", "numpy",
              "matplotlib")  # the sweep's pictures
_SOURCES = ("simulator", "models", "meshes", "experiments")


def default_dir() -> str:
  """$XDG_CACHE_HOME/shardsim, or ~/.cache/shardsim."""
  base = os.environ.get("XDG_CACHE_HOME") or os.path.join(
      os.path.expanduser("~"), ".cache")
  return os.path.join(base, "shardsim")


@functools.lru_cache(None)
def code_version() -> str:
  """The library versions and a hash of this project's source files."""
  h = hashlib.sha256()
  for name in _LIBRARIES:
    try:
      version = importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
      version = "absent"
    h.update(f"{name}={version};".encode())
  root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  for package in _SOURCES:
    for path in sorted(glob.glob(os.path.join(root, package, "**", "*.*"),
                                 recursive=True)):
      if path.endswith((".py", ".json")):
        h.update(os.path.relpath(path, root).encode())
        with open(path, "rb") as f:
          h.update(f.read())
  return h.hexdigest()[:20]


class Cache:
  """Entries by (kind, key); `directory` None or "" disables the cache.

  The cache only saves time, so it never fails a run: an entry that cannot
  be read or is not what its reader expects is recomputed, and a folder
  that cannot be written is said once (stderr) and left unwritten."""

  def __init__(self, directory: str | None):
    self.directory = directory or None
    self.unwritable: str | None = None  # why writing stopped, once it did

  @staticmethod
  def key(**parts: Any) -> str:
    text = json.dumps({**parts, "code": code_version()}, sort_keys=True,
                      default=str)
    return hashlib.sha256(text.encode()).hexdigest()

  def _path(self, kind: str, key: str, suffix: str = ".json") -> str:
    return os.path.join(self.directory, kind, key[:2], f"{key}{suffix}")

  def get(self, kind: str, key: str,
          read: Callable[[Any], Any] = lambda entry: entry) -> Any:
    """`read` of the entry, or None where there is none, or it is torn by
    a crash or not of the shape `read` takes (any error it raises):
    recomputed then."""
    data = self._read(kind, key, ".json")
    try:
      return None if data is None else read(json.loads(data))
    except Exception:  # noqa: BLE001 - torn or foreign: recompute
      return None

  def put(self, kind: str, key: str, value: dict) -> None:
    self._write(kind, key, ".json", json.dumps(value).encode())

  def get_object(self, kind: str, key: str, of_type: type) -> Any:
    """An `of_type` object `put_object` kept (this project's own, pickled:
    the key covers this project's code, so the classes are the ones that
    wrote it), or None."""
    data = self._read(kind, key, ".pickle")
    try:
      value = None if data is None else pickle.loads(data)
    except Exception:  # noqa: BLE001 - torn or foreign bytes: recompute
      return None
    return value if isinstance(value, of_type) else None

  def put_object(self, kind: str, key: str, value: Any) -> None:
    self._write(kind, key, ".pickle",
                pickle.dumps(value, pickle.HIGHEST_PROTOCOL))

  def _read(self, kind: str, key: str, suffix: str) -> bytes | None:
    if not self.directory:
      return None
    try:
      with open(self._path(kind, key, suffix), "rb") as f:
        return f.read()
    except OSError:  # absent
      return None

  def _write(self, kind: str, key: str, suffix: str, data: bytes) -> None:
    """Written whole: a temporary file renamed into place."""
    if not self.directory or self.unwritable:
      return
    path = self._path(kind, key, suffix)
    tmp = None
    try:
      os.makedirs(os.path.dirname(path), exist_ok=True)
      fd, tmp = tempfile.mkstemp(dir=os.path.dirname(path), suffix=".tmp")
      with os.fdopen(fd, "wb") as f:
        f.write(data)
      os.replace(tmp, path)
    except (OSError, ValueError) as e:  # ValueError: a NUL in the path
      if tmp and os.path.exists(tmp):
        os.remove(tmp)
      self.unwritable = getattr(e, "strerror", None) or str(e)
      print(f"warning: the cache folder {self.directory} cannot be written "
            f"({self.unwritable}); this run goes on without keeping its "
            "results there (--cache_dir= turns the cache off)",
            file=sys.stderr)

  def history(self, kind: str, field: str, **match: Any) -> list[float]:
    """`field` of every `kind` entry whose fields equal `match` (the
    expected time of a compile, from those made before)."""
    if not self.directory:
      return []
    out = []
    for path in glob.glob(os.path.join(self.directory, kind, "*", "*.json")):
      try:
        with open(path) as f:
          entry = json.load(f)
      except (OSError, ValueError):
        continue
      if field in entry and all(entry.get(k) == v for k, v in match.items()):
        out.append(float(entry[field]))
    return out

  def expected(self, kind: str, field: str, **match: Any) -> float | None:
    """The median of `history`, or None without one."""
    values = self.history(kind, field, **match)
    return statistics.median(values) if values else None
