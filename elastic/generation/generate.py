"""Batched autoregressive generation with log-probabilities, in plain PyTorch (no Ray, no
process group): the engine every caller uses (GRPO rollouts and evaluation through
elastic/train/fsdp_generate.py, the benchmark).

`generate(model, prompts, max_new_tokens, ...)` returns, per prompt, the new token ids, the
log-probability of each under the model's own distribution and why it stopped:

* **Log-probabilities** are `log_softmax` of the raw logits (fp32), before temperature,
  top-k or top-p: the quantity a policy-gradient loss recomputes in its training forward
  pass, whatever sampling settings produced the tokens.
* **Static KV cache, fixed-shape decode** (elastic/generation/decoder.py, static_cache.py): one
  preallocated cache slot per row, written in place; each step decodes [b, 1] tokens and reads
  the cache through a length mask built on the device, so on CUDA the step is captured once per
  batch bucket as a CUDA graph (around an inductor-compiled step) and replayed.
* **Continuous batching.** At most `max_batch` rows decode at once. When a row finishes, the
  next waiting prompt is prefilled into its slot (only that slot is written); when none is left,
  the live rows are packed into a smaller batch (on CPU: exactly the live rows; with CUDA
  graphs: the next power of two), so a long tail costs what its rows cost. Prompts that are
  equal (a GRPO group) are prefilled once and copied to their slots.
* **Seeds.** Each prompt has a seed (`seed`: one int per prompt, or `seed + i` for prompt i when
  a single int is given, or drawn from torch's global RNG). The randomness of the token a row
  samples at index t is a fixed function of (seed, t), computed on the device
  (elastic/generation/sampling.py): a prompt's completion depends on its seed alone, not on the
  batch, its slot or when it was admitted. (Logits may differ in the last bits between batch
  shapes; a sample flips only on such a near-tie.) The draws differ from
  generate_reference's per-row `torch.Generator` (same distribution).
* **Stops.** A token in `stop_token_ids`, or the tokens of one of `stop_sequences` ending the
  completion, end the row; they are kept (finish reason `stop`). Otherwise the row ends after
  `max_new_tokens` (finish reason `length`). `on_finish(i, completion)` is called for each
  prompt as its row ends, so a caller can stream completions onward (GRPO's reward service).
* `use_cache=False` recomputes every live sequence in full each step (the exactness reference
  and a benchmark baseline); it gives the same tokens.

On an FSDP2-sharded model the parameters must be gathered around the call
(elastic/train/fsdp_generate.py): the engine runs the blocks' forwards directly, with no FSDP
hook and so no collective, and ranks may run different numbers of steps.
The pre-engine implementation is elastic/generation/reference.py (tests compare with it).
"""

from __future__ import annotations

import os
from collections import deque
from typing import Callable, List, Optional, Sequence, Union

import torch
import torch.nn as nn

from elastic.generation.completion import Completion, check_inputs, row_seeds
from elastic.generation.decoder import CachedDecoder, RecomputeDecoder, check_unsharded, model_device, resolve_mode
from elastic.generation.sampling import SamplingParams, filter_logits

__all__ = ["Completion", "filter_logits", "generate", "run_decoder"]

# With fixed shapes (CUDA graphs) the capacity is rounded up to a multiple of 16 (the alignment
# attention kernels want for the key length of a mask).
CAPACITY_ROUND = 16
# `mode="auto"` can be overridden without code changes (e.g. ELASTIC_GENERATE_MODE=graphs on a
# machine where inductor is unavailable).
MODE_ENV = "ELASTIC_GENERATE_MODE"
KV_CACHES = ("static", "paged")


def _int64(s: int) -> int:
    """A seed as a signed 64-bit value (the bit pattern is what the sampler hashes)."""
    s &= (1 << 64) - 1
    return s - (1 << 64) if s >= 1 << 63 else s


@torch.no_grad()
def generate(model: nn.Module, prompts: List[List[int]], max_new_tokens: int, temperature: float = 0.0,
             top_p: float = 1.0, top_k: int = 0, stop_token_ids: Sequence[int] = (),
             seed: Union[int, Sequence[int], None] = None, use_cache: bool = True,
             on_finish: Optional[Callable[[int, Completion], None]] = None,
             stop_sequences: Sequence[Sequence[int]] = (), max_batch: int = 256, mode: str = "auto",
             draft=None, draft_tokens: int = 4, draft_ngram: int = 3, spec_stats=None,
             kv_cache: str = "static", block_size: int = 16) -> List[Completion]:
    """Generate up to `max_new_tokens` after each prompt; see the module docstring.

    `max_batch`: most rows decoded at once (continuous batching beyond it). `mode`: auto
    (CUDA: compile, else eager), eager, fixed, graphs or compile (elastic/generation/decoder.py).
    `draft`: speculative decoding (elastic/generation/speculative.py): None (off), "ngram"
    (prompt lookup, n-gram size `draft_ngram`), a draft model or its path; `draft_tokens`
    proposed per round; `spec_stats` (a speculative.SpecStats) collects acceptance and speed.
    It runs eagerly, also on CUDA (mode auto or eager; fixed/graphs/compile are refused), on the
    static cache, and needs `use_cache`.
    `kv_cache`: static (one slot of max length per row) or paged (blocks of `block_size` tokens,
    elastic/generation/paged_cache.py; modes eager and fixed, auto = eager)."""
    n = len(prompts)
    check_inputs(model, prompts, max_new_tokens, temperature, top_p, top_k)
    seqs = [[int(t) for t in q] for q in stop_sequences]
    if any(len(q) == 0 for q in seqs):
        raise ValueError("generate: stop_sequences must not contain an empty sequence")
    if max_batch < 1:
        raise ValueError(f"generate: max_batch must be >= 1, got {max_batch}")
    if kv_cache not in KV_CACHES:
        raise ValueError(f"generate: kv_cache must be one of {', '.join(KV_CACHES)}, got {kv_cache!r}")
    if block_size < 1:
        raise ValueError(f"generate: block_size must be >= 1, got {block_size}")
    out = [Completion() for _ in range(n)]
    if n == 0 or max_new_tokens == 0:
        return out
    check_unsharded(model)
    seeds = [_int64(s) for s in row_seeds(seed, n)]
    asked = mode
    if draft is not None and (kv_cache != "static" or not use_cache):
        raise ValueError("generate: speculative decoding (draft) runs on the static KV cache: "
                         f"needs kv_cache='static' and use_cache=True, got {kv_cache!r}, {use_cache}")
    if kv_cache == "paged" and mode == "auto":
        mode = "eager"  # the paged step is not captured (elastic/generation/paged_cache.py)
    mode = resolve_mode(os.environ.get(MODE_ENV, "auto") if mode == "auto" else mode, model_device(model))
    params = SamplingParams(float(temperature), int(top_k), float(top_p))
    if draft is not None:
        from elastic.generation.speculative import generate_speculative, make_drafter

        if asked not in ("auto", "eager"):
            raise ValueError(f"generate: speculative decoding runs eagerly; mode {mode!r} needs draft=None")
        return generate_speculative(model, make_drafter(draft, draft_ngram), prompts, seeds, max_new_tokens, params,
                                    draft_tokens, stop_token_ids, seqs, on_finish, max_batch, out, spec_stats)
    capacity = max(len(p) for p in prompts) + max_new_tokens
    slots = min(n, max_batch)
    if not use_cache:
        dec = RecomputeDecoder(model, slots, capacity, params)
    else:
        if mode != "eager":
            capacity = -(-capacity // CAPACITY_ROUND) * CAPACITY_ROUND
        if kv_cache == "paged":
            from elastic.generation.paged_cache import PagedDecoder

            dec = PagedDecoder(model, slots, capacity, params, mode, block_size)
        else:
            dec = CachedDecoder(model, slots, capacity, params, mode)
    return run_decoder(dec, prompts, seeds, max_new_tokens, stop_token_ids, seqs, on_finish, out)


def run_decoder(dec, prompts: List[List[int]], seeds: List[int], max_new_tokens: int, stop_token_ids: Sequence[int] = (),
                stop_sequences: Sequence[List[int]] = (), on_finish: Optional[Callable[[int, Completion], None]] = None,
                out: Optional[List[Completion]] = None) -> List[Completion]:
    """Continuous batching over a decoder (CachedDecoder or RecomputeDecoder); `generate` builds
    the decoder, tests pass their own (e.g. one whose step is compiled)."""
    out = out if out is not None else [Completion() for _ in prompts]
    return _Scheduler(dec, prompts, seeds, max_new_tokens, stop_token_ids, stop_sequences, on_finish, out).run()


class _Scheduler:
    """Which prompt is in which slot; admission, finishing, compaction. All host-side Python on
    the one [2, b] result a step returns."""

    def __init__(self, dec, prompts, seeds, max_new, stop_ids, stop_seqs, on_finish, out):
        self.dec, self.prompts, self.seeds, self.max_new = dec, prompts, seeds, max_new
        self.stop_ids = set(int(t) for t in stop_ids)
        self.stop_seqs = [list(q) for q in stop_seqs]
        self.stop_last = {q[-1] for q in self.stop_seqs}
        self.on_finish, self.out = on_finish, out
        self.queue = deque(range(len(prompts)))
        self.slot: List[Optional[int]] = [None] * dec.slots  # prompt index in each slot
        self.length = [0] * dec.slots  # tokens in each slot's sequence (prompt + generated)
        self.admit_min = dec.admit_min  # free slots that make a prefill worth its forward
        self.b = 0

    def run(self) -> List[Completion]:
        self._admit()
        while self.b:
            live = [s for s in range(self.b) if self.slot[s] is not None]
            toks, lps = self.dec.step(self.b, max(self.length[s] for s in live))
            done = [s for s in live if self._record(s, toks[s], lps[s])]
            self._free(done)
            self._admit()
        return self.out

    def _record(self, s: int, tok: int, logp: float) -> bool:
        """Append a sampled token to slot s's completion; True if that finishes it."""
        i = self.slot[s]
        c = self.out[i]
        c.tokens.append(tok)
        c.logprobs.append(logp)
        self.length[s] += 1
        if tok in self.stop_ids or (tok in self.stop_last and any(c.tokens[-len(q):] == q for q in self.stop_seqs)):
            c.finish_reason = "stop"
        elif len(c.tokens) < self.max_new:
            return False
        if self.on_finish is not None:
            self.on_finish(i, c)
        return True

    def _free(self, slots: List[int]) -> None:
        for s in slots:
            self.slot[s] = None
        self.dec.release(slots)

    def _admit(self) -> None:
        """Prefill waiting prompts into free slots, or, with none waiting, pack the live rows into
        the smallest bucket; then set b (the rows a step computes)."""
        while self.queue:
            free = [s for s in range(self.dec.slots) if self.slot[s] is None]
            if len(free) < min(len(self.queue), self.admit_min):
                break
            take = free[:len(self.queue)]
            idx = [self.queue.popleft() for _ in take]
            for s, i in zip(take, idx):
                self.slot[s], self.length[s] = i, len(self.prompts[i])
            toks, lps = self.dec.prefill(take, [self.prompts[i] for i in idx], [self.seeds[i] for i in idx])
            self._free([s for s, t, lp in zip(take, toks, lps) if self._record(s, t, lp)])
        live = [s for s in range(self.dec.slots) if self.slot[s] is not None]
        if not self.queue and live:
            target = self.dec.bucket(len(live))
            src = [s for s in live if s >= target]
            if src:
                dst = [s for s in range(target) if self.slot[s] is None][:len(src)]
                self.dec.move(src, dst)
                for a, d in zip(src, dst):
                    self.slot[d], self.length[d], self.slot[a] = self.slot[a], self.length[a], None
            live = [s for s in range(self.dec.slots) if self.slot[s] is not None]
        self.b = self.dec.bucket(live[-1] + 1) if live else 0
