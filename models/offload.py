"""Parameters kept in host memory (`--offload=params`), fetched per layer."""

from __future__ import annotations

import jax


def on_device(w: jax.Array) -> jax.Array:
  """A parameter in host memory fetched into HBM where a layer uses it: one
  layer's slice at a time under the layer scan, as MaxText's
  parameter_memory_host_offload moves each layer's variables to the device
  (layers/decoders.py). A parameter already on the device is returned."""
  aval = jax.typeof(w)
  if getattr(aval, "memory_space", None) != jax.memory.Space.Host:
    return w
  return jax.device_put(w, aval.sharding.update(memory_kind="device"))
