"""experiments.validation_corpus: the corpus spans every axis a user sets."""

import dataclasses
import json
import os

import pytest

from experiments import validation_matrix as vm
from experiments.validation_corpus import CASES, CORPUS_JSONL, PARTS, Case
from meshes.layout import parse_mesh_name
from meshes.topology import parse_topology
from models.params import num_params
from models.registry import load_model
from simulator.xla import crosscheck
from simulator import settings as S


def _values(field):
  return {getattr(c, field) for c in CASES if c.part != "toy"}


def test_corpus_spans_every_setting():
  """>= 60 cases; all shard modes, precisions, optimizers, remat kinds and
  attentions; seq 512 to 8192; a chunked loss; v4, v5e, v5p and v6e."""
  assert len(CASES) >= 60
  assert _values("shard") == set(S.SHARDS)
  assert _values("precision") == set(S.PRECISIONS)
  assert _values("optimizer") == set(S.OPTIMIZERS)
  assert _values("attention") == set(S.ATTENTIONS)
  assert {r.split(":")[0] for r in _values("remat")} == {
      "none", "full", "dots", "names", "offload"}
  assert min(_values("seq")) <= 512 and max(_values("seq")) >= 8192
  assert max(_values("loss_chunks")) > 1
  assert {parse_topology(t).chip.name.split()[-1] for t in _values("topology")
          } >= {"v4", "v5e", "v5p", "v6e"}, _values("topology")


def test_corpus_spans_models_and_meshes():
  """gpt2 to 70B, MQA and GQA, Hugging Face configs; pure FSDP to TP-heavy
  meshes; every case's mesh (with its pipeline stages) uses all its
  topology's chips."""
  cfgs = {m: load_model(m) for m in _values("model")}
  sizes = [num_params(c) for c in cfgs.values()]
  assert min(sizes) < 2e8 and max(sizes) > 6e10
  assert any(c.n_kv_heads == 1 for c in cfgs.values())  # MQA
  assert any(1 < c.n_kv_heads < c.n_heads for c in cfgs.values())  # GQA
  assert any(m.endswith(".json") for m in cfgs)
  meshes = [parse_mesh_name(c.mesh) for c in CASES]
  assert any(y == 1 for _, y, _ in meshes) and any(
      y >= 4 * x for x, y, _ in meshes)
  assert any(d > 1 for _, _, d in meshes)  # data-parallel replicas
  for c in CASES:
    x, y, d = parse_mesh_name(c.mesh)
    assert x * y * c.pp * d == parse_topology(c.topology).chips, c.label()


def test_every_part_holds_every_kind():
  """Both the tuned part and the check part have each shard mode, each TPU
  generation and an offload case, so each is reported on its own."""
  assert {c.part for c in CASES} == set(PARTS)
  for part in ("tune", "check"):
    of = [c for c in CASES if c.part == part]
    assert {c.shard for c in of} == set(S.SHARDS), part
    assert {c.topology.split("-")[0] for c in of} >= {"v4", "v5e", "v5p",
                                                      "v6e"}, part
    assert any(c.remat.startswith("offload:") for c in of), part


def _kept() -> dict[int, dict]:
  with open(CORPUS_JSONL) as f:
    rows = [json.loads(line) for line in f if line.strip()]
  return {r["config"]["index"]: r for r in rows}


def test_the_kept_corpus_is_every_case_compiled_once():
  """The data the docs are computed from is the corpus as defined: one row
  per case, with its exact settings (a setting added after a row was
  compiled is its default there); each compiled, or refused by XLA for HBM
  with the bytes it needed."""
  kept = _kept()
  assert sorted(kept) == list(range(len(CASES)))
  defaults = json.loads(json.dumps(
      {f.name: f.default for f in dataclasses.fields(Case)
       if f.default is not dataclasses.MISSING}))
  for i, case in enumerate(CASES):
    config = {**defaults, **kept[i]["config"]}
    settings = json.loads(json.dumps(dataclasses.asdict(case)))
    assert {k: config[k] for k in settings} == settings, i
    assert "compiled" in kept[i] or "oom" in kept[i], (i, kept[i].get("error"))


def _doc_rows() -> dict[int, dict[str, str]]:
  """experiments/validation.md's result rows by corpus index, by column."""
  path = os.path.join(os.path.dirname(CORPUS_JSONL), "..", "validation.md")
  with open(path) as f:
    lines = [[c.strip() for c in line.strip().strip("|").split("|")]
             for line in f if line.startswith("| ")]
  header, rows = lines[0], lines[1:]
  return {int(r[0]): dict(zip(header, r)) for r in rows}


FAST = [i for i, c in enumerate(CASES) if c.model in ("gpt2", "tiny")]


@pytest.mark.parametrize("index", FAST)
def test_the_docs_state_what_the_model_gives_on_kept_rows(index):
  """experiments/validation.md is today's model on the kept compiles: each
  small row, compiled from the program traced today, re-checked here gives
  the table's figures, and arguments are exact to the byte."""
  row = crosscheck.recheck(_kept()[index])
  # the kept compile is of the program today's code traces (else recompile
  # it: validation_matrix --only=index)
  assert row["program"] == "same", index
  errors = row["relative_error"]
  assert errors["arguments"] == 0
  doc = _doc_rows()[index]
  assert doc["peak err"] == vm._pct(errors["peak"]), doc
  assert doc["peak-ovh err"] == vm._pct(errors["peak_no_overhead"]), doc
  flops = row["flops"]["relative_error"]
  assert doc["flops err"] == vm._pct(flops), doc
  assert doc["bytes err"] == vm._pct(row["hbm_bytes"]["relative_error"]), doc
  # XLA's flops add the elementwise ops': a toy's and the 8-bit optimizer's
  # blockwise quantization of every parameter weigh more than a few %.
  assert -0.25 < flops < 0.02, flops
  if CASES[index].part != "toy" and CASES[index].optimizer != "adamw_8bit":
    assert abs(flops) < 0.02, flops


def test_plans_xla_refuses_are_said_not_to_fit():
  for i, row in _kept().items():
    if "oom" in row:
      assert not crosscheck.recheck(row)["symbolic_fits"], i
