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
from typing import List, Optional, Sequence, Tuple

import numpy as np
import torch
import torch.nn as nn

from elastic.eval.requests import LLRequest, truncate_left
from elastic.model.attention import AttentionMetadata

ROW_ALIGN = 32  # row lengths rounded up to a multiple of this (fewer distinct shapes)
MIN_SHARED = 16  # tokens two items' contexts must share before they share a prefix node


@dataclass
class _Node:
    """A run of tokens at consecutive positions from `pos`, seeing its ancestors. A continuation
    node holds cont[:-1] and predicts `target` (= cont) for output `slot`."""

    tokens: List[int]
    pos: int
    parent: int = -1  # index in the tree's node list (parents come first); -1: the root
    slot: int = -1
    target: Optional[List[int]] = None


@dataclass
class _Tree:
    nodes: List[_Node] = field(default_factory=list)

    @property
    def length(self) -> int:
        return sum(len(n.tokens) for n in self.nodes)

    def add(self, tokens: List[int], pos: int, parent: int, slot: int = -1, target=None) -> int:
        self.nodes.append(_Node(list(tokens), pos, parent, slot, target))
        return len(self.nodes) - 1


def _lcp(a: Sequence[int], b: Sequence[int]) -> int:
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


@dataclass
class _Req:
    context: List[int]
    conts: List[Tuple[int, List[int]]]  # (output slot, continuation)


def _cost(req: _Req, shared: int) -> int:
    """Tokens a request adds to a tree whose root holds its first `shared` context tokens."""
    return len(req.context) - shared + sum(len(c) - 1 for _, c in req.conts)


def plan_trees(requests: Sequence[LLRequest], max_len: int, row_cap: int, share: bool = True) -> Tuple[List[_Tree], int]:
    """Trees for every continuation of every request; returns (trees, number of output slots).

    Slot numbering is request-major, continuation-minor. A continuation whose pair exceeds
    `max_len + 1` tokens gets its own tree with its context truncated on the left (lm-eval).
    The others form tries: requests whose contexts share at least MIN_SHARED leading tokens
    (few-shot examples, a description) share one root node holding that prefix; each request's
    rest of context is a child of it and each continuation a child of that; a tree stays
    within `row_cap` tokens (a request alone may exceed it and gets its own tree).
    `share=False`: one tree per (context, continuation) pair, nothing shared (for comparison)."""
    trees: List[_Tree] = []
    fitting: List[_Req] = []
    s = 0
    for req in requests:
        keep = []
        for cont in req.continuations:
            if not cont:
                raise ValueError("an empty continuation has no log-likelihood (lm-eval refuses it too)")
            ctx, c = truncate_left(req.context, cont, max_len)
            if len(ctx) != len(req.context):
                t = _Tree()
                root = t.add(ctx, 0, -1)
                t.add(c[:-1], len(ctx), root, s, list(c))
                trees.append(t)
            elif share:
                keep.append((s, list(cont)))
            else:
                trees.append(_trie([_Req(list(req.context), [(s, list(cont))])], len(req.context)))
            s += 1
        if keep:
            fitting.append(_Req(list(req.context), keep))
    # group requests sharing a context prefix: sort by context, cut where the prefix gets short
    fitting.sort(key=lambda r: r.context)
    group: List[_Req] = []
    shared = 0
    for req in fitting:
        if group:
            common = min(shared, _lcp(group[0].context, req.context))
            size = common + sum(_cost(g, common) for g in group) + _cost(req, common)
            if common >= MIN_SHARED and size <= row_cap:
                group.append(req)
                shared = common
                continue
            trees.append(_trie(group, shared))
        group, shared = [req], len(req.context)
        if _cost(req, 0) > row_cap:  # alone it exceeds a row: one tree per continuation
            trees.extend(_trie([_Req(req.context, [sc])], len(req.context)) for sc in req.conts)
            group = []
    if group:
        trees.append(_trie(group, shared))
    return trees, s


def _trie(reqs: List[_Req], shared: int) -> _Tree:
    """One request: its context is the root. Several: their shared prefix is."""
    t = _Tree()
    if len(reqs) == 1:
        req = reqs[0]
        root = t.add(req.context, 0, -1)
        for slot, c in req.conts:
            t.add(c[:-1], len(req.context), root, slot, c)
        return t
    root = t.add(reqs[0].context[:shared], 0, -1)
    for req in reqs:
        mid = t.add(req.context[shared:], shared, root)
        for slot, c in req.conts:
            t.add(c[:-1], len(req.context), mid, slot, c)
    return t


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
    node: np.ndarray       # [B, T] node id of each token (unique in the batch); padding: its own
    ancestor: np.ndarray   # [nodes, nodes] bool: [a, b] = b is a or an ancestor of a
    select: np.ndarray     # [N] flat indices of predicting positions
    targets: np.ndarray    # [N] the token each predicts
    slots: np.ndarray      # [N] output slot each belongs to


def lay_out(rows: List[_Row], width: int) -> _Batch:
    B = len(rows)
    tokens = np.zeros((B, width), np.int64)
    positions = np.zeros((B, width), np.int64)
    node = np.zeros((B, width), np.int64)
    parents: List[int] = []
    sel: List[int] = []
    tgt: List[int] = []
    slt: List[int] = []
    for b, row in enumerate(rows):
        at = 0
        for t in row.trees:
            base = len(parents)
            last: List[int] = []  # flat index of the last token on the path to each node
            for k, n in enumerate(t.nodes):
                parents.append(base + n.parent if n.parent >= 0 else -1)
                m = len(n.tokens)
                tokens[b, at:at + m] = n.tokens
                positions[b, at:at + m] = np.arange(n.pos, n.pos + m)
                node[b, at:at + m] = base + k
                own = list(range(b * width + at, b * width + at + m))
                last.append(own[-1] if m else (last[n.parent] if n.parent >= 0 else -1))
                if n.target is not None:
                    pred = [last[n.parent]] + own
                    sel.extend(pred)
                    tgt.extend(n.target)
                    slt.extend([n.slot] * len(n.target))
                at += m
        pad = len(parents)  # the rest of the row: one node of its own
        parents.append(-1)
        node[b, at:] = pad
    n_nodes = len(parents)
    anc = np.eye(n_nodes, dtype=bool)
    for k in range(n_nodes):  # parents come first, so their rows are complete
        if parents[k] >= 0:
            anc[k] |= anc[parents[k]]
    return _Batch(tokens, positions, node, anc, np.asarray(sel, np.int64), np.asarray(tgt, np.int64), np.asarray(slt, np.int64))


def trie_mask(node: torch.Tensor, ancestor: torch.Tensor) -> torch.Tensor:
    """[B, 1, T, T] boolean: a query may attend a key at or before it whose node is the
    query's own node or one of its ancestors (so continuations see their context and any
    shared prefix, never another item or another choice)."""
    T = node.shape[1]
    causal = torch.ones(T, T, dtype=torch.bool, device=node.device).tril()
    return (ancestor[node[:, :, None], node[:, None, :]] & causal)[:, None]


def _batches(rows: List[_Row], width: int, token_budget: int) -> List[List[_Row]]:
    per = max(1, token_budget // max(width, 1))
    return [rows[i:i + per] for i in range(0, len(rows), per)]


@torch.no_grad()
def score(model: nn.Module, requests: Sequence[LLRequest], max_len: int, token_budget: int = 8192,
          row_cap: int = 0, device: torch.device | None = None, share: bool = True) -> List[List[Tuple[float, bool]]]:
    """Per request, per continuation: (sum of log p(token), every token the argmax).

    `max_len`: the model's context window (lm-eval's max_length). `token_budget`: tokens per
    forward (rows x row length). `row_cap`: the longest tree (default 2 x max(max_len, 256)).
    Works on an FSDP-sharded model too (every call is `model(...)`), but then every rank must
    call it with the same number of batches (see `forward_count`)."""
    device = device or next(model.parameters()).device
    trees, n_slots = plan_trees(requests, max_len, row_cap or 2 * max(max_len, 256), share)
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
    trees, _ = plan_trees(requests, max_len, row_cap or 2 * max(max_len, 256))
    n = 0
    for group in _length_groups(trees):
        rows, width = pack_rows(group)
        n += len(_batches(rows, width, token_budget))
    return n


def _run(model: nn.Module, b: _Batch, lls: torch.Tensor, misses: torch.Tensor, device: torch.device) -> None:
    to = lambda a: torch.from_numpy(a).to(device, non_blocking=True)  # noqa: E731
    tokens, positions, node, anc = to(b.tokens), to(b.positions), to(b.node), to(b.ancestor)
    meta = AttentionMetadata(backend="sdpa_mask", batch=tokens.shape[0], seq_len=tokens.shape[1],
                             dense_mask=trie_mask(node, anc))
    select, targets, slots = to(b.select), to(b.targets), to(b.slots)
    logits = model(tokens, positions=positions, meta=meta, select=select).float()
    logp = torch.log_softmax(logits, dim=-1)
    tok_ll = logp.gather(1, targets[:, None])[:, 0]
    miss = (logits.argmax(dim=-1) != targets).double()
    lls.index_add_(0, slots, tok_ll.double())
    misses.index_add_(0, slots, miss)
