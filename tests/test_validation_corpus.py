"""experiments.validation_corpus: the corpus spans every axis a user sets."""

from experiments.validation_corpus import CASES, PARTS
from meshes.layout import parse_mesh
from meshes.topology import parse_topology
from models.params import num_params
from models.registry import load_model
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
  meshes; every case's mesh uses all its topology's chips."""
  cfgs = {m: load_model(m) for m in _values("model")}
  sizes = [num_params(c) for c in cfgs.values()]
  assert min(sizes) < 2e8 and max(sizes) > 6e10
  assert any(c.n_kv_heads == 1 for c in cfgs.values())  # MQA
  assert any(1 < c.n_kv_heads < c.n_heads for c in cfgs.values())  # GQA
  assert any(m.endswith(".json") for m in cfgs)
  meshes = [parse_mesh(c.mesh) for c in CASES]
  assert any(y == 1 for _, y in meshes) and any(y >= 4 * x for x, y in meshes)
  for c in CASES:
    x, y = parse_mesh(c.mesh)
    assert x * y == parse_topology(c.topology).chips, c.label()


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
