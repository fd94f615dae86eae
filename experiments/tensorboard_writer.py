"""The one metrics writer: TensorBoard event files with the tensorboard package alone.

No TensorFlow: events are `tensorboard.compat.proto` Summary/Event protos written by
`EventFileWriter`. Tags are slash-grouped (`memory/peak_gib`, `perf/mfu`) so the
dashboard groups them into sections.

HParams: TensorBoard treats every run folder that holds a `session_start_info`
summary as one session, and reads that session's metrics from the scalars of the
same run; the experiment (which hparams and metrics exist) is one summary in a
parent run. `hparams_config` writes the latter, `MetricsWriter.session` the former.

Runs: TensorBoard's Scalars, Images and Text dashboards select every run by
default only while there are at most 40 (tf-multi-checkbox's
maxNamesToEnableByDefault); with more, they open empty. A sweep's report
therefore keeps to 40 runs: the report itself, one run of curves (a tag per
series, drawn together by a custom-scalars layout) and a session for each of
the best MAX_SESSIONS plans.
"""

from __future__ import annotations

import io
import os
import threading
import time
from typing import Any, Iterable, Mapping

from experiments import sweep_plots
from experiments.results import naming
from meshes.hardware import GiB
from simulator.search import record_mesh
from tensorboard.compat.proto import event_pb2, summary_pb2, tensor_pb2
from tensorboard.compat.proto import tensor_shape_pb2, types_pb2
from tensorboard.plugins.custom_scalar import layout_pb2
from tensorboard.plugins.custom_scalar import metadata as custom_metadata
from tensorboard.plugins.hparams import summary_v2 as hp
from tensorboard.plugins.image import metadata as image_metadata
from tensorboard.plugins.text import metadata as text_metadata
from tensorboard.summary.writer.event_file_writer import EventFileWriter


def new_run_dir(logdir: str, name: str) -> str:
  """logdir/name, or logdir/name-2, -3, ... : an existing run is never reused."""
  os.makedirs(logdir, exist_ok=True)
  path, n = os.path.join(logdir, name), 1
  while os.path.exists(path):
    n += 1
    path = os.path.join(logdir, f"{name}-{n}")
  os.makedirs(path)
  return path


def _string_tensor(values: Iterable[bytes], shape: tuple[int, ...]) -> tensor_pb2.TensorProto:
  dims = [tensor_shape_pb2.TensorShapeProto.Dim(size=d) for d in shape]
  return tensor_pb2.TensorProto(
      dtype=types_pb2.DT_STRING, string_val=list(values),
      tensor_shape=tensor_shape_pb2.TensorShapeProto(dim=dims))


def _hparam_domain(values: list[Any]) -> hp.Discrete:
  return hp.Discrete(sorted(set(values)))


def _writer_thread_errors_told_once(hook=threading.excepthook):
  """EventFileWriter writes in a thread of its own, which re-raises what
  failed it (a full disk) into the next write, flush or close here, where
  it is told on one line; the thread's own traceback is not printed."""

  def told_once(args: threading.ExceptHookArgs) -> None:
    if type(args.thread).__module__ != EventFileWriter.__module__:
      hook(args)

  told_once.writer_threads_quiet = True
  return told_once


class MetricsWriter:
  """Writes scalars, text, images and hparams sessions into one run folder."""

  def __init__(self, run_dir: str):
    os.makedirs(run_dir, exist_ok=True)
    self.run_dir = run_dir
    if not getattr(threading.excepthook, "writer_threads_quiet", False):
      threading.excepthook = _writer_thread_errors_told_once()
    self._writer = EventFileWriter(run_dir)

  def _add(self, value: summary_pb2.Summary.Value | summary_pb2.Summary,
           step: int) -> None:
    summary = value if isinstance(value, summary_pb2.Summary) else \
        summary_pb2.Summary(value=[value])
    with naming(self.run_dir):
      self._writer.add_event(event_pb2.Event(
          wall_time=time.time(), step=int(step), summary=summary))

  def scalar(self, tag: str, value: float, step: int) -> None:
    self._add(summary_pb2.Summary.Value(tag=tag, simple_value=float(value)), step)

  def scalars(self, values: Mapping[str, float], step: int) -> None:
    for tag, value in values.items():
      self.scalar(tag, value, step)

  def text(self, tag: str, markdown: str, step: int = 0) -> None:
    self._add(summary_pb2.Summary.Value(
        tag=tag, metadata=text_metadata.create_summary_metadata(display_name=tag, description=""),
        tensor=_string_tensor([markdown.encode()], ())), step)

  def image(self, tag: str, png: bytes, step: int = 0, description: str = "") -> None:
    """png: the picture's PNG file bytes (stored as they are)."""
    from PIL import Image
    w, h = Image.open(io.BytesIO(png)).size  # reads the header alone
    meta = image_metadata.create_summary_metadata(
        display_name=tag, description=description)
    self._add(summary_pb2.Summary.Value(
        tag=tag, metadata=meta,
        tensor=_string_tensor([str(w).encode(), str(h).encode(), png],
                              (3,))), step)

  def custom_scalars(self, charts: Mapping[str, str], category: str) -> None:
    """A custom-scalars layout: chart title -> a tag regex whose scalars it
    draws together (TensorBoard's layout proto, written without TF)."""
    layout = layout_pb2.Layout(category=[layout_pb2.Category(
        title=category, chart=[layout_pb2.Chart(
            title=title, multiline=layout_pb2.MultilineChartContent(tag=[tag]))
                                for title, tag in charts.items()])])
    self._add(summary_pb2.Summary.Value(
        tag=custom_metadata.CONFIG_SUMMARY_TAG,
        metadata=custom_metadata.create_summary_metadata(),
        tensor=_string_tensor([layout.SerializeToString()], ())), 0)

  def hparams_config(self, hparams: Mapping[str, list[Any]],
                     metrics: Mapping[str, str]) -> None:
    """The experiment: each hparam's observed values; metrics tag -> description."""
    summary = hp.hparams_config_pb(
        hparams=[hp.HParam(name, _hparam_domain(values))
                 for name, values in hparams.items()],
        metrics=[hp.Metric(tag, display_name=tag, description=desc)
                 for tag, desc in metrics.items()])
    self._add(summary, 0)

  def session(self, hparams: Mapping[str, Any], metrics: Mapping[str, float],
              trial_id: str) -> None:
    """One hparams session in this run folder: its hparams, then its metrics."""
    self._add(hp.hparams_pb(dict(hparams), trial_id=trial_id,
                            start_time_secs=time.time()), 0)
    self.scalars(metrics, step=0)

  def flush(self) -> None:
    with naming(self.run_dir):
      self._writer.flush()

  def close(self) -> None:
    with naming(self.run_dir):
      self._writer.close()

  def __enter__(self) -> "MetricsWriter":
    return self

  def __exit__(self, *exc) -> None:
    self.close()


# --------------------------------------------------------------------------
# The mesh sweep's report: hparams sessions, curves over batch, text, images.
# --------------------------------------------------------------------------

SWEEP_HPARAMS = ("model", "topology", "mesh", "X", "Y", "batch", "remat",
                 "shard", "optimizer", "P", "D")
# metric tag -> (record field, scale, description)
SWEEP_METRICS = {  # TensorBoard's HParams shows the first five by default
    "memory/peak_gib": ("peak_bytes", 1 / GiB, "estimated peak GiB per device"),
    "memory/fits": ("fits", 1, "1 if the peak fits in HBM"),
    "perf/tokens_per_s": ("tokens_per_s", 1,
                          "estimated tokens per second (what ranks plans)"),
    "perf/mfu": ("mfu", 1, "predicted MFU: the step-time model's (matmuls, "
                 "HBM-bound fusions, exposed collectives)"),
    "perf/step_time_s": ("step_time_s", 1, "estimated step time, seconds"),
    "perf/roofline_mfu": ("roofline_mfu", 1, "the roofline's MFU bound "
                          "(matmuls and exposed collectives only)"),
    # Every session has it (a never-compute-bound plan has no threshold, and
    # parallel coordinates drop a session missing a shown metric).
    "perf/compute_bound": ("compute_bound", 1, "1 if the step is "
                           "compute-bound at this batch"),
    "memory/max_batch": ("max_batch", 1, "the largest batch of this mesh, "
                         "remat, shard and optimizer within --hbm_fraction "
                         "of the capacity"),
    # The compiled peak is not a metric: only the confirmed plans have one,
    # and parallel coordinates drop a session missing a shown metric; it is
    # in the ranked table and results.jsonl.
}
# TensorBoard shows a numeric hparam as "16.000": counts are written as text.
_COUNT_HPARAMS = ("X", "Y", "batch", "P", "D")


def _hparam(r: Mapping[str, Any], name: str) -> Any:
  if name == "mesh":
    return record_mesh(r)
  value = r.get(name, 1) if name in ("P", "D") else r[name]  # stages, replicas
  return str(value) if name in _COUNT_HPARAMS else value


def session_name(r: Mapping[str, Any]) -> str:
  return (f"{record_mesh(r)}-b{r['batch']}-{r['remat']}-{r['shard']}-"
          f"{r['optimizer']}").replace(":", "_").replace(",", "+")


def series_name(r: Mapping[str, Any]) -> str:
  return (f"{record_mesh(r)}-{r['remat']}-{r['shard']}-{r['optimizer']}"
          ).replace(":", "_").replace(",", "+")


def session_metrics(r: Mapping[str, Any]) -> dict[str, float]:
  """The hparams metrics of one record; absent or None fields are left out."""
  out = {}
  for tag, (field, scale, _) in SWEEP_METRICS.items():
    value = r.get(field)
    if value is not None and r.get("status") == "ok":
      out[tag] = float(value) * scale
  return out


MAX_RUNS = 40  # what TensorBoard's legacy dashboards select by default
MAX_SESSIONS = MAX_RUNS - 2  # besides the report and the curves runs
CURVES = {"memory/peak_gib": ("peak_bytes", 1 / GiB),
          "perf/mfu": ("mfu", 1)}


def aligned(table: str) -> str:
  """A markdown table's rows with their columns padded to one width each
  (other lines as they are), for a monospace block."""
  rows = [l for l in table.splitlines() if l.startswith("|")]
  cells = [[c.strip() for c in r.strip("|").split("|")] for r in rows]
  widths = [max(len(c[i]) for c in cells if i < len(c))
            for i in range(max(map(len, cells)))] if cells else []
  out = []
  for line in table.splitlines():
    if not line.startswith("|"):
      out.append(line)
      continue
    row = [c.strip() for c in line.strip("|").split("|")]
    if all(set(c) <= {"-"} for c in row):
      row = ["-" * w for w in widths]
    out.append("  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip())
  return "\n".join(out)


def write_sweep(run_dir: str, ranked: list[Mapping[str, Any]], table: str,
                recommendation: str, hbm_bytes: int, cache=None,
                painters: sweep_plots.Painters | None = None) -> str:
  """Writes the sweep's TensorBoard report into a new RUN_DIR/tensorboard[-n]:
  at most MAX_RUNS runs, so every dashboard opens with its runs selected.
  cache: a simulator.cache.Cache keeping the pictures, or None; painters:
  the processes drawing them, or None (sweep_plots)."""
  pictures = sweep_plots.pictures(ranked, hbm_bytes, cache, painters)
  root = new_run_dir(run_dir, "tensorboard")
  ok = [r for r in ranked if r.get("status") == "ok"]  # failed: no session
  sessions = ok[:MAX_SESSIONS]
  hparams = {h: [_hparam(r, h) for r in sessions] for h in SWEEP_HPARAMS}
  with MetricsWriter(root) as w:
    if sessions:  # no plan evaluated: no experiment to describe
      w.hparams_config(hparams, {t: m[2] for t, m in SWEEP_METRICS.items()})
    note = "" if len(ok) == len(sessions) else (
        f"\n\nHParams holds the {len(sessions)} best of the {len(ok)} plans "
        f"evaluated; every plan is in the table above and in results.jsonl.")
    # Preformatted: TensorBoard draws a markdown table as wide as its panel
    # and breaks cells mid-word ("ran k"); a code block scrolls instead.
    w.text("sweep/ranked_table", f"```\n{aligned(table)}\n```{note}")
    w.text("sweep/recommendation", recommendation)
    w.image("memory/breakdown", pictures["memory/breakdown"],
            description="what is live at each plan's peak, per device, "
            "stacked to the planned peak")
    w.image("perf/mfu_heatmap", pictures["perf/mfu_heatmap"],
            description="best predicted MFU per (X, batch) of the plans "
            "that fit there")
    w.custom_scalars({f"{tag} over batch": f"^{tag}/" for tag in CURVES},
                     "sweep curves")
  for r in sessions:
    with MetricsWriter(os.path.join(root, "sessions", session_name(r))) as w:
      w.session({h: _hparam(r, h) for h in SWEEP_HPARAMS}, session_metrics(r),
                trial_id=session_name(r))
  with MetricsWriter(os.path.join(root, "curves")) as w:
    for r in sorted(ok, key=lambda r: r["batch"]):
      w.scalars({f"{tag}/{series_name(r)}": r[field] * scale
                 for tag, (field, scale) in CURVES.items()}, step=r["batch"])
  return root
