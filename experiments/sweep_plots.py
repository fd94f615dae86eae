"""The mesh sweep's pictures: their data read off the records, readable
without the README (axes with units, a legend, a colour scale, every cell
explained), drawn by experiments.drawing.

Each picture is PNG bytes, as TensorBoard's image summary stores it, and is
kept in the sweep's cache (simulator.cache) under the data it draws: a
repeated sweep writes its report without importing matplotlib or drawing
(about 0.9 s and 1.6 s for bench_sweep's workload on session 33's slow
2-core machine). A sweep that traces draws them in Painters, processes
started beside it.
"""

from __future__ import annotations

import base64
import json
import subprocess
from typing import Any, Mapping

import numpy as np

from experiments import drawing
from meshes.hardware import GiB
from simulator.search import record_mesh
from simulator.workers import module_process

# What is live at the peak (simulator.memory PEAK_CATEGORIES) and the
# planning overhead: stacked, they reach the planned peak.
CATEGORIES = ("params", "optimizer", "batch", "tile_padding", "grads",
              "activations", "logits", "temporaries", "overhead")
MAX_BARS = 24  # the best-ranked plans shown in the breakdown


class Painters:
  """Processes drawing pictures beside the sweep (`python -m
  experiments.drawing`): each imports matplotlib as it starts, on the core
  the sweep's tracing leaves idle, and at the end the pictures are drawn
  side by side, one a process, not one after the other here. What a
  process fails to draw is drawn here."""

  def __init__(self, count: int = 2):
    self._procs: list[subprocess.Popen] = []
    for _ in range(count):
      try:
        self._procs.append(module_process(
            "experiments.drawing", text=True, stdin=subprocess.PIPE,
            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL))
      except OSError:
        break  # fewer processes: the rest is drawn here

  def draw(self, requests: list[tuple[str, dict]]) -> list[bytes | None]:
    """PNG bytes for each (drawing, data), or None where it failed."""
    sent = []
    for i, (name, data) in enumerate(requests):
      proc = self._procs[i % len(self._procs)] if self._procs else None
      try:
        proc.stdin.write(json.dumps({"picture": name, "data": data}) + "\n")
        proc.stdin.flush()
        sent.append(proc)
      except (AttributeError, OSError, ValueError):  # none, or it is gone
        sent.append(None)
    out = []
    for proc in sent:  # each process answers in the order it was asked
      try:
        reply = json.loads(proc.stdout.readline() or "{}")
      except (AttributeError, OSError, ValueError):
        reply = {}
      out.append(base64.b64decode(reply["png"]) if "png" in reply else None)
    return out

  def close(self) -> None:
    """Ends the processes now: every reply asked for is here, and a
    process's own exit (matplotlib's teardown) took 0.2 s the sweep waited
    for."""
    for proc in self._procs:
      proc.kill()
      proc.wait()
      for pipe in (proc.stdin, proc.stdout):
        try:
          pipe.close()
        except OSError:
          pass
    self._procs = []


def _png(entry: dict) -> bytes:
  """A kept picture's PNG bytes; raises on anything else (redrawn then)."""
  png = base64.b64decode(entry["png"], validate=True)
  if not png.startswith(b"\x89PNG\r\n\x1a\n"):
    raise ValueError("not a PNG")
  return png


def drawn(requests: Mapping[str, tuple[str, dict]], cache=None,
          painters: Painters | None = None) -> dict[str, bytes]:
  """{tag: PNG} for {tag: (drawing, data)}: what an earlier draw of equal
  data made, kept in `cache` (a simulator.cache.Cache, or None; its key
  covers this project's code and the library versions, matplotlib's
  included), else drawn by `painters` or here, and kept."""
  out, keys, todo = {}, {}, []
  for tag, (name, data) in requests.items():
    if cache is not None and cache.directory:
      keys[tag] = cache.key(picture=name, data=data)
      png = cache.get("picture", keys[tag], _png)
      if png is not None:
        out[tag] = png
        continue
    todo.append(tag)
  made = (painters.draw([requests[t] for t in todo]) if painters and todo
          else [None] * len(todo))
  for tag, png in zip(todo, made):
    name, data = requests[tag]
    out[tag] = png or drawing.DRAWINGS[name](data)
    if tag in keys:
      cache.put("picture", keys[tag],
                {"png": base64.b64encode(out[tag]).decode()})
  return out


def pictures(records: list[Mapping[str, Any]], hbm_bytes: int, cache=None,
             painters: Painters | None = None) -> dict[str, bytes]:
  """The sweep report's pictures by TensorBoard tag: memory/breakdown and
  perf/mfu_heatmap."""
  return drawn({"memory/breakdown": ("breakdown",
                                     breakdown_data(records, hbm_bytes)),
                "perf/mfu_heatmap": ("heatmap", heatmap_data(records))},
               cache, painters)


def bar_stacks(records: list[Mapping[str, Any]]) -> dict[str, np.ndarray]:
  """GiB per category for each record, in CATEGORIES order."""
  return {cat: np.array([r.get("memory", {}).get(cat, 0) / GiB
                         for r in records]) for cat in CATEGORIES}


def breakdown_data(records: list[Mapping[str, Any]], hbm_bytes: int) -> dict:
  """What the breakdown draws: what is live at each plan's peak, per
  device, for the best-ranked plans (records in rank order), and the chip's
  HBM."""
  ok = [r for r in records if r.get("status") == "ok"][:MAX_BARS]
  return {"labels": [f"{record_mesh(r)} b{r['batch']}\n{r['remat']}"
                     for r in ok],
          "stacks": {cat: gib.tolist() for cat, gib in bar_stacks(ok).items()},
          "hbm_gib": hbm_bytes / GiB}


def _row(r: Mapping[str, Any]) -> tuple[int, int, int]:
  """A record's heatmap row: (pipeline stages P, replicas D, X); P·D·X·Y
  is the chips, so the three name the mesh."""
  return r.get("P", 1), r.get("D", 1), r["X"]


def mfu_grid(records: list[Mapping[str, Any]]):
  """((P, D, X) rows, batches, best MFU per cell (NaN: no plan), whether that
  plan fits): the best of the plans that fit, or, where none fits, the best
  of those that do not (a plan over HBM is not one to book)."""
  xs = sorted({_row(r) for r in records})
  bs = sorted({r["batch"] for r in records})
  grid = np.full((len(xs), len(bs)), np.nan)
  fits = np.zeros((len(xs), len(bs)), dtype=bool)
  for r in records:
    if r.get("status") != "ok":
      continue
    i, j = xs.index(_row(r)), bs.index(r["batch"])
    if np.isnan(grid[i, j]) or (r["fits"], r["mfu"]) > (fits[i, j],
                                                        grid[i, j]):
      grid[i, j], fits[i, j] = r["mfu"], r["fits"]
  return xs, bs, grid, fits


def heatmap_data(records: list[Mapping[str, Any]]) -> dict:
  """What the heatmap draws (mfu_grid), its rows named by mesh."""
  xs, bs, grid, fits = mfu_grid(records)
  return {"meshes": [record_mesh(next(r for r in records if _row(r) == row))
                     for row in xs],
          "batches": bs,
          "mfu": [[None if np.isnan(v) else float(v) for v in row]
                  for row in grid],
          "fits": fits.tolist()}
