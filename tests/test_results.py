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


def test_lines_that_are_not_records_are_skipped_and_kept(tmp_path):
  """A comment, valid JSON of another shape and bytes that are not UTF-8
  are no results: `load` skips them, `update` writes them back where they
  were (a --keep file a person edits loses nothing)."""
  path = tmp_path / "rows.jsonl"
  with open(path, "wb") as f:
    f.write(b'{"k": 1, "v": 1}\n# a note\n{}\n42\n'
            b'garbage \x00\xff not json\n{"k": 2, "v": 2}\n')
  results = ResultsFile(str(path), lambda x: x["k"])
  assert results.load() == [{"k": 1, "v": 1}, {"k": 2, "v": 2}]
  results.update([{"k": 2, "v": 3}, {"k": 4, "v": 4}])
  with open(path, "rb") as f:
    assert f.read().splitlines() == [
        b'{"k": 1, "v": 1}', b"# a note", b"{}", b"42",
        b"garbage \x00\xff not json", b'{"k": 2, "v": 3}', b'{"k": 4, "v": 4}']


def test_update_drops_a_torn_last_line(tmp_path):
  path = tmp_path / "rows.jsonl"
  with open(path, "w") as f:
    f.write('{"k": 1}\n{"k": 2, "tor')
  ResultsFile(str(path), lambda x: x["k"]).update([{"k": 3}])
  with open(path) as f:
    assert f.read() == '{"k": 1}\n{"k": 3}\n'


def test_a_failed_write_names_the_file(tmp_path):
  """ENOSPC on write names no file; `naming` gives it the one written."""
  from experiments.results import naming
  import errno
  import pytest
  with pytest.raises(OSError) as e:
    with naming("/somewhere/results.jsonl"):
      raise OSError(errno.ENOSPC, "No space left on device")
  assert e.value.filename == "/somewhere/results.jsonl"
  assert e.value.errno == errno.ENOSPC
