"""A real `tensorboard --logdir` server on 127.0.0.1 serves what results.jsonl holds."""

import io
import json
import os
import shutil
import socket
import subprocess
import time
import urllib.parse
import urllib.request

import pytest

from experiments import mesh_sweep
from experiments.tensorboard_writer import session_name
from simulator import search

SPEC = search.SweepSpec(model="tiny", topology="v5p-8", batches=(4, 8),
                        remats=("full",), seq=32)


def _free_port() -> int:
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


def _get(base, path, data=None):
  req = urllib.request.Request(base + path, data=data, headers={
      "Content-Type": "application/json", "X-TensorBoard-Feature-Flags": "{}"})
  with urllib.request.urlopen(req, timeout=10) as r:
    return json.loads(r.read())


@pytest.mark.skipif(shutil.which("tensorboard") is None, reason="no tensorboard")
def test_server_serves_runs_scalars_hparams_and_text(tmp_path):
  logdir = str(tmp_path)
  run_dir = mesh_sweep.run_sweep(SPEC, logdir, "s", top_k=0, progress=False,
                                 out=io.StringIO()).run_dir
  records = [json.loads(l) for l in open(os.path.join(run_dir, "results.jsonl"))]
  ok = [r for r in records if r["status"] == "ok"]
  port = _free_port()
  proc = subprocess.Popen(
      ["tensorboard", "--logdir", logdir, "--host", "127.0.0.1", "--port",
       str(port), "--load_fast=false", "--reload_interval=1"],
      stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
  base = f"http://127.0.0.1:{port}"
  try:
    deadline, runs = time.time() + 60, []
    while time.time() < deadline:
      try:
        runs = _get(base, "/data/runs")
        if any(r.endswith("/sessions/" + session_name(ok[0])) for r in runs):
          break
      except OSError:
        pass
      time.sleep(0.5)
    tb = "s/tensorboard"
    sessions = {f"{tb}/sessions/{session_name(r)}" for r in ok}
    assert sessions <= set(runs)
    failed = [r for r in records if r not in ok]
    assert failed and not any(f"{tb}/sessions/{session_name(r)}" in runs
                              for r in failed)  # no empty rows
    for r in ok:
      q = urllib.parse.urlencode({"run": f"{tb}/sessions/{session_name(r)}",
                                  "tag": "perf/mfu"})
      points = _get(base, f"/data/plugin/scalars/scalars?{q}")
      assert points[0][2] == pytest.approx(r["mfu"], rel=1e-6)
    q = urllib.parse.urlencode({"run": tb, "tag": "sweep/recommendation"})
    text = _get(base, f"/data/plugin/text/text?{q}")
    assert text[0]["text"].startswith("<p>recommended: mesh") or \
        "recommended: mesh" in text[0]["text"]
    body = json.dumps({"experimentName": "", "allowedStatuses": [
        "STATUS_UNKNOWN", "STATUS_SUCCESS", "STATUS_FAILURE", "STATUS_RUNNING"],
        "colParams": [], "startIndex": 0, "sliceSize": 1000}).encode()
    groups = _get(base, "/data/plugin/hparams/session_groups", body)
    got = {}
    for g in groups["sessionGroups"]:
      h = g["hparams"]
      key = (int(h["X"]), int(h["Y"]), int(h["batch"]), h["remat"], h["shard"],
             h["optimizer"], int(h["P"]), int(h["D"]))
      got[key] = {m["name"]["tag"]: m["value"] for m in g.get("metricValues", [])}
    assert set(got) == {search.record_key(r) for r in ok}
    for r in ok:
      m = got[search.record_key(r)]
      assert m["memory/peak_gib"] == pytest.approx(r["peak_bytes"] / 2**30, rel=1e-6)
      assert m["memory/fits"] == float(r["fits"])
      assert m["perf/tokens_per_s"] == pytest.approx(r["tokens_per_s"],
                                                     rel=1e-6)
    hparams = groups["sessionGroups"][0]["hparams"]
    assert all(isinstance(hparams[k], str) and hparams[k].isdigit()
               for k in ("X", "Y", "batch", "P", "D"))  # "16", not "16.000"
    assert {"model", "topology", "mesh"} <= set(hparams)
    assert hparams["model"] == "tiny" and "x" in hparams["mesh"]
  finally:
    proc.kill()
    proc.wait(timeout=10)
