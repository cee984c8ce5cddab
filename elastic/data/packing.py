"""Pack tokenized documents into fixed-length samples without losing or duplicating a token.

Documents (each followed by EOS) are concatenated in order and cut into `seq_len` windows;
a document may continue into the next sample, where its positions restart (RoPE positions
stay below `seq_len`, and attention cannot see the part in the previous sample anyway). The last
window of a shard is padded (padding is its own "document", never trained on). Each token
carries its document index within the sample and its position within its document, which
is all attention masking and RoPE need.

Packing also emits the training targets (`labels`): the next token of the same document, or
IGNORE where there is none (a document's last token in the sample, padding) or where the next
token is not to be learned. Pretraining learns every token; SFT passes a per-document target
mask so only completion (assistant) tokens and their EOS carry loss. The trainer never
re-derives targets: what to learn is data, decided once here.
"""

from __future__ import annotations

from typing import Dict, List, Optional, Sequence

import numpy as np

PAD_DOC = -1
IGNORE = -100  # target of a position that carries no loss (torch's cross_entropy ignore_index)


def pack_documents(docs: Sequence[Sequence[int]], seq_len: int, eos_id: int, pad_id: int,
                   target_masks: Optional[Sequence[Sequence[bool]]] = None,
                   split_documents: bool = True) -> Dict[str, np.ndarray]:
    """docs: token ids per document (without EOS) → arrays with one row per sample:
    tokens [n, seq_len] int32, positions [n, seq_len] int32, doc_ids [n, seq_len] int32
    (PAD_DOC for padding), labels [n, seq_len] int32 (IGNORE where no loss), n_real [n] int32.

    target_masks: per document, one flag per token (without EOS) saying whether that token is
    to be learned (predicted from the tokens before it); the appended EOS is learned when the
    document's last token is, unless the mask carries one more flag, the EOS's own. None: every
    token is learned (pretraining).
    split_documents=False (SFT): a document that does not fit in what is left of a sample
    starts the next one (the rest is padding), so no example loses its prompt to a sample
    boundary; every document must then fit in `seq_len` with its EOS."""
    lens = np.fromiter((len(d) + 1 for d in docs), dtype=np.int64, count=len(docs))
    total = int(lens.sum())
    if total == 0:
        empty = np.zeros((0, seq_len), np.int32)
        return {"tokens": empty, "positions": empty.copy(), "doc_ids": empty.copy(), "labels": empty.copy(),
                "n_real": np.zeros(0, np.int32)}
    # Where each document starts in the (padded) stream of samples.
    if split_documents:
        starts = np.concatenate([[0], np.cumsum(lens)[:-1]])
        end = total
    else:
        if int(lens.max()) > seq_len:
            raise ValueError(f"a document of {int(lens.max())} tokens (with EOS) does not fit in seq_len {seq_len}")
        starts = np.empty(len(docs), np.int64)
        pos = 0
        for i, n in enumerate(lens.tolist()):
            if pos % seq_len + n > seq_len:
                pos += seq_len - pos % seq_len
            starts[i] = pos
            pos += n
        end = pos
    n_samples = -(-end // seq_len)
    padded = n_samples * seq_len
    tokens = np.full(padded, pad_id, np.int32)
    doc_ids = np.full(padded, PAD_DOC, np.int64)
    learned = np.zeros(padded, bool)
    for i, d in enumerate(docs):
        o, n = int(starts[i]), len(d)
        tokens[o:o + n] = d
        tokens[o + n] = eos_id
        doc_ids[o:o + n + 1] = i
        if target_masks is None:
            learned[o:o + n + 1] = True
        else:
            m = np.asarray(target_masks[i], dtype=bool)
            if len(m) == n + 1:  # the EOS's own flag given (e.g. not learned after a truncation)
                learned[o:o + n + 1] = m
                continue
            if len(m) != n:
                raise ValueError(f"document {i}: target mask has {len(m)} flags for {n} tokens")
            learned[o:o + n] = m
            learned[o + n] = bool(m[-1]) if n else True
    tokens, doc_ids, learned = tokens.reshape(n_samples, seq_len), doc_ids.reshape(n_samples, seq_len), learned.reshape(n_samples, seq_len)
    # Renumber documents within each sample from 0 so ids stay small and local.
    first = np.where(doc_ids[:, :1] >= 0, doc_ids[:, :1], 0)
    local = np.where(doc_ids >= 0, doc_ids - first, PAD_DOC).astype(np.int32)
    n_real = (local >= 0).sum(axis=1).astype(np.int32)
    positions = positions_from_doc_ids(local)
    labels = labels_for(tokens, local, learned)
    return {"tokens": tokens, "positions": positions, "doc_ids": local, "labels": labels, "n_real": n_real}


def labels_for(tokens: np.ndarray, doc_ids: np.ndarray, learned: Optional[np.ndarray] = None) -> np.ndarray:
    """Next-token targets [n, T] int32 that never cross a document boundary or enter padding;
    with `learned` [n, T] bool, a target counts only where the *target* token is learned."""
    labels = np.full(tokens.shape, IGNORE, dtype=np.int32)
    same = (doc_ids[:, 1:] == doc_ids[:, :-1]) & (doc_ids[:, 1:] >= 0)
    if learned is not None:
        same &= learned[:, 1:]
    labels[:, :-1] = np.where(same, tokens[:, 1:], IGNORE)
    return labels


def unpack_tokens(tokens: np.ndarray, doc_ids: np.ndarray) -> List[int]:
    """All real (non-padding) tokens in order: the inverse of packing, for checks."""
    return tokens[doc_ids >= 0].tolist()


def positions_from_doc_ids(doc_ids: np.ndarray) -> np.ndarray:
    """Position of each token within its document run in the row (restarts at every run)."""
    n, T = doc_ids.shape
    idx = np.broadcast_to(np.arange(T), (n, T))
    start = np.zeros((n, T), dtype=bool)
    start[:, 0] = True
    start[:, 1:] = doc_ids[:, 1:] != doc_ids[:, :-1]
    run_start = np.maximum.accumulate(np.where(start, idx, 0), axis=1)
    return (idx - run_start).astype(np.int32)
