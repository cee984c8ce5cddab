"""Document perplexity for curation (`perplexity` stage, docs/curate.md): a project checkpoint,
run directory or Hugging Face directory scores each document as exp(mean NLL per token).

Loaded once per Ray Data actor of the per-document pass (elastic/launch/curate.py's
BlockCurator; one GPU each where the cluster has GPUs and `curate.perplexity_use_gpu`, else a
CPU). The model and tokenizer load as jobs/eval.py loads them (elastic/launch/eval.py:
`resolve_models`, `resolve_init_from`, `from_pretrained`, `TokenizerView`); a run directory
means its last `step_N`. A document longer than the model's window is scored in lm-eval's
disjoint rolling windows (elastic/eval/requests.py `rolling_windows`: every token predicted
once, the first after the tokenizer's prefix token, later windows with up to max_seq_len - 1
tokens of context), batched by a token budget (elastic/eval/loglik.py `score`)."""

from __future__ import annotations

import math
import os
from typing import List, Optional, Sequence


class DocScorer:
    """texts -> perplexities (inf for a text with no tokens)."""

    def __init__(self, path: str, use_gpu: bool = True, dtype: str = "auto", token_budget: int = 8192,
                 max_len: int = 0) -> None:
        import torch

        from elastic.config.init_from import resolve_init_from
        from elastic.eval.evaluate import TokenizerView
        from elastic.launch.eval import resolve_models
        from elastic.model.hf import from_pretrained

        self.path = resolve_models([path])[-1].path
        self.device = torch.device("cuda" if use_gpu and torch.cuda.is_available() else "cpu")
        name = dtype if dtype != "auto" else ("bfloat16" if self.device.type == "cuda" else "float32")
        src = resolve_init_from(self.path, key="curate.perplexity_model")
        self.model = from_pretrained(self.path, device=self.device, dtype=getattr(torch, name)).eval()
        self.tok = TokenizerView.from_file(src.tokenizer)
        self.max_len = min(max_len, int(self.model.args.max_seq_len)) if max_len > 0 else int(self.model.args.max_seq_len)
        self.token_budget = max(token_budget, self.max_len + 1)

    def __call__(self, texts: Sequence[str]) -> List[float]:
        import torch

        from elastic.eval import loglik
        from elastic.eval.requests import LLRequest, rolling_windows

        reqs: List[LLRequest] = []
        owner: List[int] = []
        ntok: List[int] = []
        for i, t in enumerate(texts):
            ids = self.tok.encode_plain(t)
            ntok.append(len(ids))
            for ctx, cont in rolling_windows(ids, self.tok.prefix_id, self.max_len):
                reqs.append(LLRequest(ctx, [cont]))
                owner.append(i)
        nll = [0.0] * len(texts)
        if reqs:
            with torch.no_grad():
                res = loglik.score(self.model, reqs, self.max_len, token_budget=self.token_budget, device=self.device)
            for i, r in zip(owner, res):
                nll[i] -= r[0][0]
        return [math.exp(nll[i] / n) if n else math.inf for i, n in enumerate(ntok)]


def make_scorer(cs) -> DocScorer:
    """The scorer of a curate section (perplexity_model, _use_gpu, _dtype, _token_budget)."""
    return DocScorer(cs.perplexity_model, use_gpu=cs.perplexity_use_gpu, dtype=cs.perplexity_dtype,
                     token_budget=cs.perplexity_token_budget)


def wants_gpu(cs, cluster_gpus: float) -> bool:
    """Whether the per-document actors ask Ray for a GPU each: the perplexity stage is on with
    the built-in scorer, curate.perplexity_use_gpu, and the cluster has GPUs."""
    return "perplexity" in cs.stages and not cs.perplexity_scorer and cs.perplexity_use_gpu and cluster_gpus >= 1


def check_model(path: str) -> Optional[str]:
    """A one-line problem with curate.perplexity_model, or None (checked on the driver)."""
    if not path:
        return "curate.perplexity_model: the perplexity stage needs a checkpoint, run or Hugging Face directory"
    try:
        from elastic.launch.eval import resolve_models

        resolve_models([path])
    except ValueError as e:
        return f"curate.perplexity_model: {e}"
    return None if os.path.exists(path) else f"curate.perplexity_model: {path}: no such directory"
