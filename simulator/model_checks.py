"""The settings a model or a mesh cannot take, found before any tracing:
one-line ValueErrors naming the bad value and what would be valid. Plain
Python on the model's config and the run settings, so a sweep read from its
cache checks its flags without importing jax (simulator.search)."""

from __future__ import annotations

from meshes.layout import divisors
from models import remat as remat_policies
from models.config import (FLASH_BLOCK, GATED_MLPS, ModelConfig,
                           at_resolution, image_tokens)
from simulator.settings import TrainSettings


class PlanError(ValueError):
  """The step cannot be laid out on this mesh (a mesh axis does not divide a
  dimension it shards). Raised while building the step, so it depends on the
  mesh, shard mode and optimizer, never on the remat policy."""


def kv_heads_replicated(cfg: ModelConfig, y: int) -> bool:
  """Whether the kv heads are replicated over Y: when Y does not divide them
  (an MQA model's one kv head, GQA's 8 under TP 16), each Y shard keeps every
  kv head and its share of the query heads, as MaxText does."""
  return cfg.attention and cfg.n_kv_heads % y != 0


def _given(settings: TrainSettings, **defaults) -> str:
  """'name=value, ...' of the settings among `defaults` that differ from
  them: what a user set, for an error naming only that."""
  return ", ".join(f"{k}={getattr(settings, k)}" for k, d in defaults.items()
                   if getattr(settings, k) != d)


def check_heads_over_y(cfg: ModelConfig, y: int) -> None:
  """PlanError where Y divides neither the kv heads nor the query heads per
  kv head (simulator.step's rules replicate the kv heads otherwise); a
  sweep checks it before tracing, so a mesh it refuses costs no trace."""
  if not kv_heads_replicated(cfg, y):
    return
  groups = cfg.n_heads // cfg.n_kv_heads
  if groups % y:
    valid = sorted(set(divisors(cfg.n_kv_heads)) | set(divisors(groups)))
    raise PlanError(
        f"Y={y} divides neither the {cfg.n_kv_heads} kv "
        f"head{'s' if cfg.n_kv_heads > 1 else ''} nor the "
        f"{groups} query heads per kv head; Y the heads allow: "
        f"{', '.join(map(str, valid))} (a Y dividing the kv heads shards "
        "them; one dividing the query heads per kv head replicates them)")


def check_pipeline(cfg: ModelConfig, settings: TrainSettings,
                   chips: int | None = None) -> None:
  """One-line ValueErrors for pipeline settings this model cannot run:
  stages over a decoder-only dense model's layers only; the valid stage
  counts named are those that also divide the `chips` (P x X x Y)."""
  pp = settings.pp
  if pp == 1:
    return
  kind = ("an encoder-decoder" if cfg.encoder_decoder else
          "a vision-language model" if cfg.vision else
          "a mixture of experts" if cfg.moe else None)
  if kind:
    raise ValueError(f"pp={pp}: {cfg.name} is {kind}; pipeline stages are "
                     "built for decoder-only dense models (e.g. llama2_7b)")
  if cfg.n_layers % pp:
    valid = [d for d in divisors(cfg.n_layers) if not chips or chips % d == 0]
    raise ValueError(f"pp={pp} does not divide {cfg.name}'s {cfg.n_layers} "
                     f"layers; valid: {', '.join(map(str, valid))}"
                     + (f" (dividing its layers and the {chips} chips)"
                        if chips else ""))


def check_stage_settings(settings: TrainSettings) -> None:
  """One-line ValueErrors for settings a pipeline's stages do not run as
  asked: the stages run under vmap, which gives every matmul a batch
  dimension, so JAX's dots_with_no_batch_dims_saveable saves nothing there
  (remat=full's program: corpus #89, gpt2 P2x2x1 dots, holds only the
  layer inputs); parameters fetched from host memory per layer are not
  built for a stage's layers. Checked on the flags and on each sweep plan
  (its reason), not where the step is built, which #89 re-traces."""
  pp = settings.pp
  if pp == 1:
    return
  if remat_policies.canonical(settings.remat) == "dots":
    raise ValueError(f"remat={settings.remat} with pp={pp}: the stages run "
                     "under vmap, where every matmul has a batch dimension "
                     "and this policy saves none (the same program as "
                     "remat=full); choose full, none or names:... (e.g. "
                     "names:qkv,mlp_in)")
  if "params" in settings.offload:
    raise ValueError(f"offload={','.join(settings.offload)} with pp={pp}: "
                     "parameters fetched from host memory per layer are not "
                     "built for pipeline stages; choose pp=1 or "
                     "--offload=optimizer")


def with_images(cfg: ModelConfig, settings: TrainSettings) -> ModelConfig:
  """`cfg` at the settings' image and patch size (models.config's
  `at_resolution`); a text model given image settings is a one-line
  ValueError."""
  given = _given(settings, images_per_sample=0, train_vision=False,
                 vision_sharding="sharded")
  if not cfg.vision and given:
    raise ValueError(f"{given}: {cfg.name} has no vision tower; images go "
                     "with a vision-language model (e.g. llava_1_5_7b)")
  return at_resolution(cfg, settings.image_size, settings.patch_size)


def check_seq(cfg: ModelConfig, settings: TrainSettings) -> None:
  """A one-line ValueError where the sequence is longer than the model's
  learned positions (no mesh makes it fit)."""
  if cfg.positions == "learned" and settings.seq > cfg.max_len:
    raise ValueError(f"seq={settings.seq} exceeds {cfg.name}'s "
                     f"{cfg.max_len} learned positions; choose seq <= "
                     f"{cfg.max_len}")
  check_flash_length(cfg, settings.attention, settings.seq, settings.images,
                     "seq")


def check_flash_length(cfg: ModelConfig, attention: str, text: int,
                       images: int, flag: str) -> None:
  """A one-line ValueError where flash attention would run over a sequence
  (a vision-language model's image tokens and `text` tokens, given by
  --`flag`) that is no multiple of its block: the text lengths that would
  make one, nearest below and above."""
  if attention != "flash" or not cfg.attention:  # an MLP stack has none
    return
  n = image_tokens(cfg, images)
  total = n + text
  block = min(FLASH_BLOCK, total)
  if total % block == 0:
    return
  # The text lengths that fill whole blocks: the nearest below (if any)
  # and above, by arithmetic (a seq of 10**12 lists no blocks).
  below = total // block * block - n
  near = ([below] if below > 0 else []) + [
      (total // block + k) * block - n for k in (1, 2)]
  near = near[:2]
  over = (f"the LM's sequence, {n} image tokens + {text} = {total}" if n
          else f"{text} tokens")
  raise ValueError(
      f"{flag}={text}: flash attention runs over {over}, which is not a "
      f"multiple of its block size {block}; choose {flag}="
      f"{' or '.join(map(str, near))} or --attention=materialized")


def check_model_settings(cfg: ModelConfig, settings: TrainSettings) -> None:
  """One-line ValueErrors for settings of a kind of model `cfg` is not: a
  decoder length without an encoder, expert settings without experts,
  adapters on a mixture of experts' MLP."""
  if settings.target_seq and not cfg.encoder_decoder:
    raise ValueError(f"target_seq={settings.target_seq}: {cfg.name} has no "
                     "encoder; target_seq is an encoder-decoder's decoder "
                     "length")
  given = _given(settings, capacity_factor=1.0, expert_axis="none")
  if not cfg.moe and given:
    raise ValueError(f"{given}: {cfg.name} has no mixture of experts; "
                     f"{'these set' if ',' in given else 'it sets'} a routed "
                     "model's experts (e.g. mixtral_8x7b)")
  mlp_targets = sorted(set(settings.lora_targets) & {"wi", "wi_gate", "wo"})
  if cfg.moe and settings.lora_rank and mlp_targets:
    raise ValueError(f"lora_targets={','.join(settings.lora_targets)}: "
                     f"{mlp_targets[0]!r} is in {cfg.name}'s mixture of "
                     "experts, where adapters are not built; valid: q, k, v, "
                     "o")
  if settings.lora_rank:
    check_lora(cfg, settings)
  chunks = settings.loss_chunks
  length, flag = ((settings.target_seq, "target_seq") if cfg.encoder_decoder
                  and settings.target_seq else (settings.seq, "seq"))
  if chunks > 0 and length % chunks:
    raise ValueError(f"loss_chunks={chunks} does not divide {flag}={length}, "
                     "the length the loss runs over; choose one of "
                     f"{', '.join(map(str, divisors(length)[:12]))}"
                     + (", ..." if len(divisors(length)) > 12 else ""))
  spec = remat_policies.canonical(settings.remat)
  if cfg.encoder_decoder and spec not in ("none", "full", "dots"):
    if any("decoder_layer_input" in (names or ())
           for names in remat_policies.split(spec)):
      raise ValueError(f"remat={settings.remat}: {cfg.name}'s encoder and "
                       "decoder layers name no decoder_layer_input (a "
                       "decoder-only model's layer input); its other names "
                       "apply, e.g. offload:qkv")
  if settings.lora_rank and settings.train_vision:
    raise ValueError(f"train_vision=True with lora_rank={settings.lora_rank}:"
                     " adapters train the language model's projections and "
                     "freeze the rest, the vision tower too; give one of "
                     "them")


def lora_projections(cfg: ModelConfig) -> tuple[str, ...]:
  """The projections of `cfg` an adapter can go on (models.layers): the
  attention's q, k, v and o where it has attention, the MLP's wi and wo,
  and wi_gate where the MLP is gated."""
  return (("q", "k", "v", "o") if cfg.attention else ()) + (
      ("wi", "wi_gate", "wo") if cfg.mlp in GATED_MLPS else ("wi", "wo"))


def check_lora(cfg: ModelConfig, settings: TrainSettings) -> None:
  """One-line ValueErrors for adapters that would train nothing or cannot
  be built: a target the model does not have (its adapter would be
  missing, the run training nothing), and a rank above the hidden size (an
  adapter's rank is at most its projection's smaller side)."""
  have = lora_projections(cfg)
  missing = [t for t in settings.lora_targets if t not in have]
  if missing:
    raise ValueError(f"lora_targets={','.join(settings.lora_targets)}: "
                     f"{cfg.name} has no {missing[0]!r} projection; valid: "
                     f"{', '.join(have)}")
  if settings.lora_rank > cfg.d_model:
    raise ValueError(f"lora_rank={settings.lora_rank} exceeds {cfg.name}'s "
                     f"hidden size {cfg.d_model} (an adapter's rank is at "
                     f"most its projection's smaller side); choose lora_rank "
                     f"<= {cfg.d_model}")
