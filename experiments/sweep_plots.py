"""The mesh sweep's pictures, drawn with matplotlib: readable without the
README (axes with units, a legend, a colour scale, every cell explained)."""

from __future__ import annotations

import io
from typing import Any, Mapping

import matplotlib

matplotlib.use("Agg")  # files only, no display
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
from PIL import Image  # noqa: E402

from meshes.hardware import GiB  # noqa: E402
from simulator.search import record_mesh  # noqa: E402

# What is live at the peak (simulator.memory PEAK_CATEGORIES) and the
# planning overhead: stacked, they reach the planned peak.
CATEGORIES = ("params", "optimizer", "batch", "tile_padding", "grads",
              "activations", "logits", "temporaries", "overhead")
MAX_BARS = 24  # the best-ranked plans shown in the breakdown


def _image(fig) -> Image.Image:
  buf = io.BytesIO()
  fig.savefig(buf, format="png", dpi=110, bbox_inches="tight")
  plt.close(fig)
  buf.seek(0)
  return Image.open(buf).convert("RGB")


def bar_stacks(records: list[Mapping[str, Any]]) -> dict[str, np.ndarray]:
  """GiB per category for each record, in CATEGORIES order."""
  return {cat: np.array([r.get("memory", {}).get(cat, 0) / GiB
                         for r in records]) for cat in CATEGORIES}


def memory_breakdown(records: list[Mapping[str, Any]], hbm_bytes: int
                     ) -> Image.Image:
  """Stacked bars of what is live at each plan's peak, per device, for the
  best-ranked plans (records in rank order); a line at the chip's HBM."""
  ok = [r for r in records if r.get("status") == "ok"][:MAX_BARS]
  fig, ax = plt.subplots(figsize=(max(6.0, 0.45 * len(ok) + 3), 4.5))
  labels = [f"{record_mesh(r)} b{r['batch']}\n{r['remat']}" for r in ok]
  x = np.arange(len(ok))
  base = np.zeros(len(ok))
  colours = plt.get_cmap("tab10")
  for i, (cat, gib) in enumerate(bar_stacks(ok).items()):
    if gib.any():
      ax.bar(x, gib, bottom=base, color=colours(i), label=cat, width=0.7)
    base += gib
  hbm, top = hbm_bytes / GiB, float(base.max()) if len(base) else 0.0
  if top >= hbm / 4 or not top:  # the HBM line, where bars stay readable
    ax.axhline(hbm, color="black", linestyle="--", linewidth=1,
               label=f"HBM {hbm:.0f} GiB")
  else:
    ax.set_ylim(0, top * 1.15)
    ax.text(0.5, 0.97, f"HBM {hbm:.0f} GiB: far above every peak, off scale",
            transform=ax.transAxes, ha="center", va="top", fontsize=7)
  ax.set_xticks(x, labels, rotation=60, ha="right", fontsize=7)
  ax.set_ylabel("GiB per device at the peak")
  ax.set_title(f"What is live at each plan's peak (best {len(ok)} plans, "
               "rank order; stacked to the planned peak)", fontsize=9)
  ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=7)
  return _image(fig)


def _row(r: Mapping[str, Any]) -> tuple[int, int, int]:
  """A record's heatmap row: (pipeline stages P, replicas D, X); P·D·X·Y
  is the chips, so the three name the mesh."""
  return r.get("P", 1), r.get("D", 1), r["X"]


def mfu_grid(records: list[Mapping[str, Any]]):
  """((P, D, X) rows, batches, best MFU per cell (NaN: no plan), whether that
  plan fits)."""
  xs = sorted({_row(r) for r in records})
  bs = sorted({r["batch"] for r in records})
  grid = np.full((len(xs), len(bs)), np.nan)
  fits = np.zeros((len(xs), len(bs)), dtype=bool)
  for r in records:
    if r.get("status") != "ok":
      continue
    i, j = xs.index(_row(r)), bs.index(r["batch"])
    if np.isnan(grid[i, j]) or r["mfu"] > grid[i, j]:
      grid[i, j], fits[i, j] = r["mfu"], r["fits"]
  return xs, bs, grid, fits


def mfu_heatmap(records: list[Mapping[str, Any]]) -> Image.Image:
  """The best predicted MFU per (X, batch) over the other swept choices."""
  xs, bs, grid, fits = mfu_grid(records)
  fig, ax = plt.subplots(figsize=(1.0 * len(bs) + 3, 0.5 * len(xs) + 2))
  shown = ax.imshow(np.ma.masked_invalid(grid), cmap="viridis", vmin=0,
                    vmax=1, aspect="auto")
  fig.colorbar(shown, ax=ax, label="predicted MFU (simulator.timing.roofline step time)")
  for i in range(len(xs)):
    for j in range(len(bs)):
      if np.isnan(grid[i, j]):
        ax.text(j, i, "no plan", ha="center", va="center", fontsize=7,
                color="grey")
      else:
        ax.text(j, i, f"{grid[i, j]:.0%}" + ("" if fits[i, j] else "\nno fit"),
                ha="center", va="center", fontsize=7,
                color="white" if grid[i, j] < 0.6 else "black")
  ax.set_xticks(range(len(bs)), [str(b) for b in bs])
  ax.set_yticks(range(len(xs)), [record_mesh(next(
      r for r in records if _row(r) == row)) for row in xs])
  ax.set_xlabel("global batch (sequences)")
  ax.set_ylabel("mesh X x Y (PpxXxY with pipeline stages, DdxXxY with "
                "replicas)")
  ax.set_title("Best predicted MFU per mesh and batch\n'no plan': every "
               "config there failed (see the ranked table)", fontsize=9)
  return _image(fig)
