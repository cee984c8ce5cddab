"""The generation engine: batched autoregressive sampling with log-probabilities from a plain
model (elastic/model), in plain PyTorch (no Ray, no torch.distributed; on an FSDP model,
elastic/train/fsdp_generate.py gathers the weights and calls in here).

    generate.py     the door: `generate(model, prompts, ...)` -> [Completion], continuous batching
    episodes.py     multi-turn episodes: a turn continues from the episode's cache slot
                    (only the feedback prefilled); per-turn spans, log-probs, seeds
    completion.py   what generation returns; input checks; per-prompt seeds
    decoder.py      CachedDecoder: prefill prompts into cache slots, decode with fixed shapes
    step.py         the decode step (one token per live slot), eager or inductor-compiled
    cuda_graphs.py  CUDA graph capture of the step
    static_cache.py the engine's preallocated KV cache (one slot per sequence)
    paged_cache.py  the paged KV cache (blocks, block tables, shared prompt blocks) and its decoder
    sampling.py     on-device sampling, reproducible per row from (seed, token index)
    reference.py    the pre-engine path (left-padded, kv_cache.py): the exactness reference
    speculative.py  speculative decoding: drafts verified in one policy forward (Leviathan/Chen
                    acceptance); draft.py the drafters (prompt lookup, a draft model);
                    chunk.py the k+1-token verify forward on the static cache
    quantized.py    generation.weights: a weight-only int8/int4 copy of the policy (torchao),
                    refreshed from the policy's current weights; the policy is only read

A new cache (paged, quantized) implements the protocols of elastic/model/cache.py and lives here;
so do drafting and new samplers.
"""

from elastic.generation.completion import Completion
from elastic.generation.generate import generate

__all__ = ["Completion", "generate"]
