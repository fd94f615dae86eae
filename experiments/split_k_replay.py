"""XLA:GPU's split-K rewriter against the rule that models it, on one plan.

  python -m experiments.split_k_replay --model=gpt2 --topology=h100:2x8 \
      --mesh=4x4 --batch=16 --seq=512 --remat=full [--dump_dir=DIR]

Compiles the train step deviceless for the GPU --topology with the module
dumped before and after XLA's splitk-rewriter pass, replays the rule's cost
model (simulator.memory.xla_gpu_rules.choose_split) on every dot dumped
before it, and lists the dots with the split each gets; exit 1 when the
rule and XLA differ on any dot.
"""

from __future__ import annotations

import sys
import tempfile

from absl import flags

from experiments import cli

FLAGS = flags.FLAGS
cli.define_model_flags()
cli.define_train_flags()
flags.DEFINE_string("dump_dir", None, "keep the compiler's dumps here "
                    "(default: a temporary directory)")


def main(argv):
  del argv
  cfg, plan = cli.model_and_plan()
  if plan.topology.chip.kind != "gpu":
    cli.fail(f"--topology={FLAGS.topology} is a TPU; the split-K rewriter is "
             "XLA:GPU's (h100:8, h100:2x8, a100:8, ...)")
  from simulator.xla import hlo_dots
  with tempfile.TemporaryDirectory() as tmp:
    dots, differ = hlo_dots.compile_and_replay(
        cfg, cli.train_settings(), plan.topology, plan.X, plan.Y,
        FLAGS.dump_dir or tmp)
  for dot, split in sorted(dots, key=lambda x: -x[1]):
    dims = "x".join(map(str, dot.dims)) if dot.dims else "several K"
    print(f"{split:5d}  b,m,n,k {dims:<24} bits {dot.bits}  "
          f"{dot.op_name[-60:]}")
  split = sum(1 for _, s in dots if s > 1)
  print(f"{len(dots) - sum(differ.values())} of {len(dots)} dots get XLA's "
        f"split from the rule ({split} split by the rule)"
        + (f"; differ: {dict(differ)}" if differ else ""))
  if differ:
    sys.exit(1)


if __name__ == "__main__":
  cli.run(main)
