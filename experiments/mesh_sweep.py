"""FSDP x TP mesh study: every X x Y of a slice, crossed with batch, remat, shard and
optimizer; ranked; top-k confirmed by compiling for the real topology (libtpu).

  python -m experiments.mesh_sweep                      # xxl_ffn on v5p-128
  python -m experiments.mesh_sweep --model=llama2_70b --topology=v5p-256 --logdir=runs
  python -m experiments.mesh_sweep ... --resume         # continue the latest run

The bare command sweeps seed 004's XXL FFN stack (220B params, two linears per
block) on v5p-128 (64 chips) at 256-token sequences and 32..512 sequences per
step: it is the model the seed works by hand, so the table can be held against
its numbers (FSDP alone is comm-bound below ~25k tokens; the optimum puts Y ≈ 8);
its model state (f32 params, grads, AdamW moments: 16 bytes a parameter) alone
is 51.2 GiB per chip, so HBM binds as well; and the batch range spans the
compute-bound threshold, so the MFU heatmap shows the crossover.

Outputs, in a new folder LOGDIR/RUN (RUN-2, ... if it exists): results.jsonl, and
TensorBoard events (hparams sessions, scalars over batch per mesh, the ranked table
as text, memory-breakdown and MFU-heatmap images). Logic lives in simulator.search,
experiments.results and experiments.tensorboard_writer.
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import fcntl
import glob
import json
import os
import sys

from absl import flags

from experiments import cli
from models.remat import CHECKPOINT_NAMES
from simulator import settings as S

FLAGS = flags.FLAGS


def _default_cache() -> str:
  from simulator.cache import default_dir
  return default_dir()


def define_flags() -> None:
  cli.define_model_flags()
  FLAGS.set_default("model", "xxl_ffn")
  FLAGS.set_default("topology", "v5p-128")
  flags.DEFINE_string("logdir", "runs", "where run folders go")
  flags.DEFINE_string("run_name", None, "run folder name; default MODEL-TOPOLOGY")
  flags.register_validator(
      "run_name", lambda v: v is None or (
          v.strip(". ") != "" and os.sep not in v and "/" not in v),
      "must be a plain folder name (no path separators, not '.' or '..'): "
      "runs go under --logdir")
  flags.DEFINE_list("batches", ["32", "64", "128", "256", "512"],
                    "global batch sizes in sequences")
  flags.DEFINE_integer("seq", 256, "sequence length in tokens (an "
                       "encoder-decoder's encoder length)")
  cli.define_target_seq_flag()
  flags.DEFINE_list("remats", ["full"], f"remat policies ({S.REMAT_HELP}); "
                    "names:qkv,mlp_in keeps its commas")
  flags.DEFINE_list("shards", ["zero3"], f"sharding choices: {', '.join(S.SHARDS)}")
  flags.DEFINE_list("optimizers", ["adamw"], f"optimizers: {', '.join(S.OPTIMIZERS)}")
  flags.DEFINE_enum("attention", "flash", list(S.ATTENTIONS), "attention kernel")
  flags.DEFINE_enum("precision", "mixed", list(S.PRECISIONS), "precision")
  cli.define_moe_flags()
  cli.define_finetune_flags()
  cli.define_vision_flags()
  flags.DEFINE_list("pps", ["1"], "pipeline stages to sweep (a mesh axis P "
                    "outermost, P x X x Y = chips; models.pipeline)")
  flags.DEFINE_list("dps", ["1"], "data-parallel replicas to sweep (a mesh "
                    "axis D outermost, D x X x Y = chips: the batch over D x "
                    "X, the weights over X alone; each with pp = 1)")
  flags.DEFINE_integer("microbatches", 1, "with pp > 1: micro-batches of "
                       "batch/microbatches sequences through the stages")
  flags.DEFINE_enum("schedule", "gpipe", list(S.SCHEDULES), "with pp > 1: "
                    "gpipe or 1f1b")
  cli.define_hbm_fraction_flag()
  flags.DEFINE_integer("top_k", 3, "confirm this many best plans by compiling; 0: none")
  flags.DEFINE_bool("resume", False, "continue the latest LOGDIR/RUN* folder")
  flags.DEFINE_bool("progress", True, "progress bars on stderr")
  flags.DEFINE_string("cache_dir", _default_cache(), "persistent cache of "
                      "evaluated configs, the groups' traces as data and "
                      "compile confirmations (a repeated sweep or "
                      "confirmation returns from it); '' disables")
  cli.define_worker_flags()
  flags.DEFINE_integer("trace_workers", 0, "processes evaluating the configs "
                       "not in the cache, this one and helpers, each taking "
                       "whole (remat, shard, optimizer) groups; 0: one per "
                       "core, at most 8; 1: this process alone")


def join_remats(items: list[str]) -> tuple[str, ...]:
  """Re-joins names:a,b (and names:a,b+offload:c,d) that the list flag
  split at its commas."""
  out: list[str] = []
  for item in (i.strip() for i in items if i.strip()):
    if (item.split("+", 1)[0] in CHECKPOINT_NAMES and out
        and out[-1].startswith(("names:", "offload:"))):
      out[-1] += "," + item
    else:
      out.append(item)
  return tuple(out)


def int_list(name: str, items: list[str]) -> tuple[int, ...]:
  """A list flag's values as integers, or a ValueError naming the flag."""
  try:
    return tuple(int(i) for i in items)
  except ValueError:
    raise ValueError(f"--{name}={','.join(items)}: every value must be an integer")


def spec_from_flags():
  from meshes.layout import parse_mesh
  from simulator.search import SweepSpec
  cli.check_lora_flags()
  return SweepSpec(
      model=FLAGS.model, topology=FLAGS.topology,
      batches=int_list("batches", FLAGS.batches), remats=join_remats(FLAGS.remats),
      shards=tuple(FLAGS.shards), optimizers=tuple(FLAGS.optimizers),
      seq=FLAGS.seq, target_seq=FLAGS.target_seq, attention=FLAGS.attention, precision=FLAGS.precision,
      meshes=(parse_mesh(FLAGS.mesh),) if FLAGS.mesh else None,
      grad_accum=FLAGS.grad_accum, lora_rank=FLAGS.lora_rank,
      lora_targets=tuple(FLAGS.lora_targets), base_quant=FLAGS.base_quant,
      offload=tuple(FLAGS.offload), moe_dispatch=FLAGS.moe_dispatch,
      capacity_factor=FLAGS.capacity_factor, expert_axis=FLAGS.expert_axis,
      images_per_sample=FLAGS.images_per_sample, image_size=FLAGS.image_size,
      patch_size=FLAGS.patch_size, train_vision=FLAGS.train_vision,
      vision_sharding=FLAGS.vision_sharding,
      pps=int_list("pps", FLAGS.pps), dps=int_list("dps", FLAGS.dps),
      microbatches=FLAGS.microbatches,
      schedule=FLAGS.schedule, hbm_fraction=FLAGS.hbm_fraction)


def run_dir_for(logdir: str, name: str, resume: bool) -> str:
  from experiments.tensorboard_writer import new_run_dir
  if not resume:
    try:
      return new_run_dir(logdir, name)
    except OSError as e:  # nothing is written yet: name the flag
      if e.errno == errno.ENAMETOOLONG and len(name.encode()) > 255:
        raise ValueError(f"--run_name={name!r}: too long for a folder name "
                         f"under --logdir={logdir}; give a shorter one"
                         ) from None
      raise ValueError(f"--logdir={logdir}: {e.strerror or e} "
                       f"({e.filename}); give a folder a run can be made "
                       "in") from None
  found = [d for d in glob.glob(os.path.join(logdir, glob.escape(name) + "*"))
           if os.path.isdir(d) and (os.path.basename(d) == name or (
               os.path.basename(d)[len(name):len(name) + 1] == "-"
               and os.path.basename(d)[len(name) + 1:].isdigit()))]
  if not found:
    raise ValueError(f"--resume: no run {name!r} under {logdir!r} to continue")
  return max(found, key=os.path.getmtime)


RUN_SETTINGS = "run.json"  # what a run's results depend on, for --resume
_POOL = "memory_fraction"  # run.json's key for a GPU's allocator pool share
_IDENTITY = ("model", "topology", "seq", "target_seq", "attention",
             "precision", "grad_accum", "lora_rank", "lora_targets",
             "base_quant", "offload", "moe_dispatch", "capacity_factor",
             "expert_axis", "images_per_sample", "image_size", "patch_size",
             "train_vision", "vision_sharding",
             "microbatches", "schedule", "hbm_fraction")


def check_run_settings(run_dir: str, spec) -> None:
  """A new run records the settings its results depend on; a resumed one
  must have the same, or its old results would be reported as the new."""
  from meshes.topology import parse_topology
  from simulator.memory import capacity
  from simulator.search import SweepSpec
  path = os.path.join(run_dir, RUN_SETTINGS)
  as_json = lambda d: json.loads(json.dumps(d))  # tuples as lists
  mine = as_json({k: getattr(spec, k) for k in _IDENTITY})
  defaults = as_json({f.name: f.default for f in dataclasses.fields(SweepSpec)
                      if f.name in _IDENTITY
                      and f.default is not dataclasses.MISSING})
  # On a GPU what fits turns on the allocator pool's share of the device
  # (capacity.mem_fraction); a run from before it was recorded ran
  # at JAX's default.
  topology = parse_topology(spec.topology)
  mine[_POOL] = capacity.pool_share(topology)
  defaults[_POOL] = (capacity.DEFAULT_FRACTION if mine[_POOL] is not None
                     else None)
  if not os.path.exists(path):
    from experiments.results import FILENAME
    results = os.path.join(run_dir, FILENAME)
    if os.path.exists(results) and os.path.getsize(results):
      raise ValueError(f"--resume: {run_dir} holds results but no "
                       f"{RUN_SETTINGS} (the settings they were made with); "
                       "start a new run (without --resume)")
    cli.write_whole(path, json.dumps(mine, indent=1))
    return
  try:
    with open(path) as f:
      theirs = json.load(f)
  except json.JSONDecodeError as e:
    raise ValueError(f"--resume: {path} is not the JSON a run writes ({e}); "
                     "start a new run (without --resume)") from None
  if not isinstance(theirs, dict):
    raise ValueError(f"--resume: {path} is not the JSON a run writes (a "
                     f"{type(theirs).__name__}); start a new run (without "
                     "--resume)")
  for k in (*_IDENTITY, _POOL):  # from before a setting existed: its default
    if theirs.get(k, defaults.get(k)) != mine[k]:
      what = ("the pool share (XLA_CLIENT_MEM_FRACTION)" if k == _POOL
              else f"--{k}")
      raise ValueError(
          f"--resume: {run_dir} was made with {what}="
          f"{theirs.get(k, defaults.get(k))}, this command has {what}="
          f"{mine[k]}; resume with the same value or start a new run "
          "(without --resume)")


@contextlib.contextmanager
def run_lock(run_dir: str):
  """One sweep writes a run at a time (two resumes would both evaluate
  every remaining config)."""
  with open(os.path.join(run_dir, ".lock"), "w") as f:
    try:
      fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
      raise ValueError(f"{run_dir} is being written by another mesh_sweep; "
                       "wait for it to finish or use another --run_name"
                       ) from None
    yield


@dataclasses.dataclass(frozen=True)
class SweepRun:
  run_dir: str
  results_path: str
  tensorboard_dir: str
  ranked: list  # result records, best first (search.rank)
  recommendation: str

  def to_json(self) -> dict:
    return {"run_dir": self.run_dir, "results": self.results_path,
            "tensorboard": self.tensorboard_dir,
            "recommendation": self.recommendation, "ranked": self.ranked}


def run_sweep(spec, logdir: str, run_name: str | None = None, resume: bool = False,
              top_k: int = 3, progress: bool = True, out=sys.stdout,
              cache_dir: str | None = None, workers: int = 1,
              ray_address: str | None = None,
              trace_workers: int = 1) -> SweepRun:
  """The whole study. Validates before any work; one process per run.
  cache_dir: the persistent cache (simulator.cache; None or "": none);
  workers, ray_address: where confirmations compile (simulator.workers);
  trace_workers: processes evaluating (simulator.sweep_workers; 0: one per
  core, at most 8)."""
  if top_k < 0:
    raise ValueError(f"--top_k={top_k} must be >= 0")
  if workers < 1:
    raise ValueError(f"--workers={workers} must be >= 1")
  from simulator.sweep_workers import check_trace_workers
  trace_workers = check_trace_workers(trace_workers)
  cfg, topo = spec.validate()
  # named by the model's own name: a config.json's path stays out of it
  run_dir = run_dir_for(logdir, run_name or f"{cfg.name}-{spec.topology}",
                        resume)
  with run_lock(run_dir):
    check_run_settings(run_dir, spec)
    try:
      return _sweep(spec, cfg, topo, run_dir, logdir, top_k, progress, out,
                    cache_dir, workers, ray_address, trace_workers)
    except KeyboardInterrupt:
      from experiments.results import FILENAME
      results = os.path.join(run_dir, FILENAME)
      kept = (f"the results so far are kept in {results}"
              if os.path.exists(results) and os.path.getsize(results)
              else f"no config had finished ({run_dir} holds its settings)")
      print(f"\ninterrupted: {kept}; the same command with --resume "
            "continues the run", file=sys.stderr)
      sys.exit(130)


def _pending(ranked: list, top_k: int, in_flight) -> list:
  return [r for r in ranked[:top_k] if r.get("status") == "ok"
          and "compiled_peak_bytes" not in r and "compile_error" not in r
          and not any(r is f for f in in_flight)]


def _confirm(sweep, ranked: list, top_k: int, workers: int, results,
             progress: bool, out, ray_address: str | None = None) -> list:
  """Compile the best top_k plans for the topology, `workers` at a time
  (here or on Ray); a plan the compiler refutes drops and the next is
  confirmed. Each result is appended as it finishes (a resumed run keeps
  it) and kept in the cache."""
  import concurrent.futures as cf
  from tqdm import tqdm
  from simulator import search
  from simulator.workers import Pool

  for r in _pending(ranked, top_k, ()):  # compiled before: no compile
    hit = search.cached_confirmation(sweep, r)
    if hit is not None:
      r.update(hit)
      results.update([r])
  ranked = search.rank(ranked)
  todo = _pending(ranked, top_k, ())
  if not todo:
    return ranked
  each = search.expected_compile_s(sweep)
  when = (f"about {each:.0f} s each on this machine (its median so far)"
          if each else "no compile history here yet; a 7B-70B plan takes "
          "about a minute on 2 idle cores")
  pool = Pool(workers, ray_address)
  print(f"compiling {len(todo)} plan{'s' if len(todo) > 1 else ''} for "
        f"{sweep.topo.name} to confirm {'them' if len(todo) > 1 else 'it'} "
        f"({pool.where}): {when}; --top_k=0 skips this", file=out, flush=True)
  bar = tqdm(desc="compile", disable=not progress, file=sys.stderr)

  def submit(r: dict) -> cf.Future:
    bar.set_description(f"compile {search.record_mesh(r)} b{r['batch']} "
                        f"{r['remat']}" + (f" (~{each:.0f} s)" if each else ""))
    return pool.submit(search.run_compile_job, *search.compile_job(sweep, r))

  in_flight: dict = {}
  try:
    while True:
      for r in _pending(ranked, top_k, in_flight.values())[
          :workers - len(in_flight)]:
        in_flight[submit(r)] = r
      if not in_flight:
        break
      finished, _ = cf.wait(in_flight, return_when=cf.FIRST_COMPLETED)
      for future in finished:
        _keep(sweep, in_flight.pop(future), future.result(), results, bar)
      ranked = search.rank(ranked)
  finally:
    pool.close()
    bar.close()
  return ranked


def _keep(sweep, record: dict, result: dict, results, bar) -> None:
  from simulator import search
  search.keep_confirmation(sweep, record, result)
  record.update(result)
  results.update([record])
  bar.update()


def _sweep(spec, cfg, topo, run_dir: str, logdir: str, top_k: int,
           progress: bool, out, cache_dir: str | None = None,
           workers: int = 1, ray_address: str | None = None,
           trace_workers: int = 1) -> SweepRun:
  from tqdm import tqdm
  from experiments import tensorboard_writer as tbw
  from experiments.results import FILENAME, ResultsFile
  from experiments.sweep_plots import Painters
  from simulator import search
  from simulator.cache import Cache
  from simulator.timing.roofline import step_time_caveat

  results = ResultsFile(os.path.join(run_dir, FILENAME), search.record_key)
  done = results.done()
  sweep = search.Sweep(spec, cfg, topo, Cache(cache_dir),
                       workers=trace_workers)
  todo = [c for c in spec.configs(topo) if c.key not in done]
  precision = ("" if spec.precision == "mixed"
               else f", {spec.precision} precision")
  print(f"{topo.describe()}; {cfg.name}{precision}; {len(todo)} "
        f"config{'' if len(todo) == 1 else 's'} to evaluate"
        f" ({len(done)} already in {results.path})", file=out)
  painters = None  # started once the sweep traces: it has seconds to go
  try:
    for record in tqdm(sweep.evaluate(todo), total=len(todo), desc="sweep",
                       disable=not progress, file=sys.stderr):
      results.append(record)
      if painters is None and sweep.traces:
        painters = Painters()
    results.sync()
    if todo:
      print(f"evaluated: {sweep.records_cached} of {len(todo)} records from "
            f"the cache; {sweep.groups_cached} groups' traces read from it as"
            f" data; {sweep.traces} traces, {sweep.read_off} more meshes "
            "read off their class's trace", file=out)

    # In the configs' order, however they were evaluated (helpers finish
    # groups out of order): ties rank the same in every run.
    order = {c.key: i for i, c in enumerate(spec.configs(topo))}
    records = sorted((r for r in results.load()
                      if search.record_key(r) in order),
                     key=lambda r: order[search.record_key(r)])
    ranked = search.rank(records)
    ranked = _confirm(sweep, ranked, top_k, workers, results, progress, out,
                      ray_address)
    text = search.table(ranked)
    why = search.recommendation(ranked, spec.hbm_fraction, spec.precision)
    print(text, file=out)
    if topo.hosts > 1:
      print(_crossing(topo, ranked), file=out)
    caveat = step_time_caveat(topo.chip.name)
    if caveat:
      print(f"note: {caveat}", file=out)
    print(why, file=out)
    tb_dir = tbw.write_sweep(run_dir, ranked, text, why, topo.chip.hbm_bytes,
                             sweep.cache, painters)
  finally:
    if painters is not None:
      painters.close()
  print(f"results: {results.path}\ntensorboard: {tb_dir} "
        f"(tensorboard --logdir {tb_dir})", file=out)
  return SweepRun(run_dir, results.path, tb_dir, ranked, why)


def _crossing(topo, ranked: list) -> str:
  """Which axis of each mesh in the table crosses the hosts (slices)."""
  from meshes.layout import crossing_line, mesh_name, plan_mesh
  meshes = dict.fromkeys((r["X"], r["Y"], r.get("P", 1), r.get("D", 1))
                         for r in ranked if r.get("status") == "ok")
  return crossing_line(topo, [
      (mesh_name(x, y, p, d), plan_mesh(topo, x, y, P=p, D=d).crossing())
      for x, y, p, d in meshes])


def main(argv) -> None:
  del argv
  spec = spec_from_flags()
  common = dict(cache_dir=FLAGS.cache_dir, workers=FLAGS.workers,
                ray_address=FLAGS.ray_address,
                trace_workers=FLAGS.trace_workers)
  if FLAGS.format == "json":
    import io
    run = run_sweep(spec, FLAGS.logdir, FLAGS.run_name, FLAGS.resume,
                    FLAGS.top_k, FLAGS.progress, out=io.StringIO(), **common)
    print(json.dumps(run.to_json(), default=str))
  else:
    run = run_sweep(spec, FLAGS.logdir, FLAGS.run_name, FLAGS.resume,
                    FLAGS.top_k, FLAGS.progress, **common)
  failed = [r for r in run.ranked if r.get("status") == "failed"]
  if failed and len(failed) == len(run.ranked):  # nothing to choose from
    from meshes.topology import parse_topology
    from simulator import search
    replicas = search.replicas_that_lay_out(spec)
    chips = parse_topology(spec.topology).chips
    cli.fail(f"no config could be evaluated ({len(failed)} failed; each "
             f"one's error is in {run.results_path}); the first: "
             f"{failed[0].get('error')}" + (
                 f"; with data-parallel replicas outermost (D x X x Y = "
                 f"{chips}) plans lay out at --dps="
                 + ",".join(map(str, replicas)) if replicas else ""))


if __name__ == "__main__":
  define_flags()
  cli.run(main)
