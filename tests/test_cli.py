"""experiments.cli: what every entry point shares."""

import json
import os
import subprocess
import sys

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


def _run(module, *args):
  root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  return subprocess.run([sys.executable, "-m", f"experiments.{module}", *args],
                        cwd=root, env={**os.environ, "JAX_PLATFORMS": "cpu"},
                        capture_output=True, text=True, timeout=120)


def test_an_unknown_flag_says_where_the_flags_are_listed():
  out = _run("inference_report", "--remat=full")
  assert out.returncode == 2 and out.stderr == (
      "error: Unknown command line flag 'remat' (a training setting); "
      "python -m experiments.inference_report --help lists the flags it "
      "takes\n")


def test_a_file_flag_naming_a_folder_is_refused(tmp_path, capsys):
  with pytest.raises(SystemExit) as e:
    cli.check_folder("keep", str(tmp_path))
  assert e.value.code == 2
  assert capsys.readouterr().err == (
      f"error: --keep={str(tmp_path)!r} is a folder; give a file\n")


def test_help_lists_the_shared_flags():
  """--help shows the flags every experiment shares (defined here), not
  only the entry point's own."""
  out = _run("memory_report", "--help").stdout
  for flag in ("--model:", "--topology:", "--batch:", "--seq:", "--config:"):
    assert flag in out, flag


@pytest.mark.parametrize("args,message", [
    (["--maxtext="], "error: --maxtext is given empty; give MaxText's "
     "key=value overrides or @FILE"),
    (["--config="], "error: --config is given empty; give a config file"),
])
def test_an_empty_run_description_is_refused(args, message):
  p = _run("memory_report", "--topology=v5p-8", *args)
  assert p.returncode == 2 and p.stderr.strip() == message


def test_a_model_too_large_for_int64_is_one_line(tmp_path):
  """Sizes each below 2**31 whose products overflow: one line, exit 2."""
  path = tmp_path / "huge.json"
  path.write_text(json.dumps({
      "model_type": "llama", "hidden_size": 4096, "intermediate_size": 11008,
      "num_attention_heads": 32, "num_hidden_layers": 2**31 - 1,
      "vocab_size": 32000}))
  p = _run("memory_report", "--topology=v5p-8", "--batch=8", "--seq=1024",
           f"--model={path}")
  assert p.returncode == 2 and "Traceback" not in p.stderr
  assert p.stderr.strip().endswith("the model or plan is too large to "
                                   "simulate")
