"""models.pipeline: stages on P, the loop's result, its sends and bubble; the
refusals of bad pipeline plans."""

import dataclasses
import json
import os
import subprocess
import sys
import textwrap

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P

from meshes.layout import abstract_mesh, plan_mesh
from meshes.topology import parse_topology
from models import pipeline
from models.registry import load_model
from models.transformer import Decoder
from simulator.timing import roofline
from simulator.tracing import program
from simulator.settings import TrainSettings
from simulator.step import build_step
from simulator.tracing.trace import trace

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TINY4 = dataclasses.replace(load_model("tiny"), n_layers=4)  # 2 per stage
PLAN = plan_mesh(parse_topology("v5p-16"), 2, 2, P=2)  # P2x2x2, 8 chips


def test_bubble_iterations_and_sends():
  """(K-1)/(M+K-1) idle (Narayanan et al. 2021); one send forward and one
  back per iteration."""
  assert pipeline.iterations(4, 8) == 11
  assert pipeline.bubble_fraction(4, 8) == pytest.approx(3 / 11)
  assert pipeline.bubble_fraction(2, 1) == pytest.approx(1 / 2)
  assert pipeline.sends(2, 4) == 10


def test_stage_params_are_stacked_over_stages_on_p():
  """[K, L/K, ...]: the stage dim on P, each device one stage's layers."""
  step = build_step(TINY4, TrainSettings(batch=16, seq=64, pp=2,
                                         microbatches=4), abstract_mesh(PLAN))
  wi = step.params["blocks"]["stages"]["mlp"]["wi"]["kernel"]
  assert wi.shape == (2, 2, 64, 128)
  assert wi.sharding.spec == P("P", None, "X", "Y")
  assert wi.sharding.shard_shape(wi.shape) == (1, 2, 32, 64)
  assert step.params["embedding"].sharding.spec == P("Y", "X")  # no P


def _unstaged_to_staged(params, stages):
  blocks = jax.tree.map(lambda x: x.reshape(stages, -1, *x.shape[1:]),
                        params["blocks"])
  return {**params, "blocks": {"stages": blocks}}


def test_the_pipeline_computes_the_unpipelined_loss_and_gradients():
  """The loop (no mesh: its stand-ins for the permute and the sum) gives
  the loss and gradients of the plain layer stack with the same weights
  (computed in f32: bf16 sums per micro-batch round differently)."""
  ids = jax.random.randint(jax.random.key(1), (8, 16), 0, TINY4.vocab_size)
  plain = Decoder(TINY4, dtype=jnp.float32)
  staged = Decoder(TINY4, stages=2, microbatches=4, dtype=jnp.float32)
  params = nn.unbox(plain.init(jax.random.key(0), ids, ids)["params"])
  loss = lambda m, p: m.apply({"params": p}, ids, ids)
  got, grads = jax.jit(jax.value_and_grad(lambda p: loss(staged, p)))(
      _unstaged_to_staged(params, 2))
  want, want_grads = jax.jit(jax.value_and_grad(lambda p: loss(plain, p)))(
      params)
  np.testing.assert_allclose(got, want, rtol=1e-5)
  np.testing.assert_allclose(grads["embedding"], want_grads["embedding"],
                             rtol=1e-4, atol=1e-6)
  np.testing.assert_allclose(
      grads["blocks"]["stages"]["mlp"]["wo"]["kernel"],
      _unstaged_to_staged(want_grads, 2)["blocks"]["stages"]["mlp"]["wo"][
          "kernel"], rtol=1e-4, atol=1e-6)


def test_stage_sends_are_the_programs_permutes():
  """The traced program's collective permutes over P are `sends` of one
  micro-batch's residual stream each, [B/M/X, S, D/Y] bf16; the finished
  micro-batches are all-reduced over P once per iteration each way."""
  s = TrainSettings(batch=16, seq=64, pp=2, microbatches=4)
  found = program.collectives(trace(TINY4, s, abstract_mesh(PLAN)))
  on_p = lambda kind: sum(c.bytes_per_device * c.count for c in found
                          if c.axis == "P" and c.kind == kind)
  each = pipeline.send_bytes(16 // 4 // 2, 64, 64 // 2)
  assert each == 2 * 64 * 32 * 2
  assert on_p("permute") == pipeline.sends(2, 4) * each
  assert on_p("all-reduce") == 2 * pipeline.iterations(2, 4) * each
  summary = roofline.pipeline_summary(TINY4, s, PLAN)
  assert summary["send_bytes"] == each and summary["sends"] == 10
  assert summary["send_seconds"] == pytest.approx(
      each / PLAN.topology.chip.ici_link_bandwidth)


CPU_SCRIPT = textwrap.dedent("""\
    import dataclasses, jax, json
    jax.config.update("jax_num_cpu_devices", 8)
    from meshes.layout import cpu_mesh
    from models.registry import load_model
    from simulator.xla.compiled import random_args
    from simulator.settings import TrainSettings
    from simulator.step import build_step
    cfg = dataclasses.replace(load_model("tiny"), n_layers=4)
    def step_loss(mesh, **pp):
      step = build_step(cfg, TrainSettings(batch=8, seq=16, **pp), mesh)
      with jax.set_mesh(mesh):
        return float(jax.jit(step.fn)(*random_args(step, mesh))[2])
    print("RESULT" + json.dumps([step_loss(cpu_mesh(4, 2)),
        step_loss(cpu_mesh(2, 2, 2), pp=2, microbatches=4)]))
    """)


@pytest.mark.long
def test_the_pipelined_step_runs_on_cpu_devices():
  """P x X x Y = 2x2x2 CPU devices: the compiled step runs, and its loss is
  the plain step's on the same values (random_args fills [4] and [2, 2]
  layers alike). XLA:CPU's bf16 all-reduce promotion pass crashes on the
  stages' sum over P, so it is off here (TPU compiles are unaffected)."""
  env = dict(os.environ, JAX_PLATFORMS="cpu", PYTHONPATH=ROOT,
             XLA_FLAGS="--xla_disable_hlo_passes=all-reduce-promotion")
  proc = subprocess.run([sys.executable, "-c", CPU_SCRIPT], cwd=ROOT, env=env,
                        capture_output=True, text=True, timeout=300)
  line = [l for l in proc.stdout.splitlines() if l.startswith("RESULT")]
  assert line, proc.stderr[-3000:]
  plain, staged = json.loads(line[0][len("RESULT"):])
  assert staged == pytest.approx(plain, rel=1e-5)


def _refused(args: list[str]) -> tuple[int, str]:
  p = subprocess.run([sys.executable, "-m", "experiments.memory_report",
                      "--batch=8", "--seq=64", *args], cwd=ROOT,
                     capture_output=True, text=True, timeout=120)
  return p.returncode, p.stderr.strip()


@pytest.mark.parametrize("args, message", [
    (["--model=gpt2", "--topology=v5p-16", "--mesh=1x1", "--pp=8"],
     "error: pp=8 does not divide gpt2's 12 layers; valid: 1, 2, 4 (dividing "
     "its layers and the 8 chips)"),
    (["--model=gpt2", "--topology=v5p-8", "--mesh=2x1", "--pp=2",
      "--microbatches=3"],
     "error: batch=8 is not a multiple of microbatches=3; each micro-batch "
     "runs batch/microbatches sequences"),
    (["--model=gpt2", "--topology=v5p-8", "--mesh=2x2", "--pp=2"],
     "error: pp=2 x mesh 2x2 has 8 devices but v5p-8 has 4 chips; choose "
     "X*Y = 4/pp"),
    (["--model=tiny_t5", "--topology=v5p-8", "--mesh=2x1", "--pp=2"],
     "error: pp=2: tiny_t5 is an encoder-decoder; pipeline stages are built "
     "for decoder-only dense models (e.g. llama2_7b)"),
    (["--model=tiny_moe", "--topology=v5p-8", "--mesh=2x1", "--pp=2"],
     "error: pp=2: tiny_moe is a mixture of experts; pipeline stages are "
     "built for decoder-only dense models (e.g. llama2_7b)"),
    (["--model=gpt2", "--topology=v5p-8", "--mesh=4x1", "--microbatches=2"],
     "error: microbatches=2, schedule=gpipe: these schedule pipeline stages;"
     " give pp > 1 (or grad_accum for micro-batches without stages)"),
    (["--model=gpt2", "--topology=v5p-8", "--mesh=4x1", "--pp=3"],
     "error: pp=3 does not divide v5p-8's 4 chips; valid: 1, 2, 4"),
])
def test_bad_pipeline_plans_are_one_line_errors(args, message):
  assert _refused(args) == (2, message)


def test_the_sweep_crosses_pipeline_stages():
  """--pps: every P with the X x Y meshes of chips/P; a pipeline plan is
  ranked with the others, named PpxXxY; a batch that X x microbatches does
  not divide fails with its reason."""
  from simulator import search
  spec = search.SweepSpec(model="tiny", topology="v5p-8", batches=(8, 12),
                          seq=64, pps=(1, 2), microbatches=4)
  sweep = search.Sweep(spec)
  configs = spec.configs(sweep.topo)
  assert {(c.P, c.X, c.Y) for c in configs} == {
      (1, 1, 4), (1, 2, 2), (1, 4, 1), (2, 1, 2), (2, 2, 1)}
  records = {(r["P"], r["X"], r["Y"], r["batch"]): r
             for r in sweep.evaluate(configs)}
  ok = records[(2, 2, 1, 8)]
  assert ok["status"] == "ok" and search.record_mesh(ok) == "P2x2x1"
  assert records[(2, 2, 1, 12)]["error"] == (
      "batch 12 is not divisible by X=2 x microbatches=4; each micro-batch "
      "is sharded over X")
  assert "| P2x2x1 | 8 |" in search.table(search.rank(list(records.values())))
  with pytest.raises(ValueError, match="pp 3 must be a positive divisor"):
    dataclasses.replace(spec, pps=(3,)).validate()
