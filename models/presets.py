"""Published architectures. Counts from jax.eval_shape are asserted in tests."""

from __future__ import annotations

from models.config import ModelConfig

_GPT = dict(norm="layer", positions="learned", mlp="gelu", tie_embeddings=True,
            bias=True, vocab_size=50257)
_LLAMA2 = dict(vocab_size=32000, max_len=4096, norm_eps=1e-5)
# T5 v1.0 (Raffel et al. 2020; HF t5-* config.json): ReLU MLP, tied head,
# 32 relative buckets up to distance 128, eps 1e-6, vocabulary 32128.
_T5 = dict(vocab_size=32128, norm="rms", positions="relative", mlp="relu",
           tie_embeddings=True, norm_eps=1e-6, max_len=512)
# CLIP ViT-L/14-336 (HF openai/clip-vit-large-patch14-336's vision_config).
_CLIP_L_336 = dict(vision_layers=24, vision_d_model=1024, vision_d_ff=4096,
                   vision_heads=16, image_size=336, patch_size=14)
_LLAMA3 = dict(vocab_size=128256, max_len=8192, rope_theta=500000.0)

PRESETS: dict[str, ModelConfig] = {
    c.name: c for c in [
        # GPT-2 small: 124,439,808 params (HF gpt2, tied embeddings).
        ModelConfig("gpt2", d_model=768, n_layers=12, d_ff=3072, n_heads=12,
                    n_kv_heads=12, head_dim=64, max_len=1024, **_GPT),
        # GPT-3 175B (Brown et al. 2020, Table 2.1): 96 layers, d 12288,
        # 96 heads of 128, context 2048, GPT-2 vocabulary and layout.
        ModelConfig("gpt3_175b", d_model=12288, n_layers=96, d_ff=49152,
                    n_heads=96, n_kv_heads=96, head_dim=128, max_len=2048,
                    **_GPT),
        ModelConfig("llama2_7b", d_model=4096, n_layers=32, d_ff=11008,
                    n_heads=32, n_kv_heads=32, head_dim=128, **_LLAMA2),
        ModelConfig("llama2_13b", d_model=5120, n_layers=40, d_ff=13824,
                    n_heads=40, n_kv_heads=40, head_dim=128, **_LLAMA2),
        ModelConfig("llama2_70b", d_model=8192, n_layers=80, d_ff=28672,
                    n_heads=64, n_kv_heads=8, head_dim=128, **_LLAMA2),
        ModelConfig("llama3_8b", d_model=4096, n_layers=32, d_ff=14336,
                    n_heads=32, n_kv_heads=8, head_dim=128, **_LLAMA3),
        ModelConfig("llama3_70b", d_model=8192, n_layers=80, d_ff=28672,
                    n_heads=64, n_kv_heads=8, head_dim=128, **_LLAMA3),
        # Llama 3.1 (HF meta-llama/Llama-3.1-8B and -70B config.json): Llama
        # 3's shapes with a 128K context (its RoPE frequencies rescaled,
        # which changes no shape); MaxText's llama3.1-8b and llama3.1-70b.
        ModelConfig("llama3_1_8b", d_model=4096, n_layers=32, d_ff=14336,
                    n_heads=32, n_kv_heads=8, head_dim=128,
                    **{**_LLAMA3, "max_len": 131072}),
        ModelConfig("llama3_1_70b", d_model=8192, n_layers=80, d_ff=28672,
                    n_heads=64, n_kv_heads=8, head_dim=128,
                    **{**_LLAMA3, "max_len": 131072}),
        ModelConfig("mistral_7b", d_model=4096, n_layers=32, d_ff=14336,
                    n_heads=32, n_kv_heads=8, head_dim=128, vocab_size=32000,
                    max_len=32768, rope_theta=10000.0),
        # Seed 004's XXL: 126 blocks of two linears, nothing else.
        ModelConfig("xxl_ffn", d_model=16384, n_layers=126, d_ff=53248,
                    attention=False, embeddings=False, norm="none",
                    positions="none", mlp="linear", final_norm=False),
        # Mixtral-8x7B (HF mistralai/Mixtral-8x7B-v0.1 config.json): 8 SwiGLU
        # experts of 14336, top-2, renormalised; 46,702,792,704 params.
        ModelConfig("mixtral_8x7b", d_model=4096, n_layers=32, d_ff=14336,
                    n_heads=32, n_kv_heads=8, head_dim=128, vocab_size=32000,
                    max_len=32768, rope_theta=1e6, n_experts=8,
                    experts_per_token=2, expert_d_ff=14336,
                    router_aux_loss_coef=0.02),
        # Mixtral's shape at a quarter of its width and 4 layers (0.43B), for
        # compiles on 4 chips: 8 experts of 3584, top-2, 8 heads of 128 over
        # 2 kv heads.
        ModelConfig("mixtral_mini", d_model=1024, n_layers=4, d_ff=3584,
                    n_heads=8, n_kv_heads=2, head_dim=128, vocab_size=32000,
                    max_len=32768, rope_theta=1e6, n_experts=8,
                    experts_per_token=2, expert_d_ff=3584,
                    router_aux_loss_coef=0.02),
        ModelConfig("tiny_moe", d_model=64, n_layers=2, d_ff=128, n_heads=4,
                    n_kv_heads=2, head_dim=16, vocab_size=256, max_len=128,
                    n_experts=4, experts_per_token=2, expert_d_ff=96),
        # 737,668,096 params; 2,851,598,336; 11,307,321,344 (HF t5-large,
        # t5-3b, t5-11b: 24 encoder and 24 decoder layers each).
        ModelConfig("t5_large", d_model=1024, n_layers=24, encoder_layers=24,
                    d_ff=4096, n_heads=16, n_kv_heads=16, head_dim=64, **_T5),
        ModelConfig("t5_3b", d_model=1024, n_layers=24, encoder_layers=24,
                    d_ff=16384, n_heads=32, n_kv_heads=32, head_dim=128,
                    **_T5),
        ModelConfig("t5_11b", d_model=1024, n_layers=24, encoder_layers=24,
                    d_ff=65536, n_heads=128, n_kv_heads=128, head_dim=128,
                    **_T5),
        # LLaVA-1.5-7B (HF llava-hf/llava-1.5-7b-hf config.json): Vicuna-7B
        # v1.5 (Llama-2-7B's shape, vocabulary 32064 with the image and pad
        # tokens) over CLIP ViT-L/14 at 336 px (24 layers of 1024, 16 heads,
        # MLP 4096: 576 patches an image) and a 2-layer GELU projector.
        ModelConfig("llava_1_5_7b", d_model=4096, n_layers=32, d_ff=11008,
                    n_heads=32, n_kv_heads=32, head_dim=128,
                    **{**_LLAMA2, "vocab_size": 32064}, **_CLIP_L_336),
        # LLaVA's layout at compile-test size: a 4-layer ViT of 512 over 224
        # px images (256 patches of 14) before a 4-layer LM of 1024 (0.13B).
        ModelConfig("llava_mini", d_model=1024, n_layers=4, d_ff=2816,
                    n_heads=8, n_kv_heads=8, head_dim=128, vocab_size=32064,
                    max_len=4096, vision_layers=4, vision_d_model=512,
                    vision_d_ff=2048, vision_heads=8, image_size=224,
                    patch_size=14),
        # Small enough to trace and compile in a unit test.
        ModelConfig("tiny", d_model=64, n_layers=2, d_ff=128, n_heads=4,
                    n_kv_heads=2, head_dim=16, vocab_size=256, max_len=128),
        ModelConfig("tiny_vlm", d_model=64, n_layers=2, d_ff=128, n_heads=4,
                    n_kv_heads=2, head_dim=16, vocab_size=256, max_len=128,
                    vision_layers=2, vision_d_model=32, vision_d_ff=64,
                    vision_heads=2, image_size=32, patch_size=8),
        ModelConfig("tiny_t5", d_model=64, n_layers=2, encoder_layers=2,
                    d_ff=128, n_heads=4, n_kv_heads=4, head_dim=16,
                    **{**_T5, "vocab_size": 256}),
    ]
}
