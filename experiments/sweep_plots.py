"""The mesh sweep's pictures, drawn with matplotlib: readable without the
README (axes with units, a legend, a colour scale, every cell explained).

Each picture is PNG bytes, as TensorBoard's image summary stores it, and is
kept in the sweep's cache (simulator.cache) under the data it draws: a
repeated sweep writes its report without importing matplotlib or drawing
(about 0.9 s and 1.6 s for bench_sweep's workload on session 33's slow
2-core machine).
"""

from __future__ import annotations

import base64
import io
from typing import Any, Callable, Mapping

import numpy as np

from meshes.hardware import GiB
from simulator.search import record_mesh

# What is live at the peak (simulator.memory PEAK_CATEGORIES) and the
# planning overhead: stacked, they reach the planned peak.
CATEGORIES = ("params", "optimizer", "batch", "tile_padding", "grads",
              "activations", "logits", "temporaries", "overhead")
MAX_BARS = 24  # the best-ranked plans shown in the breakdown


def _pyplot():
  """matplotlib's pyplot, imported where a picture is drawn (not when this
  module is), on the file-only backend; its first run on a machine builds
  a font cache and logs it at INFO, which absl would print: not shown."""
  import logging
  logging.getLogger("matplotlib").setLevel(logging.WARNING)
  import matplotlib
  matplotlib.use("Agg")  # files only, no display
  import matplotlib.pyplot as plt
  return plt


def _png(fig) -> bytes:
  buf = io.BytesIO()
  fig.savefig(buf, format="png", dpi=110, bbox_inches="tight")
  _pyplot().close(fig)
  return buf.getvalue()


def _drawn(draw: Callable[[dict], bytes], data: dict, cache) -> bytes:
  """draw(data), or the PNG an earlier draw of equal data made (`cache`: a
  simulator.cache.Cache, or None; its key covers this project's code and
  the library versions, matplotlib's included)."""
  if cache is None or not cache.directory:
    return draw(data)
  key = cache.key(picture=draw.__name__, data=data)
  hit = cache.get("picture", key)
  if hit is not None:
    return base64.b64decode(hit["png"])
  png = draw(data)
  cache.put("picture", key, {"png": base64.b64encode(png).decode()})
  return png


def bar_stacks(records: list[Mapping[str, Any]]) -> dict[str, np.ndarray]:
  """GiB per category for each record, in CATEGORIES order."""
  return {cat: np.array([r.get("memory", {}).get(cat, 0) / GiB
                         for r in records]) for cat in CATEGORIES}


def memory_breakdown(records: list[Mapping[str, Any]], hbm_bytes: int,
                     cache=None) -> bytes:
  """Stacked bars of what is live at each plan's peak, per device, for the
  best-ranked plans (records in rank order); a line at the chip's HBM."""
  ok = [r for r in records if r.get("status") == "ok"][:MAX_BARS]
  return _drawn(_draw_breakdown, {
      "labels": [f"{record_mesh(r)} b{r['batch']}\n{r['remat']}" for r in ok],
      "stacks": {cat: gib.tolist() for cat, gib in bar_stacks(ok).items()},
      "hbm_gib": hbm_bytes / GiB}, cache)


def _draw_breakdown(data: dict) -> bytes:
  plt = _pyplot()
  labels = data["labels"]
  fig, ax = plt.subplots(figsize=(max(6.0, 0.45 * len(labels) + 3), 4.5))
  x = np.arange(len(labels))
  base = np.zeros(len(labels))
  colours = plt.get_cmap("tab10")
  for i, (cat, gib) in enumerate(data["stacks"].items()):
    gib = np.array(gib)
    if gib.any():
      ax.bar(x, gib, bottom=base, color=colours(i), label=cat, width=0.7)
    base += gib
  hbm, top = data["hbm_gib"], float(base.max()) if len(base) else 0.0
  if top >= hbm / 4 or not top:  # the HBM line, where bars stay readable
    ax.axhline(hbm, color="black", linestyle="--", linewidth=1,
               label=f"HBM {hbm:.0f} GiB")
  else:
    ax.set_ylim(0, top * 1.15)
    ax.text(0.5, 0.97, f"HBM {hbm:.0f} GiB: far above every peak, off scale",
            transform=ax.transAxes, ha="center", va="top", fontsize=7)
  ax.set_xticks(x, labels, rotation=60, ha="right", fontsize=7)
  ax.set_ylabel("GiB per device at the peak")
  ax.set_title(f"What is live at each plan's peak (best {len(labels)} plans, "
               "rank order; stacked to the planned peak)", fontsize=9)
  ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=7)
  return _png(fig)


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


def mfu_heatmap(records: list[Mapping[str, Any]], cache=None) -> bytes:
  """The best predicted MFU per (X, batch) over the other swept choices."""
  xs, bs, grid, fits = mfu_grid(records)
  return _drawn(_draw_heatmap, {
      "meshes": [record_mesh(next(r for r in records if _row(r) == row))
                 for row in xs],
      "batches": bs,
      "mfu": [[None if np.isnan(v) else float(v) for v in row] for row in grid],
      "fits": fits.tolist()}, cache)


def _draw_heatmap(data: dict) -> bytes:
  plt = _pyplot()
  meshes, bs, fits = data["meshes"], data["batches"], data["fits"]
  grid = np.array([[np.nan if v is None else v for v in row]
                   for row in data["mfu"]], dtype=float).reshape(
                       len(meshes), len(bs))
  fig, ax = plt.subplots(figsize=(1.0 * len(bs) + 3, 0.5 * len(meshes) + 2))
  shown = ax.imshow(np.ma.masked_invalid(grid), cmap="viridis", vmin=0,
                    vmax=1, aspect="auto")
  fig.colorbar(shown, ax=ax, label="predicted MFU (simulator.timing.roofline step time)")
  for i in range(len(meshes)):
    for j in range(len(bs)):
      if np.isnan(grid[i, j]):
        ax.text(j, i, "no plan", ha="center", va="center", fontsize=7,
                color="grey")
      else:
        ax.text(j, i, f"{grid[i, j]:.0%}" + ("" if fits[i][j] else "\nno fit"),
                ha="center", va="center", fontsize=7,
                color="white" if grid[i, j] < 0.6 else "black")
  ax.set_xticks(range(len(bs)), [str(b) for b in bs])
  ax.set_yticks(range(len(meshes)), meshes)
  ax.set_xlabel("global batch (sequences)")
  ax.set_ylabel("mesh X x Y (PpxXxY with pipeline stages, DdxXxY with "
                "replicas)")
  ax.set_title("Best predicted MFU per mesh and batch among the plans that "
               "fit\n'no fit': none there fits (the best shown); 'no plan': "
               "every config there failed (see the ranked table)", fontsize=9)
  return _png(fig)
