"""Parameter count, bytes by dtype, and each parameter's layout on the mesh.

  python -m experiments.describe --model=llama2_7b --topology=v5p-128 --mesh=16x4
"""

from __future__ import annotations

import json

from absl import flags

from experiments import cli
from experiments.units import gib
from simulator.settings import OPTIMIZERS
from simulator.step import kv_heads_note

cli.define_model_flags()
flags.DEFINE_enum("shard", "zero3", ["dp", "zero1", "zero2", "zero3"],
                  "zero3 stores params sharded over X; the others replicate them")
flags.DEFINE_enum("precision", "mixed", ["mixed", "bf16_master", "bf16"],
                  "mixed stores f32 params; the bf16 policies bf16 params")
flags.DEFINE_enum("optimizer", "adamw", list(OPTIMIZERS),
                  "the optimizer whose state is counted")
cli.define_adapter_flags()
cli.define_moe_flags()
cli.define_vision_flags()
flags.DEFINE_integer("pp", 1, "pipeline stages on a mesh axis P outermost "
                     "(P x X x Y = chips); each holds n_layers/pp layers")
flags.DEFINE_integer("dp", 1, "data-parallel replicas on a mesh axis D "
                     "outermost (D x X x Y = chips): the weights over X alone")
FLAGS = flags.FLAGS


def _spec(entries) -> str:
  return "P(" + ", ".join(repr(e) if e else "None" for e in entries) + ")"


def main(argv):
  from simulator.inventory import describe_params
  from simulator.settings import TrainSettings
  cfg, plan = cli.model_and_plan()
  cli.check_lora_flags()
  # The parameters do not turn on the sequence or its attention kernel:
  # materialized attention takes any length (flash would refuse a
  # vision-language model's image tokens plus the default seq).
  settings = TrainSettings(attention="materialized",
                           shard=FLAGS.shard, precision=FLAGS.precision,
                           optimizer=FLAGS.optimizer,
                           lora_rank=FLAGS.lora_rank,
                           lora_targets=tuple(FLAGS.lora_targets),
                           base_quant=FLAGS.base_quant,
                           expert_axis=FLAGS.expert_axis,
                           images_per_sample=FLAGS.images_per_sample,
                           image_size=FLAGS.image_size,
                           patch_size=FLAGS.patch_size,
                           train_vision=FLAGS.train_vision,
                           vision_sharding=FLAGS.vision_sharding,
                           pp=FLAGS.pp)
  info = describe_params(cfg, plan, settings)
  if FLAGS.format == "json":
    print(json.dumps(info, indent=1))
    return
  print(f"model {info['model']}: {info['num_params']:,} parameters")
  if cfg.moe:
    print(f"active per token: {info['active_params']:,} ({cfg.experts_per_token}"
          f" of {cfg.n_experts} experts; expert axis {settings.expert_axis})")
  if settings.lora_rank:
    print(f"trainable: {info['trainable_params']:,} (LoRA rank "
          f"{settings.lora_rank} on {','.join(settings.lora_targets)}; the "
          f"base is frozen)")
  if info["quantized_base"]:
    q = info["quantized_base"]
    print(f"base stored as {q['kind']}: {q['weights']:,} weights in "
          f"{q['bytes']:,} bytes ({gib(q['bytes']):.3f} GiB), "
          f"{q['bytes_per_weight']:.4f} bytes per weight")
  print(plan.describe())
  if settings.pp > 1:
    print(f"pipeline: {settings.pp} stages of {cfg.n_layers // settings.pp} "
          "layers each, the layer stack's stage dim on P; embedding, final "
          "norm and output layer on every stage")
  if info["vocab_padding"]:
    print(f"vocabulary padded by {info['vocab_padding']} rows so Y divides it")
  if info["kv_heads_replicated"]:
    print(kv_heads_note(cfg, plan.Y))
  if settings.vision_sharding == "replicated":
    print("vision tower replicated: its weights whole on every device (no "
          "logical axis split), run data-parallel over X")
  for dtype, n in info["bytes_by_dtype"].items():
    print(f"  {dtype}: {n:,} bytes ({gib(n):.3f} GiB) in total")
  rows = [("parameter", "shape", "logical axes", "PartitionSpec",
           "per-device shape", "per-device GiB")]
  for g in info["params"]:
    rows.append((g["path"], "x".join(map(str, g["shape"])),
                 ",".join(n or "-" for n in g["logical_axes"]),
                 _spec(g["partition_spec"]),
                 "x".join(map(str, g["per_device_shape"])),
                 f"{gib(g['per_device_bytes']):.4f}"))
  widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
  for r in rows:
    print("  ".join(c.ljust(w) for c, w in zip(r, widths)))
  print(f"per-device parameter bytes: {info['per_device_param_bytes']:,} "
        f"({gib(info['per_device_param_bytes']):.3f} GiB)")
  state = info["optimizer_state_bytes"]
  print(f"optimizer state ({info['optimizer']}, {info['precision']}): "
        f"{state:,} bytes ({gib(state):.3f} GiB), "
        f"{state / info['trainable_params']:.3f} bytes per trained parameter; "
        f"per device {info['per_device_optimizer_bytes']:,} bytes "
        f"({gib(info['per_device_optimizer_bytes']):.3f} GiB)")


if __name__ == "__main__":
  cli.run(main)
