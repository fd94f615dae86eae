"""Compute-bound batch threshold and the best X×Y split, from the traced step.

  python -m experiments.compute_bound --model=xxl_ffn --topology=v5p-128 \
      --mesh=16x4 --m_x=2 --m_y=1 --flops_per_chip=4.6e14 \
      --ici_link_bandwidth=9e10 --wraparound=yes --pass=forward --remat=none \
      --nowindowed_einsum

reproduces seed 004 (c)-(d) (its reduce-scatter over Y a ring; libtpu runs
that matmul as its windowed einsum loop, the default here). One row per X×Y factorization of the topology; --mesh
picks the mesh whose collectives are listed and whose model gives the continuous
optimum (default: the best split with X, Y > 1). Bandwidth: --ici_link_bandwidth is one
link one way; a wrapped axis delivers W_ici = 2x that (seed 004: 2·9e10).
"""

from __future__ import annotations

import json
import math

from absl import flags

from experiments import cli
from models.registry import load_model
from meshes.layout import crossing_line, mesh_name, parse_mesh, plan_mesh
from meshes.topology import parse_topology
from simulator.timing import roofline as R

FLAGS = flags.FLAGS
cli.define_model_flags()
cli.define_train_flags()
flags.DEFINE_integer("m_x", None, "hold M_X (physical axes under X) fixed")
flags.DEFINE_integer("m_y", None, "hold M_Y (physical axes under Y) fixed")
flags.DEFINE_float("flops_per_chip", None, "override the chip's bf16 FLOP/s (C)")
flags.DEFINE_float("ici_link_bandwidth", None,
                   "override one-way B/s per ICI link (W_ici = 2x on a ring)")
flags.DEFINE_enum("pass", "step", list(R.PASSES),
                  "forward: forward pass only (seed 004); train: +backward; "
                  "step: +optimizer update")
flags.DEFINE_enum("ring", "book", ["book", "exact"],
                  "book: T = V/W (large-n); exact: (n-1)/n·V/W")
flags.DEFINE_enum("wraparound", "auto", ["auto", "yes", "no"],
                  "auto: from the topology; yes/no: force on both mesh axes")
flags.DEFINE_bool("windowed_einsum", True,
                  "libtpu's windowed einsum loop where it runs one "
                  "(simulator.tracing.windowed); --nowindowed_einsum: every "
                  "tensor-parallel reduce-scatter a ring, as seed 004 assumes")
flags.DEFINE_float("tokens", None, "global tokens for step time and MFU "
                   "(default batch·seq)", lower_bound=1)


def _rnd(x):
  return None if x is None or math.isinf(x) else x


def _batch_shards(plan, settings) -> int:
  """What the global batch must be a multiple of on `plan`: its data
  shards (X, and D replicas) times the micro-batches of a step."""
  return plan.X * plan.D * settings.batch_splits


def main(argv):
  del argv
  f = FLAGS
  pass_ = getattr(f, "pass")
  cfg = load_model(f.model)
  topo = parse_topology(f.topology)
  settings = cli.train_settings()
  chosen = parse_mesh(f.mesh) if f.mesh else None
  dp = cli.outer_size("dp", topo)
  if cli.outer_size("pp", topo) > 1:
    raise ValueError(f"pp={f.pp}: compute_bound times X x Y meshes (with "
                     "--dp replicas); a pipelined plan's step (its bubble "
                     f"and stage sends) is mesh_sweep --pps={f.pp}'s, its "
                     f"memory memory_report --pp={f.pp}'s")
  if chosen:
    plan_mesh(topo, *chosen, f.m_x, f.m_y, D=dp)  # validates
  wrap = {"auto": None, "yes": True, "no": False}[f.wraparound]
  hw_kw = dict(flops_per_chip=f.flops_per_chip,
               link_bandwidth=f.ici_link_bandwidth, ring=f.ring, wraparound=wrap)
  tokens = f.tokens or settings.tokens
  if not (math.isfinite(tokens) and tokens > 0):
    raise ValueError(f"tokens={tokens} must be a positive finite number "
                     "of tokens per step")
  if topo.chip.kind == "gpu":
    tpu_only = [f"--{name}={f[name].value}" for name in
                ("ring", "wraparound", "m_x", "m_y", "windowed_einsum")
                if f[name].present]
    if tpu_only:
      raise ValueError(f"{', '.join(tpu_only)}: the TPU torus's and libtpu's "
                       "options; a GPU's collectives are timed as NCCL runs "
                       "them (simulator.timing.nccl); drop them")
  rows = R.search_meshes(cfg, settings, topo, f.m_x, f.m_y, hardware_kw=hw_kw,
                         pass_=pass_, tokens=tokens, D=dp,
                         windowed_einsum=f.windowed_einsum)
  ok = [r for r in rows if r.estimate]
  if not ok:
    raise ValueError(f"no mesh of {topo.describe()} can shard {cfg.name}: "
                     f"{rows[0].error}")
  best = min(ok, key=lambda r: r.estimate.threshold_tokens_global)
  # The continuous optimum rescales one traced mesh's terms over Y; a mesh with
  # both axes > 1 has both kinds of terms (and nonzero M_X, M_Y) to rescale.
  both = [r for r in ok if r.plan.X > 1 and r.plan.Y > 1]
  by_threshold = lambda r: r.estimate.threshold_tokens_global
  base = min(both or ok, key=by_threshold)
  if chosen:
    base = next((r for r in rows if (r.plan.X, r.plan.Y) == chosen), None)
    if base is None or base.model is None:
      raise ValueError(f"mesh {f.mesh}: {base.error if base else 'not found'}")
  # A mesh with X or Y of 1 traces no collectives over it: nothing to
  # rescale over Y. The best split with both axes over 1 is rescaled then.
  rescaled = (base if base.plan.X > 1 and base.plan.Y > 1
              else min(both, key=by_threshold) if both else None)
  hw = R.Hardware.for_plan(base.plan, **hw_kw)
  optimum = None
  if rescaled is not None:
    y_opt, t_opt = R.continuous_optimum(
        rescaled.model, R.Hardware.for_plan(rescaled.plan, **hw_kw), pass_)
    optimum = dict(Y=float(y_opt),
                   X=rescaled.plan.X * rescaled.plan.Y / y_opt,
                   tokens_global=_rnd(float(t_opt)), M_X=rescaled.plan.M_X,
                   M_Y=rescaled.plan.M_Y,
                   rescaled_mesh=mesh_name(rescaled.plan.X, rescaled.plan.Y))
  meshes = []
  for r in rows:
    p, e = r.plan, r.estimate
    row = dict(X=p.X, Y=p.Y, M_X=p.M_X, M_Y=p.M_Y, X_hosts=p.x_hosts,
               Y_hosts=p.y_hosts, crossing=p.crossing())
    if e is None:
      row["error"] = r.error
    else:
      row.update(threshold_tokens_per_device=_rnd(e.threshold_tokens_per_device),
                 threshold_tokens_global=_rnd(e.threshold_tokens_global),
                 t_math_s=e.t_math, t_comm_s=e.t_comm,
                 exposed_comm_s=e.exposed_comm, step_time_s=e.step_time,
                 t_hbm_s=e.t_hbm, t_matmul_hbm_s=e.t_matmul_hbm,
                 t_host_s=e.t_host, exposed_host_s=e.exposed_host, mfu=e.mfu,
                 roofline_mfu=e.roofline_mfu,
                 hfu=e.hfu)
    row["batch_splits"] = bool(f.tokens) or (
        settings.batch % _batch_shards(p, settings) == 0)
    meshes.append(row)
  out = dict(
      model=cfg.name, topology=topo.describe(), chips=topo.chips, dp=dp,
      **{"pass": pass_},
      flops_per_chip=hw.flops_per_chip, ici_link_bandwidth=hw.link_bandwidth,
      w_ici_wrapped=2 * hw.link_bandwidth, ring=f.ring, tokens=tokens,
      meshes=meshes,
      optimum_continuous=optimum,
      best_integer=dict(X=best.plan.X, Y=best.plan.Y,
                        tokens_global=round(best.estimate.threshold_tokens_global)
                        if not math.isinf(best.estimate.threshold_tokens_global)
                        else None),
      collectives=[dict(kind=t.kind, axis=t.axis, phase=t.phase, layer=t.layer,
                        source=t.source, count=t.count,
                        bytes_per_device=t.b0 + t.b1 * tokens,
                        overlappable=t.overlappable, windowed=t.windowed)
                   for t in base.model.terms if t.phase in R.PASSES[pass_]],
      collectives_mesh=mesh_name(base.plan.X, base.plan.Y, D=dp),
      step_time_caveat=R.step_time_caveat(topo.chip.name))
  if f.format == "json":
    print(json.dumps(out, indent=1))
    return
  links = (f"NVLink {hw.link_bandwidth:.3g} B/s one-way per GPU, NCCL's "
           f"ring/tree/NVLS with latencies" if topo.chip.kind == "gpu" else
           f"link={hw.link_bandwidth:.3g} B/s one-way (W_ici="
           f"{2 * hw.link_bandwidth:.3g} wrapped), ring={f.ring}")
  if topo.hosts > 1:
    links += f", {topo.network.name} between {topo.network.hosts_word}"
  if dp > 1:
    links += (f", D={dp} data-parallel replicas outermost (X x Y below: "
              f"each replica's mesh)")
  rates = (f", matmuls timed at the measured {hw.time_flops:.3g} FLOP/s"
           if hw.time_flops != hw.flops_per_chip else "")
  print(f"{cfg.name} on {topo.describe()}, pass={pass_}, C={hw.flops_per_chip:.3g}"
        f" FLOP/s{rates}, {links}, step/MFU at "
        f"{tokens:.0f} tokens (MFU: predicted, with the fusions' HBM time "
        f"T_hbm_s and the matmuls' beyond their FLOPs where their bytes "
        f"bind them, T_mm_hbm_s; MFU_bound: the roofline's, without both; "
        f"tok/dev, tok_global: the compute-bound threshold, tokens per device "
        f"and per step, inf where communication binds at any batch)")
  if out["step_time_caveat"]:
    print(f"note: {out['step_time_caveat']}")
  hdr = ("X", "Y", "M_X", "M_Y", "tok/dev", "tok_global", "T_math_s", "T_comm_s",
         "exposed_s", "step_s", "MFU", "MFU_bound", "T_hbm_s",
         "T_mm_hbm_s")
  print(("{:>5} " * 4 + "{:>10} " * 10).format(*hdr))
  for m in meshes:
    if "error" in m:
      print(f"{m['X']:>5} {m['Y']:>5} {m['M_X']:>5} {m['M_Y']:>5} "
            f"untraceable: {m['error']}")
      continue
    fmt = lambda v: "inf" if v is None else f"{v:.0f}"
    print(f"{m['X']:>5} {m['Y']:>5} {m['M_X']:>5} {m['M_Y']:>5} "
          f"{fmt(m['threshold_tokens_per_device']):>10} "
          f"{fmt(m['threshold_tokens_global']):>10} {m['t_math_s']:>10.4g} "
          f"{m['t_comm_s']:>10.4g} {m['exposed_comm_s']:>10.4g} "
          f"{m['step_time_s']:>10.4g} {m['mfu']:>10.3f} "
          f"{m['roofline_mfu']:>10.3f} {m['t_hbm_s']:>10.4g} "
          f"{m['t_matmul_hbm_s']:>10.4g}")
  unsplit = [f"{m['X']}x{m['Y']}" for m in meshes
             if "error" not in m and not m["batch_splits"]]
  if unsplit:
    print(f"batch {settings.batch} does not split over X on "
          f"{', '.join(unsplit)} (each micro-batch is split over X): their "
          f"step and MFU are those of {tokens:.0f} tokens as if the batch "
          f"split over X; give a batch X divides for a plan that runs")
  if topo.hosts > 1:  # which axis crosses the network, mesh by mesh
    print(crossing_line(topo, [(f"{m['X']}x{m['Y']}", m["crossing"])
                               for m in meshes]))
  hosted = [m for m in meshes if m.get("t_host_s")]
  if hosted:
    print(f"copies between host memory and HBM (offload) over the host link, "
          f"{topo.chip.host_link_bandwidth:.3g} B/s one way: "
          + "; ".join(f"{m['X']}x{m['Y']} {m['t_host_s']:.4g} s, "
                      f"{m['exposed_host_s']:.4g} s of it exposed (in step_s)"
                      for m in hosted))
  oc, bi = out["optimum_continuous"], out["best_integer"]
  if oc is None:
    print("continuous optimum: none (no mesh here has X and Y both over 1, "
          "whose collectives it rescales over Y)")
  else:
    other = ("" if oc["rescaled_mesh"] == out["collectives_mesh"] else
             f", {oc['rescaled_mesh']}'s terms: --mesh's traces no "
             "collectives over an axis of 1")
    print(f"continuous optimum (M_X={oc['M_X']}, M_Y={oc['M_Y']} held{other}):"
          f" Y={oc['Y']:.2f} -> {fmt(oc['tokens_global'])} tokens")
  note = (" (no batch-independent traffic: compute-bound at any batch)"
          if bi["tokens_global"] == 0 else "")
  print(f"best integer split: {bi['X']}x{bi['Y']} -> "
        + (f"{bi['tokens_global']} tokens{note}" if bi["tokens_global"]
           is not None else "none: communication binds every traced split "
           "at any batch"))
  why = ("" if f.mesh or base is best else
         " (the best split with both axes over 1, whose terms the continuous"
         " optimum rescales; --mesh names another)")
  print(f"collectives of {out['collectives_mesh']}{why} per step (bytes per "
        f"device at {tokens:.0f} tokens):")
  for c in out["collectives"]:
    print(f"  {c['phase']:<9} {c['kind']:<14} {c['axis']} x{c['count']:<4} "
          f"{c['bytes_per_device']:>14.0f} B  {c['source']}"
          f"{_overlap_note(c)}")


def _overlap_note(c: dict) -> str:
  if c["windowed"]:
    return "  (libtpu's windowed einsum loop: overlaps its matmul)"
  return "  (overlappable)" if c["overlappable"] else ""


if __name__ == "__main__":
  cli.run(main)
