"""Where libtpu runs a tensor-parallel matmul's reduce-scatter as its
windowed einsum loop, and what the loop sends (simulator.tracing.windowed).

  python -m experiments.probe_windowed [--plans=v5p-128:8x8,...] [--f32]

Compiles one matmul per step for each plan (no TPU needed) and bisects the
contraction; prints one line per plan beside the rule's figures
(meshes.hardware.Chip.windowed_einsum_contraction). A few minutes on the
2-core machine.
"""

from __future__ import annotations

from absl import flags

from experiments import cli  # sets JAX_PLATFORMS before JAX loads
import jax.numpy as jnp  # pylint: disable=g-bad-import-order
from meshes.layout import plan_mesh
from meshes.topology import parse_topology
from simulator.xla.windowed_probe import survey

FLAGS = flags.FLAGS
flags.DEFINE_list(
    "plans", ["v5p-128:8x8", "v5p-256:16x8", "v5p-512:16x16", "v5p-128:16x4",
              "v5p-64:16x2", "v5e-128:16x8", "v5e-256:16x16", "v5e-64:16x4",
              "v6e-256:32x8", "v6e-256:16x16", "v6e-64:16x4", "v4-128:8x8",
              "v4-512:16x16", "v4-64:8x4"],
    "TOPOLOGY:XxY plans to probe")
flags.DEFINE_bool("f32", False, "also probe each plan with an f32 result")


def main(argv) -> None:
  del argv
  for spec in FLAGS.plans:
    topology, _, mesh = spec.rpartition(":")
    try:
      x, y = map(int, mesh.split("x"))
      topo = parse_topology(topology)
    except ValueError as e:
      cli.fail(f"--plans entry {spec!r}: {e} (valid: TOPOLOGY:XxY, e.g. "
               "v5p-128:8x8)")
    if topo.chip.kind != "tpu":
      cli.fail(f"--plans entry {spec!r}: a GPU topology; libtpu's windowed "
               "einsum is probed on TPU topologies (XLA:GPU's threshold, "
               "100000 MiB, means no loop)")
    try:
      plan = plan_mesh(topo, x, y)
    except ValueError as e:
      cli.fail(f"--plans entry {spec!r}: {e}")
    for dtype in (jnp.bfloat16, jnp.float32)[:1 + FLAGS.f32]:
      print(survey(plan, dtype), flush=True)


if __name__ == "__main__":
  cli.run(main)
