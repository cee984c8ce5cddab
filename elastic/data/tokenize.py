"""One shard's documents → its packed samples, in packing order: the unit of work the store
builder runs once per shard and run (elastic/data/builder.py).

The output does not depend on the epoch or on who reads it: the per-epoch sample order is a
permutation applied at read time (elastic/data/cursor.py:sample_order), so one cached copy of
a shard serves every epoch, every world size and every restart.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Dict, List, Tuple

import numpy as np

from elastic.data.chat import render_segments, tokenize_segments
from elastic.data.documents import BadRows, read_shard
from elastic.data.packing import pack_documents
from elastic.data.shards import Shard
from elastic.data.tokenizer import from_json, plain_copy


@dataclass
class PackedShard:
    """tokens/doc_ids/labels [n, seq_len] int32 and n_real [n] int32 (row i = packing index i),
    plus the shard's malformed rows (and, for SFT, conversations cut or skipped as too long)
    and the documents `data.curate` removed, by reason."""

    arrays: Dict[str, np.ndarray]
    bad_rows: BadRows
    documents: int
    curated: Dict[str, int] = None  # documents removed by data.curate stages, by reason

    @property
    def samples(self) -> int:
        return int(len(self.arrays["n_real"]))

    @property
    def tokens(self) -> int:
        return int(self.arrays["n_real"].sum())


def shard_curator(plan):
    """The plan's per-document curation stages, built once (a packer keeps it), or None."""
    if not getattr(plan, "curate_stages", ()):
        return None
    import dataclasses

    from elastic.data.curate.pipeline import DocPipeline

    return DocPipeline(dataclasses.replace(plan.curate, stages=list(plan.curate_stages)))


def curate_docs(docs: List[str], curator) -> Tuple[List[str], Dict[str, int]]:
    """The documents the stages keep (in order) and the removals counted by reason."""
    out, _ = curator.run([{"id": str(i), "text": t, "order": i} for i, t in enumerate(docs)])
    removed: Dict[str, int] = {}
    for d in out:
        if d["reason"]:
            removed[d["reason"]] = removed.get(d["reason"], 0) + 1
    return [d["text"] for d in out if not d["reason"]], removed


def pack_shard(plan, shard: Shard, tok=None, curator=None) -> PackedShard:
    """Read, tokenize and pack one shard (`plan`: elastic.data.pipeline.DataPlan). Pretraining
    documents are encoded in one `encode_batch` call and may continue across samples; SFT
    conversations are rendered, masked to their assistant tokens and never split. `tok`: the
    plan's tokenizer already loaded (a long-lived packer loads it once, not once per shard)."""
    docs, bad = read_shard(shard, plan.text_field, plan.report_bad_rows, plan.chat)
    curated: Dict[str, int] = {}
    if plan.chat is None and getattr(plan, "curate_stages", ()):
        docs, curated = curate_docs(docs, curator if curator is not None else shard_curator(plan))
    tok = tok if tok is not None else from_json(plan.tokenizer.json)
    if plan.chat is None:
        enc = tok if getattr(plan, "parse_special_tokens", False) else plain_copy(tok)  # documents are text
        ids = [e.ids for e in enc.encode_batch(docs)] if docs else []
        packed = pack_documents(ids, plan.seq_len, plan.tokenizer.eos_id, plan.tokenizer.pad_id)
    else:
        packed, long_rows = _tokenize_conversations(docs, plan, tok)
        bad.merge(long_rows)
    arrays = {k: packed[k] for k in ("tokens", "doc_ids", "labels", "n_real")}
    return PackedShard(arrays=arrays, bad_rows=bad, documents=len(docs), curated=curated)


def _tokenize_conversations(texts: List[str], plan, tok) -> Tuple[Dict[str, np.ndarray], BadRows]:
    """SFT: render each conversation, tokenize its segments, fit it into seq_len (truncate or
    skip, counted), and pack without splitting an example across samples."""
    eos = plan.tokenizer.eos_id
    ids_all, masks, long_rows = [], [], BadRows(keep=plan.report_bad_rows)
    for i, t in enumerate(texts):
        ids, mask = tokenize_segments(render_segments(json.loads(t), plan.chat), tok, eos,
                                       plan.chat.parse_special_tokens)
        if len(ids) + 1 > plan.seq_len:
            if plan.overlong == "skip":
                long_rows.add("too_long", f"conversation {i} of its shard ({len(ids) + 1} tokens > data.seq_len {plan.seq_len})")
                continue
            long_rows.add("truncated", f"conversation {i} of its shard ({len(ids) + 1} tokens > data.seq_len {plan.seq_len})")
            # Cut to fit with its EOS; a cut answer must not teach the model to stop there.
            ids, mask = ids[:plan.seq_len - 1], mask[:plan.seq_len - 1] + [False]
        if not any(mask[:len(ids)]):
            continue  # nothing left to learn (e.g. the completion was cut off entirely)
        ids_all.append(ids)
        masks.append(mask)
    return pack_documents(ids_all, plan.seq_len, eos, plan.tokenizer.pad_id, masks, split_documents=False), long_rows
