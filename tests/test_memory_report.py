"""experiments.memory_report: JSON schema, text table, one-line errors."""

import json
import re
import os
import subprocess
import sys

import pytest

from experiments import memory_report
from meshes.layout import plan_mesh
from meshes.topology import parse_topology
from models.registry import load_model
from simulator import memory
from simulator.settings import TrainSettings

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
KEYS = {"params", "grads", "optimizer", "activations", "overhead", "peak"}
AT_PEAK = {"params", "optimizer", "batch", "tile_padding", "grads",
           "activations", "logits", "temporaries"}


def _run(*args):
  env = {**os.environ, "JAX_PLATFORMS": "cpu"}
  return subprocess.run([sys.executable, "-m", "experiments.memory_report",
                         *args], cwd=ROOT, env=env, capture_output=True,
                        text=True, timeout=120)


def test_json_schema_and_text():
  common = ["--model=tiny", "--topology=v5p-8", "--mesh=2x2", "--batch=4",
            "--seq=64", "--remat=offload:qkv", "--attention=materialized",
            "--optimizer=adamw", "--precision=mixed", "--shard=zero3"]
  out = _run(*common, "--format=json")
  assert out.returncode == 0, out.stderr
  data = json.loads(out.stdout)
  assert set(data["per_device_bytes"]) == KEYS
  assert all(type(v) is int for v in data["per_device_bytes"].values())
  for key, kind in (("host_bytes", int), ("hbm_bytes", int), ("fits", bool),
                    ("eta_mem", float), ("headroom_bytes", int)):
    assert type(data[key]) is kind
  assert data["host_bytes"] > 0
  assert data["schema_version"] == 2 and set(data["at_peak"]) == AT_PEAK
  assert sum(data["at_peak"].values()) == data["compiled_comparable_peak"]
  assert data["per_device_bytes"]["peak"] == (
      data["compiled_comparable_peak"] + data["per_device_bytes"]["overhead"])
  assert data["peak_where"] and data["peak_buffers"]
  assert {"name", "shape", "dtype", "bytes", "category"} <= set(
      data["peak_buffers"][0])
  text = _run(*common)
  assert text.returncode == 0, text.stderr
  assert "GiB" in text.stdout and "% HBM" in text.stdout
  assert f"the live set at {data['peak_where']}" in text.stdout
  assert "with the 10% planning overhead" in text.stdout
  assert "max_batch --frontier=N" in text.stdout  # the schedules differ
  # Host memory: per device, pinned, per host VM (4 v5p chips), and seed
  # 003's pinned-memory rules for the same parameter count beside it.
  assert data["pinned_host_bytes"] == data["host_bytes"]
  assert data["host_ram_bytes"] == 4 * data["host_bytes"]
  assert "of it pinned (memory kind pinned_host)" in text.stdout
  assert "(4 devices per host machine" in text.stdout
  assert "ZeRO-3 offload_param=cpu : 6Ψ" in text.stdout
  assert "ZeRO-3 offload_param=none: 4Ψ" in text.stdout


def test_schedule_lines_say_how_to_see_xlas_choice_where_they_differ():
  e = memory.memory_report(load_model("tiny"), TrainSettings(batch=4, seq=64),
                           plan_mesh(parse_topology("v5p-8"), 2, 2))
  peaks = [b for b, kept in e.schedule_peaks().values() if kept]
  lines = memory_report.schedule_lines(e)
  assert len(lines) == 1 + len(e.schedule_peaks()) + 5 and len(peaks) == 2
  assert peaks[0] != peaks[1] and "--frontier=N" in lines[-1]
  assert any("schedule_replay" in l for l in lines[-3:])
  assert any("--memory_scheduler=list" in l for l in lines[-5:])


def test_bad_flags_one_line_exit_2():
  for args in (["--mesh=3x2", "--topology=v5p-8", "--model=tiny"],
               ["--model=nope"], ["--remat=names:bogus", "--model=tiny",
                                  "--topology=v5p-8"]):
    out = _run(*args)
    assert out.returncode == 2, (args, out.stderr)
    assert out.stdout == ""
    errors = [l for l in out.stderr.splitlines() if l.startswith("error:")]
    assert len(errors) == 1 and "Traceback" not in out.stderr


def test_each_schedule_is_shown_and_the_peak_is_the_largest_kept():
  """The report lists each simulated schedule of the weight gradients with
  its peak; the peak is the largest kept, and a deferred schedule over XLA's
  rematerialization limit is shown dropped."""
  import dataclasses
  from experiments import memory_report
  from meshes.layout import plan_mesh
  from meshes.topology import parse_topology
  from models.registry import load_model
  from simulator import memory
  from simulator.settings import TrainSettings
  est = memory.memory_report(load_model("tiny"),
                             TrainSettings(batch=8, seq=64, remat="full"),
                             plan_mesh(parse_topology("v5p-8"), 4, 1))
  peaks = est.schedule_peaks()
  assert set(peaks) == {"deferred", "traced"}
  assert max(b for b, kept in peaks.values() if kept) == (
      est.compiled_comparable_peak)
  text = "\n".join(memory_report.schedule_lines(est))
  assert "weight gradients deferred" in text and "traced order" in text
  (deferred, _), (traced, _) = peaks["deferred"], peaks["traced"]
  assert deferred > traced  # the logits gradient held through the layers
  limited = dataclasses.replace(est, remat_limit_bytes=(deferred + traced) // 2)
  assert limited.schedule_peaks()["deferred"] == (deferred, False)
  assert "dropped" in "\n".join(memory_report.schedule_lines(limited))


def test_replicas_hold_the_weights_of_their_x_shards():
  """--dp=2 across two slices (D2x16x1) holds each weight over X's 16
  alone: twice the parameters and optimizer state per device of FSDP over
  all 32 chips, the same activations per device."""
  def per_device(*mesh):
    r = _run("--model=gpt2", "--topology=v5e-16x2", "--batch=32",
             "--seq=256", "--format=json", *mesh)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)["per_device_bytes"]
  replicas, fsdp = per_device("--dp=2", "--mesh=16x1"), per_device(
      "--mesh=32x1")
  for kind in ("params", "optimizer"):
    assert replicas[kind] == pytest.approx(2 * fsdp[kind], rel=0.02), kind
  assert replicas["activations"] == fsdp["activations"]


def test_gpu_report_names_xlas_memory_limit():
  """On a GPU the report gives XLA:GPU's own limit within the pool and says
  when the simulated peak is above it (#173's plan on an H200: XLA logged
  100.24 GiB and could not come under it)."""
  args = ["--model=llama2_7b", "--topology=h200:1", "--mesh=1x1",
          "--batch=16", "--seq=2048", "--remat=dots", "--optimizer=adafactor",
          "--precision=bf16"]
  text = _run(*args)
  assert text.returncode == 0, text.stderr[-2000:]
  assert ("XLA:GPU schedules within the arguments + 95% of the rest of the "
          "pool = 100.237 GiB") in text.stdout
  assert "the simulated peak is above it" in text.stdout
  out = json.loads(_run(*args, "--format=json").stdout)
  assert out["gpu_memory"]["xla_memory_limit_bytes"] == (
      out["arguments_bytes"] + (out["gpu_memory"]["pool_bytes"]
                                - out["arguments_bytes"]) * 95 // 100)
  small = _run(*args[:3], "--batch=4", *args[4:])
  assert "XLA:GPU schedules within" in small.stdout
  assert "the simulated peak is above it" not in small.stdout


def test_gpu_report_says_when_the_arguments_alone_do_not_fit():
  """llama2_7b's f32 params and AdamW state on one H100 (about 100 GiB)
  are over JAX's 59.33 GiB pool: no XLA limit above the pool is printed."""
  text = _run("--model=llama2_7b", "--topology=h100:1", "--mesh=1x1",
              "--batch=1", "--seq=512")
  assert text.returncode == 0, text.stderr[-2000:]
  assert re.search(r"the step's arguments alone, [\d.]+ GiB, are more than "
                   r"the step may use", text.stdout), text.stdout
  assert "XLA:GPU schedules within" not in text.stdout
