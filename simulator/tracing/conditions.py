"""When a collective is made: size tests the SPMD partitioner decides by,
read at another mesh of a structural class and another batch
(simulator.tracing.program makes them). Data inside a kept step model
(simulator.timing.roofline.Term), so nothing here imports jax."""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True)
class SizeTest:
  """Whether p < q (or, with `want` False, not), two per-device figures
  read at the traced mesh and batch, each scaling as (X/X0)^x · (Y/Y0)^y ·
  (T/T0)^t at another mesh of the class and another global token count T:
  a choice the SPMD partitioner makes by sizes (`_Walker._grouped_side`)."""

  p: float
  px: int
  py: int
  pt: int
  q: float
  qx: int
  qy: int
  qt: int
  want: bool = True

  def holds(self, t: float = 1.0, x: float = 1.0, y: float = 1.0) -> bool:
    p = self.p * x ** self.px * y ** self.py * t ** self.pt
    q = self.q * x ** self.qx * y ** self.qy * t ** self.qt
    return (p < q) == self.want


@dataclasses.dataclass(frozen=True)
class Condition:
  """When a collective is made: every test of `all_of` holds and no
  conjunction of `none_of` does (an earlier gather of the value it would
  share holds there)."""

  all_of: tuple[SizeTest, ...] = ()
  none_of: tuple[tuple[SizeTest, ...], ...] = ()

  def holds(self, t: float = 1.0, x: float = 1.0, y: float = 1.0) -> bool:
    every = lambda tests: all(s.holds(t, x, y) for s in tests)
    return every(self.all_of) and not any(map(every, self.none_of))
