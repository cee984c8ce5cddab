"""From items to token requests, by lm-evaluation-harness's rules, so numbers compare.

* Context: `description` + one `context + target_delimiter + target + fewshot_delimiter` per
  few-shot example + the item's context (lm-eval's `fewshot_context`).
* A (context, continuation) pair is encoded as lm-eval's HFLM `_encode_pair` does: trailing
  whitespace of the context moves to the front of the continuation; the pair is encoded whole
  and the continuation is what follows the context's own encoding; special tokens as the
  tokenizer adds them by default (lm-eval 0.4.13 passes nothing: a BOS-adding tokenizer adds
  BOS); an empty context becomes the prefix token alone.
* Rolling perplexity: lm-eval's `get_rolling_token_windows` + `make_disjoint_window` with
  context_len 1: every token is predicted exactly once, with up to `max_len` tokens of context,
  the first one from the prefix token.
* Left truncation: a request longer than `max_len + 1` keeps its last `max_len + 1` tokens
  (lm-eval's `_loglikelihood_tokens`), and the scored tokens are always the continuation's.

Pure functions over token lists; the model never appears here.
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass
from typing import Callable, Iterator, List, Sequence, Tuple

from elastic.eval.spec import Doc, TaskSpec

Encode = Callable[[str], List[int]]


@dataclass
class LLRequest:
    """One context and the continuations scored after it (a multiple-choice item's choices, or one
    rolling-perplexity window). Continuations share the context's forward pass where they fit."""

    context: List[int]
    continuations: List[List[int]]


def draw_shots(spec: TaskSpec, docs: Sequence[Doc], pool: Sequence[Doc], same_file: bool) -> List[List[Doc]]:
    """Every item's few-shot examples, drawn as lm-eval 0.4 draws them (api/samplers.py): one
    random.Random(fewshot_seed) per task, used up in item order; from the item's own file,
    num_fewshot + 1 are drawn and the item itself dropped. `first_n` takes the pool's first
    rows (MMLU's dev split). Done once, on the driver, for all items in order, so an item's
    context does not depend on how items are sharded or which were already done."""
    n = spec.num_fewshot
    if n == 0:
        return [[] for _ in docs]
    rnd = random.Random(spec.fewshot_seed)
    out = []
    for d in docs:
        if spec.fewshot_sampler == "first_n":
            cands = list(pool[:n + 1]) if same_file else list(pool[:n])
        else:
            cands = rnd.sample(list(pool), min(len(pool), n + 1 if same_file else n))
        out.append([x for x in cands if not (same_file and x.id == d.id)][:n])
    return out


def fewshot_contexts(spec: TaskSpec, docs: Sequence[Doc], pool: Sequence[Doc], same_file: bool) -> List[str]:
    """The full context of every item (description, shots, the item's own context)."""
    return [build_context(spec, d, shots) for d, shots in zip(docs, draw_shots(spec, docs, pool, same_file))]


def build_context(spec: TaskSpec, doc: Doc, shots: Sequence[Doc]) -> str:
    """lm-eval's fewshot_context: description, the examples each followed by the few-shot
    delimiter, then the item's context."""
    parts = [spec.description]
    for s in shots:
        parts.append(s.context + spec.target_delimiter + s.shot_target() + spec.fewshot_delimiter)
    parts.append(doc.context)
    return "".join(parts)


def encode_pair(encode: Encode, context: str, continuation: str, prefix_id: int,
                encode_plain: Encode | None = None) -> Tuple[List[int], List[int]]:
    """lm-eval HFLM._encode_pair (and the empty-context rule of HFLM.loglikelihood: the prefix
    token, then the continuation encoded without special tokens, `encode_plain`)."""
    if context == "":
        return [prefix_id], (encode_plain or encode)(continuation)
    n_spaces = len(context) - len(context.rstrip())
    if n_spaces > 0:
        continuation = context[-n_spaces:] + continuation
        context = context[:-n_spaces]
    whole = encode(context + continuation)
    ctx = encode(context)
    return ctx, whole[len(ctx):]


def choice_request(encode: Encode, context: str, choices: Sequence[str], delimiter: str, prefix_id: int,
                   encode_plain: Encode | None = None) -> LLRequest:
    """A multiple-choice item: one continuation per choice, `delimiter + choice` (lm-eval's
    target_delimiter). The context encoding is the same for every choice (it is encoded alone)."""
    pairs = [encode_pair(encode, context, delimiter + c, prefix_id, encode_plain) for c in choices]
    return LLRequest(context=pairs[0][0], continuations=[c for _, c in pairs])


def rolling_windows(tokens: List[int], prefix_id: int, max_len: int, context_len: int = 1) -> Iterator[Tuple[List[int], List[int]]]:
    """lm-eval utils.get_rolling_token_windows followed by make_disjoint_window.

    Yields (context, continuation) pairs whose continuations tile `tokens` exactly once; each
    window is at most `max_len` tokens long (context + continuation - 1)."""
    if not 1 <= context_len <= max_len:
        raise ValueError(f"rolling_windows: need 1 <= context_len ({context_len}) <= max_len ({max_len})")
    if not tokens:
        return
    pred_len = max_len - context_len + 1
    first = min(max_len, len(tokens))
    windows = [([prefix_id] + tokens[:first - 1], tokens[:first])]
    predicted = first
    while predicted < len(tokens):
        n = min(len(tokens) - predicted, pred_len)
        end = predicted + n
        windows.append((tokens[end - max_len - 1:end - 1], tokens[end - n:end]))
        predicted += n
    for a, b in windows:  # make_disjoint_window
        yield a[:len(a) - (len(b) - 1)], b


def truncate_left(context: List[int], continuation: List[int], max_len: int) -> Tuple[List[int], List[int]]:
    """The (context, continuation) lm-eval actually runs: the last max_len + 1 tokens of their
    concatenation (the input is all but the last), the continuation always scored whole."""
    total = len(context) + len(continuation)
    if total <= max_len + 1:
        return context, continuation
    if len(continuation) > max_len:
        raise ValueError(f"a continuation of {len(continuation)} tokens does not fit the model's {max_len}-token window")
    return context[total - (max_len + 1):], continuation


# --- text after generation (lm-eval's until handling, filters and exact_match) ---

def cut_at_stops(text: str, until: Sequence[str]) -> str:
    """lm-eval generate_until: the generation is cut at the first occurrence of each stop string
    in turn (`text.split(term)[0]` for every term)."""
    for term in until:
        if term:
            text = text.split(term)[0]
    return text


def extract_regex(text: str, pattern: str, group_select: int = 0, fallback: str = "[invalid]") -> str:
    """lm-eval's RegexFilter: all matches; `group_select` picks one (-1: the last); a match with
    groups yields its first non-empty group; no match yields the fallback."""
    found = re.compile(pattern).findall(text)
    if not found:
        return fallback
    try:
        m = found[group_select]
    except IndexError:
        return fallback
    if isinstance(m, tuple):
        m = [x for x in m if x]
        m = m[0] if m else fallback
    return m.strip()


def normalize_for_match(text: str, ignore_case: bool, regexes_to_ignore: Sequence[str]) -> str:
    """lm-eval's exact_match preprocessing (HF `evaluate`'s exact_match): remove each regex,
    then lower-case when asked."""
    for r in regexes_to_ignore:
        text = re.sub(r, "", text)
    return text.lower() if ignore_case else text
