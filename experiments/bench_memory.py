"""Timing of a full memory report: llama2_70b on v5p-512 (issue 13's target: < 2 s).

  python -m experiments.bench_memory [--repeats=3]

Prints the import+first-call time (cold: JAX tracing caches empty), warm
repeats, and the at_batch rescale time (the sweep's per-config cost).
"""

from __future__ import annotations

import time

from absl import flags

from experiments import cli
from meshes.layout import plan_mesh
from meshes.topology import parse_topology
from models.registry import load_model
from simulator import memory
from simulator.settings import TrainSettings

flags.DEFINE_integer("repeats", 3, "warm repeats", lower_bound=1)
FLAGS = flags.FLAGS

MODEL, TOPOLOGY, MESH = "llama2_70b", "v5p-512", (64, 4)
SETTINGS = TrainSettings(batch=256, seq=4096, remat="full", attention="flash",
                         optimizer="adamw", precision="mixed", shard="zero3")


def main(argv):
  del argv
  plan = plan_mesh(parse_topology(TOPOLOGY), *MESH)
  cfg = load_model(MODEL)
  times = []
  for _ in range(1 + FLAGS.repeats):
    start = time.perf_counter()
    estimate = memory.memory_report(cfg, SETTINGS, plan)
    times.append(time.perf_counter() - start)
  start = time.perf_counter()
  n = 1000
  for i in range(n):
    estimate.at_batch(64 * (1 + i % 16))
  rescale = (time.perf_counter() - start) / n
  print(f"{MODEL} on {plan.describe()}")
  print(f"batch {SETTINGS.batch} x {SETTINGS.seq}, remat {SETTINGS.remat}, "
        f"{SETTINGS.attention}, {SETTINGS.optimizer}/{SETTINGS.precision}, "
        f"{SETTINGS.shard}")
  print(f"peak {estimate.per_device_bytes['peak'] / 2**30:.3f} GiB per device")
  print(f"memory_report first call: {times[0]:.2f} s (target < 2 s)")
  print("memory_report warm calls: " + ", ".join(f"{t:.2f} s" for t in times[1:]))
  print(f"at_batch rescale: {rescale * 1e3:.3f} ms per config")


if __name__ == "__main__":
  cli.run(main)
