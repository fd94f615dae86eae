"""experiments.validation_matrix: what the matrix covers, how it summarizes."""

import json
import subprocess
import sys

from experiments import validation_matrix as vm
from meshes.layout import parse_mesh
from meshes.topology import parse_topology
from models.params import num_params
from models.presets import PRESETS


def test_matrix_covers_what_the_targets_are_claimed_over():
  """>= 24 configs, >= 3 models one of them >= 7B params, pure FSDP to
  TP-heavy meshes, >= 3 batch sizes and remat policies, both optimizers, v5p
  from 4 to 256 chips; no toy model among them."""
  assert len(vm.MATRIX) >= 24
  models = {m for m, *_ in vm.MATRIX}
  assert len(models) >= 3 and "tiny" not in models
  assert max(num_params(PRESETS[m]) for m in models) >= 7e9
  meshes = [parse_mesh(m) for _, _, m, *_ in vm.MATRIX]
  assert any(y == 1 for _, y in meshes) and any(y >= 4 * x for x, y in meshes)
  assert len({c[3] for c in vm.MATRIX}) >= 3  # batch sizes
  assert len({c[5].split(":")[0] for c in vm.MATRIX}) >= 3
  assert {c[6] for c in vm.MATRIX} >= {"adamw", "adafactor"}
  chips = {parse_topology(t).chips for _, t, *_ in vm.MATRIX}
  assert min(chips) == 4 and max(chips) == 256
  for model, topo, mesh, *_ in vm.CONFIGS:
    x, y = parse_mesh(mesh)
    assert model in PRESETS and x * y == parse_topology(topo).chips


def _row(model, peak_err, arg_err, toy):
  return {"config": {"model": model, "toy": toy},
          "relative_error": {"arguments": arg_err, "peak": peak_err,
                             "peak_no_overhead": peak_err, "temp": 0.0},
          "compiled": {"peak_bytes": 1, "compile_seconds": 1.0},
          "symbolic": {}}


def test_summary_keeps_toy_configs_out_of_the_targets():
  rows = [_row("gpt2", 0.02, 0.0, False), _row("gpt2", -0.04, 0.0, False),
          _row("tiny", -0.39, 0.07, True), {"config": {"model": "x"},
                                            "error": "boom"}]
  text = "\n".join(vm.summary(rows))
  assert "3 of 4 configs compiled" in text
  assert ("peak_no_overhead (2 matrix configs): median 3.00%, worst 4.00%"
          in text), text
  assert "peak_no_overhead (1 toy configs, outside the targets): median " \
         "39.00%" in text


def test_bad_only_is_one_line_error(tmp_path):
  out = tmp_path / "v.md"
  proc = subprocess.run(
      [sys.executable, "-m", "experiments.validation_matrix", "--only=3,x",
       f"--out={out}"], capture_output=True, text=True)
  assert proc.returncode != 0
  assert "'x' is not a config index; valid: 0 to" in proc.stderr
  assert "Traceback" not in proc.stderr and not out.exists()


def test_from_jsonl_rewrites_the_table(tmp_path):
  src, out = tmp_path / "r.jsonl", tmp_path / "v.md"
  row = _row("gpt2", 0.01, 0.0, False)
  row["config"].update(topology="v5p-8", mesh="4x1", batch=8, seq=128,
                       remat="full", optimizer="adamw")
  row["symbolic"] = {"arguments": 1, "temp": 1, "peak": 1}
  row["compiled"].update(argument_bytes=1, temp_bytes=1)
  row["collectives"] = {"symbolic_bytes": 1, "hlo_bytes": 1,
                        "relative_error": 0.0}
  src.write_text(json.dumps(row) + "\n")
  proc = subprocess.run(
      [sys.executable, "-m", "experiments.validation_matrix",
       f"--from_jsonl={src}", f"--out={out}"], capture_output=True, text=True)
  assert proc.returncode == 0, proc.stderr[-2000:]
  text = out.read_text()
  assert "| 0 | gpt2 | v5p-8 | 4x1 | 8 | 128 | full | adamw |" in text
  assert "+1.00%" in text
