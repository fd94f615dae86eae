"""models.decode: the KV cache's layout, int8 quantization, and a decode step
that gives the logits a full forward pass gives."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from models import decode
from models.presets import PRESETS
from models.transformer import Decoder
from simulator import formulas


def test_cache_bytes_exact_from_shapes():
  """llama2_7b, 8 sequences of 1280 positions: 2·L·B·S·K·H·bytes, and int8's
  bf16 scales per token per kv head on top of one byte per element."""
  args = (32, 8, 1280, 32, 128)
  bf16 = decode.cache_bytes(decode.cache_layout(*args, "bf16"))
  int8 = decode.cache_bytes(decode.cache_layout(*args, "int8"))
  assert bf16 == 2 * 32 * 8 * 1280 * 32 * 128 * 2 == 5_368_709_120
  assert int8 == 2 * 32 * 8 * 1280 * 32 * (128 + 2) == 2_726_297_600
  assert int8 == formulas.kv_cache_bytes(8, 1280, 32, 32, 128, 1, 2)


def test_cache_bytes_per_device_divide_by_the_shards():
  layout = decode.cache_layout(32, 8, 1280, 8, 128, "int8")
  whole = decode.cache_bytes(layout)
  assert decode.cache_bytes(layout, {"batch": 4, "kv_heads": 2}) == whole // 8


def test_unknown_kv_dtype_is_refused():
  with pytest.raises(ValueError, match="kv_dtype='fp8'; valid: bf16, int8"):
    decode.cache_layout(2, 1, 8, 2, 16, "fp8")


def test_int8_round_trip_within_half_a_step_per_head():
  x = jax.random.normal(jax.random.key(0), (2, 5, 3, 64), jnp.float32)
  q, scale = decode.quantize(x)
  assert q.dtype == jnp.int8 and scale.shape == (2, 5, 3)
  layer = decode.KVCache(q, q, scale, scale)
  back, _ = decode.read(layer, jnp.float32)
  step = np.asarray(scale, np.float32)[..., None] / decode.MAX_INT8
  # half a step of rounding, plus the bf16 scale's relative error (2^-8)
  bound = step * 0.5 + np.abs(np.asarray(x)) * 2.0 ** -8
  assert np.all(np.abs(np.asarray(back) - np.asarray(x)) <= bound + 1e-6)


def _serve(cfg, kv_dtype, ids, split, decode_positions):
  """Logits of the last token: one prefill of all ids, and (per position in
  decode_positions) a prefill of ids[:, :split] then one decode step of
  ids[:, split] at that position."""
  model = Decoder(cfg, attention="materialized", dtype=jnp.float32,
                  param_dtype=jnp.float32)
  params = jax.jit(model.init)(jax.random.key(0), ids, ids)["params"]
  layout = decode.cache_layout(cfg.n_layers, ids.shape[0], ids.shape[1] + 3,
                               cfg.n_kv_heads, cfg.head_dim, kv_dtype)
  empty = decode.KVCache(**{n: jnp.zeros(s, d)
                            for n, (s, d, _) in layout.items()})
  # The weights an argument, not constants: each shape compiles once, fast.
  run = jax.jit(lambda p, x, cache, pos: model.apply(
      {"params": p}, x, cache=cache, pos=pos))
  full, _ = run(params, ids, empty, jnp.int32(0))
  _, cache = run(params, ids[:, :split], empty, jnp.int32(0))
  steps = [run(params, ids[:, split:split + 1], cache, jnp.int32(p))[0]
           for p in decode_positions]
  return np.asarray(full), [np.asarray(x) for x in steps]


@pytest.mark.parametrize("positions,kv_dtype,tol", [
    ("rope", "bf16", 0.01), ("rope", "int8", 0.03), ("learned", "int8", 0.03)])
def test_decode_step_gives_the_full_forward_logits(positions, kv_dtype, tol):
  cfg = dataclasses.replace(PRESETS["tiny"], positions=positions)
  ids = jax.random.randint(jax.random.key(1), (2, 9), 0, cfg.vocab_size)
  full, (step, wrong) = _serve(cfg, kv_dtype, ids, 8, (8, 9))
  error = np.abs(full - step).max()
  assert error <= tol * np.abs(full).max()
  # at the wrong position (one written slot skipped) the logits differ more
  assert np.abs(full - wrong).max() > 5 * error
