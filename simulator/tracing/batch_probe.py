"""Trace once at a probe batch; rescale to any batch exactly, without retracing.

Every batch-dependent value of the train step carries the batch in exactly one
dim (activations [batch, ...], merged dims such as batch·heads; the weight
gradient's matmul contracts it), so its bytes and FLOPs are linear in the
batch, and every other value does not depend on the batch at all. Tracing at
a global batch of PROBE sequences per device makes that dim recognisable:

- a dim derived from the batch is a multiple of PROBE (the global batch is
  PROBE·devices; sharding it divides by factors of the device count, which
  are smaller than PROBE);
- any other dim is a product of model dimensions (vocabulary, widths, heads,
  sequence), each smaller than PROBE and so, PROBE being prime, never a
  multiple of it (`check_config` refuses the rare config where that fails).

So one trace gives every figure's split into fixed + linear, which is what the
two-trace fit (B and 2B) gave before, at half the tracing.
"""

from __future__ import annotations

import dataclasses
import re

from models.config import ModelConfig
from simulator.settings import TrainSettings

PROBE = 1_000_003  # sequences per device at the probe batch; a prime


def carries_batch(shape) -> bool:
  """Whether a value traced at the probe batch scales with the batch."""
  return any(d and d % PROBE == 0 for d in shape)


def matmul_kind(lhs, rhs, out) -> str:
  """What a matmul is, by which of its shapes (global or per device) carry
  the batch: "weight_grad" (it contracts the batch away: a batch-free result
  of batch-carrying operands), "activation" (both operands carry it:
  attention scores), "weight" (x·W), "static" (no shape carries it)."""
  if carries_batch(out):
    return ("activation" if carries_batch(lhs) and carries_batch(rhs)
            else "weight")
  return "weight_grad" if carries_batch(lhs) or carries_batch(rhs) else "static"


def rescale(shape, batch: int, probe_batch: int) -> tuple[int, ...]:
  """A probe-batch shape at global `batch` (its batch dim scaled)."""
  return tuple(d * batch // probe_batch if d and d % PROBE == 0 else d
               for d in shape)


def rescale_text(text: str, batch: int, probe_batch: int) -> str:
  """A label written at the probe batch (a value's aval, e.g.
  "bfloat16[16000048@X,8@Y,4096]") at global `batch`: each number in it
  that carries the batch rescaled as `rescale` rescales a dim."""
  return re.sub(r"\d+", lambda m: str(rescale((int(m.group()),), batch,
                                              probe_batch)[0]), text)


def bytes_at(fixed, linear, num: int, den: int):
  """Fixed + linear probe-batch bytes at batch scale num/den: fixed +
  floor(linear * num / den), exact in int64 (numpy arrays too: linear at the
  probe batch times a large batch overflows it)."""
  return fixed + linear // den * num + linear % den * num // den


def check_config(cfg: ModelConfig, *seqs: int) -> None:
  dims = [v for v in dataclasses.astuple(cfg) if isinstance(v, int)
          and not isinstance(v, bool)] + list(seqs)
  bad = [d for d in dims if d and d % PROBE == 0]
  if bad:
    raise ValueError(f"model dimension {bad[0]} is a multiple of the probe "
                     f"batch {PROBE}; the batch scaling cannot tell it from "
                     f"the batch")


def require_probe(batch: int, devices: int, what: str,
                  grad_accum: int = 1) -> None:
  """Refuse a trace that was not taken at the probe batch."""
  if batch != PROBE * devices * grad_accum:
    raise ValueError(f"{what} needs the step traced at the probe batch "
                     f"(simulator.tracing.trace.trace_probe), not batch {batch}")


def probe_settings(cfg: ModelConfig, settings: TrainSettings,
                   devices: int) -> TrainSettings:
  """`settings` at the probe batch for a mesh of `devices` chips: PROBE
  sequences per device in each micro-batch (grad_accum of them, or a
  pipeline's microbatches)."""
  check_config(cfg, settings.seq, settings.target_seq)
  return dataclasses.replace(settings,
                             batch=PROBE * devices * settings.batch_splits)
