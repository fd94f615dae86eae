"""DeepSpeed's ZeRO-2/3 model-state estimates, as DeepSpeed prints them.

  python -m experiments.deepspeed_estimate --stage=3 --model=llama2_7b \
      --num_gpus_per_node=8 [--num_nodes=1]
  python -m experiments.deepspeed_estimate --stage=2 --total_params=2851e6

DeepSpeed's `estimate_zero{2,3}_model_states_mem_needs_all_cold` tables
(simulator.formulas.deepspeed_table; its "GB" is 2^30 bytes) for every
offload and zero_init option, from the traced model's total and largest-
module parameter counts (simulator.inventory) or from the counts given; for
ZeRO-3 also seed 003's three GPU cases (`--model=t5_large
--num_gpus_per_node=4` is its t5-large example: 3291/125/477 MB).
--formula=seed prints ZeRO-2's GPU column as seed 003 shows it (4Ψ + 16Ψ/N);
the default is DeepSpeed's current code (2Ψ + 18Ψ/N). With --model, the
same setting traced by this simulator follows: per-GPU model states
(params, grads, optimizer) of the step on N H100s under zero2/zero3 with
bf16 params and an f32 master copy.
"""

from __future__ import annotations

import math

from absl import flags

from experiments import cli
from meshes.hardware import GiB
from simulator import formulas

FLAGS = flags.FLAGS
flags.DEFINE_enum("stage", "3", ["2", "3"], "ZeRO stage")
flags.DEFINE_string("model", None, "preset or config.json: counts traced")
flags.DEFINE_float("total_params", None, "total parameters (without --model)")
flags.DEFINE_float("largest_layer_params", None,
                   "the largest module's parameters (ZeRO-3, without --model)")
flags.DEFINE_integer("num_gpus_per_node", 8, "GPUs per node", lower_bound=1)
flags.DEFINE_integer("num_nodes", 1, "nodes", lower_bound=1)
flags.DEFINE_enum("formula", "current", ["current", "seed"],
                  "ZeRO-2's GPU formula: DeepSpeed's code today or seed 003's")


def main(argv) -> None:
  del argv
  stage = int(FLAGS.stage)
  counts = [f"--{n}" for n in ("total_params", "largest_layer_params")
            if FLAGS[n].value is not None]
  if FLAGS.model and counts:
    raise ValueError(f"--model={FLAGS.model} with {' and '.join(counts)}: "
                     "the model's counts are traced; give one or the other")
  if stage == 3 and FLAGS.formula != "current":
    raise ValueError(f"--formula={FLAGS.formula} with --stage=3: the seed's "
                     "formula is ZeRO-2's GPU formula; give --stage=2")
  for name in ("total_params", "largest_layer_params"):
    value = FLAGS[name].value
    if value is not None and not (math.isfinite(value) and 0 < value < 1e15):
      raise ValueError(f"--{name}={value} must be a positive count below "
                       "1e15 (a quadrillion parameters)")
  if FLAGS.model:
    from models.params import num_params
    from models.registry import load_model
    from simulator.inventory import largest_module_params
    cfg = load_model(FLAGS.model)
    total, largest = num_params(cfg), largest_module_params(cfg)
  elif FLAGS.total_params is not None:
    total = int(FLAGS.total_params)
    largest = int(FLAGS.largest_layer_params or 0)
    if stage == 3 and not largest:
      raise ValueError("--stage=3 needs --largest_layer_params with "
                       "--total_params (or give --model)")
    if largest > total:
      raise ValueError(f"--largest_layer_params={FLAGS.largest_layer_params}"
                       f" is more than --total_params={FLAGS.total_params}; "
                       "the largest module is part of the model")
  else:
    raise ValueError("give --model or --total_params")
  print("DeepSpeed's estimator as it prints (its GB is 2^30 bytes, GiB; its "
        "MB 2^20, MiB):")
  print(formulas.deepspeed_table(stage, total, largest,
                                 FLAGS.num_gpus_per_node, FLAGS.num_nodes,
                                 current=FLAGS.formula == "current"))
  if stage == 3:
    gpus = FLAGS.num_gpus_per_node * FLAGS.num_nodes
    print("\nseed 003's pinned memory (cpu_offload_use_pin_memory: the part "
          "of the CPU column that is page-locked):\n"
          + "\n".join(formulas.deepspeed_pinned_lines(total, FLAGS.num_nodes)))
    print(f"\nseed 003's ZeRO-3 GPU cases on {gpus} GPUs (its MB: 2^20 "
          f"bytes):\n" + formulas.deepspeed_zero3_gpu_cases(total, largest,
                                                            gpus))
  if stage == 2 and FLAGS.formula == "current":
    seed = formulas.deepspeed_zero2_model_states_mem_needs(
        total, FLAGS.num_gpus_per_node, FLAGS.num_nodes, False)
    print(f"(seed 003 prints {seed.gpu / 2**30:.2f}GB per GPU without "
          f"offload: its 4Ψ + 16Ψ/N; DeepSpeed's code now has 2Ψ + 18Ψ/N)")
  if stage == 2:
    print("(seed 003: ZeRO-2's pinned memory \"can't be controlled\")")
  if FLAGS.model:
    _traced(cfg, stage)


def _traced(cfg, stage: int) -> None:
  from meshes.layout import plan_mesh
  from meshes.topology import parse_topology
  from simulator import memory
  from simulator.settings import TrainSettings
  gpus = FLAGS.num_gpus_per_node * FLAGS.num_nodes
  plan = plan_mesh(parse_topology(f"h100:{gpus}"), gpus, 1)
  est = memory.memory_report(cfg, TrainSettings(
      batch=gpus, seq=min(512, cfg.max_len), shard=f"zero{stage}",
      precision="bf16_master"), plan)
  states = sum(est.per_device_bytes[c] for c in ("params", "grads",
                                                  "optimizer"))
  print(f"traced here (zero{stage}, bf16 params + f32 master, AdamW, "
        f"{gpus} H100s): model states {states / GiB:.2f} GiB per GPU "
        f"(params {est.per_device_bytes['params'] / GiB:.2f}, grads "
        f"{est.per_device_bytes['grads'] / GiB:.2f}, optimizer "
        f"{est.per_device_bytes['optimizer'] / GiB:.2f}), nothing offloaded")
  off = memory.memory_report(cfg, TrainSettings(
      batch=gpus, seq=min(512, cfg.max_len), shard=f"zero{stage}",
      precision="bf16_master", offload=("optimizer", "params")), plan)
  print(f"traced here with --offload=optimizer,params: pinned host memory "
        f"{off.pinned_host_bytes / GiB:.2f} GiB per GPU, "
        f"{off.host_ram_bytes / GiB:.2f} GiB per node of "
        f"{off.host_devices} GPUs (params, f32 master and moments, all "
        f"pinned_host)")


if __name__ == "__main__":
  cli.run(main)
