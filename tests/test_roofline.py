"""Seed 004 (c)-(d) reproduced from the traced XXL model; closed forms cross-check."""

import dataclasses
import functools

import pytest

from meshes.layout import plan_mesh
from meshes.topology import parse_topology
from models.presets import PRESETS
from simulator import formulas as FM
from simulator.timing import roofline as R
from simulator.settings import TrainSettings

C, LINK = 4.6e14, 9e10  # seed 004: W_ici = 2·9e10
W = 2 * LINK
F = 53248
TOPO = parse_topology("v5p-128")
SETTINGS = TrainSettings(batch=16, seq=64, remat="none", shard="zero3")
HW = R.Hardware(C, LINK, ring="book", wraparound=True)


@functools.lru_cache(None)
def _model(x, y, m_x=2, m_y=1):
  """Every reduce-scatter a ring, as the seed's closed forms assume."""
  return R.fit_mesh(PRESETS["xxl_ffn"], SETTINGS,
                    plan_mesh(TOPO, x, y, m_x, m_y), windowed_einsum=False)


def test_seed_004c_threshold_16x4():
  e = R.step_estimate(_model(16, 4), 32768, HW, "forward")
  assert round(e.threshold_tokens_per_device) == 1581  # seed: B/X >= 1581
  assert round(e.threshold_tokens_global) == 25302  # seed: B >= 25302
  assert e.threshold_tokens_global == pytest.approx(
      FM.fsdp_tp_min_batch(F, 16, 4, 2, 1, C, W), rel=1e-9)
  # T_math and T_comm per block at B tokens: the seed's closed forms.
  t_math, t_comm = FM.fsdp_tp_ffn_forward_times(32768, 16384, F, 16, 4, 2, 1, C, W)
  blocks = next(l for l in e.layers if l.layer == "blocks")
  assert blocks.t_math == pytest.approx(t_math, rel=1e-9)
  assert blocks.t_comm == pytest.approx(t_comm, rel=1e-9)


def test_seed_004d_continuous_and_integer_optimum():
  y, t = R.continuous_optimum(_model(16, 4), HW, "forward")
  assert y == pytest.approx(FM.fsdp_tp_optimal_y(F, 1, C, W), rel=1e-4)  # 10.42
  assert round(t) == 15699
  best = min(((x, yy) for x, yy in [(4, 16), (8, 8), (16, 4), (32, 2)]),
             key=lambda m: R.threshold_tokens(_model(*m), HW, "forward"))
  assert best == (8, 8)
  assert round(R.threshold_tokens(_model(8, 8), HW, "forward")) == 16593
  # Rescaling the 16x4 fit to 8x8 agrees with tracing 8x8.
  assert R.threshold_tokens(_model(16, 4), HW, "forward", X=8, Y=8) == \
      pytest.approx(R.threshold_tokens(_model(8, 8), HW, "forward"), rel=1e-9)


def test_full_step_threshold_includes_backward():
  # Backward: 2x the forward FLOPs, the same collective bytes again (dOut
  # gather, dIn and weight-gradient reduce-scatters), so
  # B >= 2·F·C·X·M_Y / (M_X·(3·F·M_Y·W - 2·C·Y)).
  t = R.threshold_tokens(_model(16, 4), HW, "step")
  assert t == pytest.approx(2 * F * C * 16 / (2 * (3 * F * W - 2 * C * 4)),
                            rel=1e-9)
  assert round(t) == 15630


def test_scaling_book_pure_fsdp_threshold():
  # Y = 1: only weight gathers; per chip C/(M_X·W) tokens: 2555.6 (the
  # Book's "2550") on one axis, 851.9 ("850") over three.
  for m_x, want in ((1, 2555.6), (3, 851.9)):
    t = R.threshold_tokens(_model(64, 1, m_x, 1), HW, "forward")
    assert t / 64 == pytest.approx(want, abs=0.1)
    assert t / 64 == pytest.approx(FM.dp_min_tokens_per_chip(C, W, m_x))


def test_exposed_comm_and_mfu():
  m = _model(16, 4)
  big = R.step_estimate(m, 1e6, HW, "forward")
  # Weight gathers hide under the math at large batch; TP collectives do not.
  blocks = next(l for l in big.layers if l.layer == "blocks")
  assert blocks.t_comm_overlappable < blocks.t_math
  assert big.exposed_comm < big.t_comm
  assert big.step_time == pytest.approx(big.t_math + big.exposed_comm)
  assert 0 < big.mfu < 1 and big.mfu == pytest.approx(big.hfu)


def test_no_wraparound_halves_bandwidth():
  hw = R.Hardware(C, LINK, wraparound=False)
  slow = R.threshold_tokens(_model(16, 4), hw, "forward")
  assert slow == pytest.approx(FM.fsdp_tp_min_batch(F, 16, 4, 2, 1, C, LINK))


def _tiny(attention):
  plan = plan_mesh(parse_topology("v5p-8"), 4, 1)
  s = TrainSettings(batch=8, seq=1024, remat="full", attention=attention)
  model = R.fit_mesh(PRESETS["tiny"], s, plan)
  return R.step_estimate(model, s.tokens, R.Hardware.for_plan(plan))


def test_step_time_adds_hbm_bound_work_to_the_roofline():
  """step = matmuls + the matmuls' time over their FLOPs' where their bytes
  bind them + fusions' HBM bytes / bandwidth + exposed collectives; the
  roofline bound leaves both HBM terms out, so it is the higher MFU."""
  e = _tiny("flash")
  assert e.t_hbm > 0 and e.t_matmul_hbm > 0
  assert e.step_time == pytest.approx(
      e.t_math + e.t_matmul_hbm + e.t_hbm + e.exposed_comm)
  assert e.roofline_mfu > e.mfu > 0


def _one_matmul(flops, nbytes):
  plan = plan_mesh(parse_topology("h100:1"), 1, 1)
  work = R.Work("blocks", "forward", 1, flops, 0.0, 0.0, 1, 1, m0=nbytes)
  return R.MeshModel(plan, (), (work,), {"blocks": 1}, 1024)


def test_a_matmul_takes_the_longer_of_its_flops_and_its_bytes():
  """A kernel's roofline: an attention-score product, bf16 [2048, 128] x
  [128, 512] into f32 [2048, 512], does 268 MFLOP over 4.7 MB (57 FLOP per
  byte, under the H100's 318 at its measured rates): its time is its bytes
  over the bandwidth. A weight product, [8192, 4096] x [4096, 4096] in
  bf16, is bound by its FLOPs and adds nothing."""
  hw = R.Hardware(9.895e14, 4.5e11, hbm_bandwidth=2.5267e12,
                  matmul_flops=8.041e14)
  flops = 2 * 2048 * 128 * 512
  nbytes = 2 * (2048 * 128 + 128 * 512) + 4 * 2048 * 512
  e = R.step_estimate(_one_matmul(flops, nbytes), 1.0, hw, "forward")
  assert e.t_math == pytest.approx(flops / 8.041e14)
  assert e.t_math + e.t_matmul_hbm == pytest.approx(nbytes / 2.5267e12)
  assert e.step_time == pytest.approx(nbytes / 2.5267e12)
  flops = 2 * 8192 * 4096 * 4096
  nbytes = 2 * (8192 * 4096 + 4096 * 4096 + 8192 * 4096)
  e = R.step_estimate(_one_matmul(flops, nbytes), 1.0, hw, "forward")
  assert e.t_matmul_hbm == 0 and e.step_time == pytest.approx(
      flops / 8.041e14)


def test_measured_rates_time_the_step_and_the_datasheet_counts_mfu():
  """Where the chip was measured (the H100: experiments.probe_gpu), the
  step is timed at what it reached; MFU keeps the datasheet's peak. A TPU
  has no measurement: its datasheet's figures time the step."""
  h100 = R.Hardware.for_plan(plan_mesh(parse_topology("h100:1"), 1, 1))
  assert (h100.time_flops, h100.hbm_bandwidth) == (8.041e14, 2.5267e12)
  assert h100.flops_per_chip == 9.895e14
  v5p = R.Hardware.for_plan(plan_mesh(parse_topology("v5p-8"), 4, 1))
  assert v5p.time_flops == v5p.flops_per_chip == 4.59e14
  assert R.Hardware.for_plan(plan_mesh(parse_topology("h100:1"), 1, 1),
                             flops_per_chip=5e14).time_flops == 5e14


def test_lora_model_flops_leave_out_the_frozen_weight_gradients():
  """Full training: 3 x the forward (what MFU has always counted); LoRA:
  the frozen weights' gradients are not work the step does, so the same
  step time is fewer model FLOPs."""
  plan = plan_mesh(parse_topology("v5p-8"), 4, 1)
  fits = {}
  for rank in (0, 8):
    s = TrainSettings(batch=8, seq=128, remat="none", lora_rank=rank)
    m = R.fit_mesh(PRESETS["tiny"], s, plan)
    fwd = sum(w.g1 * w.count for w in m.work if w.phase == "forward")
    fits[rank] = (R._model_flops(m, 1.0, True), fwd)
  assert fits[0][0] == pytest.approx(3 * fits[0][1])
  assert fits[0][1] < fits[8][1]  # the adapters' own forward matmuls
  assert 2 * fits[8][1] < fits[8][0] < 2.5 * fits[8][1]


def test_mxu_padding_rounds_k_and_n_up_to_whole_tiles():
  """The MXU holds [K, N] in tile x tile blocks: K = 384 is 3 whole tiles,
  N = 96 runs as 128 (4/3 the time); v6e's 256 tiles pad 384 to 512."""
  assert R.mxu_padding((384, 96), 128) == pytest.approx(4 / 3)
  assert R.mxu_padding((384, 96), 256) == pytest.approx(512 / 384 * 256 / 96)
  assert R.mxu_padding((4096, 8192), 128) == 1.0
  assert R.mxu_padding((384, 96), 0) == 1.0  # GPUs: not modelled
  assert R.mxu_padding((256, 1), 128) == 1.0  # strength-reduced, no MXU
  from simulator.tracing.batch_probe import PROBE
  assert R.mxu_padding((3 * PROBE, 96), 128) == pytest.approx(4 / 3)


def test_padded_matmuls_take_longer_but_are_not_more_model_flops():
  """tiny's per-device dims (d_model 64, heads 4 x 16) are under one
  128-wide tile: the step's matmuls take longer than their FLOPs at peak,
  MFU's model FLOPs do not change."""
  import dataclasses
  topo = parse_topology("v5p-8")
  flat = dataclasses.replace(
      topo, chip=dataclasses.replace(topo.chip, mxu_size=0))
  s = TrainSettings(batch=8, seq=128, remat="none")
  padded = R.fit_mesh(PRESETS["tiny"], s, plan_mesh(topo, 4, 1))
  plain = R.fit_mesh(PRESETS["tiny"], s, plan_mesh(flat, 4, 1))
  assert max(w.padding for w in padded.work) > 1
  assert all(w.padding == 1 for w in plain.work)
  hw = R.Hardware(C, LINK)
  a, b = (R.step_estimate(m, s.tokens, hw) for m in (padded, plain))
  assert a.t_math > b.t_math
  assert R._model_flops(padded, s.tokens, True) == R._model_flops(
      plain, s.tokens, True)


def test_mxu_dims_are_the_per_device_k_and_n():
  """tiny on 2x2: the q projection bsd,dnh->bsnh contracts d = 64 (the
  FSDP-gathered weight) into 4 heads / Y=2 of 16 = 32 columns per device;
  the output projection contracts those 32 into d = 64."""
  from meshes.layout import abstract_mesh
  from simulator.tracing.program import read_traced
  from simulator.tracing.trace import trace_probe
  plan = plan_mesh(parse_topology("v5p-8"), 2, 2)
  s = TrainSettings(batch=8, seq=128, remat="none")
  p = read_traced(trace_probe(PRESETS["tiny"], s, abstract_mesh(plan)))
  dims = {d.source.split("/")[-2]: d.mxu_dims for d in p.dots
          if d.phase == "forward" and "/attn/" in d.source
          and d.source.split("/")[-2] in ("q", "o")}
  assert dims == {"q": (64, 32), "o": (32, 64)}


def test_host_copies_take_the_host_link_and_only_their_excess_is_exposed():
  """--offload=optimizer copies the moments into HBM for the update and
  back: their bytes over the host link, each way on its own (PCIe is full
  duplex), beside the update's own work; only what the copies take beyond
  it adds to the step. Without offload there is no host time."""
  plan = plan_mesh(parse_topology("v5p-8"), 4, 1)
  cfg = PRESETS["gpt2"]
  settings = TrainSettings(batch=16, seq=512, remat="full",
                           offload=("optimizer",))
  model = R.fit_mesh(cfg, settings, plan)
  hw = R.Hardware.for_plan(plan)
  assert hw.host_bandwidth == 1.5e10  # the Scaling Book's PCIe per chip
  back, there = (sum(h.b0 * h.count for h in model.host if h.to_host == way)
                 for way in (True, False))
  assert back == there > 0  # the moments return as they came
  est = R.step_estimate(model, settings.tokens, hw)
  one_way = sum(h.b0 * h.count for h in model.host if h.to_host)
  assert est.t_host == pytest.approx(one_way / hw.host_bandwidth)
  slow = dataclasses.replace(hw, host_bandwidth=1e8)
  stalled = R.step_estimate(model, settings.tokens, slow)
  assert stalled.exposed_host > 0 and stalled.step_time == pytest.approx(
      est.step_time - est.exposed_host + stalled.exposed_host)
  plain = R.fit_mesh(cfg, dataclasses.replace(settings, offload=()), plan)
  assert R.step_estimate(plain, settings.tokens, hw).t_host == 0.0


def test_a_collective_made_at_some_batches_counts_only_there():
  """On a GPU a layer's output gradient is gathered once at small batches
  and twice at large ones (simulator.tracing.program, `_grouped_side`):
  the model fitted at the probe batch times the gathers of the batch it
  is read at, those the step traced at that batch makes."""
  from meshes.layout import abstract_mesh
  from simulator.tracing import program
  from simulator.tracing.trace import trace
  plan = plan_mesh(parse_topology("h100:8"), 4, 2)
  settings = TrainSettings(batch=8, seq=64, remat="none", shard="zero3")
  model = R.fit_mesh(PRESETS["tiny"], settings, plan)
  assert any(t.present_if is not None for t in model.terms)
  for batch in (8, 256):
    tokens = batch * settings.seq
    fitted = sum((t.b0 + t.b1 * tokens) * t.count for t in model.terms
                 if t.kind == "all-gather" and t.axis == "Y"
                 and t.present(tokens, 1.0, 1.0))
    direct = program.read_traced(trace(
        PRESETS["tiny"], dataclasses.replace(settings, batch=batch),
        abstract_mesh(plan)), gpu=True)
    assert fitted == pytest.approx(sum(
        c.bytes_per_device * c.count for c in direct.made()
        if c.kind == "all-gather" and c.axis == "Y"), rel=1e-9), batch
