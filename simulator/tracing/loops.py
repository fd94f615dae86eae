"""How a loop primitive's operands divide, read in one place.

A scan's operands are constants, initial carries and scanned slices; its
results are the final carries and the stacked outputs; a while loop's are
the condition's constants, the body's constants and the carries. The jaxpr
parameters that say so are JAX internals that change between releases
(JAX 0.11's scan has no `num_consts`/`num_carry`: seen when this project's
reader ran there, README "Executed on an H100"), so nothing else reads them.
"""

from __future__ import annotations


def scan_counts(eqn) -> tuple[int, int]:
  """(constants, carries) at the head of a scan's operands; its first
  `carries` results are the final carries."""
  return eqn.params["num_consts"], eqn.params["num_carry"]


def while_counts(eqn) -> tuple[int, int]:
  """(condition constants, body constants) at the head of a while loop's
  operands; the rest are its carries."""
  return eqn.params["cond_nconsts"], eqn.params["body_nconsts"]


def inlined(eqn, loop):
  """`eqn` of `loop`'s body as an equation of the loop's caller (the loop
  inlined): its name stack under the loop's, as the body's is."""
  info = eqn.source_info
  return eqn.replace(source_info=info.replace(
      name_stack=loop.source_info.name_stack + info.name_stack))
