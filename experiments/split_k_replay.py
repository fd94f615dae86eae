"""XLA:GPU's split-K rewriter against the rule that models it, on one plan.

  python -m experiments.split_k_replay --model=gpt2 --topology=h100:2x8 \
      --mesh=4x4 --batch=16 --seq=512 --remat=full [--dump_dir=DIR]
  python -m experiments.split_k_replay --corpus_rows=all   # or 0,1,12

Compiles the train step deviceless for the GPU --topology with the module
dumped before and after XLA's splitk-rewriter pass, replays the rule's cost
model (simulator.memory.xla_gpu_rules.choose_split) on every dot dumped
before it, and lists the dots with the split each gets; exit 1 when the
rule and XLA differ on any dot. --corpus_rows replays the kept GPU corpus
rows' plans (experiments/data/compiled_gpu_corpus.jsonl) instead of the
plan flags, one line each.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile

from absl import flags

from experiments import cli

CORPUS = "experiments/data/compiled_gpu_corpus.jsonl"
FLAGS = flags.FLAGS
cli.define_model_flags()
cli.define_train_flags()
flags.DEFINE_string("dump_dir", None, "keep the compiler's dumps here "
                    "(default: a temporary directory)")
flags.DEFINE_string("corpus_rows", None, "replay these rows of the kept GPU "
                    f"corpus ({CORPUS}): indices 0,1,... or all")


def _plans():
  """(label, cfg, settings, topology, X, Y) for each plan asked for."""
  from meshes.topology import parse_topology
  from models.registry import load_model
  from simulator.xla import crosscheck
  if not FLAGS.corpus_rows:
    cfg, plan = cli.model_and_plan()
    return [("", cfg, cli.train_settings(), plan.topology, plan.X, plan.Y)]
  with open(CORPUS) as f:
    rows = {r["config"]["index"]: r["config"] for r in map(json.loads, f)}
  try:
    wanted = (sorted(rows) if FLAGS.corpus_rows == "all" else
              [int(i) for i in FLAGS.corpus_rows.split(",")])
  except ValueError:
    wanted = None
  if not wanted or any(i not in rows for i in wanted):
    cli.fail(f"--corpus_rows={FLAGS.corpus_rows!r}: give all or indices of "
             f"{CORPUS} (0-{max(rows)})")
  out = []
  for i in wanted:
    c = rows[i]
    x, y = map(int, c["mesh"].split("x"))
    out.append((f"#{i} {c['model']} {c['topology']} {c['mesh']}: ",
                load_model(c["model"]), crosscheck.settings_of(c),
                parse_topology(c["topology"]), x, y))
  return out


def main(argv):
  del argv
  if FLAGS.dump_dir and os.path.exists(FLAGS.dump_dir) and not os.path.isdir(
      FLAGS.dump_dir):
    cli.fail(f"--dump_dir={FLAGS.dump_dir!r} is a file; give a folder for "
             "the compiler's dumps")
  plans = _plans()
  for _, _, _, topology, _, _ in plans:
    if topology.chip.kind != "gpu":
      cli.fail(f"--topology={topology.name} is a TPU; the split-K rewriter is "
               "XLA:GPU's (h100:8, h100:2x8, a100:8, ...)")
  from simulator.xla import hlo_dots
  total = agree = split = 0
  for label, cfg, settings, topology, x, y in plans:
    with tempfile.TemporaryDirectory() as tmp:
      dots, differ = hlo_dots.compile_and_replay(
          cfg, settings, topology, x, y, FLAGS.dump_dir or tmp)
    if not label:
      for dot, s in sorted(dots, key=lambda d: -d[1]):
        dims = "x".join(map(str, dot.dims)) if dot.dims else "several K"
        print(f"{s:5d}  b,m,n,k {dims:<24} bits {dot.bits}  "
              f"{dot.op_name[-60:]}")
    n, s = len(dots), sum(1 for _, s in dots if s > 1)
    total, agree = total + n, agree + n - sum(differ.values())
    split += s
    print(f"{label}{n - sum(differ.values())} of {n} dots get XLA's split "
          f"from the rule ({s} split by the rule)"
          + (f"; differ: {dict(differ)}" if differ else ""), flush=True)
  if len(plans) > 1:
    print(f"all: {agree} of {total} dots get XLA's split from the rule "
          f"({split} split)")
  if agree != total:
    sys.exit(1)


if __name__ == "__main__":
  cli.run(main)
