"""The GPU validation corpus: configs compiled deviceless for NVIDIA clusters
through the CUDA plugin (the `gpu` extra), held to the same targets as the TPU
corpus. Compile with `python -m experiments.validation_matrix --corpus=gpu`
(it appends to `GPU_CORPUS_JSONL` and rewrites experiments/validation_gpu.md);
`--from_jsonl` re-checks the kept rows without compiling, as for TPU.
"""

from __future__ import annotations

import os

from experiments.validation_corpus import QWEN2_0_5B, Case

GPU_CORPUS_JSONL = os.path.join(os.path.dirname(__file__), "data",
                                "compiled_gpu_corpus.jsonl")
GPU_PART = "gpu"  # the corpus part its rows carry
G = GPU_PART

CASES: list[Case] = [
    # GPT-2 on one node and over two (X over InfiniBand, Y inside a node).
    Case("gpt2", "h100:8", "8x1", 32, 1024, "full", "adamw", G),
    Case("gpt2", "h100:2x8", "4x4", 16, 512, "full", "adamw", G),
    Case("gpt2", "h100:2x8", "8x2", 32, 1024, "dots", "adamw", G),
    # 7B-class on H100 / H200 nodes, several meshes and remats.
    Case("llama2_7b", "h100:8", "8x1", 8, 2048, "full", "adamw", G),
    Case("llama2_7b", "h100:2x8", "8x2", 16, 4096, "full", "adamw", G),
    Case("llama2_7b", "h200:2x8", "16x1", 32, 2048, "dots", "adamw", G),
    Case("mistral_7b", "h100:2x8", "8x2", 16, 4096, "full", "adamw", G),
    Case(QWEN2_0_5B, "a100:8", "8x1", 32, 2048, "full", "adamw", G),
]
