"""Open a sweep's TensorBoard in headless chromium and check each dashboard.

  python -m experiments.tensorboard_check --logdir=runs/xxl_ffn-v5p-128/tensorboard

Starts `tensorboard --logdir`, opens the Time Series, Custom Scalars,
Images, Text and HParams dashboards as a user would (nothing picked by
hand), and says for each whether this sweep's content is drawn; screenshots
go to --screenshots. Needs Debian's `chromium` (`apt-get install chromium`).
Exit 0 when every dashboard is drawn, 1 when one is not.
"""

from __future__ import annotations

import glob
import os
import sys

from absl import flags

from experiments import cli, tensorboard_browser

FLAGS = flags.FLAGS
flags.DEFINE_string("logdir", None, "a sweep's tensorboard folder (the one "
                    "mesh_sweep prints)")
flags.DEFINE_string("screenshots", None, "where the screenshots go; default "
                    "LOGDIR/screenshots")


def main(argv) -> None:
  del argv
  if not FLAGS.logdir or not os.path.isdir(FLAGS.logdir):
    raise ValueError(f"--logdir={FLAGS.logdir!r} is not a folder; give the "
                     f"tensorboard folder a sweep printed")
  if not glob.glob(os.path.join(glob.escape(FLAGS.logdir), "**",
                                "events.out.tfevents*"), recursive=True):
    raise ValueError(f"--logdir={FLAGS.logdir!r} holds no TensorBoard event "
                     "files; give the tensorboard folder a sweep printed "
                     "(RUN/tensorboard)")
  if tensorboard_browser.chromium() is None:
    raise ValueError("chromium is not installed; apt-get install chromium")
  out = FLAGS.screenshots or os.path.join(FLAGS.logdir, "screenshots")
  with tensorboard_browser.serve(FLAGS.logdir) as base:
    results = tensorboard_browser.check(base, out)
  for r in results:
    state = "drawn" if r.ok else f"EMPTY (no {r.missing})"
    print(f"{r.name:>15}: {state}; {r.screenshot}")
  if not all(r.ok for r in results):
    sys.exit(1)


if __name__ == "__main__":
  cli.run(main)
