"""The largest batch that fits, exact, from one trace.

  python -m experiments.max_batch --model=llama2_70b --topology=v5p-256 \
      --mesh=32x4 --seq=4096 --remat=full [--hbm_fraction=0.85] [--confirm]

Every program point's live bytes are affine in the batch (the probe batch,
simulator.tracing.batch_probe), so the largest global batch whose compiler-comparable
peak stays within --hbm_fraction of the chip's HBM follows from one trace
(simulator.memory.largest_batch); no compiles are searched. The fraction is
the headroom the fine-tuning playbook (seed 002) keeps, 15-20%, in place of
the 10% planning overhead. --confirm compiles the answer for the topology;
--frontier=N compiles up to N times to pin XLA's own largest batch in the
same budget, starting from the simulation's answers (simulator.xla.frontier);
with --memory_scheduler=NAME those compiles run libtpu's scheduler NAME.
--batch is ignored; --grad_accum makes the answer a multiple of it.
"""

from __future__ import annotations

import json

from absl import flags

from experiments import cli
from meshes.hardware import GiB
from meshes.layout import mesh_name
from simulator import memory
from simulator.memory.capacity import capacity_bytes, check_hbm_fraction

FLAGS = flags.FLAGS
cli.define_model_flags()
cli.define_train_flags()
cli.define_hbm_fraction_flag()
flags.DEFINE_bool("confirm", False, "compile the answer for the topology")
flags.DEFINE_integer("frontier", 0, "compile up to this many times to find "
                     "XLA's own largest batch in the same budget, starting "
                     "from the simulation's answers (0: off)")
cli.define_memory_scheduler_flag()


def main(argv) -> None:
  del argv
  import dataclasses
  check_hbm_fraction(FLAGS.hbm_fraction)
  if FLAGS.frontier < 0:
    raise ValueError(f"frontier={FLAGS.frontier} must be a number of "
                     "compiles, 0 (off) or more")
  cfg, plan = cli.model_and_plan()
  if FLAGS.memory_scheduler != "default" and (
      plan.topology.chip.kind != "tpu"
      or not (FLAGS.confirm or FLAGS.frontier)):
    cli.fail(f"--memory_scheduler={FLAGS.memory_scheduler} is libtpu's "
             "--xla_memory_scheduler for the compiles of --confirm or "
             "--frontier=N: it needs a TPU --topology and one of them")
  settings = cli.train_settings()
  step = plan.data * settings.batch_splits  # a sequence per micro-batch shard
  settings = dataclasses.replace(settings, batch=step)
  estimate = memory.memory_report(cfg, settings, plan)
  usable = capacity_bytes(plan)  # a GPU: JAX's pool (simulator.memory.capacity)
  cap = memory.peak_budget(usable, FLAGS.hbm_fraction)
  best = memory.largest_batch(estimate, cap, step)
  capped = (" (what fits with the planning overhead)"
            if cap < int(FLAGS.hbm_fraction * usable) else "")
  where = (f"{FLAGS.hbm_fraction:.0%} of {usable / GiB:.2f}"
           f" GiB = {cap / GiB:.2f} GiB{capped} per device, mesh "
           f"{mesh_name(plan.X, plan.Y, plan.P, plan.D)}")
  text = FLAGS.format == "text"
  say = lambda line: print(line, flush=True) if text else None
  out = {"model": cfg.name, "topology": plan.topology.describe(),
         "mesh": mesh_name(plan.X, plan.Y, plan.P, plan.D),
         "hbm_fraction": FLAGS.hbm_fraction, "usable_bytes": usable,
         "budget_bytes": cap, "batch_step": step, "largest_batch": best}
  if not best:
    need = estimate.at_batch(step).compiled_comparable_peak
    out["needed_bytes_at_step"] = need
    say(f"nothing fits in {where}: batch {step} needs {need / GiB:.2f} GiB")
  else:
    at = estimate.at_batch(best)
    more = estimate.at_batch(best + step).compiled_comparable_peak
    out.update(peak_bytes=at.compiled_comparable_peak,
               planned_peak_bytes=at.per_device_bytes["peak"],
               next_batch_peak_bytes=more)
    say(f"largest batch in {where}: {best} sequences ({best // plan.data} per "
        f"data shard) at {at.compiled_comparable_peak / GiB:.2f} GiB "
        f"({at.per_device_bytes['peak'] / GiB:.2f} with the 10% planning "
        f"overhead); {best + step} would need {more / GiB:.2f} GiB")
  if (FLAGS.confirm and best) or FLAGS.frontier:
    from simulator.xla import frontier
    if plan.topology.chip.kind == "gpu":
      say("note: a GPU target compiles here without a GPU, so without "
          "XLA's autotuner; on a GPU it can put the logits matmul on "
          "cuBLAS and hold more (README, 'Autotuned on a real GPU'): a "
          "batch that fits these compiles may not fit there, while the "
          "simulation's answer holds that schedule")
    compile_at = frontier.compile_probe(cfg, settings, plan, cap,
                                        FLAGS.memory_scheduler)
    probes = out["compiles"] = []

    def probe(batch: int) -> frontier.Probe:
      p = compile_at(batch)
      probes.append(dataclasses.asdict(p))
      say(f"compiled at batch {batch}: {_said(p)}, "
          f"{'fits' if p.fits else 'does NOT fit'} in {cap / GiB:.2f} GiB")
      return p

    if FLAGS.frontier:
      guess = memory.largest_batch_any_schedule(estimate, cap, step)
      found = frontier.search(probe, best, guess, step, FLAGS.frontier)
      out["xla_largest_batch"] = {"largest_fit": found.largest_fit,
                                  "smallest_over": found.smallest_over,
                                  "exact": found.exact}
      say(_frontier_line(found, best, cap))
    else:
      probe(best)
  if not text:
    print(json.dumps(out, indent=1))


def _said(p) -> str:
  if p.refused:
    return (f"XLA refuses it for HBM (its heap {p.peak_bytes / GiB:.2f} GiB "
            "as it refused)")
  return f"XLA's peak {p.peak_bytes / GiB:.2f} GiB"


def _frontier_line(found, simulated: int, cap: int) -> str:
  n = len(found.probes)
  head = f"XLA's largest batch in {cap / GiB:.2f} GiB"
  tail = f"the simulation's: {simulated}"
  if found.exact and not found.largest_fit:
    return f"{head}: none, {found.smallest_over} does not fit ({tail})"
  if found.exact:
    return f"{head}: {found.largest_fit} ({_compiles(n)}; {tail})"
  if found.smallest_over is None:
    where = f"at least {found.largest_fit}, every compile fitted"
  else:
    where = f"from {found.largest_fit} to below {found.smallest_over}"
  return f"{head}: {where} (not pinned in {_compiles(n)}, raise --frontier; {tail})"


def _compiles(n: int) -> str:
  return f"{n} compile{'s' if n != 1 else ''}"


if __name__ == "__main__":
  cli.run(main)
