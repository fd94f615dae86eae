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
import importlib.abc
import importlib.machinery
import os
import sys


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


class _QuietJaxLoader(importlib.abc.Loader):
  """jax's own loader, its module run with fd 2 hidden and its plugins
  registered there (`load_jax_plugins_quietly`)."""

  def __init__(self, loader):
    self._loader = loader

  def create_module(self, spec):
    return self._loader.create_module(spec)

  def exec_module(self, module) -> None:
    with native_stderr_quiet():
      self._loader.exec_module(module)
    load_jax_plugins_quietly()

  def __getattr__(self, name):  # resource readers, is_package, ...
    return getattr(self._loader, name)


class _QuietJaxFinder(importlib.abc.MetaPathFinder):
  """Finds jax where Python would, once, and hands it `_QuietJaxLoader`."""

  def find_spec(self, name, path=None, target=None):
    if name != "jax":
      return None
    sys.meta_path.remove(self)
    spec = importlib.machinery.PathFinder.find_spec(name, path)
    if spec is not None and spec.loader is not None:
      spec.loader = _QuietJaxLoader(spec.loader)
    return spec


def quiet_jax_import() -> None:
  """Makes the process's first `import jax`, wherever it happens, load the
  plugins quietly, without importing jax now: a run that needs nothing of
  jax (a sweep whose every result is cached) does not pay its second of
  imports. Where jax is already imported, its plugins are registered now."""
  if "jax" in sys.modules:
    load_jax_plugins_quietly()
  elif not any(isinstance(f, _QuietJaxFinder) for f in sys.meta_path):
    sys.meta_path.insert(0, _QuietJaxFinder())
