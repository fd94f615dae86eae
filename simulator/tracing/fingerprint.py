"""A fingerprint of a traced step's structure, to tell whether a kept
compile still describes the program today's code traces.

A corpus row holds XLA's figures for the program traced when it was
compiled; a change to a model or to the step since then makes its re-check
compare today's program against yesterday's compile (corpus #128,
compiled in session 15: its HLO read 9.8% more collective bytes than the
traced program, and the same row compiled again reads 0.0%). The
fingerprint hashes what the compiler is given: each equation's primitive,
the shapes, dtypes and mesh shardings of its operands and results, its
plain parameters (numbers, strings, booleans, dtypes) and its inner
programs, recursively. Names (`name` parameters) and objects (callables,
meshes, shardings) are left out, so it does not depend on function names
or on whether the mesh is the abstract one of a trace or a real one of a
compile.
"""

from __future__ import annotations

import hashlib

import numpy as np
from jax.extend import core as jcore

from simulator.tracing.program import subjaxprs
from simulator.tracing.trace import spec_of

_PLAIN = (bool, int, float, str, type(None))


def _plain(value) -> object:
  """A parameter's value if it is plain data (None otherwise: left out)."""
  if isinstance(value, _PLAIN):
    return value
  if isinstance(value, np.dtype) or isinstance(value, type) and issubclass(
      value, np.generic):
    return str(np.dtype(value))
  if isinstance(value, (tuple, list)):
    items = [_plain(v) for v in value]
    return tuple(items) if all(i is not None or v is None
                               for i, v in zip(items, value)) else None
  return None


def _aval(v) -> tuple:
  aval = v.aval
  shape = tuple(getattr(aval, "shape", ()))
  dtype = str(getattr(aval, "dtype", type(aval).__name__))
  return shape, dtype, tuple(map(str, spec_of(aval))) if shape else ()


def _walk(jaxpr, out: list) -> None:
  jaxpr = getattr(jaxpr, "jaxpr", jaxpr)
  out.append(("in", tuple(_aval(v) for v in jaxpr.invars)))
  for eqn in jaxpr.eqns:
    calls = sorted(subjaxprs(eqn), key=lambda call: call[0])  # stable
    for key, sub in calls:
      out.append(("call", key))
      _walk(sub, out)
    called = {key for key, _ in calls}
    params = [(key, plain) for key in sorted(eqn.params)
              if key not in called and key != "name"
              and (plain := _plain(eqn.params[key])) is not None]
    out.append((eqn.primitive.name,
                tuple(_aval(v) for v in eqn.invars
                      if not isinstance(v, jcore.Literal)),
                tuple(_aval(v) for v in eqn.outvars), tuple(params)))
  out.append(("out", tuple(_aval(v) for v in jaxpr.outvars
                           if not isinstance(v, jcore.Literal))))


def program_fingerprint(jaxpr) -> str:
  """A hex digest of the step's structure (`jaxpr`: a Jaxpr or ClosedJaxpr)."""
  parts: list = []
  _walk(jaxpr, parts)
  return hashlib.sha256(repr(parts).encode()).hexdigest()[:16]
