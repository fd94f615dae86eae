"""experiments.cli: what every entry point shares."""

from experiments import cli


def test_a_flag_given_twice_is_refused():
  """absl keeps the last value silently; the user is told instead."""
  assert cli._repeated(["prog", "--seq=64", "--seq=128"]) == (
      "--seq is given twice (--seq=64 and --seq=128); give it once")
  assert cli._repeated(["prog", "--seq=64", "--batch=8"]) is None
  assert cli._repeated(["prog", "--seq", "64", "--batch=8"]) is None
