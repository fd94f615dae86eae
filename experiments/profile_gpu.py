"""Where a step's time goes on the local GPU: one GPU corpus case profiled
with jax.profiler, GPU kernel time summed by kind.

  python -m experiments.profile_gpu --case=21 [--profiled_steps=2]

prints JSON: the step's wall time, the compute stream's kernel time per step
(so the idle share), kernels per step, and time per kind: `gemm` (cuBLAS /
CUTLASS kernels), XLA's own fusions by their prefix (`input` reductions,
`loop` elementwise, `gemm_fusion` Triton matmuls, ...). The figures in
README "Step time" came from it on a lent H100. Needs a GPU.
"""

from __future__ import annotations

import collections
import glob
import gzip
import json
import os
import tempfile
import time

from absl import flags

from experiments import cli

FLAGS = flags.FLAGS
flags.DEFINE_integer("case", None, "experiments.gpu_corpus index (mesh 1x1)")
flags.DEFINE_integer("profiled_steps", 2, "steps profiled, after two that "
                     "are not", lower_bound=1)

GEMM_MARKS = ("gemm", "xmma", "nvjet", "cutlass", "cublas")


def kind(kernel: str) -> str:
  """A kernel's kind: a library matmul, or an XLA fusion's prefix."""
  low = kernel.lower()
  if low.startswith("gemm_fusion"):
    return "gemm_fusion"
  if any(mark in low for mark in GEMM_MARKS):
    return "gemm"
  return kernel.split("_")[0][:20]


def summarise(events: list[dict], steps: int) -> dict:
  """Kernel time per step on the GPU's compute streams, by kind and name."""
  pids = {e["pid"]: e["args"]["name"] for e in events
          if e.get("ph") == "M" and e.get("name") == "process_name"}
  tids = {(e["pid"], e["tid"]): e["args"]["name"] for e in events
          if e.get("ph") == "M" and e.get("name") == "thread_name"}
  by_kind, by_name = collections.Counter(), collections.Counter()
  count = 0
  for e in events:
    if e.get("ph") != "X" or "/device:GPU" not in pids.get(e["pid"], ""):
      continue
    if "Compute" not in tids.get((e["pid"], e["tid"]), ""):
      continue
    by_kind[kind(e["name"])] += e["dur"]
    by_name[e["name"][:90]] += e["dur"]
    count += 1
  per_step = lambda us: us / 1e3 / steps  # µs in the trace -> ms per step
  return {"gpu_kernel_ms_per_step": per_step(sum(by_kind.values())),
          "kernels_per_step": count / steps,
          "by_kind_ms": {k: per_step(v) for k, v in by_kind.most_common(12)},
          "top_kernels_ms": {k: per_step(v)
                             for k, v in by_name.most_common(20)}}


def profile(index: int, steps: int) -> dict:
  cli.use_local_gpus()
  import jax  # pylint: disable=g-import-not-at-top
  from experiments import gpu_corpus  # pylint: disable=g-import-not-at-top
  from models.registry import load_model  # pylint: disable=g-import-not-at-top
  from simulator.xla import compiled  # pylint: disable=g-import-not-at-top
  case = gpu_corpus.CASES[index]
  c = compiled.compile_step(load_model(case.model), case.settings(),
                            compiled.make_mesh("gpu", 1, 1))
  params, opt, batch = compiled.random_args(c.step, c.mesh)
  run = lambda p, o: jax.block_until_ready(c.compiled(p, o, batch))
  for _ in range(2):
    params, opt, _ = run(params, opt)
  with tempfile.TemporaryDirectory() as folder:
    jax.profiler.start_trace(folder, create_perfetto_trace=True)
    start = time.perf_counter()
    for _ in range(steps):
      params, opt, _ = run(params, opt)
    wall = (time.perf_counter() - start) / steps
    jax.profiler.stop_trace()
    path, = glob.glob(os.path.join(folder, "**", "*.trace.json.gz"),
                      recursive=True)
    with gzip.open(path) as f:
      trace = json.load(f)
  events = trace["traceEvents"] if isinstance(trace, dict) else trace
  return {"case": index, "label": case.label(), "wall_ms": wall * 1e3,
          **summarise(events, steps)}


def main(argv):
  del argv
  from experiments import gpu_corpus  # pylint: disable=g-import-not-at-top
  single = gpu_corpus.single_gpu_cases()
  if FLAGS.case not in single:
    cli.fail(f"--case={FLAGS.case}: give a single-GPU case of "
             f"experiments.gpu_corpus: {', '.join(map(str, single))}")
  print(json.dumps(profile(FLAGS.case, FLAGS.profiled_steps), indent=1))


if __name__ == "__main__":
  cli.run(main)
