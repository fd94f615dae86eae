"""simulator.search on the tiny model: trace reuse, failures, ranking."""

import pytest

from simulator import search

SPEC = search.SweepSpec(model="tiny", topology="v5p-16", batches=(8, 16, 32),
                        remats=("full", "none"), seq=64)


@pytest.fixture(scope="module")
def swept():
  sweep = search.Sweep(SPEC)
  return sweep, list(sweep.evaluate(SPEC.configs(sweep.topo)))


def test_every_factorization_crossed_with_every_choice(swept):
  sweep, records = swept
  meshes = {(r["X"], r["Y"]) for r in records}
  assert meshes == {(1, 8), (2, 4), (4, 2), (8, 1)}
  assert len(records) == 4 * 3 * 2
  assert len({search.record_key(r) for r in records}) == len(records)


def test_traces_once_per_mesh_remat_shard_optimizer(swept):
  sweep, records = swept
  assert len(sweep._estimators) == 4 * 2  # not 4 * 2 * 3 batch sizes


def test_the_time_spent_is_split_into_tracing_and_estimating(swept):
  """Only groups that lay out are traced or estimated; both took time."""
  sweep, _ = swept
  assert set(sweep.seconds) == {"trace", "estimate"}
  assert sweep.traces + sweep.read_off == 2 * 2  # Y = 1, 2; two remats
  assert all(t > 0 for t in sweep.seconds.values())


def test_mesh_whose_y_does_not_divide_kv_heads_fails_and_sweep_goes_on(swept):
  _, records = swept
  bad = [r for r in records if r["Y"] > 2]  # tiny has 2 kv heads
  assert bad and all(r["status"] == "failed" for r in bad)
  assert "divides neither" in bad[0]["error"]
  assert any(r["status"] == "ok" for r in records)


def test_batch_rescaling_matches_a_fresh_trace(swept):
  sweep, records = swept
  r = next(x for x in records if (x["X"], x["Y"], x["batch"], x["remat"]) ==
           (4, 2, 32, "none"))
  fresh = search.Sweep(search.SweepSpec(model="tiny", topology="v5p-16",
                                        batches=(32,), remats=("none",), seq=64,
                                        meshes=((4, 2),)))
  c = search.Config(4, 2, 32, "none", "zero3", "adamw")
  direct = fresh.evaluate_one(c)
  assert r["peak_bytes"] == direct["peak_bytes"]
  assert r["step_time_s"] == pytest.approx(direct["step_time_s"])


def test_max_batch_is_the_largest_that_stays_within_the_fraction():
  """Each record's max_batch: the largest multiple of X whose peak stays
  within hbm_fraction of the capacity, the same for every batch of its
  group, and what max_batch's own function gives on a direct trace; the
  next multiple would not fit. A fraction small enough makes it 0."""
  from meshes.layout import plan_mesh
  from meshes.topology import parse_topology
  from models.registry import load_model
  from simulator import memory
  from simulator.settings import TrainSettings
  fraction = 1e-4  # 9.5 MiB of v5p's 95 GiB: a few hundred tiny sequences
  spec = search.SweepSpec(model="tiny", topology="v5p-16", batches=(8, 16),
                          remats=("none",), seq=64, meshes=((4, 2),),
                          hbm_fraction=fraction)
  sweep = search.Sweep(spec)
  records = list(sweep.evaluate(spec.configs(sweep.topo)))
  best = {r["max_batch"] for r in records}
  assert len(best) == 1
  best = best.pop()
  assert best > 0 and best % 4 == 0
  plan = plan_mesh(parse_topology("v5p-16"), 4, 2)
  est = memory.memory_report(load_model("tiny"), TrainSettings(
      batch=8, seq=64, remat="none"), plan)
  cap = int(fraction * est.hbm_bytes)
  assert memory.largest_batch(est, cap, 4) == best
  assert est.at_batch(best).compiled_comparable_peak <= cap
  assert est.at_batch(best + 4).compiled_comparable_peak > cap
  none = search.Sweep(search.SweepSpec(
      model="tiny", topology="v5p-16", batches=(8,), remats=("none",),
      seq=64, meshes=((4, 2),), hbm_fraction=1e-9))
  assert none.evaluate_one(search.Config(4, 2, 8, "none", "zero3",
                                         "adamw"))["max_batch"] == 0
  with pytest.raises(ValueError, match=r"hbm_fraction=1.5 must be in \(0, 1\]"):
    search.SweepSpec(model="tiny", topology="v5p-16", batches=(8,),
                     hbm_fraction=1.5).validate()


def test_more_batch_means_more_activation_memory_and_remat_saves_it(swept):
  _, records = swept
  ok = {(r["X"], r["Y"], r["batch"], r["remat"]): r for r in records
        if r["status"] == "ok"}
  assert ok[(4, 2, 32, "none")]["memory"]["activations"] > \
      ok[(4, 2, 8, "none")]["memory"]["activations"]
  assert ok[(4, 2, 32, "full")]["memory"]["activations"] < \
      ok[(4, 2, 32, "none")]["memory"]["activations"]


def test_rank_puts_fitting_fastest_first_and_failures_last(swept):
  _, records = swept
  ranked = search.rank(records)
  statuses = [r["status"] for r in ranked]
  assert statuses.index("failed") > max(i for i, s in enumerate(statuses) if s == "ok")
  fitting = [r["tokens_per_s"] for r in ranked if r["status"] == "ok" and r["fits"]]
  assert fitting == sorted(fitting, reverse=True)
  text = search.recommendation(ranked)
  b = ranked[0]
  assert text.startswith(f"recommended: mesh {b['X']}x{b['Y']}")
  text = search.table(ranked)
  rows = [l for l in text.splitlines() if l.startswith("| ")]
  assert len(rows) == len(ranked) + 1  # the header, a row per config
  failed = [r for r in ranked if r.get("status") != "ok"]
  # each failure's reason is printed whole, once, under the table
  assert all(f"] {r['error']}" in text for r in failed)


def test_record_has_the_issue_fields(swept):
  _, records = swept
  r = next(x for x in records if x["status"] == "ok")
  for field in ("X", "Y", "batch", "remat", "shard", "optimizer", "peak_bytes",
                "fits", "step_time_s", "mfu", "compute_bound", "tokens_per_s"):
    assert field in r


def test_bad_spec_values_raise_before_tracing():
  for bad in (dict(model="nope"), dict(topology="v5p-7"), dict(batches=(0,)),
              dict(remats=("sometimes",)), dict(shards=("zero9",)),
              dict(meshes=((3, 3),))):
    spec = search.SweepSpec(**{**dict(model="tiny", topology="v5p-16",
                                      batches=(8,)), **bad})
    with pytest.raises(ValueError):
      spec.validate()


def test_a_value_given_twice_and_a_bad_pool_share_are_refused(monkeypatch):
  """A duplicate would be evaluated and recorded twice; on a GPU the
  allocator pool's share is read (and refused) before any run is made,
  and it keys the cache: records made at one share are not another's."""
  spec = search.SweepSpec(model="tiny", topology="h100:8", batches=(8, 16, 8))
  with pytest.raises(ValueError, match="batches: 8 is given twice"):
    spec.validate()
  spec = search.SweepSpec(model="tiny", topology="h100:8", batches=(8,))
  monkeypatch.setenv("XLA_PYTHON_CLIENT_MEM_FRACTION", "abc")
  with pytest.raises(ValueError, match="'abc' is not a number"):
    spec.validate()
  keys = []
  for share in ("0.75", "0.9"):
    monkeypatch.setenv("XLA_PYTHON_CLIENT_MEM_FRACTION", share)
    sweep = search.Sweep(spec)
    keys.append(sweep.cache_key(search.Config(8, 1, 8, "full", "zero3",
                                              "adamw"), "records"))
  assert keys[0] != keys[1]


def test_the_recommendation_names_what_x_does_and_the_precision():
  plan = dict(status="ok", fits=True, X=8, Y=1, batch=32, remat="full",
              shard="zero1", optimizer="adamw", peak_bytes=30 * search.GiB,
              hbm_bytes=95 * search.GiB, mfu=0.4, roofline_mfu=0.6,
              threshold_tokens_global=65536, tokens_per_s=900.0,
              compute_bound=True)
  text = search.recommendation([plan], precision="bf16")
  assert text.startswith("recommended: mesh 8x1 (X data-parallel, ZeRO-1, "
                         "Y tensor), batch 32, remat full, zero1, adamw, "
                         "bf16 precision: fits")
  assert "(X FSDP, Y tensor)" in search.recommendation(
      [dict(plan, shard="zero3")])
  assert "precision" not in search.recommendation([plan])


def test_nothing_fits_recommendation_names_the_smallest():
  r = dict(status="ok", fits=False, X=2, Y=4, batch=8, remat="full",
           peak_bytes=200 * search.GiB, hbm_bytes=95 * search.GiB)
  assert search.recommendation([r]).startswith("nothing fits")


def test_the_recommendation_says_what_binds_as_the_table_does():
  """A communication-bound best plan beside slower compute-bound plans that
  fit is not "no fitting plan is compute-bound"; a plan with no
  collectives is compute-bound at any batch; capacities to 0.1 GiB."""
  plan = dict(status="ok", fits=True, X=8, Y=1, batch=32, remat="full",
              shard="zero3", optimizer="adamw", peak_bytes=30 * search.GiB,
              hbm_bytes=int(59.33 * search.GiB), mfu=0.4, roofline_mfu=0.6,
              threshold_tokens_global=65536)
  best = dict(plan, tokens_per_s=900.0, compute_bound=False)
  slower = dict(plan, X=4, Y=2, tokens_per_s=800.0, compute_bound=True)
  text = search.recommendation([best, slower])
  assert "communication-bound (the compute-bound plans that fit are slower)" \
      in text and "fits at 30.0 of 59.3 GiB" in text
  alone = search.recommendation([best])
  assert "communication-bound (no fitting plan is compute-bound)" in alone
  one_gpu = dict(best, X=1, compute_bound=True, threshold_tokens_global=0)
  assert "no collectives: compute-bound at any batch" in (
      search.recommendation([one_gpu]))
  hbm_heavy = dict(best, t_math_s=0.087, exposed_comm_s=0.044, t_hbm_s=0.368,
                   t_matmul_hbm_s=0.116, step_time_s=0.615)
  assert ("HBM traffic (fusions' bytes, byte-bound matmuls) is the largest "
          "part of its step, 79%") in search.recommendation([hbm_heavy])
  assert "HBM traffic" not in alone


def test_a_plan_the_compiler_refutes_never_ranks_among_those_that_fit():
  """The estimate said it fits; compiling it for the topology said no (or
  ran out of memory): it ranks with the plans that do not fit."""
  from simulator import search
  ok = dict(status="ok", fits=True, peak_bytes=10, tokens_per_s=100.0)
  best = dict(ok, tokens_per_s=900.0, compiled_fits=False)
  oom = dict(ok, tokens_per_s=800.0,
             compile_error="XlaRuntimeError: RESOURCE_EXHAUSTED: Ran out of "
             "memory in memory space hbm")
  assert search.rank([best, oom, ok])[0] is ok
  assert search.refuted(best) and search.refuted(oom) and not search.refuted(ok)


def test_gradient_accumulation_sweeps_whole_micro_batches():
  """With --grad_accum=4 the sweep runs (its checks use a batch valid for
  the micro-batches) and a batch that is not whole micro-batches over X
  fails alone, naming grad_accum; a valid one matches memory_report."""
  from meshes.layout import plan_mesh
  from meshes.topology import parse_topology
  from models.registry import load_model
  from simulator import memory
  from simulator.settings import TrainSettings
  spec = search.SweepSpec(model="tiny", topology="v5p-8", batches=(4, 16),
                          seq=64, grad_accum=4, meshes=((2, 2),))
  sweep = search.Sweep(spec)
  records = {r["batch"]: r for r in sweep.evaluate(spec.configs(sweep.topo))}
  assert records[4]["status"] == "failed"
  assert "X=2 x grad_accum=4" in records[4]["error"]
  assert records[16]["status"] == "ok"
  direct = memory.memory_report(
      load_model("tiny"), TrainSettings(batch=16, seq=64, grad_accum=4),
      plan_mesh(parse_topology("v5p-8"), 2, 2))
  assert records[16]["peak_bytes"] == direct.per_device_bytes["peak"]


def test_replicas_are_swept_as_a_third_axis_and_match_a_direct_estimate():
  """--dps=1,2 on two slices: each X x Y mesh of D·X·Y = chips, never with
  pipeline stages; a replica plan's record is what memory_report and
  compute_bound give for it, its batch split over D x X."""
  from meshes.layout import plan_mesh
  from meshes.topology import parse_topology
  from models.registry import load_model
  from simulator import memory
  from simulator.settings import TrainSettings
  from simulator.timing import roofline
  spec = search.SweepSpec(model="tiny", topology="v5e-16x2", batches=(32,),
                          seq=64, pps=(1, 2), dps=(1, 2),
                          meshes=((16, 1),))
  sweep = search.Sweep(spec)
  configs = spec.configs(sweep.topo)
  assert {(c.X, c.P, c.D) for c in configs} == {(16, 1, 2), (16, 2, 1)}
  r = next(sweep.evaluate(c for c in configs if c.D == 2))
  assert (r["D"], search.record_mesh(r), r["status"]) == (2, "D2x16x1", "ok")
  plan = plan_mesh(parse_topology("v5e-16x2"), 16, 1, D=2)
  settings = TrainSettings(batch=32, seq=64)
  est = memory.memory_report(load_model("tiny"), settings, plan)
  assert r["peak_bytes"] == est.per_device_bytes["peak"]
  step = roofline.step_estimate(
      roofline.fit_mesh(load_model("tiny"), settings, plan), 32 * 64,
      roofline.Hardware.for_plan(plan))
  assert r["step_time_s"] == pytest.approx(step.step_time)
  odd = next(sweep.evaluate([search.Config(16, 1, 16, "full", "zero3",
                                           "adamw", 1, 2)]))
  assert "not divisible by D x X=32" in odd["error"]
  with pytest.raises(ValueError, match="dp 3 must be a positive divisor"):
    search.SweepSpec(model="tiny", topology="v5e-16x2", batches=(32,),
                     dps=(3,)).validate()
