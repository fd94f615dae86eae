"""Predicted vs measured MFU on MaxText's published runs (the anchors).

  python -m experiments.step_time_matrix [--out=experiments/step_time.md]

Each anchor (experiments.step_time_anchors, which also holds the logic) is
mapped onto this project's flags the way `--maxtext` maps any MaxText run,
traced on its TPU slice and timed by simulator.timing.roofline; its MFU is counted
with the FLOP count MaxText used for the published figure, so predicted and
measured share a numerator. Writes a markdown table, prints its summary.
"""

from __future__ import annotations

import time

from absl import flags

from experiments import cli
from experiments.step_time_anchors import ANCHORS, HELD_OUT, predict, report

FLAGS = flags.FLAGS
flags.DEFINE_string("out", "experiments/step_time.md", "results table (markdown)")


def main(argv) -> None:
  del argv
  cli.check_folder("out", FLAGS.out)
  started = time.perf_counter()
  rows: dict[bool, list] = {False: [], True: []}  # held out or not
  for anchor in (*ANCHORS, *HELD_OUT):
    r = predict(anchor)
    rows[anchor in HELD_OUT].append(r)
    print(f"{r['anchor']:>16}: predicted MFU {100 * r['mfu']:.1f}%, measured "
          f"{100 * r['measured_mfu']:.2f}%", flush=True)
  text = report(rows[False], time.perf_counter() - started, rows[True])
  cli.write_whole(FLAGS.out, text)
  print(text.split("\n\n")[2])


if __name__ == "__main__":
  cli.run(main)
