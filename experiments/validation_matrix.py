"""The validation matrix: symbolic memory vs the compiler over many configs.

  python -m experiments.validation_matrix [--only=N,M] [--out=experiments/validation.md]
      [--jsonl=F]   also keep every result as a JSON line
  python -m experiments.validation_matrix --from_jsonl=F
                    rewrite the table from kept results, compiling nothing

Every config is compiled for its v5p topology through libtpu (no TPU needed). A
config that fails (including out-of-memory at compile time) is recorded as failed
and the run goes on. Progress goes to stderr; the table (with its summary: median
and worst relative error of peak, of arguments and of collective bytes,
symbolic vs HLO) is rewritten after every config, so a cut-short run still
leaves its rows.
"""

from __future__ import annotations

import json
import statistics
import sys
import time
import traceback

from absl import flags

from experiments import cli
from meshes.hardware import GiB
from models.registry import load_model
from simulator.settings import TrainSettings

FLAGS = flags.FLAGS
flags.DEFINE_string("out", "experiments/validation.md", "results table (markdown)")
flags.DEFINE_string("jsonl", None, "also append each result as a JSON line here")
flags.DEFINE_string("only", None, "comma-separated config indices to run")
flags.DEFINE_string("from_jsonl", None, "write the table from these results "
                    "(a --jsonl of an earlier run) instead of compiling")
# (model, topology, mesh, batch, seq, remat, optimizer); fast ones first. The
# targets (arguments exact; peak within 5% median, 10% worst) are over these.
MATRIX = [
    ("gpt2", "v5p-8", "4x1", 16, 512, "full", "adamw"),
    ("gpt2", "v5p-8", "2x2", 16, 512, "none", "adamw"),
    ("gpt2", "v5p-8", "1x4", 8, 512, "dots", "adafactor"),
    ("gpt2", "v5p-16", "8x1", 32, 512, "full", "adafactor"),
    ("gpt2", "v5p-16", "4x2", 16, 512, "dots", "adamw"),
    ("gpt2", "v5p-16", "2x4", 8, 512, "none", "adafactor"),
    ("gpt2", "v5p-32", "16x1", 32, 512, "names:attn_out,mlp_in", "adamw"),
    ("gpt2", "v5p-32", "4x4", 16, 512, "full", "adafactor"),
    ("gpt2", "v5p-64", "32x1", 32, 512, "full", "adamw"),
    ("gpt2", "v5p-64", "8x4", 32, 512, "dots", "adamw"),
    ("llama2_7b", "v5p-8", "4x1", 8, 2048, "full", "adamw"),
    ("llama2_7b", "v5p-16", "8x1", 8, 2048, "full", "adafactor"),
    ("llama2_7b", "v5p-16", "4x2", 16, 2048, "dots", "adamw"),
    ("llama2_7b", "v5p-32", "4x4", 16, 2048, "names:qkv,mlp_hidden", "adamw"),
    ("llama2_7b", "v5p-64", "16x2", 32, 2048, "full", "adamw"),
    ("llama2_7b", "v5p-128", "16x4", 32, 2048, "full", "adamw"),
    ("llama2_7b", "v5p-128", "64x1", 64, 2048, "full", "adafactor"),
    ("llama2_7b", "v5p-128", "8x8", 16, 2048, "none", "adamw"),
    ("llama2_7b", "v5p-512", "64x4", 64, 2048, "full", "adamw"),
    ("llama2_7b", "v5p-512", "32x8", 32, 2048, "dots", "adafactor"),
    ("llama3_8b", "v5p-32", "16x1", 16, 2048, "full", "adamw"),
    ("llama3_8b", "v5p-64", "8x4", 32, 2048, "dots", "adafactor"),
    ("llama3_8b", "v5p-128", "32x2", 64, 2048, "names:qkv,mlp_hidden", "adamw"),
    ("llama2_13b", "v5p-128", "16x4", 32, 2048, "full", "adamw"),
    ("llama2_13b", "v5p-256", "32x4", 64, 2048, "dots", "adafactor"),
]
# Toy-sized steps (compiled peaks of 0.7-3.6 MiB), reported apart: there XLA's
# peak_memory_in_bytes is not the HBM buffers its own dumps hold (see README).
TOY = [
    ("tiny", "v5p-8", "4x1", 8, 128, "full", "adamw"),
    ("tiny", "v5p-16", "4x2", 16, 128, "none", "adafactor"),
    ("tiny", "v5p-32", "16x1", 32, 128, "dots", "adamw"),
    ("tiny", "v5p-32", "8x2", 8, 128, "names:qkv,mlp_hidden", "adafactor"),
]
CONFIGS = MATRIX + TOY  # --only indexes this


def _pct(x) -> str:
  return "n/a" if x is None else f"{100 * x:+.2f}%"


def _errors_line(rows: list[dict], key: str, what: str) -> str | None:
  errs = [abs(r["relative_error"][key]) for r in rows
          if r["relative_error"].get(key) is not None]
  if not errs:
    return None
  return (f"- |relative error| of {key}{what}: median "
          f"{100 * statistics.median(errs):.2f}%, worst {100 * max(errs):.2f}%")


def _is_toy(row: dict) -> bool:
  return bool(row["config"].get("toy"))


def summary(rows: list[dict]) -> list[str]:
  ok = [r for r in rows if "relative_error" in r]
  lines = [f"{len(ok)} of {len(rows)} configs compiled."]
  matrix = [r for r in ok if not _is_toy(r)]
  toy = [r for r in ok if _is_toy(r)]
  for key in ("arguments", "peak", "peak_no_overhead", "temp"):
    line = _errors_line(matrix, key, f" ({len(matrix)} matrix configs)")
    if line:
      lines.append(line)
  for key in ("arguments", "peak_no_overhead"):
    line = _errors_line(toy, key, f" ({len(toy)} toy configs, outside the "
                        f"targets)")
    if line:
      lines.append(line)
  live = [r for r in ok if r["compiled"].get("peak_live_bytes")]
  if live:
    match = sum(1 for r in live if abs(r["compiled"]["peak_live_bytes"]
                                       / r["compiled"]["peak_bytes"] - 1) < 1e-3)
    lines.append(f"- XLA's peak rebuilt from its dumped buffer assignment and "
                 f"live ranges (simulator.xla_peak) within 0.1% of "
                 f"memory_analysis in {match} of {len(live)} configs")
  lay = [r for r in ok if r["relative_error"].get("arguments_layout") is not None]
  exact = sum(1 for r in lay if r["relative_error"]["arguments_layout"] == 0)
  lines.append(f"- arguments with the compiled tiled layouts: exact in {exact} of "
               f"{len(lay)}")
  coll = [r["collectives"] for r in ok if r.get("collectives")]
  errs = [abs(c["relative_error"]) for c in coll
          if c["relative_error"] is not None]
  if errs:
    lines.append(
        f"- collective bytes per device per step, symbolic (simulator.comms) vs "
        f"the compiled HLO: |relative error| median "
        f"{100 * statistics.median(errs):.2f}%, worst {100 * max(errs):.2f}% "
        f"over {len(errs)} configs; summed, {sum(c['symbolic_bytes'] for c in coll) / GiB:.2f}"
        f" vs {sum(c['hlo_bytes'] for c in coll) / GiB:.2f} GiB")
  return lines


def write(rows: list[dict], path: str, started: float) -> None:
  head = ["# Validation: symbolic memory vs the XLA compiler (TPU v5p via libtpu)",
          "",
          "Written by `python -m experiments.validation_matrix`; per-device bytes in "
          "GiB (2**30). Relative error = (symbolic - compiled) / compiled. Compiled "
          "peak = `memory_analysis().peak_memory_in_bytes` (the TPU compiler's heap "
          "simulation); symbolic peak includes the 10% overhead term "
          "(`peak-ovh` excludes it).", "", "## Summary", ""]
  head += summary(rows)
  compile_s = sum(r["compiled"]["compile_seconds"] for r in rows
                  if "compiled" in r)
  run = (f"Run time {time.time() - started:.0f} s; " if started else "")
  head += ["", f"{run}compile time {compile_s:.0f} s summed over the configs.",
           "", "## Results", "",
           "| # | model | topology | mesh | batch | seq | remat | optimizer | "
           "args sym | args XLA | args err | temp sym | temp XLA | peak sym | "
           "peak XLA | peak err | peak-ovh err | coll sym GiB | coll HLO GiB | "
           "coll err | compile s |",
           "|" + "---|" * 21]
  for i, r in enumerate(rows):
    c = r["config"]
    model = c["model"] + (" (toy)" if _is_toy(r) else "")
    pre = (f"| {i} | {model} | {c['topology']} | {c['mesh']} | {c['batch']} | "
           f"{c['seq']} | {c['remat']} | {c['optimizer']} | ")
    if "relative_error" not in r:
      head.append(pre + f"FAILED: {r['error'][:120]} |" + " |" * 12)
      continue
    s, x, e = r["symbolic"], r["compiled"], r["relative_error"]
    g = lambda b: f"{b / GiB:.3f}"
    head.append(pre + " | ".join([
        g(s["arguments"]), g(x["argument_bytes"]), _pct(e["arguments"]),
        g(s["temp"]), g(x["temp_bytes"]), g(s["peak"]), g(x["peak_bytes"]),
        _pct(e["peak"]), _pct(e["peak_no_overhead"]),
        g(r["collectives"]["symbolic_bytes"]), g(r["collectives"]["hlo_bytes"]),
        _pct(r["collectives"]["relative_error"]),
        f"{x['compile_seconds']:.0f}"]) + " |")
  with open(path, "w") as f:
    f.write("\n".join(head) + "\n")


def _chosen(only: str | None) -> list[int]:
  if not only:
    return list(range(len(CONFIGS)))
  out = []
  for part in only.split(","):
    if not part.strip().isdigit() or int(part) >= len(CONFIGS):
      cli.fail(f"--only={only!r}: {part!r} is not a config index; valid: 0 to "
               f"{len(CONFIGS) - 1} ({len(MATRIX)} matrix configs, then "
               f"{len(TOY)} toy ones)")
    out.append(int(part))
  return out


def main(argv):
  del argv
  if FLAGS.from_jsonl:
    try:
      with open(FLAGS.from_jsonl) as f:
        rows = [json.loads(line) for line in f if line.strip()]
    except (OSError, ValueError) as e:
      cli.fail(f"--from_jsonl={FLAGS.from_jsonl!r}: {e}; give a --jsonl file "
               "of an earlier run")
    write(rows, FLAGS.out, 0)
    return
  from experiments.validate import validate
  from meshes.layout import parse_mesh
  chosen = _chosen(FLAGS.only)
  rows, started = [], time.time()
  for n, i in enumerate(chosen):
    model, topo, mesh, batch, seq, remat, opt = CONFIGS[i]
    x, y = parse_mesh(mesh)
    settings = TrainSettings(batch=batch, seq=seq, remat=remat, optimizer=opt)
    label = f"[{n + 1}/{len(chosen)} #{i} {model} {topo} {mesh} b{batch} {remat} {opt}]"
    print(f"{label} start ({time.time() - started:.0f} s elapsed)", file=sys.stderr,
          flush=True)
    t0 = time.time()
    try:
      r = validate(load_model(model), settings, topo, x, y,
                   progress=lambda m: print(f"{label} {m}", file=sys.stderr,
                                            flush=True))
      r["compiled"].pop("collectives_list", None)
      print(f"{label} done in {time.time() - t0:.0f} s: args err "
            f"{_pct(r['relative_error']['arguments'])}, peak err "
            f"{_pct(r['relative_error']['peak'])}", file=sys.stderr, flush=True)
    except Exception as e:  # noqa: BLE001 - a failed config is a result
      msg = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
      print(f"{label} FAILED after {time.time() - t0:.0f} s: {msg}", file=sys.stderr,
            flush=True)
      traceback.print_exc(file=sys.stderr)
      r = {"error": msg}
    r["config"] = {"model": model, "topology": topo, "mesh": mesh, "batch": batch,
                   "seq": seq, "remat": remat, "optimizer": opt,
                   "toy": i >= len(MATRIX)}
    rows.append(r)
    if FLAGS.jsonl:
      with open(FLAGS.jsonl, "a") as f:
        f.write(json.dumps(r, default=str) + "\n")
    write(rows, FLAGS.out, started)


if __name__ == "__main__":
  cli.run(main)
