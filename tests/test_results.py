"""experiments.results: lines survive a killed process; a torn line is dropped."""

import os
import subprocess
import sys

from experiments.results import ResultsFile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_lines_appended_before_a_kill_are_kept(tmp_path):
  """No fsync per line: each is flushed to the OS as written, so a process
  that dies without `sync` (os._exit: no cleanup at all) loses none."""
  path = tmp_path / "results.jsonl"
  script = ("import os, sys; from experiments.results import ResultsFile; "
            f"r = ResultsFile({str(path)!r}, lambda x: x['k']); "
            "[r.append({'k': i}) for i in range(5)]; os._exit(1)")
  proc = subprocess.run([sys.executable, "-c", script], cwd=ROOT)
  assert proc.returncode == 1
  assert [r["k"] for r in ResultsFile(str(path), lambda x: x["k"]).load()] == [
      0, 1, 2, 3, 4]


def test_a_torn_last_line_is_dropped_and_the_next_starts_clean(tmp_path):
  path = tmp_path / "results.jsonl"
  results = ResultsFile(str(path), lambda x: x["k"])
  results.append({"k": 1})
  with open(path, "a") as f:
    f.write('{"k": 2, "tor')
  assert [r["k"] for r in results.load()] == [1]
  results.append({"k": 3})
  results.sync()
  assert [r["k"] for r in results.load()] == [1, 3]
