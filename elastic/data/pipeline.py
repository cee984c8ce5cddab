"""Data planning: source → shards → tokenizer, on the driver, before any worker starts.

:func:`prepare_data_plan` resolves the source, plans shards from file sizes and loads or
trains the tokenizer; every data error surfaces here as one line. The resulting
:class:`DataPlan` is all the rest of the pipeline needs: the store builder
(elastic/data/builder.py) tokenizes and packs each shard once into the shard cache
(elastic/data/store.py), and each train worker reads its own samples of each global batch
from it (elastic/data/reader.py).
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from typing import Any, List, Optional

from elastic.data.chat import ChatFormat, plain_text
from elastic.data.documents import read_shard
from elastic.data.shards import Shard, plan_shards
from elastic.data.sources import DataError, SourceFile, resolve_files
from elastic.data.tokenizer import TokenizerInfo, load_or_train


@dataclass
class DataPlan:
    """Everything a worker needs to rebuild the exact same stream, picklable and small."""

    shards: List[Shard]
    tokenizer: TokenizerInfo
    seq_len: int
    text_field: str
    seed: int
    shuffle: bool
    tokenize_cpus: float = 1.0
    report_bad_rows: int = 5
    corpus_bytes: int = 0
    files: int = 0
    # SFT: rows are conversations rendered with this format; loss on assistant tokens only;
    # examples are never split across samples; one longer than seq_len is truncated or skipped.
    chat: Optional[ChatFormat] = None
    overlong: str = "truncate"
    # data.curate: per-document curation stages (elastic/data/curate) run by the packers on
    # each shard's documents before tokenization, with the `curate` section's settings.
    curate_stages: tuple = ()
    curate: Any = None
    # data.parse_special_tokens: a special token's spelling in a document means that token (a
    # corpus with its own markers). Off: documents are text (nanoGPT's encode_ordinary).
    parse_special_tokens: bool = False

    @property
    def num_shards(self) -> int:
        return len(self.shards)

    def estimated_samples_per_epoch(self) -> float:
        return self.corpus_bytes / max(self.tokenizer.bytes_per_token, 1e-3) / self.seq_len


def _tokenizer_sample(files: List[SourceFile], shards: List[Shard], text_field: str, sample_bytes: int,
                      chat: Optional[ChatFormat] = None) -> List[str]:
    """Documents from evenly spaced shards, up to `sample_bytes` (deterministic)."""
    out: List[str] = []
    acc = 0
    if not shards:
        return out
    step = max(1, len(shards) // max(1, int(sample_bytes / max(1, shards[0].size)) or 1))
    for s in shards[::step]:
        docs, _ = read_shard(s, text_field, chat=chat)
        for d in docs:
            if chat is not None:
                d = plain_text(json.loads(d))
            out.append(d)
            acc += len(d)
            if acc >= sample_bytes:
                return out
    return out


def prepare_data_plan(source: str, glob: str, fmt: str, text_field: str, tokenizer: str, vocab_size: int,
                      tokenizer_sample_mb: float, seq_len: int, shard_mb: float, seed: int, shuffle: bool,
                      tokenizer_save_path: str = "", tokenize_cpus: float = 1.0, report_bad_rows: int = 5,
                      chat: Optional[ChatFormat] = None, overlong: str = "truncate", curate_stages=(),
                      curate=None, parse_special_tokens: bool = False) -> DataPlan:
    """Driver-side planning; raises DataError (one line) for missing or unreadable input.
    With `chat` (SFT) rows are conversations; the format's template and special tokens are
    completed from the tokenizer (its own chat_template wins over the built-in one)."""
    files = resolve_files(source, glob, fmt)
    if chat is not None:
        text_files = [f.uri for f in files if f.format == "text"]
        if text_files:
            raise DataError(f"{text_files[0]}: SFT needs JSONL or Parquet rows (prompt/completion or messages), not text files")
    shards = plan_shards(files, max(1, int(shard_mb * 2**20)), seed if shuffle else None)
    sample = _tokenizer_sample(files, shards, text_field, int(tokenizer_sample_mb * 2**20), chat) if not tokenizer else []
    if not tokenizer and not sample:
        raise DataError(f"data.source {source}: no valid documents found (every row was malformed or empty)")
    tok = load_or_train(tokenizer, tokenizer_save_path, sample, vocab_size)
    if tok.vocab_size > vocab_size:
        raise DataError(f"data.vocab_size {vocab_size}: the tokenizer has {tok.vocab_size} tokens; raise data.vocab_size")
    if chat is not None:
        chat = dataclasses.replace(chat, chat_template=chat.chat_template or tok.chat_template,
                                   eos_token=tok.eos_token, bos_token=tok.bos_token,
                                   parse_special_tokens=parse_special_tokens)
    return DataPlan(shards=shards, tokenizer=tok, seq_len=seq_len, text_field=text_field, seed=seed, shuffle=shuffle,
                    tokenize_cpus=tokenize_cpus, report_bad_rows=report_bad_rows,
                    corpus_bytes=sum(f.size for f in files), files=len(files), chat=chat, overlong=overlong,
                    curate_stages=tuple(curate_stages), curate=curate if curate_stages else None,
                    parse_special_tokens=parse_special_tokens)
