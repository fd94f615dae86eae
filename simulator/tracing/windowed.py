"""libtpu's windowed einsum: which reduce-scatters over Y run as a loop of
collective-permutes, and what that loop sends.

XLA's SPMD partitioner may run a matmul whose contraction is sharded over an
axis, and whose result is sharded over it too, as a loop (OpenXLA
`spmd/dot_handler.cc`, `windowed_dot_general_body_rs`): each step a partial
matmul, its partial result passed to the ring neighbour by
collective-permutes, so the sends overlap the matmuls; it keeps the plain
reduce-scatter where its cost model finds the loop slower
(`disable_windowed_einsum`: computation against communication time). On
TPUs the choice turns, as probed, on the matmul's global contraction over its
result's bytes alone (not on the token count or the result's width) and on
the axis size:

- `experiments/probe_windowed.py` compiles `bsf,fd->bsd` with f and the
  result's d over Y for a topology and bisects f: v5p and v5e run the loop
  from f = 4224 at a bf16 result (8448 at f32), v4 from 6120, v6e from 9836
  (`meshes.hardware.Chip.windowed_einsum_contraction`), at Y = 4, 8 and 16
  alike and at 256 to 16384 tokens a device; never at Y = 2.
- What it sends, in collective-permutes over Y, for V the partial result's
  bytes on one device (what the reduce-scatter would reduce): (2 + 1/Y)·V
  at Y = 8, 16, 32 (Y/2 steps of four sends of V/Y, and one more), (1 +
  1/Y)·V at Y = 4 (the loop unrolled: five sends of V/4). Other Y are not
  probed and stay reduce-scatters.
- In the train step: llama2_7b v5p-128 8x8 (corpus #17) runs the MLP's down
  projection this way (`while.464`, body `windowed_dot_general_body_rs`,
  f = 11008: 32 layers x 17 sends of 4 MiB = 2,281,701,376 B, the HLO's
  collective-permutes over Y to the byte) and keeps the attention's output
  projection (f = 4096) a reduce-scatter (an all-reduce-scatter fusion).
"""

from __future__ import annotations


def sent_over_v(y: int) -> float | None:
  """Bytes the loop sends over Y as a multiple of V; None: no loop at Y."""
  if y == 4:
    return (y + 1) / y
  if y >= 8 and y & (y - 1) == 0:
    return (2 * y + 1) / y
  return None


def runs_windowed(threshold: int, y: int, contraction: int,
                  itemsize: int) -> bool:
  """Whether libtpu runs the reduce-scatter over Y of a matmul contracting
  `contraction` elements globally into an `itemsize`-byte result as the
  windowed loop (`threshold`: the chip's bf16-result contraction; 0 never)."""
  return (threshold > 0 and sent_over_v(y) is not None
          and contraction * 2 >= threshold * itemsize)
