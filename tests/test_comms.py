"""Collectives read off the traced step; ring timing units."""

import functools

import pytest

from meshes.layout import abstract_mesh, plan_mesh
from meshes.topology import parse_topology
from models.presets import PRESETS
from simulator.timing.comms import (axis_bandwidth, collective_cost,
                                    collective_time, ring_time)
from simulator.tracing.program import collectives
from simulator.settings import TrainSettings
from simulator.tracing.trace import trace

D, F, L = 16384, 53248, 126


@functools.lru_cache(None)
def _xxl(shard, remat="none"):
  plan = plan_mesh(parse_topology("v5p-128"), 16, 4)
  s = TrainSettings(batch=16, seq=64, remat=remat, shard=shard)
  return plan, collectives(trace(PRESETS["xxl_ffn"], s, abstract_mesh(plan)))


def _summary(cs, phase):
  return sorted((c.kind, c.axis, c.bytes_per_device, c.count) for c in cs
                if c.phase == phase and c.layer == "blocks")


def test_xxl_forward_matches_seed_004_steps():
  # Seed 004(c): AllGather_Y In[B_X, D_Y], AllGather_X W_in and W_out (bf16),
  # ReduceScatter_Y Out[B_X, D]{U_Y}; B = 16·64 tokens, X = 16, Y = 4.
  _, cs = _xxl("zero3")
  act = 2 * (16 * 64 // 16) * D
  weight = 2 * D * F // 4
  assert _summary(cs, "forward") == sorted([
      ("all-gather", "Y", act, L), ("all-gather", "X", weight, L),
      ("all-gather", "X", weight, L), ("reduce-scatter", "Y", act, L)])
  gathers = [c for c in cs if c.phase == "forward" and c.axis == "X"
             and c.layer == "blocks"]
  assert all(c.prefetchable for c in gathers)  # FSDP weight gathers
  loss = [c for c in cs if c.layer == "top"]
  assert {(c.kind, c.axis, c.bytes_per_device) for c in loss} == {
      ("all-reduce", "X", 4), ("all-reduce", "Y", 4)}  # the loss all-reduce


def test_xxl_backward_mirrors_forward():
  # What seed 004 leaves out: the backward pass gathers dOut over Y, reduce-
  # scatters dIn over Y and both weight gradients over X (bf16, zero3).
  _, cs = _xxl("zero3")
  act = 2 * (16 * 64 // 16) * D
  weight = 2 * D * F // 4
  assert _summary(cs, "backward") == sorted([
      ("all-gather", "Y", act, L), ("reduce-scatter", "X", weight, L),
      ("reduce-scatter", "X", weight, L), ("reduce-scatter", "Y", act, L)])
  grads = [c for c in cs if c.phase == "backward" and c.axis == "X"]
  assert all(c.deferrable and not c.prefetchable for c in grads)


def test_remat_regathers_weights_in_backward():
  _, cs = _xxl("zero3", "full")
  bwd = [c for c in cs if c.phase == "backward" and c.kind == "all-gather"
         and c.axis == "X"]
  assert len(bwd) == 2


def test_dp_has_no_weight_gathers_and_all_reduces_grads():
  _, cs = _xxl("dp")
  assert not [c for c in cs if c.kind == "all-gather" and c.axis == "X"]
  grad = [c for c in cs if c.axis == "X" and c.layer == "blocks"]
  assert {c.kind for c in grad} == {"all-reduce"}
  assert len(grad) == 2 and all(c.phase == "backward" for c in grad)


def test_ring_time_units_and_conventions():
  plan = plan_mesh(parse_topology("v5p-128"), 16, 4)  # M_X=2, M_Y=1, wrapped
  assert axis_bandwidth(plan, "X", 9e10) == 2 * 2 * 9e10
  assert axis_bandwidth(plan, "Y", 9e10) == 2 * 9e10
  assert axis_bandwidth(plan, "Y", 9e10, wraparound=False) == 9e10
  # 1.8e11 bytes on W_ici = 1.8e11 B/s: one second (book convention, f = 1).
  assert ring_time("all-gather", 1.8e11, 4, 1.8e11) == pytest.approx(1.0)
  assert ring_time("all-gather", 1.8e11, 4, 1.8e11, "exact") == pytest.approx(0.75)
  assert ring_time("all-reduce", 1.8e11, 4, 1.8e11) == pytest.approx(2.0)
  assert ring_time("all-gather", 1e9, 1, 1e9) == 0.0
  _, cs = _xxl("zero3")
  w = next(c for c in cs if c.kind == "all-gather" and c.axis == "X")
  # seed: 2·D·(F/Y) / (W_ici·M_X)
  assert collective_time(w, plan, 9e10) == pytest.approx(
      2 * D * (F / 4) / (1.8e11 * 2))
  with pytest.raises(ValueError):
    ring_time("all-gather", 1, 2, 1, ring="bogus")


@pytest.mark.parametrize("parallel,forward_rs,backward_ar", [
    (False, 2, 2),  # dq, dk, dv summed: one all-reduce; the MLP's its own
    (True, 1, 1),  # one for attention and MLP, both ways
])
def test_summed_partial_sums_are_reduced_once(parallel, forward_rs,
                                              backward_ar):
  """XLA's all-reduce and reduce-scatter reassociation: the sum of two
  partial-sum reductions is one reduction of the sum."""
  import dataclasses
  cfg = dataclasses.replace(PRESETS["tiny"], parallel_block=parallel)
  plan = plan_mesh(parse_topology("v5p-8"), 2, 2)
  cs = [c for c in collectives(trace(cfg, TrainSettings(batch=8, seq=64),
                                     abstract_mesh(plan)))
        if c.axis == "Y" and c.layer != "top"]
  count = lambda phase, kind: sum(c.phase == phase and c.kind == kind
                                  for c in cs)
  assert count("forward", "reduce-scatter") == forward_rs
  assert count("backward", "all-reduce") == backward_ar


def test_collective_cost_keeps_the_tpu_ring():
  plan = plan_mesh(parse_topology("v5p-128"), 16, 4)
  for kind in ("all-gather", "all-reduce", "reduce-scatter"):
    cost = collective_cost(kind, "X", plan, 9e10, nbytes=1e8)
    assert cost.latency == 0.0
    assert cost.time(1e8) == pytest.approx(ring_time(
        kind, 1e8, 16, axis_bandwidth(plan, "X", 9e10)))


def test_multi_slice_adds_the_dcn_ring():
  # v5p-256x2 64x4: X = 2 slices x 32 chips; the DCN ring moves V/32 between
  # the 2 slices at 50 Gb/s per chip (Cloud's v5p page), after the ICI ring.
  plan = plan_mesh(parse_topology("v5p-256x2"), 64, 4)
  assert (plan.x_hosts, plan.y_hosts, plan.local("X")) == (2, 1, 32)
  ici = ring_time("all-gather", 1e8, 32, axis_bandwidth(plan, "X", 9e10))
  dcn = (1 / 2) * (1e8 / 32) / 6.25e9
  assert collective_cost("all-gather", "X", plan, 9e10).time(1e8) == (
      pytest.approx(ici + dcn))
  y = collective_cost("all-gather", "Y", plan, 9e10).time(1e8)
  assert y == pytest.approx(ring_time("all-gather", 1e8, 4, axis_bandwidth(
      plan, "Y", 9e10)))


def test_replicas_across_slices_sum_over_dcn_alone():
  """D2x256x1 on v5e-256x2: each replica a slice, so the sum over D is the
  DCN ring between the 2 slices at 25 Gb/s per chip (Cloud's v5e page:
  6.4 Tbps per 256-chip pod), no ICI part; inside one slice D is a ring
  over one physical axis without wraparound, as pipeline stages are."""
  plan = plan_mesh(parse_topology("v5e-256x2"), 256, 1, D=2)
  assert collective_cost("all-reduce", "D", plan, 4.5e10).time(1e6) == (
      pytest.approx(2 * (1 / 2) * 1e6 / 3.125e9))
  inside = plan_mesh(parse_topology("v5e-32"), 16, 1, D=2)
  assert collective_cost("all-reduce", "D", inside, 4.5e10).time(1e6) == (
      pytest.approx(ring_time("all-reduce", 1e6, 2, 4.5e10)))


def test_gpu_axes_are_timed_as_nccl_does():
  plan = plan_mesh(parse_topology("h100:2x8"), 2, 8)
  tp = collective_cost("all-gather", "Y", plan, 4.5e11, nbytes=1e8)
  dp = collective_cost("all-reduce", "X", plan, 4.5e11, nbytes=1e8)
  assert tp.algorithm == "ring" and tp.latency > 0
  assert tp.per_byte == pytest.approx((7 / 8) / 4.5e11)  # NVLink, not 2x
  assert dp.per_byte == pytest.approx((2 * 1 / 2) / 5e10)  # one NIC per GPU
