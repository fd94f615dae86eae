"""simulator.memory.points: a heap simulation's points as data, each
schedule's and part's peak at any batch, and the live sets kept."""

import pickle

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from simulator.memory import liveness, points
from simulator.tracing.batch_probe import PROBE


def test_schedule_and_part_peaks_are_their_largest_points():
  """Each schedule's peak, the peak over some schedules and each part's
  peak are the largest of their points at the batch, as a plain search of
  the points finds them."""
  rng = np.random.default_rng(0)
  n = 60
  order = tuple(rng.choice(["deferred", "traced", "late"], n))
  pts = points.Points(
      fixed=rng.integers(0, 10**6, n), linear=rng.integers(0, 10**4, n),
      where=tuple(map(str, range(n))), paths=((0,),) * n,
      part=rng.integers(0, 4, n), parts=("a", "b", "c", "d"), order=order,
      splits={}, _sim=None, _jaxpr=None, _in_place=())
  for num, den in ((1, 1), (7, 3), (10**6, 1)):
    values = [int(f) + int(l) * num // den
              for f, l in zip(pts.fixed, pts.linear)]
    assert pts.order_peaks(num, den) == {
        o: max(v for v, p in zip(values, order) if p == o)
        for o in dict.fromkeys(order)}
    for kept in (None, ("traced",), ("late", "deferred"), ("cublas",)):
      mine = [v if kept is None or o in kept else None
              for v, o in zip(values, order)]
      if any(v is not None for v in mine):
        best = max(v for v in mine if v is not None)
        assert pts.peak_at(num, den, kept) == (best, mine.index(best))
    assert pts.part_peaks(num, den, ("traced",)) == {
        part: max(v for v, p, o in zip(values, pts.part, order)
                  if o == "traced" and pts.parts[p] == part)
        for part in pts.parts
        if any(o == "traced" and pts.parts[p] == part
               for p, o in zip(pts.part, order))}


def test_points_at_a_large_batch_do_not_overflow():
  """linear bytes at the probe batch times a large batch pass 2**63
  (llama2_70b v5p-256 32x4 b1024: 9.05e15 * 1024): the scaled figures are
  still exact."""
  x = jax.ShapeDtypeStruct((PROBE, 2**31), jnp.bfloat16)  # 4.3e15 B
  pts = liveness.simulate(jax.make_jaxpr(jnp.tanh)(x), 0)
  num, den = 4096, PROBE
  exact = [int(a) + int(b) * num // den
           for a, b in zip(pts.fixed, pts.linear)]
  assert max(int(b) for b in pts.linear) * num > 2**63
  assert list(map(int, pts.at(num, den))) == exact
  assert pts.peak_at(num, den)[0] == max(exact)


def test_points_kept_as_data_know_the_live_sets_walked_before():
  """Pickled (the sweep's cache), the points drop their program: a live
  set walked before comes back; another raises LiveSetUnknown."""
  def f(xs, w):
    h = jnp.tanh(xs @ w)
    return jnp.sum(h @ w.T)

  pts = liveness.simulate(
      jax.make_jaxpr(f)(jnp.ones((16, 64)), jnp.ones((64, 64))), 0)
  _, i = pts.peak_at(1, 1)
  walked = pts.live(i)
  kept = pickle.loads(pickle.dumps(pts))
  assert kept.live(i) == walked and kept.peak_at(1, 1) == pts.peak_at(1, 1)
  other = next(j for j in range(len(pts.where)) if j != i)
  with pytest.raises(points.LiveSetUnknown):
    kept.live(other)
  assert pts.live(other)  # with its program, any point walks


def test_the_deferred_order_over_the_limit_is_dropped():
  """The rematerialized-logits rule: the deferred order goes where it is
  over XLA's limit and the traced one is not; the traced order over it
  with the deferred under keeps both (XLA was seen recomputing the
  logits, nothing else); both over, or no limit: both kept."""
  kept = points.kept_orders
  assert kept({"deferred": 101, "traced": 90}, 100) == ("traced",)
  assert kept({"deferred": 100, "traced": 90}, 100) == ("deferred", "traced")
  assert kept({"traced": 101, "deferred": 90}, 100) == ("traced", "deferred")
  assert kept({"deferred": 120, "traced": 101}, 100) == ("deferred", "traced")
  assert kept({"deferred": 120, "traced": 90}, None) == ("deferred", "traced")
  assert kept({"deferred": 120}, 100) == ("deferred",)
