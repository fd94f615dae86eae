"""The single-GPU cases of the GPU corpus run on a real GPU, and the kept runs
re-checked.

  python -m experiments.execute_gpu [--only=N,M] [--steps=8] --jsonl=F
      on a machine with an NVIDIA GPU: compile each single-GPU case of
      experiments.gpu_corpus (mesh 1x1) of the local GPU's chip (h100:1 on
      an H100, h200:1 on an H200) for that GPU, run --steps steps
      on random data, and append the compiler's figures with the measured ones
      (the allocator's peak_bytes_in_use, each step's time) to F. Each case
      runs in a fresh process: the allocator's peak counts from the process's
      start. Nothing symbolic is traced there, so any JAX build with a CUDA
      plugin runs it; XLA_FLAGS as set is recorded with each row.
  python -m experiments.execute_gpu --from_jsonl=experiments/data/executed_gpu.jsonl
      the kept runs beside today's symbolic peak and step time and the same
      case's deviceless compile from the corpus (GPU_CORPUS_JSONL): the table
      in experiments/executed_gpu.md (--out).

Bytes per device; human output in GiB (2**30).
"""

from __future__ import annotations

import concurrent.futures as cf
import dataclasses
import functools
import json
import multiprocessing
import os
import statistics
import subprocess
import sys

from absl import flags

from experiments import cli
from experiments import gpu_corpus
from meshes.hardware import GiB

FLAGS = flags.FLAGS
cli.define_corpus_flags()  # --only: gpu_corpus indices (default: every
# single-GPU case); --out default: experiments/executed_gpu.md
flags.DEFINE_integer("steps", 8, "steps to run per case; the step time is the "
                     "median after the first", lower_bound=2)

DEFAULT_OUT = os.path.join(os.path.dirname(__file__), "executed_gpu.md")
DATA = os.path.join(os.path.dirname(__file__), "data")
OOM = "RESOURCE_EXHAUSTED"


def run_index(i: int, steps: int) -> dict:
  """Case i compiled for and run on the local GPU, as a kept row (a fresh
  process runs this)."""
  import jax  # pylint: disable=g-import-not-at-top
  from models.registry import load_model  # pylint: disable=g-import-not-at-top
  from simulator.xla import compiled  # pylint: disable=g-import-not-at-top
  case = gpu_corpus.CASES[i]
  row = {"config": {**dataclasses.asdict(case), "index": i, "target": "gpu",
                    "xla_flags": os.environ.get("XLA_FLAGS", ""),
                    "jax": jax.__version__}}
  try:
    rep = compiled.compile_report(load_model(case.model), case.settings(),
                                  "gpu", 1, 1, progress=None,
                                  execute_steps=steps)
  except Exception as e:  # noqa: BLE001 - an out-of-memory run is an answer
    text = str(e).strip().splitlines()[0] if str(e).strip() else repr(e)
    if OOM not in text:
      raise
    row["error"] = text
    return row
  row["compiled"] = compiled.compiled_side(rep)
  return row


def lent_device_names() -> dict[str, str]:
  """Each lent chip's device name as its probe recorded it
  (experiments/data/CHIP_device.json): the GPU its one-GPU cases are for.
  A variant of the chip (an H100 PCIe, an H200 NVL) has other SMs, clocks
  or memory, and its runs would be read as the lent chip's."""
  out = {}
  for chip in gpu_corpus.LENT_CHIPS:
    with open(os.path.join(DATA, f"{chip}_device.json")) as f:
      out[json.load(f)["device_kind"]] = chip
  return out


def local_chip() -> str:
  """The chip of experiments.gpu_corpus (LENT_CHIPS) the local GPU is, read
  off nvidia-smi: the parent process must not start CUDA (its pool would
  take the memory the cases' processes need)."""
  try:
    name = subprocess.run(["nvidia-smi", "--query-gpu=name",
                           "--format=csv,noheader"], capture_output=True,
                          text=True, check=True).stdout.splitlines()[0]
  except (OSError, subprocess.CalledProcessError, IndexError):
    cli.fail("no NVIDIA GPU here (nvidia-smi lists none): execute_gpu runs "
             "the cases on a local GPU")
  names = lent_device_names()
  if name.strip() not in names:
    cli.fail(f"the local GPU is {name.strip()!r}; the corpus has one-GPU "
             f"cases for {', '.join(map(repr, names))} only")
  return names[name.strip()]


def _chosen(only: str | None) -> list[int]:
  """The cases to run: --only's (each a one-GPU case of the local GPU's
  chip), or every one-GPU case of that chip."""
  valid = gpu_corpus.single_gpu_cases()
  out = []
  for part in only.split(",") if only else ():
    if not part.strip().isdigit() or int(part) not in valid:
      cli.fail(f"--only={only!r}: {part!r} is not a single-GPU case; valid: "
               f"{', '.join(map(str, valid))}")
    out.append(int(part))
  chip = local_chip()
  mine = gpu_corpus.single_gpu_cases(chip)
  for i in out:
    if i not in mine:
      cli.fail(f"--only={only!r}: case {i} is for "
               f"{gpu_corpus.CASES[i].topology}, the local GPU is an {chip}; "
               f"its cases: {', '.join(map(str, mine))}")
  return out or mine


@functools.cache
def _deviceless() -> dict[int, dict]:
  """Each case's deviceless compile (pinned jax) from the corpus, by index."""
  if not os.path.exists(gpu_corpus.GPU_CORPUS_JSONL):
    return {}
  with open(gpu_corpus.GPU_CORPUS_JSONL) as f:
    rows = [json.loads(line) for line in f if line.strip()]
  return {r["config"]["index"]: r["compiled"] for r in rows if "compiled" in r}


def autotuned(config: dict) -> bool:
  """Whether the run let XLA:GPU's autotuner pick its kernels (the default;
  --xla_gpu_autotune_level=0 turns it off)."""
  return "autotune_level=0" not in (config.get("xla_flags") or "")


def recheck(row: dict) -> dict:
  """A kept run with today's symbolic peak, step time and the deviceless
  compile of its case beside it."""
  from meshes.layout import abstract_mesh, plan_mesh  # pylint: disable=g-import-not-at-top
  from meshes.topology import parse_topology  # pylint: disable=g-import-not-at-top
  from models.registry import load_model  # pylint: disable=g-import-not-at-top
  from simulator.memory.from_trace import estimate_memory  # pylint: disable=g-import-not-at-top
  from simulator.timing import roofline  # pylint: disable=g-import-not-at-top
  from simulator.tracing.trace import trace_probe  # pylint: disable=g-import-not-at-top
  from simulator.xla import compiled  # pylint: disable=g-import-not-at-top
  config = row["config"]
  case = gpu_corpus.CASES[config["index"]]
  cfg, settings = load_model(case.model), case.settings()
  plan = plan_mesh(parse_topology(case.topology), 1, 1)
  traced = trace_probe(cfg, settings, abstract_mesh(plan))  # once, for both
  estimate = estimate_memory(traced, plan).at_batch(settings.batch)
  # An autotuned run is held against the estimate with the autotuner's
  # schedules; one with autotuning off against the deviceless program's.
  sym = compiled.symbolic_side(estimate, "gpu" if autotuned(config)
                               else case.topology)
  step = roofline.step_estimate(
      roofline.fit_mesh(cfg, settings, plan, traced=traced),
      settings.batch * settings.seq, roofline.Hardware.for_plan(plan))
  out = {**row, "symbolic": sym, "fits": bool(estimate.fits),
         "predicted_step_seconds": step.step_time, "predicted_mfu": step.mfu,
         "deviceless": _deviceless().get(config["index"])}
  if "compiled" in row:
    out["relative_error"] = compiled.errors(sym, row["compiled"])
  return out


def _gib(x) -> str:
  return "" if x is None else f"{x / GiB:.3f}"


def _pct(x) -> str:
  return "" if x is None else f"{100 * x:+.2f}%"


COLUMNS = ("#", "case", "XLA_FLAGS", "symbolic peak-ovh", "XLA deviceless",
           "XLA on the GPU", "allocator peak", "error vs the GPU's XLA",
           "step measured (ms)", "step predicted (ms)", "MFU measured",
           "MFU predicted")


def table_row(r: dict) -> list[str]:
  config = r["config"]
  case = gpu_corpus.CASES[config["index"]]
  dl = r.get("deviceless") or {}
  head = [str(config["index"]), case.label(), config.get("xla_flags") or "-",
          _gib(r["symbolic"]["peak_no_overhead"]), _gib(dl.get("peak_bytes"))]
  if "compiled" not in r:
    fits = "does not fit" if not r["fits"] else "fits (wrong)"
    return head + [f"OOM on the GPU ({r['error'][:60]})", "", f"symbolic: {fits}",
                   "", f"{1e3 * r['predicted_step_seconds']:.0f}", "",
                   f"{100 * r['predicted_mfu']:.1f}%"]
  c, m = r["compiled"], r["compiled"]["measured"]
  measured_mfu = r["predicted_mfu"] * r["predicted_step_seconds"] / m[
      "step_seconds"]
  return head + [_gib(c["peak_bytes"]), _gib(m["peak_bytes_in_use"]),
                 _pct(r["relative_error"]["peak_no_overhead"]),
                 f"{1e3 * m['step_seconds']:.0f}",
                 f"{1e3 * r['predicted_step_seconds']:.0f}",
                 f"{100 * measured_mfu:.1f}%", f"{100 * r['predicted_mfu']:.1f}%"]


def summary(rows: list[dict]) -> list[str]:
  """The summary lines, each lent chip's runs apart."""
  lines = []
  for chip in gpu_corpus.LENT_CHIPS:
    cases = set(gpu_corpus.single_gpu_cases(chip))
    mine = [r for r in rows if r["config"]["index"] in cases]
    if mine:
      lines += _chip_summary(mine)
  return lines


def _chip_summary(rows: list[dict]) -> list[str]:
  ran = [r for r in rows if "compiled" in r]
  tuned = [r for r in ran if autotuned(r["config"])]
  errs = [r["relative_error"]["peak_no_overhead"] for r in tuned]
  lines = [f"{len(ran)} of {len(rows)} runs completed on "
           f"{ran[0]['compiled']['measured']['device_kind'] if ran else '?'}"
           f" (jax {rows[0]['config'].get('jax')})."]
  if errs:
    lines.append(f"- symbolic peak vs the GPU's XLA peak, autotuned, "
                 f"{len(errs)} runs: |error| median "
                 f"{100 * statistics.median(map(abs, errs)):.2f}%, from "
                 f"{100 * min(errs):+.2f}% to {100 * max(errs):+.2f}%")
  gaps = [(r["compiled"]["measured"]["peak_bytes_in_use"]
           - r["compiled"]["peak_bytes"]) for r in ran]
  if gaps:
    lines.append(f"- allocator peak minus XLA's compiled peak: median "
                 f"{statistics.median(gaps) / 2**20:.1f} MiB, largest "
                 f"{max(gaps) / GiB:.3f} GiB")
  same = [(r["compiled"]["peak_bytes"], r["deviceless"]["peak_bytes"])
          for r in ran if r.get("deviceless")]
  if same:
    ratios = [a / b - 1 for a, b in same]
    lines.append(f"- XLA on the GPU vs the deviceless compile of the same case: "
                 f"from {100 * min(ratios):+.2f}% to {100 * max(ratios):+.2f}%")
  steps = [r["predicted_step_seconds"] / r["compiled"]["measured"]["step_seconds"]
           for r in tuned]
  if steps:
    lines.append(f"- step time predicted / measured: from {min(steps):.2f} to "
                 f"{max(steps):.2f} (median {statistics.median(steps):.2f})")
  oom = [r for r in rows if "error" in r]
  if oom:
    lines.append(f"- {len(oom)} runs out of memory on the GPU; the symbolic "
                 f"estimate says 'does not fit' for "
                 f"{sum(1 for r in oom if not r['fits'])}")
  return lines


def _rates() -> str:
  """Each lent chip's measured matmul and copy rates, as the doc states them."""
  from meshes.topology import parse_topology  # pylint: disable=g-import-not-at-top
  out = []
  for name in gpu_corpus.LENT_CHIPS:
    chip = parse_topology(f"{name}:1").chip
    out.append(f"{name.upper()} {chip.measured_bf16_flops / 1e12:.1f} TFLOP/s "
               f"on an 8192^3 bf16 matmul, {chip.measured_hbm_bandwidth / 1e12:.2f}"
               " TB/s on a copy")
  return "; ".join(out)


def write(rows: list[dict], path: str) -> None:
  text = ["# Executed on a GPU: symbolic, compiled and measured", "",
          "Written by `python -m experiments.execute_gpu --from_jsonl="
          "experiments/data/executed_gpu.jsonl`; the runs by `python -m "
          "experiments.execute_gpu --jsonl=...` on the GPU. Per device, GiB "
          "(2**30). `XLA deviceless`: the same case compiled without a GPU "
          "(experiments.gpu_corpus, pinned jax); `XLA on the GPU`: "
          "`memory_analysis()` of the step compiled for the local GPU; "
          "`allocator peak`: `device.memory_stats()['peak_bytes_in_use']` "
          "after the steps (the whole process's). Error = (symbolic - XLA on "
          "the GPU) / XLA on the GPU. Step: median wall time after the first; "
          "predicted: simulator.timing.roofline at the rates the device "
          f"reached (meshes.hardware, experiments.probe_gpu: {_rates()}), "
          "each matmul at the "
          "longer of its FLOPs and its operands' and result's bytes, plus the "
          "fusions' bytes. MFU (both columns): the model FLOPs over the step "
          "time at the datasheet's 989.5 TFLOP/s.", "", "## Summary", "",
          *summary(rows), "",
          "## Runs", "", "| " + " | ".join(COLUMNS) + " |",
          "|" + "---|" * len(COLUMNS)]
  text += ["| " + " | ".join(table_row(r)) + " |" for r in rows]
  cli.write_whole(path, "\n".join(text) + "\n")


def _read(path: str) -> list[dict]:
  rows = cli.read_kept_rows(path)
  if not all(isinstance(r, dict) and "index" in r.get("config", {})
                         for r in rows):
    cli.fail(f"--from_jsonl={path!r}: not a --jsonl file of execute_gpu "
             "(each line a JSON object with a 'config' and its 'index')")
  return rows


def main(argv):
  del argv
  cli.check_folder("out", FLAGS.out or DEFAULT_OUT)
  cli.check_folder("jsonl", FLAGS.jsonl)
  if FLAGS.from_jsonl:
    rows = [recheck(r) for r in _read(FLAGS.from_jsonl)]
    write(rows, FLAGS.out or DEFAULT_OUT)
    print("\n".join(summary(rows)))
    return
  if not FLAGS.jsonl:
    cli.fail("give --jsonl=FILE to keep the runs, or --from_jsonl=FILE to "
             "re-check kept ones")
  cli.use_local_gpus()
  context = multiprocessing.get_context("spawn")
  for i in _chosen(FLAGS.only):
    # A fresh process per case: peak_bytes_in_use counts from its start.
    with cf.ProcessPoolExecutor(1, context) as pool:
      row = pool.submit(run_index, i, FLAGS.steps).result()
    with open(FLAGS.jsonl, "a") as f:
      f.write(json.dumps(row, default=str) + "\n")
    m = (row.get("compiled") or {}).get("measured") or {}
    print(f"#{i} {gpu_corpus.CASES[i].label()}: "
          + (row.get("error") or f"peak_bytes_in_use "
             f"{_gib(m.get('peak_bytes_in_use'))} GiB, step "
             f"{1e3 * m['step_seconds']:.1f} ms"), file=sys.stderr, flush=True)


if __name__ == "__main__":
  cli.run(main)
