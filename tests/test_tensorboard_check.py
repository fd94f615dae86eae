"""experiments.tensorboard_check: a folder without TensorBoard events is
named at once, not served and waited on."""

import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_a_folder_without_event_files_is_a_one_line_error(tmp_path):
  (tmp_path / "notes.txt").write_text("not a run")
  p = subprocess.run([sys.executable, "-m", "experiments.tensorboard_check",
                      f"--logdir={tmp_path}"], cwd=ROOT, capture_output=True,
                     text=True, timeout=120)
  assert p.returncode == 2 and p.stderr == (
      f"error: --logdir={str(tmp_path)!r} holds no TensorBoard event files; "
      "give the tensorboard folder a sweep printed (RUN/tensorboard)\n")
