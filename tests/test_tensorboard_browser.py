"""experiments.tensorboard_browser: the sweep's dashboards, as a browser
draws them (needs Debian's chromium; CI installs it)."""

import io
import os

import pytest

from experiments import mesh_sweep, tensorboard_browser
from experiments.tensorboard_writer import MetricsWriter
from simulator import search

pytestmark = pytest.mark.skipif(
    tensorboard_browser.chromium() is None,
    reason="chromium is not installed (apt-get install chromium)")

SPEC = search.SweepSpec(model="tiny", topology="v5p-8", batches=(4, 8),
                        remats=("full", "dots"), seq=32)


def _sweep(tmp_path) -> str:
  run = mesh_sweep.run_sweep(SPEC, str(tmp_path), "s", top_k=0,
                             progress=False, out=io.StringIO())
  return run.tensorboard_dir


def test_every_dashboard_opens_drawn(tmp_path):
  logdir = _sweep(tmp_path)
  with tensorboard_browser.serve(logdir) as base:
    results = tensorboard_browser.check(base, str(tmp_path / "shots"))
  assert [r.name for r in results] == list(tensorboard_browser.DASHBOARDS)
  assert all(r.ok for r in results), [r for r in results if not r.ok]
  assert all(os.path.getsize(r.screenshot) > 10_000 for r in results)


def test_the_check_sees_a_text_dashboard_with_no_run_selected(tmp_path):
  """With more than 40 runs TensorBoard's Text dashboard opens with none
  selected: the check must say so (the failure issue 16 found)."""
  logdir = _sweep(tmp_path)
  for i in range(41):
    with MetricsWriter(os.path.join(logdir, "extra", f"r{i:02d}")) as w:
      w.scalar("x", 1.0, 0)
  with tensorboard_browser.serve(logdir) as base:
    results = {r.name: r for r in tensorboard_browser.check(
        base, str(tmp_path / "shots"), timeout_s=10,
        names=("timeseries", "text"))}
  assert not results["text"].ok and results["timeseries"].ok
