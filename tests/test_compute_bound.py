"""experiments.compute_bound end to end: seed 004 flags, JSON, bad flags."""

import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SEED = ["--model=xxl_ffn", "--topology=v5p-128", "--mesh=16x4", "--m_x=2",
        "--m_y=1", "--flops_per_chip=4.6e14", "--ici_link_bandwidth=9e10",
        "--wraparound=yes", "--pass=forward", "--remat=none", "--seq=64",
        "--nowindowed_einsum"]


def _run(*args):
  env = dict(os.environ, JAX_PLATFORMS="cpu")
  return subprocess.run([sys.executable, "-m", "experiments.compute_bound",
                         *args], cwd=ROOT, env=env, capture_output=True,
                        text=True, timeout=120)


def test_seed_004_json():
  r = _run(*SEED, "--format=json")
  assert r.returncode == 0, r.stderr
  out = json.loads(r.stdout)
  row = next(m for m in out["meshes"] if (m["X"], m["Y"]) == (16, 4))
  assert (row["M_X"], row["M_Y"]) == (2, 1)
  assert round(row["threshold_tokens_per_device"]) == 1581
  assert round(row["threshold_tokens_global"]) == 25302
  assert round(out["optimum_continuous"]["tokens_global"]) == 15699
  assert abs(out["optimum_continuous"]["Y"] - 10.418) < 0.01
  assert out["best_integer"] == {"X": 8, "Y": 8, "tokens_global": 16593}
  assert len(out["meshes"]) == 7


def test_by_default_the_seeds_reduce_scatter_is_libtpus_windowed_loop():
  """Without --nowindowed_einsum the XXL stack's reduce-scatter over Y
  (f = 53248, past v5p's 4224) is libtpu's loop: 1.25 V of
  collective-permutes at Y = 4, overlappable, so the threshold moves."""
  r = _run(*[a for a in SEED if a != "--nowindowed_einsum"], "--format=json")
  assert r.returncode == 0, r.stderr
  out = json.loads(r.stdout)
  loops = [c for c in out["collectives"] if c["windowed"]]
  assert [(c["kind"], c["axis"], c["phase"]) for c in loops] == [
      ("permute", "Y", "forward")]
  assert loops[0]["overlappable"]
  row = next(m for m in out["meshes"] if (m["X"], m["Y"]) == (16, 4))
  assert round(row["threshold_tokens_per_device"]) != 1581


def test_bad_flags_exit_2_one_line():
  for args in (["--mesh=5x5"], ["--model=nope"], ["--pass=sideways"],
               ["--flops_per_chip=-1"], ["--m_x=0", "--mesh=16x4"],
               ["--m_x=5", "--mesh=16x4"], ["--ici_link_bandwidth=-1"],
               ["--tokens=nan"], ["--tokens=inf"], ["--tokens=0"],
               ["--topology=h100:8", "--model=tiny", "--ring=exact"],
               ["--topology=h100:8", "--model=tiny", "--m_y=1"],
               ["--topology=h100:8", "--model=tiny", "--nowindowed_einsum"],
               ["--dp=3"], ["--dp=2", "--mesh=64x1"]):
    r = _run(*args)
    assert r.returncode == 2, (args, r.stderr)
    lines = [l for l in r.stderr.splitlines() if l.startswith("error:")]
    assert len(lines) == 1 and "Traceback" not in r.stderr, (args, r.stderr)


def test_replicas_sum_their_gradients_over_dcn():
  """--dp=2 on two slices: each X x Y mesh is one replica's; the
  gradients' sums over D run over DCN, on each device's shard."""
  r = _run("--model=tiny", "--topology=v5e-16x2", "--dp=2", "--mesh=16x1",
           "--batch=32", "--seq=64", "--format=json")
  assert r.returncode == 0, r.stderr
  out = json.loads(r.stdout)
  assert out["dp"] == 2 and out["collectives_mesh"] == "D2x16x1"
  assert {(m["X"], m["Y"]) for m in out["meshes"]} >= {(16, 1), (8, 2)}
  over_d = [c for c in out["collectives"] if c["axis"] == "D"]
  assert over_d and {c["kind"] for c in over_d} == {"all-reduce"}


def test_meshes_the_batch_does_not_split_over_are_named():
  """The step and MFU columns are at the batch's tokens; where X (times
  the micro-batches) does not divide the batch, the report says so for
  those meshes, not for the others."""
  r = _run("--model=tiny", "--topology=v5p-16", "--batch=3", "--seq=64",
           "--format=json")
  assert r.returncode == 0, r.stderr
  splits = {(m["X"], m["Y"]): m["batch_splits"]
            for m in json.loads(r.stdout)["meshes"] if "error" not in m}
  assert splits == {(4, 2): False, (8, 1): False}  # 1x8, 2x4: Y over 2 heads
  r = _run("--model=tiny", "--topology=v5p-16", "--batch=8", "--seq=64",
           "--format=json")
  assert all(m["batch_splits"] for m in json.loads(r.stdout)["meshes"]
             if "error" not in m)
  text = _run("--model=tiny", "--topology=v5p-16", "--batch=3", "--seq=64")
  assert "batch 3 does not split over X on 4x2, 8x1 (" in text.stdout
  assert ("as if the batch split over X; give a batch X divides for a plan "
          "that runs\n") in text.stdout  # the sentence ends


def test_a_chip_whose_published_runs_it_misses_carries_a_caveat():
  """v6e: the four held-out Trillium runs come out 13-34 points slow; the
  report says so (text and JSON); v5p's anchors carry none."""
  flags = ("--model=tiny", "--batch=8", "--seq=64")
  v6e = _run(*flags, "--topology=v6e-8", "--format=json")
  assert v6e.returncode == 0, v6e.stderr
  assert "Trillium" in json.loads(v6e.stdout)["step_time_caveat"]
  assert json.loads(_run(*flags, "--topology=v5p-8", "--format=json").stdout
                    )["step_time_caveat"] is None
  assert "note: MaxText's four published Trillium runs" in _run(
      *flags, "--topology=v6e-8").stdout


def test_the_continuous_optimum_rescales_a_mesh_with_both_axes_over_one():
  """--mesh with Y=1 traces no Y collectives: the optimum rescales the best
  split with both axes over 1 and says so; with none (one chip) there is
  none. --pp is refused with where pipelined plans are timed."""
  r = _run("--model=tiny", "--topology=v5p-16", "--batch=8", "--seq=64",
           "--mesh=8x1", "--format=json")
  assert r.returncode == 0, r.stderr
  out = json.loads(r.stdout)
  assert out["collectives_mesh"] == "8x1"
  x, y = map(int, out["optimum_continuous"]["rescaled_mesh"].split("x"))
  assert x > 1 and y > 1
  one = _run("--model=tiny", "--topology=h100:1", "--batch=8", "--seq=64")
  assert one.returncode == 0, one.stderr
  assert "continuous optimum: none (no mesh here has X and Y both over 1" \
      in one.stdout
  pp = _run("--model=tiny", "--topology=v5p-16", "--pp=2", "--mesh=2x2")
  assert pp.returncode == 2 and pp.stderr.startswith(
      "error: pp=2: compute_bound times X x Y meshes")


def test_each_mesh_says_which_axis_crosses_the_network():
  """Over 2 hosts of 8 GPUs: Y=16 spans both hosts, X=2 does; JSON holds
  X_hosts and Y_hosts per mesh."""
  r = _run("--model=tiny", "--topology=h100:2x8", "--batch=16", "--seq=64",
           "--format=json")
  assert r.returncode == 0, r.stderr
  hosts = {(m["X"], m["Y"]): (m["X_hosts"], m["Y_hosts"])
           for m in json.loads(r.stdout)["meshes"]}
  assert hosts[(1, 16)] == (1, 2) and hosts[(2, 8)] == (2, 1)
  text = _run("--model=tiny", "--topology=h100:2x8", "--batch=16", "--seq=64")
  assert "1x16 Y over 2 hosts; 2x8 X over 2 hosts" in text.stdout
