"""models.quant (issue 17): a QLoRA base stored as nf4 or int8 codes."""

import math
import os
import subprocess
import sys

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from meshes.layout import abstract_mesh, plan_mesh
from meshes.topology import parse_topology
from models import quant
from models.config import ModelConfig
from models.layers import Dense
from models.registry import load_model
from models.rules import FSDP_TP
from simulator import memory
from simulator.inventory import describe_params
from simulator.settings import TrainSettings
from simulator.step import PlanError, build_step, trainable_params

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
QLORA = dict(lora_rank=8, precision="bf16")


def _dense(kind: str) -> Dense:
  return Dense((128, 256), ("embed", "mlp"), "bd,df->bf", ("batch", "mlp"),
               FSDP_TP, jnp.float32, jnp.float32, quant=kind)


def test_nf4_codes_dequantize_to_levels_times_the_block_absmax():
  """Byte 0x7F holds codes 7 (level 0.0) and 15 (level 1.0); absmax code
  127 of group scale s is s, so the kernel alternates 0, s."""
  dense, x = _dense("nf4"), jnp.ones((1, 128))
  p = nn.unbox(dense.init(jax.random.key(0), x)["params"])
  p["kernel_nf4"] = jnp.full_like(p["kernel_nf4"], 0x7F)
  p["kernel_absmax"] = jnp.full_like(p["kernel_absmax"], 127)
  p["kernel_absmax_scale"] = jnp.full_like(p["kernel_absmax_scale"], 2.0)
  y = dense.apply({"params": p}, x)
  assert np.allclose(y[0], np.tile([0.0, 2.0 * 128], 128))
  # One more level: code 0 is -1.0; byte 0x0F: codes 0 and 15.
  p["kernel_nf4"] = jnp.full_like(p["kernel_nf4"], 0x0F)
  y = dense.apply({"params": p}, x)
  assert np.allclose(y[0], np.tile([-2.0 * 128, 2.0 * 128], 128))


def test_int8_codes_scale_by_the_absmax_of_their_output_feature():
  dense, x = _dense("int8"), jnp.ones((1, 128))
  p = nn.unbox(dense.init(jax.random.key(0), x)["params"])
  p["kernel_int8"] = jnp.full_like(p["kernel_int8"], 127)
  p["kernel_absmax"] = jnp.arange(256, dtype=jnp.float32)
  y = dense.apply({"params": p}, x)
  assert np.allclose(y[0], 128 * np.arange(256))


@pytest.mark.parametrize("kind", ["nf4", "int8"])
def test_stored_bytes_per_weight_of_llama2_7b(kind):
  """The layer projections' codes and scales, over the weights they hold:
  0.5 + 1/64 + 4/16384 for nf4 (up to the last partial absmax group of
  each array), 1 + 4/fan_in for int8; the parameter count is the model's."""
  cfg = load_model("llama2_7b")
  plan = plan_mesh(parse_topology("v5p-8"), 4, 1)
  full = describe_params(cfg, plan, TrainSettings(**QLORA))
  info = describe_params(cfg, plan, TrainSettings(**QLORA, base_quant=kind))
  q = info["quantized_base"]
  assert info["num_params"] == full["num_params"]
  assert info["trainable_params"] == full["trainable_params"]
  layer = 4 * 4096 * 4096 + 3 * 4096 * 11008
  assert q["weights"] == 32 * layer
  if kind == "nf4":
    assert q["bytes_per_weight"] == pytest.approx(
        quant.bytes_per_weight("nf4"), abs=2e-6)
  else:  # fan_in 4096 for every projection but wo's 11008
    scales = 32 * 4 * (4 * 4096 + 2 * 11008 + 4096)
    assert q["bytes"] == q["weights"] + scales
  assert info["quantized_base"]["bytes"] < full["per_device_param_bytes"] * 4


def test_the_step_moves_codes_and_trains_only_the_adapters():
  """A tiny model whose projections' last dims hold whole nf4 blocks."""
  cfg = ModelConfig("tiny64", d_model=128, n_layers=2, d_ff=256, n_heads=2,
                    n_kv_heads=2, head_dim=64, vocab_size=256, max_len=128)
  plan = plan_mesh(parse_topology("v5p-8"), 2, 2)
  settings = TrainSettings(batch=8, seq=64, base_quant="nf4", **QLORA)
  step = build_step(cfg, settings, abstract_mesh(plan))
  assert trainable_params(step) == trainable_params(build_step(
      cfg, TrainSettings(batch=8, seq=64, **QLORA), abstract_mesh(plan)))
  dtypes = {str(x.dtype) for x in jax.tree.leaves(step.params["blocks"])}
  assert "uint8" in dtypes
  est = memory.memory_report(cfg, settings, plan)
  plain = memory.memory_report(cfg, TrainSettings(batch=8, seq=64, **QLORA),
                               plan)
  assert est.per_device_bytes["params"] < plain.per_device_bytes["params"]


def test_a_block_count_y_does_not_divide_is_refused():
  """llama2_7b's wi has 11008/64 = 172 nf4 blocks per row: Y=8 cannot
  shard them."""
  plan = plan_mesh(parse_topology("v5p-16"), 1, 8)
  with pytest.raises(PlanError, match="kernel_absmax: dimension 172"):
    build_step(load_model("llama2_7b"), TrainSettings(
        batch=8, base_quant="nf4", **QLORA), abstract_mesh(plan))


def test_a_quantized_base_needs_adapters_and_a_known_kind():
  with pytest.raises(ValueError, match="needs lora_rank > 0"):
    TrainSettings(base_quant="nf4")
  with pytest.raises(ValueError, match="base_quant='fp4'"):
    TrainSettings(base_quant="fp4", lora_rank=4)
  with pytest.raises(ValueError, match="^base_quant=nf4: q/kernel's last dim "
                     "is 16, not a multiple of nf4's blocks of 64; choose "
                     "--base_quant=int8 or none"):
    build_step(load_model("tiny"), TrainSettings(batch=8, seq=64,
                                                 base_quant="nf4", **QLORA),
               abstract_mesh(plan_mesh(parse_topology("v5p-8"), 4, 1)))
  out = subprocess.run(
      [sys.executable, "-m", "experiments.describe", "--model=tiny",
       "--topology=v5p-8", "--base_quant=nf4"], cwd=ROOT,
      env={**os.environ, "JAX_PLATFORMS": "cpu"}, capture_output=True,
      text=True, timeout=120)
  assert out.returncode == 2
  assert out.stderr.strip().startswith("error: base_quant=nf4 needs lora_rank")
  assert len(out.stderr.strip().splitlines()) == 1
