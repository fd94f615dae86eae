"""MetricsWriter: what it writes reads back with EventAccumulator."""

import io
import os

from PIL import Image
from tensorboard.backend.event_processing import event_accumulator as ea

from experiments import tensorboard_writer as tbw


def _acc(path):
  a = ea.EventAccumulator(path, size_guidance={ea.TENSORS: 0, ea.SCALARS: 0})
  a.Reload()
  return a


def test_scalars_text_image_read_back(tmp_path):
  with tbw.MetricsWriter(str(tmp_path)) as w:
    w.scalar("memory/peak_gib", 12.5, step=64)
    w.text("sweep/note", "hello **table**")
    png = io.BytesIO()
    Image.new("RGB", (7, 5), "red").save(png, format="PNG")
    w.image("memory/breakdown", png.getvalue())
  a = _acc(str(tmp_path))
  assert [(e.step, e.value) for e in a.Scalars("memory/peak_gib")] == [(64, 12.5)]
  assert a.Tensors("sweep/note")[0].tensor_proto.string_val == [b"hello **table**"]
  w_, h_, png = a.Tensors("memory/breakdown")[0].tensor_proto.string_val
  assert (w_, h_) == (b"7", b"5") and png.startswith(b"\x89PNG")


def test_new_run_dir_never_reuses(tmp_path):
  a = tbw.new_run_dir(str(tmp_path), "run")
  b = tbw.new_run_dir(str(tmp_path), "run")
  assert os.path.basename(a) == "run" and os.path.basename(b) == "run-2"


def test_session_metrics_skip_missing_and_failed():
  r = dict(status="ok", peak_bytes=2**31, fits=True, step_time_s=1.0, mfu=0.5,
           threshold_tokens_global=None, compute_bound=False)
  m = tbw.session_metrics(r)
  assert m["memory/peak_gib"] == 2.0 and m["perf/compute_bound"] == 0.0
  assert "memory/compiled_peak_gib" not in m
  assert tbw.session_metrics(dict(status="failed")) == {}


def test_count_hparams_are_text():
  """X, Y and batch are written as text: TensorBoard shows a numeric hparam
  as "16.000"."""
  from experiments import tensorboard_writer as tw
  r = {"X": 16, "Y": 2, "batch": 128, "remat": "full"}
  assert [tw._hparam(r, k) for k in ("X", "Y", "batch", "mesh", "remat")] == [
      "16", "2", "128", "16x2", "full"]
  assert set(tw._hparam_domain(["16", "2", "128", "2"]).values) == {
      "2", "16", "128"}


def test_a_sweep_report_keeps_to_forty_runs(tmp_path):
  """TensorBoard's Text and Images dashboards open with no run selected
  when there are more than 40: a 60-plan sweep writes 38 sessions."""
  from experiments import tensorboard_writer as tw
  records = [dict(status="ok", X=1, Y=1, batch=b, remat="full", shard="zero3",
                  optimizer="adamw", model="tiny", topology="v5p-8",
                  peak_bytes=2**30, fits=True, step_time_s=1.0, mfu=0.5,
                  roofline_mfu=0.6, tokens_per_s=float(b),
                  threshold_tokens_global=1.0, compute_bound=True,
                  memory={}, hbm_bytes=2**34) for b in range(1, 61)]
  root = tw.write_sweep(str(tmp_path), records, "| table |", "recommended",
                        2**34)
  runs = [d for d, _, files in os.walk(root)
          if any(f.startswith("events.out.tfevents") for f in files)]
  assert len(runs) == tw.MAX_RUNS == 40


def test_a_sweep_where_every_config_failed_still_writes_its_report(tmp_path):
  """No session, no hparams experiment (an empty domain is an error)."""
  from experiments import tensorboard_writer as tw
  failed = [dict(status="failed", X=6144, Y=1, batch=6144, remat="full",
                 shard="zero3", optimizer="adamw", error="X does not divide")]
  root = tw.write_sweep(str(tmp_path), failed, "| table |", "no config could "
                        "be evaluated", 2**34)
  assert os.path.isdir(root) and not os.path.exists(
      os.path.join(root, "sessions"))


def test_the_ranked_table_is_shown_in_aligned_columns():
  from experiments import tensorboard_writer as tw
  text = tw.aligned("| rank | mesh |\n|---|---|\n| 1 | 64x1 |\n[1] a reason")
  assert text.splitlines() == ["rank  mesh", "----  ----", "1     64x1",
                               "[1] a reason"]


def test_what_ranks_plans_is_among_the_five_metrics_shown_by_default():
  """TensorBoard's HParams shows the first five metrics; hparams that
  differ across sessions come first there, so a swept shard shows."""
  from experiments import tensorboard_writer as tw
  assert "perf/tokens_per_s" in list(tw.SWEEP_METRICS)[:5]
  assert "perf/mfu" in list(tw.SWEEP_METRICS)[:5]


def test_the_writer_threads_failure_is_told_once_by_the_writer(tmp_path):
  """EventFileWriter's thread re-raises a failed write (a full disk) into
  the next write here, named by the run folder; its own traceback is not
  printed (threading.excepthook), while other threads' still are."""
  import threading
  seen = []
  hook = tbw._writer_thread_errors_told_once(seen.append)
  writer = tbw.MetricsWriter(str(tmp_path / "run"))
  writer_thread = next(t for t in threading.enumerate()
                       if type(t).__module__ == tbw.EventFileWriter.__module__)
  hook(threading.ExceptHookArgs((OSError, OSError(28, "full"), None,
                                 writer_thread)))
  assert seen == []
  other = threading.ExceptHookArgs((ValueError, ValueError(), None,
                                    threading.current_thread()))
  hook(other)
  assert seen == [other]
  writer.close()
