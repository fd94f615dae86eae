"""Per-device memory of one training configuration, from the traced program.

  python -m experiments.memory_report --model=llama2_70b --topology=v5p-512 \
      --mesh=64x4 --batch=256 --seq=4096 --remat=full --attention=flash \
      --optimizer=adamw --precision=mixed --shard=zero3 [--format=json]

Text, in GiB (2**30 bytes) and % of the chip's HBM: the step's tensors by
category; the peak (what is live at the heap simulation's largest point, by
category, and where in the step it is), the planning overhead, the verdict;
the largest buffers live at the peak and the largest tensors per category.
JSON: simulator.memory.to_json's schema (all bytes are ints, per device).
"""

from __future__ import annotations

import json

from absl import flags

from experiments import cli
from meshes.hardware import GiB
from models.params import num_params
from simulator import formulas, memory
from simulator.timing import roofline
from simulator.memory import capacity, points
from simulator.model_checks import kv_heads_replicated
from simulator.step import kv_heads_note

FLAGS = flags.FLAGS
cli.define_model_flags()
cli.define_train_flags()


def _gib(n: int) -> str:
  return f"{n / GiB:10.3f}"


def _row(name: str, n: int, hbm: int) -> str:
  return f"  {name:<14} {_gib(n)} {100 * n / hbm:6.1f}%"


def _budget_lines(budget: capacity.GpuBudget,
                  estimate: memory.MemoryEstimate) -> list[str]:
  """The GPU's memory as JAX divides it, a line per figure with its source,
  and XLA:GPU's own memory limit within the pool."""
  lines = ["", "GPU memory as JAX divides it (per GPU):"]
  lines += [f"  {x.name:<32} {_gib(x.bytes)} GiB  ({x.source})"
            for x in budget.lines()]
  lines.append(f"  the step may use min(pool, device - outside the pool) = "
               f"{budget.capacity_bytes / GiB:.3f} GiB")
  if estimate.arguments_bytes > budget.capacity_bytes:
    lines.append(f"  the step's arguments alone, "
                 f"{estimate.arguments_bytes / GiB:.3f} GiB, are more than the "
                 "step may use: the step cannot run (shard or offload the "
                 "model state, or raise the pool share)")
    return lines
  limit = budget.xla_memory_limit(estimate.arguments_bytes)
  lines.append(f"  XLA:GPU schedules within the arguments + "
               f"{capacity.XLA_GPU_SLOP_PERCENT}% of the rest of the pool = "
               f"{limit / GiB:.3f} GiB (--xla_gpu_memory_limit_slop_factor)")
  if estimate.compiled_comparable_peak > limit:
    lines.append("  the simulated peak is above it: XLA:GPU rematerializes "
                 "(recomputes values: a slower step than predicted) to come "
                 "under it, and where it cannot, the allocation fails")
  return lines


def host_lines(estimate: memory.MemoryEstimate, total_params: int,
               hosts: int, grad_accum: int) -> list[str]:
  """Host memory: per device, pinned, per host machine; beside it seed 003's
  ZeRO-3 pinned-memory rules for the same parameter count."""
  n = estimate.host_devices
  return [
      "", "host memory (--offload, offloaded residuals):",
      f"  per device     {_gib(estimate.host_bytes)} GiB, of it pinned "
      f"(memory kind pinned_host) {estimate.pinned_host_bytes / GiB:.3f} GiB",
      f"  per host       {_gib(estimate.host_ram_bytes)} GiB  ({n} devices "
      f"per host machine, each its share; the host's own runtime not "
      f"counted)",
      f"seed 003's pinned memory for {total_params / 1e6:,.0f}M parameters "
      f"(DeepSpeed ZeRO-3 with cpu_offload_use_pin_memory; its GB = GiB; "
      f"{hosts} node{'s' if hosts > 1 else ''}):",
      *formulas.deepspeed_pinned_lines(total_params, hosts, grad_accum)]


def schedule_lines(estimate: memory.MemoryEstimate) -> list[str]:
  """Each simulated schedule of the weight gradients with its peak: where
  they differ, the band XLA's choice falls in."""
  peaks = estimate.schedule_peaks()
  if not peaks:
    return []
  lines = ["  each schedule of the weight gradients simulated (XLA's scheduler "
           "picks one; the peak is the largest kept):"]
  for order, (b, kept) in sorted(peaks.items(), key=lambda kv: -kv[1][0]):
    label = points.order_label(order)
    note = "" if kept else ("  (dropped: over XLA's rematerialization "
                            "limit, the logits recomputed)")
    lines.append(f"    {label:<52}{_gib(b)} GiB{note}")
  kept_peaks = [b for b, kept in peaks.values() if kept]
  if max(kept_peaks) > min(kept_peaks):
    lines += ["  (XLA keeps the one its own estimate finds smallest, often the "
              "smaller here. `experiments.validate` with these",
              "  flags compiles the step and prints each of XLA's three "
              "schedules' heap replayed; with --memory_scheduler=list,",
              "  dfs or post_order it compiles that schedule, which can peak "
              "lower than the one XLA keeps;",
              "  `experiments.schedule_replay --dump_dir=DIR` shows the order "
              "it kept (validate --dump_dir=DIR --dump_passes=memory-",
              "  scheduler); `experiments.max_batch --frontier=N` pins its "
              "largest batch)"]
  return lines


def render(estimate: memory.MemoryEstimate, header: str,
           budget: capacity.GpuBudget | None = None,
           host: list[str] = ()) -> str:
  hbm = estimate.hbm_bytes
  pd = estimate.per_device_bytes
  lines = [header, "", "the step's tensors          GiB   "
           + ("% usable" if budget else "% HBM")]
  lines += [_row(c, pd[c], hbm) for c in ("params", "grads", "optimizer",
                                          "activations")]
  lines += ["  (activations: what the backward keeps, and the batch)"
            + (f"; in host memory, not HBM (--offload, offloaded residuals): "
               f"{estimate.host_bytes / GiB:.3f} GiB" if estimate.host_bytes
               else ""), "",
            f"the peak: the live set at {estimate.peak_where}",
            "  (a heap simulation of the step; the step's tensors above are "
            "not all live at once)"]
  lines += [_row(c, estimate.at_peak[c], hbm) for c in memory.PEAK_CATEGORIES
            if estimate.at_peak[c]]
  lines += ["  " + "-" * 31,
            _row("simulated peak", estimate.compiled_comparable_peak, hbm),
            _row("+ overhead", pd["overhead"], hbm),
            _row("= plan with", pd["peak"], hbm)]
  lines += schedule_lines(estimate)
  verdict = "fits" if estimate.fits else "does NOT fit"
  lines += host
  if budget:
    lines += _budget_lines(budget, estimate)
  lines += [
      "",
      f"{'usable by XLA per GPU' if budget else 'HBM per chip'} "
      f"{hbm / GiB:.2f} GiB: "
      f"{verdict} with the "
      f"{memory.OVERHEAD_FRACTION:.0%} planning overhead (runtime and "
      f"fragmentation, {memory.OVERHEAD_FRACTION:.0%} of XLA's peak); "
      f"headroom {estimate.headroom_bytes / GiB:.3f} GiB",
      f"eta_mem = params / planned peak = {estimate.eta_mem:.4f}",
      "", "largest buffers live at the peak (per device):"]
  for x in estimate.peak_buffers:
    shape = "x".join(map(str, x.shape)) or "-"
    lines.append(f"  {x.category:<12} {_gib(x.bytes)} GiB  {x.dtype:<8} "
                 f"[{shape}]  {x.name}")
  lines += ["", "largest tensors of the step (per device):"]
  for c in (*memory.CATEGORIES[:-2], "batch", "host"):
    for x in estimate.contributors.get(c, ()):
      shape = "x".join(map(str, x.shape)) or "-"
      lines.append(f"  {c:<12} {_gib(x.bytes)} GiB  {x.dtype:<8} [{shape}]  "
                   f"{x.name}")
  return "\n".join(lines)


def pipeline_line(p: dict) -> str:
  """The pipeline's bubble, stage sends and memory rule, one line."""
  return (f"pipeline: {p['stages']} stages x {p['microbatches']} micro-"
          f"batches, {p['schedule']}: {p['iterations']} iterations, bubble "
          f"{p['bubble_fraction']:.1%} of the step; {p['sends']} stage sends "
          f"of {p['send_bytes'] / 2**20:.2f} MiB per device "
          f"({p['send_seconds'] * 1e6:.1f} us each); activations: "
          f"{p['memory']}")


def main(argv):
  del argv
  cfg, plan = cli.model_and_plan()
  settings = cli.train_settings()
  estimate = memory.memory_report(cfg, settings, plan)
  replicated = kv_heads_replicated(cfg, plan.Y)
  stages = (roofline.pipeline_summary(cfg, settings, plan)
            if settings.pp > 1 else None)
  budget = (capacity.gpu_budget(plan) if plan.topology.chip.kind == "gpu"
            else None)
  if FLAGS.format == "json":
    print(json.dumps({**memory.to_json(estimate),
                      "kv_heads_replicated": replicated,
                      "pipeline": stages,
                      "gpu_memory": budget.to_json(estimate.arguments_bytes)
                                    if budget else None},
                     indent=1))
  else:
    header = f"{cli.settings_line(cfg.name, settings, cfg)}\n{plan.describe()}"
    if replicated:
      header += "\n" + kv_heads_note(cfg, plan.Y)
    if stages:
      header += "\n" + pipeline_line(stages)
    if settings.lora_rank:
      header += (f"\ntrainable parameters: {estimate.trainable_params:,} "
                 f"(the LoRA adapters; the base is frozen: no gradient, no "
                 f"optimizer state)" + (
                     f"; its layer projections stored as "
                     f"{settings.base_quant} (models.quant)"
                     if settings.base_quant != "none" else ""))
    host = (host_lines(estimate, num_params(cfg),
                       plan.topology.chips // estimate.host_devices,
                       settings.grad_accum) if estimate.host_bytes else [])
    print(render(estimate, header, budget, host))


if __name__ == "__main__":
  cli.run(main)
