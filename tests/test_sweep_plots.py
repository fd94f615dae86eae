"""experiments.sweep_plots: the pictures' data, and that they render."""

import math

from experiments import sweep_plots

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


def test_pictures_render():
  records = _records()
  assert sweep_plots.memory_breakdown(records, 95 * GiB).size[0] > 300
  assert sweep_plots.mfu_heatmap(records).size[1] > 200
