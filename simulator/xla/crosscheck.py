"""Symbolic memory and collectives beside the compiler's: one config compiled
now (`validate`), or a kept corpus row re-checked without compiling
(`recheck`: the compiled side is data, the symbolic side is recomputed)."""

from __future__ import annotations

import dataclasses
import re
import time
from typing import Any, Callable

from meshes.layout import abstract_mesh, mesh_name, parse_mesh_name, plan_mesh
from meshes.topology import parse_topology
from models.config import ModelConfig
from models.registry import load_model
from simulator.xla import compiled
from simulator import memory
from simulator.settings import TrainSettings, settings_from
from simulator.tracing.fingerprint import program_fingerprint
from simulator.tracing.program import read_for_plan
from simulator.tracing.trace import trace


def _symbolic(cfg: ModelConfig, settings: TrainSettings, topology: str, x: int,
              y: int, d: int = 1):
  """The memory estimate, the traced program (its collectives and
  matmuls) at the config's own batch and the trace it was read off. Under
  `--schedule=1f1b` the estimate is the traced GPipe program's: that is
  the program XLA compiles, and the 1F1B rule (simulator.memory.schedule)
  says what a 1F1B runtime would hold instead, which no compile shows
  (llama2_7b v5p-32 4x2 pp=2 b256 M=8, #131:
  XLA holds all nine iterations' stage activations, bf16[9,16,1,8,2048,2048],
  where the rule keeps two)."""
  plan = plan_mesh(parse_topology(topology), x, y, P=settings.pp, D=d)
  estimate = memory.memory_report(
      cfg, dataclasses.replace(settings, schedule="gpipe"), plan)
  traced = trace(cfg, settings, abstract_mesh(plan))
  return estimate, read_for_plan(traced, plan), traced


def validate(cfg: ModelConfig, settings: TrainSettings, topology: str, x: int,
             y: int, target: str | None = None, execute_steps: int = 0,
             progress: Callable[[str], None] | None = None,
             dump_dir: str | None = None, d: int = 1,
             dump_passes: str = "^$", scheduler: str = "default"
             ) -> dict[str, Any]:
  """Compile the step for `target` (default: the TPU `topology`) and compare;
  `d` data-parallel replicas outermost (meshes.layout); the compiler's dumps
  kept in `dump_dir`, with the module before and after each pass
  `dump_passes` matches; on a TPU libtpu's memory scheduler `scheduler`."""
  estimate, program, _ = _symbolic(cfg, settings, topology, x, y, d)
  kwargs = {} if progress is None else {"progress": progress}
  rep = compiled.compile_report(cfg, settings, target or topology, x, y,
                                execute_steps=execute_steps, dump_dir=dump_dir,
                                dump_passes=dump_passes, D=d,
                                scheduler=scheduler, **kwargs)
  out = compiled.compare(estimate, rep)
  out["collectives"] = compiled.compare_collectives(
      program.made(), rep.collective_summary())
  target = target or topology
  out["flops"] = compiled.compare_flops(
      program.dots, _comparable_cost(rep.flops, target))
  out["hbm_bytes"] = compiled.compare_hbm_bytes(
      program, _comparable_cost(rep.bytes_accessed, target))
  out["config"] = {"model": cfg.name, "topology": topology,
                   "mesh": mesh_name(x, y, D=d),
                   "target": target,
                   **dataclasses.asdict(settings)}
  return out


def _comparable_cost(figure: float | None, target: str) -> float | None:
  """XLA's cost-analysis figure (flops, bytes accessed) where it counts the
  matmuls. XLA:GPU's cost analysis leaves out the matmuls its autotuner
  hands to cuBLAS (custom calls): qwen2-0.5b b8 s2048 on an H100, 2.1e11
  FLOPs autotuned, 1.5e13 with --xla_gpu_autotune_level=0
  (experiments/data/executed_gpu.jsonl), so no GPU figure is compared."""
  return None if compiled.target_kind(target) == "gpu" else figure


def settings_of(config: dict[str, Any]) -> TrainSettings:
  """The TrainSettings a kept row was compiled with."""
  return settings_from(config)


def recheck(row: dict[str, Any]) -> dict[str, Any]:
  """A kept corpus row with its symbolic side recomputed by today's model
  against the compiled figures it holds. An out-of-HBM row gets the
  symbolic peak (no planning overhead) beside XLA's heap as it refused:
  the figure libtpu's message calls "HLO temporaries" is that heap's peak,
  arguments included (#58: 164.95 GiB both; #287: 38.32 GiB in the
  message, 38.13 read off its dump, 11.22 of them arguments), taken off
  the dump where the row keeps it (`refused_at`); other failed rows are
  returned as they are. `program` says whether today's code traces the
  program the row was compiled from (`same`, `changed`: its figures are an
  older program's; `unknown`: the row keeps no fingerprint)."""
  if "compiled" not in row and "oom" not in row:
    return row
  config = row["config"]
  target = config.get("target") or config["topology"]
  x, y, d = parse_mesh_name(config["mesh"])
  estimate, program, traced = _symbolic(
      load_model(config["model"]), settings_of(config), config["topology"],
      x, y, d)
  sym = compiled.symbolic_side(estimate, target)
  kept = (row.get("compiled") or row.get("oom") or {}).get("program")
  row = {**row, "program": (
      "unknown" if not kept else
      "same" if kept == program_fingerprint(traced.jaxpr) else "changed")}
  if "oom" in row:
    needed = row["oom"].get("peak_bytes") or row["oom"]["temp_bytes"]
    return {**row, "symbolic": sym,
            "oom_relative_error": (sym["peak_no_overhead"] - needed) / needed,
            "symbolic_fits": bool(estimate.fits)}
  comp = row["compiled"]
  return {**row, "symbolic": sym,
          "relative_error": compiled.errors(sym, comp),
          "collectives": compiled.compare_collectives(
              program.made(), comp["collectives"]),
          "flops": compiled.compare_flops(
              program.dots, _comparable_cost(comp.get("flops"), target)),
          "hbm_bytes": compiled.compare_hbm_bytes(
              program, _comparable_cost(comp.get("bytes_accessed"), target))}


_OOM = re.compile(r"CompileTimeHbmOom.*?temporaries \(([\d.]+)G\) exceeds "
                  r"available HBM \(([\d.]+)G\)", re.S)


def hbm_oom(message: str) -> dict[str, int] | None:
  """What an out-of-HBM compile (libtpu's CompileTimeHbmOom) says it needed:
  the temporaries' bytes and the HBM available (XLA prints GiB as "G")."""
  m = _OOM.search(message)
  if m is None:
    return None
  return {"temp_bytes": int(float(m.group(1)) * 2**30),
          "hbm_bytes": int(float(m.group(2)) * 2**30)}


def refused_at(error: BaseException, top: int = compiled.PEAK_BUFFERS
               ) -> dict[str, Any]:
  """What XLA held at its peak when it refused a plan for HBM, if its dump
  was read (simulator.xla.compiled.refused_peak): the peak's bytes, the
  instruction there and the `top` largest buffers live, as a kept row
  holds them, and each memory schedule's heap replayed on the module
  (`replayed_schedules`: whether another schedule would fit); {}
  otherwise."""
  peak = getattr(error, "xla_peak", None)
  replayed = getattr(error, "replayed_schedules", None)
  out = {"replayed_schedules": replayed} if replayed else {}
  if peak is None:
    return out
  return {"peak_bytes": peak.peak_bytes, "peak_instruction": peak.instruction,
          "peak_buffers": [dataclasses.asdict(b) for b in peak.buffers[:top]],
          **out}


def compile_case(cfg: ModelConfig, settings: TrainSettings, topology: str,
                 x: int, y: int, progress: Callable[[str], None] | None = None,
                 d: int = 1, scheduler: str = "default") -> dict[str, Any]:
  """`validate`, with a failed compile kept as a result: its message whole,
  and for an out-of-HBM compile the bytes XLA needed (`oom`)."""
  started = time.perf_counter()
  try:
    return validate(cfg, settings, topology, x, y, progress=progress, d=d,
                    scheduler=scheduler)
  except Exception as e:  # noqa: BLE001 - a failed compile is a result
    text = str(e)
    first = text.splitlines()[0] if text else ""
    row = {"error": f"{type(e).__name__}: {first}", "error_text": text[:4000],
           "compile_seconds": time.perf_counter() - started}
    oom = hbm_oom(text)
    if oom:
      row["oom"] = {**oom, **refused_at(e),
                    "program": getattr(e, "program", "")}
    return row
