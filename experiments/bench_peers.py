"""Benchmark: the analytical peers on experiments.bench_sweep's workload.

  PEER_PYTHON -m experiments.bench_peers   (from the repository root)

The same 320 tuples as `experiments.bench_sweep`: llama2_70b at seq 4096 on
512 devices, every X x Y (data x tensor), 8 global batches, 4 remat
settings, timed through llm-analysis (`llm_analysis.analysis.train`) and
Calculon (`Llm.compile` + `Llm.run`), each where it is importable. Neither
is a dependency of this project: install them in a virtualenv of their own
(`pip install llm-analysis==0.2.2`; Calculon from its repository,
`pip install . pandas psutil`, with CALCULON_SYSTEM=its
systems/h100_80g_nvl8.json) and run this file with that interpreter; it imports
nothing else from here. A tuple a peer refuses (llm-analysis: tensor
parallelism above 8 GPUs, its remat levels are 0-2) counts as a config.
"""

from __future__ import annotations

import contextlib
import io
import logging
import time

DEVICES = 512
SEQ = 4096
BATCHES = (512, 1024, 1536, 2048, 3072, 4096, 6144, 8192)
MESHES = tuple((DEVICES // y, y) for y in (1, 2, 4, 8, 16, 32, 64, 128, 256,
                                           512))
# llama2_70b in Calculon's application format (it has no llama preset).
LLAMA2_70B = {"hidden": 8192, "feedforward": 28672, "seq_size": SEQ,
              "attn_heads": 64, "attn_size": 128, "num_blocks": 80}


def _timed(name: str, one) -> None:
  start, ok, refused = time.perf_counter(), 0, 0
  for dp, tp in MESHES:
    for batch in BATCHES:
      for remat in range(4):
        try:
          with contextlib.redirect_stdout(io.StringIO()):
            one(dp, tp, batch, remat)
          ok += 1
        except Exception:  # noqa: BLE001 - a refused config is a data point
          refused += 1
  took = time.perf_counter() - start
  print(f"{name}: {ok + refused} configs ({ok} evaluated, {refused} refused) "
        f"in {took:.2f} s, {1e3 * took / (ok + refused):.2f} ms per config",
        flush=True)


def llm_analysis() -> None:
  from llm_analysis.analysis import train
  logging.disable(logging.CRITICAL)
  _timed("llm-analysis 0.2.2", lambda dp, tp, batch, remat: train(
      model_name="upstage_Llama-2-70b-instruct-v2", gpu_name="h100-sxm-80gb",
      dtype_name="w16a16e16", log_level="CRITICAL", global_batch_size=batch,
      seq_len=SEQ, activation_recomputation=remat, ds_zero=3, dp_size=dp,
      tp_size=tp, total_num_gpus=DEVICES, flash_attn=True))


def calculon() -> None:
  import json
  import os
  from calculon.llm import Llm
  from calculon.system import System
  path = os.environ.get("CALCULON_SYSTEM")  # its systems/h100_80g_nvl8.json
  if not path or not os.path.isfile(path):
    raise ImportError("set CALCULON_SYSTEM to the h100_80g_nvl8.json of a "
                      "Calculon checkout (systems/)")
  with open(path) as f:
    system = System(json.load(f))
  app = Llm.Application(LLAMA2_70B)
  remats = ("none", "attn_only", "full", "full")

  def one(dp, tp, batch, remat):
    exe = Llm.Execution.from_json({
        "num_procs": DEVICES, "tensor_par": tp, "pipeline_par": 1,
        "data_par": dp, "tensor_par_net": 0, "pipeline_par_net": 1,
        "data_par_net": 1, "batch_size": batch, "microbatch_size": 1,
        "datatype": "float16", "fused_activation": True,
        "attention_type": "multihead", "activation_recompute": remats[remat],
        "pipeline_interleaving": 1, "optimizer_sharding": True,
        "tensor_par_comm_type": "rs_ag", "tensor_par_overlap": "none",
        "seq_par_ag_redo": False, "data_par_overlap": False,
        "weight_offload": False, "activations_offload": False,
        "optimizer_offload": False, "training": True})
    model = Llm(app, logging.getLogger("calculon"))
    model.compile(system, exe)
    model.run(system)

  _timed("Calculon", one)


if __name__ == "__main__":
  for peer in (llm_analysis, calculon):
    try:
      peer()
    except ImportError as e:
      print(f"{peer.__name__}: not importable here ({e}); install it in "
            "this interpreter's environment")
