"""simulator.tracing.trace: which residuals XLA keeps as buffers (fused_residuals),
the residuals read off the train step's own program (saved_residuals), which
arguments the step reads (read_inputs)."""

import jax
import jax.numpy as jnp

import optax

from meshes.layout import abstract_mesh, plan_mesh
from meshes.topology import parse_topology
from models.registry import load_model
from simulator.settings import TrainSettings
from simulator.memory import xla_rules
from simulator.tracing.trace import (fused_residuals, layout_of, read_inputs,
                                     spec_of, trace)


def _fused_by_shape(fn, *args) -> dict[tuple, list[bool]]:
  out: dict[tuple, list[bool]] = {}
  for r in fused_residuals(fn, *args):
    if not r.argument:
      out.setdefault(r.aval.shape, []).append(r.fused)
  return out


def test_norm_intermediates_fuse_matmul_outputs_stay():
  """An RMS norm's f32 chain feeding a matmul: the chain is fused, the bf16
  value the matmul reads and the matmul's output are buffers."""
  def f(x, w):
    x32 = x.astype(jnp.float32)
    y = x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, -1, keepdims=True) + 1e-6)
    h = jnp.dot(y.astype(jnp.bfloat16), w)  # (8, 32)
    return jnp.sum(jnp.tanh(h).astype(jnp.float32))

  x = jnp.ones((8, 16), jnp.bfloat16)
  w = jnp.ones((16, 32), jnp.bfloat16)
  got = _fused_by_shape(f, x, w)
  assert True in got[(8, 16)] and False in got[(8, 16)]  # f32 chain; bf16 input
  assert got[(8, 32)].count(False) >= 1  # the matmul output
  assert all(got[(8, 32)][1:])  # tanh and what follows: fused


def test_matmul_plus_bias_is_a_buffer_activation_of_it_is_not():
  def f(x, w, b):
    h = jnp.dot(x, w) + b[None, :]  # XLA's output fusion: one buffer
    return jnp.sum(jax.nn.silu(h) * h)

  x, w, b = jnp.ones((8, 16)), jnp.ones((16, 32)), jnp.ones((32,))
  flags = _fused_by_shape(f, x, w, b)[(8, 32)]
  assert flags[0] is False  # dot + bias (the dot output is not saved)
  assert flags[1:] and all(flags[1:])  # silu's internals


def test_read_inputs_follows_jit_and_dead_code():
  """An argument read only by a dead op, or passed to a jit that ignores it,
  is not read; one returned as is, or read inside a jit, is."""
  inner = jax.jit(lambda x, unused: x * 2)

  def f(a, b, c, d, e):
    _ = jnp.sin(d)  # dead
    return a + inner(b, c), e

  ones = jnp.ones(3)
  got = read_inputs(jax.make_jaxpr(f)(ones, ones, ones, ones, ones))
  assert got == [True, True, False, False, True]


def test_read_inputs_follows_scan_bodies():
  """A scan's operand its body never reads is dropped as jit drops it (JAX's
  scan dead-code rule): an encoder-decoder's decode step hands its decoder
  scan every layer's cross-attention k and v projections and reads none."""
  def f(w_read, w_unread, x):
    def body(carry, ws):
      read, _ = ws
      return carry @ read, None
    return jax.lax.scan(body, x, (w_read, w_unread))[0]

  stack = jnp.ones((2, 3, 3))
  got = read_inputs(jax.make_jaxpr(f)(stack, stack, jnp.ones(3)))
  assert got == [True, False, True]


def test_read_inputs_adafactor_placeholders_unread():
  """Adafactor keeps (1,) placeholders for the moments a parameter's shape
  does not use; its update never reads them (jit drops them)."""
  tx = optax.adafactor(1e-3)
  params = {"w": jnp.ones((256, 128)), "b": jnp.ones(128)}
  state = tx.init(params)
  reads = read_inputs(jax.make_jaxpr(lambda g, s, p: tx.update(g, s, p))(
      params, state, params))
  leaves = jax.tree.leaves((params, state, params))
  unread = [x.shape for x, r in zip(leaves, reads) if not r]
  # w factored: v is a placeholder; b not: v_row and v_col are.
  assert sorted(unread) == [(1,), (1,), (1,)], unread
  assert all(r for x, r in zip(leaves, reads) if x.shape != (1,))


def _saved(residuals) -> list[tuple]:
  return [(str(r.aval), r.name, r.fused, r.op) for r in residuals
          if not r.argument and r.aval.shape]  # scalars: a seed or a literal


def _step_and_loss_residuals(**kw):
  mesh = abstract_mesh(plan_mesh(parse_topology("v5p-16"), 4, 2))
  traced = trace(load_model("tiny"), TrainSettings(batch=8, seq=128, **kw),
                 mesh)
  step = traced.step
  with jax.sharding.use_abstract_mesh(mesh):
    of_loss = fused_residuals(step.loss_fn, step.params, step.micro_batch)
  return _saved(traced.residuals), _saved(of_loss)


def test_step_residuals_are_the_loss_vjps():
  """Read off the step's program, the residuals are those jax.vjp of the
  loss saves (a trace of their own), for every remat kind and with
  grad_accum (the first micro-batch's forward and backward are at the top)."""
  for kw in ({"remat": "full"}, {"remat": "dots"}, {"remat": "none"},
             {"remat": "offload:qkv"}, {"remat": "full", "grad_accum": 2}):
    step, of_loss = _step_and_loss_residuals(**kw)
    assert step and step == of_loss, kw


def test_frozen_weights_save_nothing_for_their_gradient():
  """LoRA: the step takes no gradient of the frozen base, so nothing is saved
  for one (the final norm's output feeds only the frozen output projection's
  weight gradient); a vjp of the loss over every param would save it."""
  step, of_loss = _step_and_loss_residuals(remat="full", lora_rank=4)
  assert set(step) < set(of_loss)
  assert any("final_norm" in name for _, name, _, _ in set(of_loss) - set(step))


def test_the_layer_body_is_traced_once_and_leaves_no_dead_code():
  """models.transformer.scanned runs flax's scan without its invariance
  check: the step traces the layer body once, and with no remat boundary
  that check's trace left its constant computations (the rope table, the
  blockwise attention's zero accumulators) at the step's top level as dead
  equations, 47 of them in tiny's step against 18 with full remat."""
  from models import transformer
  from simulator.step import build_step
  mesh = abstract_mesh(plan_mesh(parse_topology("v5p-8"), 2, 2))
  real = transformer.Block.__call__
  dead = {}
  for remat in ("none", "full"):
    step = build_step(load_model("tiny"),
                      TrainSettings(batch=8, seq=128, remat=remat), mesh)
    calls = []

    def counted(self, *args, **kwargs):
      calls.append(1)
      return real(self, *args, **kwargs)

    transformer.Block.__call__ = counted
    try:
      with jax.sharding.use_abstract_mesh(mesh):
        j = jax.make_jaxpr(step.fn)(*step.args).jaxpr
    finally:
      transformer.Block.__call__ = real
    assert len(calls) == 1, (remat, len(calls))
    dead[remat] = len(xla_rules.dead_equations(j))  # top-level equations
  assert dead["none"] <= dead["full"], dead


def _reshards(topology: str, x: int, y: int) -> list:
  plan = plan_mesh(parse_topology(topology), x, y)
  j = trace(load_model("tiny"), TrainSettings(batch=8, seq=128),
            abstract_mesh(plan)).jaxpr.jaxpr
  out: list = []

  def walk(jaxpr) -> None:
    for e in jaxpr.eqns:
      if e.primitive.name == "reshard":
        out.append(e)
      for v in e.params.values():
        for sub in v if isinstance(v, (tuple, list)) else (v,):
          inner = getattr(sub, "jaxpr", sub)
          if hasattr(inner, "eqns"):
            walk(inner)
  walk(j)
  return out


def test_a_reshard_over_axes_of_one_device_is_a_view():
  """At mesh 1x1 the FSDP reshards change specs (X dropped) but not the
  layout: every one is a view. On 4x2 some gather."""
  one = _reshards("h100:1", 1, 1)
  assert any(spec_of(e.invars[0].aval) != spec_of(e.outvars[0].aval)
             for e in one)
  assert all(xla_rules.is_view(e) for e in one)
  assert all(layout_of(e.outvars[0].aval) == ((),) * e.outvars[0].aval.ndim
             for e in one)
  assert not all(xla_rules.is_view(e) for e in _reshards("h100:8", 4, 2))
