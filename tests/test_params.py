"""Every preset's parameter count from jax.eval_shape equals the published one."""

import os
import subprocess
import sys

import pytest

from models.params import num_params
from models.presets import PRESETS

PUBLISHED = {
    "gpt2": 124_439_808,
    "llama2_7b": 6_738_415_616,
    "llama2_13b": 13_015_864_320,
    "llama2_70b": 68_976_648_192,
    "llama3_8b": 8_030_261_248,
    "llama3_70b": 70_553_706_496,
    "mistral_7b": 7_241_732_096,
    "xxl_ffn": 219_848_638_464,
}


@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_published_counts(name):
  assert num_params(PRESETS[name]) == PUBLISHED[name]


def test_gpt3_175b_is_the_papers_architecture():
  # 96 layers of 12·d² + 13·d (GPT layout with biases), tied 50257-vocab
  # embedding and 2048 learned positions, final LayerNorm: 174,604,259,328,
  # the paper's "175.0B".
  d, layers = 12288, 96
  expected = layers * (12 * d * d + 13 * d) + 50257 * d + 2048 * d + 2 * d
  assert num_params(PRESETS["gpt3_175b"]) == expected == 174_604_259_328


def test_xxl_is_two_linears_per_block():
  assert num_params(PRESETS["xxl_ffn"]) == 126 * 2 * 16384 * 53248


def test_counting_parameters_starts_no_backend():
  """The shapes are read off an abstract trace only: nothing runs on a
  device, so a sweep never starts a backend nor compiles (a fresh process:
  this one's tests have started one)."""
  code = ("from models.params import num_params\n"
          "from models.presets import PRESETS\n"
          "num_params(PRESETS['tiny'])\n"
          "from jax._src import xla_bridge\n"
          "print(sorted(xla_bridge._backends))\n")
  root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  p = subprocess.run([sys.executable, "-c", code], cwd=root,
                     capture_output=True, text=True, timeout=120)
  assert (p.returncode, p.stdout.strip()) == (0, "[]"), p.stderr[-500:]
