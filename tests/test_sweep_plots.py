"""experiments.sweep_plots: the pictures' data, and that they render."""

import io
import math

import pytest
from PIL import Image

from experiments import drawing, sweep_plots
from simulator.cache import Cache

GiB = 2**30


def _records():
  live = {"params": 2 * GiB, "optimizer": 4 * GiB, "grads": 2 * GiB,
          "activations": 3 * GiB, "temporaries": GiB, "overhead": GiB}
  ok = [dict(status="ok", X=x, Y=8 // x, batch=b, remat="full",
             mfu=0.1 * x + b / 1000, fits=x > 1,
             peak_bytes=sum(live.values()), memory=live)
        for x in (1, 2) for b in (8, 16)]
  return ok + [dict(status="failed", X=4, Y=2, batch=8, error="X")]


def test_bars_stack_to_the_planned_peak():
  records = [r for r in _records() if r["status"] == "ok"]
  stacks = sweep_plots.bar_stacks(records)
  for k, r in enumerate(records):
    assert math.isclose(sum(v[k] for v in stacks.values()),
                        r["peak_bytes"] / GiB)


def test_heatmap_cells_best_mfu_and_no_plan():
  xs, bs, grid, fits = sweep_plots.mfu_grid(_records())
  assert xs == [(1, 1, 1), (1, 1, 2), (1, 1, 4)] and bs == [8, 16]
  assert math.isclose(grid[1, 1], 0.2 + 0.016) and fits[1, 1]
  assert not fits[0, 0]
  assert all(math.isnan(v) for v in grid[2])  # X=4 only failed


def test_a_cell_shows_the_best_plan_that_fits():
  """A faster plan over HBM does not hide a slower one that fits."""
  base = dict(status="ok", X=2, Y=4, batch=8, memory={}, peak_bytes=0)
  records = [dict(base, remat="none", mfu=0.6, fits=False),
             dict(base, remat="full", mfu=0.4, fits=True),
             dict(base, remat="dots", mfu=0.5, fits=False)]
  _, _, grid, fits = sweep_plots.mfu_grid(records)
  assert (grid[0, 0], fits[0, 0]) == (0.4, True)
  _, _, grid, fits = sweep_plots.mfu_grid(
      [r for r in records if not r["fits"]])
  assert (grid[0, 0], fits[0, 0]) == (0.6, False)


def _size(png: bytes) -> tuple[int, int]:
  return Image.open(io.BytesIO(png)).size


def test_pictures_render():
  records = _records()
  pictures = sweep_plots.pictures(records, 95 * GiB)
  assert _size(pictures["memory/breakdown"])[0] > 300
  assert _size(pictures["perf/mfu_heatmap"])[1] > 200


def test_a_picture_of_the_same_data_comes_from_the_cache(tmp_path,
                                                         monkeypatch):
  """A repeated sweep draws nothing: each picture is kept under the data it
  draws, and a change in that data draws again."""
  cache = Cache(str(tmp_path))
  records = _records()
  first = sweep_plots.pictures(records, 95 * GiB, cache)

  def drew_again():
    raise AssertionError("drew again")

  monkeypatch.setattr(drawing, "pyplot", drew_again)
  assert sweep_plots.pictures(records, 95 * GiB, cache) == first
  records[0]["mfu"] += 0.05
  with pytest.raises(AssertionError, match="drew again"):
    sweep_plots.pictures(records, 95 * GiB, cache)
  assert not [p for p in tmp_path.rglob("*.tmp")]  # entries written whole


def test_a_kept_picture_that_is_no_png_is_drawn_again(tmp_path):
  cache = Cache(str(tmp_path))
  records = _records()
  first = sweep_plots.pictures(records, 95 * GiB, cache)
  paths = list(tmp_path.rglob("*.json"))
  for path, bad in zip(paths, ["{}", '{"png": "!!not base64"}',
                               '{"png": "aGVsbG8="}'] * len(paths)):
    path.write_text(bad)
  assert sweep_plots.pictures(records, 95 * GiB, cache) == first


def test_painters_draw_what_this_process_draws():
  """The pictures drawn in the painters' processes, side by side, are the
  bytes drawn here (asked of the painters directly: `pictures` would draw
  a failed one here); the processes are gone once closed."""
  records = _records()
  requests = [("breakdown", sweep_plots.breakdown_data(records, 95 * GiB)),
              ("heatmap", sweep_plots.heatmap_data(records))]
  painters = sweep_plots.Painters()
  procs = list(painters._procs)
  try:
    beside = painters.draw(requests)
  finally:
    painters.close()
  assert len(procs) == 2 and all(p.poll() is not None for p in procs)
  assert beside == [drawing.DRAWINGS[name](data) for name, data in requests]


def test_what_a_painter_fails_to_draw_is_drawn_here():
  """A painter process that is gone (or answers an error) leaves its
  picture to this process: the report still has it."""
  painters = sweep_plots.Painters(count=1)
  painters._procs[0].kill()
  painters._procs[0].wait()
  try:
    made = painters.draw([("heatmap", {}), ("no such drawing", {})])
    assert made == [None, None]
    pictures = sweep_plots.pictures(_records(), 95 * GiB, painters=painters)
  finally:
    painters.close()
  assert _size(pictures["perf/mfu_heatmap"])[1] > 200
  with_errors = sweep_plots.Painters(count=1)
  try:
    assert with_errors.draw([("no such drawing", {})]) == [None]
  finally:
    with_errors.close()
