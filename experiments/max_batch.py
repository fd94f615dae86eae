"""The largest batch that fits, exact, from one trace.

  python -m experiments.max_batch --model=llama2_70b --topology=v5p-256 \
      --mesh=32x4 --seq=4096 --remat=full [--hbm_fraction=0.85] [--confirm]

Every program point's live bytes are affine in the batch (the probe batch,
simulator.tracing.batch_probe), so the largest global batch whose compiler-comparable
peak stays within --hbm_fraction of the chip's HBM follows from one trace
(simulator.memory.largest_batch); no compiles are searched. The fraction is
the headroom the fine-tuning playbook (seed 002) keeps, 15-20%, in place of
the 10% planning overhead. --confirm compiles the answer for the topology.
--batch is ignored; --grad_accum makes the answer a multiple of it.
"""

from __future__ import annotations

from absl import flags

from experiments import cli
from meshes.hardware import GiB
from simulator import memory
from simulator.memory.capacity import capacity_bytes, check_hbm_fraction

FLAGS = flags.FLAGS
cli.define_model_flags()
cli.define_train_flags()
cli.define_hbm_fraction_flag()
flags.DEFINE_bool("confirm", False, "compile the answer for the topology")


def main(argv) -> None:
  del argv
  import dataclasses
  check_hbm_fraction(FLAGS.hbm_fraction)
  cfg, plan = cli.model_and_plan()
  settings = cli.train_settings()
  step = plan.X * settings.batch_splits  # whole sequences per micro-batch shard
  settings = dataclasses.replace(settings, batch=step)
  estimate = memory.memory_report(cfg, settings, plan)
  usable = capacity_bytes(plan)  # a GPU: JAX's pool (simulator.memory.capacity)
  cap = int(FLAGS.hbm_fraction * usable)
  best = memory.largest_batch(estimate, cap, step)
  where = (f"{FLAGS.hbm_fraction:.0%} of {usable / GiB:.0f}"
           f" GiB = {cap / GiB:.2f} GiB per device, mesh {plan.X}x{plan.Y}")
  if not best:
    need = estimate.at_batch(step).compiled_comparable_peak
    print(f"nothing fits in {where}: batch {step} needs {need / GiB:.2f} GiB")
    return
  at = estimate.at_batch(best)
  more = estimate.at_batch(best + step).compiled_comparable_peak
  print(f"largest batch in {where}: {best} sequences ({best // plan.X} per "
        f"data shard) at {at.compiled_comparable_peak / GiB:.2f} GiB "
        f"({at.per_device_bytes['peak'] / GiB:.2f} with the 10% planning "
        f"overhead); {best + step} would need {more / GiB:.2f} GiB")
  if FLAGS.confirm:
    from simulator.xla import compiled
    report = compiled.compile_report(cfg, dataclasses.replace(
        settings, batch=best), plan.topology.name, plan.X, plan.Y)
    verdict = "fits" if report.peak_bytes <= cap else "does NOT fit"
    print(f"compiled at batch {best}: XLA's peak {report.peak_bytes / GiB:.2f}"
          f" GiB, {verdict} in {cap / GiB:.2f} GiB")


if __name__ == "__main__":
  cli.run(main)
