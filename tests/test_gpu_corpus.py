"""experiments.gpu_corpus: the kept GPU compiles are the corpus as defined,
and experiments/validation_gpu.md is today's model on them (re-checked
without compiling, as the TPU corpus is in test_validation_corpus)."""

import dataclasses
import json
import os

import pytest

from experiments import gpu_corpus
from experiments import validation_matrix as vm
from experiments.gpu_corpus import CASES, GPU_CORPUS_JSONL, GPU_PARTS
from experiments.validation_corpus import Case
from meshes.layout import parse_mesh_name
from meshes.topology import parse_topology
from simulator.xla import crosscheck


def _kept() -> dict[int, dict]:
  with open(GPU_CORPUS_JSONL) as f:
    rows = [json.loads(line) for line in f if line.strip()]
  return {r["config"]["index"]: r for r in rows}


def test_the_kept_gpu_corpus_is_every_case_compiled_once():
  """One row per case with its exact settings (a setting added to Case
  after a row was compiled is absent from it: its default)."""
  kept = _kept()
  assert sorted(kept) == list(range(len(CASES)))
  defaults = json.loads(json.dumps(dataclasses.asdict(Case("", "", "", 0, 0,
                                                           "", ""))))
  for i, case in enumerate(CASES):
    config = kept[i]["config"]
    settings = json.loads(json.dumps(dataclasses.asdict(case)))
    assert {k: config.get(k, defaults[k]) for k in settings} == settings, i
    assert "compiled" in kept[i], (i, kept[i].get("error"))
    assert kept[i]["compiled"].get("workaround") == (
        "--xla_gpu_enable_triton_gemm=false"
        if i in gpu_corpus.CUBLAS_GEMMS_CASES else None), i


def test_both_parts_span_meshes_remats_and_gpus():
  """The tuned and the held-out part each hold several GPUs, a two-host
  mesh and more than one remat; the held-out part a TP-heavy mesh (Y a
  whole host)."""
  assert {c.part for c in CASES} == set(GPU_PARTS)
  defaults = {f.name: f.default for f in dataclasses.fields(Case)}
  for part in GPU_PARTS:
    of = [c for c in CASES if c.part == part]
    assert len({c.topology.split(":")[0] for c in of}) >= 3, part
    assert any(parse_topology(c.topology).hosts > 1 for c in of), part
    assert len({c.remat.split(":")[0] for c in of}) >= 2, part
    assert any(c.optimizer != "adamw" or c.shard != defaults["shard"]
               for c in of), part
  assert any(parse_mesh_name(c.mesh)[1] == parse_topology(c.topology).chips_per_host
             for c in CASES if c.part == "gpu-check")
  for c in CASES:  # every mesh (with its replicas and stages) uses every GPU
    x, y, d = parse_mesh_name(c.mesh)
    assert x * y * d * c.pp == parse_topology(c.topology).chips, c.label()


def _doc_rows() -> dict[int, dict[str, str]]:
  path = os.path.join(os.path.dirname(GPU_CORPUS_JSONL), "..",
                      "validation_gpu.md")
  with open(path) as f:
    lines = [[c.strip() for c in line.strip().strip("|").split("|")]
             for line in f if line.startswith("| ")]
  header, rows = lines[0], lines[1:]
  return {int(r[0]): dict(zip(header, r)) for r in rows}


FAST = [i for i, c in enumerate(CASES) if c.model == "gpt2"]


@pytest.mark.parametrize("index", FAST)
def test_the_gpu_docs_state_what_the_model_gives_on_kept_rows(index):
  """Each gpt2 row, compiled from the program traced today, re-checked
  here gives validation_gpu.md's figures (the GPU rules applied), with the
  arguments exact to the byte."""
  row = crosscheck.recheck(_kept()[index])
  assert row["program"] == "same", index  # else recompile it (--only)
  errors = row["relative_error"]
  assert errors["arguments"] == 0
  doc = _doc_rows()[index]
  assert doc["part"] == CASES[index].part
  assert doc["peak err"] == vm._pct(errors["peak"]), doc
  assert doc["peak-ovh err"] == vm._pct(errors["peak_no_overhead"]), doc
