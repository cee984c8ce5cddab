"""The peer for training throughput: Hugging Face transformers `LlamaForCausalLM` on one device.

The same shape as one of our presets, fp32 master weights with bf16 autocast on CUDA (fp32 on
CPU), fused AdamW on CUDA, SDPA attention with a plain causal mask (no document masking: an
advantage to the peer), gradient accumulation to the same global batch, and optionally
`torch.compile`. It reports tokens/s over steady steps and MFU by *our* formula
(`elastic.model.flops_per_token`) against the same peak, so the two rows of a table compare.
Nothing is downloaded: the model is built from a config with random weights.

  python bench/hf_peer.py --preset 1b --seq-len 4096 --global-batch 8 --micro-batch 2 --compile on
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def run_peer(preset: str, seq_len: int, global_batch: int, micro_batch: int, compile_model: bool,
             vocab: int = 0, warmup: int = 3, steps: int = 10) -> dict:
    import torch
    import transformers
    from transformers import LlamaConfig, LlamaForCausalLM

    from elastic.config.presets import PRESETS
    from elastic.model import ModelArgs, flops_per_token
    from elastic.train.metrics import peak_flops

    p = dict(PRESETS[preset])
    vocab = vocab or p.get("vocab_size") or 2048
    dim, L, H = p["dim"], p["n_layers"], p["n_heads"]
    KV, F = p.get("n_kv_heads") or H, p["ffn_hidden"]
    cuda = torch.cuda.is_available()
    dev = torch.device("cuda" if cuda else "cpu")
    cfg = LlamaConfig(vocab_size=vocab, hidden_size=dim, intermediate_size=F, num_hidden_layers=L, num_attention_heads=H,
                      num_key_value_heads=KV, tie_word_embeddings=p.get("tie_embeddings", True),
                      rope_theta=p.get("rope_theta", 10000.0), max_position_embeddings=seq_len, attn_implementation="sdpa")
    torch.manual_seed(0)
    model = LlamaForCausalLM(cfg).to(dev)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=cuda)
    fwd = torch.compile(model) if compile_model else model
    accum = max(1, global_batch // micro_batch)
    x = torch.randint(0, vocab, (micro_batch, seq_len), device=dev)
    args = ModelArgs(vocab_size=vocab, dim=dim, n_layers=L, n_heads=H, n_kv_heads=KV, ffn_hidden=F, max_seq_len=seq_len)
    fpt = flops_per_token(args, seq_len)
    peak, src = peak_flops(dev)

    def step():
        for _ in range(accum):
            with torch.autocast(dev.type, dtype=torch.bfloat16, enabled=cuda):
                loss = fwd(input_ids=x, labels=x).loss
            (loss / accum).backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)

    def sync():
        if cuda:
            torch.cuda.synchronize()

    for _ in range(warmup):
        step()
    sync()
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    t0 = time.perf_counter()
    for _ in range(steps):
        step()
    sync()
    dt = (time.perf_counter() - t0) / steps
    tps = accum * micro_batch * seq_len / dt
    return {"peer": "hf_transformers_llama_sdpa", "preset": preset, "micro_batch": micro_batch, "compile": compile_model,
            "global_batch": accum * micro_batch, "seq": seq_len, "vocab": vocab, "step_s": dt, "tokens_per_s": tps,
            "mfu": tps * fpt / peak, "flops_per_token": fpt, "peak_flops": peak, "peak_source": src,
            "max_mem_gib": torch.cuda.max_memory_allocated() / 2**30 if cuda else None,
            "transformers": transformers.__version__, "torch": torch.__version__, "device": str(dev)}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--preset", default="1b")
    ap.add_argument("--seq-len", type=int, default=4096)
    ap.add_argument("--global-batch", type=int, default=8)
    ap.add_argument("--micro-batch", type=int, default=2)
    ap.add_argument("--compile", default="off", choices=["on", "off"])
    ap.add_argument("--vocab", type=int, default=0, help="vocabulary size (default: the preset's)")
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--steps", type=int, default=10)
    a = ap.parse_args(argv)
    print(json.dumps(run_peer(a.preset, a.seq_len, a.global_batch, a.micro_batch, a.compile == "on", a.vocab,
                              a.warmup, a.steps)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
