"""Prefill: prompts through the model in right-padded causal forwards, each writing its keys and
values into a cache, giving the logits after every prompt's last token. One implementation for
every cache: the static one (decoder.CachedDecoder, and the speculative path's target and draft
caches through `prefill_slots`), the paged one (paged_cache.PagedDecoder, with its own
attention) and the no-cache reference (decoder.RecomputeDecoder).

Equal prompts (a GRPO group) are computed once (`distinct_prompts`); the distinct ones go through
in groups whose padded size stays under PREFILL_TOKENS (`chunks`), which bounds activation
memory however many prompts a call admits.
"""

from __future__ import annotations

from typing import Any, Callable, List, Sequence, Tuple

import torch
import torch.nn as nn

from elastic.generation.static_cache import PrefillAttention, StaticKVCache
from elastic.generation.step import forward_hidden

# A prefill forward holds at most this many (padded) prompt tokens (activation memory).
PREFILL_TOKENS = 16384


def right_pad(seqs: List[List[int]], device: torch.device) -> Tuple[torch.Tensor, torch.Tensor]:
    """Sequences → tokens [n, longest] (0-padded on the right) and their lengths [n]."""
    L = max(len(s) for s in seqs)
    tokens = torch.zeros((len(seqs), L), dtype=torch.long)
    for i, s in enumerate(seqs):
        tokens[i, :len(s)] = torch.tensor(s, dtype=torch.long)
    lens = torch.tensor([len(s) for s in seqs], dtype=torch.long)
    return tokens.to(device), lens.to(device)


def last_logits(model: nn.Module, seqs: List[List[int]], rope: torch.Tensor, att_for: Callable[[], Any]) -> torch.Tensor:
    """Logits [n, V] (fp32) after the last token of each sequence, by one right-padded causal
    forward (rope: the complex [n, D/2] table); `att_for()` makes the attention mode (it may
    write a cache)."""
    tokens, lens = right_pad(seqs, rope.device)
    h = forward_hidden(model, tokens, rope[:tokens.shape[1]][None], att_for())
    last = h[torch.arange(len(seqs), device=h.device), lens - 1]
    return model.output(last).float()


def chunks(seqs: Sequence[Sequence[int]], budget: int) -> List[List[int]]:
    """Indices of `seqs` in groups whose padded size (count × longest) fits the token budget."""
    out, cur, longest = [], [], 0
    for i, s in enumerate(seqs):
        L = max(longest, len(s))
        if cur and L * (len(cur) + 1) > budget:
            out.append(cur)
            cur, L = [], len(s)
        cur.append(i)
        longest = L
    return out + [cur] if cur else out


def distinct_prompts(prompts: Sequence[Sequence[int]]) -> Tuple[List[int], List[List[int]]]:
    """(rows, uniq): the distinct prompts in order of first appearance, and for each prompt j the
    index rows[j] of its copy in uniq."""
    distinct: dict = {}
    rows = [distinct.setdefault(tuple(p), len(distinct)) for p in prompts]
    return rows, [list(p) for p in distinct]


def prefill_logits(model: nn.Module, rope: torch.Tensor, uniq: List[List[int]],
                   att_for: Callable[[List[int]], Any]) -> torch.Tensor:
    """Logits [len(uniq), V] fp32 after each prompt of `uniq`, in groups of at most PREFILL_TOKENS
    padded tokens; `att_for(group)` makes the attention of the forward over prompts `group`
    (indices into uniq, in that row order), which writes their keys/values where they belong."""
    logits = torch.empty(len(uniq), model.args.vocab_size, device=rope.device)
    for group in chunks(uniq, PREFILL_TOKENS):
        logits[group] = last_logits(model, [uniq[r] for r in group], rope, lambda: att_for(group))
    return logits


def prefill_slots(model: nn.Module, cache: StaticKVCache, rope: torch.Tensor, slots: List[int],
                  prompts: List[List[int]]) -> torch.Tensor:
    """Write each prompt's keys/values into its slot of a static cache; logits [n, V] fp32 after
    each prompt's last token. Equal prompts are computed once and copied to every slot taking
    them. rope: the complex [capacity, D/2] table."""
    dev = rope.device
    rows, uniq = distinct_prompts(prompts)

    def att_for(group: List[int]) -> PrefillAttention:
        gset = set(group)
        sel = [j for j, r in enumerate(rows) if r in gset]
        local = {r: i for i, r in enumerate(group)}
        slots_t = torch.tensor([slots[j] for j in sel], device=dev)
        rows_t = torch.tensor([local[rows[j]] for j in sel], device=dev)
        return PrefillAttention(cache, slots_t, rows_t)

    return prefill_logits(model, rope, uniq, att_for)[torch.tensor(rows, device=dev)]
