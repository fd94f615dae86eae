"""The validation corpus compiled, or re-checked from kept results.

  python -m experiments.validation_matrix [--corpus=tpu|gpu] [--only=N,M] [--jsonl=F]
      [--workers=K] [--ray_address=ray://HOST:PORT|auto|local]
      compile the cases of experiments.validation_corpus for their TPU
      topologies through libtpu (no TPU needed), or with --corpus=gpu those of
      experiments.gpu_corpus for GPU clusters through the CUDA plugin, K at a
      time (here, or as Ray tasks), appending each result to F as it finishes
  python -m experiments.validation_matrix --from_jsonl=experiments/data/compiled_corpus.jsonl
      [--workers=K] [--ray_address=...] [--jsonl=F]
      recompute the symbolic side of every kept row against its compiled
      figures (no compiling: two traces of each row's step, 1-3 s a row on
      the 2-core machine, K rows at a time) and rewrite the table, rows in
      case order (the file keeps them in the order they finished compiling);
      F, another file, gets the re-checked rows (each schedule's simulated
      peak among them), one JSON line each

A config that fails to compile is a result: an out-of-HBM compile keeps the
bytes XLA said it needed and its heap at its peak as it refused. The table
(--out, summary per corpus part: median and worst relative error of peak,
arguments and collective bytes, and the matmul FLOPs against the
compiler's cost analysis, symbolic vs compiled) is rewritten after every
config, so a cut-short run still leaves its rows.
"""

from __future__ import annotations

import collections
import dataclasses
import json
import os
import statistics
import sys
import time

from absl import flags

from experiments import cli
from experiments import gpu_corpus, validation_corpus
from experiments.gpu_corpus import GPU_PARTS
from experiments.validation_corpus import DEFAULT_SETTINGS, PARTS
from meshes.hardware import GiB
from models.registry import load_model
from simulator.memory import xla_rules
from simulator.xla import memory_scheduler
from simulator.xla.compiled import LIVE_SET

FLAGS = flags.FLAGS
flags.DEFINE_enum("corpus", "tpu", ["tpu", "gpu"], "which corpus to compile: "
                  "experiments.validation_corpus or experiments.gpu_corpus")
cli.define_corpus_flags()  # --out default: experiments/validation.md, or
# validation_gpu.md with --corpus=gpu
cli.define_worker_flags()
cli.define_memory_scheduler_flag()


def _pct(x) -> str:
  return "n/a" if x is None else f"{100 * x:+.2f}%"


def _errors_line(rows: list[dict], key: str, what: str) -> str | None:
  errs = [abs(r["relative_error"][key]) for r in rows
          if r["relative_error"].get(key) is not None]
  if not errs:
    return None
  return (f"- |relative error| of {key}{what}: median "
          f"{100 * statistics.median(errs):.2f}%, worst {100 * max(errs):.2f}%")


def _part(row: dict) -> str:
  return row["config"].get("part") or ("toy" if row["config"].get("toy")
                                       else "tune")


def _program_line(rows: list[dict], changed: list[dict]) -> str:
  """Whether each row was compiled from the program today's code traces
  (crosscheck.recheck's `program`)."""
  same = sum(1 for r in rows if r.get("program") == "same")
  unknown = sum(1 for r in rows if r.get("program") == "unknown")
  ids = ",".join(str(r["config"].get("index", "?")) for r in changed)
  return (f"- compiled from the program today's code traces (its fingerprint,"
          f" simulator.tracing.fingerprint): {same} rows; changed since: "
          f"{len(changed)}" + (f" (#{ids.replace(',', ', #')}: their "
                               f"compiled figures are an older program's, "
                               f"left out of every figure above; recompile "
                               f"them with --only={ids})" if changed else "")
          + f"; no fingerprint kept: {unknown}")


def summary(rows: list[dict]) -> list[str]:
  changed = [r for r in rows if r.get("program") == "changed"]
  checked = rows
  rows = [r for r in rows if r.get("program") != "changed"]
  ok = [r for r in rows if "relative_error" in r]
  lines = [f"{len(ok)} of {len(rows)} configs compiled."]
  for part in (*PARTS, *GPU_PARTS):
    of_part = [r for r in ok if _part(r) == part]
    keys = (("arguments", "peak_no_overhead") if part == "toy" else
            ("arguments", "peak", "peak_no_overhead", "temp"))
    what = (f" ({len(of_part)} {part} configs"
            f"{', outside the targets' if part == 'toy' else ''})")
    for key in keys:
      line = _errors_line(of_part, key, what)
      if line:
        lines.append(line)
    under = [r for r in of_part
             if (r["relative_error"].get("peak_no_overhead") or 0) < -0.05]
    if of_part and part != "toy":
      ids = ", ".join(f"#{r['config'].get('index', '?')} "
                      f"{_pct(r['relative_error']['peak_no_overhead'])}"
                      for r in under)
      lines.append(f"- peak_no_overhead under XLA's by more than 5% ({part}): "
                   f"{len(under)} of {len(of_part)}{': ' + ids if ids else ''}")
    line = _smaller_schedule_line(of_part, part) if part in PARTS else None
    if line:
      lines.append(line)
    line = _autotuned_line(of_part, part) if part in GPU_PARTS else None
    if line:
      lines.append(line)
  oom = [r for r in rows if "oom_relative_error" in r]
  if oom:
    says = sum(1 for r in oom if not r["symbolic_fits"])
    errs = ", ".join(f"{100 * r['oom_relative_error']:+.1f}%" for r in oom)
    lines.append(f"- {len(oom)} configs over HBM at compile time (XLA's "
                 f"CompileTimeHbmOom): the symbolic estimate says 'does not "
                 f"fit' for {says}; its peak (no planning overhead) vs XLA's "
                 f"heap as it refused, arguments included (the figure "
                 f"libtpu's message calls HLO temporaries): {errs}")
  rebuilt = [r for r in ok if r["compiled"].get("peak_live_bytes")]
  taken = [r for r in rebuilt if r["compiled"].get("peak_source") == LIVE_SET]
  live = [r for r in rebuilt if r["compiled"].get("peak_source") != LIVE_SET]
  if live:
    match = sum(1 for r in live if abs(r["compiled"]["peak_live_bytes"]
                                       / r["compiled"]["peak_bytes"] - 1) < 1e-3)
    lines.append(f"- XLA's peak rebuilt from its dumped buffer assignment and "
                 f"live ranges (simulator.xla.xla_peak) within 0.1% of "
                 f"memory_analysis in {match} of {len(live)} configs" + (
                     f"; in {len(taken)} more ("
                     + ", ".join(f"#{r['config']['index']}" for r in taken)
                     + "), with temporaries in host memory, the rebuilt "
                     "live set is the compiled peak: there memory_analysis "
                     "can count the host temporaries "
                     "(simulator.xla.compiled.memory_figures)" if taken
                     else ""))
  line = _scheduler_line(ok)
  if line:
    lines.append(line)
  lay = [r for r in ok if r["relative_error"].get("arguments_layout") is not None]
  exact = sum(1 for r in lay if r["relative_error"]["arguments_layout"] == 0)
  lines.append(f"- arguments with the compiled tiled layouts: exact in {exact} of "
               f"{len(lay)}")
  coll = [r["collectives"] for r in ok if r.get("collectives")]
  errs = [abs(c["relative_error"]) for c in coll
          if c["relative_error"] is not None]
  if errs:
    lines.append(
        f"- collective bytes per device per step, symbolic (simulator.timing.comms) vs "
        f"the compiled HLO: |relative error| median "
        f"{100 * statistics.median(errs):.2f}%, worst {100 * max(errs):.2f}% "
        f"over {len(errs)} configs; summed, {sum(c['symbolic_bytes'] for c in coll) / GiB:.2f}"
        f" vs {sum(c['hlo_bytes'] for c in coll) / GiB:.2f} GiB")
  line = _cost_line(ok, "flops", (
      "matmul FLOPs per device, symbolic (the traced program's dots, each "
      "loop body once, as XLA's HloCostAnalysis counts a while loop) vs the "
      "compiled step's cost_analysis() flops (which add the elementwise "
      "ops')"))
  if line:
    lines.append(line)
  line = _cost_line(ok, "hbm_bytes", (
      "HBM bytes per device, the step-time model's (simulator.timing."
      "roofline: matmuls' operands and results, other fusions' reads and "
      "writes; each loop body once) vs the compiled step's cost_analysis() "
      "bytes accessed (which add collectives, copies and host transfers)"),
      quantized=True, by_tokens=True)
  if line:
    lines.append(line)
  if any("program" in r for r in checked):
    lines.append(_program_line(checked, changed))
  return lines


def _tokens_per_device(config: dict) -> int:
  """Tokens a data shard runs per step: batch x seq over D x X."""
  from meshes.layout import parse_mesh_name
  x, _, d = parse_mesh_name(config["mesh"])
  return config["batch"] * config["seq"] // (x * d)


# Tokens a device runs per step: the bounds of the bins the HBM-bytes line
# gives its medians in (a reporting choice, powers of four).
_TOKEN_BINS = (4096, 16384, 65536)


def _by_tokens(rows: list[dict], err) -> str:
  """The median of `err` over the rows in each bin of tokens per device."""
  out = []
  for lo, hi in zip((0, *_TOKEN_BINS), (*_TOKEN_BINS, None)):
    errs = [err(r) for r in rows if _tokens_per_device(r["config"]) > lo
            and (hi is None or _tokens_per_device(r["config"]) <= hi)]
    if errs:
      label = f"up to {hi:,}" if hi else f"over {lo:,}"
      out.append(f"{label} median {_pct(statistics.median(errs))} "
                 f"({len(errs)})")
  return "; by tokens a device (batch x seq / data shards): " + ", ".join(out)


def _cost_line(rows: list[dict], key: str, what: str,
               quantized: bool = False, by_tokens: bool = False
               ) -> str | None:
  """The symbolic figure `key` (a crosscheck comparison) against XLA's cost
  analysis over the non-toy rows: median and range, the rows XLA counts
  otherwise apart; with `quantized` the 8-bit optimizer's too, where XLA's
  bytes accessed weight each fused operand by how often its fusion reads
  it."""
  rows = [r for r in rows if r.get(key) and _part(r) != "toy"]
  if not rows:
    return None
  host = [r for r in rows if _streamed_in_loops(r["config"])]
  slices = [r for r in rows if r not in host and _across_slices(r["config"])]
  codes = [r for r in rows if quantized and r not in host + slices
           and r["config"].get("optimizer") == "adamw_8bit"]
  err = lambda r: r[key]["relative_error"]
  rest = sorted((r for r in rows if r not in host + slices + codes),
                key=err)
  tag = lambda r: f"#{r['config'].get('index', '?')} {_pct(err(r))}"
  return (
      f"- {what}: "
      + (f"relative error median "
         f"{100 * statistics.median(map(err, rest)):+.2f}%, from "
         f"{tag(rest[0])} to {tag(rest[-1])} over {len(rest)} configs"
         if rest else "no config to compare")
      + (_by_tokens(rest, err) if rest and by_tokens else "")
      + (f"; not comparable where the layer loops stream from host memory "
         f"({', '.join(map(tag, host))}): XLA unrolls them, by two in the "
         f"optimized HLO of #34 and #69, and its cost analysis counts each "
         f"copy" if host else "")
      + (f"; nor where replicas span slices ({', '.join(map(tag, slices))})"
         f": the module holds two copies of some layer loops (#290: 8 "
         f"while loops, the one-slice #291 6), each counted" if slices
         else "")
      + (f"; nor with the 8-bit optimizer ({', '.join(map(tag, codes))}): "
         f"XLA's cost analysis counts a fused operand's bytes as often as "
         f"the fusion reads each element, and the quantization compares "
         f"each moment element with the 255 midpoints of its code map "
         f"(simulator.adam8bit): gpt2 v5p-8 4x1 b16 s512 (#81) 620.4 GB "
         f"where its AdamW twin (#0) counts 6.9 GB" if codes else ""))


def _across_slices(config: dict) -> bool:
  """Data-parallel replicas over a multi-slice topology (meshes.layout)."""
  from meshes.layout import parse_mesh_name
  from meshes.topology import parse_topology
  return (parse_mesh_name(config["mesh"])[2] > 1
          and parse_topology(config["topology"]).hosts > 1)


def _streamed_in_loops(config: dict) -> bool:
  """Offloaded residuals or parameters: the layer loops read host memory."""
  return "params" in config.get("offload", ()) or "offload:" in str(
      config.get("remat", ""))


COLUMNS = ("#", "model", "part", "topology", "mesh", "batch", "seq", "remat",
           "optimizer", "settings", "args sym", "args XLA", "args err",
           "temp sym", "temp XLA", "peak sym", "peak XLA", "peak err",
           "peak-ovh err", "coll sym GiB", "coll HLO GiB", "coll err",
           "flops err", "bytes err", "compile s")


def _settings(c: dict) -> str:
  text = lambda v: ",".join(v) if isinstance(v, (list, tuple)) else str(v)
  return " ".join(f"{k}={text(c[k])}" for k, d in DEFAULT_SETTINGS
                  if text(c.get(k, d)) != text(d)) or "-"


def _row(i: int, r: dict) -> list[str]:
  c = r["config"]
  stale = " (program changed)" if r.get("program") == "changed" else ""
  settings = _settings(c)
  workaround = (r.get("compiled") or {}).get("workaround")
  if workaround:  # compiled.CUBLAS_GEMMS
    settings = (("" if settings == "-" else settings + " ")
                + f"(compiled with {workaround})")
  pre = [str(c.get("index", i)), c["model"].split("/")[-1], _part(r) + stale,
         c["topology"], c["mesh"], str(c["batch"]), str(c["seq"]),
         c["remat"], c["optimizer"], settings]
  g = lambda b: f"{b / GiB:.3f}"
  if "oom_relative_error" in r:
    verdict = "does not fit" if not r["symbolic_fits"] else "FITS (wrong)"
    needed = r["oom"].get("peak_bytes") or r["oom"]["temp_bytes"]
    return pre + [f"XLA: over HBM, its heap {g(needed)} GiB as it refused; "
                  f"symbolic peak-ovh {g(r['symbolic']['peak_no_overhead'])} "
                  f"({_pct(r['oom_relative_error'])}), says {verdict}"] + [
                      ""] * (len(COLUMNS) - len(pre) - 1)
  if "relative_error" not in r:
    return pre + [f"FAILED: {r['error'][:120]}"] + [""] * (
        len(COLUMNS) - len(pre) - 1)
  s, x, e = r["symbolic"], r["compiled"], r["relative_error"]
  return pre + [
      g(s["arguments"]), g(x["argument_bytes"]), _pct(e["arguments"]),
      g(s["temp"]), g(x["temp_bytes"]), g(s["peak"]), g(x["peak_bytes"]),
      _pct(e["peak"]), _pct(e["peak_no_overhead"]),
      g(r["collectives"]["symbolic_bytes"]), g(r["collectives"]["hlo_bytes"]),
      _pct(r["collectives"]["relative_error"]),
      _pct(r["flops"]["relative_error"]) if r.get("flops") else "-",
      _pct(r["hbm_bytes"]["relative_error"]) if r.get("hbm_bytes") else "-",
      f"{x['compile_seconds']:.0f}"]


_GPU_COMPARED = (
    " A deviceless compile does not autotune, so the symbolic figures held "
    "against it are the deviceless program's (`MemoryEstimate.deviceless`): "
    "without the cuBLAS-logits schedule (simulator.memory.xla_gpu_rules), "
    "which XLA's autotuner may pick on a real GPU and which the estimate's "
    "own peak and `fits` include; the summary gives that peak beside "
    "(`autotuned`), and tests/test_xla_gpu_rules.py holds it against the "
    "steps run on an H100 (experiments/data/executed_gpu.jsonl).")


def _smaller_schedule_line(rows: list[dict], part: str) -> str | None:
  """What keeping the smaller simulated weight-gradient schedule would give
  instead of the larger: why the larger is kept (xla_rules, deferred weight
  gradients; XLA keeps the smallest of its own schedules)."""
  errs = [r["relative_error"].get("peak_smaller_schedule") for r in rows]
  errs = [e for e in errs if e is not None]
  if part == "toy" or not errs:
    return None
  under = sorted(e for e in errs if e < -0.05)
  return (f"- peak_no_overhead with the smaller simulated schedule kept "
          f"instead of the larger ({part}): |relative error| median "
          f"{100 * statistics.median(map(abs, errs)):.2f}%, worst "
          f"{100 * max(map(abs, errs)):.2f}%; under XLA's by more than 5%: "
          f"{len(under)} of {len(errs)}"
          + (f", down to {_pct(under[0])}" if under else ""))


def _scheduler_line(rows: list[dict]) -> str | None:
  """Which schedule XLA's memory scheduler kept, by its own estimates
  (libtpu's, or XLA:GPU's: simulator.xla.memory_scheduler), in the rows
  that logged them, and how far its estimate of the kept schedule is from
  the compiled peak: the choice rests on those estimates, not on the
  peaks."""
  logged = [r for r in rows if (r["compiled"].get("memory_scheduler") or {})
            .get("chose")]
  if not logged:
    return None
  kept = collections.Counter(r["compiled"]["memory_scheduler"]["chose"]
                             for r in logged)
  off = sorted((r["compiled"]["memory_scheduler"][
      r["compiled"]["memory_scheduler"]["chose"]]
                / r["compiled"]["peak_bytes"] - 1, r["config"].get("index"))
               for r in logged)
  return (f"- XLA's memory scheduler (its own estimates, logged in "
          f"{len(logged)} compiles): kept "
          + ", ".join(f"the {memory_scheduler.label(k)} schedule in {n}"
                      for k, n in kept.most_common())
          + f"; its estimate of the schedule it kept against the compiled "
          f"peak: median {_pct(statistics.median(e for e, _ in off))}, from "
          f"#{off[0][1]} {_pct(off[0][0])} to #{off[-1][1]} "
          f"{_pct(off[-1][0])}")


def _autotuned_line(rows: list[dict], part: str) -> str | None:
  """The estimate's own peak (every schedule) over the deviceless peaks."""
  errs = sorted((r["symbolic"]["peak_no_overhead_autotuned"]
                 / r["compiled"]["peak_bytes"] - 1, r["config"].get("index"))
                for r in rows
                if "peak_no_overhead_autotuned" in r.get("symbolic", {}))
  if not errs:
    return None
  worst = errs[-1]
  return (f"- autotuned: peak_no_overhead with the cuBLAS-logits schedule "
          f"(what `fits` holds) over these deviceless peaks ({part}): median "
          f"{_pct(statistics.median(e for e, _ in errs))}, largest "
          f"#{worst[1]} {_pct(worst[0])}")


def write(rows: list[dict], path: str, started: float) -> None:
  gpu = bool(rows) and all(_part(r) in GPU_PARTS for r in rows)
  target, how = (("NVIDIA GPUs via the CUDA plugin, no GPU", "XLA:GPU's "
                  "arguments plus its temp arena, outputs aliased")
                 if gpu else ("TPU via libtpu", "the TPU compiler's heap "
                              "simulation"))
  gpu_parts = (", `gpu` (experiments.gpu_corpus: the GPU rules of "
               "simulator.memory.xla_gpu_rules were read off these), "
               "`gpu-check` (GPU cases nobody tuned on)")
  head = [f"# Validation: symbolic memory vs the XLA compiler ({target})",
          "",
          "Written by `python -m experiments.validation_matrix"
          f"{' --corpus=gpu' if gpu else ''}`; per-device "
          "bytes in GiB (2**30). Relative error = (symbolic - compiled) / "
          "compiled. Compiled peak = `memory_analysis().peak_memory_in_bytes` "
          f"({how}); symbolic `peak` includes the "
          "10% planning overhead, `peak-ovh` is the figure held against "
          "XLA's. Parts: `tune` (the rules were read off these), `check` "
          "(nobody tuned on them), `toy` (sub-4-MiB steps, outside the "
          f"targets){gpu_parts if gpu else ''}. "
          "Settings other than zero3, mixed, flash, one loss "
          "chunk are listed." + (_GPU_COMPARED if gpu else ""), "",
          "## Summary", ""]
  head += summary(rows)
  compile_s = sum(r["compiled"]["compile_seconds"] for r in rows
                  if "compiled" in r)
  run = (f"Run time {time.time() - started:.0f} s; " if started else "")
  head += ["", f"{run}compile time {compile_s:.0f} s summed over the configs.",
           "", "## Results", "", "| " + " | ".join(COLUMNS) + " |",
           "|" + "---|" * len(COLUMNS)]
  head += ["| " + " | ".join(_row(i, r)) + " |" for i, r in enumerate(rows)]
  if not gpu:
    head += ["", "## Rules", "", "What XLA holds differently from the traced "
             "program, each with the dump it was read off "
             "(simulator.memory.xla_rules):", ""]
    head += [f"- **{name}**: {text}" for name, text in xla_rules.rules()]
  cli.write_whole(path, "\n".join(head) + "\n")


def _cases() -> list:
  return (gpu_corpus if FLAGS.corpus == "gpu" else validation_corpus).CASES


def _out() -> str:
  return FLAGS.out or ("experiments/validation_gpu.md" if FLAGS.corpus == "gpu"
                       else "experiments/validation.md")


def _chosen(only: str | None) -> list[int]:
  CASES = _cases()  # pylint: disable=invalid-name
  if only is None:
    return list(range(len(CASES)))
  out = []
  for part in only.split(","):
    if not part.strip().isdigit() or int(part) >= len(CASES):
      cli.fail(f"--only={only!r}: {part!r} is not a config index; valid: 0 to "
               f"{len(CASES) - 1} (the --corpus's CASES)")
    if int(part) in out:
      cli.fail(f"--only={only!r}: {int(part)} is given twice; give it once")
    out.append(int(part))
  return out


def _read_rows(path: str) -> list[dict]:
  return cli.read_kept_rows(path, keys=("config",))


def _say(message: str) -> None:
  print(message, file=sys.stderr, flush=True)


def main(argv):
  del argv
  from simulator.workers import Pool
  from simulator.xla import crosscheck
  started = time.time()
  if FLAGS.from_jsonl:
    if FLAGS.jsonl and os.path.realpath(FLAGS.jsonl) == os.path.realpath(
        FLAGS.from_jsonl):
      cli.fail(f"--jsonl={FLAGS.jsonl!r} is the --from_jsonl file; give "
               "another file for the re-checked rows (the kept one stays)")
    kept = _read_rows(FLAGS.from_jsonl)
    gpu_rows = all(_part(r) in GPU_PARTS for r in kept)
    if not FLAGS.out and gpu_rows != (FLAGS.corpus == "gpu"):
      cli.fail(f"--from_jsonl={FLAGS.from_jsonl!r} holds the "
               f"{'GPU' if gpu_rows else 'TPU'} corpus's rows; add "
               f"--corpus={'gpu' if gpu_rows else 'tpu'} (the table "
               "experiments/validation"
               f"{'_gpu' if gpu_rows else ''}.md) or give --out=FILE")
    cli.check_folder("out", _out())
    cli.check_folder("jsonl", FLAGS.jsonl)
    if FLAGS.only is not None:  # those rows of the kept corpus
      chosen = set(_chosen(FLAGS.only))
      kept = [r for r in kept if r["config"].get("index") in chosen]
      if not kept:
        cli.fail(f"--only={FLAGS.only!r}: no row of {FLAGS.from_jsonl} has "
                 "those indices")
    pool = Pool(FLAGS.workers, FLAGS.ray_address)
    _say(f"re-checking {len(kept)} kept rows {pool.where} (each traced "
         "twice, 1-3 s a row on 2 cores)")
    try:  # each row traced twice (~2 s on 2 cores): in parallel
      rows = sorted((future.result() for _, future in pool.as_completed(
          crosscheck.recheck, ((r,) for r in kept))),
                    key=lambda r: r["config"].get("index", 0))
      if FLAGS.jsonl:  # the re-checked rows, symbolic side as today's code
        cli.write_whole(FLAGS.jsonl, "".join(json.dumps(r, default=str) + "\n"
                                             for r in rows))
      write(rows, _out(), started)
    except (KeyError, IndexError, TypeError) as e:  # a row of another shape
      cli.fail(f"--from_jsonl={FLAGS.from_jsonl!r}: a row is not a kept "
               f"corpus row ({type(e).__name__}: {e}); give the --jsonl file "
               "of an earlier run")
    finally:
      pool.close()
    _say(f"re-checked {len(rows)} kept rows {pool.where} in "
         f"{time.time() - started:.1f} s")
    return
  cli.check_folder("out", _out())
  cli.check_folder("jsonl", FLAGS.jsonl)
  if FLAGS.memory_scheduler != "default" and (FLAGS.corpus != "tpu"
                                              or not FLAGS.out):
    cli.fail(f"--memory_scheduler={FLAGS.memory_scheduler} compiles the TPU "
             "corpus with libtpu's other scheduler: give --out=FILE (the "
             "corpus's own table holds the default's)")
  chosen = _chosen(FLAGS.only)
  if FLAGS.corpus == "gpu":  # XLA:GPU's scheduler estimates in each row,
    # from the worker processes (this one has loaded jax already)
    memory_scheduler.request_gpu_log()
  pool = Pool(FLAGS.workers, FLAGS.ray_address)
  _say(f"compiling {len(chosen)} configs {pool.where}")
  rows: list = []
  here = pool.workers == 1 and not FLAGS.ray_address
  try:
    for (_, i, *_), future in pool.as_completed(
        compile_index, ((FLAGS.corpus, i, here, FLAGS.memory_scheduler)
                        for i in chosen)):
      r = future.result()
      _say(f"[{len(rows) + 1}/{len(chosen)} #{i} {_cases()[i].label()}] "
           f"{r.get('error') or 'compiled'} "
           f"({time.time() - started:.0f} s elapsed)")
      rows.append(r)
      if FLAGS.jsonl:
        with open(FLAGS.jsonl, "a") as f:
          f.write(json.dumps(r, default=str) + "\n")
      write(sorted(rows, key=lambda r: r["config"]["index"]), _out(),
            started)
  finally:
    pool.close()


def compile_index(corpus: str, i: int, progress: bool = False,
                  scheduler: str = "default") -> dict:
  """Case i of `corpus` ("tpu" or "gpu") compiled for its topology (with
  libtpu's memory scheduler `scheduler`), as a kept row (a worker runs
  this)."""
  from meshes.layout import parse_mesh_name
  from simulator.xla import crosscheck
  case = (gpu_corpus if corpus == "gpu" else validation_corpus).CASES[i]
  x, y, d = parse_mesh_name(case.mesh)
  label = f"[#{i} {case.label()}]"
  r = crosscheck.compile_case(
      load_model(case.model), case.settings(), case.topology, x, y,
      progress=(lambda m: _say(f"{label} {m}")) if progress else None, d=d,
      scheduler=scheduler)
  r["config"] = {**dataclasses.asdict(case), "index": i,
                 **({"memory_scheduler": scheduler}
                    if scheduler != "default" else {})}
  if "oom" in r:  # the symbolic side of a plan XLA refused
    r = crosscheck.recheck(r)
  return r


if __name__ == "__main__":
  cli.run(main)
