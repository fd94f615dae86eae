"""The traced step, read: the program and its saved residuals under the
mesh (trace), which values scale with the batch (batch_probe), which meshes
share one trace (mesh_class), and one walk of the jaxpr for its collectives,
matmuls and HBM traffic (program)."""
