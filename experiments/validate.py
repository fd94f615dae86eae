"""Symbolic memory (simulator.memory) beside the compiler's figures, one config.

  python -m experiments.validate --model=llama2_7b --topology=v5p-128 --mesh=16x4 \
      --batch=64 --seq=2048 --remat=full [--target=cpu|gpu] [--format=json]

The step is compiled for --topology with no accelerator attached: TPU slices
through libtpu, GPU clusters (h100:2x8, ...) through the CUDA plugin (the `gpu`
extra; --target=gpu says the same); or with --target=cpu on CPU fake devices
(X*Y of them). --target=gpu --execute_steps=N runs N steps on the local GPUs
instead and reads device.memory_stats() (on cpu it runs them too, which checks
the step executes).
Rows: arguments (params + optimizer + batch, TPU tile padding included);
temp (symbolic: the compiled-comparable peak minus the arguments; compiled:
XLA's temp_size, its temporaries summed over the whole step, which can
exceed its peak); peak (symbolic: with the planning overhead, as the other
tools plan; compiled: XLA's peak); peak - overhead (the symbolic peak
without the overhead: the arguments plus the largest live set of the heap
simulation, simulator/memory);
relative error = (symbolic - compiled) / compiled.
Bytes are per device; human output in GiB (2**30 bytes).
"""

from __future__ import annotations

import json
import sys

from absl import flags

from experiments import cli
from meshes.hardware import GiB
from meshes.layout import mesh_name
from simulator.xla import xla_peak

FLAGS = flags.FLAGS
cli.define_model_flags()
cli.define_train_flags()
flags.DEFINE_string("target", None, "compile for: the --topology (default; TPU "
                    "via libtpu, GPU via the CUDA plugin, no device needed), cpu "
                    "(fake CPU devices) or gpu (the GPU --topology; with "
                    "--execute_steps, the local GPUs)")
flags.DEFINE_integer("execute_steps", 0, "on --target=gpu (or cpu), run this "
                     "many steps on random data and read device.memory_stats() "
                     "peak (GPU; the CPU keeps none)", lower_bound=0)


def _known_target(target: str | None) -> bool:
  if target in (None, "cpu", "gpu"):
    return True
  from meshes.topology import parse_topology
  try:
    parse_topology(target)
  except ValueError:
    return False
  return True


flags.register_validator("target", _known_target,
                         "must be cpu, gpu or a TPU topology (v5p-8, "
                         "v5p:2x2x1, ...)")
flags.DEFINE_string("dump_dir", None, "TPU: keep the compiler's dumps (optimized "
                    "module, buffer assignment, live ranges) in this directory")
flags.DEFINE_string("dump_passes", None, "with --dump_dir: also dump the module "
                    "before and after each compiler pass this regular "
                    "expression matches (memory-scheduler: what "
                    "experiments.schedule_replay reads)")
cli.define_memory_scheduler_flag()
PEAK_LINES = 12  # buffers at XLA's peak shown in the text report
VMEM_LINES = 4  # buffers XLA keeps in VMEM shown in the text report


def _buffer_line(b: dict) -> str:
  """One xla_peak.LiveBuffer (as JSON): MiB, A for an argument, shape, op."""
  return (f"  {b['bytes'] / 2**20:10.2f} {'A' if b['argument'] else ' '} "
          f"{b['shape'][:44]:<44} {xla_peak.op_tail(b['op_name'], 70)}")


def _pct(x) -> str:
  return "    n/a" if x is None else f"{100 * x:+6.2f}%"


def _scheduler_lines(s: dict, c: dict) -> list[str]:
  """XLA's memory-scheduler estimates (libtpu's, or XLA:GPU's) beside the
  simulated schedules of the weight gradients (README "Does the compiler
  agree?")."""
  from simulator.memory import points
  from simulator.xla import memory_scheduler
  lines = []
  if c.get("workaround"):
    lines.append(f"compiled with {c['workaround']}: XLA:GPU's Triton GEMM "
                 "emitter found no tiling for a matmul of this step, so its "
                 "GEMMs are cuBLAS's (on a GPU, XLA_FLAGS="
                 f"{c['workaround']} does the same)")
  if c.get("scheduler"):
    lines.append(f"compiled with libtpu's {c['scheduler']} memory scheduler "
                 "(--memory_scheduler)")
  if c.get("memory_scheduler"):
    simulated = ", ".join(f"{points.order_label(o)} {b / GiB:.3f}"
                          for o, b in s.get("schedule_peaks", {}).items())
    lines.append(f"XLA's memory scheduler (its own estimates, no "
                 f"fragmentation): {memory_scheduler.summary(c['memory_scheduler'])}"
                 f"; simulated: {simulated} GiB")
  if c.get("replayed_schedules"):
    lines.append("its schedules replayed on the module before that pass "
                 "(simulator.xla.heap_replay, no fragmentation): "
                 + memory_scheduler.replayed_summary(c["replayed_schedules"],
                                                     c["peak_bytes"]))
  return lines


def _planned_verdict(peak_no_overhead: int, capacity_bytes: int) -> str:
  """The symbolic side's verdict, as memory_report and mesh_sweep give it:
  the peak with the planning overhead against the same capacity."""
  from simulator.memory import OVERHEAD_FRACTION, overhead_bytes
  planned = peak_no_overhead + overhead_bytes(peak_no_overhead)
  return (f"planned (symbolic, with the {OVERHEAD_FRACTION:.0%} planning "
          f"overhead, the other tools' verdict) {planned / GiB:.4f} GiB: "
          f"{'fits' if planned <= capacity_bytes else 'does NOT fit'}")


def render(result: dict, header: str) -> str:
  s, c, e = result["symbolic"], result["compiled"], result["relative_error"]
  rows = [("arguments", s["arguments"], c["argument_bytes"], e["arguments"]),
          ("temp", s["temp"], c["temp_bytes"], e["temp"]),
          ("peak", s["peak"], c["peak_bytes"], e["peak"]),
          ("peak - overhead", s["peak_no_overhead"], c["peak_bytes"],
           e["peak_no_overhead"])]
  lines = [header, "", f"{'per device':<16} {'symbolic GiB':>13} {'compiled GiB':>13}"
           f" {'rel. error':>10}"]
  for name, a, b, r in rows:
    lines.append(f"{name:<16} {a / GiB:13.4f} {b / GiB:13.4f} {_pct(r):>10}")
  tuned = s.get("peak_no_overhead_autotuned", s["peak_no_overhead"])
  if tuned != s["peak_no_overhead"]:
    lines.append(f"  (GPU: symbolic figures of the deviceless program; with "
                 f"the cuBLAS-logits schedule XLA's autotuner may pick on a "
                 f"device, what fits holds: {tuned / GiB:.4f} GiB without "
                 f"overhead)")
  lines += ["", f"symbolic peak at {s['peak_where']}: " + ", ".join(
      f"{k} {v / GiB:.4f}" for k, v in s["at_peak"].items() if v) + " GiB",
            f"compiled peak {c['peak_bytes'] / GiB:.4f} of the "
            f"{c['capacity_bytes'] / GiB:.4f} GiB the step may use "
            f"(simulator.memory.capacity): "
            f"{'fits' if c['fits'] else 'does NOT fit'}",
            _planned_verdict(tuned, c["capacity_bytes"]),
            f"compiled: output {c['output_bytes'] / GiB:.4f}, alias "
            f"{c['alias_bytes'] / GiB:.4f}, generated code "
            f"{c['generated_code_bytes'] / GiB:.4f} GiB; peak from {c['peak_source']};"
            f" argument+output-alias+temp {c['bound_bytes'] / GiB:.4f} GiB",
            *_scheduler_lines(s, c),
            f"arguments from the step's shardings {c['step_argument_bytes']} B, "
            f"with the compiled tiled layouts {c['layout_argument_bytes']} B, "
            f"compiled {c['argument_bytes']} B"]
  if c.get("flops") is not None:  # XLA:CPU's gives no bytes, no time
    parts = [f"{c['flops']:.4g} flops"]
    if c.get("bytes_accessed") is not None:
      parts.append(f"{c['bytes_accessed']:.4g} bytes accessed")
    if c.get("optimal_seconds") is not None:
      parts.append(f"optimal {c['optimal_seconds']:.4g} s")
    lines.append(f"cost: {', '.join(parts)} (per device)")
  if result.get("flops"):
    f = result["flops"]
    lines.append(f"matmul FLOPs per device, each loop body once as XLA's cost "
                 f"analysis counts it: symbolic {f['symbolic']:.4g}, XLA "
                 f"{f['xla']:.4g} (elementwise ops' added) "
                 f"({100 * f['relative_error']:+.2f}%)")
  if result.get("hbm_bytes"):
    b = result["hbm_bytes"]
    lines.append(f"HBM bytes per device, each loop body once as XLA's cost "
                 f"analysis counts it: the step-time model's (matmuls' "
                 f"operands and results, other fusions' reads and writes) "
                 f"{b['symbolic']:.4g}, XLA's bytes accessed {b['xla']:.4g} "
                 f"(collectives, copies and host transfers added) "
                 f"({100 * b['relative_error']:+.2f}%)")
  cc = result["collectives"]
  err = cc["relative_error"]
  lines.append(f"collectives, per device per step (V: gathered result, "
               f"unreduced input, or the array), GiB: symbolic "
               f"{cc['symbolic_bytes'] / GiB:.4f}, HLO {cc['hlo_bytes'] / GiB:.4f}"
               f" ({'n/a' if err is None else f'{100 * err:+.2f}%'})")
  for k in sorted(set(cc["symbolic"]) | set(cc["hlo"])):
    lines.append(f"  {k:<28} symbolic {cc['symbolic'].get(k, 0) / GiB:10.4f}"
                 f"   HLO {cc['hlo'].get(k, 0) / GiB:10.4f}")
  if any(k.endswith("@?") for k in cc["hlo"]):
    lines.append("  (@?: collectives whose replica groups match no mesh "
                 "axis or combination of axes; in the HLO total, by no axis)")
  if c.get("peak_buffers"):
    lines.append(f"XLA's live set at its peak (at {c['peak_instruction']}; "
                 f"{c['peak_live_bytes'] / GiB:.4f} GiB from the dumped buffer "
                 f"assignment and live ranges), largest buffers, MiB "
                 f"(A: argument):")
    lines += [_buffer_line(b) for b in c["peak_buffers"][:PEAK_LINES]]
  if c.get("vmem_bytes"):
    lines.append(f"XLA's on-chip VMEM scratch (memory space 1, not HBM, not in "
                 f"the peak): {c['vmem_bytes'] / 2**20:.2f} MiB; largest "
                 f"buffers it keeps there, MiB:")
    lines += [_buffer_line(b) for b in c["vmem_buffers"][:VMEM_LINES]]
  if c.get("measured"):
    m = c["measured"]
    peak = ("n/a (no memory_stats on this backend)"
            if m["peak_bytes_in_use"] is None
            else f"{m['peak_bytes_in_use'] / GiB:.4f} GiB")
    losses = ", ".join(f"{x:.4f}" for x in m["losses"])
    lines.append(f"measured on {m['device']}: {m['steps']} steps run (losses "
                 f"{losses}); peak_bytes_in_use {peak} (compiled peak "
                 f"{c['peak_bytes'] / GiB:.4f} GiB); step "
                 f"{1e3 * m['step_seconds']:.2f} ms (median after the first)")
  return "\n".join(lines)


def vars_of(settings) -> dict:
  import dataclasses
  return dataclasses.asdict(settings)


def _print_oom(row: dict) -> None:
  """XLA refused the plan for HBM: say so, with the bytes on both sides."""
  if FLAGS.format == "json":
    print(json.dumps(row, indent=1, default=str))
    return
  sym, oom = row["symbolic"], row["oom"]
  print(f"XLA: does not fit: needs {oom['temp_bytes'] / GiB:.1f} GiB of "
        f"temporaries, {oom['hbm_bytes'] / GiB:.1f} GiB of HBM available "
        "(CompileTimeHbmOom)")
  if oom.get("replayed_schedules"):
    from simulator.xla import memory_scheduler
    print("its memory schedules replayed on the module before that pass "
          "(simulator.xla.heap_replay, no fragmentation): "
          + memory_scheduler.replayed_summary(
              oom["replayed_schedules"], oom["hbm_bytes"],
              f"the {oom['hbm_bytes'] / GiB:.1f} GiB of HBM"))
  if oom.get("peak_buffers"):  # read off the dump libtpu wrote as it refused
    print(f"XLA's heap at its peak: {oom['peak_bytes'] / GiB:.2f} GiB at "
          f"{oom['peak_instruction']}; largest live there (GiB):")
    for b in oom["peak_buffers"][:8]:
      print(f"  {b['bytes'] / GiB:8.3f}  {b['shape']}  "
            f"{b['op_name'] or b['value']}"[:160])
  print(f"symbolic: peak {sym['peak_no_overhead'] / GiB:.1f} GiB "
        f"({100 * row['oom_relative_error']:+.1f}% against XLA's heap), "
        f"{sym['peak'] / GiB:.1f} GiB with the planning overhead: "
        f"{'fits (wrong)' if row['symbolic_fits'] else 'does not fit'}")


def _request_gpu_scheduler_log() -> None:
  """A deviceless GPU compile logs XLA:GPU's memory-scheduler estimates
  where asked before jax loads (simulator.xla.memory_scheduler)."""
  from meshes.topology import parse_topology
  from simulator.xla import memory_scheduler
  try:
    gpu = parse_topology(FLAGS.topology).chip.kind == "gpu"
  except ValueError:
    return  # model_and_plan says what is wrong with it
  if gpu and not FLAGS.execute_steps and FLAGS.target in (None, "gpu"):
    memory_scheduler.request_gpu_log()


def main(argv):
  del argv
  _request_gpu_scheduler_log()  # before jax loads the CUDA plugin
  import jax
  cfg, plan = cli.model_and_plan()  # validates model, topology and mesh first
  topology, x, y = plan.topology, plan.X, plan.Y
  if FLAGS.target == "cpu":
    from simulator.xla.compiled import ensure_cpu_devices
    ensure_cpu_devices(plan.chips)
  settings = cli.train_settings()
  target = FLAGS.target
  if FLAGS.execute_steps and target not in ("gpu", "cpu"):
    cli.fail(f"--execute_steps={FLAGS.execute_steps} runs steps on local "
             "devices: add --target=gpu (the local GPUs) or --target=cpu; a "
             f"{FLAGS.topology} compile runs nothing")
  if target == "gpu" and FLAGS.execute_steps:
    cli.use_local_gpus()
  if target == "gpu" and not FLAGS.execute_steps:
    if topology.chip.kind != "gpu":
      cli.fail(f"--target=gpu compiles for a GPU --topology (h100:2x8, ...); "
               f"{FLAGS.topology} is a TPU topology")
    target = None  # the GPU topology, deviceless
  if FLAGS.dump_passes is not None:  # checked before --dump_dir is made
    import re
    if not FLAGS.dump_dir:
      cli.fail(f"--dump_passes={FLAGS.dump_passes!r} needs --dump_dir=DIR "
               "(where the pass dumps go)")
    try:
      re.compile(FLAGS.dump_passes)
    except re.error as e:
      cli.fail(f"--dump_passes={FLAGS.dump_passes!r} is not a regular "
               f"expression ({e}); e.g. memory-scheduler")
  if FLAGS.dump_dir:
    import os
    if os.path.exists(FLAGS.dump_dir) and not os.path.isdir(FLAGS.dump_dir):
      cli.fail(f"--dump_dir={FLAGS.dump_dir!r} is a file; give a directory "
               "(created if missing)")
    os.makedirs(FLAGS.dump_dir, exist_ok=True)
  if FLAGS.memory_scheduler != "default" and (
      topology.chip.kind != "tpu" or target in ("cpu", "gpu")):
    cli.fail(f"--memory_scheduler={FLAGS.memory_scheduler} is libtpu's "
             "--xla_memory_scheduler: it needs a TPU --topology compiled for "
             "itself (no --target=cpu|gpu)")
  from simulator.xla import crosscheck
  try:
    result = crosscheck.validate(cfg, settings, FLAGS.topology, x, y,
                                 target, FLAGS.execute_steps,
                                 dump_dir=FLAGS.dump_dir, d=plan.D,
                                 dump_passes=FLAGS.dump_passes or "^$",
                                 scheduler=FLAGS.memory_scheduler)
  except Exception as e:  # an out-of-HBM compile is an answer
    oom = crosscheck.hbm_oom(str(e))
    if oom is None and isinstance(e, jax.errors.JaxRuntimeError):
      cli.compiler_failed(e, FLAGS.topology)
    if oom is None:
      raise
    _print_oom(crosscheck.recheck({"config": {
        "model": FLAGS.model, "topology": FLAGS.topology,
        "mesh": mesh_name(x, y, D=plan.D),
        **vars_of(settings)}, "oom": {**oom, **crosscheck.refused_at(e)}}))
    return
  if settings.schedule == "1f1b":
    print("note: --schedule=1f1b: XLA compiles the traced GPipe program, so "
          "the symbolic figures below are that program's (without the 1F1B "
          "rule; `memory_report` gives the 1F1B estimate)", file=sys.stderr)
  if FLAGS.format == "json":
    print(json.dumps(result, indent=1, default=str))
  else:
    header = (f"{cli.settings_line(cfg.name, settings, cfg)}\nmesh "
              f"{mesh_name(x, y, plan.P, plan.D)} on "
              f"{topology.describe()}; compiled for "
              f"{target or FLAGS.topology} (jax {jax.__version__})")
    print(render(result, header))


if __name__ == "__main__":
  cli.run(main)
