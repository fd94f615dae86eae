"""experiments.validation_matrix: summaries per corpus part, re-checking kept
rows without compiling, one-line errors."""

import json
import os
import subprocess
import sys

from experiments import validation_matrix as vm
from experiments.validation_corpus import CASES
from meshes.layout import plan_mesh
from meshes.topology import parse_topology
from models.registry import load_model
from simulator.xla import crosscheck
from simulator import memory
from simulator.settings import TrainSettings

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _row(model, peak_err, arg_err, part):
  return {"config": {"model": model, "part": part},
          "relative_error": {"arguments": arg_err, "peak": peak_err,
                             "peak_no_overhead": peak_err, "temp": 0.0},
          "compiled": {"peak_bytes": 1, "compile_seconds": 1.0},
          "symbolic": {}}


def test_summary_reports_each_part_apart():
  rows = [_row("gpt2", 0.02, 0.0, "tune"), _row("gpt2", -0.04, 0.0, "tune"),
          _row("llama2_7b", 0.10, 0.0, "check"),
          _row("tiny", -0.39, 0.07, "toy"),
          {"config": {"model": "x"}, "error": "boom"}]
  text = "\n".join(vm.summary(rows))
  assert "4 of 5 configs compiled" in text
  assert ("peak_no_overhead (2 tune configs): median 3.00%, worst 4.00%"
          in text), text
  assert "peak_no_overhead (1 check configs): median 10.00%" in text
  assert "peak_no_overhead (1 toy configs, outside the targets): median " \
         "39.00%" in text


def test_a_row_compiled_from_another_program_is_left_out_and_named():
  """crosscheck.recheck's `program`: a row whose kept fingerprint is not
  today's trace's counts in no figure and is listed to be recompiled."""
  rows = [{**_row("gpt2", 0.02, 0.0, "tune"), "program": "same"},
          {**_row("gpt2", 0.50, 0.0, "tune"), "program": "changed",
           "config": {"model": "gpt2", "part": "tune", "index": 7}},
          {**_row("gpt2", 0.04, 0.0, "tune"), "program": "unknown"}]
  text = "\n".join(vm.summary(rows))
  assert "2 of 2 configs compiled" in text
  assert "peak_no_overhead (2 tune configs): median 3.00%, worst 4.00%" in text
  assert ("today's code traces (its fingerprint, simulator.tracing."
          "fingerprint): 1 rows; changed since: 1 (#7: their compiled "
          "figures are an older program's, left out of every figure above; "
          "recompile them with --only=7); no fingerprint kept: 1") in text


def test_the_summary_says_what_the_smaller_schedule_would_give():
  """Beside the kept (larger) schedule's errors, the smaller's: how many
  rows it would put under XLA's peak, the dangerous side."""
  rows = [_row("gpt2", 0.02, 0.0, "check"), _row("gpt2", 0.30, 0.0, "check"),
          _row("tiny", 0.5, 0.0, "toy")]
  rows[0]["relative_error"]["peak_smaller_schedule"] = 0.01
  rows[1]["relative_error"]["peak_smaller_schedule"] = -0.20
  rows[2]["relative_error"]["peak_smaller_schedule"] = -0.40
  text = "\n".join(vm.summary(rows))
  assert ("peak_no_overhead with the smaller simulated schedule kept instead "
          "of the larger (check): |relative error| median 10.50%, worst "
          "20.00%; under XLA's by more than 5%: 1 of 2, down to -20.00%"
          in text), text
  assert "larger (toy)" not in text


def test_the_summary_says_which_schedule_xla_kept_and_how_far_its_estimate():
  """XLA's memory scheduler keeps the schedule its own estimate finds
  smallest: the summary counts its choices in the rows that logged them
  and sets the kept schedule's estimate beside the compiled peak."""
  rows = [_row("gpt2", 0.02, 0.0, "gpu"), _row("gpt2", 0.30, 0.0, "gpu"),
          _row("gpt2", 0.10, 0.0, "gpu-check")]
  for i, (row, log) in enumerate(zip(rows, (
      {"list": 150, "dfs": 120, "post order": 120, "chose": "dfs"},
      {"list": 80, "dfs": 90, "post order": 95, "chose": "list"},
      {"list": 300, "dfs": 250, "post order": 250, "chose": "dfs"}))):
    row["config"]["index"] = i
    row["compiled"] = {"peak_bytes": 100, "memory_scheduler": log}
  text = "\n".join(vm.summary(rows))
  assert ("XLA's memory scheduler (its own estimates, logged in 3 compiles): "
          "kept the DFS schedule in 2, the list schedule in 1; its estimate "
          "of the schedule it kept against the compiled peak: median "
          "+20.00%, from #1 -20.00% to #2 +150.00%") in text, text
  assert "XLA's memory scheduler" not in "\n".join(vm.summary(rows[:0]))


def test_a_summary_of_host_streamed_rows_alone_has_no_flops_median():
  """A table whose only compiled row streams its layers from host memory
  (the first row of a compile batch, say) gets a summary, not an error."""
  row = _row("llama3_8b", 0.02, 0.0, "check")
  row["config"].update(index=7, remat="offload:qkv")
  row["flops"] = {"relative_error": -0.4}
  text = "\n".join(vm.summary([row]))
  assert "no config to compare; not comparable where the layer loops " \
         "stream from host memory (#7 -40.00%)" in text, text


def test_the_summary_holds_hbm_bytes_against_the_cost_analysis():
  """Each row's step-time HBM bytes against XLA's bytes accessed: the
  median and range over the rows XLA counts as the model does, and per bin
  of tokens a device; those that stream layers from host memory and the
  8-bit optimizer's named apart, toys left out."""
  rows = [_row("gpt2", 0.0, 0.0, "tune"), _row("llama2_7b", 0.0, 0.0, "check"),
          _row("llama2_7b", 0.0, 0.0, "check"),
          _row("llama3_8b", 0.0, 0.0, "check"),
          _row("llama3_8b", 0.0, 0.0, "check"), _row("tiny", 0.0, 0.0, "toy")]
  for i, (r, err, batch) in enumerate(zip(
      rows, (-0.4, 0.5, 0.7, 0.9, -0.95, 3.0), (8, 8, 64, 8, 8, 8))):
    r["config"].update(index=i, mesh="4x1", topology="v5p-8", batch=batch,
                       seq=2048, optimizer="adamw")
    r["hbm_bytes"] = {"relative_error": err}
  rows[3]["config"]["remat"] = "offload:qkv"
  rows[4]["config"]["optimizer"] = "adamw_8bit"
  text = "\n".join(vm.summary(rows))
  assert ("vs the compiled step's cost_analysis() bytes accessed (which add "
          "collectives, copies and host transfers): relative error median "
          "+50.00%, from #0 -40.00% to #2 +70.00% over 3 configs; by tokens "
          "a device (batch x seq / data shards): up to 4,096 median +5.00% "
          "(2), up to 65,536 median +70.00% (1); not comparable where the "
          "layer loops stream from host memory (#3 +90.00%)") in text, text
  assert "nor with the 8-bit optimizer (#4 -95.00%)" in text, text
  assert "#5 +300.00%" not in text  # toys left out


def test_the_gpu_corpus_parts_are_reported_apart(tmp_path):
  """`gpu` (tuned on) and `gpu-check` (held out) each get their own lines,
  and a table of GPU rows says so in its header."""
  rows = [_row("gpt2", -0.10, 0.0, "gpu"), _row("gpt2", 0.02, 0.0, "gpu"),
          _row("llama2_7b", -0.06, 0.0, "gpu-check")]
  for i, r in enumerate(rows):
    r["config"]["index"] = i
  text = "\n".join(vm.summary(rows))
  assert "peak_no_overhead (2 gpu configs): median 6.00%, worst 10.00%" in text
  assert "peak_no_overhead (1 gpu-check configs): median 6.00%" in text
  assert ("under XLA's by more than 5% (gpu-check): 1 of 1: #2 -6.00%"
          in text), text
  out = tmp_path / "v.md"
  for r in rows:
    r["config"].update(topology="h100:8", mesh="8x1", batch=8, seq=128,
                       remat="full", optimizer="adamw")
    r["compiled"].update(argument_bytes=1, temp_bytes=1)
    r["symbolic"].update(arguments=1, temp=1, peak=1)
    r["collectives"] = {"symbolic_bytes": 0, "hlo_bytes": 0,
                        "relative_error": None}
  vm.write(rows, str(out), 0.0)
  head = out.read_text().splitlines()[0]
  assert "NVIDIA GPUs" in head and "`gpu-check`" in out.read_text()
  assert "## Rules" not in out.read_text()  # the TPU rules are not its own


def test_an_out_of_hbm_compile_is_a_data_point():
  text = ("RESOURCE_EXHAUSTED: E1000: CompileTimeHbmOom: Ran out of memory on "
          "HBM, the total memory required for HLO temporaries (164.95G) "
          "exceeds available HBM (95.73G). HLO module: jit_step.")
  assert crosscheck.hbm_oom(text) == {"temp_bytes": int(164.95 * 2**30),
                                      "hbm_bytes": int(95.73 * 2**30)}
  assert crosscheck.hbm_oom("INTERNAL: something else") is None
  rows = [{"config": {"model": "m"}, "oom": {}, "oom_relative_error": -0.1,
           "symbolic_fits": False}]
  assert ("1 configs over HBM at compile time (XLA's CompileTimeHbmOom): "
          "the symbolic estimate says 'does not fit' for 1" in
          "\n".join(vm.summary(rows)))


def test_recheck_recomputes_the_symbolic_side_against_kept_figures():
  """A kept row's compiled figures are data; the symbolic side comes from
  today's model: compiled figures equal to it give zero error."""
  config = {"model": "tiny", "topology": "v5p-8", "mesh": "2x2", "batch": 8,
            "seq": 128, "remat": "full", "optimizer": "adamw", "part": "toy"}
  settings = crosscheck.settings_of(config)
  assert settings == TrainSettings(batch=8, seq=128)
  est = memory.memory_report(load_model("tiny"), settings,
                             plan_mesh(parse_topology("v5p-8"), 2, 2))
  peak = est.compiled_comparable_peak
  row = {"config": config, "compiled": {
      "argument_bytes": est.arguments_bytes, "temp_bytes": 2 * peak,
      "peak_bytes": peak, "layout_argument_bytes": None,
      "collectives": {}}}
  got = crosscheck.recheck(row)
  assert got["relative_error"]["arguments"] == 0
  assert got["relative_error"]["peak_no_overhead"] == 0
  # the kept schedules' peaks: the largest is the estimate's, none above it
  schedules = got["symbolic"]["schedule_peaks"]
  assert not schedules or max(schedules.values()) == peak
  assert got["relative_error"]["peak_smaller_schedule"] == (
      (min(schedules.values()) - peak) / peak if schedules else 0)
  assert got["symbolic"]["peak_no_overhead"] == peak
  assert got["collectives"]["symbolic_bytes"] > 0  # tiny 2x2 communicates


def test_from_jsonl_rechecks_and_rewrites_the_table(tmp_path):
  src, out = tmp_path / "r.jsonl", tmp_path / "v.md"
  config = {"model": "tiny", "topology": "v5p-8", "mesh": "4x1", "batch": 8,
            "seq": 128, "remat": "full", "optimizer": "adamw", "part": "toy"}
  row = {"config": config, "compiled": {
      "argument_bytes": 1, "temp_bytes": 1, "peak_bytes": 1,
      "compile_seconds": 3.0, "collectives": {}}}
  later = {**row, "config": {**config, "batch": 16, "index": 1}}
  first = {**row, "config": {**config, "index": 0}}
  src.write_text(json.dumps(later) + "\n" + json.dumps(first) + "\n")
  rechecked = tmp_path / "again.jsonl"
  proc = subprocess.run(
      [sys.executable, "-m", "experiments.validation_matrix",
       f"--from_jsonl={src}", f"--out={out}", f"--jsonl={rechecked}"],
      capture_output=True, text=True)
  assert proc.returncode == 0, proc.stderr[-2000:]
  text = out.read_text()
  # --jsonl: the re-checked rows, in case order, today's symbolic side
  again = [json.loads(l) for l in rechecked.read_text().splitlines()]
  assert [r["config"]["index"] for r in again] == [0, 1]
  assert all(r["compiled"] == row["compiled"] for r in again)
  assert again[1]["symbolic"]["peak"] > again[0]["symbolic"]["peak"]
  # the same rows re-checked two at a time write the same table
  two = tmp_path / "v2.md"
  proc = subprocess.run(
      [sys.executable, "-m", "experiments.validation_matrix",
       f"--from_jsonl={src}", f"--out={two}", "--workers=2"],
      capture_output=True, text=True, timeout=600)
  assert proc.returncode == 0, proc.stderr[-2000:]
  assert "re-checked 2 kept rows 2 at a time" in proc.stderr
  drop_time = lambda t: [l for l in t.splitlines() if "Run time" not in l]
  assert drop_time(two.read_text()) == drop_time(text)
  row0 = "| 0 | tiny | toy | v5p-8 | 4x1 | 8 | 128 | full | adamw | - |"
  row1 = "| 1 | tiny | toy | v5p-8 | 4x1 | 16 | 128 | full | adamw | - |"
  assert row0 in text and row1 in text
  assert text.index(row0) < text.index(row1)  # in case order, not the file's
  assert "- **copied cast weights**: " in out.read_text()  # the rule list
  # --only: those kept rows
  one = tmp_path / "v1.jsonl"
  proc = subprocess.run(
      [sys.executable, "-m", "experiments.validation_matrix",
       f"--from_jsonl={src}", f"--out={tmp_path / 'v1.md'}", "--only=1",
       f"--jsonl={one}"], capture_output=True, text=True, timeout=600)
  assert proc.returncode == 0, proc.stderr[-2000:]
  assert "re-checking 1 kept rows" in proc.stderr
  assert [json.loads(l)["config"]["index"]
          for l in one.read_text().splitlines()] == [1]


def test_bad_inputs_are_one_line_errors(tmp_path):
  out = tmp_path / "v.md"
  bad = tmp_path / "bad.jsonl"
  bad.write_text('{"no": "config"}\n')
  empty = tmp_path / "empty.jsonl"
  empty.write_text("")
  partial = tmp_path / "partial.jsonl"
  partial.write_text('{"config": {"index": 0, "model": "tiny"}}\n')
  torn = tmp_path / "torn.jsonl"
  torn.write_text('{"config": {"index": 0}}\n{"bad\n')
  link = tmp_path / "link.jsonl"
  link.symlink_to(bad)
  gpu_rows = os.path.join(ROOT, "experiments", "data",
                          "compiled_gpu_corpus.jsonl")
  for args, message in (
      (["--only=3,x"], "'x' is not a config index; valid: 0 to"),
      (["--only="], "'' is not a config index"),
      (["--only=3,3"], "3 is given twice"),
      ([f"--from_jsonl={partial}"], "a row is not a kept corpus row "
       "(KeyError: 'topology')"),
      ([f"--from_jsonl={torn}"], "line 2 is not JSON"),
      ([f"--from_jsonl={bad}", f"--jsonl={link}"], "is the --from_jsonl file"),
      ([f"--from_jsonl={bad}"], "line 1 has no 'config'; give a --jsonl file "
       "of an earlier run"),
      ([f"--from_jsonl={empty}"], "holds no rows"),
      ([f"--from_jsonl={bad}", f"--jsonl={bad}"], "is the --from_jsonl file")):
    proc = subprocess.run(
        [sys.executable, "-m", "experiments.validation_matrix", *args,
         f"--out={out}"], capture_output=True, text=True)
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert message in proc.stderr
    assert "Traceback" not in proc.stderr and not out.exists()
  assert bad.read_text() == '{"no": "config"}\n'  # nothing written over
  proc = subprocess.run(  # the GPU corpus's rows would land on the TPU table
      [sys.executable, "-m", "experiments.validation_matrix",
       f"--from_jsonl={gpu_rows}", "--only=0"], capture_output=True,
      text=True, cwd=str(tmp_path), env={**os.environ, "PYTHONPATH": ROOT})
  assert proc.returncode == 2 and "holds the GPU corpus's rows; add " \
      "--corpus=gpu" in proc.stderr, proc.stderr[-2000:]
  assert not list(tmp_path.rglob("*.md"))


def test_cases_compile_in_worker_processes(tmp_path):
  """--workers=2: two toy cases compiled at once, each row appended as it
  finishes, the table in index order."""
  out, rows = tmp_path / "v.md", tmp_path / "r.jsonl"
  toy = [i for i, c in enumerate(CASES) if c.part == "toy"][:2]
  proc = subprocess.run(
      [sys.executable, "-m", "experiments.validation_matrix",
       f"--only={toy[1]},{toy[0]}", "--workers=2", f"--jsonl={rows}",
       f"--out={out}"], capture_output=True, text=True, timeout=600)
  assert proc.returncode == 0, proc.stderr[-2000:]
  assert "compiling 2 configs 2 at a time" in proc.stderr
  kept = [json.loads(line) for line in rows.read_text().splitlines()]
  assert sorted(r["config"]["index"] for r in kept) == toy
  assert all("relative_error" in r for r in kept)
  # each keeps the fingerprint of the program it compiled, today's trace's
  assert {crosscheck.recheck(r)["program"] for r in kept} == {"same"}
  changed = {**kept[0], "compiled": {**kept[0]["compiled"], "program": "0"}}
  rechecked = crosscheck.recheck(changed)
  assert rechecked["program"] == "changed"
  assert "toy (program changed)" in vm._row(0, rechecked)
  table = [line for line in out.read_text().splitlines()
           if line.startswith("| ") and line[2].isdigit()]
  assert [int(line.split("|")[1]) for line in table] == toy


def test_a_forced_memory_scheduler_needs_its_own_table(tmp_path):
  """--memory_scheduler compiles cases with libtpu's other scheduler: rows
  say which ran, and the corpus's own table is never written."""
  for args in (["--memory_scheduler=list"],
               ["--memory_scheduler=list", "--corpus=gpu",
                f"--out={tmp_path / 'g.md'}"]):
    proc = subprocess.run(
        [sys.executable, "-m", "experiments.validation_matrix", "--only=0",
         *args], capture_output=True, text=True)
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert proc.stderr.count("\n") == 1 and "give --out=FILE" in proc.stderr
  out, rows = tmp_path / "v.md", tmp_path / "r.jsonl"
  toy = [i for i, c in enumerate(CASES) if c.part == "toy"][0]
  proc = subprocess.run(
      [sys.executable, "-m", "experiments.validation_matrix", f"--only={toy}",
       "--memory_scheduler=list", f"--jsonl={rows}", f"--out={out}"],
      capture_output=True, text=True, timeout=600)
  assert proc.returncode == 0, proc.stderr[-2000:]
  row = json.loads(rows.read_text())
  assert row["config"]["memory_scheduler"] == row["compiled"]["scheduler"] == (
      "list")
  assert "memory_scheduler" not in row["compiled"]  # no choice was made
  assert set(row["compiled"]["replayed_schedules"]) == {"list", "dfs",
                                                        "post_order"}
