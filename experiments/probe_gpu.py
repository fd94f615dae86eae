"""What the local GPU is, as JAX sees it: versions, the allocator's pool, the
driver's memory use beside it, the device's XLA target config, and the bf16
matmul rate and HBM copy bandwidth it reaches.

  python -m experiments.probe_gpu --out_dir=DIR

writes DIR/device.json and DIR/target_config.txtpb (experiments/data/
h100_device.json and h100_device_target_config.txtpb were made so, on a lent
H100). Needs a GPU; nothing here is used by the estimates.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time

from absl import flags

from experiments import cli

FLAGS = flags.FLAGS
flags.DEFINE_string("out_dir", ".", "folder for device.json and "
                    "target_config.txtpb")

SMI_FIELDS = ("name,memory.total,memory.used,driver_version,clocks.max.sm,"
              "clocks.max.mem")


def _smi() -> str:
  return subprocess.run(["nvidia-smi", f"--query-gpu={SMI_FIELDS}",
                         "--format=csv,noheader,nounits"], capture_output=True,
                        text=True, check=False).stdout.strip()


def _median_seconds(fn, *args, runs: int) -> float:
  times = []
  for _ in range(runs):
    start = time.perf_counter()
    fn(*args).block_until_ready()
    times.append(time.perf_counter() - start)
  return sorted(times)[runs // 2]


def probe(out_dir: str) -> dict:
  """The figures above; the target config is written beside them."""
  cli.use_local_gpus()
  import flax  # pylint: disable=g-import-not-at-top
  import jax  # pylint: disable=g-import-not-at-top
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
  import numpy  # pylint: disable=g-import-not-at-top
  import optax  # pylint: disable=g-import-not-at-top
  device = jax.devices()[0]
  out = {"jax": jax.__version__, "flax": flax.__version__,
         "optax": optax.__version__, "numpy": numpy.__version__,
         "device_kind": device.device_kind, "smi_before": _smi()}
  a = jnp.ones((8192, 8192), jnp.bfloat16)
  matmul = jax.jit(lambda a, b: a @ b)
  matmul(a, a).block_until_ready()
  out["memory_stats_after_init"] = device.memory_stats()
  out["smi_after_matmul"] = _smi()
  out["matmul_8192_bf16_tflops_median"] = 2 * 8192**3 / _median_seconds(
      matmul, a, a, runs=20) / 1e12
  x = jnp.ones((2**30,), jnp.float32)  # 4 GiB, read and written once
  double = jax.jit(lambda x: x * 2)
  double(x).block_until_ready()
  out["hbm_read_write_GBps_median"] = 2 * 4 * 2**30 / _median_seconds(
      double, x, runs=10) / 1e9
  from meshes import gpu_target  # pylint: disable=g-import-not-at-top
  with open(os.path.join(out_dir, "target_config.txtpb"), "w") as f:
    f.write(gpu_target.local_target_config())
  out["target_config"] = "written"
  return out


def main(argv):
  del argv
  if shutil.which("nvidia-smi") is None:
    cli.fail("no NVIDIA GPU here (no nvidia-smi): probe_gpu measures the "
             "local GPU; run it on a machine with one")
  if os.path.exists(FLAGS.out_dir) and not os.path.isdir(FLAGS.out_dir):
    cli.fail(f"--out_dir={FLAGS.out_dir!r} is a file; give a folder")
  os.makedirs(FLAGS.out_dir, exist_ok=True)
  out = probe(FLAGS.out_dir)
  with open(os.path.join(FLAGS.out_dir, "device.json"), "w") as f:
    json.dump(out, f, indent=1, default=str)
  print(json.dumps(out, indent=1, default=str))


if __name__ == "__main__":
  cli.run(main)
