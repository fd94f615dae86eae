"""Replays XLA's list, DFS and post-order memory schedules on a dumped module,
shows which order XLA kept (simulator.xla.memory_scheduler) and each
schedule's heap (simulator.xla.heap_replay).

  python -m experiments.validate --model=gpt2 --topology=v5p-8 --mesh=4x1 \\
      --batch=16 --seq=1024 --remat=full --shard=dp \\
      --dump_dir=/tmp/d --dump_passes=memory-scheduler
  python -m experiments.schedule_replay --dump_dir=/tmp/d

(`validate` itself prints XLA's own estimates of the three schedules and
which one it kept.)
"""

from __future__ import annotations

import os

from experiments import cli
from absl import app, flags

FLAGS = flags.FLAGS
flags.DEFINE_string("dump_dir", None, "a directory `experiments.validate "
                    "--dump_dir=DIR --dump_passes=memory-scheduler` wrote")
flags.DEFINE_float("min_mib", 64, "list the loops and the buffers of this "
                   "many MiB or more")


def main(argv) -> None:
  del argv
  from simulator.xla import memory_scheduler
  if not FLAGS.dump_dir or not os.path.isdir(FLAGS.dump_dir):
    given = (f"--dump_dir={FLAGS.dump_dir!r} is not a directory" if
             FLAGS.dump_dir else "--dump_dir is needed")
    cli.fail(f"{given}; give the one "
             "experiments.validate --dump_dir=DIR --dump_passes=memory-"
             "scheduler wrote")
  if FLAGS.min_mib < 0:
    cli.fail(f"--min_mib={FLAGS.min_mib:g} must be 0 or more")
  try:
    replay = memory_scheduler.replay(FLAGS.dump_dir)
  except (FileNotFoundError, ValueError) as e:
    cli.fail(str(e))
  print(memory_scheduler.describe(replay, int(FLAGS.min_mib * 2**20)))
  from simulator.xla import heap_replay
  print("each schedule's heap replayed (simulator.xla.heap_replay; no "
        "fragmentation, as libtpu's logged estimates), GiB, and the largest "
        "buffers live at its peak:")
  for scheduler, peak in heap_replay.peaks(replay.hlo).items():
    print(f"  {memory_scheduler.label(scheduler):<10} {peak.bytes / 2**30:8.3f}"
          f" at {peak.instruction} (step {peak.step}): " + ", ".join(
              f"{b.instruction} {b.bytes / 2**30:.3f}" for b in peak.live[:4]))


if __name__ == "__main__":
  cli.run(main)
