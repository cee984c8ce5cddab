"""Evaluate items of a task with a model in this process: the per-worker half of evaluation.

`ItemEvaluator.run(spec, items)` returns one plain record per item (what `eval.json` keeps and
`metrics.aggregate` reduces); the same code serves `jobs/eval.py` (one model per Ray worker,
items sharded) and the in-training hook (the live FSDP model, every rank in step).

Record fields by task type:
  perplexity       ll, tokens, words, bytes (lm-eval's wikitext counts)
  multiple_choice  lls [per choice], greedy [per choice], gold, chars [per choice]
  generation       generated (cut at the stop strings), answer (after extraction), target, exact_match
  code             completions [samples] (scored afterwards by the sandboxed python_tests verifier)
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import torch
import torch.nn as nn

from elastic.eval import loglik
from elastic.eval.requests import (LLRequest, choice_request, cut_at_stops, extract_regex, normalize_for_match,
                                   rolling_windows)
from elastic.eval.spec import Doc, TaskSpec


Item = Tuple[int, Doc, str]  # (index in the task, the item, its full context with few-shot examples)


@dataclass
class TokenizerView:
    """What evaluation needs of a tokenizer, as lm-eval 0.4's HFLM uses it: `encode` with the
    tokenizer's own default for special tokens (a post-processor that adds BOS, as Llama 3's
    does, adds it; ours adds nothing), `encode_plain` without them (a continuation after an
    empty context), both encoding text as text (special-token spellings in a task's text are
    characters, issue 58), `decode` skipping special tokens, the prefix token (BOS if the tokenizer
    has one, else EOS) and EOS, which always stops generation."""

    encode: Callable[[str], List[int]]
    encode_plain: Callable[[str], List[int]]
    decode: Callable[[List[int]], str]
    eos_id: int
    prefix_id: int
    # A task's stop strings (its YAML's `until`, config, not data): special tokens parsed, so
    # `until: ["<|im_end|>"]` stops on that token's id. None: `encode`.
    encode_stop: Optional[Callable[[str], List[int]]] = None

    @classmethod
    def from_file(cls, tokenizer_json: str) -> "TokenizerView":
        from elastic.data.tokenizer import info_from_file

        return cls.from_info(info_from_file(tokenizer_json))

    @classmethod
    def from_info(cls, info) -> "TokenizerView":
        """From a data plan's TokenizerInfo (the JSON text itself; training workers)."""
        from tokenizers import Tokenizer

        tok = Tokenizer.from_str(info.json)
        bos = tok.token_to_id(info.bos_token) if info.bos_token else None
        return cls.of(tok, info.eos_id, bos)

    @classmethod
    def of(cls, tok, eos: int, bos: Optional[int]) -> "TokenizerView":
        from elastic.data.tokenizer import plain_copy

        text = plain_copy(tok)  # a task's text is text: a special token's spelling in it stays characters
        return cls(encode=lambda s: text.encode(s).ids, encode_plain=lambda s: text.encode(s, add_special_tokens=False).ids,
                   decode=lambda ids: tok.decode(ids, skip_special_tokens=True),
                   eos_id=eos, prefix_id=bos if bos is not None else eos,
                   encode_stop=lambda s: tok.encode(s, add_special_tokens=False).ids)


@dataclass
class ItemEvaluator:
    model: nn.Module
    tok: TokenizerView
    max_len: int                 # the model's context window (lm-eval's max_length)
    token_budget: int = 8192     # tokens per scoring forward
    gen_batch: int = 64          # prompts decoded together
    generate_fn: Optional[Callable] = None  # (prompts, max_new, temperature, top_p, seeds, stop_seqs) -> [Completion]
    # The model generation tasks generate with (e.g. a weight-only quantized copy of `model`,
    # elastic/generation/quantized.py); None: `model`. Scoring always uses `model`.
    gen_model: Optional[nn.Module] = None

    # --- log-likelihood tasks ---

    def plan(self, spec: TaskSpec, items: Sequence[Item]) -> Tuple[List[LLRequest], List[int], Dict[int, str]]:
        """Every scoring request of these items, flat, in item order; how many belong to each
        item (rolling perplexity gives one per window); and the items skipped, by position,
        with the reason: a multiple-choice continuation longer than the model's window cannot
        be scored whole (lm-eval asserts and stops; here the item is counted and left out)."""
        reqs: List[LLRequest] = []
        counts: List[int] = []
        skipped: Dict[int, str] = {}
        for j, (_, d, c) in enumerate(items):
            if spec.type == "perplexity":
                win = [LLRequest(list(a), [list(b)]) for a, b in rolling_windows(self.tok.encode(d.text), self.tok.prefix_id, self.max_len)]
            else:
                r = choice_request(self.tok.encode, c, d.choices, spec.target_delimiter, self.tok.prefix_id, self.tok.encode_plain)
                longest = max(len(x) for x in r.continuations)
                if longest > self.max_len:
                    skipped[j] = f"a choice of {longest} tokens does not fit the model's {self.max_len}-token window"
                    win = []
                else:
                    win = [r]
            reqs.extend(win)
            counts.append(len(win))
        return reqs, counts, skipped

    def requests(self, spec: TaskSpec, items: Sequence[Item]) -> List[LLRequest]:
        return self.plan(spec, items)[0]

    def score_items(self, spec: TaskSpec, items: Sequence[Item]) -> List[Dict[str, Any]]:
        reqs, counts, skipped = self.plan(spec, items)
        got = loglik.score(self.model, reqs, self.max_len, self.token_budget)
        out, w = [], 0
        for j, ((i, d, _), k) in enumerate(zip(items, counts)):
            res, w = got[w:w + k], w + k
            if j in skipped:
                out.append({"id": d.id, "index": i, "skipped": skipped[j]})
            elif spec.type == "perplexity":
                out.append({"id": d.id, "index": i, "ll": sum(r[0][0] for r in res),
                            "tokens": sum(len(q.continuations[0]) for q in reqs[w - k:w]),
                            "words": len(re.split(r"\s+", d.text)), "bytes": len(d.text.encode("utf-8"))})
            else:
                out.append({"id": d.id, "index": i, "lls": [ll for ll, _ in res[0]], "greedy": [g for _, g in res[0]],
                            "gold": d.gold, "chars": [len(c) for c in d.choices]})
        return out

    # --- generation tasks ---

    def generate_items(self, spec: TaskSpec, items: Sequence[Item], seed: int = 0) -> List[Dict[str, Any]]:
        ctxs = [c for _, _, c in items]
        # lm-eval: the context keeps its last (max_length - max_gen_toks) tokens. A model whose
        # window is not longer than max_gen_toks (lm-eval would keep one token or none) keeps
        # half its window for the context and generates at most the other half.
        max_new = spec.max_gen_toks if spec.max_gen_toks < self.max_len else max(1, self.max_len // 2)
        keep = max(1, self.max_len - max_new)
        prompts = []
        for c in ctxs:
            ids = self.tok.encode(c)
            ids = ids or [self.tok.prefix_id]
            prompts.append(ids[-keep:])
        n = spec.samples
        flat = [p for p in prompts for _ in range(n)]
        seeds = [seed * 1_000_003 + i * 1009 + s for i, _, _ in items for s in range(n)]  # per item, not per shard
        stop_seqs = [ids for ids in map(self.tok.encode_stop or self.tok.encode, spec.until) if ids]
        comps = self._generate(flat, max_new, spec.temperature if n > 1 else 0.0, spec.top_p, seeds, stop_seqs)
        texts = [cut_at_stops(self.tok.decode(c.tokens), spec.until) for c in comps]
        out = []
        for j, (i, d, _) in enumerate(items):
            mine = texts[j * n:(j + 1) * n]
            if spec.type == "code":
                out.append({"id": d.id, "index": i, "completions": mine})
            else:
                out.append(self._answer_record(spec, i, d, mine[0]))
        return out

    def _generate(self, prompts, max_new, temperature, top_p, seeds, stop_seqs):
        if self.generate_fn is not None:
            return self.generate_fn(prompts, max_new, temperature, top_p, seeds, stop_seqs)
        from elastic.generation.generate import generate

        model = self.gen_model if self.gen_model is not None else self.model
        return generate(model, prompts, max_new, temperature=temperature, top_p=top_p, seed=seeds,
                        stop_token_ids=[self.tok.eos_id], stop_sequences=stop_seqs, max_batch=self.gen_batch)

    @staticmethod
    def _answer_record(spec: TaskSpec, i: int, d: Doc, text: str) -> Dict[str, Any]:
        return {"id": d.id, "index": i, "generated": text, **judge_answer(spec, text, d.target)}

    def run(self, spec: TaskSpec, items: Sequence[Item], seed: int = 0) -> List[Dict[str, Any]]:
        """items: (index in the task, Doc, full context from `fewshot_contexts`; "" for perplexity)."""
        if spec.type in ("perplexity", "multiple_choice"):
            return self.score_items(spec, items)
        return self.generate_items(spec, items, seed)


def judge_answer(spec: TaskSpec, text: str, target: str) -> Dict[str, Any]:
    """Extraction and exact match of one generation: `regex` (lm-eval's RegexFilter, then its
    exact_match with regexes_to_ignore / ignore_case) or `math_answer` (the verifier's answer
    extraction and equivalence), or the whole text."""
    if spec.extract == "math_answer":
        from elastic.reward.verifiers.math_answer import score_math

        ok, reason = score_math(text, target)
        from elastic.reward.verifiers.math_answer import extract_answer

        return {"answer": extract_answer(text) or "", "target": target, "exact_match": float(ok), "reason": reason}
    ans = extract_regex(text, spec.pattern, spec.group_select) if spec.extract == "regex" else text
    a = normalize_for_match(ans, spec.ignore_case, spec.regexes_to_ignore)
    b = normalize_for_match(target, spec.ignore_case, spec.regexes_to_ignore)
    return {"answer": ans, "target": target, "exact_match": float(a == b)}


@torch.no_grad()
def model_max_len(model: nn.Module) -> int:
    return int(model.args.max_seq_len)
