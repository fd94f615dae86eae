"""Per-device memory of one training configuration, from the traced program.

  python -m experiments.memory_report --model=llama2_70b --topology=v5p-512 \
      --mesh=64x4 --batch=256 --seq=4096 --remat=full --attention=flash \
      --optimizer=adamw --precision=mixed --shard=zero3 [--format=json]

Text: a table of categories in GiB (2**30 bytes) and % of the chip's HBM, then
the largest tensors per category. JSON: simulator.memory.to_json's schema
(all bytes are ints, per device).
"""

from __future__ import annotations

import json

from absl import flags

from experiments import cli
from meshes.hardware import GiB
from simulator import memory
from simulator.step import kv_heads_note, kv_heads_replicated

FLAGS = flags.FLAGS
cli.define_model_flags()
cli.define_train_flags()


def _gib(n: int) -> str:
  return f"{n / GiB:10.3f}"


def render(estimate: memory.MemoryEstimate, header: str) -> str:
  hbm = estimate.hbm_bytes
  lines = [header, "",
           f"{'category':<12} {'GiB':>10} {'% HBM':>7}"]
  for c in memory.CATEGORIES:
    b = estimate.per_device_bytes[c]
    if c == "peak":
      lines.append("-" * 31)
    lines.append(f"{c:<12} {_gib(b)} {100 * b / hbm:6.1f}%")
  verdict = "fits" if estimate.fits else "does NOT fit"
  lines += [
      "",
      f"HBM per chip {hbm / GiB:.2f} GiB: {verdict}, headroom "
      f"{estimate.headroom_bytes / GiB:.3f} GiB",
      f"host (pinned, offloaded residuals) {estimate.host_bytes / GiB:.3f} GiB"
      " per device, not in HBM",
      f"eta_mem = params / peak = {estimate.eta_mem:.4f}",
      f"overhead = {memory.OVERHEAD_FRACTION:.0%} of the other categories; "
      f"batch arguments {estimate.batch_bytes / GiB:.4f} GiB (in activations)",
      "", "largest contributors (per device):"]
  for c in (*memory.CATEGORIES[:-2], "host"):
    for x in estimate.contributors.get(c, ()):
      shape = "x".join(map(str, x.shape)) or "-"
      lines.append(f"  {c:<11} {_gib(x.bytes)} GiB  {x.dtype:<8} [{shape}]  "
                   f"{x.name}")
  return "\n".join(lines)


def main(argv):
  del argv
  cfg, plan = cli.model_and_plan()
  settings = cli.train_settings()
  estimate = memory.memory_report(cfg, settings, plan)
  replicated = kv_heads_replicated(cfg, plan.Y)
  if FLAGS.format == "json":
    print(json.dumps({**memory.to_json(estimate),
                      "kv_heads_replicated": replicated}, indent=1))
  else:
    header = f"{cli.settings_line(cfg.name, settings)}\n{plan.describe()}"
    if replicated:
      header += "\n" + kv_heads_note(cfg, plan.Y)
    print(render(estimate, header))


if __name__ == "__main__":
  cli.run(main)
