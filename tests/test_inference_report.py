"""experiments.inference_report: JSON, text, one-line errors."""

import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
COMMON = dict(model="tiny", topology="v5p-8", mesh="2x2", batch=4, prompt=16,
              generate=8, attention="materialized")


def _run(*args, env: dict | None = None, **flags):
  """The report with `flags` over COMMON's plan (a --recheck, which takes no
  plan, without it)."""
  env = {**os.environ, "JAX_PLATFORMS": "cpu", **(env or {})}
  plan = {} if "recheck" in flags else COMMON
  flags = [f"--{k}={v}" for k, v in {**plan, **flags}.items()]
  return subprocess.run([sys.executable, "-m", "experiments.inference_report",
                         *flags, *args], cwd=ROOT, env=env,
                        capture_output=True, text=True, timeout=120)


def test_json_and_text():
  out = _run(kv_dtype="int8", format="json")
  assert out.returncode == 0, out.stderr
  data = json.loads(out.stdout)
  # tiny: 2 layers, 2 kv heads of 16; per device 2 sequences, 1 kv head
  assert data["kv_cache_bytes"] == 2 * 2 * 2 * 24 * 1 * (16 + 2)
  assert set(data["phases"]) == {"prefill", "decode"}
  for phase in data["phases"].values():
    assert type(phase["peak_bytes"]) is int
    assert phase["peak_bytes"] >= phase["arguments_bytes"]
  assert data["fits"] is True and data["tokens_per_s"] > 0
  text = _run()
  assert text.returncode == 0, text.stderr
  assert "KV cache (full)" in text.stdout and "tokens/s" in text.stdout


def test_an_encoder_decoder_serves_with_both_caches():
  """tiny_t5 (2 layers, 4 heads of 16): per device 2 sequences and 2 heads,
  the decoder's cache over the 8 generated positions and the
  cross-attention's over the 16 prompt positions, k and v, bf16."""
  out = _run(model="tiny_t5", format="json")
  assert out.returncode == 0, out.stderr
  data = json.loads(out.stdout)
  assert data["kv_cache_bytes"] == 2 * 2 * 2 * (8 + 16) * 2 * 16 * 2
  decode = data["phases"]["decode"]
  assert decode["hbm_bytes"] < data["weights_bytes"] + data["kv_cache_bytes"]
  text = _run(model="tiny_t5")
  assert "prompt 16 (encoded once, cross-attention cache) + generate 8 " \
      "(decoder cache)" in text.stdout, text.stdout


def test_a_gpu_plan_is_simulated_with_xla_gpus_rules():
  """On a GPU the serving steps take XLA:GPU's rules
  (simulator.memory.xla_gpu_rules, held to the kept deviceless compiles
  by tests/test_inference.py): tiny's decode, two queries per kv head,
  holds a copy of a cache stack for its loop and copies of its bf16
  weights' slices; on a TPU neither."""
  names = lambda out: " ".join(b["name"] for b in json.loads(out.stdout)[
      "phases"]["decode"]["peak_buffers"])
  gpu = _run(topology="h100:8", mesh="4x2", batch=8, format="json")
  assert gpu.returncode == 0, gpu.stderr
  assert "copied into another order for its loop" in names(gpu)
  assert "one layer's slice, copied for its matmul" in names(gpu)
  tpu = names(_run(format="json"))
  assert "its loop" not in tpu and "slice" not in tpu
  assert "warning" not in _run(topology="h100:8", mesh="4x2", batch=8).stdout


@pytest.mark.parametrize("flags,message", [
    (dict(kv_dtype="fp8"), "error: flag --kv_dtype=fp8: value should be one "
     "of"),
    (dict(batch=6, mesh="4x1"), "error: batch=6 must be a positive multiple "
     "of 4 (the sequences and their KV cache are split over X=4)"),
    (dict(prompt=0), "error: prompt=0 must be a positive integer"),
    (dict(keep="kept.jsonl"), "error: --keep='kept.jsonl' keeps compiled "
     "steps; add --compile"),
    (dict(part="gpu"), "error: --part='gpu' names a kept row's part; add "
     "--keep"),
    (dict(recheck="no.jsonl"), "error: --recheck='no.jsonl': No such file "
     "or directory; give a file of inference_report --keep rows"),
    (dict(recheck="no.jsonl", compile=True), "error: --recheck='no.jsonl' "
     "re-checks kept compiles; drop --compile"),
    (dict(recheck="no.jsonl", model="tiny", batch=7), "error: --recheck "
     "re-checks every plan its file keeps; drop --model, --batch"),
])
def test_bad_values_are_one_line_errors(flags, message):
  out = _run(**flags)
  assert out.returncode == 2
  assert out.stderr.strip().splitlines()[-1].startswith(message), out.stderr
  assert "Traceback" not in out.stderr


def test_learned_positions_bound_the_cache():
  out = _run(model="gpt2", mesh="4x1", prompt=1000, generate=100)
  assert out.returncode == 2 and "Traceback" not in out.stderr
  assert out.stderr.strip().endswith("choose prompt + generate <= 1024")


def test_a_compiled_plan_is_kept_as_a_row(tmp_path):
  """--keep adds the plan and its compiled steps to a file of kept
  compiles, in the rows tests/test_inference.py re-checks (the arguments
  exact); compiled again, its row is replaced, the other rows kept, and
  the XLA_FLAGS it was compiled under kept with it; --recheck reads it
  back, each step's error and its part's summary. A folder that is not
  there is refused before anything compiles."""
  kept = tmp_path / "kept.jsonl"
  other = {"model": "gpt2", "topology": "h100:8", "mesh": [8, 1],
           "serve": {}, "compiled": {}}
  kept.write_text(json.dumps(other) + "\n")
  flags = dict(topology="h100:8", mesh="4x2", batch=8, keep=str(kept),
               part="gpu-check", format="json")
  for env in ({}, {"XLA_FLAGS": "--xla_gpu_enable_triton_gemm=false"}):
    out = _run("--compile", env=env, **flags)
    assert out.returncode == 0, out.stderr
  rows = [json.loads(line) for line in kept.read_text().splitlines()]
  assert len(rows) == 2 and rows[0] == other
  row, report = rows[1], json.loads(out.stdout)
  assert (row["model"], row["topology"], row["mesh"], row["part"]) == (
      "tiny", "h100:8", [4, 2], "gpu-check")
  assert row["serve"]["batch"] == 8 and row["compiled"] == report["compiled"]
  assert row["xla_flags"] == "--xla_gpu_enable_triton_gemm=false"
  for phase in ("prefill", "decode"):
    assert report["compare"][phase]["argument_error"] == 0
  alone = tmp_path / "alone.jsonl"
  alone.write_text(json.dumps(row) + "\n")
  again = _run(recheck=str(alone))
  assert again.returncode == 0, again.stderr
  assert "gpu-check  tiny h100:8 4x2 b8 16+8 bf16: prefill " in again.stdout
  assert again.stdout.strip().splitlines()[-1].startswith("gpu-check: 2 steps")
  assert again.stdout.strip().endswith("arguments exact in 2")
  missing = _run("--compile", **{**flags, "keep": str(tmp_path / "no" / "f")})
  assert missing.returncode == 2 and "no folder" in missing.stderr
  assert "Traceback" not in missing.stderr


def test_a_maxtext_serving_run_sets_the_lengths_it_names():
  """--maxtext on the serving report: MaxText's prefill length and cache
  length become --prompt and --generate (not a training --seq), and what
  this experiment has no flag for is named as unused."""
  out = subprocess.run(
      [sys.executable, "-m", "experiments.inference_report",
       "--topology=v5p-8", "--format=json", "--maxtext=model_name=tiny "
       "per_device_batch_size=2 max_prefill_predict_length=96 "
       "max_target_length=160"], cwd=ROOT,
      env={**os.environ, "JAX_PLATFORMS": "cpu"}, capture_output=True,
      text=True, timeout=120)
  assert out.returncode == 0, out.stderr
  serve = json.loads(out.stdout)["serve"]
  assert (serve["batch"], serve["prompt"], serve["generate"]) == (8, 96, 64)
  assert "-> --prompt=96" in out.stderr
  assert "not used by this experiment: remat_policy=full" in out.stderr


@pytest.mark.parametrize("line,message", [
    ('{"a": 1}', "line 1 has no 'model'; give a file of inference_report "
     "--keep rows"),
    ("[1, 2]", "line 1 is a JSON list, not an object"),
    (json.dumps({"model": "no_such_model", "topology": "v5p-8",
                 "mesh": [2, 2], "serve": {}, "compiled": {}}),
     "row 1 (no_such_model v5p-8): unknown model 'no_such_model'"),
])
def test_a_recheck_file_of_other_rows_names_the_line(tmp_path, line, message):
  kept = tmp_path / "kept.jsonl"
  kept.write_text(line + "\n")
  out = _run(recheck=str(kept))
  assert out.returncode == 2 and "Traceback" not in out.stderr, out.stderr
  assert message in out.stderr.strip().splitlines()[-1], out.stderr


def test_a_cache_past_the_trained_length_is_noted():
  """A rotary model runs past the positions it was trained at (tiny's 128)
  without a refusal; the report says so, and only then."""
  past = _run(prompt=2048, generate=64, batch=4, mesh="2x2")
  assert past.returncode == 0, past.stderr
  assert "note: 2112 positions, past the 128 tiny was trained at" in (
      past.stdout)
  assert "note:" not in _run().stdout
