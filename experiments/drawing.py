"""The mesh sweep's pictures drawn from their data, and a process drawing them.

Each drawing takes the plain data experiments.sweep_plots reads off the
records and returns PNG bytes, as TensorBoard's image summary stores them.
Only numpy and matplotlib are imported here, so that

  python -m experiments.drawing

(started by sweep_plots.Painters, not by users) is ready in about a second:
it imports matplotlib at once, then answers each request line,
{"picture": NAME, "data": {...}}, with one line, {"png": BASE64} or
{"error": "..."}, until its input closes.
"""

from __future__ import annotations

import base64
import io
import json
import os
import sys
from typing import Callable, TextIO

import numpy as np


def pyplot():
  """matplotlib's pyplot on the file-only backend, imported where a picture
  is drawn (not when this module is); its first run on a machine builds a
  font cache and logs it at INFO, which absl would print: not shown."""
  import logging
  logging.getLogger("matplotlib").setLevel(logging.WARNING)
  import matplotlib
  matplotlib.use("Agg")  # files only, no display
  import matplotlib.pyplot as plt
  return plt


def _png(fig) -> bytes:
  buf = io.BytesIO()
  fig.savefig(buf, format="png", dpi=110, bbox_inches="tight")
  pyplot().close(fig)
  return buf.getvalue()


def breakdown(data: dict) -> bytes:
  """Stacked bars of GiB per category (data["stacks"], in order) for each
  plan (data["labels"]), and the chip's HBM (data["hbm_gib"])."""
  plt = pyplot()
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


def heatmap(data: dict) -> bytes:
  """The best MFU (None: no plan) per mesh row and batch column, and
  whether that plan fits."""
  plt = pyplot()
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


DRAWINGS: dict[str, Callable[[dict], bytes]] = {"breakdown": breakdown,
                                                "heatmap": heatmap}


def serve(requests: TextIO, replies: TextIO) -> None:
  """Answers each request line with one reply line (module docstring)."""
  pyplot()  # the import, before the first request comes
  for line in requests:
    try:
      request = json.loads(line)
      png = DRAWINGS[request["picture"]](request["data"])
      reply = {"png": base64.b64encode(png).decode()}
    except Exception as e:  # pylint: disable=broad-except
      reply = {"error": f"{type(e).__name__}: {e}"}  # drawn by the caller
    replies.write(json.dumps(reply) + "\n")
    replies.flush()


if __name__ == "__main__":
  # Below the sweep's priority: on two cores, two of these processes
  # importing beside the sweep's tracing would slow it.
  os.nice(19)
  replies, sys.stdout = sys.stdout, sys.stderr  # the protocol's alone
  serve(sys.stdin, replies)
