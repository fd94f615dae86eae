"""Which piece of a step the step-time model counts HBM bytes for unlike
XLA (simulator.xla.bytes_probe).

  python -m experiments.probe_bytes [--pieces=loss,flash] [--topology=v5p-8]
      [--batch=4 --seq=2048] [--model=NAME | --d_model=4096 --vocab=32000
       --kv_heads=32 --groups=1 --head_dim=128] [--dump_dir=DIR]

Compiles each piece and its gradient for one chip of a TPU topology (no TPU
needed; seconds each on the 2-core machine) and prints XLA's bytes accessed
beside the model's, each loop body once. Defaults: llama2_7b's shapes at 4
sequences of 2048 tokens; --model takes a decoder's dims from its config
(a dim flag given beside it is an error); --dump_dir keeps each piece's
compiled modules as text under DIR/PIECE (XLA's fusions:
*after_optimizations.txt).
"""

from __future__ import annotations

import os

from absl import flags

from experiments import cli  # sets JAX_PLATFORMS before JAX loads
from models.registry import load_model
from simulator.xla import bytes_probe

FLAGS = flags.FLAGS
flags.DEFINE_list("pieces", list(bytes_probe.PIECES),
                  f"pieces to probe: {', '.join(bytes_probe.PIECES)}")
flags.DEFINE_string("topology", "v5p-8", "a TPU topology: one of its chips")
flags.DEFINE_string("model", None, "take the dims from this decoder's config "
                    "(a preset or a config.json)")
flags.DEFINE_string("dump_dir", None, "keep each piece's compiled modules as "
                    "text under DIR/PIECE")
_DIMS = (("d_model", 4096), ("vocab", 32000), ("kv_heads", 32), ("groups", 1),
         ("head_dim", 128))
for name, default in (("batch", 4), ("seq", 2048), *_DIMS):
  flags.DEFINE_integer(name, default, f"the pieces' {name}", lower_bound=1)


def main(argv) -> None:
  del argv
  bad = [p for p in FLAGS.pieces if p not in bytes_probe.PIECES]
  if not FLAGS.pieces:
    cli.fail(f"--pieces is empty; valid pieces are "
             f"{', '.join(bytes_probe.PIECES)}")
  if bad:
    cli.fail(f"--pieces={','.join(bad)}: valid pieces are "
             f"{', '.join(bytes_probe.PIECES)}")
  dims = {name: FLAGS[name].value for name, _ in _DIMS}
  if FLAGS.model:
    given = [f"--{name}" for name, _ in _DIMS if FLAGS[name].present]
    if given:
      cli.fail(f"{', '.join(given)} given with --model={FLAGS.model}: the "
               "model's config sets the dims; give one or the other")
    dims = bytes_probe.model_shapes(load_model(FLAGS.model))
  for piece in FLAGS.pieces:
    dump = os.path.join(FLAGS.dump_dir, piece) if FLAGS.dump_dir else None
    print(bytes_probe.measure(piece, FLAGS.topology, FLAGS.batch, FLAGS.seq,
                              **dims, dump_dir=dump).line(), flush=True)
    if dump:
      print(f"  {piece}'s modules: {dump}", flush=True)


if __name__ == "__main__":
  cli.run(main)
