"""Small Hugging Face model directories for tests, built from random configs (nothing downloaded)."""

from __future__ import annotations

from pathlib import Path

import torch

from elastic.data.tokenizer import EOS, PAD, train_bpe

TEXT = ["def f(x):\n    return x + 1\n", "alpha beta gamma delta", "elastic ray torch shard"] * 40


def hf_config(kind: str, **over):
    import transformers

    common = dict(vocab_size=300, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, max_position_embeddings=128)
    if kind == "llama":  # GQA, untied, non-default theta and eps
        cfg = dict(common, tie_word_embeddings=False, rope_parameters={"rope_type": "default", "rope_theta": 5000.0},
                   rms_norm_eps=1e-5)
        cfg.update(over)
        return transformers.LlamaConfig(**cfg), transformers.LlamaForCausalLM
    cfg = dict(common, tie_word_embeddings=True)  # Qwen2: q/k/v biases, tied
    cfg.update(over)
    return transformers.Qwen2Config(**cfg), transformers.Qwen2ForCausalLM


def make_hf_dir(path: Path, kind: str, seed: int = 0, max_shard_size: str | None = None, **over):
    """save_pretrained of a random-init model plus a tokenizer (our BPE as PreTrainedTokenizerFast)."""
    import transformers

    cfg, cls = hf_config(kind, **over)
    torch.manual_seed(seed)
    model = cls(cfg).eval()
    with torch.no_grad():  # HF zero-inits biases; random ones make the bias mapping matter
        for name, p in model.named_parameters():
            if name.endswith(".bias"):
                p.normal_(0, 0.1)
    kw = {"max_shard_size": max_shard_size} if max_shard_size else {}
    model.save_pretrained(path, **kw)
    tok = transformers.PreTrainedTokenizerFast(tokenizer_object=train_bpe(TEXT, 300), eos_token=EOS, pad_token=PAD)
    tok.save_pretrained(path)
    return model
