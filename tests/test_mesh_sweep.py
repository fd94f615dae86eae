"""experiments.mesh_sweep end to end on the tiny model: results.jsonl, resume,
TensorBoard event files read back with EventAccumulator, bad flags."""

import io
import json
import os
import subprocess
import sys

import pytest
from tensorboard.backend.event_processing import event_accumulator as ea

from experiments import mesh_sweep
from experiments.results import ResultsFile
from simulator import search

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SPEC = search.SweepSpec(model="tiny", topology="v5p-8", batches=(4, 8),
                        remats=("full",), seq=32)


@pytest.fixture(scope="module")
def swept(tmp_path_factory):
  logdir = str(tmp_path_factory.mktemp("runs"))
  import io
  out = io.StringIO()
  sweep = mesh_sweep.run_sweep(SPEC, logdir, "t", top_k=1, progress=False,
                               out=out)
  return logdir, sweep, out.getvalue()


@pytest.fixture(scope="module")
def run(swept):
  logdir, sweep, out = swept
  return logdir, sweep.run_dir, out


def test_json_summary_is_the_ranked_results(swept):
  """What --format=json prints: run paths, the recommendation, every record
  best first."""
  sweep = swept[1]
  j = json.loads(json.dumps(sweep.to_json(), default=str))
  assert j["recommendation"].startswith("recommended: mesh")
  assert j["results"] == os.path.join(sweep.run_dir, "results.jsonl")
  assert os.path.isdir(j["tensorboard"])
  assert sorted(map(search.record_key, j["ranked"])) == sorted(
      map(search.record_key, _lines(sweep.run_dir)))
  assert j["ranked"] == search.rank(j["ranked"])


def _lines(run_dir):
  with open(os.path.join(run_dir, "results.jsonl")) as f:
    return [json.loads(l) for l in f]


def test_one_line_per_config_with_the_issue_fields(run):
  _, run_dir, out = run
  lines = _lines(run_dir)
  assert len(lines) == len(SPEC.configs(search.parse_topology("v5p-8")))
  assert len({search.record_key(r) for r in lines}) == len(lines)
  for f in ("X", "Y", "batch", "remat", "shard", "optimizer", "fits", "status"):
    assert all(f in r for r in lines)
  confirmed = [r for r in lines if "compiled_peak_bytes" in r]
  assert len(confirmed) == 1 and confirmed[0]["compiled_peak_bytes"] > 0
  assert "recommended: mesh" in out.splitlines()[-3]


def test_resume_redoes_and_duplicates_nothing(run, tmp_path):
  logdir, run_dir, _ = run
  # Simulate an interruption: keep two lines and a torn third.
  lines = open(os.path.join(run_dir, "results.jsonl")).read().splitlines()
  d = tmp_path / "r"
  d.mkdir()
  (d / "results.jsonl").write_text("\n".join(lines[:2]) + "\n" + lines[2][:10])
  (d / mesh_sweep.RUN_SETTINGS).write_text(
      open(os.path.join(run_dir, mesh_sweep.RUN_SETTINGS)).read())
  import io
  out = io.StringIO()
  mesh_sweep.run_sweep(SPEC, str(tmp_path), "r", resume=True, top_k=0,
                       progress=False, out=out)
  assert f"{len(lines) - 2} configs to evaluate" in out.getvalue()
  again = ResultsFile(str(d / "results.jsonl"), search.record_key).load()
  assert sorted(map(search.record_key, again)) == sorted(
      search.record_key(json.loads(l)) for l in lines)
  out = io.StringIO()
  mesh_sweep.run_sweep(SPEC, str(tmp_path), "r", resume=True, top_k=0,
                       progress=False, out=out)
  assert "0 configs to evaluate" in out.getvalue()
  assert len(open(d / "results.jsonl").read().splitlines()) == len(lines)


def test_a_new_run_never_overwrites(run):
  logdir, run_dir, _ = run
  assert mesh_sweep.run_dir_for(logdir, "t", resume=False).endswith("t-2")


def _acc(path):
  a = ea.EventAccumulator(path, size_guidance={ea.TENSORS: 0, ea.IMAGES: 0,
                                                 ea.SCALARS: 0})
  a.Reload()
  return a


def test_event_files_hold_what_results_jsonl_holds(run):
  _, run_dir, _ = run
  records = {search.record_key(r): r for r in _lines(run_dir)}
  tb = os.path.join(run_dir, "tensorboard")
  top = _acc(tb)
  tags = top.Tags()
  assert {"memory/breakdown", "perf/mfu_heatmap"} <= set(tags["tensors"])
  png = top.Tensors("memory/breakdown")[0].tensor_proto.string_val[2]
  assert png.startswith(b"\x89PNG")
  table = top.Tensors("sweep/ranked_table")[0].tensor_proto.string_val[0].decode()
  rows = [l for l in table.splitlines() if l.split()[:1] and (
      l.split()[0].isdigit() or l.startswith("rank"))]
  assert len(rows) == len(records) + 1  # the header and one per config
  ok = [r for r in records.values() if r["status"] == "ok"]
  for r in ok:
    s = _acc(os.path.join(tb, "sessions",
                          __import__("experiments.tensorboard_writer",
                                     fromlist=["x"]).session_name(r)))
    peak = s.Scalars("memory/peak_gib")[0].value
    assert peak == pytest.approx(r["peak_bytes"] / 2**30, rel=1e-6)
    assert s.Scalars("perf/mfu")[0].value == pytest.approx(r["mfu"], rel=1e-6)
  from experiments.tensorboard_writer import series_name
  r = ok[0]
  c = _acc(os.path.join(tb, "curves"))
  steps = {e.step: e.value for e in c.Scalars(f"perf/mfu/{series_name(r)}")}
  assert steps[r["batch"]] == pytest.approx(r["mfu"], rel=1e-6)
  assert "custom_scalars__config__" in top.Tags()["tensors"]


def _cli(*args):
  env = dict(os.environ, JAX_PLATFORMS="cpu")
  return subprocess.run([sys.executable, "-m", "experiments.mesh_sweep", *args],
                        cwd=ROOT, env=env, capture_output=True, text=True,
                        timeout=60)


@pytest.mark.parametrize("args,needle", [
    (["--model=nope"], "unknown model"),
    (["--topology=v5p-7"], "v5p"),
    (["--batches=4,x"], "integer"),
    (["--remats=sometimes"], "remat"),
    (["--shards=zero9"], "shard"),
    (["--top_k=-1"], "top_k"),
    (["--trace_workers=-1"], "--trace_workers=-1 must be >= 0"),
    (["--bogus=1"], "bogus"),
    (["--run_name=../../x"], "plain folder name"),
    (["--run_name=/tmp/abs"], "plain folder name"),
    (["--model=gpt2", "--seq=2048"], "1024 learned positions"),
    (["--capacity_factor=1.25"], "has no mixture of experts"),
    (["--target_seq=64"], "has no encoder"),
    (["--topology=v5e-16x2", "--maxtext=model_name=tiny "
      "per_device_batch_size=1", "--dps=1"], "--dps=1 and --maxtext (which "
     "sets --dps=2) are both given"),
])
def test_bad_flags_one_line_exit_2_before_work(args, needle, tmp_path):
  p = _cli(*args, f"--logdir={tmp_path}")
  assert p.returncode == 2
  assert p.stderr.startswith("error:") and needle in p.stderr
  assert "Traceback" not in p.stderr
  assert not list(tmp_path.iterdir())  # no run folder: nothing started


def _sweep_importing(args: list[str], modules: tuple[str, ...]):
  """mesh_sweep with `args` in a fresh interpreter: (its process, which of
  `modules` it imported)."""
  probe = "\n".join([
      "import runpy, sys",
      f"sys.argv = ['mesh_sweep', *{args!r}]",
      "try:",
      "  runpy.run_module('experiments.mesh_sweep', run_name='__main__')",
      "except SystemExit as e:",
      "  assert not e.code, e.code",
      f"print(sorted(m for m in {modules!r} if m in sys.modules), "
      "file=sys.stderr)"])
  p = subprocess.run([sys.executable, "-c", probe], cwd=ROOT,
                     env=dict(os.environ, JAX_PLATFORMS="cpu"),
                     capture_output=True, text=True, timeout=60)
  assert p.returncode == 0, p.stderr
  return p, p.stderr.strip().splitlines()[-1]


def test_a_sweep_read_from_its_cache_imports_no_jax(tmp_path):
  """A repeated sweep answers from its cache without importing jax, flax,
  optax or the estimators (meshes.quiet.quiet_jax_import, simulator.search),
  and writes the same results as the sweep that traced."""
  args = ["--model=tiny", "--topology=v5p-8", "--batches=4,8",
          "--remats=full", "--seq=32", "--top_k=0", "--noprogress",
          f"--cache_dir={tmp_path / 'cache'}", f"--logdir={tmp_path / 'runs'}"]
  cold = _cli(*args, "--run_name=first")
  assert cold.returncode == 0
  assert "evaluated: 0 of 6 records from the cache" in cold.stdout
  p, imported = _sweep_importing(
      [*args, "--run_name=second"], ("jax", "flax", "optax",
                                     "simulator.memory.estimate",
                                     "simulator.group_estimate"))
  assert imported == "[]"
  assert "evaluated: 6 of 6 records from the cache; 0 groups' traces read " \
      "from it as data; 0 traces" in p.stdout
  first, second = (_lines(str(tmp_path / "runs" / n))
                   for n in ("first", "second"))
  assert sorted(map(json.dumps, first)) == sorted(map(json.dumps, second))


def test_a_sweep_reading_its_groups_from_the_cache_imports_no_jax(tmp_path):
  """Another --hbm_fraction misses the records but reads each group's
  estimators from the cache as data (simulator.group_estimate): without
  importing jax, flax or optax, and with the records a sweep that traces
  writes."""
  args = ["--model=tiny", "--topology=v5p-8", "--batches=4,8",
          "--remats=full", "--seq=32", "--top_k=0", "--noprogress",
          f"--logdir={tmp_path / 'runs'}"]
  cache = f"--cache_dir={tmp_path / 'cache'}"
  assert _cli(*args, cache, "--run_name=first").returncode == 0
  p, imported = _sweep_importing(
      [*args, cache, "--run_name=second", "--hbm_fraction=0.5"],
      ("jax", "flax", "optax"))
  assert imported == "[]"
  assert "evaluated: 0 of 6 records from the cache; 2 groups' traces read " \
      "from it as data; 0 traces" in p.stdout
  traced = _cli(*args, "--cache_dir=", "--run_name=third",
                "--hbm_fraction=0.5")
  assert traced.returncode == 0
  second, third = ([{k: v for k, v in r.items() if k != "eval_s"}
                     for r in _lines(str(tmp_path / "runs" / n))]
                    for n in ("second", "third"))
  assert sorted(map(json.dumps, second)) == sorted(map(json.dumps, third))


def test_remat_list_keeps_names_commas():
  assert mesh_sweep.join_remats(["full", "names:qkv", "mlp_in", "dots"]) == (
      "full", "names:qkv,mlp_in", "dots")
  assert mesh_sweep.join_remats(
      ["names:qkv", "mlpwi+offload:decoder_layer_input", "out_proj", "full"]
  ) == ("names:qkv,mlpwi+offload:decoder_layer_input,out_proj", "full")


def test_resume_continues_exactly_the_run_named(tmp_path):
  """--resume of tiny-v5p-1 must not pick tiny-v5p-16 (a name it prefixes);
  it takes the run itself or its numbered copies (tiny-v5p-1-2)."""
  for name in ("tiny-v5p-16", "tiny-v5p-1", "tiny-v5p-1-2"):
    (tmp_path / name).mkdir()
  os.utime(tmp_path / "tiny-v5p-16", (2e9, 2e9))  # the newest by far
  found = mesh_sweep.run_dir_for(str(tmp_path), "tiny-v5p-1", resume=True)
  assert os.path.basename(found) in ("tiny-v5p-1", "tiny-v5p-1-2")
  with pytest.raises(ValueError, match="no run 'tiny-v5p-2'"):
    mesh_sweep.run_dir_for(str(tmp_path), "tiny-v5p-2", resume=True)


def test_resume_with_other_settings_is_refused(tmp_path):
  """The run's results depend on --seq: a resume with another value would
  report the old results as the new ones."""
  logdir = str(tmp_path)
  mesh_sweep.run_sweep(SPEC, logdir, "t", top_k=0, progress=False,
                       out=open(os.devnull, "w"))
  other = search.SweepSpec(model="tiny", topology="v5p-8", batches=(4, 8),
                           remats=("full",), seq=64)
  with pytest.raises(ValueError, match="made with --seq=32, this command has "
                     "--seq=64"):
    mesh_sweep.run_sweep(other, logdir, "t", resume=True, top_k=0,
                         progress=False, out=open(os.devnull, "w"))


def test_resume_of_a_run_whose_settings_file_is_torn_names_it(tmp_path):
  run_dir = tmp_path / "t"
  run_dir.mkdir()
  (run_dir / mesh_sweep.RUN_SETTINGS).write_text('{"model": ')
  with pytest.raises(ValueError, match=r"--resume: .*/t/run.json is not the "
                     r"JSON a run writes \(Expecting value"):
    mesh_sweep.check_run_settings(str(run_dir), SPEC)


def test_resume_of_results_without_their_settings_is_refused(tmp_path):
  """Results whose run.json is gone could be of any --seq: not resumed as
  this command's."""
  run_dir = tmp_path / "t"
  run_dir.mkdir()
  (run_dir / "results.jsonl").write_text('{"X": 4}\n')
  with pytest.raises(ValueError, match=r"holds results but no run.json"):
    mesh_sweep.check_run_settings(str(run_dir), SPEC)
  (tmp_path / "u").mkdir()
  mesh_sweep.check_run_settings(str(tmp_path / "u"), SPEC)  # a new run
  assert (tmp_path / "u" / mesh_sweep.RUN_SETTINGS).exists()


def test_resume_takes_a_folder_and_a_too_long_name_is_the_run_names(tmp_path):
  (tmp_path / "tiny-v5p-8").write_text("not a run")
  with pytest.raises(ValueError, match="no run 'tiny-v5p-8'"):
    mesh_sweep.run_dir_for(str(tmp_path), "tiny-v5p-8", resume=True)
  with pytest.raises(ValueError, match=r"^--run_name='xxx.*too long"):
    mesh_sweep.run_dir_for(str(tmp_path), "x" * 300, resume=False)


def test_a_run_is_written_by_one_sweep_at_a_time(swept):
  run_dir = swept[1].run_dir
  with mesh_sweep.run_lock(run_dir):
    with pytest.raises(ValueError, match="being written by another"):
      with mesh_sweep.run_lock(run_dir):
        pass


def test_ctrl_c_stops_cleanly_and_says_how_to_resume(tmp_path, monkeypatch,
                                                    capsys):
  """Ctrl-C in the middle of a sweep: exit 130 with one line saying where
  the results are and how to continue; the lines written stay whole."""
  real = mesh_sweep._sweep

  def interrupted(spec, cfg, topo, run_dir, *args):
    first = spec.configs(topo)[0]  # written, then Ctrl-C
    record = next(search.Sweep(spec, cfg, topo).evaluate([first]))
    ResultsFile(os.path.join(run_dir, "results.jsonl"),
                search.record_key).append(record)
    raise KeyboardInterrupt

  monkeypatch.setattr(mesh_sweep, "_sweep", interrupted)
  with pytest.raises(SystemExit) as stop:
    mesh_sweep.run_sweep(SPEC, str(tmp_path), "c", top_k=0, progress=False,
                         out=open(os.devnull, "w"))
  assert stop.value.code == 130
  err = capsys.readouterr().err
  assert "interrupted: the results so far are kept in" in err
  assert "--resume" in err
  monkeypatch.setattr(mesh_sweep, "_sweep", lambda *a: (_ for _ in ()).throw(
      KeyboardInterrupt))  # before any config finished: no results to name
  with pytest.raises(SystemExit):
    mesh_sweep.run_sweep(SPEC, str(tmp_path), "d", top_k=0, progress=False,
                         out=open(os.devnull, "w"))
  assert "interrupted: no config had finished" in capsys.readouterr().err
  monkeypatch.setattr(mesh_sweep, "_sweep", real)
  run = mesh_sweep.run_sweep(SPEC, str(tmp_path), "c", resume=True, top_k=0,
                             progress=False, out=open(os.devnull, "w"))
  assert len(_lines(run.run_dir)) == len(SPEC.configs(
      search.parse_topology("v5p-8")))  # resumed, nothing duplicated


def test_confirmations_in_two_workers_then_from_the_cache(tmp_path):
  """--workers compiles plans in parallel processes; the same sweep again
  (a new run, the same cache) confirms them without compiling."""
  cache = str(tmp_path / "cache")
  first = mesh_sweep.run_sweep(SPEC, str(tmp_path), "a", top_k=2, workers=2,
                               progress=False, out=io.StringIO(),
                               cache_dir=cache)
  confirmed = [r for r in first.ranked if "compiled_peak_bytes" in r]
  assert len(confirmed) == 2 and not any(r.get("from_cache") for r in confirmed)
  out = io.StringIO()
  again = mesh_sweep.run_sweep(SPEC, str(tmp_path), "b", top_k=2,
                               progress=False, out=out, cache_dir=cache)
  cached = [r for r in again.ranked if "compiled_peak_bytes" in r]
  assert [r["compiled_peak_bytes"] for r in cached] == [
      r["compiled_peak_bytes"] for r in confirmed]
  assert all(r["from_cache"] for r in cached)
  assert "compiling" not in out.getvalue()  # nothing left to compile


def test_confirmations_on_a_local_ray_instance(tmp_path):
  """--ray_address=local starts Ray here; the confirmation runs as a Ray
  task and comes back like a local one."""
  out = io.StringIO()
  run = mesh_sweep.run_sweep(SPEC, str(tmp_path), "ray", top_k=1,
                             progress=False, out=out, ray_address="local")
  assert "on the Ray cluster (1 CPUs)" in out.getvalue()
  confirmed = [r for r in run.ranked if "compiled_peak_bytes" in r]
  assert len(confirmed) == 1 and confirmed[0]["compiled_peak_bytes"] > 0


def test_a_logdir_no_run_can_be_made_in_names_the_flag(tmp_path):
  """A --logdir under a file: a one-line error naming the flag, before
  anything is written."""
  blocker = tmp_path / "file"
  blocker.write_text("")
  with pytest.raises(ValueError, match=r"--logdir=.*/file/runs: Not a "
                     r"directory .*; give a folder a run can be made in"):
    mesh_sweep.run_dir_for(str(blocker / "runs"), "t", resume=False)


def test_resume_at_another_gpu_pool_share_is_refused(tmp_path, monkeypatch):
  """What fits on a GPU turns on XLA_PYTHON_CLIENT_MEM_FRACTION: a resume
  at another share would mix verdicts in one run's results."""
  spec = search.SweepSpec(model="tiny", topology="h100:8", batches=(8,))
  run_dir = tmp_path / "t"
  run_dir.mkdir()
  mesh_sweep.check_run_settings(str(run_dir), spec)  # JAX's default, 0.75
  mesh_sweep.check_run_settings(str(run_dir), spec)
  monkeypatch.setenv("XLA_PYTHON_CLIENT_MEM_FRACTION", "0.9")
  with pytest.raises(ValueError, match=r"made with the pool share \(XLA_"
                     r"CLIENT_MEM_FRACTION\)=0.75, this command has the pool "
                     r"share \(XLA_CLIENT_MEM_FRACTION\)=0.9"):
    mesh_sweep.check_run_settings(str(run_dir), spec)


def test_a_config_json_sweep_runs_under_logdir_and_nothing_evaluated_is_an_error(
    tmp_path):
  """--model=PATH names the run by the model (the config's file name), under
  --logdir, not beside the config; a sweep where no plan could be evaluated
  (here every mesh of v5p-8 refused: 3 heads on Y=2 or 4, batch 3 on X=2 or
  4) says so and exits 2, its rows kept."""
  model = tmp_path / "models" / "three_heads.json"
  model.parent.mkdir()
  model.write_text(json.dumps({
      "model_type": "llama", "hidden_size": 6, "intermediate_size": 8,
      "num_attention_heads": 3, "num_hidden_layers": 1, "vocab_size": 16}))
  logdir = tmp_path / "runs"
  p = _cli(f"--model={model}", "--topology=v5p-8", "--batches=3", "--seq=16",
           "--top_k=0", f"--logdir={logdir}", "--cache_dir=", "--noprogress")
  assert p.returncode == 2, p.stderr
  assert p.stderr.strip().splitlines()[-1].startswith(
      "error: no config could be evaluated (3 failed; each one's error is in "
      f"{logdir}/three_heads-v5p-8/results.jsonl); the first: ")
  assert "Traceback" not in p.stderr
  assert sorted(os.listdir(model.parent)) == ["three_heads.json"]
  assert len((logdir / "three_heads-v5p-8" / "results.jsonl").read_text()
             .splitlines()) == 3


def test_a_sweep_no_mesh_lays_out_names_the_replicas_that_do(tmp_path):
  """6 wide with 3 heads on 8 chips: X divides 6 (1, 2), Y the heads (1,
  3), so no X x Y = 8 lays out; with D replicas outermost D x X x Y = 8
  does at D = 4 (2x1, batch 8 over D x X) and 8 (1x1), not at 2. The
  error says so, and --dps=4 then sweeps a plan that fits."""
  model = tmp_path / "three_heads.json"
  model.write_text(json.dumps({
      "model_type": "llama", "hidden_size": 6, "intermediate_size": 8,
      "num_attention_heads": 3, "num_hidden_layers": 1, "vocab_size": 16}))
  args = (f"--model={model}", "--topology=v5p-16", "--batches=8", "--seq=16",
          "--top_k=0", f"--logdir={tmp_path}", "--cache_dir=", "--noprogress")
  p = _cli(*args)
  assert p.returncode == 2, p.stderr
  assert p.stderr.strip().splitlines()[-1].endswith(
      "; with data-parallel replicas outermost (D x X x Y = 8) plans lay out "
      "at --dps=4,8")
  p = _cli(*args, "--dps=4", "--run_name=replicas")
  assert p.returncode == 0, p.stderr
  assert "recommended: mesh D4x2x1 " in p.stdout


def test_a_multi_host_sweep_says_which_axis_crosses_the_hosts(tmp_path):
  p = _cli("--model=tiny", "--topology=h100:2x8", "--batches=16", "--seq=64",
           "--top_k=0", f"--logdir={tmp_path}", "--cache_dir=", "--noprogress")
  assert p.returncode == 0, p.stderr
  line = next(l for l in p.stdout.splitlines() if l.startswith("across "))
  assert line.startswith("across hosts (InfiniBand") and (
      "16x1 X over 2 hosts" in line)
