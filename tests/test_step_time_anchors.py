"""experiments.step_time_anchors: MaxText's published runs, predicted."""

import os
import re
import subprocess
import sys

import pytest

from experiments import step_time_anchors
from models.maxtext import maxtext_run
from meshes.topology import parse_topology

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_every_anchor_maps_onto_flags_without_loss():
  """Each anchor's script maps whole but for use_iota_embed (the token
  lookup as a one-hot matmul: 2·V·d FLOPs per token, about 1% of a step
  here, not modelled)."""
  for a in step_time_anchors.ANCHORS:
    topology = parse_topology(a.topology)
    run = maxtext_run(a.maxtext, topology.chips, topology.hosts)
    assert run.unexpressed == ("use_iota_embed=true",), a.name
    assert run.flags.get("dp", "1") == str(topology.hosts), a.name


def test_the_multi_slice_anchors_are_the_v5e_tables_rows():
  """MaxText's v5e table: the four one-slice scripts on 2 to 32 slices,
  each slice a replica (D) of the one-slice mesh."""
  names = [a.name for a in step_time_anchors.ANCHORS]
  assert len(names) == 32 == len(set(names))
  for n in (2, 4, 8, 16, 32):
    assert [f"{s}B v5e-256x{n}" in names for s in (16, 32, 64, 128)] == [
        True] * 4
  row = next(a for a in step_time_anchors.ANCHORS
             if a.name == "64B v5e-256x8")
  assert (row.measured_mfu, row.measured_tflops) == (0.5496, 108)
  predicted = step_time_anchors.predict(row)
  assert predicted["mesh"] == "D8x256x1"


def test_held_out_runs_map_whole():
  """The Trillium runs are FSDP over every chip (llama2-70b's over
  fsdp_transpose), the custom remat policies offload what they name."""
  for a in step_time_anchors.HELD_OUT:
    chips = parse_topology(a.topology).chips
    run = maxtext_run(a.maxtext, chips)
    assert run.unexpressed == () and run.flags["mesh"] == f"{chips}x1", a.name
    if "remat_policy=custom" in a.maxtext:
      assert run.flags["remat"].startswith("offload:decoder_layer_input,qkv")


@pytest.mark.parametrize("model,per_device,seq,step_s,printed", [
    ("llama2_70b", 4, 4096, 17.373, 419.193),
    ("mixtral_8x7b", 12, 4096, 13.360, 305.127),
    ("llama3_1_70b", 5, 8192, 42.656, 462.297),
    ("llama3_1_8b", 3, 8192, 3.443, 413.433),
])
def test_maxtexts_flop_count_reproduces_the_logs(model, per_device, seq,
                                                  step_s, printed):
  """The TFLOP/s/device the tpu-recipes logs print for these steps: no
  input-embedding lookup, a mixture of experts' top-k experts alone."""
  from models.registry import load_model
  flops = step_time_anchors.maxtext_flops_per_device(
      load_model(model), per_device, seq, False)
  assert flops / step_s / 1e12 == pytest.approx(printed, rel=1e-3)


def test_anchors_take_tensor_parallelism_from_their_scripts():
  """The v5e 128B script (configs/largest_job/128b.sh, Oct 2023) sets
  ici_fsdp_parallelism=16 ici_tensor_parallelism=16; the other v5e scripts
  leave both at base.yml's -1 and 1 (pure FSDP over 256 chips)."""
  topology = lambda a: parse_topology(a.topology)
  meshes = {a.name: maxtext_run(a.maxtext, topology(a).chips,
                                topology(a).hosts).flags["mesh"]
            for a in step_time_anchors.ANCHORS}
  assert meshes["128B v5e-256"] == meshes["128B v5e-256x32"] == "16x16"
  assert [meshes[f"{s}B v5e-256"] for s in (16, 32, 64)] == ["256x1"] * 3
  assert meshes["512B v5p-1024"] == "32x16"


def test_maxtexts_flop_count_of_then():
  """6·N·tokens plus the attention term, halved for causality in the v5p
  figures' FLOP count and not in the v5e ones'."""
  from models.registry import load_model
  from models.params import num_params
  cfg = load_model("maxtext2023-16b")
  attention = 12 * 32 * 32 * 256 * 2048 ** 2 * 6
  dense = 6 * num_params(cfg) * 2048 * 6
  full = step_time_anchors.maxtext_flops_per_device(cfg, 6, 2048, False)
  half = step_time_anchors.maxtext_flops_per_device(cfg, 6, 2048, True)
  assert (full, half) == (dense + attention, dense + attention / 2)


def test_the_docs_table_is_what_the_model_predicts():
  """experiments/step_time.md's rows are today's predictions."""
  rows = [step_time_anchors.predict(a) for a in step_time_anchors.ANCHORS]
  held_out = [step_time_anchors.predict(a) for a in step_time_anchors.HELD_OUT]
  text = step_time_anchors.report(rows, 0.0, held_out)
  table = lambda t: [l for l in t.splitlines() if l.startswith("| ")]
  with open(os.path.join(ROOT, "experiments", "step_time.md")) as f:
    kept = f.read()
  assert table(text) == table(kept)
  summary = lambda t: re.sub(r"Run time \d+ s\.", "", t.split("\n\n")[2])
  assert summary(text) == summary(kept)


def test_an_out_file_in_no_folder_is_refused_before_the_run(tmp_path):
  out = tmp_path / "no" / "step_time.md"
  p = subprocess.run([sys.executable, "-m", "experiments.step_time_matrix",
                      f"--out={out}"], cwd=ROOT, capture_output=True,
                     text=True, timeout=120)
  assert p.returncode == 2 and p.stdout == "", p.stdout  # no anchor run
  assert p.stderr.strip() == (f"error: --out='{out}': no folder "
                              f"'{out.parent}'; give a file in an existing "
                              "folder")
