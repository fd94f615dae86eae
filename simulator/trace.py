"""Trace the train step once under a mesh: the program every estimate reads.

`jax.make_jaxpr` of the step under an Explicit X/Y mesh gives every value with
its NamedSharding; `saved_residuals` of the loss lists what the backward pass
keeps under the remat policy, each with its sharding.
"""

from __future__ import annotations

import dataclasses

import jax
from jax._src.ad_checkpoint import saved_residuals as _saved_residuals  # private: used only here

from models.config import ModelConfig
from simulator.batch_probe import probe_settings
from simulator.settings import TrainSettings
from simulator.step import Step, build_step


@dataclasses.dataclass(frozen=True)
class Residual:
  aval: jax.core.ShapedArray  # carries .sharding under an Explicit mesh
  source: str  # JAX's description: "from the argument ...", "output of dot_general ..."


@dataclasses.dataclass(frozen=True)
class Traced:
  step: Step
  jaxpr: jax.core.ClosedJaxpr  # the whole step: forward, backward, update
  residuals: tuple[Residual, ...]


def saved_residuals(fn, *args) -> tuple[Residual, ...]:
  return tuple(Residual(a, s) for a, s in _saved_residuals(fn, *args))


def trace(cfg: ModelConfig, settings: TrainSettings, mesh,
          residuals: bool = True) -> Traced:
  """mesh: a jax.sharding.AbstractMesh with Explicit X/Y axes.

  residuals=False skips the second (VJP) trace when only the program is read.
  """
  step = build_step(cfg, settings, mesh)
  with jax.sharding.use_abstract_mesh(mesh):
    jaxpr = jax.make_jaxpr(step.fn)(*step.args)
    residuals = saved_residuals(step.loss_fn, step.params,
                                step.batch) if residuals else ()
  return Traced(step, jaxpr, residuals)


def trace_probe(cfg: ModelConfig, settings: TrainSettings, mesh,
                residuals: bool = True) -> Traced:
  """The step traced at the probe batch (simulator.batch_probe): what the
  memory and timing estimates read, once, for every batch size."""
  return trace(cfg, probe_settings(cfg, settings, mesh.size), mesh, residuals)
