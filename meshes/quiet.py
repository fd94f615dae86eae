"""Native libraries that log to file descriptor 2, hidden where the log is
expected and says nothing to the user.

- libtpu's first load logs a screenful about missing TPU hosts: with no TPU
  attached (compile-only use) that is expected.
- The CUDA PJRT plugin (the `gpu` extra: jax-cuda12-plugin) logs "Could not find
  cuda drivers on your machine" from C++ each time it is loaded on a host
  without a GPU, which is how deviceless GPU compiles run.
Failures still raise; only fd 2 is redirected, and only for the call.
"""

from __future__ import annotations

import contextlib
import os


@contextlib.contextmanager
def native_stderr_quiet():
  """Redirects fd 2 to /dev/null for the duration of the block."""
  saved, devnull = os.dup(2), os.open(os.devnull, os.O_WRONLY)
  os.dup2(devnull, 2)
  try:
    yield
  finally:
    os.dup2(saved, 2)
    os.close(saved)
    os.close(devnull)


def load_jax_plugins_quietly() -> None:
  """Imports jax and registers its PJRT plugins (the CUDA one, where installed)
  with their native logs hidden. Backends are not initialised, so CPU device
  counts can still be set afterwards. jax 0.10.2 registers plugins once, in
  `xla_bridge._discover_and_register_pjrt_plugins`; later calls are no-ops."""
  with native_stderr_quiet():
    from jax._src import xla_bridge  # pylint: disable=g-import-not-at-top
    xla_bridge._discover_and_register_pjrt_plugins()  # pylint: disable=protected-access
