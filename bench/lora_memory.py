"""Memory and speed of a training step: full, LoRA and QLoRA (one process, no FSDP).

For each preset and mode (`full`: every weight trains; `lora-R`: rank-R adapters on all seven
projections, base frozen; `qlora-R`: the same adapters on a base whose block linears are NF4,
`model.quantize_base: nf4`, elastic/model/quantize.py) a fresh child process builds the model,
runs `--steps` AdamW steps of causal-LM loss on random tokens ([batch, seq_len]) and reports:

- trainable / total parameters (a tied matrix counted once);
- state bytes: parameters + gradients + AdamW moments, summed from the tensors after the last
  step (exact, independent of the allocator; an NF4 weight counts its codes, scalers and codebook);
- peak RSS of the child (`ru_maxrss`, includes Python, torch and activations; under QLoRA it
  includes the fp32 base built before quantizing), the RSS right after building the model (the
  baseline the step adds to), and the peak RSS of the steps alone (VmHWM reset after the build);
- step time: median wall time of the steps after the first (which allocates the optimizer
  state), forward + backward + optimizer.

Each configuration runs in its own process, one after another, so peaks do not mix; on a
shared machine quote the ratios (LoRA ÷ full, measured in the same run), not the absolute
seconds. With `--device cuda` the peak is `torch.cuda.max_memory_allocated` and the frozen
base is kept in `--dtype` (bf16) as the trainer does under LoRA.

  python bench/lora_memory.py                                 # 125m, full vs LoRA-16 vs QLoRA-16, CPU
  python bench/lora_memory.py --presets tiny,125m --ranks 8,64
  python bench/lora_memory.py --smoke                         # seconds; checks the script runs
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

DEFAULT_VOCAB = {"tiny": 2048, "125m": 32000, "1b": 128256, "8b": 128256}


def _rss_mib() -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def _reset_peak_rss() -> None:
    """Start VmHWM (peak RSS) afresh from the current RSS (Linux: clear_refs 5)."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        pass


def _peak_rss_mib() -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def child(preset: str, rank: int, batch: int, seq_len: int, steps: int, threads: int, device: str, dtype: str,
          nf4: bool = False) -> dict:
    """One configuration, measured in this process (rank 0 = full fine-tuning; `nf4`: QLoRA)."""
    import torch
    import torch.nn.functional as F

    from elastic.config import PRESETS
    from elastic.model import ModelArgs, Transformer
    from elastic.model.lora import LoRAConfig, apply_lora, init_adapters, trainable_counts
    from elastic.model.quantize import stored_bytes

    torch.set_num_threads(threads)
    torch.manual_seed(0)
    dims = dict(PRESETS[preset], vocab_size=DEFAULT_VOCAB[preset], max_seq_len=seq_len)
    model = Transformer(ModelArgs(**dims))
    if rank:
        apply_lora(model, LoRAConfig(rank=rank, alpha=2.0 * rank))
    model.init_weights(seed=0)
    if rank:
        init_adapters(model, seed=0)
    low = {"bf16": torch.bfloat16, "fp32": torch.float32}[dtype]
    if rank and low != torch.float32:  # the frozen base in the compute dtype, adapters fp32
        for p in model.parameters():
            if not p.requires_grad:
                p.data = p.data.to(low)
    if nf4:
        from elastic.model.quantize import quantize_base

        quantize_base(model)
    model.to(device)
    trainable, total = trainable_counts(model)
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-4)
    rss_model = _rss_mib()
    _reset_peak_rss()
    if device == "cuda":
        torch.cuda.reset_peak_memory_stats()
    g = torch.Generator().manual_seed(1)
    x = torch.randint(0, dims["vocab_size"], (batch, seq_len), generator=g).to(device)
    times = []
    for _ in range(steps):
        if device == "cuda":
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        with torch.autocast(device, dtype=low, enabled=low != torch.float32):
            logits = model(x)
        loss = F.cross_entropy(logits[:, :-1].float().flatten(0, 1), x[:, 1:].flatten())
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=False)  # keep the gradients: they are part of the step's memory
        if device == "cuda":
            torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
    seen, state = set(), 0
    for p in model.parameters():
        if id(p) in seen:
            continue
        seen.add(id(p))
        state += stored_bytes(p) + (p.grad.numel() * p.grad.element_size() if p.grad is not None else 0)
    for s in opt.state.values():
        state += sum(v.numel() * v.element_size() for v in s.values() if torch.is_tensor(v) and v.dim() > 0)
    out = {"preset": preset, "mode": (f"qlora-{rank}" if nf4 else f"lora-{rank}") if rank else "full", "trainable_params": trainable, "total_params": total,
           "state_mib": state / 2**20, "rss_after_build_mib": rss_model,
           "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, "peak_rss_steps_mib": _peak_rss_mib(),
           "step_s": statistics.median(times[1:]) if len(times) > 1 else times[0], "first_step_s": times[0],
           "tokens_per_step": batch * seq_len, "loss": float(loss)}
    if device == "cuda":
        out["peak_cuda_mib"] = torch.cuda.max_memory_allocated() / 2**20
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--presets", default="125m")
    ap.add_argument("--ranks", default="16", help="LoRA ranks to compare with full fine-tuning (comma-separated)")
    ap.add_argument("--no-qlora", action="store_true", help="skip the QLoRA (NF4 base) runs")
    ap.add_argument("--batch", type=int, default=2)
    ap.add_argument("--seq-len", type=int, default=256)
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--dtype", default="fp32", choices=("fp32", "bf16"))
    ap.add_argument("--smoke", action="store_true", help="tiny, 2 steps, batch 1, seq 32")
    ap.add_argument("--out", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "results", "lora_memory.json"))
    ap.add_argument("--child", help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.child:
        preset, rank, *q = a.child.split(":")
        print(json.dumps(child(preset, int(rank), a.batch, a.seq_len, a.steps, a.threads, a.device, a.dtype, nf4=q == ["nf4"])))
        return 0
    if a.smoke:
        a.presets, a.ranks, a.steps, a.batch, a.seq_len = "tiny", "8", 2, 1, 32
    rows = []
    for preset in a.presets.split(","):
        ranks = [int(r) for r in a.ranks.split(",")]
        for rank, q in [(0, "")] + [(r, "") for r in ranks] + ([] if a.no_qlora else [(r, ":nf4") for r in ranks]):
            cmd = [sys.executable, os.path.abspath(__file__), "--child", f"{preset}:{rank}{q}", "--batch", str(a.batch),
                   "--seq-len", str(a.seq_len), "--steps", str(a.steps), "--threads", str(a.threads), "--device", a.device,
                   "--dtype", a.dtype]
            res = subprocess.run(cmd, capture_output=True, text=True, check=True)
            rows.append(json.loads(res.stdout.strip().splitlines()[-1]))
    print(f"{'preset':7} {'mode':8} {'trainable':>12} {'total':>12} {'state MiB':>10} {'peak RSS MiB':>13} "
          f"{'steps peak':>11} {'step s':>8} {'vs full':>8}")
    for r in rows:
        full = next(x for x in rows if x["preset"] == r["preset"] and x["mode"] == "full")
        r["state_ratio_vs_full"] = r["state_mib"] / full["state_mib"]
        r["peak_rss_ratio_vs_full"] = r["peak_rss_mib"] / full["peak_rss_mib"]
        r["step_time_ratio_vs_full"] = r["step_s"] / full["step_s"]
        print(f"{r['preset']:7} {r['mode']:8} {r['trainable_params']:>12,} {r['total_params']:>12,} {r['state_mib']:>10.1f} "
              f"{r['peak_rss_mib']:>13.1f} {r['peak_rss_steps_mib']:>11.1f} {r['step_s']:>8.2f} {r['step_time_ratio_vs_full']:>7.2f}x")
    if not a.smoke:
        os.makedirs(os.path.dirname(a.out), exist_ok=True)
        with open(a.out, "w") as f:
            json.dump({"settings": {k: getattr(a, k) for k in ("presets", "ranks", "batch", "seq_len", "steps", "threads", "device", "dtype")},
                       "machine": {"platform": platform.platform(), "cpus": os.cpu_count(), "python": platform.python_version(),
                                   "load_avg_at_end": os.getloadavg()}, "rows": rows}, f, indent=2)
        print(f"wrote {a.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
