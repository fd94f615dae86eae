"""Meshes read off one trace per structural class, checked mesh by mesh.

For every pair of meshes of a slice in the same class (simulator.tracing.mesh_class),
the figures read off the trace of one at the other's sizes must equal those
of a real trace at the other: the memory estimate (peak, what is live there
by category, the largest buffers, every part's peak, the tensors) at two
batch sizes, every collective and matmul of the program, and the step-time
model. As tests/test_batch_probe.py does for batches.
"""

import dataclasses
import itertools

import pytest

from meshes.layout import abstract_mesh, mesh_shapes, plan_mesh
from meshes.topology import parse_topology
from models.registry import load_model
from simulator import memory, search
from simulator.tracing import mesh_class
from simulator.timing import roofline
from simulator.tracing.program import read_traced
from simulator.settings import TrainSettings
from simulator.step import PlanError
from simulator.tracing.trace import trace_probe


def _model(name, **dims):
  return dataclasses.replace(load_model(name), name=f"{name}_x", **dims)


# Small models with dims a 16- or 32-chip mesh can still split (d_model 512).
_DIMS = dict(d_model=512, d_ff=1024, head_dim=64, vocab_size=1024)
CASES = [
    # multi-head, 16 chips: classes {2x8, 4x4, 8x2}, {1x16}, {16x1}
    (_model("tiny", n_heads=16, n_kv_heads=16, **_DIMS), "v5p-32",
     dict(remat="full")),
    (_model("tiny", n_heads=16, n_kv_heads=16, **_DIMS), "v5p-32",
     dict(remat="dots", shard="zero1", attention="materialized")),
    # GQA, 32 chips: kv heads replicated at Y=4 and 8, sharded at Y=2
    (_model("tiny", n_heads=16, n_kv_heads=2, **_DIMS), "v5p-64",
     dict(remat="none", optimizer="adafactor", loss_chunks=2)),
    # GQA, 16 chips: one kv head per device at 4x4, two at 8x2
    (_model("tiny", n_heads=16, n_kv_heads=4, **_DIMS), "v5p-32",
     dict(remat="full")),
    # MQA: one kv head, replicated wherever Y > 1
    (_model("tiny", n_heads=8, n_kv_heads=1, **_DIMS), "v5p-32",
     dict(remat="names:qkv,mlp_in", grad_accum=2)),
    # mixture of experts, experts over X
    (_model("tiny_moe", n_heads=8, n_kv_heads=8, expert_d_ff=768, **_DIMS),
     "v5p-32", dict(remat="full", expert_axis="x")),
    # QLoRA (NF4 base), state offloaded to host, an offloading remat
    (_model("tiny", n_heads=16, n_kv_heads=16, **_DIMS), "v5p-32",
     dict(remat="offload:qkv", lora_rank=8, base_quant="nf4",
          offload=("optimizer", "params"))),
    # T5 encoder-decoder
    (_model("tiny_t5", n_heads=8, n_kv_heads=8, **_DIMS), "v5p-32",
     dict(remat="full", target_seq=64)),
    # data-parallel replicas D outermost: the batch over D and X together
    (_model("tiny", n_heads=16, n_kv_heads=16, **_DIMS), "v5p-32",
     dict(remat="full", batch=32, dp=2)),
    (_model("tiny", n_heads=16, n_kv_heads=4, **_DIMS), "v5p-64",
     dict(remat="dots", batch=64, dp=4, loss_chunks=2)),
]


def _figures(cfg, settings, traced, traced_plan, plan):
  """Everything the sweep and the reports read, at `plan`'s sizes."""
  resize = mesh_class.resize_for(traced, traced_plan, plan)
  with mesh_class.resized(resize):
    est = memory.estimate_memory(traced, plan)
    program = read_traced(traced)
    model = roofline.fit_mesh(cfg, settings, plan, traced=traced)
    batches = (2 * plan.D * plan.X, 6 * plan.D * plan.X)
    mem = [(memory.to_json(e), e.tensors) for e in map(est.at_batch, batches)]
  hw = roofline.Hardware.for_plan(plan)
  steps = [roofline.step_estimate(model, b * settings.seq, hw)
           for b in batches]
  return dict(memory=mem, program=program, model=model, steps=steps)


@pytest.fixture(scope="module", params=CASES,
                ids=lambda c: f"{c[0].name}-{c[1]}-{c[2]['remat']}"
                              f"-D{c[2].get('dp', 1)}")
def traces(request):
  cfg, topology, kw = request.param
  topo = parse_topology(topology)
  kw = dict(kw)
  dp = kw.pop("dp", 1)
  settings = TrainSettings(**{"batch": 8, "seq": 128, **kw})
  out = {}
  for x, y in mesh_shapes(topo, dp):
    plan = plan_mesh(topo, x, y, D=dp)
    try:
      key = mesh_class.class_key(cfg, settings, plan)
      traced = trace_probe(cfg, settings, abstract_mesh(plan))
    except PlanError:
      continue
    out[x, y] = (key, traced, plan, _figures(cfg, settings, traced, plan,
                                              plan))
  return cfg, settings, out


def test_derived_figures_equal_real_traces(traces):
  cfg, settings, meshes = traces
  derived = 0
  for (m0, (k0, traced, plan0, _)), (m, (k, _, plan, real)) in (
      itertools.permutations(meshes.items(), 2)):
    if k0 != k:
      continue
    try:
      got = _figures(cfg, settings, traced, plan0, plan)
    except mesh_class.NotInClass:
      continue  # traced instead: the sweep falls back
    derived += 1
    for name in real:
      assert got[name] == real[name], f"{name}: {m0} read at {m}"
  assert derived  # the check is not vacuous


def test_class_key_names_what_changes_the_program():
  topo = parse_topology("v5p-64")
  cfg = _model("tiny", n_heads=16, n_kv_heads=2, **_DIMS)
  settings = TrainSettings(batch=8, seq=128)
  key = lambda x, y: mesh_class.class_key(cfg, settings, plan_mesh(topo, x, y))
  assert key(8, 4) == key(4, 8) != key(16, 2)  # kv heads replicated or not
  assert key(16, 2) == key(32, 1)  # Y of size 1: read at its size
  with pytest.raises(PlanError, match="Y=16 divides neither"):
    key(2, 16)


def test_what_cannot_be_read_off_is_not_in_the_class():
  resize = mesh_class.Resize({"X": 4, "Y": 4}, {"X": 2, "Y": 8},
                             {128: None, 1000: 500}, {})
  with pytest.raises(mesh_class.NotInClass, match="not divisible"):
    resize.shard_shape((12, 64), ("Y", None))
  # over X and Y: a shard_map residual, read off its body's dims
  assert resize.shard_shape((16000, 64), (("X", "Y"), None)) == (500, 64)
  with pytest.raises(mesh_class.NotInClass, match="not an operand"):
    resize.shard_shape((32, 64), (("X", "Y"), None))
  assert resize.shard_shape((8, 64), ("Y", None)) == (1, 64)
  assert resize.local_shape((1000, 1)) == (500, 1)
  with pytest.raises(mesh_class.NotInClass, match="ambiguous"):
    resize.local_shape((1000, 128))  # seq 128, or 512 over Y=4?
  with pytest.raises(mesh_class.NotInClass, match="not an operand"):
    resize.local_shape((7,))


def test_the_sweep_traces_once_per_class_with_the_same_records():
  cfg = _model("tiny", n_heads=16, n_kv_heads=16, **_DIMS)
  spec = search.SweepSpec(model="tiny", topology="v5p-32", batches=(16, 32),
                          remats=("full", "none"), seq=128)
  topo = parse_topology(spec.topology)
  strip = lambda rs: [{k: v for k, v in r.items() if k != "eval_s"}
                      for r in rs]
  sweep = search.Sweep(spec, cfg, topo)
  once = strip(sweep.evaluate(spec.configs(topo)))
  every = search.Sweep(spec, cfg, topo, share_traces=False)
  each = strip(every.evaluate(spec.configs(topo)))
  assert once == each
  assert sum(r["status"] == "ok" for r in once) == 20  # 5 meshes x 2 x 2
  assert (every.traces, every.read_off) == (10, 0)
  assert sweep.traces + sweep.read_off == 10 and sweep.read_off >= 2
  # meshes with an axis of size 1 (1x16, 16x1) share the others' class
  assert sweep.traces == 2


def test_kv_heads_replicated_or_not_is_a_class_of_its_own():
  """Read at 16x1, the MQA model's 8x2 trace gives other collectives than
  its own trace at 16x1: its one kv head is replicated over Y=2, sharded
  over nothing at Y=1, and JAX's program differs."""
  cfg, topology, kw = CASES[4]
  assert cfg.n_kv_heads == 1
  topo = parse_topology(topology)
  settings = TrainSettings(**{"batch": 8, "seq": 128, **kw})
  (p0, t0), (p, t) = [
      (plan, trace_probe(cfg, settings, abstract_mesh(plan)))
      for plan in (plan_mesh(topo, 8, 2), plan_mesh(topo, 16, 1))]
  assert (mesh_class.class_key(cfg, settings, p0)
          != mesh_class.class_key(cfg, settings, p))
  read = _figures(cfg, settings, t0, p0, p)
  assert read["program"] != _figures(cfg, settings, t, p, p)["program"]
