"""Generation throughput: the engine vs its recompute mode, the pre-engine reference path,
Hugging Face transformers' generate() and the memory-bandwidth bound, in one run.

For each preset x batch size it generates `--new-tokens` greedy tokens after prompts of mixed
lengths (uniform in [prompt_len/2, prompt_len]) with each system:

  ours        elastic.generation.generate.generate (static KV cache; CUDA: compiled step in CUDA
              graphs, `--mode` to choose)
  recompute   the same engine with use_cache=False (full forward over every live sequence per step)
  reference   elastic.generation.reference (the pre-engine path: left-padded growing cache
              with a dense mask per step)
  hf          transformers LlamaForCausalLM.generate (default dynamic cache, SDPA), built from a
              random config of the same shape and loaded with the same weights (nothing downloaded)
  int8, int4  ours on a weight-only quantized copy of the same model (generation.weights,
              elastic/generation/quantized.py: the blocks' linear layers quantized by torchao;
              embedding, norms and output head full). int4 runs on CUDA in bf16 only (torchao 0.18
              has no CPU int4 kernel): it is in the default systems there, and refused on CPU.

Quantization quality, per quantized system, on the full model's own greedy tokens (prompt + ours'
completion, teacher-forced through both models): mean and max over completion tokens of
|log p_quantized(token) - log p_full(token)| (log_softmax of the raw logits, fp32), the fraction of
rows whose greedy tokens equal ours', and its speed as a ratio to ours (the full-precision
engine) in the same run; `quantize s` is the time to make the copy (once per rollout in RL).

Tokens counted: generated tokens only (no prompt, no padding); no stop tokens, so every row
produces exactly `--new-tokens`. Time: wall clock of the whole call (prefill, and for ours the
per-call graph capture, included), best of `--repeats`, systems alternating so that a change in
machine load biases none; one untimed warm-up call per system and shape first (for ours on CUDA
that is where the step compiles). Ratios are within this run.

Bound: a decode step must read every weight once (the batch shares the read), so tokens/s <=
batch x bandwidth / weight bytes; weight bytes = parameters x bytes per parameter, the embedding
table counted only when it is also the output projection (tied). KV-cache reads and compute are
ignored, so it is an upper bound. Bandwidth is measured here with a large copy (bytes read +
written / seconds, best of 5): on one H100 expect ~2.5-3 TB/s.

Paged vs static KV cache (`--grpo`, after the main table; skip with `--grpo 0`): a GRPO batch of
`--grpo` prompts x `--group` samples each (prompt lengths as above; sampled at temperature 1, one
seed per row), ended by `--stop-ids` stop tokens (random ids: rows stop at geometric-like mixed
lengths) or `--new-tokens`; `--max-batch` rows decode at once (continuous batching beyond it).
Both caches run the engine's eager step (the paged one has no CUDA graphs). Columns: tokens/s of
each (wall clock of the whole call, best of `--repeats`, the two alternating which goes first),
static / paged tokens/s (the paged median over rounds of the per-round ratio), and KV bytes per
generated token: static = what it allocates (slots x (longest prompt + new tokens) x bytes per
cached token); paged = the peak of blocks in use x block bytes (what a pool must hold), and the
pool it grew to (x1.5 growth); same = whether paged gave exactly static's tokens.

Token agreement: ours must equal recompute and the reference token for token in fp32 (exit
status 1 otherwise); HF's agreement is reported (fraction of rows equal), as is agreement in bf16
(where near-ties make a few rows differ legitimately).

  python bench/generate_throughput.py                      # CPU: tiny and 125m, batch 1, 4, 16
  python bench/generate_throughput.py --device cuda --dtype bf16 --presets 1b --batch 1,16,64 --new-tokens 64
  python bench/generate_throughput.py --smoke              # seconds; checks the script runs
  python bench/generate_throughput.py --presets tiny --batch 1 --systems ours --grpo 8 --group 4  # the paged table

Speculative decoding (`--speculative`, elastic/generation/speculative.py): greedy, eager, on the
prompts of the shipped python tasks (datasets/python-tasks/heldout.jsonl, the `prompt` field:
signature + docstring), tokenized as UTF-8 bytes (ids 0-255; no tokenizer file needed). For each
policy preset and batch size: tokens/s of plain generate vs generate(draft=...) for each
`--drafts` entry (`ngram`: prompt lookup; a preset name: a randomly initialised model of that
preset with the policy's vocabulary, i.e. an untrained draft), best of `--repeats` with the two
sides alternating order each repeat; the acceptance rate (accepted / proposed drafts), tokens a
row gains per policy forward, and whether the tokens equal plain greedy (they must, in fp32:
exit status 1 otherwise).

Caveat, seen: a randomly initialised preset with tied embeddings decodes greedily by repeating
its last token after the first, and so does a random draft, so policy and any draft agree on
every token: acceptance 1, an upper bound on what drafting buys. `--untied` gives both models
their own random output head: the policy's greedy text then falls into short shifting cycles,
which prompt lookup partly catches, and an untrained draft agrees with it about never (a lower
bound). A trained (distilled) draft
lies in between; none is shipped.

  python bench/generate_throughput.py --speculative --threads 1 --presets 125m --drafts ngram,tiny --batch 1,4
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402

from elastic.config import PRESETS  # noqa: E402
from elastic.model import ModelArgs, Transformer  # noqa: E402
from elastic.generation.decoder import CachedDecoder  # noqa: E402
from elastic.generation.generate import generate, run_decoder  # noqa: E402
from elastic.generation.paged_cache import PagedDecoder  # noqa: E402
from elastic.generation.quantized import quantized_weight_bytes  # noqa: E402
from elastic.generation.sampling import SamplingParams  # noqa: E402
from elastic.generation.reference import generate_reference  # noqa: E402

# Vocabulary per preset: the default data.vocab_size for tiny, the 32k the 125m preset is sized for.
DEFAULT_VOCAB = {"tiny": 2048, "125m": 32000, "1b": 128256, "8b": 128256}
SYSTEMS = ("ours", "recompute", "reference", "hf", "int8", "int4")
QUANTIZED = ("int8", "int4")


def build(preset: str, vocab: int, max_len: int, device: str, dtype: torch.dtype, untied: bool = False) -> Transformer:
    dims = dict(PRESETS[preset], vocab_size=vocab, max_seq_len=max_len)
    if untied:
        dims["tie_embeddings"] = False
    model = Transformer(ModelArgs(**dims))
    model.init_weights(seed=0)
    return model.to(device=device, dtype=dtype).eval()


def build_hf(model: Transformer, dtype: torch.dtype):
    """transformers' Llama of the same shape, carrying our weights (elastic/model/hf.py's names)."""
    import transformers

    from elastic.model.hf import hf_config_dict, hf_key_map

    a = model.args
    cfg = transformers.LlamaConfig(**{k: v for k, v in hf_config_dict(a, dtype, None, 0).items()
                                      if k not in ("architectures", "model_type", "torch_dtype")})
    cfg._attn_implementation = "sdpa"
    ours = model.state_dict()
    with torch.device(ours["norm.weight"].device):
        hf = transformers.LlamaForCausalLM(cfg).to(dtype)
    missing, unexpected = hf.load_state_dict({h: ours[k] for k, h in hf_key_map(a).items()}, strict=False)
    assert not unexpected and set(missing) <= {"lm_head.weight"}, (missing, unexpected)
    if a.tie_embeddings:
        hf.tie_weights()
    return hf.eval()


def hf_generate(hf, prompts: list, new_tokens: int) -> list:
    dev = hf.model.embed_tokens.weight.device
    L = max(len(p) for p in prompts)
    ids = torch.tensor([[0] * (L - len(p)) + p for p in prompts], device=dev)
    mask = torch.tensor([[0] * (L - len(p)) + [1] * len(p) for p in prompts], device=dev)
    with torch.no_grad():
        out = hf.generate(input_ids=ids, attention_mask=mask, max_new_tokens=new_tokens, do_sample=False,
                          pad_token_id=0, eos_token_id=None)
    return out[:, L:].tolist()


def prompts_for(batch: int, prompt_len: int, vocab: int, seed: int) -> list:
    g = torch.Generator().manual_seed(seed)
    lens = torch.randint(max(1, prompt_len // 2), prompt_len + 1, (batch,), generator=g).tolist()
    return [torch.randint(0, vocab, (n,), generator=g).tolist() for n in lens]


def weight_bytes(model: Transformer) -> int:
    a = model.args
    n = model.num_params(exclude_embeddings=False)
    if not a.tie_embeddings:
        n -= a.vocab_size * a.dim  # an untied embedding table is read a row per token, not whole
    return n * model.tok_embeddings.weight.element_size()


def measure_bandwidth(device: str) -> float:
    """Bytes/s of a large device-memory copy (read + write), best of 5."""
    n = (1 << 30) if device == "cuda" else (256 << 20)
    x = torch.empty(n, dtype=torch.uint8, device=device)
    y = torch.empty_like(x)
    best = float("inf")
    for _ in range(6):
        _sync(device)
        t0 = time.perf_counter()
        y.copy_(x)
        _sync(device)
        best = min(best, time.perf_counter() - t0)
    del x, y
    return 2 * n / best


def _sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def completion_logprobs(model, prompts: list, completions: list) -> list:
    """Per row, log p(each completion token) under `model`: one teacher-forced forward over prompt
    + completion, log_softmax of the raw logits in fp32."""
    out = []
    dev = model.tok_embeddings.weight.device
    with torch.no_grad():
        for p, c in zip(prompts, completions):
            seq = torch.tensor([list(p) + list(c)], device=dev)
            lp = torch.log_softmax(model(seq)[0, :-1].float(), -1).gather(-1, seq[0, 1:, None])[:, 0]
            out.append(lp[len(p) - 1:].cpu())
    return out


def logprob_delta(full, quant, prompts: list, completions: list) -> tuple:
    """(mean, max) |log p_quant - log p_full| over every completion token."""
    d = torch.cat([(a - b).abs() for a, b in zip(completion_logprobs(quant, prompts, completions),
                                                 completion_logprobs(full, prompts, completions))])
    return float(d.mean()), float(d.max())


def run_system(name: str, model, others: dict, prompts: list, new_tokens: int, mode: str) -> list:
    """`others`: the HF model ("hf") and the quantized copies ("int8", "int4") of this preset."""
    if name in QUANTIZED:
        return [c.tokens for c in generate(others[name], prompts, new_tokens, mode=mode)]
    if name == "ours":
        return [c.tokens for c in generate(model, prompts, new_tokens, mode=mode)]
    if name == "recompute":
        return [c.tokens for c in generate(model, prompts, new_tokens, use_cache=False)]
    if name == "reference":
        return [c.tokens for c in generate_reference(model, prompts, new_tokens)]
    return hf_generate(others["hf"], prompts, new_tokens)


def timed(name: str, model, others, prompts, new_tokens: int, mode: str, device: str):
    _sync(device)
    t0 = time.perf_counter()
    toks = run_system(name, model, others, prompts, new_tokens, mode)
    _sync(device)
    return time.perf_counter() - t0, toks


def _agree(a: list, b: list) -> float:
    return sum(x == y for x, y in zip(a, b)) / len(a)


def _grpo_run(kind: str, model, prompts: list, seeds: list, a, stops: list):
    """One GRPO batch through the engine's scheduler with a static or paged cache: (seconds,
    tokens, decoder)."""
    params = SamplingParams(1.0, 0, 1.0)
    capacity = max(len(p) for p in prompts) + a.new_tokens
    slots = min(len(prompts), a.max_batch)
    t0 = time.perf_counter()
    if kind == "static":
        dec = CachedDecoder(model, slots, capacity, params, "eager")
    else:
        dec = PagedDecoder(model, slots, capacity, params, "eager", a.block_size)
    out = run_decoder(dec, prompts, seeds, a.new_tokens, stops)
    return time.perf_counter() - t0, [c.tokens for c in out], dec


def paged_vs_static(a, preset: str, vocab: int, model) -> dict:
    """The paged table's row for one preset (see the module docstring)."""
    base = prompts_for(a.grpo, a.prompt_len, vocab, seed=1000)
    prompts = [p for p in base for _ in range(a.group)]
    seeds = list(range(len(prompts)))
    stops = torch.randperm(vocab, generator=torch.Generator().manual_seed(7))[:a.stop_ids].tolist()
    kinds = ("static", "paged")
    _grpo_run("static", model, prompts, seeds, a, stops)  # warm-up
    best, ratios, toks, decs = {k: float("inf") for k in kinds}, [], {}, {}
    for r in range(max(1, a.repeats)):
        t = {}
        for k in (kinds if r % 2 == 0 else kinds[::-1]):  # alternate which side goes first
            t[k], toks[k], decs[k] = _grpo_run(k, model, prompts, seeds, a, stops)
            best[k] = min(best[k], t[k])
        ratios.append(t["static"] / t["paged"])
    n = sum(len(x) for x in toks["static"])
    st = decs["paged"].cache.stats()
    sd = decs["static"]
    static_bytes = sum(x.numel() * x.element_size() for x in sd.cache.k + sd.cache.v)
    ratios.sort()
    row = {"preset": preset, "prompts": a.grpo, "group_size": a.group, "max_batch": a.max_batch, "block_size": a.block_size,
           "rows": len(prompts), "generated_tokens": n, "completion_lengths": [len(x) for x in toks["static"]],
           "prompt_lens": [len(p) for p in base], "seconds": best,
           "tokens_per_s": {k: n / best[k] for k in kinds}, "paged_over_static_speed": ratios[len(ratios) // 2],
           "static_kv_bytes": static_bytes, "paged": st, "static_kv_bytes_per_token": static_bytes / n,
           "paged_peak_kv_bytes_per_token": st["peak_bytes"] / n, "paged_pool_kv_bytes_per_token": st["pool_bytes"] / n,
           "same_tokens": toks["static"] == toks["paged"]}
    lens = row["completion_lengths"]
    print(f"paged vs static, {preset}: GRPO batch {a.grpo} prompts x {a.group} samples, max_batch {a.max_batch}, "
          f"block {a.block_size}, completions {min(lens)}-{max(lens)} tokens (mean {n / len(lens):.1f}), {n} generated")
    print(f"  {'static tok/s':>12} {'paged tok/s':>12} {'paged/static':>12} {'static B/tok':>13} {'paged peak B/tok':>17} "
          f"{'paged pool B/tok':>17} {'peak/static':>11}  same tokens")
    print(f"  {row['tokens_per_s']['static']:>12.1f} {row['tokens_per_s']['paged']:>12.1f} {row['paged_over_static_speed']:>11.2f}x "
          f"{row['static_kv_bytes_per_token']:>13.0f} {row['paged_peak_kv_bytes_per_token']:>17.0f} "
          f"{row['paged_pool_kv_bytes_per_token']:>17.0f} {st['peak_bytes'] / static_bytes:>11.2f}  {row['same_tokens']}", flush=True)
    return row


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--presets", default="tiny,125m")
    ap.add_argument("--batch", default="1,4,16", help="comma-separated batch sizes")
    ap.add_argument("--prompt-len", type=int, default=32)
    ap.add_argument("--new-tokens", type=int, default=32)
    ap.add_argument("--vocab", type=int, default=0, help="0: per preset (tiny 2048, 125m 32000, 1b/8b 128256)")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--dtype", choices=("fp32", "bf16"), default=None, help="default: bf16 on CUDA, fp32 on CPU")
    ap.add_argument("--mode", default="auto", help="the engine's mode: auto (CUDA: compile, CPU: eager), eager, fixed, graphs, compile")
    ap.add_argument("--systems", default="", help=f"subset of {','.join(SYSTEMS)} (default: all; int4 only on CUDA in bf16)")
    ap.add_argument("--threads", type=int, default=0, help="torch CPU threads (0: torch's default)")
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--grpo", type=int, default=8, help="paged vs static: prompts in the GRPO batch (0: skip)")
    ap.add_argument("--group", type=int, default=4, help="paged vs static: samples per prompt")
    ap.add_argument("--stop-ids", type=int, default=64, help="paged vs static: random stop token ids (mixed lengths)")
    ap.add_argument("--max-batch", type=int, default=16, help="paged vs static: rows decoded at once")
    ap.add_argument("--block-size", type=int, default=16, help="paged vs static: tokens per block")
    ap.add_argument("--smoke", action="store_true", help="tiny, batch 1 and 2, 8 new tokens")
    ap.add_argument("--speculative", action="store_true", help="plain vs speculative decoding (see the docstring)")
    ap.add_argument("--drafts", default="ngram,tiny", help="--speculative: ngram and/or draft presets")
    ap.add_argument("--draft-tokens", type=int, default=4, help="--speculative: tokens proposed per round")
    ap.add_argument("--untied", action="store_true", help="--speculative: untied output heads (see the docstring)")
    ap.add_argument("--out", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "results", "generate_throughput.json"))
    a = ap.parse_args(argv)
    if a.smoke:
        a.presets, a.batch, a.prompt_len, a.new_tokens, a.repeats = "tiny", "1,2", 8, 8, 1
        a.grpo, a.group, a.max_batch = 2, 2, 3
    if a.threads:
        torch.set_num_threads(a.threads)
    a.dtype = a.dtype or ("bf16" if a.device == "cuda" else "fp32")
    dtype = {"fp32": torch.float32, "bf16": torch.bfloat16}[a.dtype]
    default = [s for s in SYSTEMS if s != "int4" or (a.device == "cuda" and a.dtype == "bf16")]
    systems = [s for s in a.systems.split(",") if s] or default
    if "int4" in systems:
        from elastic.generation.quantized import QuantizationError, check_weights

        try:
            check_weights("int4", torch.device(a.device), dtype)
        except QuantizationError as e:
            print(f"error: {e}", file=sys.stderr)
            return 2
    assert systems[0] == "ours" and set(systems) <= set(SYSTEMS), f"--systems must start with ours, from {SYSTEMS}"
    # Compilation caches go to a scratch directory removed at the end: the JSON is all we leave.
    scratch = tempfile.mkdtemp(prefix="gen-bench-")
    for var in ("TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR"):
        os.environ.setdefault(var, os.path.join(scratch, var.lower()))
    try:
        if a.speculative:
            return _run_speculative(a, dtype)
        return _run(a, dtype, systems)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def _run(a, dtype: torch.dtype, systems: list) -> int:
    bw = measure_bandwidth(a.device)
    rows, paged_rows, exact_ok = [], [], True
    head = f"{'preset':>6} {'batch':>5} " + " ".join(f"{s + ' tok/s':>15}" for s in systems)
    head += f" {'bound tok/s':>12} {'% bound':>8} " + " ".join(f"{'/' + s:>11}" for s in systems[1:]) + "  same tokens as ours"
    print(f"device {a.device} ({torch.cuda.get_device_name(0) if a.device == 'cuda' else platform.processor() or 'cpu'}), "
          f"{a.dtype}, engine mode {a.mode}, measured copy bandwidth {bw / 1e9:.1f} GB/s")
    print(head)
    for preset in a.presets.split(","):
        vocab = a.vocab or DEFAULT_VOCAB[preset]
        model = build(preset, vocab, a.prompt_len + a.new_tokens, a.device, dtype)
        others = {"hf": build_hf(model, dtype) if "hf" in systems else None}
        quant_s = {}
        for w in (s for s in systems if s in QUANTIZED):  # the copy generation uses (per rollout in RL)
            from elastic.generation.quantized import QuantizedCopy

            qc = QuantizedCopy(w)
            qc.refresh(model)  # first call: imports torchao
            others[w] = qc.refresh(model)
            quant_s[w] = qc.refresh_s
        wb = weight_bytes(model)
        for batch in (int(b) for b in a.batch.split(",")):
            prompts = prompts_for(batch, a.prompt_len, vocab, seed=batch)
            for s in systems:  # warm-up: allocator, kernels, and the engine's compile on CUDA
                run_system(s, model, others, prompts, a.new_tokens, a.mode)
            best = {s: float("inf") for s in systems}
            toks = {}
            for r in range(a.repeats):
                for s in (systems if r % 2 == 0 else systems[::-1]):  # alternating sides
                    t, toks[s] = timed(s, model, others, prompts, a.new_tokens, a.mode, a.device)
                    best[s] = min(best[s], t)
            n = sum(len(t) for t in toks["ours"])
            assert n == batch * a.new_tokens
            tps = {s: n / best[s] for s in systems}
            bound = batch * bw / wb
            same = {s: _agree(toks["ours"], toks[s]) for s in systems[1:]}
            if a.dtype == "fp32":
                exact_ok &= all(same[s] == 1.0 for s in ("recompute", "reference") if s in same)
            row = {"preset": preset, "vocab": vocab, "batch": batch, "prompt_lens": [len(p) for p in prompts],
                   "new_tokens_per_row": a.new_tokens, "tokens": n, "params": model.num_params(exclude_embeddings=False),
                   "weight_bytes": wb, "seconds": best, "tokens_per_s": tps, "bound_tokens_per_s": bound,
                   "ours_fraction_of_bound": tps["ours"] / bound,
                   "ours_speedup": {s: tps["ours"] / tps[s] for s in systems[1:]}, "same_tokens_fraction": same}
            for w in (s for s in systems if s in QUANTIZED):
                mean_d, max_d = logprob_delta(model, others[w], prompts, toks["ours"])
                row.setdefault("quantized", {})[w] = {
                    "tokens_per_s_vs_full": tps[w] / tps["ours"], "logprob_abs_delta_mean": mean_d,
                    "logprob_abs_delta_max": max_d, "same_tokens_fraction": same[w], "quantize_s": quant_s[w],
                    "weight_bytes_in_memory": quantized_weight_bytes(others[w]),
                    "full_weight_bytes_in_memory": quantized_weight_bytes(model)}
            rows.append(row)
            line = f"{preset:>6} {batch:>5} " + " ".join(f"{tps[s]:>15.1f}" for s in systems)
            line += f" {bound:>12.0f} {100 * tps['ours'] / bound:>7.1f}% " + " ".join(f"{tps['ours'] / tps[s]:>10.2f}x" for s in systems[1:])
            line += "  " + ", ".join(f"{s} {same[s]:.0%}" for s in systems[1:])
            for w, q in row.get("quantized", {}).items():
                line += (f"\n{'':>12} {w}: {q['tokens_per_s_vs_full']:.2f}x full tok/s, |dlogp| mean {q['logprob_abs_delta_mean']:.2e} "
                         f"max {q['logprob_abs_delta_max']:.2e}, same greedy tokens {q['same_tokens_fraction']:.0%}, "
                         f"quantize {q['quantize_s']:.2f}s, weights {q['weight_bytes_in_memory'] / 2**20:.1f} of "
                         f"{q['full_weight_bytes_in_memory'] / 2**20:.1f} MiB")
            print(line, flush=True)
        if a.grpo:
            paged_rows.append(paged_vs_static(a, preset, vocab, model))
            exact_ok &= paged_rows[-1]["same_tokens"]
        del model, others
    print(f"tok/s = generated tokens (batch x {a.new_tokens}, no prompt or padding) / wall seconds of the whole call, "
          f"best of {a.repeats}; /x = ours tok/s / x tok/s in this run; |dlogp| on ours' greedy tokens; bound = batch x {bw / 1e9:.1f} GB/s / weight bytes; "
          f"{torch.get_num_threads()} CPU threads")
    env = {"torch": torch.__version__, "python": platform.python_version(), "cpu_count": os.cpu_count(),
           "threads": torch.get_num_threads(), "device": a.device, "dtype": a.dtype, "mode": a.mode,
           "bandwidth_bytes_per_s": bw}
    try:
        import transformers

        env["transformers"] = transformers.__version__
    except ImportError:
        pass
    if a.device == "cuda":
        env["gpu"] = torch.cuda.get_device_name(0)
    os.makedirs(os.path.dirname(os.path.abspath(a.out)), exist_ok=True)
    with open(a.out, "w") as f:
        json.dump({"environment": env, "settings": {"prompt_len": a.prompt_len, "new_tokens": a.new_tokens, "repeats": a.repeats,
                                                    "systems": systems}, "results": rows,
                   "paged_vs_static": paged_rows}, f, indent=2)
    print(f"wrote {a.out}")
    return 0 if exact_ok else 1


def task_prompts(batch: int) -> list:
    """The first `batch` prompts of the shipped python tasks' held-out split, as UTF-8 bytes."""
    path = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "datasets", "python-tasks",
                        "heldout.jsonl")
    with open(path) as f:
        texts = [json.loads(line)["prompt"] for line in f if line.strip()]
    return [list(texts[i % len(texts)].encode()) for i in range(batch)]


def _run_speculative(a, dtype: torch.dtype) -> int:
    from elastic.generation.speculative import SpecStats

    rows, exact_ok = [], True
    print(f"device {a.device}, {a.dtype}, {'untied' if a.untied else 'tied'} output heads, greedy, eager, {a.new_tokens} new tokens, draft_tokens {a.draft_tokens}, "
          f"python-tasks prompts as bytes, {torch.get_num_threads()} CPU threads")
    print(f"{'policy':>6} {'draft':>6} {'batch':>5} {'plain tok/s':>12} {'spec tok/s':>11} {'spec/plain':>10} "
          f"{'accept':>7} {'tok/fwd':>8}  same tokens")
    for preset in a.presets.split(","):
        vocab = a.vocab or DEFAULT_VOCAB[preset]
        for batch in (int(b) for b in a.batch.split(",")):
            prompts = task_prompts(batch)
            max_len = max(len(p) for p in prompts) + a.new_tokens + a.draft_tokens + 2
            model = build(preset, vocab, max_len, a.device, dtype, a.untied)
            for dname in a.drafts.split(","):
                draft = "ngram" if dname == "ngram" else build(dname, vocab, max_len, a.device, dtype, a.untied)

                def plain():
                    return [c.tokens for c in generate(model, prompts, a.new_tokens, mode="eager")], None

                def spec():
                    st = SpecStats()
                    out = generate(model, prompts, a.new_tokens, draft=draft, draft_tokens=a.draft_tokens, spec_stats=st)
                    return [c.tokens for c in out], st

                plain()
                spec()  # warm-up
                best, toks, stats = {"plain": float("inf"), "spec": float("inf")}, {}, None
                for r in range(a.repeats):
                    order = (("plain", plain), ("spec", spec)) if r % 2 == 0 else (("spec", spec), ("plain", plain))
                    for name, fn in order:
                        _sync(a.device)
                        t0 = time.perf_counter()
                        toks[name], st = fn()
                        _sync(a.device)
                        best[name] = min(best[name], time.perf_counter() - t0)
                        stats = st or stats
                n = batch * a.new_tokens
                tps = {k: n / v for k, v in best.items()}
                same = _agree(toks["plain"], toks["spec"])
                exact_ok &= a.dtype != "fp32" or same == 1.0
                row = {"policy": preset, "draft": dname, "vocab": vocab, "batch": batch, "new_tokens_per_row": a.new_tokens,
                       "draft_tokens": a.draft_tokens, "seconds": best, "tokens_per_s": tps,
                       "spec_over_plain": tps["spec"] / tps["plain"], "acceptance_rate": stats.acceptance_rate,
                       "tokens_per_forward": stats.tokens_per_round, "proposed": stats.proposed,
                       "accepted": stats.accepted, "same_tokens_fraction": same}
                rows.append(row)
                print(f"{preset:>6} {dname:>6} {batch:>5} {tps['plain']:>12.1f} {tps['spec']:>11.1f} "
                      f"{tps['spec'] / tps['plain']:>9.2f}x {stats.acceptance_rate:>7.2f} {stats.tokens_per_round:>8.2f}  "
                      f"{same:.0%}", flush=True)
                del draft
            del model
    print(f"tok/s = batch x {a.new_tokens} generated tokens / wall seconds of the call (prefill included), best of "
          f"{a.repeats}, the two sides alternating; accept = accepted / proposed drafts; tok/fwd = tokens a row gains "
          "per policy forward (1 without drafting)")
    os.makedirs(os.path.dirname(os.path.abspath(a.out)), exist_ok=True)
    out = a.out.replace("generate_throughput.json", "generate_speculative_untied.json" if a.untied else "generate_speculative.json")
    with open(out, "w") as f:
        json.dump({"environment": {"torch": torch.__version__, "threads": torch.get_num_threads(), "device": a.device,
                                   "dtype": a.dtype, "cpu_count": os.cpu_count(), "untied": a.untied},
                   "settings": {"new_tokens": a.new_tokens, "repeats": a.repeats, "draft_tokens": a.draft_tokens,
                                "prompts": "datasets/python-tasks/heldout.jsonl prompt, UTF-8 bytes"},
                   "results": rows}, f, indent=2)
    print(f"wrote {out}")
    return 0 if exact_ok else 1


if __name__ == "__main__":
    sys.exit(main())
