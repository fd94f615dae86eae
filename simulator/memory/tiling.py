"""TPU tiled layouts: the bytes one per-device array takes in HBM.

TPU arrays are stored in tiles: the two minor dims of a rank >= 2 array in
(8, 128) tiles (second-minor 1, 2 or 4 when it is that small); a rank-1
array of n elements in tiles of n rounded up to a power of two, at least 512
bytes and at most 1024 elements (f32[384]: T(512), f32[768] and f32[50257]:
T(1024), bf16[24]: T(256), read off the compiled layouts of gpt2, llama and
tiny steps); a scalar in one 512-byte tile. The compiler also picks which
dims are minor (major_to_minor) to waste least: e.g. a (50257, 192) f32 shard
is stored with 50257 minor.

Dtypes are numpy's names ("bfloat16": ml_dtypes registers the ML ones, as
jax does, so that reading a kept estimate needs no jax). `tpu_tiled_bytes`
predicts that layout; `layout_bytes` measures a layout the
compiler chose (simulator.xla.compiled checks the two agree, leaf by leaf).
"""

from __future__ import annotations

import math

import ml_dtypes  # noqa: F401  pylint: disable=unused-import
import numpy as np

TILE_MINOR, TILE_SECOND = 128, 8
TILE_BYTES_1D = 512  # the least rank-1 tile (and a scalar's)
TILE_MAX_1D = 1024  # elements


def _up(x: int, t: int) -> int:
  return -(-x // t) * t


def tiled(dims_major_to_minor: list[int], itemsize: int,
          tile: tuple[int, ...]) -> int:
  """Bytes of an array whose dims, major to minor, are rounded up to `tile`
  (its last entries apply to the minor dims)."""
  dims = list(dims_major_to_minor) or [1]  # a scalar still fills one tile
  for i, t in enumerate(reversed(tile)):
    if i < len(dims) and t > 1:
      j = len(dims) - 1 - i
      dims[j] = _up(dims[j], t)
  return math.prod(dims) * itemsize


def tpu_tiled_bytes(shape: tuple[int, ...], dtype) -> int:
  """Bytes of one per-device array in the TPU layout the compiler picks."""
  itemsize = np.dtype(dtype).itemsize
  if len(shape) == 0:
    return TILE_BYTES_1D
  if len(shape) == 1:
    n = shape[0]
    tile = min(max(1 << max(n - 1, 0).bit_length(), TILE_BYTES_1D // itemsize),
               TILE_MAX_1D)
    return _up(n, tile) * itemsize
  best = None
  for i in range(len(shape)):  # i: the minor dim, j: the second-minor dim
    for j in range(len(shape)):
      if i == j:
        continue
      rest = [d for k, d in enumerate(shape) if k not in (i, j)]
      size = _tiled_in_order(rest + [shape[j], shape[i]], itemsize)
      best = size if best is None else min(best, size)
  return best


def tiled_in_order_bytes(shape: tuple[int, ...], dtype) -> int:
  """Bytes of one per-device array of rank >= 2 stored with its dims in
  their own order, the last minor: a layout the compiler is given rather
  than picks (simulator.memory.xla_rules, gathered slices minor)."""
  return _tiled_in_order(list(shape), np.dtype(dtype).itemsize)


def _tiled_in_order(dims_major_to_minor: list[int], itemsize: int) -> int:
  second = dims_major_to_minor[-2]
  tile = TILE_SECOND if second >= TILE_SECOND else 1 << (
      max(second, 1) - 1).bit_length()
  return tiled(dims_major_to_minor, itemsize, (tile, TILE_MINOR))


def layout_bytes(shape: tuple[int, ...], dtype, layout) -> int:
  """Bytes of one array under a layout the compiler chose (its
  major_to_minor order and first-level tile; untiled: the plain bytes)."""
  itemsize = np.dtype(dtype).itemsize
  tiling = getattr(layout, "tiling", None) or ()
  if not tiling:
    return math.prod(shape) * itemsize
  order = list(getattr(layout, "major_to_minor", range(len(shape))))
  return tiled([shape[a] for a in order], itemsize, tiling[0])
