"""simulator.xla.bytes_probe and experiments.probe_bytes: one piece of a step
compiled for one TPU chip, XLA's bytes beside the step-time model's."""

import subprocess
import sys

import pytest

from experiments import cli  # noqa: F401  (sets JAX_PLATFORMS first)
from simulator.xla import bytes_probe

SMALL = dict(batch=1, seq=1024, d_model=256, vocab=2048, kv_heads=2,
             groups=2, head_dim=128)


@pytest.mark.parametrize("piece", bytes_probe.PIECES)
def test_a_piece_counts_the_matmuls_xla_counts(piece):
  """Both sides count the same matmuls, each loop body once (the flash
  loops run their blocks in a loop): the model's matmul FLOPs are XLA's
  flops less its elementwise ops' few, and both sides count bytes."""
  got = bytes_probe.measure(piece, "v5p-8", **SMALL)
  assert 0.9 < got.matmul_flops / got.xla_flops <= 1.0, got
  assert got.xla_bytes > 0 and got.matmul_bytes > 0 and got.fusion_bytes > 0
  assert f"{piece}: XLA's bytes accessed" in got.line()


def test_bad_pieces_and_targets_are_named():
  with pytest.raises(ValueError, match="valid: loss, flash"):
    bytes_probe.measure("mlp")
  with pytest.raises(ValueError, match="GPU's"):
    bytes_probe.measure("loss", "h100:8")


@pytest.mark.parametrize("pieces,message", [
    ("loss,mlp", "error: --pieces=mlp: valid pieces are loss, flash"),
    ("", "error: --pieces is empty; valid pieces are loss, flash")])
def test_the_command_refuses_a_bad_piece_in_one_line(pieces, message):
  p = subprocess.run([sys.executable, "-m", "experiments.probe_bytes",
                      f"--pieces={pieces}"], capture_output=True, text=True,
                     timeout=300)
  assert p.returncode == 2
  assert p.stderr.strip() == message, p.stderr


def test_a_models_dims_are_its_configs():
  from models.registry import load_model
  assert bytes_probe.model_shapes(load_model("llama3_1_8b")) == dict(
      d_model=4096, vocab=128256, kv_heads=8, groups=4, head_dim=128)
  with pytest.raises(ValueError, match="xxl_ffn has no attention heads"):
    bytes_probe.model_shapes(load_model("xxl_ffn"))


def test_the_command_refuses_dims_beside_a_model():
  p = subprocess.run([sys.executable, "-m", "experiments.probe_bytes",
                      "--model=llama3_1_8b", "--vocab=5"],
                     capture_output=True, text=True, timeout=300)
  assert p.returncode == 2
  assert p.stderr.strip() == ("error: --vocab given with --model=llama3_1_8b: "
                              "the model's config sets the dims; give one or "
                              "the other"), p.stderr


def test_the_compiled_modules_can_be_kept(tmp_path):
  """--dump_dir keeps the piece's optimized module, where XLA's fusions are
  read (the loss's logits matmul fusion makes their max too)."""
  got = bytes_probe.measure("loss", "v5p-8", **SMALL, dump_dir=str(tmp_path))
  assert got.xla_bytes > 0
  optimized = list(tmp_path.glob("*after_optimizations.txt"))
  assert optimized, sorted(p.name for p in tmp_path.iterdir())
  assert "ENTRY" in optimized[0].read_text()
