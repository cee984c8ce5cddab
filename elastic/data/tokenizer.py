"""HF `tokenizers`: load a given tokenizer.json, or train a byte-level BPE on a corpus sample.

The trained tokenizer is saved with the run and reused on restart, so token ids never
change under a resumed run. Workers receive the tokenizer as its JSON string (no shared
filesystem needed).
"""

from __future__ import annotations

import functools
import os
from dataclasses import dataclass
from typing import Iterable, List

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from elastic.data.sources import DataError

EOS = "<|endoftext|>"
PAD = "<|pad|>"


@dataclass(frozen=True)
class TokenizerInfo:
    json: str
    vocab_size: int
    eos_id: int
    pad_id: int
    bytes_per_token: float  # measured on the training sample; sizes epoch estimates


def train_bpe(texts: Iterable[str], vocab_size: int) -> Tokenizer:
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=[EOS, PAD],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(texts, trainer=trainer)
    return tok


def _info(tok: Tokenizer, sample: List[str]) -> TokenizerInfo:
    eos = tok.token_to_id(EOS)
    if eos is None:
        raise DataError(f"tokenizer has no {EOS!r} token (needed as end-of-document)")
    pad = tok.token_to_id(PAD)
    if pad is None:
        pad = eos  # padding is masked out of loss and attention; any id works
    nbytes = sum(len(t.encode("utf-8")) for t in sample)
    ntok = sum(len(e.ids) for e in tok.encode_batch(sample)) if sample else 0
    return TokenizerInfo(json=tok.to_str(), vocab_size=tok.get_vocab_size(), eos_id=eos, pad_id=pad,
                         bytes_per_token=(nbytes / ntok) if ntok else 4.0)


def load_or_train(given: str, saved_path: str, sample: List[str], vocab_size: int) -> TokenizerInfo:
    """`given` tokenizer.json if set; else the run's saved one; else train and save it."""
    if given:
        if not os.path.isfile(given):
            raise DataError(f"data.tokenizer {given}: no such file")
        try:
            tok = Tokenizer.from_file(given)
        except Exception as e:
            raise DataError(f"data.tokenizer {given}: not a tokenizers JSON ({str(e).splitlines()[0]})") from None
    elif saved_path and os.path.isfile(saved_path):
        tok = Tokenizer.from_file(saved_path)
    else:
        if not sample:
            raise DataError("data.source: no documents to train a tokenizer on")
        tok = train_bpe(sample, vocab_size)
        if saved_path:
            os.makedirs(os.path.dirname(saved_path), exist_ok=True)
            tmp = saved_path + ".tmp"
            tok.save(tmp)
            os.replace(tmp, saved_path)
    return _info(tok, sample[:64])


@functools.lru_cache(maxsize=4)
def from_json(js: str) -> Tokenizer:
    """Per-process cache: Ray Data tasks reuse the parsed tokenizer."""
    return Tokenizer.from_str(js)
