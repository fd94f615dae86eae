"""simulator.tracing.fingerprint: the same program gives the same digest
whichever way it is traced; a different program a different one."""

import dataclasses

import jax
import jax.numpy as jnp

from meshes.layout import abstract_mesh, plan_mesh
from meshes.topology import parse_topology
from models.registry import load_model
from simulator.settings import TrainSettings
from simulator.step import build_step
from simulator.tracing.fingerprint import program_fingerprint
from simulator.tracing.trace import trace
from simulator.xla.compiled import make_mesh

TINY = load_model("tiny")
SETTINGS = TrainSettings(batch=8, seq=128)
PLAN = plan_mesh(parse_topology("v5p-8"), 2, 2)


def _traced(settings=SETTINGS, cfg=TINY) -> str:
  return program_fingerprint(trace(cfg, settings, abstract_mesh(PLAN)).jaxpr)


def test_a_trace_and_a_compile_of_one_step_read_the_same():
  """What crosscheck.recheck traces (an abstract mesh) and what
  compiled.compile_fn compiles (jit on the topology's real devices)."""
  mesh = make_mesh("v5p-8", 2, 2)
  step = build_step(TINY, SETTINGS, mesh)
  with jax.set_mesh(mesh):
    compiled = jax.jit(step.fn, donate_argnums=(0, 1)).trace(*step.args)
  assert program_fingerprint(compiled.jaxpr) == _traced() == _traced()


def test_a_changed_program_reads_differently():
  base = _traced()
  assert _traced(dataclasses.replace(SETTINGS, remat="dots")) != base
  assert _traced(dataclasses.replace(SETTINGS, batch=16)) != base
  wider = dataclasses.replace(TINY, d_ff=2 * TINY.d_ff)
  assert _traced(cfg=wider) != base


def test_function_names_are_left_out():
  def one(x):
    return jnp.sin(x) * 2

  def two(x):
    return jnp.sin(x) * 2

  def three(x):
    return jnp.cos(x) * 2

  read = lambda f: program_fingerprint(
      jax.make_jaxpr(jax.jit(f))(jnp.ones((4, 8))))
  assert read(one) == read(two) != read(three)
