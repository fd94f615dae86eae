"""experiments.cli: what every entry point shares."""

import pytest

from experiments import cli


def test_a_flag_given_twice_is_refused():
  """absl keeps the last value silently; the user is told instead."""
  assert cli._repeated(["prog", "--seq=64", "--seq=128"]) == (
      "--seq is given twice (--seq=64 and --seq=128); give it once")
  assert cli._repeated(["prog", "--seq=64", "--batch=8"]) is None
  assert cli._repeated(["prog", "--seq", "64", "--batch=8"]) is None


def test_a_compiler_failure_is_one_line(capsys):
  """XLA's own failure: exit 1, the target and the first line of XLA's
  message, no traceback."""
  with pytest.raises(SystemExit) as e:
    cli.compiler_failed(RuntimeError("INTERNAL: no kernel\nmore detail"),
                        "h100:8")
  assert e.value.code == 1
  err = capsys.readouterr().err
  assert err == ("error: XLA could not compile the step for h100:8: "
                 "INTERNAL: no kernel\n")
