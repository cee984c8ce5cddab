"""Task metrics from per-item records, with the formula each number follows.

multiple_choice (lm-eval):   acc      = mean[argmax_i ll_i == gold]
                             acc_norm = mean[argmax_i (ll_i / len(choice_i in characters)) == gold]
                             *_stderr = sample standard deviation / sqrt(n)
perplexity (lm-eval's wikitext, sums over all documents):
                             word_perplexity = exp(-sum ll / sum words), words = len(re.split(r"\\s+", doc))
                             byte_perplexity = exp(-sum ll / sum utf-8 bytes)
                             bits_per_byte   = -sum ll / sum bytes / ln 2
                             token_perplexity = exp(-sum ll / sum tokens)   (depends on the tokenizer)
generation:                  exact_match = mean[extracted answer == target] (after regexes_to_ignore)
code:                        pass@k = mean over items of 1 - C(n-c, k) / C(n, k) (Chen et al. 2021)
"""

from __future__ import annotations

import math
from typing import Any, Dict, List, Sequence

import numpy as np

from elastic.eval.spec import TaskSpec
from elastic.eval.pass_at_k import mean_pass_at_k

FORMULAS = {
    "acc": "mean[argmax_i loglik_i == gold]",
    "acc_norm": "mean[argmax_i loglik_i / chars_i == gold]",
    "word_perplexity": "exp(-sum loglik / sum words)",
    "byte_perplexity": "exp(-sum loglik / sum bytes)",
    "bits_per_byte": "-sum loglik / sum bytes / ln 2",
    "token_perplexity": "exp(-sum loglik / sum tokens)",
    "exact_match": "mean[answer == target]",
    "pass@k": "mean 1 - C(n-c,k)/C(n,k)",
}


def _stderr(x: Sequence[float]) -> float:
    return float(np.std(x, ddof=1) / math.sqrt(len(x))) if len(x) > 1 else float("nan")


def mc_correct(rec: Dict[str, Any]) -> tuple[float, float]:
    lls = np.asarray(rec["lls"], dtype=np.float64)
    chars = np.asarray(rec["chars"], dtype=np.float64)
    return float(np.argmax(lls) == rec["gold"]), float(np.argmax(lls / chars) == rec["gold"])


def aggregate(spec: TaskSpec, records: List[Dict[str, Any]]) -> Dict[str, float]:
    """The task's metrics over its records (any order); `n` is the number of items scored,
    `skipped` the number that could not be (e.g. a choice longer than the model's window)."""
    skipped = sum(1 for r in records if "skipped" in r)
    out = _aggregate(spec, [r for r in records if "skipped" not in r])
    if skipped:
        out["skipped"] = skipped
    return out


def _aggregate(spec: TaskSpec, records: List[Dict[str, Any]]) -> Dict[str, float]:
    n = len(records)
    if n == 0:
        return {"n": 0}
    if spec.type == "multiple_choice":
        acc, norm = zip(*(mc_correct(r) for r in records))
        return {"n": n, "acc": float(np.mean(acc)), "acc_stderr": _stderr(acc),
                "acc_norm": float(np.mean(norm)), "acc_norm_stderr": _stderr(norm)}
    if spec.type == "perplexity":
        return from_sums(spec, partial_sums(spec, records))
    if spec.type == "generation":
        em = [r["exact_match"] for r in records]
        return {"n": n, "exact_match": float(np.mean(em)), "exact_match_stderr": _stderr(em)}
    if spec.type == "code":
        counts = [(len(r["verdicts"]), sum(v == "ok" for v in r["verdicts"])) for r in records]
        out: Dict[str, float] = {"n": n}
        for k in spec.k:
            v = mean_pass_at_k(counts, k)
            if v is not None:
                out[f"pass@{k}"] = v
        return out
    raise ValueError(f"unknown task type {spec.type!r}")


def partial_sums(spec: TaskSpec, records: List[Dict[str, Any]]) -> List[float]:
    """Sums from which `from_sums` gives the task's metrics: added over ranks (one collective)
    they give the metrics of all items, however the items were split. Log-likelihood tasks only.
    The last sum is the number of skipped items."""
    skipped = float(sum(1 for r in records if "skipped" in r))
    records = [r for r in records if "skipped" not in r]
    if spec.type == "multiple_choice":
        c = [mc_correct(r) for r in records]
        return [float(len(records)), sum(a for a, _ in c), sum(b for _, b in c), skipped]
    if spec.type == "perplexity":
        return [float(len(records))] + [float(sum(r[k] for r in records)) for k in ("ll", "words", "bytes", "tokens")] + [skipped]
    raise ValueError(f"partial_sums: {spec.type} tasks are not reduced by sums")


def sums_len(spec: TaskSpec) -> int:
    return 4 if spec.type == "multiple_choice" else 6


def from_sums(spec: TaskSpec, sums: Sequence[float]) -> Dict[str, float]:
    n, skipped = int(sums[0]), int(sums[-1])
    extra = {"skipped": skipped} if skipped else {}
    if n == 0:
        return {"n": 0, **extra}
    if spec.type == "multiple_choice":
        return {"n": n, "acc": sums[1] / n, "acc_norm": sums[2] / n, **extra}
    ll, words, nbytes, toks = sums[1:5]
    return {**extra, "n": n, "word_perplexity": math.exp(-ll / words), "byte_perplexity": math.exp(-ll / nbytes),
            "bits_per_byte": -ll / nbytes / math.log(2), "token_perplexity": math.exp(-ll / toks), "tokens": toks}


def headline(spec: TaskSpec) -> str:
    """The one metric a table shows first for this task type."""
    return {"multiple_choice": "acc_norm", "perplexity": "bits_per_byte", "generation": "exact_match",
            "code": f"pass@{min(spec.k)}"}[spec.type]
