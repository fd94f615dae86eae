"""The probe batch's premise, checked value by value against real traces.

Every residual, collective and matmul of a probe-batch trace, rescaled to batch
b, must equal the same value traced at b: same per-device shape, bytes and
FLOPs; and the heap simulation's peak likewise. That is what lets memory and
roofline trace once per mesh.
"""

import dataclasses

import jax
import numpy as np
import pytest

from meshes.layout import abstract_mesh, plan_mesh
from meshes.topology import parse_topology
from models.config import ModelConfig
from models.registry import load_model
from simulator.tracing import batch_probe
from simulator.memory import liveness
from simulator.tracing.program import read_traced
from simulator.settings import TrainSettings
from simulator.step import device_bytes, device_shape
from simulator.tracing.trace import trace, trace_probe

CASES = [
    ("tiny", "v5p-8", 2, 2, 6, dict(remat="full", attention="materialized")),
    ("tiny", "v5p-8", 4, 1, 8, dict(remat="offload:qkv", loss_chunks=4)),
    ("tiny", "v5p-8", 2, 2, 2, dict(remat="dots", shard="zero1")),
    ("gpt2", "v5p-8", 2, 2, 4, dict(remat="none", seq=256)),
    ("llama2_7b", "v5p-32", 4, 4, 8, dict(remat="names:qkv,mlp_in", seq=512,
                                          optimizer="adafactor")),
    ("xxl_ffn", "v5p-8", 4, 1, 4, dict(remat="none", seq=64)),
]


def _scaled(shape, nbytes, batch, probe):
  linear = batch_probe.carries_batch(shape)
  return (batch_probe.rescale(shape, batch, probe),
          nbytes * batch // probe if linear else nbytes)


@pytest.fixture(scope="module", params=CASES, ids=lambda c: f"{c[0]}-{c[2]}x{c[3]}")
def traces(request):
  name, topology, x, y, batch, kw = request.param
  cfg = load_model(name)
  settings = TrainSettings(**{"batch": batch, "seq": 128, **kw})
  mesh = abstract_mesh(plan_mesh(parse_topology(topology), x, y))
  probe = trace_probe(cfg, settings, mesh)
  real = trace(cfg, settings, mesh)
  pb = probe.step.batch["inputs"].shape[0]
  double = trace(cfg, dataclasses.replace(settings, batch=2 * pb), mesh)
  return probe, real, batch, pb, double


def test_residuals_rescale_exactly(traces):
  probe, real, batch, pb, _ = traces
  assert len(probe.residuals) == len(real.residuals)
  for p, r in zip(probe.residuals, real.residuals):
    assert (p.name, p.op, p.scopes) == (r.name, r.op, r.scopes)
    assert _scaled(device_shape(p.aval), device_bytes(p.aval), batch, pb) == (
        device_shape(r.aval), device_bytes(r.aval)), p.name


def test_heap_simulation_rescales_exactly(traces):
  """The live-set points of the probe trace, rescaled to twice the probe
  batch, give the peak the heap simulation finds in a trace at twice the
  probe batch. (Against a real batch the rules that ask whether a value
  carries the batch cannot tell: its dims are then ordinary sizes.)"""
  probe, _, _, _, double = traces
  donated = lambda t: len(jax.tree.leaves(t.step.params)) + len(
      jax.tree.leaves(t.step.opt_state))
  p = liveness.simulate(probe.jaxpr, donated(probe))
  d = liveness.simulate(double.jaxpr, donated(double))
  assert p.peak_at(2, 1)[0] == d.peak_at(1, 1)[0] > 0


def test_program_rescales_exactly(traces):
  probe, real, batch, pb, _ = traces
  p, r = read_traced(probe), read_traced(real)
  assert len(p.collectives) == len(r.collectives) > 0
  for a, b in zip(p.collectives, r.collectives):
    assert (a.kind, a.axis, a.source, a.count) == (b.kind, b.axis, b.source,
                                                   b.count)
    assert _scaled(a.shape, a.bytes_per_device, batch, pb) == (
        b.shape, b.bytes_per_device)
  assert len(p.dots) == len(r.dots) > 0
  for a, b in zip(p.dots, r.dots):
    linear = batch_probe.carries_batch(a.dims)
    scale = (lambda f: f * batch // pb) if linear else (lambda f: f)
    assert (scale(a.flops_per_device), scale(a.flops_global)) == (
        b.flops_per_device, b.flops_global), a.source


def test_no_model_dimension_is_a_probe_multiple():
  cfg = ModelConfig(name="odd", d_model=64, n_layers=1, d_ff=128,
                    vocab_size=batch_probe.PROBE * 2, n_heads=2, n_kv_heads=2,
                    head_dim=32)
  with pytest.raises(ValueError, match="2000006 is a multiple of the probe"):
    batch_probe.probe_settings(cfg, TrainSettings(batch=2, seq=16), 4)


def test_bytes_at_is_the_exact_floor_of_the_scaled_bytes_in_int64():
  """Fixed + floor(linear * num / den), also where linear * num overflows
  int64 (llama2_70b's probe-batch bytes at b1024)."""
  linear, num, den = 9_050_000_000_000_007, 1024, 1_000_003
  exact = 7 + linear * num // den
  assert batch_probe.bytes_at(7, linear, num, den) == exact
  assert batch_probe.bytes_at(np.array([7]), np.array([linear]), num,
                              den)[0] == exact
  assert np.array([linear]) * num < 0  # the plain product overflows


def test_labels_rescale_as_shapes_do():
  """A label holding a probe-batch aval reads at the real batch: only the
  numbers that carry the batch change, as `rescale` changes those dims."""
  P = batch_probe.PROBE
  label = f"x > remat2 > bfloat16[{16 * P}@X,8@Y,4,4096,512] made in a layout"
  assert batch_probe.rescale_text(label, 32, 16 * P) == (
      "x > remat2 > bfloat16[32@X,8@Y,4,4096,512] made in a layout")
  assert batch_probe.rescale_text(f"f32[{P},0,7]", 6, 2 * P) == "f32[3,0,7]"
