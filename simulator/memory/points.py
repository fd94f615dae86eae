"""What a heap simulation of the step leaves as data (simulator.memory.liveness
makes it): the transient live bytes at each point that can be the peak, as
fixed + linear in the batch, and what is live at the points walked. Kept in
the sweep's cache and read without the traced program, so nothing here
imports jax."""

from __future__ import annotations

import dataclasses
import functools
from typing import TYPE_CHECKING, Iterable

import numpy as np

from simulator.tracing.batch_probe import bytes_at

if TYPE_CHECKING:
  from simulator.memory.liveness import _Simulation

Bytes = tuple[int, int]  # (fixed, linear at the traced batch)


@dataclasses.dataclass(frozen=True)
class LiveBuffer:
  """One buffer live at a point."""

  where: str  # the equation that made it, by scope ("blocks/mlp: mul")
  shape: tuple[int, ...]  # per device
  dtype: str
  bytes: Bytes
  scopes: tuple[str, ...]  # the named scopes it was made under
  backward: bool  # made by the backward pass (a transpose)
  hoisted: bool = False  # a weight stack made outside its loop


@dataclasses.dataclass(frozen=True)
class Points:
  """The step's transient live bytes at each of its top-level equations'
  points that can be the peak at some batch, where each is, and (on demand)
  what is live there."""

  fixed: np.ndarray
  linear: np.ndarray
  where: tuple[str, ...]
  paths: tuple[tuple, ...]
  part: np.ndarray  # each point's index into `parts`
  parts: tuple[str, ...]  # the step's parts: top-level pass and scope
  order: tuple[str, ...]  # per point: its schedule of weight gradients
  # per point with any: what the rules add there at each batch (the
  # split-K matmuls of xla_gpu_rules, xla_rules' interleaved micro-batch)
  splits: dict[int, tuple]
  _sim: _Simulation = dataclasses.field(repr=False, compare=False)
  _jaxpr: object = dataclasses.field(repr=False, compare=False)
  _in_place: tuple = dataclasses.field(repr=False, compare=False)
  _live: dict = dataclasses.field(repr=False, compare=False,
                                  default_factory=dict)

  def at(self, num: int, den: int) -> np.ndarray:
    """Every point's bytes at batch scale num/den: fixed + floor(linear *
    num / den), exact in int64 (linear at the probe batch times a large
    batch overflows it: llama2_70b b1024, 9.05e15 * 1024); with the
    point-wise rules' bytes at that batch (`split_bytes`)."""
    out = bytes_at(self.fixed, self.linear, num, den)
    for i, extra in self.split_bytes(num, den).items():
      out[i] += extra
    return out

  def split_bytes(self, num: int, den: int) -> dict[int, int]:
    """{point: bytes the point-wise rules add there} at batch scale num/den
    (where XLA splits a matmul at that batch, and the other micro-batch's
    work where two interleave)."""
    out = {}
    for i in self.splits:
      extra = sum(self.extras(i, num, den).values())
      if extra:
        out[i] = extra
    return out

  def extra_dtypes(self, index: int) -> dict[str, str]:
    """{what: dtype} of the point-wise rules' bytes at point `index`
    (`extras`'s keys)."""
    return {s.label: s.dtype for s in self.splits.get(index, ())}

  def extras(self, index: int, num: int, den: int) -> dict[str, int]:
    """{what: bytes} the point-wise rules add at point `index` at batch scale
    num/den (`split_bytes`, by rule)."""
    out: dict[str, int] = {}
    for s in self.splits.get(index, ()):
      extra = s.extra(num, den)
      if extra:
        out[s.label] = out.get(s.label, 0) + extra
    return out

  @functools.cached_property
  def _schedules(self) -> dict[str, np.ndarray]:
    """{schedule simulated: which points are its} (the sweep asks for every
    schedule's peak at many batches)."""
    order = np.array(self.order)
    return {o: order == o for o in dict.fromkeys(self.order)}

  def _of(self, orders: Iterable[str] | None) -> np.ndarray:
    """Which points belong to the schedules `orders` (None: all)."""
    if orders is None:
      return np.ones(len(self.where), dtype=bool)
    return functools.reduce(
        np.logical_or, (self._schedules[o] for o in orders
                        if o in self._schedules),
        np.zeros(len(self.where), dtype=bool))

  def order_peaks(self, num: int, den: int) -> dict[str, int]:
    """{schedule: its largest point's bytes} at batch scale num/den."""
    values = self.at(num, den)
    return {o: int(values[mask].max()) for o, mask in self._schedules.items()}

  def peak_at(self, num: int, den: int,
              orders: Iterable[str] | None = None) -> tuple[int, int]:
    """(bytes, point index) of the largest point at batch scale num/den, of
    the schedules `orders` (None: all)."""
    if not len(self.where):
      return 0, -1
    values = np.where(self._of(orders), self.at(num, den),
                      np.iinfo(np.int64).min)
    i = int(np.argmax(values))
    return int(values[i]), i

  def part_peaks(self, num: int, den: int,
                 orders: Iterable[str] | None = None) -> dict[str, int]:
    """The largest transient live bytes of each part of the step, over the
    schedules `orders` (None: all)."""
    kept = self._of(orders)
    out = np.full(len(self.parts), np.iinfo(np.int64).min, dtype=np.int64)
    np.maximum.at(out, self.part[kept], self.at(num, den)[kept])
    return {name: int(v) for name, v in zip(self.parts, out)
            if v != np.iinfo(np.int64).min}

  def live(self, index: int) -> list[LiveBuffer]:
    """The buffers live at point `index` (walked once, then kept; points
    kept as data, without their program, know only those walked before:
    another raises LiveSetUnknown)."""
    if index not in self._live:
      if self._sim is None:
        raise LiveSetUnknown(f"the live set at point {index} was not kept")
      self._live[index] = self._sim.live_at(
          self._jaxpr, self.paths[index], in_place_out=self._in_place,
          order=self.order[index])
    return self._live[index]

  def __getstate__(self) -> dict:
    """As data (simulator.cache): the points and the live sets walked so
    far, not the traced program and its simulation."""
    return {k: v for k, v in self.__dict__.items()
            if k not in ("_sim", "_jaxpr", "_in_place")}

  def __setstate__(self, state: dict) -> None:
    self.__dict__.update(state, _sim=None, _jaxpr=None, _in_place=())


class LiveSetUnknown(LookupError):
  """Points kept as data were asked what is live at a point nobody walked
  while the program was at hand: the step must be traced again."""


# The schedules of the step's own weight gradients simulated: deferred
# (xla_rules), the traced order, the traced order with their collectives late
# (GPU only: xla_gpu_rules); and on a GPU the traced order with the logits
# matmul on cuBLAS, as XLA's autotuner may pick on a real GPU (AUTOTUNED:
# left out where a deviceless compile is compared).
ORDERS = ("deferred", "traced", "late", "cublas", "memory")
AUTOTUNED = ("cublas",)
ORDER_NOTES = {"traced": "weight gradients in traced order",
               "late": "weight gradients in traced order, collectives late",
               "cublas": "traced order, logits matmul on cuBLAS (autotuned)",
               "memory": "the memory scheduler's order: loop outputs "
                         "zero-filled first"}


def order_label(order: str) -> str:
  """How a report names the schedule `order` (ORDERS)."""
  return ORDER_NOTES.get(order, "weight gradients deferred")


def kept_orders(peaks: dict[str, int], limit: int | None) -> tuple[str, ...]:
  """The schedules of the weight gradients the peak is the largest of, from
  each one's peak `peaks` (bytes, arguments included) and XLA's
  rematerialization limit (None: the rule does not apply): the deferred
  order is dropped where it is over the limit and another order is not
  (the rematerialized-logits rule, simulator.memory.xla_rules)."""
  others = [o for o in peaks if o != "deferred"]
  if (limit is not None and peaks.get("deferred", 0) > limit
      and any(peaks[o] <= limit for o in others)):
    return tuple(others)
  return tuple(peaks)
