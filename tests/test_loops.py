"""simulator.tracing.loops: how a loop primitive's operands divide."""

import jax
import jax.numpy as jnp

from simulator.tracing import loops


def _eqn(fn, *args, primitive):
  jaxpr = jax.make_jaxpr(fn)(*args).jaxpr
  eqn, = [e for e in jaxpr.eqns if e.primitive.name == primitive]
  return eqn


def test_scan_counts_constants_and_carries():
  w = jnp.ones(3)

  def f(c, d, xs):
    def body(carry, x):
      c, d = carry
      return (c * w + x, d + 1.0), c.sum()
    return jax.lax.scan(body, (c, d), xs)

  eqn = _eqn(f, jnp.ones(3), 0.0, jnp.ones((4, 3)), primitive="scan")
  consts, carries = loops.scan_counts(eqn)
  assert (consts, carries) == (1, 2)  # w; (c, d)
  assert len(eqn.invars) == consts + carries + 1  # + xs
  assert len(eqn.outvars) == carries + 1  # + the stacked ys


def test_while_counts_condition_and_body_constants():
  def f(n, x, y):
    return jax.lax.while_loop(lambda c: c[0] < n,
                              lambda c: (c[0] + 1, c[1] * y), (0, x))

  eqn = _eqn(f, 3, 1.0, 2.0, primitive="while")
  assert loops.while_counts(eqn) == (1, 1)  # n; y
  assert len(eqn.invars) == 1 + 1 + 2
