"""Serving with a KV cache: memory and time of prefill and decode per device.

  python -m experiments.inference_report --model=llama2_7b --topology=v5p-8 \
      --mesh=4x1 --batch=16 --prompt=1024 --generate=256 [--kv_dtype=int8] \
      [--attention=flash] [--images_per_sample=N --image_size=PX
      --patch_size=PX] [--compile [--keep=FILE [--part=NAME]]] [--format=json]
  python -m experiments.inference_report \
      --recheck=experiments/data/inference_compiled_gpu.jsonl [--format=json]

Both steps are the training code's Decoder run with a KV cache
(simulator.serve_step; an encoder-decoder's prefill encodes the prompt once
and caches each decoder layer's cross-attention k and v of it, its decode
steps run the decoder alone; a vision-language model's prefill runs its
vision tower on the images and the LM over [image tokens; prompt], its
decode steps the LM alone), traced under the abstract mesh: weights and the
cache per device, each step's peak from the live-range model
(simulator.memory.liveness), decode and prefill times from a roofline,
throughput at the batch, the verdict (simulator.inference). --compile also
compiles both steps for --topology and prints XLA's peaks beside them.
Text in GiB (2**30 bytes); JSON: simulator.inference.to_json, and with
--compile `compiled` (memory_analysis per step) and `compare`. --keep adds
the plan and its compiled steps to a file of kept compiles; --recheck
sets today's estimate against each row of one (simulator.inference.recheck,
as tests/test_inference.py does): each step's peak error, and per part the
median |error|, the range and the steps within 5%.
"""

from __future__ import annotations

import dataclasses
import json
import os
import statistics
import sys

from absl import flags

from experiments import cli
from meshes.hardware import GiB
from models.vision import image_tokens
from simulator import inference, settings as S
from simulator.serve_step import serve_config
from simulator.step import kv_heads_note

FLAGS = flags.FLAGS
cli.define_model_flags()
_D = S.ServeSettings()
flags.DEFINE_integer("batch", _D.batch, "sequences served at once (global)")
flags.DEFINE_integer("prompt", _D.prompt, "prompt tokens per sequence")
flags.DEFINE_integer("generate", _D.generate, "tokens generated per sequence")
flags.DEFINE_enum("kv_dtype", _D.kv_dtype, list(S.KV_DTYPES),
                  "KV cache dtype (int8: a bf16 scale per token per kv head)")
flags.DEFINE_enum("attention", _D.attention, list(S.ATTENTIONS),
                  "the prefill's attention kernel")
cli.define_image_flags()
flags.DEFINE_bool("compile", False, "compile both steps for --topology and "
                  "compare XLA's peaks")
flags.DEFINE_string("keep", None, "with --compile: keep the plan's compiled "
                    "steps as a row of this JSON-lines file (a row for the "
                    "same plan is replaced; XLA_FLAGS, where set, recorded "
                    "with it), as experiments/data/inference_compiled*.jsonl"
                    " are")
flags.DEFINE_string("part", None, "with --keep: the row's part (the GPU "
                    "file's gpu / gpu-check)")
flags.DEFINE_string("recheck", None, "instead of one plan: today's estimate "
                    "against every compile kept in this file (--keep's rows), "
                    "each step's error and a summary per part")


def render(e: inference.InferenceEstimate, cfg, comparison: dict | None
           ) -> str:
  s, hbm = e.serve, e.hbm_bytes
  # A GPU's steps use JAX's allocator pool (simulator.memory.capacity).
  usable = ("usable by XLA per GPU" if e.plan.topology.chip.kind == "gpu"
            else "HBM per chip")
  g = lambda n: f"{n / GiB:.3f} GiB"
  cfg = serve_config(cfg, s)
  images = image_tokens(cfg, s.images)
  positions = (f"prompt {s.prompt} (encoded once, cross-attention cache) "
               f"+ generate {s.generate} (decoder cache)"
               if cfg.encoder_decoder else
               f"{s.images} image(s) x ({cfg.image_size}/{cfg.patch_size})^2"
               f" = {images} image tokens + prompt {s.prompt} + generate "
               f"{s.generate} = {images + s.length} cache positions"
               if cfg.vision else
               f"prompt {s.prompt} + generate {s.generate} = {s.length} "
               "cache positions")
  lines = [f"{e.model}: batch {s.batch}, {positions}, kv {s.kv_dtype}, "
           f"prefill attention {s.attention}", e.plan.describe()]
  if e.kv_heads_replicated:
    lines.append(kv_heads_note(cfg, e.plan.Y, training=False))
  if cfg.positions == "rope" and images + s.length > cfg.max_len:
    lines.append(f"note: {images + s.length} positions, past the "
                 f"{cfg.max_len} {cfg.name} was trained at (rotary positions "
                 "run past it: memory and time are these; whether it "
                 "generates well there is not this report's to say)")
  lines += ["", f"weights (bf16)      {g(e.weights_bytes)} per device",
            f"KV cache (full)     {g(e.kv_cache_bytes)} per device", ""]
  for name, p in e.phases.items():
    lines.append(f"{name:<8} peak {g(p.peak_bytes)} ({100 * p.peak_bytes / hbm:.1f}% "
                 f"of {usable}) at {p.peak_where}")
    lines.append(f"         per device {p.flops / 1e12:.3f} TFLOP, "
                 f"{g(p.hbm_bytes)} read, {g(p.comm_bytes)} in collectives: "
                 f"T_math {1e3 * p.t_math:.3f} ms, T_hbm "
                 f"{1e3 * p.t_hbm:.3f} ms, T_comm {1e3 * p.t_comm:.3f} ms "
                 f"-> max(T_math, T_hbm) + T_comm = {1e3 * p.seconds:.3f} ms "
                 f"({p.bound}-bound)")
    if comparison and name in comparison:
      c = comparison[name]
      lines.append(f"         XLA's peak {g(c['xla_peak_bytes'])}: error "
                   f"{100 * c['peak_error']:+.2f}%" + (
                       f" (compiled with {c['workaround']}: XLA:GPU's Triton "
                       "GEMM emitter found no tiling, cuBLAS GEMMs instead)"
                       if c.get("workaround") else ""))
      coll = c["collectives"]
      if coll["hlo_bytes"] or coll["symbolic_bytes"]:
        kinds = lambda d: ", ".join(f"{k} {g(v)}" for k, v in d.items())
        lines.append(f"         collectives, traced: {kinds(coll['symbolic'])}"
                     f"; XLA's HLO: {kinds(coll['hlo'])}")
  verdict = "fits" if e.fits else "does NOT fit"
  lines += ["", f"decode: {e.decode_tokens_per_s:,.0f} tokens/s at batch "
            f"{s.batch}; end to end {e.tokens_per_s:,.0f} generated tokens/s"
            f" ({e.total_seconds:.3f} s for prefill + {s.generate} decode "
            f"step{'s' if s.generate != 1 else ''})",
            f"{usable} {hbm / GiB:.2f} GiB: {verdict} (peak "
            f"{g(e.peak_bytes)}, {g(e.planned_bytes)} with the "
            f"{inference.OVERHEAD_FRACTION:.0%} planning overhead)"]
  return "\n".join(lines)


def _stderr(message: str) -> None:
  print(message, file=sys.stderr, flush=True)


def _keep(path: str, row: dict) -> None:
  """The row written into `path` in place of one for the same plan: the
  file rewritten whole and moved over the old (experiments.results)."""
  from experiments.results import ResultsFile
  plan = lambda r: json.dumps([r["model"], r["topology"], r["mesh"],
                               r["serve"], r.get("part")], sort_keys=True)
  ResultsFile(path, plan).update([row])


def render_recheck(results: list[dict]) -> str:
  """Each kept plan's peak errors, prefill / decode, and per part: the
  median |error|, the range, the steps within 5%, the arguments exact."""
  pct = lambda x: f"{100 * x:+.2f}%"
  lines, parts = [], {}
  for r in results:
    s, errors = r["serve"], r["peak_error"]
    lines.append(f"{r['part'] or '-'}  {r['model']} {r['topology']} "
                 f"{r['mesh'][0]}x{r['mesh'][1]} b{s['batch']} "
                 f"{s['prompt']}+{s['generate']} {s['kv_dtype']}: "
                 + " / ".join(f"{p} {pct(errors[p])}" for p in inference.PHASES
                              if p in errors))
    steps = parts.setdefault(r["part"] or "-", [[], 0])
    steps[0] += errors.values()
    steps[1] += sum(x == 0 for x in r["argument_error"].values())
  lines.append("")
  for part, (errors, exact) in parts.items():
    lines.append(
        f"{part}: {len(errors)} steps, median |error| "
        f"{100 * statistics.median(map(abs, errors)):.2f}%, from "
        f"{pct(min(errors))} to {pct(max(errors))}, "
        f"{sum(abs(x) <= 0.05 for x in errors)} within 5%; arguments exact "
        f"in {exact}")
  return "\n".join(lines)


# The flags that describe one plan, which --recheck (every kept plan) does
# not take.
_PLAN_FLAGS = ("model", "topology", "mesh", "batch", "prompt", "generate",
               "kv_dtype", "attention", "images_per_sample", "image_size",
               "patch_size", "maxtext", "keep", "part")


def main(argv) -> None:
  del argv
  if FLAGS.recheck is not None:
    if FLAGS.compile:
      cli.fail(f"--recheck={FLAGS.recheck!r} re-checks kept compiles; drop "
               "--compile (or --recheck)")
    plan_flags = [f"--{name}" for name in _PLAN_FLAGS
                  if name in FLAGS and FLAGS[name].present]
    if plan_flags:
      cli.fail(f"--recheck re-checks every plan its file keeps; drop "
               f"{', '.join(plan_flags)} (a plan's flags)")
    rows = cli.read_kept_rows(
        FLAGS.recheck, "recheck", "a file of inference_report --keep rows",
        keys=("model", "topology", "mesh", "serve", "compiled"))
    try:
      results = inference.recheck(rows)
    except ValueError as e:
      raise ValueError(f"--recheck={FLAGS.recheck}: {e}") from None
    print(json.dumps(results, indent=1) if FLAGS.format == "json"
          else render_recheck(results))
    return
  if FLAGS.keep is not None and not FLAGS.compile:
    cli.fail(f"--keep={FLAGS.keep!r} keeps compiled steps; add --compile")
  if FLAGS.part is not None and FLAGS.keep is None:
    cli.fail(f"--part={FLAGS.part!r} names a kept row's part; add --keep")
  cli.check_folder("keep", FLAGS.keep)
  cfg, plan = cli.model_and_plan()
  serve = S.ServeSettings(FLAGS.batch, FLAGS.prompt, FLAGS.generate,
                          FLAGS.kv_dtype, FLAGS.attention,
                          FLAGS.images_per_sample, FLAGS.image_size,
                          FLAGS.patch_size)
  estimate = inference.inference_report(cfg, serve, plan)
  compiled = comparison = None
  if FLAGS.compile:
    import jax  # the compiler's errors: loaded with the serving steps
    try:
      compiled = inference.compile_serve(cfg, serve, plan.topology.name,
                                         plan.X, plan.Y, progress=_stderr)
    except jax.errors.JaxRuntimeError as e:
      cli.compiler_failed(e, plan.topology.name)
    comparison = inference.compare(estimate, compiled)
    if FLAGS.keep is not None:
      row = {"model": FLAGS.model, "topology": plan.topology.name,
             "mesh": [plan.X, plan.Y], "serve": dataclasses.asdict(serve),
             "compiled": compiled}
      if FLAGS.part:
        row["part"] = FLAGS.part
      if os.environ.get("XLA_FLAGS"):  # what the compiler was told
        row["xla_flags"] = os.environ["XLA_FLAGS"]
      _keep(FLAGS.keep, row)
  if FLAGS.format == "json":
    out = inference.to_json(estimate)
    if compiled:
      out |= {"compiled": compiled, "compare": comparison}
    print(json.dumps(out, indent=1))
  else:
    print(render(estimate, cfg, comparison))


if __name__ == "__main__":
  cli.run(main)
