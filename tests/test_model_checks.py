"""simulator.model_checks: the settings a model cannot take, one-line
ValueErrors before any tracing, with no jax imported."""

import subprocess
import sys

import pytest

from models.registry import load_model
from simulator.model_checks import (PlanError, check_heads_over_y,
                                    check_model_settings, check_pipeline,
                                    check_flash_length, check_seq,
                                    kv_heads_replicated,
                                    with_images)
from simulator.settings import TrainSettings


def _settings(**kw) -> TrainSettings:
  return TrainSettings(**{"batch": 8, "seq": 32, **kw})


@pytest.mark.parametrize("model,kw,needle", [
    ("tiny", {"target_seq": 16}, "has no encoder"),
    ("tiny", {"capacity_factor": 1.25}, "^capacity_factor=1.25: tiny has no "
     "mixture of experts; it sets"),
    ("tiny_moe", {"lora_rank": 4, "lora_targets": ("q", "wi")},
     "'wi' is in tiny_moe's mixture of experts"),
    # an adapter on a projection the model lacks would train nothing
    ("gpt2", {"lora_rank": 4, "lora_targets": ("q", "wi_gate")},
     "gpt2 has no 'wi_gate' projection; valid: q, k, v, o, wi, wo"),
    ("xxl_ffn", {"lora_rank": 4, "lora_targets": ("q",)},
     "xxl_ffn has no 'q' projection; valid: wi, wo"),
    ("gpt2", {"lora_rank": 769}, "lora_rank=769 exceeds gpt2's hidden size "
     "768"),
    ("tiny_vlm", {"lora_rank": 4, "train_vision": True},
     "train_vision=True with lora_rank=4: adapters train"),
])
def test_settings_of_another_kind_of_model(model, kw, needle):
  with pytest.raises(ValueError, match=needle):
    check_model_settings(load_model(model), _settings(**kw))


def test_y_divides_the_kv_heads_or_the_query_heads_per_kv_head():
  """llama2_70b's 8 kv heads of 8 query heads each: Y = 8 shards the kv
  heads, Y = 16 is refused (it divides neither 8 nor 8); gemma-2b's one kv
  head is replicated over any Y dividing its 8 query heads."""
  llama = load_model("llama2_70b")
  check_heads_over_y(llama, 8)
  assert not kv_heads_replicated(llama, 8)
  with pytest.raises(PlanError, match="Y=16 divides neither the 8 kv heads"):
    check_heads_over_y(llama, 16)
  gemma = load_model("models/configs/gemma-2b.json")
  check_heads_over_y(gemma, 4)
  assert kv_heads_replicated(gemma, 4)
  with pytest.raises(PlanError, match="nor the 8 query heads per kv head; "
                     "Y the heads allow: 1, 2, 4, 8 "):
    check_heads_over_y(gemma, 16)
  with pytest.raises(PlanError, match="Y the heads allow: 1, 2, 4, 8 "):
    check_heads_over_y(load_model("llama3_8b"), 16)  # 8 kv heads of 4


def test_pipeline_stages_divide_the_layers_of_a_dense_decoder():
  check_pipeline(load_model("tiny"), _settings(pp=2))
  with pytest.raises(ValueError, match="valid: 1, 2"):
    check_pipeline(load_model("tiny"), _settings(pp=4))
  # the valid counts named are those the chips take too (P x X x Y = chips)
  with pytest.raises(ValueError, match=r"12 layers; valid: 1, 2, 4 \(dividing "
                     r"its layers and the 8 chips\)$"):
    check_pipeline(load_model("gpt2"), _settings(pp=8), chips=8)
  with pytest.raises(ValueError, match="is a mixture of experts"):
    check_pipeline(load_model("tiny_moe"), _settings(pp=2))


def test_seq_within_learned_positions():
  check_seq(load_model("gpt2"), _settings(seq=1024))
  with pytest.raises(ValueError, match="1024 learned positions"):
    check_seq(load_model("gpt2"), _settings(seq=2048))


def test_images_only_for_a_vision_language_model():
  vlm = load_model("tiny_vlm")
  assert with_images(vlm, _settings()) is vlm
  assert with_images(vlm, _settings(image_size=2 * vlm.image_size)
                     ).image_size == 2 * vlm.image_size
  with pytest.raises(ValueError, match="has no vision tower"):
    with_images(load_model("tiny"), _settings(images_per_sample=2))


def test_importing_the_checks_imports_no_jax():
  probe = ("import sys, simulator.model_checks, simulator.search; "
           "print('jax' in sys.modules)")
  out = subprocess.run([sys.executable, "-c", probe], capture_output=True,
                       text=True, timeout=60, check=True).stdout
  assert out.strip() == "False"


def test_flash_over_a_decoder_names_the_flag_and_the_lengths_that_fit():
  """A decoder's (or an encoder's) flash attention over a length its block
  does not divide: the flag named, with the lengths nearest that fit."""
  cfg = load_model("llama2_7b")
  with pytest.raises(ValueError, match=r"^prompt=1000: flash attention runs "
                     r"over 1000 tokens, .* choose prompt=512 or 1024 or "
                     r"--attention=materialized$"):
    check_flash_length(cfg, "flash", 1000, 0, "prompt")
  check_flash_length(cfg, "materialized", 1000, 0, "prompt")
  check_flash_length(cfg, "flash", 1024, 0, "prompt")
  with pytest.raises(ValueError, match=r"choose seq=999999999488 or "
                     r"1000000000000 or"):  # by arithmetic, not a list
    check_flash_length(cfg, "flash", 999999999999, 0, "seq")
  check_flash_length(load_model("xxl_ffn"), "flash", 300, 0, "seq")  # no
  # attention: any length


@pytest.mark.parametrize("seq,valid", [(256, "448 or 960"),
                                       (512, "448 or 960"),
                                       (1024, "960 or 1472")])
def test_flash_over_image_tokens_names_the_text_lengths_that_fit(seq, valid):
  """llava_1_5_7b's 576 image tokens go before the text, so flash
  attention's 512 block needs seq = 512k - 576: the error names the text
  lengths (not the LM's totals) nearest below and above; those pass."""
  cfg = load_model("llava_1_5_7b")
  with pytest.raises(ValueError, match=f"choose seq={valid} or --attention"):
    check_seq(cfg, _settings(seq=seq, attention="flash"))
  for ok in map(int, valid.split(" or ")):
    check_seq(cfg, _settings(seq=ok, attention="flash"))
  check_seq(cfg, _settings(seq=seq, attention="materialized"))
  check_seq(load_model("tiny"), _settings(seq=seq, attention="flash"))


def test_stages_refuse_what_they_would_not_run_as_asked():
  """Under pp the stages' vmap gives every matmul a batch dimension, so
  dots (MaxText's minimal) saves nothing, remat=full's program; parameters
  fetched from host memory are not built for stages."""
  from simulator.model_checks import check_stage_settings
  for remat in ("dots", "minimal"):
    with pytest.raises(ValueError, match=f"^remat={remat} with pp=2: the "
                       "stages run under vmap"):
      check_stage_settings(_settings(remat=remat, pp=2, microbatches=2))
  with pytest.raises(ValueError, match="^offload=params with pp=2: "):
    check_stage_settings(_settings(offload=("params",), pp=2, microbatches=2))
  check_stage_settings(_settings(remat="names:qkv,mlp_in", pp=2,
                                 microbatches=2))
  check_stage_settings(_settings(remat="dots"))


def test_an_encoder_decoder_refuses_the_decoder_only_layer_input_name():
  t5 = load_model("t5_large")
  with pytest.raises(ValueError, match="^remat=offload:decoder_layer_input: "
                     "t5_large's encoder and decoder layers name no "):
    check_model_settings(t5, _settings(remat="offload:decoder_layer_input"))
  check_model_settings(t5, _settings(remat="save_qkv_proj"))
  check_model_settings(load_model("llama2_7b"),
                       _settings(remat="offload:decoder_layer_input"))


def test_a_setting_of_another_kind_of_model_is_named_alone():
  with pytest.raises(ValueError, match="^expert_axis=x: gpt2 has no mixture "
                     "of experts; it sets"):
    check_model_settings(load_model("gpt2"), _settings(expert_axis="x"))
  with pytest.raises(ValueError, match="^train_vision=True: gpt2 has no "
                     "vision tower"):
    with_images(load_model("gpt2"), _settings(train_vision=True))


def test_loss_chunks_must_divide_the_length_the_loss_runs_over():
  """An encoder-decoder's loss runs over its decoder (--target_seq), a
  decoder's over --seq: the flag named, with the chunk counts that fit."""
  with pytest.raises(ValueError, match=r"^loss_chunks=4 does not divide "
                     r"target_seq=30, the length the loss runs over; choose "
                     r"one of 1, 2, 3, 5, 6, 10, 15, 30$"):
    check_model_settings(load_model("t5_large"), _settings(
        seq=64, target_seq=30, loss_chunks=4))
  with pytest.raises(ValueError, match=r"^loss_chunks=3 does not divide "
                     r"seq=32"):
    check_model_settings(load_model("tiny"), _settings(loss_chunks=3))
  check_model_settings(load_model("tiny"), _settings(loss_chunks=4))
