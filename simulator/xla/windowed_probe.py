"""Probe libtpu's windowed einsum on one matmul (simulator.tracing.windowed).

`bsf,fd->bsd` with the contraction f sharded over Y on both operands and the
result's d over Y: the shardings of a tensor-parallel down projection, whose
partial sums are reduce-scattered over Y. Compiled for the plan's topology
(no TPU needed), the HLO says whether libtpu kept the reduce-scatter or ran
its collective-permute loop, and what that loop sends.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
from jax.sharding import NamedSharding, PartitionSpec

from meshes.layout import MeshPlan, device_mesh
from simulator.tracing import windowed
from simulator.xla import hlo_collectives


@dataclasses.dataclass(frozen=True)
class Probe:
  """One compiled matmul: whether it ran windowed and its collectives' bytes
  over Y as a multiple of V (the partial result on one device)."""

  contraction: int
  windowed: bool
  sent_over_v: float


def probe(plan: MeshPlan, contraction: int, result_dtype=jnp.bfloat16,
          tokens_per_device: int = 2048, width: int = 4096) -> Probe:
  """Compile the matmul for `plan` (X x Y) with a global contraction of
  `contraction` (a multiple of Y) and read the HLO."""
  mesh = device_mesh(plan)
  spec = lambda *axes: NamedSharding(mesh, PartitionSpec(*axes))
  batch, seq = 2 * plan.X, tokens_per_device // 2
  lhs = jax.ShapeDtypeStruct((batch, seq, contraction), jnp.bfloat16,
                             sharding=spec("X", None, "Y"))
  rhs = jax.ShapeDtypeStruct((contraction, width), jnp.bfloat16,
                             sharding=spec("Y", None))

  def matmul(x, w):
    return jnp.einsum("bsf,fd->bsd", x, w, preferred_element_type=result_dtype,
                      out_sharding=spec("X", None, "Y"))

  with jax.set_mesh(mesh):
    text = jax.jit(matmul).lower(lhs, rhs).compile().as_text()
  found, _ = hlo_collectives.parse_collectives(text, (plan.X, plan.Y),
                                               ("X", "Y"))
  over_y = [c for c in found if c.axes == ("Y",)]
  v = tokens_per_device * width * jnp.dtype(result_dtype).itemsize
  return Probe(contraction,
               bool(over_y) and all(c.kind == "collective-permute"
                                    for c in over_y),
               sum(c.in_bytes * c.count for c in over_y) / v)


def smallest_windowed(plan: MeshPlan, lo: int, hi: int,
                      result_dtype=jnp.bfloat16) -> int:
  """The smallest global contraction (a multiple of Y) in (lo, hi] that
  libtpu runs windowed, by bisection; `lo` must not run windowed and `hi`
  must (a ValueError says which does not)."""
  y = plan.Y
  a, b = lo // y, hi // y
  for k, want in ((a, False), (b, True)):
    if probe(plan, k * y, result_dtype).windowed != want:
      raise ValueError(f"contraction {k * y} on {plan.describe()}: windowed "
                       f"is {not want}, the bisection needs {want}")
  while b - a > 1:
    m = (a + b) // 2
    if probe(plan, m * y, result_dtype).windowed:
      b = m
    else:
      a = m
  return b * y


def survey(plan: MeshPlan, result_dtype=jnp.bfloat16) -> str:
  """One line: where libtpu starts the loop on `plan` and what it sends,
  beside the rule (simulator.tracing.windowed and the chip's figure)."""
  chip, y = plan.topology.chip, plan.Y
  scale = jnp.dtype(result_dtype).itemsize // 2
  name = f"{plan.topology.name} {plan.X}x{y} ({jnp.dtype(result_dtype).name})"
  rule = windowed.sent_over_v(y)
  if rule is None:
    p = probe(plan, 16384 * y, result_dtype)
    return (f"{name}: {'windowed' if p.windowed else 'no loop'} at f = "
            f"{p.contraction} (the rule: no loop at Y = {y})")
  first = smallest_windowed(plan, 64 * y, 16384 * y, result_dtype)
  sent = probe(plan, first, result_dtype).sent_over_v
  want = chip.windowed_einsum_contraction * scale
  at_y = -(-want // y) * y  # f runs in steps of Y here
  figure = f"{want}" if at_y == want else f"{want}, {at_y} in steps of {y}"
  return (f"{name}: windowed from f = {first} (the chip's figure {figure}: "
          f"{'agrees' if first == at_y else 'DIFFERS'}); sends {sent:.4f} V "
          f"over Y (the rule {rule:.4f}: "
          f"{'agrees' if abs(sent - rule) < 1e-9 else 'DIFFERS'})")
