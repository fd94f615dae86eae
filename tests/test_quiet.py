"""meshes.quiet: importing meshes leaves jax unimported, and the first import
of jax after it, wherever it happens, loads the PJRT plugins quietly."""

import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _python(code: str) -> subprocess.CompletedProcess:
  return subprocess.run([sys.executable, "-c", code], cwd=ROOT,
                        env=dict(os.environ, JAX_PLATFORMS="cpu"),
                        capture_output=True, text=True, timeout=120)


def test_meshes_does_not_import_jax():
  p = _python("import sys, meshes, meshes.layout; print('jax' in sys.modules)")
  assert p.returncode == 0 and p.stdout.strip() == "False", p.stderr


def test_the_first_jax_import_after_meshes_logs_nothing():
  """With the CUDA plugin installed (the `gpu` extra), a bare `import jax`
  logs that this host has no CUDA driver; after `import meshes` it does not
  (tests/test_gpu_target.py compiles through the plugin so loaded)."""
  p = _python("import meshes\n"
              "from meshes.layout import abstract_mesh, plan_mesh\n"
              "from meshes.topology import parse_topology\n"
              "import jax\n"
              "jax.numpy.zeros(1).block_until_ready()\n"
              "mesh = abstract_mesh(plan_mesh(parse_topology('v5p-8'), 4, 1))\n"
              "print(jax.__version__, dict(mesh.shape))")
  assert p.returncode == 0, p.stderr
  assert p.stderr == ""
  assert "'X': 4" in p.stdout
