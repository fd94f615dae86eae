"""Logical axis names → mesh axes X (FSDP/data) and Y (tensor), and with
pipeline stages `stage` → P (simulator.step.step_rules). Rules are data.

Three tables, because a weight lives in one layout and is used in another:
`params` is where a weight is stored, `compute` is the layout a matmul needs
(the difference is the FSDP all-gather), `activations` lays out the values that
flow between layers.
"""

from __future__ import annotations

import dataclasses
from typing import Mapping, Sequence

import jax
from jax.sharding import PartitionSpec as P

LOGICAL_AXES = ("batch", "length", "embed", "heads", "kv_heads", "kv", "mlp",
                "vocab", "layers", "exp", "stage")
MESH_AXES = ("X", "Y", "P", "D")

Table = tuple[tuple[str, str | tuple[str, ...] | None], ...]


def _table(mapping: Mapping[str, str | tuple[str, ...] | None]) -> Table:
  unknown = set(mapping) - set(LOGICAL_AXES)
  if unknown:
    raise ValueError(f"unknown logical axis {sorted(unknown)[0]!r}; valid: "
                     f"{', '.join(LOGICAL_AXES)}")
  bad = [a for v in mapping.values() if v is not None
         for a in ((v,) if isinstance(v, str) else v) if a not in MESH_AXES]
  if bad:
    raise ValueError(f"unknown mesh axis {bad[0]!r}; valid: X, Y, P, D, "
                     "a tuple of them, or none")
  return tuple(sorted(mapping.items()))


@dataclasses.dataclass(frozen=True)
class AxisRules:
  params: Table
  compute: Table
  activations: Table

  def spec(self, table: str, names: Sequence[str | None]) -> P:
    """PartitionSpec of a value whose dims carry these logical names.

    A mesh axis shards the first dim whose name maps to it; a later dim
    mapped to the same axis stays whole (as MaxText's logical rules do). So
    with experts over X (`exp` -> X) an expert weight (exp, embed, mlp) is
    split by expert, not also along embed, and an expert-major activation
    (exp, batch, ...) by expert, not also by batch (by the rest of the
    batch's axes: D with replicas).
    """
    mapping = dict(getattr(self, table))
    used, axes = set(), []
    for n in names:
      axis = mapping.get(n) if n else None
      free = tuple(a for a in ((axis,) if isinstance(axis, str) else
                               axis or ()) if a not in used)
      axes.append(free[0] if len(free) == 1 else free or None)
      used |= set(free)
    return P(*axes)

  def replace(self, table: str, **updates: str | None) -> "AxisRules":
    mapping = dict(getattr(self, table))
    mapping.update(updates)
    return dataclasses.replace(self, **{table: _table(mapping)})


# TP over Y: heads, MLP hidden and vocabulary, as in Megatron. The residual
# stream between layers is sharded over Y along embed (seed 004's In[B_X, D_Y]),
# so each layer begins with an all-gather and ends with a reduce-scatter over Y.
# Experts (`exp`) are not split by default: an expert's weights are laid out
# like a dense MLP's (embed over X under zero3, mlp over Y), so routing moves
# no tokens between devices; `expert_rules` puts them over X instead.
_TP = dict(heads="Y", kv_heads="Y", mlp="Y", vocab="Y", kv=None, layers=None,
           length=None, batch=None, exp=None)

FSDP_TP = AxisRules(
    params=_table({**_TP, "embed": "X"}),
    compute=_table({**_TP, "embed": None}),
    activations=_table({**_TP, "batch": "X", "embed": "Y"}),
)


def rules_for(fsdp_params: bool, base: AxisRules = FSDP_TP) -> AxisRules:
  """Weights stored sharded over X (ZeRO-3 / FSDP) or replicated over X."""
  return base if fsdp_params else base.replace("params", embed=None)


def expert_rules(rules: AxisRules, axis: str | None) -> AxisRules:
  """Experts split over mesh axis `axis` (expert parallelism) in all three
  tables, or left as they are (None). Over X, each device holds E/X whole
  experts (no FSDP gather of them) and tokens reach their experts by an
  all-to-all over X and come back by another."""
  if axis is None:
    return rules
  for table in ("params", "compute", "activations"):
    rules = rules.replace(table, exp=axis)
  return rules


def data_parallel_rules(rules: AxisRules) -> AxisRules:
  """`rules` with nothing split but the batch (over the mesh axis `rules`
  lays the batch on): weights whole on every device in all three tables, so
  a module under them runs data-parallel with no gather and no TP
  collective (a replicated vision tower)."""
  whole = {a: None for a in LOGICAL_AXES}
  batch = dict(rules.activations).get("batch")
  return AxisRules(params=_table(whole), compute=_table(whole),
                   activations=_table({**whole, "batch": batch}))


def reshard(x: jax.Array, spec: P) -> jax.Array:
  """jax.sharding.reshard when tracing under a mesh; identity otherwise.

  Without a mesh (plain init, eval_shape for counting) there is nothing to
  lay out, so the model code runs unchanged.
  """
  if jax.sharding.get_abstract_mesh().empty:
    return x
  return jax.sharding.reshard(x, spec)
