import dataclasses
import json
import re

import pytest

from models.hf_config import from_hf_config
from models.params import num_params
from models.registry import load_model

LLAMA2_7B = {
    "model_type": "llama", "hidden_size": 4096, "intermediate_size": 11008,
    "num_attention_heads": 32, "num_hidden_layers": 32,
    "num_key_value_heads": 32, "vocab_size": 32000, "rms_norm_eps": 1e-5,
    "max_position_embeddings": 4096, "tie_word_embeddings": False,
}
QWEN2_0_5B = {
    "model_type": "qwen2", "hidden_size": 896, "intermediate_size": 4864,
    "num_attention_heads": 14, "num_hidden_layers": 24,
    "num_key_value_heads": 2, "vocab_size": 151936, "tie_word_embeddings": True,
    "rope_theta": 1000000.0,
}
T5_LARGE = {  # HF t5-large's config.json (T5Config defaults for the rest)
    "model_type": "t5", "d_model": 1024, "d_ff": 4096, "d_kv": 64,
    "num_heads": 16, "num_layers": 24, "vocab_size": 32128,
    "n_positions": 512, "relative_attention_num_buckets": 32,
}
GEMMA_2B = {
    "model_type": "gemma", "hidden_size": 2048, "intermediate_size": 16384,
    "num_attention_heads": 8, "num_hidden_layers": 18, "num_key_value_heads": 1,
    "head_dim": 256, "vocab_size": 256000,
}


def _write(tmp_path, raw, name="config.json"):
  path = tmp_path / name
  if isinstance(raw, bytes):
    path.write_bytes(raw)
  else:
    path.write_text(json.dumps(raw) if isinstance(raw, dict) else raw)
  return str(path)


def test_llama_config_matches_the_preset_count(tmp_path):
  cfg = load_model(_write(tmp_path, LLAMA2_7B))
  assert num_params(cfg) == 6_738_415_616


def test_qwen2_has_qkv_bias_and_tied_embeddings(tmp_path):
  # Qwen2-0.5B's published count is 494,032,768.
  cfg = from_hf_config(_write(tmp_path, QWEN2_0_5B))
  assert cfg.qkv_bias and cfg.tie_embeddings
  assert num_params(cfg) == 494_032_768


def test_gemma_uses_its_head_dim_and_geglu(tmp_path):
  # Gemma-2B's published count is 2,506,172,416.
  cfg = from_hf_config(_write(tmp_path, GEMMA_2B))
  assert (cfg.head_dim, cfg.mlp, cfg.tie_embeddings) == (256, "geglu", True)
  assert num_params(cfg) == 2_506_172_416


def test_t5_large_config_is_the_preset(tmp_path):
  cfg = from_hf_config(_write(tmp_path, T5_LARGE, "t5-large.json"))
  assert cfg == dataclasses.replace(load_model("t5_large"), name="t5-large")
  assert num_params(cfg) == 737_668_096


def test_t5_v1_1_small_is_gated_gelu_and_untied():
  """google/t5-v1_1-small (kept in models/configs): 76,961,152 parameters
  as HF counts them, its lm_head untied."""
  cfg = load_model("models/configs/t5-v1_1-small.json")
  assert (cfg.mlp, cfg.tie_embeddings, cfg.encoder_layers, cfg.n_layers) == (
      "geglu", False, 8, 8)
  assert num_params(cfg) == 76_961_152


@pytest.mark.parametrize("raw, message", [
    ({**T5_LARGE, "feed_forward_proj": "gated-silu"},
     "feed_forward_proj='gated-silu' is not supported; valid: relu, gelu, "
     "gated-gelu"),
    ({k: v for k, v in T5_LARGE.items() if k != "d_kv"}, "missing 'd_kv'"),
    ({**T5_LARGE, "relative_attention_num_buckets": 3},
     "relative_buckets=3 must be even and >= 4"),
    ({**T5_LARGE, "num_decoder_layers": 0.5}, "num_decoder_layers=0.5 must"),
    ({**T5_LARGE, "layer_norm_epsilon": -1}, "layer_norm_epsilon=-1 must"),
])
def test_bad_t5_configs_name_the_problem(tmp_path, raw, message):
  with pytest.raises(ValueError, match=re.escape(message)):
    from_hf_config(_write(tmp_path, raw))


@pytest.mark.parametrize("raw, message", [
    ("{not json", "not valid JSON"),
    ({**LLAMA2_7B, "model_type": "bert"}, "model_type='bert' is not supported"),
    ({k: v for k, v in LLAMA2_7B.items() if k != "vocab_size"},
     "missing 'vocab_size'"),
    ({**LLAMA2_7B, "hidden_size": 0}, "hidden_size=0"),
    ({**LLAMA2_7B, "num_hidden_layers": -2}, "n_layers=-2"),
    ("[1, 2]", "expected a JSON object"),
    ({**LLAMA2_7B, "num_attention_heads": 30}, "not a multiple of"),
    ({**LLAMA2_7B, "num_key_value_heads": 3}, "num_attention_heads=32 is not "
     "a multiple of num_key_value_heads=3; valid num_key_value_heads: 1, 2, "
     "4, 8, 16, 32"),
    ({**LLAMA2_7B, "rope_theta": float("nan")}, "rope_theta=nan"),
    ({**LLAMA2_7B, "rms_norm_eps": {"a": 1}}, "rms_norm_eps={'a': 1}"),
    ({**LLAMA2_7B, "rms_norm_eps": None}, None),
    ({**LLAMA2_7B, "vocab_size": 1e12}, "vocab_size=1000000000000.0 must be"),
    ({**LLAMA2_7B, "num_hidden_layers": True}, "num_hidden_layers=True must"),
    ({**LLAMA2_7B, "intermediate_size": "big"}, "intermediate_size='big'"),
    ("[" * 100000 + "]" * 100000, "nested too deeply"),
    # a string is not a boolean ("false" would read as true)
    ({**LLAMA2_7B, "tie_word_embeddings": "false"},
     "tie_word_embeddings='false' must be true or false"),
    ({**LLAMA2_7B, "attention_bias": "false"},
     "attention_bias='false' must be true or false"),
    # rotary embeddings rotate pairs of features
    ({**LLAMA2_7B, "hidden_size": 4000}, "head_dim=125 (hidden_size=4000 / "
     "num_attention_heads=32) is odd"),
    ({**LLAMA2_7B, "head_dim": 127}, "head_dim=127 is odd"),
    (b"\xff\xfe{}", "not UTF-8 text"),
])
def test_bad_configs_name_the_problem(tmp_path, raw, message):
  if message is None:  # null means the family's default
    assert from_hf_config(_write(tmp_path, raw)).norm_eps == 1e-6
    return
  with pytest.raises(ValueError, match=re.escape(message)):
    from_hf_config(_write(tmp_path, raw))


def test_missing_file():
  with pytest.raises(ValueError, match="cannot read model config"):
    load_model("/nonexistent/config.json")


def test_a_checkout_folder_reads_its_config_json(tmp_path):
  """--model=FOLDER (a Hugging Face checkout) reads FOLDER/config.json and
  is named by the folder."""
  folder = tmp_path / "Llama-2-7b-hf"
  folder.mkdir()
  (folder / "config.json").write_text(json.dumps(LLAMA2_7B))
  cfg = load_model(str(folder))
  assert cfg.name == "Llama-2-7b-hf" and cfg.d_model == 4096
