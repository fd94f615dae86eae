"""simulator.memory.xla_rules: each rule on a program made to show it."""

import jax
import jax.numpy as jnp
import pytest

from meshes.layout import abstract_mesh, plan_mesh
from meshes.topology import parse_topology
from models import scopes
from models.registry import load_model
from simulator.batch_probe import PROBE
from simulator.memory import liveness, xla_rules
from simulator.settings import TrainSettings
from simulator.trace import trace_probe


def _eqn(jaxpr, name):
  return next(e for e in jaxpr.eqns if e.primitive.name == name)


def test_output_fusion_of_activations_not_of_weight_gradients():
  """A matmul of activations (a probe-batch dim) read by elementwise ops
  fuses into them; a batch-free matmul (a weight gradient) is a buffer."""
  act = jax.make_jaxpr(lambda x, w: jnp.exp(x @ w))(
      jax.ShapeDtypeStruct((PROBE, 16), jnp.float32), jnp.ones((16, 8)))
  dot, exp = _eqn(act.jaxpr, "dot_general"), _eqn(act.jaxpr, "exp")
  assert xla_rules.fused_away(dot, dot.outvars[0], [exp], [exp], False)
  grad = jax.make_jaxpr(lambda x, d: jnp.exp(x.T @ d))(
      jax.ShapeDtypeStruct((PROBE, 16), jnp.float32),
      jax.ShapeDtypeStruct((PROBE, 8), jnp.float32))
  dot, exp = _eqn(grad.jaxpr, "dot_general"), _eqn(grad.jaxpr, "exp")
  assert not xla_rules.fused_away(dot, dot.outvars[0], [exp], [exp], False)


def test_views_alias_their_operand():
  j = jax.make_jaxpr(lambda x: (x.reshape(4, 2).T, x.astype(jnp.float32),
                                x.astype(jnp.bfloat16)))(jnp.ones(8))
  kinds = {e.primitive.name + str(e.outvars[0].aval.dtype): xla_rules.is_view(e)
           for e in j.jaxpr.eqns}
  assert kinds == {"reshapefloat32": True, "transposefloat32": True,
                   "convert_element_typebfloat16": False}


def _two_loops(w_stack, cast):
  """A forward and a backward loop over a stacked weight, as jax.grad of a
  rematerialized scan makes them (the model's layer stack); each slice cast
  to bf16 in the body when `cast`."""
  @jax.checkpoint
  def body(h, w):
    w = w.astype(jnp.bfloat16) if cast else w
    return (jnp.tanh(h @ w) @ w.T).astype(h.dtype), None

  def loss(ws, x):
    return jnp.sum(jax.lax.scan(body, x, ws)[0].astype(jnp.float32))

  x = jax.ShapeDtypeStruct((PROBE, w_stack.shape[1]), jnp.bfloat16)
  return jax.make_jaxpr(jax.grad(loss))(w_stack, x)


def test_a_weight_stack_cast_in_both_loops_is_cast_once_outside():
  ws = jax.ShapeDtypeStruct((6, 128, 128), jnp.float32)
  j = _two_loops(ws, cast=True).jaxpr
  stacks, hoisted = xla_rules.hoisted_stacks(j, False)
  casts = {k: v for k, v in stacks.items() if k[2] == "cast"}
  assert len(casts) == 1 and hoisted
  (first, last, size), = casts.values()
  loops = [i for i, e in enumerate(j.eqns) if e.primitive.name == "scan"]
  assert (first, last) == (loops[0], loops[-1]) and first < last
  assert size == (6 * 128 * 128 * 2, 0)  # the whole stack in bf16


@pytest.mark.parametrize("shape,copied", [((6, 128, 256), True),
                                          ((6, 128, 200), False)])
def test_a_backward_loop_copies_a_weight_argument_to_the_transposed_layout(
    shape, copied):
  """Only in the backward loop, only for an argument read directly, and not
  when the argument is stored transposed already (last dim padded)."""
  ws = jax.ShapeDtypeStruct(shape, jnp.bfloat16)
  j = _two_loops(ws, cast=False).jaxpr
  stacks, _ = xla_rules.hoisted_stacks(j, False)
  matmul = [v for k, v in stacks.items() if k[2] == "matmul"]
  assert bool(matmul) == copied
  if copied:
    backward = [i for i, e in enumerate(j.eqns) if e.primitive.name == "scan"
                and "transpose(" in str(e.source_info.name_stack)]
    assert [(f, l) for f, l, _ in matmul] == [(backward[0], backward[0])]


def test_the_output_projection_gradient_is_deferred_on_one_d_meshes():
  """On a 1-D mesh the loss's weight-gradient matmul moves after the layers'
  and the embedding's backward; on a 2-D mesh the rule does not apply."""
  assert xla_rules.defers_output_grad(
      plan_mesh(parse_topology("v5p-8"), 4, 1))
  assert not xla_rules.defers_output_grad(
      plan_mesh(parse_topology("v5p-8"), 2, 2))
  plan = plan_mesh(parse_topology("v5p-8"), 4, 1)
  j = trace_probe(load_model("tiny"), TrainSettings(batch=8, seq=128),
                  abstract_mesh(plan)).jaxpr.jaxpr

  def order(jaxpr):
    loss_grad = next(i for i, e in enumerate(jaxpr.eqns)
                     if e.primitive.name == "dot_general"
                     and scopes.LOSS in scopes.scopes_of(e.source_info.name_stack)
                     and "transpose(" in str(e.source_info.name_stack)
                     and not any(d % PROBE == 0 for d in e.outvars[0].aval.shape))
    layers_back = max(i for i, e in enumerate(jaxpr.eqns)
                      if e.primitive.name == "scan")
    return loss_grad, layers_back

  before, moved = order(j), order(xla_rules.defer_output_grad(j))
  assert before[0] < before[1] and moved[0] > moved[1]
  assert len(xla_rules.defer_output_grad(j).eqns) == len(j.eqns)
  assert (liveness.simulate(j, 0, True).peak_at(1, 1)[0]
          >= liveness.simulate(j, 0, False).peak_at(1, 1)[0])
