"""Tests run on the CPU backend (as the experiments do by default); TPU targets
compile through libtpu's topology API, which needs no TPU. Set before JAX loads,
and inherited by the experiments the tests start as subprocesses."""

import os
import tempfile

os.environ.setdefault("JAX_PLATFORMS", "cpu")
# The experiments' persistent cache (simulator.cache) defaults under
# XDG_CACHE_HOME: the tests' own, never the user's.
os.environ["XDG_CACHE_HOME"] = tempfile.mkdtemp(prefix="shardsim-tests-")
