"""simulator.xla.hlo_dots: the dots of an HLO dump around XLA:GPU's split-K
rewriter, read and replayed against the rule (lines from the dump of gpt2
h100:2x8 4x4, GPU corpus #1: `python -m experiments.split_k_replay ...`)."""

from simulator.memory import xla_gpu_rules
from simulator.xla import hlo_dots

H100 = xla_gpu_rules.Sms(132, 9)
OP = 'metadata={op_name="jit(step)/transpose(jvp(Decoder))/loss/dot_general"}'
BEFORE = f"""
ENTRY %main {{
  %bitcast.138 = f32[2048,12565]{{1,0}} parameter(0)
  %bitcast.644 = bf16[768,12565]{{1,0}} parameter(1)
  %convert.78 = f32[768,12565]{{1,0}} convert(%bitcast.644), {OP}
  %dot.82 = f32[2048,768]{{0,1}} dot(%bitcast.138, %convert.78), lhs_contracting_dims={{1}}, rhs_contracting_dims={{1}}, {OP}
}}
"""
AFTER = f"""
%dot.131.reduce_sub_computation (lhs.5: f32[], rhs.5: f32[]) -> f32[] {{
  %lhs.5 = f32[] parameter(0)
}}
ENTRY %main {{
  %bitcast.138 = f32[2048,12565]{{1,0}} parameter(0)
  %bitcast.644 = bf16[768,12565]{{1,0}} parameter(1)
  %convert.78 = f32[768,12565]{{1,0}} convert(%bitcast.644), {OP}
  %constant.902 = f32[] constant(0)
  %pad.7 = f32[2048,12576]{{1,0}} pad(%bitcast.138, %constant.902), padding=0_0x0_11
  %pad.8 = f32[768,12576]{{1,0}} pad(%convert.78, %constant.902), padding=0_0x0_11
  %reshape.1219 = f32[2048,2,6288]{{2,1,0}} reshape(%pad.7)
  %reshape.1220 = f32[768,2,6288]{{2,1,0}} reshape(%pad.8)
  %dot.131 = f32[2,2048,768]{{2,1,0}} dot(%reshape.1219, %reshape.1220), lhs_batch_dims={{1}}, lhs_contracting_dims={{2}}, rhs_batch_dims={{1}}, rhs_contracting_dims={{2}}, {OP}
  %reduce.65 = f32[2048,768]{{0,1}} reduce(%dot.131, %constant.902), dimensions={{0}}, to_apply=%dot.131.reduce_sub_computation, {OP}
}}
"""


def test_a_dot_is_read_with_its_operands_bits_before_their_casts():
  (dot,) = hlo_dots.dots(BEFORE)
  assert dot.dims == (1, 2048, 768, 12565)
  assert dot.bits == (32, 16, 32)  # the weight is bf16 before its convert


def test_the_split_is_read_off_the_reduce_of_the_split_dim():
  assert hlo_dots.splits(AFTER) == {("jit(step)/transpose(jvp(Decoder))/"
                                     "loss/dot_general", 2): 1}
  assert set(hlo_dots.splits(BEFORE).values()) == {1}
  assert list(hlo_dots.splits(BEFORE)) == [(
      "jit(step)/transpose(jvp(Decoder))/loss/dot_general", 1)]


def test_the_replay_agrees_with_xla_and_says_where_it_does_not():
  dots, differ = hlo_dots.replay(BEFORE, AFTER, H100)
  assert [s for _, s in dots] == [2] and not differ
  _, differ = hlo_dots.replay(BEFORE, BEFORE, H100)  # as if XLA kept it
  assert sum(differ.values()) == 2
