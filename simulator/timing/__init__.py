"""Step time: FLOPs (flops), collectives timed on ICI, DCN and NVLink /
InfiniBand (comms, nccl), and the roofline step-time model (roofline)."""
