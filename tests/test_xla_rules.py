"""simulator.memory.xla_rules: each rule on a program made to show it."""

import dataclasses
import functools
import math

import jax
import jax.numpy as jnp
import pytest
from jax.sharding import AbstractMesh, AxisType, NamedSharding, PartitionSpec as P

from meshes.layout import abstract_mesh, plan_mesh
from meshes.topology import parse_topology
from models import scopes
from models.registry import load_model
from simulator.tracing.batch_probe import PROBE, carries_batch
from simulator import memory
from simulator.memory import liveness, xla_rules
from simulator.settings import TrainSettings
from simulator.step import device_shape
from simulator.tracing.program import subjaxprs
from simulator.tracing.trace import made_by_backward, trace_probe


def _eqn(jaxpr, name):
  return next(e for e in jaxpr.eqns if e.primitive.name == name)


def test_output_fusion_of_activations_not_of_weight_gradients():
  """A matmul of activations (a probe-batch dim) read by one elementwise op
  fuses into it; a batch-free matmul (a weight gradient) is a buffer."""
  act = jax.make_jaxpr(lambda x, w: jnp.exp(x @ w))(
      jax.ShapeDtypeStruct((PROBE, 16), jnp.float32), jnp.ones((16, 8)))
  dot, exp = _eqn(act.jaxpr, "dot_general"), _eqn(act.jaxpr, "exp")
  assert xla_rules.fused_away(dot, dot.outvars[0], [exp], [exp], False, True)
  grad = jax.make_jaxpr(lambda x, d: jnp.exp(x.T @ d))(
      jax.ShapeDtypeStruct((PROBE, 16), jnp.float32),
      jax.ShapeDtypeStruct((PROBE, 8), jnp.float32))
  dot, exp = _eqn(grad.jaxpr, "dot_general"), _eqn(grad.jaxpr, "exp")
  assert not xla_rules.fused_away(dot, dot.outvars[0], [exp], [exp], False)


def _buffers(fn, *args, **simulation) -> dict[str, int]:
  """Bytes of each value's own buffer at its making equation (0: none);
  `simulation`: liveness._Simulation's settings."""
  return _buffers_of(jax.make_jaxpr(fn)(*args).jaxpr, **simulation)


def _buffers_of(j, **simulation) -> dict[str, int]:
  plan = liveness._Simulation(**simulation).plan(j, False, ())
  return {f"{i}:{e.primitive.name}": sum(plan.size[v])
          for i, e in enumerate(plan.jaxpr.eqns) for v in e.outvars}


def test_a_matmul_fusion_ends_at_a_value_with_two_readers():
  """The flash backward's p = exp(scores - lse), read by two fusions: the
  matmul is computed once, p is its fusion's one buffer."""
  def fn(q, k, lse, dp):
    p = jnp.exp(q @ k - lse)
    return p.astype(jnp.bfloat16), p * dp
  x = jax.ShapeDtypeStruct((PROBE, 16), jnp.float32)
  sizes = _buffers(fn, x, jnp.ones((16, 32)),
                   jax.ShapeDtypeStruct((PROBE, 1), jnp.float32),
                   jax.ShapeDtypeStruct((PROBE, 32), jnp.float32))
  made = {k.split(":")[1]: v for k, v in sizes.items()
          if k.split(":")[1] in ("dot_general", "sub", "exp")}
  assert made == {"dot_general": 0, "sub": 0, "exp": PROBE * 32 * 4}


def test_a_matmul_fusion_writes_a_reduction_of_its_chain_beside_it():
  """The matmul-reductions rule (v6e): T5's attention backward ds = p *
  (dp - delta), summed over the batch for its bias gradient and cast to
  bf16 for the dq and dk matmuls, is no f32 buffer (the fusion writes the
  sum and the bf16 ds); where the rule does not apply (v5p, v5e) it is
  one. Scaled scores the exponent reads after their row maximum are one
  either way."""
  assert [xla_rules.writes_matmul_reductions(c)
          for c in ("v5e", "v5p", "v6e")] == [False, False, True]
  f32 = lambda *shape: jax.ShapeDtypeStruct(shape, jnp.float32)

  def ds_of(q, k, p, delta, w):
    ds = p * (q @ k - delta)
    d = ds.astype(jnp.bfloat16)
    return d @ w, d.T @ q.astype(jnp.bfloat16), ds.sum(0)
  args = (f32(PROBE, 16), jnp.ones((16, 32)), f32(PROBE, 32), f32(PROBE, 1),
          jnp.ones((32, 8), jnp.bfloat16))
  sizes = _buffers(ds_of, *args, matmul_reductions=True)
  made = lambda name: [v for k, v in sizes.items() if k.endswith(f":{name}")]
  assert made("mul") == [0]
  assert made("convert_element_type")[0] == PROBE * 32 * 2
  sizes = _buffers(ds_of, *args)
  assert made("mul") == [PROBE * 32 * 4]

  def softmax(q, k, w):
    s = (q @ k) * 0.5
    p = jnp.exp(s - s.max(-1, keepdims=True)).astype(jnp.bfloat16)
    return p @ w, p.T @ q.astype(jnp.bfloat16)
  sizes = _buffers(softmax, f32(PROBE, 16), jnp.ones((16, 32)),
                   jnp.ones((32, 8), jnp.bfloat16), matmul_reductions=True)
  assert made("mul") == [PROBE * 32 * 4]


def test_a_widening_cast_ends_a_matmul_fusion():
  """q = x @ w in bf16, cast to f32 for the rope's split halves: the bf16
  matmul result is the buffer, the cast fuses into the split."""
  def fn(x, w):
    q = (x @ w).astype(jnp.float32)
    a, b = jnp.split(q, 2, axis=-1)
    return a * 2.0, b * 3.0
  sizes = _buffers(fn, jax.ShapeDtypeStruct((PROBE, 16), jnp.bfloat16),
                   jnp.ones((16, 32), jnp.bfloat16))
  dot = next(v for k, v in sizes.items() if k.endswith("dot_general"))
  cast = next(v for k, v in sizes.items() if k.endswith("convert_element_type"))
  assert (dot, cast) == (PROBE * 32 * 2, 0)


def test_an_elementwise_producer_fuses_into_its_matmuls_unless_it_narrows():
  """d(gate) = dh * silu(wi), read by two matmuls, is no buffer (dh, wi
  are); a cast of an f32 norm to bf16 read by matmuls is one."""
  def swiglu_grad(dh, wi, w):
    d = dh * jax.nn.silu(wi)
    return d @ w, d.T @ dh
  bf = jax.ShapeDtypeStruct((PROBE, 32), jnp.bfloat16)
  sizes = _buffers(swiglu_grad, bf, bf, jnp.ones((32, 8), jnp.bfloat16))
  assert sizes[next(k for k in sizes if k.endswith(":mul"))] == 0

  def norm_matmuls(x, w1, w2):
    h = (x * 2.0).astype(jnp.bfloat16)
    return h @ w1, h @ w2
  sizes = _buffers(norm_matmuls, jax.ShapeDtypeStruct((PROBE, 32), jnp.float32),
                   jnp.ones((32, 8), jnp.bfloat16), jnp.ones((32, 8), jnp.bfloat16))
  cast = next(k for k in sizes if k.endswith("convert_element_type"))
  assert sizes[cast] == PROBE * 32 * 2


def test_a_batched_weight_matmul_takes_no_elementwise_chain_in():
  """The experts' SwiGLU gradient d = dh * silu(g), read by a matmul batched
  over experts with their weights (egcd,edf->egcf) and by its weight
  gradient, is a buffer (held-out #188, fusion.696's outputs); read by the
  same matmuls unbatched it is not (the into-matmuls rule); a batched
  matmul of two activations (attention's) does not change that."""
  def experts(dh, g, w):
    d = dh * jax.nn.silu(g)
    return jnp.einsum("ecf,edf->ecd", d, w), jnp.einsum("ecf,ecd->edf", d, dh)

  def attention(dh, g, k):
    d = dh * jax.nn.silu(g)
    return jnp.einsum("ecf,edf->ecd", d, k)

  act = jax.ShapeDtypeStruct((4, PROBE, 32), jnp.bfloat16)
  mul = lambda sizes: sizes[next(k for k in sizes if k.endswith(":mul"))]
  assert mul(_buffers(experts, act, act,
                      jnp.ones((4, 32, 32), jnp.bfloat16))) == 4 * PROBE * 64
  two_d = jax.ShapeDtypeStruct((PROBE, 32), jnp.bfloat16)
  assert mul(_buffers(lambda dh, g, w: (dh * jax.nn.silu(g)) @ w, two_d,
                      two_d, jnp.ones((32, 32), jnp.bfloat16))) == 0
  keys = jax.ShapeDtypeStruct((4, PROBE, 32), jnp.bfloat16)
  assert mul(_buffers(attention, act, act, keys)) == 0


def test_a_norm_fuses_into_its_matmuls_through_views_a_wide_division_not():
  """An RMS norm of a bf16 input, cast back to bf16 and read by matmuls (one
  through a view) is no buffer: its chain reads nothing wider as large as
  it, only x and the per-row statistics. The flash forward's f32 acc / l
  cast to bf16 and read by a matmul through a view is a buffer (the f32
  acc would be read at twice its bytes)."""
  def norm(x, w):
    xf = x.astype(jnp.float32)
    h = (xf * jax.lax.rsqrt(jnp.mean(xf * xf, -1, keepdims=True)))
    h = h.astype(jnp.bfloat16)
    return h @ w, h.reshape(PROBE, 1, 32) @ w

  def flash_out(acc, l, w):
    return (acc / l).astype(jnp.bfloat16).reshape(PROBE, 1, 32) @ w

  w = jnp.ones((32, 8), jnp.bfloat16)
  for fn, args, made in [
      (norm, (jax.ShapeDtypeStruct((PROBE, 32), jnp.bfloat16), w), 0),
      (flash_out, (jax.ShapeDtypeStruct((PROBE, 32), jnp.float32),
                   jax.ShapeDtypeStruct((PROBE, 1), jnp.float32), w),
       PROBE * 32 * 2)]:
    j = jax.make_jaxpr(fn)(*args).jaxpr
    sizes = _buffers(fn, *args)
    cast = next(f"{i}:{e.primitive.name}" for i, e in enumerate(j.eqns)
                if e.primitive.name == "convert_element_type"
                and e.outvars[0].aval.dtype == jnp.bfloat16)
    assert sizes[cast] == made


def test_weight_gradients_are_made_last_in_a_body():
  """Inside a body, a weight-gradient matmul moves after the work that
  does not need it (here a second matmul chain), with its chain."""
  def body(x, dy, w):
    dw = (x.T @ dy).astype(jnp.float32)  # weight gradient
    dx = jnp.tanh(dy @ w.T) @ w  # the input gradient's work
    return dw, dx
  bf = jax.ShapeDtypeStruct((PROBE, 32), jnp.bfloat16)
  j = jax.make_jaxpr(body)(bf, bf, jnp.ones((32, 32), jnp.bfloat16)).jaxpr
  moved = xla_rules.defer_weight_grads(j)

  def weight_grad_after_input_grad(jaxpr) -> bool:
    dots = [e for e in jaxpr.eqns if e.primitive.name == "dot_general"]
    grad = next(e for e in dots if PROBE not in e.outvars[0].aval.shape)
    return jaxpr.eqns.index(grad) > max(jaxpr.eqns.index(e) for e in dots
                                        if e is not grad)
  assert not weight_grad_after_input_grad(j)
  assert weight_grad_after_input_grad(moved)
  assert sorted(map(id, moved.eqns)) == sorted(map(id, j.eqns))
  assert moved.eqns[-1].primitive.name == "convert_element_type"


def _chunked_grad(x_CxBxD, w_DxV):
  """A chunked loss's backward: each chunk's weight gradient, made in f32
  inside a checkpoint, cast to bf16 and added into the loop's carry."""
  def body(acc_DxV, x_BxD):
    g_DxV = jax.checkpoint(lambda x: (x.T @ jnp.tanh(x @ w_DxV)).astype(
        jnp.bfloat16))(x_BxD)
    return acc_DxV + g_DxV, None
  acc, _ = jax.lax.scan(body, jnp.zeros(w_DxV.shape, jnp.bfloat16), x_CxBxD)
  return acc


def test_a_narrowed_weight_gradient_is_added_into_the_carry_in_place():
  """The narrowed-weight-gradients rule: the f32 product, its bf16 cast
  and the checkpoint's output are one fusion writing into the carry, so a
  chunk holds no [D, V] buffer of its own (the f32 product and a bf16 copy
  without the rule)."""
  x = jax.ShapeDtypeStruct((4, PROBE, 64), jnp.float32)
  w = jax.ShapeDtypeStruct((64, 512), jnp.float32)
  j = jax.make_jaxpr(_chunked_grad)(x, w).jaxpr
  peak, _ = liveness.simulate(j, 0).peak_at(1, 1)
  logits = PROBE * 512 * 4  # tanh(x @ w), the chunk's f32 activation
  assert peak < logits + 64 * 512 * (2 + 2 + 4)  # init, carry, no product
  body = _eqn(j, "scan").params["jaxpr"].jaxpr
  call, = (e for e in body.eqns if e.primitive.name != "add")
  readers = lambda v: [e for e in body.eqns if v in e.invars]
  assert call.outvars[0] in xla_rules.matmul_fusion_chain(
      body.eqns, readers, set(body.outvars))


def test_a_narrowed_weight_gradient_read_by_a_collective_is_not():
  """Cast to bf16 for a reduce-scatter (a reshard), the cast is a fusion of
  its own and the f32 product a buffer (t5-v1_1-small v5p-16 8x1)."""
  mesh = AbstractMesh((2,), ("X",), axis_types=(AxisType.Explicit,))
  def fn(x, d):
    g = (x.T @ d).astype(jnp.bfloat16)
    return jax.sharding.reshard(g, P("X", None))
  with jax.sharding.use_abstract_mesh(mesh):
    j = jax.make_jaxpr(fn)(jax.ShapeDtypeStruct((PROBE, 16), jnp.float32),
                           jax.ShapeDtypeStruct((PROBE, 8), jnp.float32))
  sizes = _buffers_of(j.jaxpr)
  assert next(v for k, v in sizes.items() if k.endswith("dot_general")) == (
      16 * 8 * 4)


def test_a_narrowed_weight_gradient_with_partial_sums_fuses_only_in_a_loop():
  """Contracting the batch sharded over X, the weight gradient holds partial
  sums. Outside a loop an all-reduce adds them up from the f32 product, so
  the cast does not fuse into the matmul (fusion.313 f32[25129,768] read by
  all-reduce.45 in gpt2 v5p-16 4x2 bf16_master, #31); inside a loop what is
  only accumulated is reduced after it (XLA's WhileLoopAllReduceCodeMotion)
  and the cast fuses (the chunked loss's, #82)."""
  mesh = AbstractMesh((2,), ("X",), axis_types=(AxisType.Explicit,))
  batch = NamedSharding(mesh, P("X", None))
  def fn(x, d, acc):
    g = jnp.einsum("bi,bj->ij", x, d, out_sharding=P(None, None))
    return acc + g.astype(jnp.bfloat16)
  with jax.sharding.use_abstract_mesh(mesh):
    j = jax.make_jaxpr(fn)(
        jax.ShapeDtypeStruct((2 * PROBE, 16), jnp.float32, sharding=batch),
        jax.ShapeDtypeStruct((2 * PROBE, 8), jnp.float32, sharding=batch),
        jax.ShapeDtypeStruct((16, 8), jnp.bfloat16)).jaxpr
  dot = _eqn(j, "dot_general")
  assert xla_rules.partial_sums(dot)
  readers = lambda v: [e for e in j.eqns if v in e.invars]
  assert dot.outvars[0] not in xla_rules.matmul_fusion_chain(
      j.eqns, readers, set(j.outvars))
  assert dot.outvars[0] in xla_rules.matmul_fusion_chain(
      j.eqns, readers, set(j.outvars), in_loop=True)


def test_an_input_gradient_with_partial_sums_is_an_f32_buffer_outside_loops():
  """Contracting the vocabulary sharded over Y (the loss's input gradient
  under TP), the activation matmul holds partial sums: outside a loop a
  collective adds them up in f32 first, so the f32 result is a buffer and
  its cast does not fuse (f32[32,2048,4096] at the peak of llama3_8b
  v5p-64 8x4, #122); without partial sums, or in a loop, the cast fuses."""
  mesh = AbstractMesh((2,), ("Y",), axis_types=(AxisType.Explicit,))
  def fn(d, w):
    return jnp.einsum("bv,dv->bd", d, w,
                      out_sharding=P(None, None)).astype(jnp.bfloat16)
  def jaxpr(spec):
    with jax.sharding.use_abstract_mesh(mesh):
      return jax.make_jaxpr(fn)(
          jax.ShapeDtypeStruct((PROBE, 16), jnp.float32,
                               sharding=NamedSharding(mesh, spec)),
          jax.ShapeDtypeStruct((8, 16), jnp.float32,
                               sharding=NamedSharding(mesh, spec))).jaxpr
  for spec, split in ((P(None, "Y"), True), (P(None, None), False)):
    j = jaxpr(spec)
    dot = _eqn(j, "dot_general")
    assert xla_rules.partial_sums(dot) == split
    readers = lambda v: [e for e in j.eqns if v in e.invars]
    chained = xla_rules.matmul_fusion_chain(j.eqns, readers, set(j.outvars))
    assert (dot.outvars[0] in chained) != split
    assert dot.outvars[0] in xla_rules.matmul_fusion_chain(
        j.eqns, readers, set(j.outvars), in_loop=True)


def test_iotas_and_fills_a_loop_reads_are_sunk_into_it():
  """The sunk-loop-constants rule: an iota and a zero fill made outside a
  loop and read by it as constants are made inside it (XLA's
  WhileLoopFusibleSinking); a constant made from an argument is not."""
  def fn(x_CxBxV, labels_CxB, arg_BxV):
    iota = jax.lax.broadcasted_iota(jnp.int32, x_CxBxV.shape[1:], 1)
    zeros = jnp.zeros(x_CxBxV.shape[1:])
    other = arg_BxV * 2.0
    def body(c, xs):
      x, lab = xs
      hit = iota == lab[:, None]
      return c + jnp.sum(jnp.where(hit, x, zeros) + other), None
    return jax.lax.scan(body, 0.0, (x_CxBxV, labels_CxB))[0]
  j = jax.make_jaxpr(fn)(jax.ShapeDtypeStruct((4, 8, 1024), jnp.float32),
                         jax.ShapeDtypeStruct((4, 8), jnp.int32),
                         jax.ShapeDtypeStruct((8, 1024), jnp.float32)).jaxpr
  sizes = _buffers_of(j)
  assert [k.split(":")[1] for k, v in sizes.items() if v] == ["mul", "scan"]


def test_a_loop_only_the_loss_needs_runs_last():
  """The deferred order moves a loop whose value only the step's loss
  reads (a chunked loss's forward loop) after the backward, holding its
  operands through it; an elementwise op only the loss reads stays."""
  def step(w, x):
    fwd = jax.lax.scan(lambda c, xi: (c + jnp.sum(xi @ w), None), 0.0, x)[0]
    back = jax.lax.scan(lambda c, xi: (c + xi.T @ xi, None),
                        jnp.zeros((16, 16)), x)[0]
    return w - back @ w, fwd * 2.0
  j = jax.make_jaxpr(step)(jax.ShapeDtypeStruct((16, 16), jnp.float32),
                           jax.ShapeDtypeStruct((4, 8, 16), jnp.float32)).jaxpr
  names = lambda jaxpr: [e.primitive.name for e in jaxpr.eqns]
  moved = xla_rules.defer_weight_grads(j, results=(j.outvars[1],))
  assert names(j)[0] == "scan" and names(moved)[-2:] == ["scan", "mul"]
  assert xla_rules.defer_weight_grads(j) is j


def test_views_alias_their_operand():
  j = jax.make_jaxpr(lambda x: (x.reshape(4, 2).T, x.astype(jnp.float32),
                                x.astype(jnp.bfloat16)))(jnp.ones(8))
  kinds = {e.primitive.name + str(e.outvars[0].aval.dtype): xla_rules.is_view(e)
           for e in j.jaxpr.eqns}
  assert kinds == {"reshapefloat32": True, "transposefloat32": True,
                   "convert_element_typebfloat16": False}


def _two_loops(w_stack, cast, sliced=True):
  """A forward and a backward loop over a stacked weight, as jax.grad of a
  rematerialized scan makes them (the model's layer stack); each slice cast
  to bf16 in the body when `cast`; `sliced`: the step also lays the stack
  out over X (ZeRO-1/2's update of its X-slice), on a mesh X = 2."""
  @jax.checkpoint
  def body(h, w):
    w = w.astype(jnp.bfloat16) if cast else w
    return (jnp.tanh(h @ w) @ w.T).astype(h.dtype), None

  def loss(ws, x):
    return jnp.sum(jax.lax.scan(body, x, ws)[0].astype(jnp.float32))

  def step(ws, x):
    grads = jax.grad(loss)(ws, x)
    if not sliced:
      return grads
    return grads, jax.sharding.reshard(ws, P(None, "X"))

  x = jax.ShapeDtypeStruct((PROBE, w_stack.shape[1]), jnp.bfloat16)
  mesh = AbstractMesh((2,), ("X",), axis_types=(AxisType.Explicit,))
  with jax.sharding.use_abstract_mesh(mesh):
    return jax.make_jaxpr(step)(w_stack, x)


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


@pytest.mark.parametrize("shape,sliced,copied", [
    ((6, 128, 256), True, True), ((6, 128, 200), True, True),
    ((6, 128, 256), False, False)])
def test_a_backward_loop_copies_a_weight_argument_to_the_transposed_layout(
    shape, sliced, copied):
  """Only for the backward loop, only for an argument read directly whose
  layout the step fixes (laid out anew over X for its update), also when
  the argument is stored transposed (last dim padded: held-out #196's wi
  and wi_gate, [32,4096,2752]{1,2,0}, copy.520/521); made where the
  argument is first read, the forward loop here (held-out #178: copy.575-577
  at the head of ENTRY, read by both loops), held to its last reader, the
  reshard for the update (#178's update reads the copy)."""
  ws = jax.ShapeDtypeStruct(shape, jnp.bfloat16)
  j = _two_loops(ws, cast=False, sliced=sliced).jaxpr
  stacks, _ = xla_rules.hoisted_stacks(j, False)
  matmul = [v for k, v in stacks.items() if k[2] == "matmul"]
  assert bool(matmul) == copied
  if copied:
    loops = [i for i, e in enumerate(j.eqns) if e.primitive.name == "scan"]
    backward = [i for i in loops
                if "transpose(" in str(j.eqns[i].source_info.name_stack)]
    readers = [i for i, e in enumerate(j.eqns)
               if any(v is j.invars[0] for v in e.invars)]
    assert readers[0] == loops[0] < backward[0] < readers[-1]
    assert j.eqns[readers[-1]].primitive.name == "reshard"
    assert [(f, l) for f, l, _ in matmul] == [(readers[0], readers[-1])]


@pytest.mark.parametrize("shape", [(6, 128, 256), (6, 128, 200)])
@pytest.mark.parametrize("sliced", [True, False])
def test_a_backward_loop_copies_a_cast_weight_argument_in_its_own_layout(
    shape, sliced, monkeypatch):
  """A stored-f32 stack each slice of which is cast before its matmuls,
  and which the update reads resharded to a slice (ZeRO-1/2), gets for the
  backward loop alone a copy in its own dtype and layout (stored transposed
  or not), beside the bf16 cast made once for both loops, held to the
  argument's last reader (#29's update reads its copy); a stack the update
  writes in place (no slice read) gets none."""
  ws = jax.ShapeDtypeStruct(shape, jnp.float32)
  j = _two_loops(ws, cast=True).jaxpr
  monkeypatch.setattr(xla_rules, "sliced_for_update",
                      lambda jaxpr: set(jaxpr.invars[:1]) if sliced else set())
  stacks, _ = xla_rules.hoisted_stacks(j, False)
  copies = [v for k, v in stacks.items() if k[2] == "copy"]
  backward = [i for i, e in enumerate(j.eqns) if e.primitive.name == "scan"
              and "transpose(" in str(e.source_info.name_stack)]
  last = max(i for i, e in enumerate(j.eqns)
             if any(v is j.invars[0] for v in e.invars))
  assert [(f, l, b) for f, l, b in copies] == ([
      (backward[0], last, (math.prod(shape) * 4, 0))] if sliced else [])
  assert not [k for k in stacks if k[2] == "matmul"]


def test_no_weight_copies_where_the_update_does_not_lay_the_stack_out():
  """dp: the update is not sliced over X, XLA lays the argument out as the
  backward loop reads it; only the bf16 cast is hoisted."""
  ws = jax.ShapeDtypeStruct((6, 128, 256), jnp.float32)
  stacks, _ = xla_rules.hoisted_stacks(
      _two_loops(ws, cast=True, sliced=False).jaxpr, False)
  assert {k[2] for k in stacks} == {"cast"}


@pytest.mark.parametrize("model,settings,copied", [
    ("tiny", dict(shard="zero2"), "copy"),
    ("tiny", dict(shard="zero1"), "copy"),
    ("tiny", dict(shard="dp"), None),
    ("tiny_moe", dict(expert_axis="x"), None),
    ("tiny", dict(shard="zero1", precision="bf16"), "matmul"),
    ("tiny", dict(shard="dp", precision="bf16"), None)])
def test_only_a_weight_stack_updated_on_a_slice_is_copied(model, settings,
                                                          copied):
  """The copied-cast-weights and transposed-weights rules on the traced
  step (4x1): the ZeRO-1/2 update reads a slice of each stack (XLA copied
  them: copy.479-486 of llama2_7b 4x4 zero2 mixed, copy.518-525 of 8x2
  zero1 bf16); a dp update (gpt2 4x1 dp mixed, llama2_7b 2x4 dp bf16: no
  copy) and an X-sharded stack the backward reads without a gather
  (experts over X: none in mixtral_mini 4x1 expert_axis=x) are updated in
  place."""
  plan = plan_mesh(parse_topology("v5p-8"), 4, 1)
  j = trace_probe(load_model(model),
                  TrainSettings(batch=8, seq=128, **settings),
                  abstract_mesh(plan)).jaxpr.jaxpr
  stacks, _ = xla_rules.hoisted_stacks(j, False)
  assert {k[2] for k in stacks} - {"cast"} == ({copied} if copied else set())


def _gathered_loops(shape, subscripts, dtype=jnp.bfloat16):
  """jax.grad of a rematerialized scan over a stacked weight stored over X
  on its second dim (FSDP, X = 2), each layer's slice gathered whole before
  its matmul with the layer input, `subscripts` (its einsum), and cast to
  bf16 after the gather when stored in another dtype."""
  mesh = AbstractMesh((2,), ("X",), axis_types=(AxisType.Explicit,))
  lhs = subscripts.split(",")[0]  # the layer input, as the matmul reads it

  @jax.checkpoint
  def body(h, w):
    w = jax.sharding.reshard(w, P()).astype(jnp.bfloat16)
    out = jnp.einsum(subscripts, h.reshape(PROBE, *w.shape[:len(lhs) - 1]),
                     w)
    return jnp.tanh(out.reshape(h.shape)), None

  def loss(ws, x):
    return jnp.sum(jax.lax.scan(body, x, ws)[0].astype(jnp.float32))

  spec = P(None, "X")
  ws = jax.ShapeDtypeStruct(shape, dtype, sharding=NamedSharding(mesh, spec))
  x = jax.ShapeDtypeStruct((PROBE, 128), jnp.bfloat16)
  with jax.sharding.use_abstract_mesh(mesh):
    return jax.make_jaxpr(jax.grad(loss))(ws, x).jaxpr


@pytest.mark.parametrize("shape,subscripts,dtype,copied", [
    ((6, 128, 2, 64), "bd,dnh->bnh", jnp.bfloat16, True),  # q, k, v
    ((6, 2, 64, 128), "bnh,nhd->bd", jnp.bfloat16, False),  # o
    ((6, 128, 128), "bd,df->bf", jnp.bfloat16, False),  # an MLP's
    ((6, 128, 2, 64), "bd,dnh->bnh", jnp.float32, False)])  # cast (mixed)
def test_a_gathered_head_split_weight_is_copied_for_both_loops(
    shape, subscripts, dtype, copied):
  """A weight stack gathered slice by slice and read, uncast, by a matmul
  whose result keeps its heads and head dims behind the contracted d_model
  is copied whole (per-device bytes) from the forward loop to the backward
  loop; one read with heads major (o: also in its backward), one output
  dim (an MLP's), or a cast after the gather (the hoisted cast's) is not."""
  j = _gathered_loops(shape, subscripts, dtype)
  stacks, _ = xla_rules.hoisted_stacks(j, False)
  got = [(f, l, b) for k, (f, l, b) in stacks.items() if k[2] == "gathered"]
  loops = [i for i, e in enumerate(j.eqns) if e.primitive.name == "scan"]
  assert got == ([(loops[0], loops[-1], (math.prod(shape) // 2 * 2, 0))]
                 if copied else [])
  assert len(loops) == 2


@pytest.mark.parametrize("settings,copied", [
    (dict(precision="bf16"), True),
    (dict(precision="bf16", lora_rank=4), True),
    (dict(precision="bf16_master"), True),
    (dict(), False),
    (dict(shard="zero1", precision="bf16"), False),
    (dict(precision="bf16", lora_rank=4, base_quant="int8"), False)])
def test_gathered_q_k_v_stacks_are_copied_on_the_traced_step(settings,
                                                            copied):
  """The head-split-gathered-weights rule on the traced step (4x1): under
  FSDP with the layer stacks stored in bf16, trained in full or frozen
  under LoRA adapters, q, k and v (copy.141-143 of llama2_7b 4x1 zero3
  bf16 lora_rank=16; copy.163-165 without LoRA) and no other stack; none
  stored f32 (the hoisted cast), replicated over X (zero1: no gather) or
  dequantized per layer (int8)."""
  cfg = load_model("tiny")
  plan = plan_mesh(parse_topology("v5p-8"), 4, 1)
  j = trace_probe(cfg, TrainSettings(batch=8, seq=128, **settings),
                  abstract_mesh(plan)).jaxpr.jaxpr
  stacks, _ = xla_rules.hoisted_stacks(j, False)
  gathered = sorted(k[0].aval.shape for k in stacks if k[2] == "gathered")
  q_k_v = sorted((cfg.n_layers, cfg.d_model, heads, cfg.head_dim)
                 for heads in (cfg.n_heads, cfg.n_kv_heads, cfg.n_kv_heads))
  assert gathered == (q_k_v if copied else [])


@pytest.mark.parametrize("x,y", [(4, 1), (2, 2)])
def test_the_output_projection_gradient_is_deferred(x, y):
  """The loss's weight-gradient matmul moves after the layers' and the
  embedding's backward on any mesh (the upper bound of what XLA's scheduler
  does), so the f32 logits gradient is live through the layers' backward."""
  plan = plan_mesh(parse_topology("v5p-8"), x, y)
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

  before, moved = order(j), order(xla_rules.defer_weight_grads(j))
  assert before[0] < before[1] and moved[0] > moved[1]
  assert len(xla_rules.defer_weight_grads(j).eqns) == len(j.eqns)
  points = liveness.simulate(j, 0)
  inside = [i for i, w in enumerate(points.where)
            if w.startswith("backward Decoder/layers")]
  live = points.live(max(inside, key=lambda i: points.fixed[i]
                         + points.linear[i]))
  assert any(scopes.LOSS in b.scopes and b.dtype == "float32"
             and len(b.shape) == 3 for b in live)


@pytest.mark.parametrize("chunks", [1, 4])
def test_only_an_unchunked_loss_has_recomputable_logits(chunks):
  """One matmul makes the output projection's weight gradient over the
  whole batch (recomputable logits) unless the loss is chunked, where it
  is a loop's carried gradient."""
  plan = plan_mesh(parse_topology("v5p-8"), 4, 1)
  j = trace_probe(load_model("tiny"), TrainSettings(
      batch=8, seq=128, loss_chunks=chunks), abstract_mesh(plan)).jaxpr
  assert xla_rules.logits_recomputable(j) == (chunks == 1)


@pytest.mark.parametrize("remat,recomputable", [
    ("offload:qkv", False), ("offload:decoder_layer_input", False),
    ("names:qkv", True)])
def test_offloaded_residuals_keep_the_logits(remat, recomputable):
  """Where a layer loop's residuals go to host memory XLA kept the f32
  logits to a peak 25% over its limit and recomputed none (#287): the
  rematerialized-logits rule does not apply there."""
  plan = plan_mesh(parse_topology("v5p-8"), 4, 1)
  j = trace_probe(load_model("tiny"), TrainSettings(
      batch=8, seq=128, remat=remat), abstract_mesh(plan)).jaxpr
  assert xla_rules.logits_recomputable(j) == recomputable


def test_a_scanned_stack_returned_into_a_donated_buffer_is_its_own():
  """The stacked-outputs-not-donated rule: a loop's stacked output keeps a
  buffer of its own though the step returns it into a donated argument (a
  KV cache scanned over layers); a plain donated output is written in
  place."""
  def step(cache_LxN, x_N):
    def body(carry, row_N):
      return carry + 1.0, row_N + carry
    _, new_LxN = jax.lax.scan(body, x_N, cache_LxN)
    return new_LxN, x_N * 2.0

  stack = jax.ShapeDtypeStruct((8, 1024), jnp.float32)
  row = jax.ShapeDtypeStruct((1024,), jnp.float32)
  j = jax.make_jaxpr(step)(stack, row).jaxpr
  kept = xla_rules.donated_in_place(j, j.outvars)
  assert kept == [j.outvars[1]]
  peak, _ = liveness.simulate(j, 2).peak_at(1, 1)
  assert peak >= 8 * 1024 * 4  # the new stack, beside the donated one


def test_dead_equations_are_no_buffers():
  """The dead-code rule: an equation nothing live reads (as Flax's lifted
  scan leaves the flash masks behind when serving) makes no buffer and no
  transient work, as jit's dead-code pass removes it."""
  def f(x_N):
    unused_NxN = jax.jit(lambda: jnp.arange(1024)[:, None]
                         >= jnp.arange(1024)[None, :])()
    del unused_NxN
    return x_N * 2.0

  j = jax.make_jaxpr(f)(jax.ShapeDtypeStruct((1024,), jnp.float32)).jaxpr
  dead = xla_rules.dead_equations(j)
  assert [e.primitive.name for e in j.eqns if id(e) in dead] == ["jit"]
  peak, _ = liveness.simulate(j, 0).peak_at(1, 1)
  assert peak == 1024 * 4  # the output alone, not the 1 MiB mask


def _offload_jaxpr(*offload):
  plan = plan_mesh(parse_topology("v5p-8"), 2, 2)
  traced = trace_probe(load_model("tiny"), TrainSettings(
      batch=8, seq=64, offload=offload), abstract_mesh(plan))
  return xla_rules.defer_weight_grads(traced.jaxpr.jaxpr)


def test_the_update_streams_only_with_state_in_host_memory():
  jaxpr = _offload_jaxpr()
  assert xla_rules.stream_offloaded_update(jaxpr) == (jaxpr, {})


def test_a_streamed_update_runs_leaf_by_leaf_one_fetch_ahead():
  """--offload=optimizer,params: each leaf's update reads its fetched
  parameter, gradient and moments (held until its last value is made), the
  next leaf's are fetched before it runs, and the previous leaf's copies
  back to host come after it (llama2_7b #69's schedule: copy-starts of the
  next MLP leaf before fusion.371)."""
  jaxpr = _offload_jaxpr("optimizer", "params")
  streamed, held = xla_rules.stream_offloaded_update(jaxpr)
  eqns = streamed.eqns
  assert sorted(map(id, eqns)) == sorted(map(id, jaxpr.eqns))
  fetched = {v for e in eqns if xla_rules.fetches_host_value(e)
             for v in e.outvars}
  fusions = sorted(held)
  big = [i for i in fusions if len(held[i]) == 4]
  assert len(big) >= 2 and all(set(held[i]) <= fetched for i in big)
  first, second = big[0], big[1]
  # the second leaf's state is fetched before the first leaf's update ends
  position = {v: n for n, e in enumerate(eqns) for v in e.outvars}
  assert max(position[v] for v in held[second]) < first
  # the first leaf's copies back to host come after the second's update
  writes = [n for n, e in enumerate(eqns) if e.primitive.name == "device_put"
            and any(u in {w for i in range(first - 3, first + 1)
                          for w in eqns[i].outvars} for u in e.invars)]
  assert writes and min(writes) > second


def test_fetched_optimizer_state_moves_before_the_backward_loop():
  """The prefetched-host-state rule: with the moments alone in host memory
  each fetch moves to just before the last loop ahead of it (the layers'
  backward), as XLA issues the copy-starts of llama3_8b v6e-32 16x2
  --offload=optimizer (#221) before that loop; nothing moves without
  offloaded state."""
  plain = _offload_jaxpr()
  assert xla_rules.prefetch_host_state(plain) is plain
  jaxpr = _offload_jaxpr("optimizer")
  moved = xla_rules.prefetch_host_state(jaxpr)
  assert sorted(map(id, moved.eqns)) == sorted(map(id, jaxpr.eqns))
  loops = [i for i, e in enumerate(moved.eqns) if xla_rules.runs_whole(e)]
  fetches = [i for i, e in enumerate(moved.eqns)
             if xla_rules.fetches_host_value(e)]
  assert fetches and loops
  backward = loops[-1]
  assert fetches == list(range(backward - len(fetches), backward))
  assert all(i > loops[-1] for i, e in enumerate(jaxpr.eqns)
             if xla_rules.fetches_host_value(e))  # program order: after


def test_fetched_optimizer_state_is_live_through_the_backward():
  """On a TPU the layers' backward holds every fetched moment: its live set
  is the one without offload, less the moments' device arguments, plus
  their fetched copies (XLA's peak in #221 holds all 24 copy-starts,
  1.87 GiB, inside the backward loop)."""
  plan = plan_mesh(parse_topology("v5p-8"), 2, 2)
  ests = [memory.memory_report(load_model("tiny"), TrainSettings(
      batch=8, seq=64, offload=offload), plan)
          for offload in ((), ("optimizer",))]
  on_device, offloaded = ests
  assert offloaded.host_bytes > 0
  backward = "backward Decoder/layers"
  assert offloaded.phase_bytes[backward] == (
      on_device.phase_bytes[backward] - on_device.arguments_bytes
      + offloaded.arguments_bytes + offloaded.host_bytes)


def test_a_streamed_update_holds_four_leaves_of_state():
  """llama2_7b v5p-16 4x2 --offload=optimizer,params: the update's peak is
  an MLP leaf's 4 fetched inputs and 3 outputs, the next leaf's 4 fetched
  and the previous leaf's 3 outputs: 14 f32[32,1024,5504] (XLA's: 12, #69),
  not every moment's device copy at once."""
  est = memory.memory_report(load_model("llama2_7b"), TrainSettings(
      batch=16, seq=2048, offload=("optimizer", "params")),
      plan_mesh(parse_topology("v5p-16"), 4, 2))
  leaf = 32 * 1024 * 5504 * 4
  update = est.phase_bytes["update"] - est.arguments_bytes
  assert 14 * leaf <= update < 14 * leaf * 1.01
  assert est.compiled_comparable_peak == est.phase_bytes["update"]


def test_the_rule_list_is_the_docstring_s():
  """Each rule of the module docstring once, named by its first columns
  (names over two lines joined), its text ending its sentence; the
  copied-cast-weights rule names both its evidence and its exceptions."""
  found = dict(xla_rules.rules())
  assert len(found) == len(xla_rules.rules())
  for name in ("fusion", "hoisted casts", "copied cast weights",
               "deferred weight gradients", "rematerialized logits",
               "stacked outputs not donated"):
    assert name in found
  assert all(text.endswith((";", ".")) for text in found.values())
  assert "copy.484-486" in found["copied cast weights"]
  assert "expert_axis=x" in found["copied cast weights"]



def test_the_dequantized_8bit_moments_are_made_first():
  """The early-dequantized-state rule: with 8-bit AdamW the moments'
  dequantization (argument-only, f32 out of int8 in) is moved to the step's
  start with what is made from it alone; with AdamW nothing moves."""
  plan = plan_mesh(parse_topology("v5p-8"), 4, 1)
  def jaxpr(optimizer):
    return trace_probe(load_model("gpt2"),
                       TrainSettings(batch=8, seq=128, optimizer=optimizer),
                       abstract_mesh(plan)).jaxpr.jaxpr
  plain = jaxpr("adamw")
  assert xla_rules.hoist_dequantized_state(plain) is plain
  j = jaxpr("adamw_8bit")
  moved = xla_rules.hoist_dequantized_state(j)
  first = [e for e in moved.eqns[:8] if e.primitive.name == "shard_map"]
  assert first and not any(made_by_backward(e) for e in moved.eqns[:8])
  assert all(v.aval.dtype == jnp.float32 for e in first for v in e.outvars)
  assert sorted(map(id, moved.eqns)) == sorted(map(id, j.eqns))


def test_every_v5e_schedule_makes_the_dequantized_moments_first():
  """The early-dequantized-state rule holds in the deferred schedule too,
  not only in the traced one (the deferred rule rewrites the step's jaxpr
  first; the rule still applies to the step's own), on v5e; on v5p and
  v6e the dequantization stays after the backward pass, where the program
  has it."""
  j = trace_probe(load_model("gpt2"), TrainSettings(
      batch=8, seq=128, optimizer="adamw_8bit"),
      abstract_mesh(plan_mesh(parse_topology("v5p-8"), 4, 1))).jaxpr.jaxpr
  for chip in ("v5e", "v5p", "v6e"):
    early = xla_rules.dequantizes_early(chip)
    assert early == (chip == "v5e")
    sim = liveness._Simulation(dequantize_early=early)
    sim.top = id(j)
    for order in ("deferred", "traced"):
      eqns = sim.plan(j, False, (), order).jaxpr.eqns
      first = [e for e in eqns[:8] if e.primitive.name == "shard_map"
               and all(v.aval.dtype == jnp.float32 for v in e.outvars)]
      assert bool(first) == early, (chip, order)
      assert not any(made_by_backward(e) for e in eqns[:8]), order


def test_the_chip_decides_where_the_8bit_moments_are_dequantized():
  """The estimate passes its chip to the rule: gpt2's 8-bit step on a v5e
  mesh holds the f32 moments through its forward pass, the same step on v5p
  does not, so its peak is lower by at least one dequantized moment."""
  settings = TrainSettings(batch=8, seq=128, optimizer="adamw_8bit")
  peaks = {}
  for topo in ("v5e-4", "v5p-8"):
    plan = plan_mesh(parse_topology(topo), 4, 1)
    est = memory.estimate_memory(
        trace_probe(load_model("gpt2"), settings, abstract_mesh(plan)), plan)
    peaks[topo] = est.summary_at(est.batch).compiled_comparable_peak
  # the smallest 8-bit moment: a [768] vector keeps f32 moments, the
  # position embedding f32[1024, 192] is one dequantized moment a device
  assert peaks["v5e-4"] - peaks["v5p-8"] >= 1024 * 192 * 4


def test_a_fill_made_in_a_call_is_sunk_into_the_loop_reading_it():
  """The sunk-loop-constants rule looks through a call: a -1e30 fill a jit
  returns and a scan reads as a constant (the flash forward's, passed out
  of the attention's call by partial evaluation) is no buffer; one made
  from an argument is."""
  def fn(xs_CxBxK, arg_BxK):
    fill, gram = jax.jit(lambda a: (jnp.full(xs_CxBxK.shape[1:], -1e30),
                                    a @ a.T))(arg_BxK)  # not fusible whole
    other = jax.jit(lambda a: a * 2.0)(arg_BxK) + gram.sum()
    def body(c, x):
      return c + jnp.sum(jnp.maximum(x, fill) + other), None
    return jax.lax.scan(body, 0.0, xs_CxBxK)[0]
  j = jax.make_jaxpr(fn)(jax.ShapeDtypeStruct((4, 8, 1024), jnp.float32),
                         jax.ShapeDtypeStruct((8, 1024), jnp.float32)).jaxpr
  calls = [e for e in j.eqns if e.primitive.name in ("jit", "pjit")]
  producer = {v: e for e in j.eqns for v in e.outvars}
  readers = lambda v: [e for e in j.eqns if v in e.invars]
  sunk = xla_rules.sunk_into_loops(j.eqns, readers, producer)
  assert calls[0].outvars[0] in sunk and calls[1].outvars[0] not in sunk


def test_a_value_one_matmul_alone_reads_is_taken_into_it():
  """The into-matmuls rule's sole-reader part: the flash forward's bf16 p,
  made from the wider f32 scores and read by the p·V matmul alone, is no
  buffer (on a TPU); read by two matmuls, as the backward's ds, it is."""
  def fn(s_BxT, v_TxH):
    p = jnp.exp(s_BxT - s_BxT.max(-1, keepdims=True)).astype(jnp.bfloat16)
    return p @ v_TxH, p
  j = jax.make_jaxpr(fn)(jax.ShapeDtypeStruct((PROBE, 64), jnp.float32),
                         jax.ShapeDtypeStruct((64, 8), jnp.bfloat16)).jaxpr
  cast = next(e for e in j.eqns if e.primitive.name == "convert_element_type")
  dot = _eqn(j, "dot_general")
  args = (cast, cast.outvars[0], [dot], [dot], False)
  assert xla_rules.fused_away(*args, sole_matmul_in=True)
  assert not xla_rules.fused_away(*args)  # a GPU: a loop fusion's output
  two = [dot, dot.replace(invars=list(dot.invars))]
  assert not xla_rules.fused_away(cast, cast.outvars[0], two, two, False,
                                  sole_matmul_in=True)


def test_weights_in_host_memory_are_prefetched_at_the_loop_body_start():
  """The prefetched-host-weights rule (--offload=params): in the layer
  loop's body every weight fetched from host memory, with its gather and
  cast, comes before anything that carries the batch; the equations are
  the same ones."""
  j = _offload_jaxpr("params")
  body = next(b for e in j.eqns if e.primitive.name == "scan"
              for _, b in subjaxprs(e)
              if any(xla_rules.fetches_host_value(x) for x in b.eqns))
  moved = xla_rules.prefetch_host_weights(body)
  assert moved is not body
  assert sorted(map(id, moved.eqns)) == sorted(map(id, body.eqns))
  fetches = [i for i, e in enumerate(moved.eqns)
             if xla_rules.fetches_host_value(e)]
  batch = [i for i, e in enumerate(moved.eqns)
           if any(carries_batch(v.aval.shape) for v in e.outvars)]
  assert fetches and max(fetches) < min(batch)
  plain = _offload_jaxpr()
  assert all(xla_rules.prefetch_host_weights(b) is b
             for e in plain.eqns for _, b in subjaxprs(e))


@functools.lru_cache(None)
def _accumulated(topology: str, grad_accum: int):
  plan = plan_mesh(parse_topology(topology), 8, 1)
  settings = TrainSettings(batch=64, seq=128, grad_accum=grad_accum)
  traced = trace_probe(load_model("tiny"), settings, abstract_mesh(plan))
  return memory.estimate_memory(traced, plan).at_batch(64)


@pytest.mark.parametrize("topology", ["h100:8", "v5p-16"])
def test_two_micro_batches_interleave(topology):
  """The interleaved-micro-batches rule: with two micro-batches the
  accumulation loop has one iteration, which XLA inlines beside the first
  micro-batch, on a GPU and on a TPU; at each point of it the other
  micro-batch is counted as it waits between two of its instructions, at
  its largest such live set: at least what this micro-batch made outside its
  loops and still holds at the peak (it held that waiting before its
  backward loop), less than this micro-batch's own transient there (a loop
  body's working set is not held while waiting). On a TPU the other is
  waiting or done, so it is counted beyond its gradients (the
  accumulation's initial carry, at most the f32 parameters' bytes: the
  embedding's are made narrow), which the step already holds; on a GPU
  they are zero-filled early and held waiting too. Not with four
  micro-batches (the loop stays)."""
  def other(estimate):
    return sum(c.bytes for c in estimate.peak_buffers
               if "other micro-batch" in c.name)
  two = _accumulated(topology, 2)
  assert scopes.ACCUMULATION in two.peak_where
  rule = {s for ss in two.points.splits.values() for s in ss
          if isinstance(s, xla_rules.InterleavedMicroBatch)}
  (done, linear), = {s.done for s in rule}
  params = sum(t.fixed for t in two.tensors if t.category == "params")
  assert linear == 0
  assert done == 0 if topology.startswith("h100") else 0 < done <= params
  extra = other(two) + done
  own = [c for c in two.peak_buffers if c.name.startswith(
      scopes.ACCUMULATION) and "other micro-batch" not in c.name]
  outside_loops = sum(c.bytes for c in own if c.name.count(" > ") == 1)
  assert 0 < outside_loops <= extra
  assert other(two) < sum(c.bytes for c in own)
  assert other(_accumulated(topology, 4)) == 0


def test_the_schedule_runs_through_the_inlined_micro_batch():
  """XLA inlines the one-iteration accumulation loop, so the step's
  schedule of the weight gradients is the micro-batch's too (#141: both
  micro-batches in the traced order): in the traced schedule the
  micro-batch's f32 logits gradient is gone by its layers' backward loop,
  its output projection's gradient made right after it; in the deferred
  one it is still live there."""
  points = _accumulated("v5p-16", 2).points

  def logits_live(order):
    at = [i for i, (where, o) in enumerate(zip(points.where, points.order))
          if o == order and where.startswith(scopes.ACCUMULATION)
          and "backward Decoder/layers" in where]
    assert at
    return [any("forward Decoder/loss/bsd,dv->bsv" in b.where
                and b.dtype == "float32" for b in points.live(i))
            for i in at]

  assert all(logits_live("deferred"))
  assert not any(logits_live("traced"))


@pytest.mark.parametrize("names,kv_heads,relaid", [
    ("qkv,attn_out", 4, 3), ("qkv,attn_out", 2, 0), ("mlp_hidden", 4, 0),
    # The residual stream's stacks: not modelled (#287 relays them, #288
    # and the 70B recipe do not).
    ("qkv,decoder_layer_input,out_proj", 4, 3),
    ("decoder_layer_input", 4, 0)])
def test_offloaded_attention_stacks_are_relaid_before_the_backward(
    names, kv_heads, relaid):
  """The relaid-stacks rule: of the host stacks remat offload saves, the
  backward layer loop's q, k, v (read by its attention's loops) are relaid
  out through HBM before it runs, two copies of the largest at once, on a
  TPU, anywhere after the loss's last equation (held at each of those
  points), when they are of one shape (MHA: tiny with 4 kv heads); with
  fewer kv heads than query heads (GQA, tiny's 2) none is (the GQA dumps,
  #198, #199, #208); attn_out, mlp_hidden (read by matmuls), the layer
  inputs and out_proj never."""
  plan = plan_mesh(parse_topology("v5p-8"), 2, 2)
  cfg = dataclasses.replace(load_model("tiny"), n_kv_heads=kv_heads)
  traced = trace_probe(cfg, TrainSettings(
      batch=8, seq=64, remat=f"offload:{names}"), abstract_mesh(plan))
  loops = [e for e in traced.jaxpr.jaxpr.eqns
           if xla_rules.relaid_host_stacks(e)]
  stacks = [v for e in loops for v in xla_rules.relaid_host_stacks(e)]
  assert len(stacks) == relaid
  assert all(xla_rules.on_host(v.aval) for v in stacks)
  estimate = memory.estimate_memory(traced, plan)
  rules = [s for ss in estimate.points.splits.values() for s in ss
           if isinstance(s, xla_rules.RelaidStack)]
  one = max((math.prod(device_shape(v.aval)) * v.aval.dtype.itemsize
             for v in stacks), default=0)
  assert {r.extra(1, 1) for r in rules} == ({2 * one} if loops else set())
  assert {r.dtype for r in rules} <= {"bfloat16"}  # the stack's, reported
  eqns = traced.jaxpr.jaxpr.eqns
  for loop in loops:
    at = eqns.index(loop)
    stretch = xla_rules.relay_stretch(eqns, at)
    assert stretch.stop == at and scopes.LOSS in scopes.scopes_of(
        eqns[stretch.start - 1].source_info.name_stack)
    assert len(stretch) > 0 and not any(
        scopes.LOSS in scopes.scopes_of(eqns[k].source_info.name_stack)
        for k in stretch)
  held = [i for i, ss in estimate.points.splits.items()
          if any(isinstance(s, xla_rules.RelaidStack) for s in ss)]
  assert len(held) > len(set(estimate.points.order)) * len(loops) or not loops


def _recomputed_cast(y: int):
  """The f32 cast jax.checkpoint recomputes in the backward of a norm whose
  bf16 input, sharded over Y of `y` devices, is gathered over Y first; with
  its producer and readers in that backward's jaxpr."""
  mesh = AbstractMesh((2, y), ("X", "Y"),
                      axis_types=(AxisType.Explicit, AxisType.Explicit))

  def layer(x, w):
    xf = jax.sharding.reshard(x, P("X", None)).astype(jnp.float32)
    h = xf * jax.lax.rsqrt(jnp.mean(xf * xf, -1, keepdims=True))
    return jnp.sum((h.astype(jnp.bfloat16) @ w).astype(jnp.float32))

  x = jax.ShapeDtypeStruct((2 * PROBE, 64), jnp.bfloat16,
                           sharding=NamedSharding(mesh, P("X", "Y")))
  w = jax.ShapeDtypeStruct((64, 8), jnp.bfloat16,
                           sharding=NamedSharding(mesh, P(None, None)))
  with jax.sharding.use_abstract_mesh(mesh):
    closed = jax.make_jaxpr(jax.grad(jax.checkpoint(layer)))(x, w)
  stack = [closed.jaxpr]
  while stack:
    j = stack.pop()
    for e in j.eqns:
      if (e.primitive.name == "convert_element_type"
          and scopes.in_recompute(e.source_info.name_stack)
          and e.outvars[0].aval.dtype == jnp.float32
          and len(e.outvars[0].aval.shape) == 2
          and e.outvars[0].aval.shape[-1] == 64):
        producer = {v: p for p in j.eqns for v in p.outvars}
        readers = [r for r in j.eqns if e.outvars[0] in r.invars]
        return e, producer, readers
      stack += [sub for _, sub in subjaxprs(e)]
  raise AssertionError("no recomputed f32 cast of the gathered input")


def test_a_recomputed_cast_of_a_gathered_value_the_backward_reads_is_a_buffer():
  """The gathered-casts rule (held-out #221: bitcast_convert_fusion.4 =
  fusion(all-gather.120), held to the norm's backward): the recompute's
  f32 cast of the input it gathers over Y, read by the backward pass, is a
  buffer; over a Y of one device the reshard gathers nothing and the cast
  fuses into its readers as before."""
  cast, producer, readers = _recomputed_cast(2)
  assert any(not scopes.in_recompute(r.source_info.name_stack)
             for r in readers)
  assert xla_rules.gathered_cast(cast, producer, readers)
  assert not xla_rules.fused_away(cast, cast.outvars[0], readers, readers,
                                  False, producer=producer)
  cast, producer, readers = _recomputed_cast(1)
  assert not xla_rules.gathered_cast(cast, producer, readers)


def _two_matmuls_of_one_gathered_operand(y: int, both: bool = True):
  """dy (batch over X, features over Y) read by a weight gradient whose
  result keeps Y for its other dim and by an input gradient whose weight
  keeps Y for its output: both gather dy over Y (#188's backward MoE
  output gradient, all-gather.248 read by the experts' wo gradients)."""
  mesh = AbstractMesh((2, y), ("X", "Y"),
                      axis_types=(AxisType.Explicit, AxisType.Explicit))

  def grads(dy, h, w):
    dw = jnp.einsum("bd,bf->df", dy, h, out_sharding=P(None, "Y"))
    if not both:
      return dw
    dx = jnp.einsum("bd,fd->bf", dy, w, out_sharding=P("X", "Y"))
    return dw, dx

  spec = lambda *s: NamedSharding(mesh, P(*s))
  args = (jax.ShapeDtypeStruct((2 * PROBE, 64), jnp.bfloat16,
                               sharding=spec("X", "Y")),
          jax.ShapeDtypeStruct((2 * PROBE, 32), jnp.bfloat16,
                               sharding=spec("X", "Y")),
          jax.ShapeDtypeStruct((32, 64), jnp.bfloat16,
                               sharding=spec("Y", None)))
  with jax.sharding.use_abstract_mesh(mesh):
    return jax.make_jaxpr(grads)(*args).jaxpr


def test_an_operand_two_matmuls_gather_is_one_buffer_between_them():
  """The gathered-operands rule: dy gathered over Y for both matmuls is one
  buffer of its gathered per-device size, from when dy exists (an input:
  the start) to the second; over a Y of one device nothing is gathered, and
  one matmul's gather is not held."""
  jaxpr = _two_matmuls_of_one_gathered_operand(2)
  dots = [i for i, e in enumerate(jaxpr.eqns)
          if e.primitive.name == "dot_general"]
  held, replaced = xla_rules.gathered_operands(jaxpr.eqns, False, {})
  assert list(held.values()) == [(0, dots[1], (0, PROBE * 64 * 2))]
  (operand, _, rule), = held
  assert operand.value is jaxpr.invars[0] and rule == "operand"
  assert device_shape(operand.aval) == (PROBE, 64)
  assert not replaced  # an input: its caller holds it
  for one_matmul in (_two_matmuls_of_one_gathered_operand(1),
                     _two_matmuls_of_one_gathered_operand(2, both=False)):
    assert xla_rules.gathered_operands(one_matmul.eqns, False,
                                       {}) == ({}, {})


def _step_with_a_late_reduction(xs, w, wb):
  """A loop body like the flash backward's with a bias: d is read by its
  cast (two matmuls read the cast) and by a reduction the program makes
  last, written into a stacked output."""
  def body(c, x):
    d = jnp.tanh(x @ w) * 3.0  # f32 [PROBE, 256]
    ds = d.astype(jnp.bfloat16)
    wide = (ds @ wb).astype(jnp.float32)  # its bf16 product: the peak
    grad = ds.T @ x.astype(jnp.bfloat16)
    return c + jnp.sum(wide), (grad, jnp.sum(d, axis=0))
  return jax.lax.scan(body, 0.0, xs)


def test_a_reduction_is_made_where_its_operand_is_made():
  """The multi-output-reductions rule, with the written-outputs rule: the
  reduction of d moves to just after d is made, and what it reads is not
  held for the stacked output it is written into, so at the matmul reading
  d's cast the f32 d is dead (held there without the rules)."""
  j = jax.make_jaxpr(_step_with_a_late_reduction)(
      jax.ShapeDtypeStruct((4, PROBE, 64), jnp.float32),
      jax.ShapeDtypeStruct((64, 256), jnp.float32),
      jax.ShapeDtypeStruct((256, 1024), jnp.bfloat16)).jaxpr
  body = _eqn(j, "scan").params["jaxpr"].jaxpr
  moved = xla_rules.reductions_where_made(body).eqns
  names = [e.primitive.name for e in moved]
  assert names.index("reduce_sum") == names.index("mul") + 1
  points = liveness.simulate(j, 0)
  _, i = points.peak_at(1, 1)
  live = {(b.shape, b.dtype) for b in points.live(i)}
  assert ((PROBE, 256), "bfloat16") in live  # the cast
  assert ((PROBE, 1024), "bfloat16") in live  # the matmul reading it
  assert ((PROBE, 256), "float32") not in live


def test_an_all_to_all_stages_its_operand_beside_its_result():
  """A reshard that moves a mesh axis between dims (vocab-split to
  width-split, gemma-2b's table in its serving lookup) holds a copy of its
  operand in the all-to-all's layout while it runs, beside the result
  (copy.25 and all-to-all in that decode step's dump), on a GPU too
  (XLA:GPU puts the split dim major: loop_transpose_fusion and
  all-to-all.2 in llama2_7b h100:8 2x4's decode); a gather and a reshard
  onto the operand's major dim (the experts' dispatch) stage nothing."""
  mesh = AbstractMesh((4,), ("Y",), axis_types=(AxisType.Explicit,))
  table = jax.ShapeDtypeStruct((64, 32), jnp.bfloat16,
                               sharding=NamedSharding(mesh, P("Y", None)))
  def fn(t, spec):
    return (jax.sharding.reshard(t, spec) * 2).sum()
  with jax.sharding.use_abstract_mesh(mesh):
    moved, gathered = (jax.make_jaxpr(functools.partial(fn, spec=spec))(
        table).jaxpr for spec in (P(None, "Y"), P(None, None)))
  assert xla_rules.moves_between_dims(_eqn(moved, "reshard"))
  assert not xla_rules.moves_between_dims(_eqn(gathered, "reshard"))
  wide = jax.ShapeDtypeStruct((64, 32), jnp.bfloat16,
                              sharding=NamedSharding(mesh, P(None, "Y")))
  with jax.sharding.use_abstract_mesh(mesh):  # onto the major dim: the
    # experts' dispatch, chunks already contiguous
    major = jax.make_jaxpr(functools.partial(fn, spec=P("Y", None)))(
        wide).jaxpr
  assert not xla_rules.moves_between_dims(_eqn(major, "reshard"))
  local = 64 * 32 * 2 // 4
  tpu = liveness._plan(moved, False, (), set(), {})
  assert [b[0] for b in tpu.beside.values()] == [(local, 0)]
  at_reshard = {gpu: next(sum(at) for _, e, at in liveness._Simulation._at_each(
      liveness._plan(moved, False, (), set(), {}, gpu=gpu))
                          if e.primitive.name == "reshard")
                for gpu in (False, True)}
  assert at_reshard == {False: 2 * local, True: 2 * local}
  assert not liveness._plan(gathered, False, (), set(), {}).beside


def _position_bias(heads: int):
  """T5's bias lookup: a [buckets, heads] table at [S, S] bucket ids, in a
  shard_map as models.transformer.lookup runs it, then heads major."""
  mesh = AbstractMesh((1,), ("Y",), axis_types=(AxisType.Explicit,))
  table = jax.ShapeDtypeStruct((32, heads), jnp.float32,
                               sharding=NamedSharding(mesh, P(None, None)))
  ids = jax.ShapeDtypeStruct((256, 256), jnp.int32,
                             sharding=NamedSharding(mesh, P(None, None)))
  def fn(t, i):
    rows = jax.shard_map(lambda t, i: jnp.take(t, i, axis=0),
                         in_specs=(P(None, None), P(None, None)),
                         out_specs=P(None, None, None))(t, i)
    return jnp.transpose(rows, (2, 0, 1)) * 2.0
  with jax.sharding.use_abstract_mesh(mesh):
    return jax.make_jaxpr(fn)(table, ids).jaxpr


@pytest.mark.parametrize("heads, padded", [(8, 256 * 256 * 128 * 4),
                                           (128, None)])
def test_a_gather_pads_narrow_slices_while_its_result_is_copied(heads,
                                                                padded):
  """The gathered-slices-minor rule: a gather's result, returned through
  its shard_map, keeps each gathered row minor in TPU tiles, 8 heads padded
  to 128 lanes (T5's bias, f32[4194304,8] 2 GiB at the t5_3b prefill's
  peak), live beside the dense copy its readers take while that is made;
  rows of 128 need no copy, nor does a GPU plan."""
  j = _position_bias(heads)
  lookup = _eqn(j, "shard_map")
  assert xla_rules.gathered_slices_minor(lookup, lookup.outvars[0])
  dense = 256 * 256 * heads * 4
  beside = liveness._plan(j, False, (), set(), {}).beside
  assert [b[0] for b in beside.values()] == ([(padded, 0)] if padded else [])
  assert not liveness._plan(j, False, (), set(), {}, gpu=True).beside
  at_lookup = next(sum(at) for _, e, at in liveness._Simulation._at_each(
      liveness._plan(j, False, (), set(), {})) if e is lookup)
  assert at_lookup == dense + (padded or 0)
  levels = jax.make_jaxpr(lambda t, codes: t[codes])(  # 8-bit AdamW's
      jnp.zeros(256), jnp.zeros((64, 4), jnp.int32)).jaxpr  # elements
  element = _eqn(levels, "gather")
  assert not xla_rules.gathered_slices_minor(element, element.outvars[0])


def test_two_reshards_of_a_value_into_one_layout_are_one_buffer():
  """The shared-reshards rule: an encoder-decoder's two lookups of its
  shared table reshard it alike; XLA makes one all-to-all (the
  t5-v1_1-small prefill), held from the first to the last reader of
  either, on a TPU. A reshard into another layout is its own."""
  mesh = AbstractMesh((4,), ("Y",), axis_types=(AxisType.Explicit,))
  table = jax.ShapeDtypeStruct((1024, 256), jnp.float32,
                               sharding=NamedSharding(mesh, P("Y", None)))
  def fn(t, x, other=P(None, "Y")):
    first = (jax.sharding.reshard(t, P(None, "Y")) * 2).sum()
    big = jnp.sin(x) * 2  # made between the two reshards
    return first + (jax.sharding.reshard(t, other) * 3).sum() + big.sum()
  x = jax.ShapeDtypeStruct((4096, 256), jnp.float32,
                           sharding=NamedSharding(mesh, P(None, None)))
  with jax.sharding.use_abstract_mesh(mesh):
    j = jax.make_jaxpr(fn)(table, x).jaxpr
    gathered = jax.make_jaxpr(functools.partial(fn, other=P(None, None)))(
        table, x).jaxpr
  first, second = [e for e in j.eqns if e.primitive.name == "reshard"]
  assert xla_rules.shared_reshards(j.eqns) == {
      second.outvars[0]: first.outvars[0]}
  assert xla_rules.shared_reshards(gathered.eqns) == {}
  sin = _eqn(j, "sin")
  live_at_sin = lambda gpu: next(
      sum(at) for _, e, at in liveness._Simulation._at_each(
          liveness._plan(j, False, (), set(), {}, gpu=gpu)) if e is sin)
  local = 1024 * 256 * 4 // 4
  assert live_at_sin(False) - live_at_sin(True) == local


@pytest.mark.parametrize("made_rows, first", [(64, True), (256, False)])
def test_a_cache_stack_larger_than_a_loop_operand_s_making_is_made_first(
    made_rows, first):
  """The stacks-made-first rule: a loop's stacked output the step returns
  with a buffer of its own (a KV cache stack, written one position at a
  time) is made before what the step makes for the loop's other operand,
  and live beside it, where it is the larger (libtpu's DFS order: the
  llava_mini 2x2 decode's 72 MiB stacks before its 31 MiB lookup); a
  smaller stack is made after (gemma-2b's decode)."""
  def step(cache_LxTxN, x_RxN, w_NxN):
    wide = x_RxN @ w_NxN  # made for the loop: a matmul's buffer
    init = wide.sum(axis=0)
    def body(carry, slice_TxN):
      new = jax.lax.dynamic_update_slice_in_dim(slice_TxN, carry[None], 0,
                                                axis=0)
      return carry + 1.0, new
    _, new = jax.lax.scan(body, init, cache_LxTxN)
    return new, init

  stack = jax.ShapeDtypeStruct((8, 16, 1024), jnp.float32)  # 512 KiB
  x = jax.ShapeDtypeStruct((made_rows, 1024), jnp.float32)
  w = jax.ShapeDtypeStruct((1024, 1024), jnp.float32)
  j = jax.make_jaxpr(step)(stack, x, w).jaxpr
  plan = liveness._plan(j, False, (), set(), {})
  early = xla_rules.stacks_made_first(j, plan.size, plan.beside, (), 1.0)
  assert [key[0] for key in early] == j.outvars[:1] * first
  stack_bytes, made = 8 * 16 * 1024 * 4, made_rows * 1024 * 4
  peak, _ = liveness.simulate(j, 1, batch_scale=1.0).peak_at(1, 1)
  without, _ = liveness.simulate(j, 1).peak_at(1, 1)
  if first:  # the stack beside the buffer made for the loop
    assert without < stack_bytes + made <= peak
  else:
    assert peak == without


def test_a_slice_updated_in_part_is_a_buffer_of_the_loop_body():
  """The updated slices rule: a loop body writing one position of its
  stacked operand's slice (a KV cache layer at a decode step) reads the
  slice out into a buffer of its own, updates it and writes it into the
  output stack; a slice written whole, or an output that is no update of
  a slice, is written in place."""
  def step(cache_LxTxN, x_SxN):
    def body(carry, slice_TxN):
      new = jax.lax.dynamic_update_slice_in_dim(slice_TxN, x_SxN + carry, 0,
                                                axis=0)
      return carry + 1.0, (new, slice_TxN * 2.0)
    _, (new, doubled) = jax.lax.scan(body, jnp.zeros((), jnp.float32),
                                     cache_LxTxN)
    return new, doubled

  stack = jax.ShapeDtypeStruct((8, 16, 1024), jnp.float32)
  for rows, copied in ((4, 1), (16, 0)):
    j = jax.make_jaxpr(step)(stack, jax.ShapeDtypeStruct((rows, 1024),
                                                         jnp.float32)).jaxpr
    scan = _eqn(j, "scan")
    body = scan.params["jaxpr"].jaxpr
    assert xla_rules.sliced_updates(scan) == body.outvars[1:1 + copied]
    (_, _, in_place), = xla_rules.calls(scan, False)
    assert len(in_place) == len(body.outvars) - copied


def test_a_stack_written_whole_over_a_donated_argument_is_in_place():
  """The written-whole stacks: a loop whose body overwrites each slice of
  a donated stack whole (T5's prefill writing the cross-attention cache)
  writes its stacked output into the argument's buffer; written one
  position at a time (the decoder's own cache) it keeps a stack of its
  own, as does a whole write over an argument something else reads."""
  def step(cache_LxTxN, x_SxN, read_too=False):
    def body(carry, slice_TxN):
      new = jax.lax.dynamic_update_slice_in_dim(slice_TxN, x_SxN + carry, 0,
                                                axis=0)
      return carry + 1.0, new
    _, new = jax.lax.scan(body, jnp.zeros((), jnp.float32), cache_LxTxN)
    return new, (cache_LxTxN.sum() if read_too else x_SxN.sum())

  stack = jax.ShapeDtypeStruct((8, 16, 1024), jnp.float32)
  whole, part = (jax.ShapeDtypeStruct((s, 1024), jnp.float32)
                 for s in (16, 4))
  jaxpr = lambda x, read=False: jax.make_jaxpr(
      functools.partial(step, read_too=read))(stack, x).jaxpr
  in_place = lambda j: xla_rules.donated_in_place(j, j.outvars[:1])
  written = jaxpr(whole)
  assert in_place(written) == written.outvars[:1]
  assert in_place(jaxpr(part)) == []
  assert in_place(jaxpr(whole, read=True)) == []
  peak = lambda j: liveness.simulate(j, 1).peak_at(1, 1)[0]
  assert peak(written) < 8 * 16 * 1024 * 4 <= peak(jaxpr(part))


def test_pvary_makes_no_copy():
  """shard_map's pvary (jax.lax.pcast to varying) lowers to nothing: a
  replicated table a lookup reads through it is no buffer of its own
  (mixtral_mini v5p-8 4x1 b8's serving steps: +4.8% and +6.8% with a
  62.5 MiB copy of the table, +1.0% and -0.1% without)."""
  mesh = AbstractMesh((2,), ("X",), axis_types=(AxisType.Explicit,))
  table = jax.ShapeDtypeStruct((64, 32), jnp.bfloat16,
                               sharding=NamedSharding(mesh, P(None, None)))
  ids = jax.ShapeDtypeStruct((2 * PROBE,), jnp.int32,
                             sharding=NamedSharding(mesh, P("X")))
  def fn(t, i):
    take = lambda t, i: jnp.take(jax.lax.pcast(t, ("X",), to="varying"), i,
                                 axis=0)  # pcast to varying: a pvary
    return jax.shard_map(take, in_specs=(P(None, None), P("X")),
                         out_specs=P("X", None))(t, i)
  with jax.sharding.use_abstract_mesh(mesh):
    j = jax.make_jaxpr(fn)(table, ids).jaxpr
  body = next(s for e in j.eqns for _, s in subjaxprs(e))
  body = getattr(body, "jaxpr", body)
  pvary = _eqn(body, "pvary")
  assert xla_rules.is_view(pvary)
  plan = liveness._plan(body, True, (), set(), {})
  assert plan.size[pvary.outvars[0]] == (0, 0)


def test_a_loop_of_one_iteration_is_replaced_by_its_body():
  """inline_one_trip_loops: the one-trip scan is gone, its body's equations
  are the caller's (its slice, carry and stacked output views), and the
  program computes what it did; a longer loop and the gradient-accumulation
  loop (its own rule) stay loops."""
  def f(xs, w):
    def body(c, x):
      h = x @ w
      return c + jnp.sum(h), jnp.tanh(h)
    return jax.lax.scan(body, 1.0, xs)

  def accumulated(xs, w):
    with jax.named_scope(scopes.ACCUMULATION):
      return f(xs, w)

  xs, w = jnp.arange(8.0).reshape(1, 2, 4), jnp.ones((4, 3)) / 3
  closed = jax.make_jaxpr(f)(xs, w)
  inlined = xla_rules.inline_one_trip_loops(closed.jaxpr)
  assert "scan" not in {e.primitive.name for e in inlined.eqns}
  got = jax.core.eval_jaxpr(inlined, closed.consts, xs, w)
  for a, b in zip(got, f(xs, w)):
    assert jnp.allclose(a, b)
  for g, args in ((f, (jnp.ones((2, 2, 4)), w)), (accumulated, (xs, w))):
    jaxpr = jax.make_jaxpr(g)(*args).jaxpr
    assert xla_rules.inline_one_trip_loops(jaxpr) is jaxpr
