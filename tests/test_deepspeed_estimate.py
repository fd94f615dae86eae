"""DeepSpeed's estimator tables (seed 003) and experiments.deepspeed_estimate."""

import os
import subprocess
import sys

from models.params import num_params
from models.registry import load_model
from simulator import formulas
from simulator.inventory import largest_module_params

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# Seed 003's cold tables, as DeepSpeed printed them.
ZERO2 = """\
  127.45GB |   5.31GB | offload_optimizer=cpu 
  127.45GB |  15.93GB | offload_optimizer=none"""
ZERO3 = """\
   71.69GB |   0.12GB | offload_param=cpu , offload_optimizer=cpu , zero_init=1
  127.45GB |   0.12GB | offload_param=cpu , offload_optimizer=cpu , zero_init=0
   63.72GB |   0.78GB | offload_param=none, offload_optimizer=cpu , zero_init=1
  127.45GB |   0.78GB | offload_param=none, offload_optimizer=cpu , zero_init=0
    1.43GB |   6.09GB | offload_param=none, offload_optimizer=none, zero_init=1
  127.45GB |   6.09GB | offload_param=none, offload_optimizer=none, zero_init=0"""


# Seed 003's live tables for AutoModel.from_pretrained("t5-3b"): the live
# model's 2,851,598,336 params (and its 32,899,072-param shared embedding).
LIVE_ZERO2 = """\
  127.48GB |   5.31GB | offload_optimizer=cpu 
  127.48GB |  15.93GB | offload_optimizer=none"""
LIVE_ZERO3 = """\
   71.71GB |   0.12GB | offload_param=cpu , offload_optimizer=cpu , zero_init=1
  127.48GB |   0.12GB | offload_param=cpu , offload_optimizer=cpu , zero_init=0
   63.74GB |   0.79GB | offload_param=none, offload_optimizer=cpu , zero_init=1
  127.48GB |   0.79GB | offload_param=none, offload_optimizer=cpu , zero_init=0
    1.47GB |   6.10GB | offload_param=none, offload_optimizer=none, zero_init=1
  127.48GB |   6.10GB | offload_param=none, offload_optimizer=none, zero_init=0"""
# Seed 003's t5-large example (ZeRO-3, 4 GPUs), as its script prints it.
T5_LARGE_CASES = """\
total params:         737.67M
largest layer params:  32.90M
largest layer memory:    125MB
case1 gpu memory:   3291MB
case2 gpu memory:    125MB
case3 gpu memory:    477MB"""


def _rows(table: str) -> str:
  return "\n".join(table.splitlines()[4:])


def test_seed_003s_cold_tables_line_for_line():
  two = formulas.deepspeed_table(2, 2851 * 10**6, 0, 8, 1, current=False)
  three = formulas.deepspeed_table(3, 2851 * 10**6, 32 * 10**6, 8, 1)
  assert _rows(two) == ZERO2 and _rows(three) == ZERO3
  assert three.splitlines()[2] == ("SW: Model with 2851M total params, 32M "
                                   "largest layer params.")


def test_deepspeeds_current_zero2_formula():
  """2Ψ + 18Ψ/N (stage_1_and_2.py today) where the seed shows 4Ψ + 16Ψ/N."""
  now = formulas.deepspeed_table(2, 2851 * 10**6, 0, 8, 1, current=True)
  assert now.splitlines()[-1] == "  127.45GB |  11.28GB | offload_optimizer=none"


def test_the_largest_layer_is_the_largest_module():
  """llama2_7b: the untied output and embedding tables, 32000 x 4096."""
  assert largest_module_params(load_model("llama2_7b")) == 32000 * 4096


def test_seed_003s_live_t5_3b_tables_from_the_traced_model():
  cfg = load_model("t5_3b")
  total, largest = num_params(cfg), largest_module_params(cfg)
  assert (total, largest) == (2_851_598_336, 32_899_072)
  two = formulas.deepspeed_table(2, total, 0, 8, 1, current=False)
  three = formulas.deepspeed_table(3, total, largest, 8, 1)
  assert _rows(two) == LIVE_ZERO2 and _rows(three) == LIVE_ZERO3


def test_seed_003s_t5_large_example():
  """The largest module is the shared embedding (32128 x 1024), as
  DeepSpeed's loop over model.modules() finds it."""
  env = {**os.environ, "JAX_PLATFORMS": "cpu"}
  p = subprocess.run([sys.executable, "-m", "experiments.deepspeed_estimate",
                      "--stage=3", "--model=t5_large",
                      "--num_gpus_per_node=4"], cwd=ROOT, env=env,
                     capture_output=True, text=True, timeout=300)
  assert p.returncode == 0, p.stderr
  assert T5_LARGE_CASES in p.stdout
  assert "SW: Model with 737M total params, 32M largest layer params." in (
      p.stdout)


def test_bad_input():
  env = {**os.environ, "JAX_PLATFORMS": "cpu"}
  p = subprocess.run([sys.executable, "-m", "experiments.deepspeed_estimate",
                      "--stage=3", "--total_params=2851e6"], cwd=ROOT, env=env,
                     capture_output=True, text=True, timeout=60)
  assert p.returncode == 2 and p.stderr.strip() == (
      "error: --stage=3 needs --largest_layer_params with --total_params "
      "(or give --model)")
  for args, message in (
      (["--stage=2", "--total_params=0"], "--total_params=0.0 must be a "
       "positive count below 1e15"),
      (["--stage=2", "--total_params=nan"], "--total_params=nan must be"),
      (["--model=gpt2", "--total_params=1e6"], "--model=gpt2 with "
       "--total_params: the model's counts are traced"),
      (["--stage=2", "--total_params=1e6", "--largest_layer_params=1e7"],
       "is more than --total_params"),
      (["--stage=3", "--formula=seed", "--model=gpt2"], "--formula=seed with "
       "--stage=3")):
    p = subprocess.run([sys.executable, "-m", "experiments.deepspeed_estimate",
                        *args], cwd=ROOT, env=env, capture_output=True,
                       text=True, timeout=60)
    assert p.returncode == 2 and p.stderr.startswith("error: --") and (
        message in p.stderr) and p.stderr.count("\n") == 1, (args, p.stderr)


def test_seed_003s_pinned_memory_rules():
  """ZeRO-3 with cpu_offload_use_pin_memory: 6Ψ with params offloaded (8Ψ
  with gradient accumulation), 4Ψ without; per node as its general RAM."""
  psi = 2851 * 10**6
  assert formulas.deepspeed_zero3_pinned_bytes(psi, True) == 6 * psi
  assert formulas.deepspeed_zero3_pinned_bytes(psi, True, 4) == 8 * psi
  assert formulas.deepspeed_zero3_pinned_bytes(psi, False, 4) == 4 * psi
  assert formulas.deepspeed_zero3_pinned_bytes(psi, False, 1, 2) == 2 * psi
  assert formulas.deepspeed_pinned_lines(psi) == [
      "    15.93GB per node | ZeRO-3 offload_param=cpu : 6Ψ",
      "    10.62GB per node | ZeRO-3 offload_param=none: 4Ψ"]
