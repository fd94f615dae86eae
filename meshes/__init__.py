"""Hardware, slice topologies and the X x Y mesh laid over them."""

# Before anything imports jax: when something does, its PJRT plugins (the CUDA
# one, with the `gpu` extra) are loaded with their native logs hidden
# (meshes.quiet).
from meshes.quiet import quiet_jax_import

quiet_jax_import()

# pylint: disable=g-import-not-at-top,wrong-import-position
from meshes.hardware import CHIPS, Chip, get_chip  # noqa: E402
from meshes.layout import (MeshPlan, abstract_mesh, cpu_mesh,  # noqa: E402
                           device_mesh, factorizations, mesh_shapes,
                           parse_mesh, plan_mesh)
from meshes.network import NETWORKS, Network, network_for  # noqa: E402
from meshes.topology import Topology, list_topologies, parse_topology  # noqa: E402

__all__ = [
    "CHIPS", "Chip", "MeshPlan", "NETWORKS", "Network", "Topology",
    "abstract_mesh", "cpu_mesh", "device_mesh", "factorizations", "get_chip",
    "list_topologies", "mesh_shapes", "network_for", "parse_mesh",
    "parse_topology", "plan_mesh",
]
