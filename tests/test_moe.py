"""models.moe: exact counts, routing semantics, the traced step at a mesh."""

import dataclasses
import json
import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from meshes.layout import abstract_mesh, plan_mesh
from meshes.topology import parse_topology
from models import moe
from models.config import ModelConfig
from models.hf_config import from_hf_config
from models.params import num_params
from models.presets import PRESETS
from models.transformer import Decoder
from simulator.timing import roofline as R
from simulator.inventory import describe_params
from simulator.tracing.program import read_traced
from simulator.settings import TrainSettings
from simulator.step import build_step, trainable_params
from simulator.tracing.trace import trace_probe

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CONFIGS = os.path.join(ROOT, "models", "configs")
TINY = PRESETS["tiny_moe"]
PLAN = plan_mesh(parse_topology("v5p-8"), 2, 2)


def test_mixtral_8x7b_count_is_exact_from_preset_and_config_json():
  assert num_params(PRESETS["mixtral_8x7b"]) == 46_702_792_704
  cfg = from_hf_config(os.path.join(CONFIGS, "mixtral-8x7b.json"))
  assert num_params(cfg) == 46_702_792_704
  assert (cfg.n_experts, cfg.experts_per_token, cfg.expert_d_ff) == (8, 2,
                                                                     14336)


def test_qwen1_5_moe_count_matches_the_closed_form_of_its_config():
  path = os.path.join(CONFIGS, "qwen1.5-moe-a2.7b.json")
  with open(path) as f:
    raw = json.load(f)
  d, v, L = raw["hidden_size"], raw["vocab_size"], raw["num_hidden_layers"]
  e, f_e, f_s = (raw["num_experts"], raw["moe_intermediate_size"],
                 raw["shared_expert_intermediate_size"])
  attn = 4 * d * d + 3 * d  # q, k, v, o (16 heads of 128 = d) + qkv biases
  layer = (attn + d * e  # router
           + e * 3 * d * f_e + 3 * d * f_s + d  # experts, shared, its gate
           + 2 * d)  # two norms
  closed = L * layer + 2 * v * d + d  # untied embedding/output, final norm
  assert closed == 14_315_784_192  # Qwen1.5-MoE-A2.7B's "14.3B"
  cfg = from_hf_config(path)
  assert not cfg.router_renormalize  # norm_topk_prob: false
  assert num_params(cfg) == closed


def test_active_parameters_count_top_k_experts():
  info = describe_params(PRESETS["mixtral_8x7b"],
                         plan_mesh(parse_topology("v5p-128"), 16, 4))
  experts = 32 * 8 * 3 * 4096 * 14336
  assert info["active_params"] == 46_702_792_704 - experts * 6 // 8
  assert info["active_params"] == 12_879_925_248  # Mixtral's "12.9B active"


def test_expert_weights_layout_by_expert_axis():
  """Unsplit experts are laid out like a dense MLP; over X, each device
  holds whole experts (X no longer splits embed)."""
  specs = {}
  for axis in ("none", "x"):
    info = describe_params(TINY, PLAN, TrainSettings(expert_axis=axis))
    wi = next(g for g in info["params"]
              if g["path"] == "blocks/moe/experts/wi/kernel")
    assert wi["logical_axes"] == ["layers", "exp", "embed", "mlp"]
    specs[axis] = (wi["partition_spec"], wi["per_device_shape"])
  assert specs["none"] == ([None, None, "X", "Y"], [2, 4, 32, 48])
  assert specs["x"] == ([None, "X", None, "Y"], [2, 2, 64, 48])


def test_route_renormalises_top_k_as_mixtral_and_not_as_qwen():
  logits = jnp.log(jnp.array([[[0.5, 0.3, 0.2, 0.0]]]) + 1e-30)
  _, w, idx = moe.route(logits, 2, renormalize=True)
  np.testing.assert_allclose(w[0, 0], [0.625, 0.375], rtol=1e-6)
  assert idx[0, 0].tolist() == [0, 1]
  _, w, _ = moe.route(logits, 2, renormalize=False)
  np.testing.assert_allclose(w[0, 0], [0.5, 0.3], rtol=1e-6)


def test_capacity_drops_choices_past_an_experts_slots():
  """Four tokens all choose expert 0 first; 2 slots per expert keep the
  first two (in token order) and drop the rest; second choices spread."""
  experts = jnp.array([[[0, 1], [0, 2], [0, 1], [0, 3]]])
  weights = jnp.array([[[0.6, 0.4], [0.7, 0.3], [0.8, 0.2], [0.9, 0.1]]])
  c = np.asarray(moe.combine_weights(weights, experts, 4, 2))[0]  # SxExC
  assert c.shape == (4, 4, 2)
  np.testing.assert_allclose(c[:, 0], [[0.6, 0], [0, 0.7], [0, 0], [0, 0]])
  np.testing.assert_allclose(c[:, 1], [[0.4, 0], [0, 0], [0, 0.2], [0, 0]])
  np.testing.assert_allclose(c[:, 2, 0], [0, 0.3, 0, 0])
  np.testing.assert_allclose(c[:, 3, 0], [0, 0, 0, 0.1])
  assert c.sum() == pytest.approx(0.6 + 0.4 + 0.7 + 0.3 + 0.2 + 0.1)


def test_capacity_is_maxtexts_formula():
  cfg = dataclasses.replace(TINY, n_experts=8, experts_per_token=2)
  assert moe.capacity(cfg, 4096, 1.0) == 1024
  assert moe.capacity(cfg, 4096, 1.25) == 1280
  assert moe.capacity(cfg, 3, 1.0) == 1  # ceil(3·2/8)
  assert moe.active_fraction(cfg, 4096, 2.0) == 0.5


def test_load_balancing_loss_on_known_routing():
  e = 4
  uniform = jnp.full((1, 8, e), 1 / e)
  balanced = jnp.arange(8).reshape(1, 8, 1) % e
  assert float(moe.load_balancing_loss(uniform, balanced)) == pytest.approx(1)
  collapsed = jax.nn.one_hot(jnp.zeros((1, 8), jnp.int32), e)
  assert float(moe.load_balancing_loss(
      collapsed, jnp.zeros((1, 8, 1), jnp.int32))) == pytest.approx(e)
  # Half the tokens on expert 0 (p 0.5 there), half on 1 (p 0.5): f = P =
  # (0.5, 0.5, 0, 0) -> 4 · 0.5 = 2.
  probs = jnp.tile(jnp.array([0.5, 0.5, 0, 0]), (1, 8, 1))
  half = (jnp.arange(8) // 4).reshape(1, 8, 1)
  assert float(moe.load_balancing_loss(probs, half)) == pytest.approx(2)


def test_the_loss_adds_the_weighted_load_balancing_loss():
  ids = jax.random.randint(jax.random.key(1), (2, 16), 0, TINY.vocab_size)
  params = jax.jit(Decoder(TINY).init)(jax.random.key(0), ids, ids)
  losses = {}
  for coef in (0.0, 1.0):  # the coefficient is a setting, not a parameter
    model = Decoder(dataclasses.replace(TINY, router_aux_loss_coef=coef))
    losses[coef] = float(jax.jit(model.apply)(params, ids, ids))
  aux = losses[1.0] - losses[0.0]  # the layers' mean E·Σ f·P
  assert 1.0 <= aux <= TINY.n_experts  # k=2 spread over 4 experts: >= 1


def _program(**kw):
  settings = TrainSettings(batch=4, seq=64, **kw)
  return read_traced(trace_probe(TINY, settings, abstract_mesh(PLAN)))


def test_expert_parallelism_moves_tokens_by_all_to_all_over_x():
  kinds = lambda p: {(c.kind, c.axis) for c in p.collectives}
  assert ("all-to-all", "X") not in kinds(_program())
  assert ("all-to-all", "X") in kinds(_program(expert_axis="x"))


def test_a_shared_expert_traces_at_a_mesh_and_adds_its_parameters():
  """Qwen2-MoE's layout: a shared expert every token goes through, behind a
  sigmoid gate, beside top-k experts whose weights are not renormalised."""
  qwen = dataclasses.replace(TINY, shared_expert_d_ff=32,
                             router_renormalize=False)
  d = TINY.d_model
  assert num_params(qwen) - num_params(TINY) == TINY.n_layers * (
      3 * d * 32 + d)
  program = read_traced(trace_probe(qwen, TrainSettings(batch=4, seq=64),
                                    abstract_mesh(PLAN)))
  gates = [x for x in program.dots if "shared_expert_gate" in x.source]
  assert gates and all(x.kind in ("weight", "weight_grad") for x in gates)


def test_model_flops_count_routed_tokens_not_capacity_or_dispatch():
  """More capacity (cf 2) doubles the experts' and dispatch matmuls the step
  does, not the model FLOPs MFU counts."""
  seq = 64
  fits = {}
  for cf in (1.0, 2.0):
    settings = TrainSettings(batch=4, seq=seq, capacity_factor=cf)
    fits[cf] = R.fit_mesh(TINY, settings, PLAN)
  tokens = 4 * seq
  done = {cf: sum(w.g1 * w.count for w in m.work) for cf, m in fits.items()}
  model = {cf: R._model_flops(m, tokens, True) for cf, m in fits.items()}
  assert done[2.0] > 1.3 * done[1.0]
  assert model[2.0] == pytest.approx(model[1.0], rel=1e-9)
  dense = dataclasses.replace(TINY, n_experts=0, experts_per_token=0,
                              expert_d_ff=0, d_ff=TINY.expert_d_ff)
  # Per token the routed experts do k dense MLPs' work; the router adds
  # 2·d·E per token forward (3x in training).
  dense_model = R._model_flops(R.fit_mesh(dense, TrainSettings(batch=4,
                                                               seq=seq),
                                          PLAN), tokens, True)
  mlp = 3 * 2 * 3 * TINY.d_model * TINY.expert_d_ff * TINY.n_layers
  router = 3 * 2 * TINY.d_model * TINY.n_experts * TINY.n_layers
  k = TINY.experts_per_token
  assert model[1.0] / tokens == pytest.approx(
      dense_model / tokens + (k - 1) * mlp + router, rel=1e-9)


@pytest.mark.parametrize("field, value, message", [
    ("experts_per_token", 5, "experts_per_token=5 exceeds n_experts=4"),
    ("expert_d_ff", 0, "expert_d_ff=0 must be a positive integer"),
    ("bias", True, "bias=True with n_experts=4"),
    ("n_experts", -1, "n_experts=-1 must be an integer >= 0"),
])
def test_bad_moe_configs_are_one_line_errors(field, value, message):
  with pytest.raises(ValueError, match=message) as e:
    dataclasses.replace(TINY, **{field: value})
  assert "\n" not in str(e.value)


def _cli(*flags):
  return subprocess.run([sys.executable, "-m", "experiments.describe",
                         "--topology=v5p-8", "--mesh=2x2", *flags], cwd=ROOT,
                        capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("key, value, message", [
    ("decoder_sparse_step", 2, "decoder_sparse_step=2 is not supported"),
    ("mlp_only_layers", [0], "mlp_only_layers=[0] is not supported"),
    ("num_experts_per_tok", 61, "experts_per_token=61 exceeds n_experts=60"),
])
def test_unsupported_qwen2_moe_configs_exit_2_with_one_line(tmp_path, key,
                                                            value, message):
  with open(os.path.join(CONFIGS, "qwen1.5-moe-a2.7b.json")) as f:
    raw = json.load(f)
  path = tmp_path / "config.json"
  path.write_text(json.dumps({**raw, key: value}))
  out = _cli(f"--model={path}")
  assert out.returncode == 2
  assert out.stderr.count("\n") == 1 and message in out.stderr, out.stderr
  assert "Traceback" not in out.stderr


def test_lora_on_the_experts_is_refused_and_on_attention_trains_adapters():
  settings = TrainSettings(batch=4, seq=64, lora_rank=4,
                           lora_targets=("q", "wi"))
  with pytest.raises(ValueError, match="'wi' is in tiny_moe's mixture of "
                     "experts, where adapters are not built"):
    build_step(TINY, settings, abstract_mesh(PLAN))
  step = build_step(TINY, dataclasses.replace(settings, lora_targets=("q",)),
                    abstract_mesh(PLAN))
  assert trainable_params(step) == TINY.n_layers * 4 * (
      TINY.d_model + TINY.n_heads * TINY.head_dim)


def test_describe_prints_total_and_active_parameters():
  out = _cli("--model=tiny_moe", "--expert_axis=x")
  assert out.returncode == 0, out.stderr
  lines = out.stdout.splitlines()
  assert lines[0] == f"model tiny_moe: {num_params(TINY):,} parameters"
  assert lines[1].startswith("active per token: ") and "2 of 4 experts" in (
      lines[1]) and "expert axis x" in lines[1]
  bad = _cli("--model=tiny_moe", "--expert_axis=y")
  assert bad.returncode == 2 and "Traceback" not in bad.stderr


@pytest.mark.parametrize("flag, message", [
    ("--capacity_factor=1.25",
     "error: capacity_factor=1.25: tiny has no mixture of experts; it sets a "
     "routed model's experts (e.g. mixtral_8x7b)"),
    ("--expert_axis=x",
     "error: expert_axis=x: tiny has no mixture of experts; it sets a routed "
     "model's experts (e.g. mixtral_8x7b)"),
])
def test_a_dense_model_refuses_expert_settings(flag, message,
                                               refused_by_memory_report):
  refused_by_memory_report(["--model=tiny", flag], message)
