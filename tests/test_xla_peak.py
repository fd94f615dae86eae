"""simulator.xla.xla_peak: how a buffer XLA holds at its peak is named for
people."""

from simulator.xla.xla_peak import op_tail


def test_an_op_name_is_cut_at_a_scope_and_reads_as_written():
  """A long HLO op_name keeps its last whole scopes within the width; an
  argument's path reads with JAX's quotes, not the HLO text's escapes."""
  op = ("jit(step)/transpose(jvp(Decoder))/layers/while/body/closed_call/"
        "checkpoint/blocks/mlp/wo/bsf,fd->bsd/dot_general")
  assert op_tail(op, 70) == (
      "…/body/closed_call/checkpoint/blocks/mlp/wo/bsf,fd->bsd/dot_general")
  assert len(op_tail(op, 70)) <= 70 and op_tail(op, 200) == op
  assert op_tail("p[\\'blocks\\'][\\'mlp\\']", 70) == "p['blocks']['mlp']"
  assert op_tail("x" * 100, 10) == "…" + "x" * 7
