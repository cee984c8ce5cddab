"""Generation throughput: KV cache vs recomputing the whole sequence every step.

For each preset × batch size it generates `--new-tokens` greedy tokens after prompts of
mixed lengths (uniform in [prompt_len/2, prompt_len], left-padded in one batch), once with
the KV cache and once without (`generate(..., use_cache=False)`: a full forward over prompt +
generated tokens per step), and reports new tokens per second for each and their ratio.
Tokens counted: generated tokens only (no prompt, no padding); no stop tokens, so every row
produces exactly `--new-tokens`. Time: wall clock of the whole generate() call (prefill
included), best of `--repeats`, the two modes alternating. Both must produce the same
tokens (checked). On a shared machine, quote the ratio, not the absolute figures.
Weights are random (`init_weights`), which does not change the cost.

  python bench/generate_throughput.py                       # tiny and 125m, batch 1 and 16, CPU
  python bench/generate_throughput.py --device cuda --dtype bf16 --presets 125m,1b --batch 1,16,64
  python bench/generate_throughput.py --smoke               # seconds; checks the script runs
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402

from elastic.config import PRESETS  # noqa: E402
from elastic.model import ModelArgs, Transformer  # noqa: E402
from elastic.model.generate import generate  # noqa: E402

# Vocabulary per preset: the default data.vocab_size for tiny, the 32k the 125m preset is sized for.
DEFAULT_VOCAB = {"tiny": 2048, "125m": 32000, "1b": 128256, "8b": 128256}


def build(preset: str, vocab: int, max_len: int, device: str, dtype: torch.dtype) -> Transformer:
    dims = dict(PRESETS[preset], vocab_size=vocab, max_seq_len=max_len)
    model = Transformer(ModelArgs(**dims))
    model.init_weights(seed=0)
    return model.to(device=device, dtype=dtype).eval()


def prompts_for(batch: int, prompt_len: int, vocab: int, seed: int) -> list:
    g = torch.Generator().manual_seed(seed)
    lens = torch.randint(max(1, prompt_len // 2), prompt_len + 1, (batch,), generator=g).tolist()
    return [torch.randint(0, vocab, (n,), generator=g).tolist() for n in lens]


def timed(model, prompts, new_tokens: int, use_cache: bool, device: str):
    if device == "cuda":
        torch.cuda.synchronize()
    t0 = time.perf_counter()
    out = generate(model, prompts, new_tokens, use_cache=use_cache)
    if device == "cuda":
        torch.cuda.synchronize()
    return time.perf_counter() - t0, out


def compare(model, prompts, new_tokens: int, repeats: int, device: str):
    """Best-of-`repeats` seconds for cache and recompute, alternating the two so that a change
    in machine load between them biases neither."""
    best = {True: float("inf"), False: float("inf")}
    outs = {}
    for _ in range(repeats):
        for use_cache in (True, False):
            t, outs[use_cache] = timed(model, prompts, new_tokens, use_cache, device)
            best[use_cache] = min(best[use_cache], t)
    return best[True], outs[True], best[False], outs[False]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--presets", default="tiny,125m")
    ap.add_argument("--batch", default="1,16", help="comma-separated batch sizes")
    ap.add_argument("--prompt-len", type=int, default=32)
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--vocab", type=int, default=0, help="0: per preset (tiny 2048, 125m 32000, 1b/8b 128256)")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--dtype", choices=("fp32", "bf16"), default="fp32")
    ap.add_argument("--threads", type=int, default=0, help="torch CPU threads (0: torch's default)")
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--smoke", action="store_true", help="tiny, batch 1 and 2, 8 new tokens")
    ap.add_argument("--out", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "results", "generate_throughput.json"))
    a = ap.parse_args(argv)
    if a.smoke:
        a.presets, a.batch, a.prompt_len, a.new_tokens, a.repeats = "tiny", "1,2", 8, 8, 1
    if a.threads:
        torch.set_num_threads(a.threads)
    dtype = {"fp32": torch.float32, "bf16": torch.bfloat16}[a.dtype]

    rows = []
    print(f"{'preset':>7} {'vocab':>6} {'batch':>5} {'cache tok/s':>12} {'recompute tok/s':>16} {'ratio':>7}  same tokens")
    for preset in a.presets.split(","):
        vocab = a.vocab or DEFAULT_VOCAB[preset]
        model = build(preset, vocab, a.prompt_len + a.new_tokens, a.device, dtype)
        for batch in (int(b) for b in a.batch.split(",")):
            prompts = prompts_for(batch, a.prompt_len, vocab, seed=batch)
            generate(model, prompts, 2)  # warm-up (allocator, kernels)
            t_cache, out_c, t_full, out_f = compare(model, prompts, a.new_tokens, a.repeats, a.device)
            n = sum(len(c.tokens) for c in out_c)
            same = [c.tokens for c in out_c] == [c.tokens for c in out_f]
            row = {"preset": preset, "vocab": vocab, "batch": batch, "prompt_lens": [len(p) for p in prompts],
                   "new_tokens_per_row": a.new_tokens, "tokens": n, "cache_s": t_cache, "recompute_s": t_full,
                   "cache_tokens_per_s": n / t_cache, "recompute_tokens_per_s": n / t_full,
                   "speedup": t_full / t_cache, "same_tokens": same, "params": model.num_params(exclude_embeddings=False)}
            rows.append(row)
            print(f"{preset:>7} {vocab:>6} {batch:>5} {row['cache_tokens_per_s']:>12.1f} {row['recompute_tokens_per_s']:>16.1f} "
                  f"{row['speedup']:>6.2f}x  {same}", flush=True)
        del model
    print(f"tokens/s = generated tokens (batch x {a.new_tokens}, no prompt or padding) / wall seconds of generate(), "
          f"best of {a.repeats}; ratio = recompute seconds / cache seconds; device {a.device}, {a.dtype}, "
          f"{torch.get_num_threads()} CPU threads")
    env = {"torch": torch.__version__, "python": platform.python_version(), "cpu_count": os.cpu_count(),
           "threads": torch.get_num_threads(), "device": a.device, "dtype": a.dtype}
    if a.device == "cuda":
        env["gpu"] = torch.cuda.get_device_name(0)
    os.makedirs(os.path.dirname(os.path.abspath(a.out)), exist_ok=True)
    with open(a.out, "w") as f:
        json.dump({"environment": env, "settings": {"prompt_len": a.prompt_len, "new_tokens": a.new_tokens, "repeats": a.repeats},
                   "results": rows}, f, indent=2)
    print(f"wrote {a.out}")
    return 0 if all(r["same_tokens"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
