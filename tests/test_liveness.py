"""simulator.memory.liveness: live ranges in program order, on small
programs whose buffers can be counted by hand (no mesh: per-device shapes
are the shapes; f32 unless said)."""

import random

import jax
import jax.numpy as jnp
from jax.sharding import AbstractMesh, AxisType, NamedSharding, PartitionSpec as P

from simulator.tracing.batch_probe import PROBE
from simulator.memory import liveness

F32 = 4


def _peak(fn, *args, donated: int = 0) -> int:
  points = liveness.simulate(jax.make_jaxpr(fn)(*args), donated)
  return points.peak_at(1, 1)[0]


def test_a_value_lives_from_its_equation_to_its_last_reader():
  """h = x@w1 (8x32) is live while y = h@w2 (8x16) is made: 8*32 + 8*16
  floats; the arguments are not transient."""
  x, w1, w2 = jnp.ones((8, 64)), jnp.ones((64, 32)), jnp.ones((32, 16))
  assert _peak(lambda x, a, b: jnp.sum((x @ a) @ b), x, w1, w2) == (
      (8 * 32 + 8 * 16) * F32)


def test_an_elementwise_chain_into_a_reduction_is_fused():
  """exp(h) * 2 is computed inside the row sum's fusion: only h and the
  sum's output are buffers."""
  x, w = jnp.ones((8, 64)), jnp.ones((64, 32))
  got = _peak(lambda x, w: jnp.sum(jnp.exp(x @ w) * 2.0, axis=1), x, w)
  assert got == (8 * 32 + 8) * F32


def test_a_fusion_writes_over_an_operand_that_dies_there():
  """g = h*3 + 1 is read by a matmul (a buffer), and h dies where g is made:
  g takes h's buffer, so the two are never live together."""
  x, w, w2 = jnp.ones((8, 64)), jnp.ones((64, 32)), jnp.ones((32, 32))
  got = _peak(lambda x, w, w2: jnp.sum((x @ w * 3.0 + 1.0) @ w2), x, w, w2)
  assert got == 2 * 8 * 32 * F32  # g (over h) and the second matmul's output


def test_a_scatter_writes_into_its_operand_when_it_dies_there():
  """g = (h@w).at[idx].add(u): the scatter-add updates the matmul's (64,32)
  output in place (as the embedding gradient's scatter does), so the two
  are never live together: at the scatter, g and its int32 [8,1] indices.
  Without the rule h@w and g would both be live there (2*64*32 floats)."""
  h, w = jnp.ones((64, 16)), jnp.ones((16, 32))
  idx, u = jnp.zeros((8,), jnp.int32), jnp.ones((8, 32))
  got = _peak(lambda h, w, i, u: jnp.sum((h @ w).at[i].add(u)), h, w, idx, u)
  assert got == 64 * 32 * F32 + 8 * 4


def _tanh_scan(xs, w):
  """A scan over the slices of xs: h = x@w, the sum of h carried, tanh(h)
  stacked."""
  def body(c, x):
    h = x @ w
    return c + jnp.sum(h), jnp.tanh(h)
  return jax.lax.scan(body, 0.0, xs)


def test_a_scan_allocates_its_stacked_outputs_whole():
  """A scan over 4 slices stacks its (8,32) outputs: all 4 are allocated
  before the first iteration, beside that iteration's own values."""
  xs, w = jnp.ones((4, 8, 64)), jnp.ones((64, 32))
  # stacked ys 4*8*32, the carry, and one iteration's h (8*32) + sum
  assert _peak(_tanh_scan, xs, w) == (4 * 8 * 32 + 1 + 8 * 32 + 1) * F32


def test_a_loop_of_one_iteration_is_its_body():
  """The same scan over one slice: XLA replaces a one-trip loop by its body
  (xla_rules, one-trip loops), so no stacked output is allocated beside
  the body's values: tanh(h) is the output, written over h where h dies,
  beside the sum; as a loop it would be the stacked (1,8,32) buffer beside
  h (2*8*32 + 2 floats)."""
  xs, w = jnp.ones((1, 8, 64)), jnp.ones((64, 32))
  assert _peak(_tanh_scan, xs, w) == (8 * 32 + 1) * F32


def test_an_output_fusion_does_not_write_over_a_value_another_fusion_reads():
  """d = p * (dO·Vᵀ - 1) is that matmul's output fusion; p = exp(Q·Kᵀ - 1)
  is also read by the matmul pᵀ·dO (the flash backward's dV): which of the
  two reads it last is the scheduler's choice, so d does not take over p's
  buffer: per sequence p (8x32), dV (32x16) and d (8x32) are live together
  at d (8*32 + 32*16 floats if d wrote over p)."""
  seqs = lambda *shape: jax.ShapeDtypeStruct((PROBE, *shape), jnp.float32)

  def f(q, k, do, v):
    p = jnp.exp(jnp.einsum("bsh,bth->bst", q, k) - 1.0)
    dv = jnp.einsum("bst,bsh->bth", p, do)
    return dv, p * (jnp.einsum("bsh,bth->bst", do, v) - 1.0)

  got = _peak(f, seqs(8, 16), seqs(32, 16), seqs(8, 16), seqs(32, 16))
  assert got == PROBE * (8 * 32 + 32 * 16 + 8 * 32) * F32


def test_donated_outputs_take_no_new_buffer():
  p = jnp.ones((256, 128))
  update = lambda p: (p - 0.1 * jnp.tanh(p), jnp.sum(p))
  assert _peak(update, p, donated=1) < _peak(update, p, donated=0)


def test_the_kept_points_hold_every_batch_maximum():
  rng = random.Random(0)
  points = [(rng.randrange(1000), rng.randrange(1000), str(i), (i,))
            for i in range(300)]
  kept = liveness._prune(points)
  assert len(kept) < 30
  for s in (0, 0.01, 0.5, 1, 3, 50, 10**6):
    best = lambda ps: max(f + l * s for f, l, *_ in ps)
    assert best(kept) == best(points)


def test_the_live_set_at_a_point_sums_to_it():
  def f(xs, w):
    h = jnp.tanh(xs @ w)
    return jnp.sum(h @ w.T)

  xs, w = jnp.ones((16, 64)), jnp.ones((64, 64))
  points = liveness.simulate(jax.make_jaxpr(f)(xs, w), 0)
  peak, i = points.peak_at(1, 1)
  live = points.live(i)
  assert sum(b.bytes[0] for b in live) == peak
  assert all(b.shape and b.where for b in live)


def test_hbm_traffic_of_a_fusion_is_what_it_reads_and_writes():
  """exp(x) * 2 + y is one fusion: it reads x and y and writes the sum; the
  values inside it move nothing."""
  f32 = jax.ShapeDtypeStruct((PROBE, 8), jnp.float32)
  j = jax.make_jaxpr(lambda x, y: jnp.sum(jnp.exp(x) * 2.0 + y, axis=1))(f32, f32)
  moved = liveness.hbm_traffic(j.jaxpr)
  n = PROBE * 8 * 4
  assert list(moved.values()) == [(0, 2 * n + PROBE * 4)]


def test_a_matmuls_output_fusion_is_timed_by_the_matmul():
  """x @ w + b: the add runs in the matmul's output fusion, whose operands
  stream under its FLOPs; it is no HBM-bound work of its own."""
  x = jax.ShapeDtypeStruct((PROBE, 8), jnp.float32)
  j = jax.make_jaxpr(lambda x, w, b: x @ w + b)(x, jnp.ones((8, 8)),
                                                 jnp.ones((8,)))
  assert liveness.hbm_traffic(j.jaxpr) == {}


def _reads_by_search(plan, eqn) -> list:
  """The buffers a fusion reads, found afresh: a depth-first search from
  its operands through the values computed inside it (no buffer of their
  own), each buffer listed where the search first meets it."""
  producer = {v: e for e in plan.jaxpr.eqns for v in e.outvars}
  found, seen = [], set()

  def search(v):
    if not isinstance(v, jax.extend.core.Var) or v in seen:
      return
    seen.add(v)
    made = producer.get(v)
    if made is None or plan.size[v] != (0, 0):
      found.append(v)
      return
    for u in made.invars:
      search(u)

  for v in eqn.invars:
    search(v)
  return found


def test_each_fusion_reads_the_buffers_behind_its_operands():
  """The buffers each equation's fusion reads (what hbm_traffic counts and
  the in-place rule picks from, first found first), in every body of a
  traced step: those a fresh search finds, in its order."""
  from meshes.layout import abstract_mesh, plan_mesh
  from meshes.topology import parse_topology
  from models.presets import PRESETS
  from simulator.settings import TrainSettings
  from simulator.memory.xla_rules import calls
  from simulator.tracing.trace import trace_probe

  plan = plan_mesh(parse_topology("v5p-8"), 2, 2)
  traced = trace_probe(PRESETS["tiny"], TrainSettings(batch=2, seq=128),
                       abstract_mesh(plan))
  jaxprs, checked = [(traced.jaxpr.jaxpr, False)], 0
  while jaxprs:
    jaxpr, local = jaxprs.pop()
    jaxprs += [(sub, sub_local) for e in jaxpr.eqns
               for sub, sub_local, _ in calls(e, local)]
    built = liveness._plan(jaxpr, local, (), set(), {})
    for i, eqn in enumerate(jaxpr.eqns):
      assert built.reads[i] == _reads_by_search(built, eqn)
      checked += len(built.reads[i]) > 1
  assert checked > 100  # fusions that read several buffers


def test_a_program_waits_outside_its_loops_and_at_their_edges():
  """between_loops: what a program holds while it waits between two of its
  instructions. A loop runs whole, so its body's working set is never
  held; the [64, 1024] matmul result made after the loop is held waiting
  anywhere outside it, not at the loop's edges (before, while or after it
  runs), where only the loop's [64, 64] carry is (the interleaved-micro-
  batches rule reads both: xla_rules)."""
  def step(x, w, w2, w3):
    def body(c, _):
      return jnp.tanh(c @ w), None
    y = jax.lax.scan(body, x, None, length=3)[0]
    return ((y @ w2) @ w3).sum()

  jaxpr = jax.make_jaxpr(step)(jnp.ones((64, 64)), jnp.ones((64, 64)),
                               jnp.ones((64, 1024)), jnp.ones((1024, 8))).jaxpr
  sim = liveness._Simulation()
  held = lambda edges: max(f + l for f, l, _ in sim.between_loops(
      jaxpr, edges=edges))
  assert held(False) >= 64 * 1024 * F32 > held(True) == 64 * 64 * F32


def test_an_operand_only_gathering_matmuls_read_dies_at_its_gather():
  """The gathered-operands rule (xla_rules): dy, a matmul's result that two
  matmuls gather over Y and nothing else reads, dies once its gathered copy
  is made, the equation after its own, and the copy is held to the second
  matmul."""
  mesh = AbstractMesh((2, 2), ("X", "Y"),
                      axis_types=(AxisType.Explicit, AxisType.Explicit))

  def grads(a, m, h, w):
    dy = jnp.einsum("bk,kd->bd", a, m, out_sharding=P("X", "Y"))
    dw = jnp.einsum("bd,bf->df", dy, h, out_sharding=P(None, "Y"))
    dx = jnp.einsum("bd,fd->bf", dy, w, out_sharding=P("X", "Y"))
    return dw, dx

  spec = lambda *s: NamedSharding(mesh, P(*s))
  args = [jax.ShapeDtypeStruct(shape, jnp.bfloat16, sharding=spec(*s))
          for shape, s in (((2 * PROBE, 16), ("X", None)),
                           ((16, 64), (None, "Y")),
                           ((2 * PROBE, 32), ("X", "Y")),
                           ((32, 64), ("Y", None)))]
  with jax.sharding.use_abstract_mesh(mesh):
    jaxpr = jax.make_jaxpr(grads)(*args).jaxpr
  plan = liveness._Simulation().plan(jaxpr, False, ())
  dots = [i for i, e in enumerate(plan.jaxpr.eqns)
          if e.primitive.name == "dot_general"]
  dy = plan.jaxpr.eqns[dots[0]].outvars[0]
  assert dy in plan.frees[dots[0] + 1]
  (first, last, _), = [r for k, r in plan.stacks.items()
                       if k[2] == "operand" and k[0].value is dy]
  assert (first, last) == (dots[0] + 1, dots[2])
