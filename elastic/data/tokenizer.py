"""HF `tokenizers`: load a given tokenizer.json, or train a byte-level BPE on a corpus sample.

The trained tokenizer is saved with the run and reused on restart, so token ids never
change under a resumed run. Workers receive the tokenizer as its JSON string (no shared
filesystem needed).
"""

from __future__ import annotations

import functools
import json
import os
from dataclasses import dataclass
from typing import Iterable, List, Optional

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from elastic.data.sources import DataError

EOS = "<|endoftext|>"
PAD = "<|pad|>"
# The built-in chat template's role markers (elastic/data/chat.py). They are special tokens of
# the tokenizer trained here, so text encoded as text (a message's content, a program's output)
# can never produce them: a policy cannot forge a turn in its own context.
ROLE_MARKERS = ("<|system|>", "<|user|>", "<|assistant|>")


@dataclass(frozen=True)
class TokenizerInfo:
    json: str
    vocab_size: int
    eos_id: int
    pad_id: int
    bytes_per_token: float  # measured on the training sample; sizes epoch estimates
    eos_token: str = EOS
    bos_token: str = ""
    chat_template: Optional[str] = None  # Jinja source from tokenizer_config.json, if any


def _token_text(v) -> str:
    """tokenizer_config.json writes special tokens as strings or as {"content": ...}."""
    if isinstance(v, dict):
        return str(v.get("content", ""))
    return v if isinstance(v, str) else ""


def read_tokenizer_config(tokenizer_json: str) -> dict:
    """The Hugging Face `tokenizer_config.json` next to a `tokenizer.json` ({} if none): where
    the EOS/BOS/PAD tokens and the chat template are declared."""
    path = os.path.join(os.path.dirname(os.path.abspath(tokenizer_json)), "tokenizer_config.json")
    if not os.path.isfile(path):
        return {}
    try:
        with open(path) as f:
            cfg = json.load(f)
    except (OSError, json.JSONDecodeError) as e:
        raise DataError(f"{path}: unreadable tokenizer config ({e})") from None
    return cfg if isinstance(cfg, dict) else {}


def train_bpe(texts: Iterable[str], vocab_size: int) -> Tokenizer:
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=[EOS, PAD, *ROLE_MARKERS],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(texts, trainer=trainer)
    return tok


def _info(tok: Tokenizer, sample: List[str], config: Optional[dict] = None) -> TokenizerInfo:
    config = config or {}
    eos_name = _token_text(config.get("eos_token")) or EOS
    eos = tok.token_to_id(eos_name)
    if eos is None:
        raise DataError(f"tokenizer has no {eos_name!r} token (needed as end-of-document)")
    pad = tok.token_to_id(_token_text(config.get("pad_token")) or PAD)
    if pad is None:
        pad = eos  # padding is masked out of loss and attention; any id works
    template = config.get("chat_template")
    if isinstance(template, list):  # several named templates: the default one
        template = next((t.get("template") for t in template if isinstance(t, dict) and t.get("name") == "default"), None)
    nbytes = sum(len(t.encode("utf-8")) for t in sample)
    ntok = sum(len(e.ids) for e in tok.encode_batch(sample)) if sample else 0
    return TokenizerInfo(json=tok.to_str(), vocab_size=tok.get_vocab_size(), eos_id=eos, pad_id=pad,
                         bytes_per_token=(nbytes / ntok) if ntok else 4.0, eos_token=eos_name,
                         bos_token=_token_text(config.get("bos_token")),
                         chat_template=template if isinstance(template, str) else None)


def info_from_file(tokenizer_json: str) -> TokenizerInfo:
    """The TokenizerInfo of a saved tokenizer.json (EOS/BOS/PAD from tokenizer_config.json beside
    it, else the project's defaults), as training sees it."""
    return _info(Tokenizer.from_file(tokenizer_json), [], read_tokenizer_config(tokenizer_json))


def load_or_train(given: str, saved_path: str, sample: List[str], vocab_size: int) -> TokenizerInfo:
    """`given` tokenizer.json if set; else the run's saved one; else train and save it."""
    config: dict = {}
    if given:
        if not os.path.isfile(given):
            raise DataError(f"data.tokenizer {given}: no such file")
        try:
            tok = Tokenizer.from_file(given)
        except Exception as e:
            raise DataError(f"data.tokenizer {given}: not a tokenizers JSON ({str(e).splitlines()[0]})") from None
        config = read_tokenizer_config(given)
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
    return _info(tok, sample[:64], config)


def missing_role_markers(tok: Tokenizer) -> List[str]:
    """The built-in template's role markers that are not special tokens of `tok` (a tokenizer
    trained before they were, or a given one without a chat_template): with those the headers
    are plain text, which a message could spell."""
    special = {t.content for t in tok.get_added_tokens_decoder().values() if t.special}
    return [m for m in ROLE_MARKERS if m not in special]


def plain_copy(tok):
    """`tok` with special-token parsing off (`encode_special_tokens`): text that did not come
    from a template (a data set's message, a program's output) is encoded as text, so a special
    token's spelling in it never becomes that token's id. One copy per tokenizer object, kept on
    it. A tokenizer-like object without the setting (it has no special tokens) is its own copy."""
    plain = getattr(tok, "_elastic_plain", None)
    if plain is None:
        if not hasattr(tok, "encode_special_tokens"):
            return tok
        plain = Tokenizer.from_str(tok.to_str())
        plain.encode_special_tokens = True
        tok._elastic_plain = plain
    return plain


@functools.lru_cache(maxsize=4)
def from_json(js: str) -> Tokenizer:
    """Per-process cache: Ray Data tasks reuse the parsed tokenizer."""
    return Tokenizer.from_str(js)
