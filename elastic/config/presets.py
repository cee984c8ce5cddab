"""Model size presets (plain data, so config validation needs no model import).

Sizes follow Llama-style shapes: ffn_hidden ≈ 8/3·dim rounded up to a multiple of 256
(of 32 for the CPU-sized `tiny`). Parameter counts exclude embeddings unless tied.
"""

from typing import Any, Dict

PRESETS: Dict[str, Dict[str, Any]] = {
    # CPU tests and the 3-minute demo (~0.8M non-embedding parameters).
    "tiny": dict(dim=128, n_layers=4, n_heads=4, n_kv_heads=2, ffn_hidden=352,
                 tie_embeddings=True, rope_theta=10000.0, norm_eps=1e-5),
    # ~125M with a 32k vocab (GPT-2 small shape, GQA).
    "125m": dict(dim=768, n_layers=12, n_heads=12, n_kv_heads=4, ffn_hidden=2048,
                 tie_embeddings=True, rope_theta=10000.0, norm_eps=1e-5),
    # ~1B (Llama-3.2-1B shape).
    "1b": dict(dim=2048, n_layers=16, n_heads=32, n_kv_heads=8, ffn_hidden=8192,
               tie_embeddings=True, rope_theta=500000.0, norm_eps=1e-5),
    # ~8B (Llama-3.1-8B shape).
    "8b": dict(dim=4096, n_layers=32, n_heads=32, n_kv_heads=8, ffn_hidden=14336,
               tie_embeddings=False, rope_theta=500000.0, norm_eps=1e-5),
}
