"""Log-likelihoods of continuations, batched by length, with each context computed once.

lm-evaluation-harness's HF backend runs every (context, continuation) pair as its own padded
row: a 4-choice item with a 500-token few-shot context runs the context 4 times. Here an item's
continuations share one row as a *tree*: the context once, then each continuation's tokens
(all but its last) attending to the context and to their own earlier tokens only, at the
positions they would have after the context alone. The numbers are the same as running each
pair separately (attention sees exactly the same keys at the same positions); what changes is
the work. Trees are then packed first-fit-decreasing into rows of one length (no padding
between them), and rows are batched by a token budget.

Only the positions that predict a continuation token go through the output projection
(`Transformer.forward(select=...)`), and results stay on the device until the end (one host
transfer per call, none per batch).

Input conventions (what is scored, truncation) are lm-eval's: see elastic/eval/requests.py.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import List, Sequence, Tuple

import numpy as np
import torch
import torch.nn as nn

from elastic.eval.requests import LLRequest, truncate_left
from elastic.model.attention import AttentionMetadata

ROW_ALIGN = 32  # row lengths rounded up to a multiple of this (fewer distinct shapes)


@dataclass
class _Tree:
    context: List[int]
    branches: List[Tuple[int, List[int]]] = field(default_factory=list)  # (output slot, continuation)

    @property
    def length(self) -> int:
        return len(self.context) + sum(len(c) - 1 for _, c in self.branches)


def plan_trees(requests: Sequence[LLRequest], max_len: int, row_cap: int) -> Tuple[List[_Tree], int]:
    """Trees for every continuation of every request; returns (trees, number of output slots).

    Slot numbering is request-major, continuation-minor. A continuation whose pair exceeds
    `max_len + 1` tokens gets its own tree with its context truncated on the left (lm-eval);
    the others share their request's context, split into several trees when one would exceed
    `row_cap` tokens."""
    trees: List[_Tree] = []
    slot = 0
    for req in requests:
        current = _Tree(list(req.context))
        for cont in req.continuations:
            if not cont:
                raise ValueError("an empty continuation has no log-likelihood (lm-eval refuses it too)")
            ctx, c = truncate_left(req.context, cont, max_len)
            if len(ctx) != len(req.context):
                trees.append(_Tree(list(ctx), [(slot, list(c))]))
            else:
                if current.branches and current.length + len(c) - 1 > row_cap:
                    trees.append(current)
                    current = _Tree(list(req.context))
                current.branches.append((slot, list(c)))
            slot += 1
        if current.branches:
            trees.append(current)
    return trees, slot


@dataclass
class _Row:
    trees: List[_Tree] = field(default_factory=list)
    used: int = 0


def pack_rows(trees: List[_Tree]) -> Tuple[List[_Row], int]:
    """First-fit decreasing into rows as long as the longest tree (rounded up to ROW_ALIGN)."""
    order = sorted(trees, key=lambda t: -t.length)
    if not order:
        return [], 0
    width = -(-order[0].length // ROW_ALIGN) * ROW_ALIGN
    rows: List[_Row] = []
    for t in order:
        for r in rows:  # rows are few per batch; linear first fit is fine at eval sizes
            if r.used + t.length <= width:
                r.trees.append(t)
                r.used += t.length
                break
        else:
            rows.append(_Row([t], t.length))
    return rows, width


@dataclass
class _Batch:
    tokens: np.ndarray     # [B, T] int64
    positions: np.ndarray  # [B, T]
    tree: np.ndarray       # [B, T] unique per tree in the batch; padding -1
    branch: np.ndarray     # [B, T] 0 = context, i = the i-th branch of its tree
    select: np.ndarray     # [N] flat indices of predicting positions
    targets: np.ndarray    # [N] the token each predicts
    slots: np.ndarray      # [N] output slot each belongs to


def lay_out(rows: List[_Row], width: int) -> _Batch:
    B = len(rows)
    tokens = np.zeros((B, width), np.int64)
    positions = np.zeros((B, width), np.int64)
    tree = np.full((B, width), -1, np.int64)
    branch = np.zeros((B, width), np.int64)
    sel, tgt, slt = [], [], []
    tid = 0
    for b, row in enumerate(rows):
        at = 0
        for t in row.trees:
            c = len(t.context)
            tokens[b, at:at + c] = t.context
            positions[b, at:at + c] = np.arange(c)
            tree[b, at:at + c] = tid
            last_ctx = b * width + at + c - 1
            at += c
            for i, (slot, cont) in enumerate(t.branches, start=1):
                n = len(cont) - 1  # the last continuation token is predicted, never fed
                tokens[b, at:at + n] = cont[:-1]
                positions[b, at:at + n] = np.arange(c, c + n)
                tree[b, at:at + n] = tid
                branch[b, at:at + n] = i
                preds = [last_ctx] + list(range(b * width + at, b * width + at + n))
                sel.extend(preds)
                tgt.extend(cont)
                slt.extend([slot] * len(cont))
                at += n
            tid += 1
        # padding: its own "tree" per row (-1 - b), attending only to earlier padding
        tree[b, at:] = -1 - b
    return _Batch(tokens, positions, tree, branch, np.asarray(sel, np.int64), np.asarray(tgt, np.int64), np.asarray(slt, np.int64))


def tree_mask(tree: torch.Tensor, branch: torch.Tensor) -> torch.Tensor:
    """[B, 1, T, T] boolean: a query may attend a key of its own tree at or before it that is
    context or on its own branch."""
    T = tree.shape[1]
    same = tree[:, :, None] == tree[:, None, :]
    causal = torch.ones(T, T, dtype=torch.bool, device=tree.device).tril()
    shared = (branch[:, None, :] == 0) | (branch[:, :, None] == branch[:, None, :])
    return (same & causal & shared)[:, None]


def _batches(rows: List[_Row], width: int, token_budget: int) -> List[List[_Row]]:
    per = max(1, token_budget // max(width, 1))
    return [rows[i:i + per] for i in range(0, len(rows), per)]


@torch.no_grad()
def score(model: nn.Module, requests: Sequence[LLRequest], max_len: int, token_budget: int = 8192,
          row_cap: int = 0, device: torch.device | None = None) -> List[List[Tuple[float, bool]]]:
    """Per request, per continuation: (sum of log p(token), every token the argmax).

    `max_len`: the model's context window (lm-eval's max_length). `token_budget`: tokens per
    forward (rows x row length). `row_cap`: the longest tree (default max(max_len, 256)).
    Works on an FSDP-sharded model too (every call is `model(...)`), but then every rank must
    call it with the same number of batches (see `forward_count`)."""
    device = device or next(model.parameters()).device
    trees, n_slots = plan_trees(requests, max_len, row_cap or max(max_len, 256))
    lls = torch.zeros(n_slots, dtype=torch.float64, device=device)
    misses = torch.zeros(n_slots, dtype=torch.float64, device=device)
    # long trees first; each length class packs into its own rows
    for group in _length_groups(trees):
        rows, width = pack_rows(group)
        for chunk in _batches(rows, width, token_budget):
            _run(model, lay_out(chunk, width), lls, misses, device)
    lls_h, miss_h = lls.cpu().tolist(), misses.cpu().tolist()
    out, s = [], 0
    for req in requests:
        k = len(req.continuations)
        out.append([(lls_h[s + j], miss_h[s + j] == 0) for j in range(k)])
        s += k
    return out


def _length_groups(trees: List[_Tree]) -> List[List[_Tree]]:
    """Trees grouped so a row's width is at most twice its trees' lengths: short items do not
    pay for the longest one's width."""
    groups: dict = {}
    for t in trees:
        groups.setdefault(max(t.length - 1, 1).bit_length(), []).append(t)
    return [groups[k] for k in sorted(groups, reverse=True)]


def forward_count(requests: Sequence[LLRequest], max_len: int, token_budget: int = 8192, row_cap: int = 0) -> int:
    """How many forwards `score` will run for these requests (to equalise ranks under FSDP)."""
    trees, _ = plan_trees(requests, max_len, row_cap or max(max_len, 256))
    n = 0
    for group in _length_groups(trees):
        rows, width = pack_rows(group)
        n += len(_batches(rows, width, token_budget))
    return n


def _run(model: nn.Module, b: _Batch, lls: torch.Tensor, misses: torch.Tensor, device: torch.device) -> None:
    to = lambda a: torch.from_numpy(a).to(device, non_blocking=True)  # noqa: E731
    tokens, positions, tree, branch = to(b.tokens), to(b.positions), to(b.tree), to(b.branch)
    meta = AttentionMetadata(backend="sdpa_mask", batch=tokens.shape[0], seq_len=tokens.shape[1],
                             dense_mask=tree_mask(tree, branch))
    select, targets, slots = to(b.select), to(b.targets), to(b.slots)
    logits = model(tokens, positions=positions, meta=meta, select=select).float()
    logp = torch.log_softmax(logits, dim=-1)
    tok_ll = logp.gather(1, targets[:, None])[:, 0]
    miss = (logits.argmax(dim=-1) != targets).double()
    lls.index_add_(0, slots, tok_ll.double())
    misses.index_add_(0, slots, miss)
