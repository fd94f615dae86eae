"""One piece of a training step compiled for one TPU chip: XLA's own count
of its HBM bytes (`cost_analysis()`'s bytes accessed) beside the step-time
model's (simulator.timing.roofline: each matmul's operands and result, each
other fusion's reads and writes; simulator.tracing.program).

The corpus holds the whole step's two figures against each other
(compiled.compare_hbm_bytes); a piece alone says which part of the step
the model counts differently, on shapes one chooses:
- "loss": the decoder's loss (models.transformer._loss: the f32 logits
  matmul, logsumexp, the target's logit) and its gradient in the hidden
  states and the output weight;
- "flash": the blockwise attention (models.attention.flash) and its
  gradient in q, k and v, one layer's; each loop body once, as both count.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from meshes.layout import device_mesh, plan_mesh
from meshes.topology import parse_topology
from models import attention, transformer
from simulator.tracing.program import read_program

PIECES = ("loss", "flash")


@dataclasses.dataclass(frozen=True)
class PieceBytes:
  """Bytes and matmul FLOPs of one piece on one chip, each loop body once."""

  piece: str
  xla_bytes: float  # cost_analysis()'s bytes accessed
  xla_flops: float  # its flops (the matmuls' and the elementwise ops')
  matmul_bytes: int  # the model's: each matmul's operands and result
  fusion_bytes: int  # the model's: each other fusion's reads and writes
  matmul_flops: int  # the model's

  @property
  def model_bytes(self) -> int:
    return self.matmul_bytes + self.fusion_bytes

  def line(self) -> str:
    return (f"{self.piece}: XLA's bytes accessed {self.xla_bytes / 1e9:.3f} "
            f"GB, the step-time model's {self.model_bytes / 1e9:.3f} GB "
            f"(matmuls {self.matmul_bytes / 1e9:.3f} GB, other fusions "
            f"{self.fusion_bytes / 1e9:.3f} GB; "
            f"{self.model_bytes / self.xla_bytes:.2f}x XLA's); matmul FLOPs "
            f"{self.matmul_flops:.4g}, XLA's flops {self.xla_flops:.4g}")


def model_shapes(cfg) -> dict[str, int]:
  """The pieces' dims of a decoder config (models.config.ModelConfig)."""
  if not cfg.n_heads or not cfg.vocab_size:
    raise ValueError(f"model {cfg.name} has no attention heads or no "
                     "vocabulary to probe; give the dims instead")
  kv_heads = cfg.n_kv_heads or cfg.n_heads
  return {"d_model": cfg.d_model, "vocab": cfg.vocab_size,
          "kv_heads": kv_heads, "groups": cfg.n_heads // kv_heads,
          "head_dim": cfg.head_dim or cfg.d_model // cfg.n_heads}


def _piece(piece: str, batch: int, seq: int, d_model: int, vocab: int,
           kv_heads: int, groups: int, head_dim: int):
  """(the function differentiated, its arguments' shapes and dtypes)."""
  if piece == "loss":
    return (lambda x, w, t: transformer._loss(x, w, t, None),  # pylint: disable=protected-access
            (((batch, seq, d_model), jnp.bfloat16),
             ((d_model, vocab), jnp.bfloat16), ((batch, seq), jnp.int32)), 2)
  if piece == "flash":
    return (lambda q, k, v: attention.flash(q, k, v).astype(jnp.float32).sum(),
            (((batch, seq, kv_heads, groups, head_dim), jnp.bfloat16),
             ((batch, seq, kv_heads, head_dim), jnp.bfloat16),
             ((batch, seq, kv_heads, head_dim), jnp.bfloat16)), 3)
  raise ValueError(f"piece {piece!r}; valid: {', '.join(PIECES)}")


def measure(piece: str, topology: str = "v5p-8", batch: int = 4,
            seq: int = 2048, d_model: int = 4096, vocab: int = 32000,
            kv_heads: int = 32, groups: int = 1, head_dim: int = 128,
            dump_dir: str | None = None) -> PieceBytes:
  """Compile `piece` and its gradient for one chip of the TPU `topology`
  (through libtpu, no TPU needed) and count its bytes both ways; with
  `dump_dir` the compiler's modules are written there as text (the
  optimized one, `*after_optimizations.txt`, shows XLA's fusions)."""
  fn, shapes, differentiated = _piece(piece, batch, seq, d_model, vocab,
                                      kv_heads, groups, head_dim)
  topo = parse_topology(topology)
  if topo.chip.kind != "tpu":
    raise ValueError(f"topology {topology!r} is a GPU's; XLA:GPU's "
                     "deviceless path gives no cost analysis: probe a TPU")
  device = device_mesh(plan_mesh(topo, topo.chips, 1)).devices.flat[0]
  step = jax.value_and_grad(fn, argnums=tuple(range(differentiated)))
  on_chip = jax.sharding.SingleDeviceSharding(device)
  args = tuple(jax.ShapeDtypeStruct(s, d, sharding=on_chip)
               for s, d in shapes)
  options = ({"xla_dump_to": dump_dir, "xla_dump_hlo_as_text": True}
             if dump_dir else None)
  traced = jax.jit(step).trace(*args)  # one trace: compiled and read
  cost = traced.lower().compile(compiler_options=options).cost_analysis()
  cost = cost[0] if isinstance(cost, list) else cost
  program = read_program(traced.jaxpr, len(shapes))
  return PieceBytes(piece, float(cost["bytes accessed"]),
                    float(cost["flops"]), *program.hbm_bytes_once(),
                    sum(d.flops_per_device for d in program.dots))
