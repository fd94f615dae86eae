"""simulator.xla.windowed_probe against libtpu: one matmul each side of each
chip's figure (meshes.hardware.Chip.windowed_einsum_contraction), compiled
for the topology (no TPU needed); the CLI's bad input."""

import os
import subprocess
import sys

import pytest

from meshes.layout import plan_mesh
from meshes.topology import parse_topology
from simulator.tracing import windowed
from simulator.xla.windowed_probe import probe


@pytest.mark.parametrize("topology, x, y", [
    ("v5p-128", 8, 8), ("v5e-64", 16, 4), ("v6e-64", 16, 4), ("v4-64", 8, 4)])
def test_libtpu_runs_the_loop_from_the_chips_contraction_and_sends_as_ruled(
    topology, x, y):
  plan = plan_mesh(parse_topology(topology), x, y)
  f = plan.topology.chip.windowed_einsum_contraction
  below, at = probe(plan, f - y), probe(plan, f)
  assert (below.windowed, at.windowed) == (False, True)
  assert below.sent_over_v == 1.0  # the reduce-scatter's V (an all-reduce)
  assert at.sent_over_v == windowed.sent_over_v(y)


def test_a_bad_plan_is_one_line_and_exit_2():
  root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  for spec, names in (("v5p-128:9x9", "mesh 9x9"), ("nonsense", "nonsense"),
                      ("h100:8:8x1", "a GPU topology")):
    p = subprocess.run([sys.executable, "-m", "experiments.probe_windowed",
                        f"--plans={spec}"], cwd=root, capture_output=True,
                       text=True, timeout=120)
    assert p.returncode == 2, (spec, p.stderr)
    assert p.stderr.strip().count("\n") == 0 and names in p.stderr, p.stderr
