"""Conversations → text segments that say which tokens a model learns (SFT) or sees (prompts).

A training row is either `prompt`/`completion` or `messages` (a list of `{role, content}`), as
in TRL. It is rendered with the tokenizer's own `chat_template` (a Jinja template in
`tokenizer_config.json`, as Hugging Face ships it) when the tokenizer has one, otherwise with
the built-in template below. Only assistant content (and the end of its turn) carries loss; an
assistant message with `"weight": 0` (OpenAI's fine-tuning convention) is context only, so a
multi-turn row can show a wrong attempt without teaching it (datasets/python-tasks
repair_sft.jsonl: wrong attempt, verifier feedback, fix; only the fix is learned).

Built-in template (documented in README, "SFT"), one block per message:

    <|user|>\\n{content}\\n            (system and user turns; not learned)
    <|assistant|>\\n{content}<EOS>     (the header is not learned; content and EOS are)

With a chat template, each assistant turn's learned text is found by rendering the
conversation up to that turn with and without it (the difference is the turn), which is what
the template itself would produce at generation time; a template for which that does not hold
is rejected with a one-line error.

The same rendering gives GRPO's prompts (`render_prompt`), so a policy sees at RL time exactly
the prompt format it was fine-tuned on.

Text that did not come from the template is encoded as text (issue 58): a message's content, a
program's or verifier's output fed back to the policy, an environment's message. Only the
template's own text (:class:`Markup`) may contain special tokens; a special token's spelling
inside content (``<|endoftext|>``, ``<|im_end|>``, ``<|assistant|>``) stays those characters, so
a policy cannot forge a turn or the end of its sequence. With a chat template the content is
found by rendering the conversation with a probe in place of each message (the template's text
is what is left); a template that rewrites content other than trimming it is rendered as one
piece, and such a row is refused (RowError) when its content spells a special token. A data set
whose text means its special tokens sets ``data.parse_special_tokens`` (ChatFormat field).
"""

from __future__ import annotations

import functools
import json
import re
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Sequence, Tuple

from elastic.data.tokenizer import plain_copy

ROLES = ("system", "user", "assistant")
EOS = None  # a segment whose text is None stands for the tokenizer's EOS token

Segment = Tuple[Optional[str], bool]  # (text or EOS, learned?); text is Markup, Unsplit or content


class Markup(str):
    """Template text (role headers, end-of-turn markers): the only text whose special-token
    spellings are parsed into special ids. Any other str in a segment is content, encoded as
    text. Concatenating or slicing gives a plain str (content): the safe side."""


class Unsplit(str):
    """A chat template's rendering whose content could not be told apart from the template's
    text (the template rewrites content): encoded with special tokens parsed, and only if none
    of `contents` spells one (tokenize_segments checks; else RowError)."""

    contents: Tuple[str, ...] = ()

    @classmethod
    def of(cls, text: str, contents: Sequence[str]) -> "Unsplit":
        u = cls(text)
        u.contents = tuple(contents)
        return u


class RowError(ValueError):
    """A row that is not a conversation; the message names what is wrong (one line)."""


@dataclass(frozen=True)
class ChatFormat:
    """How rows are read and rendered (picklable; part of the data plan)."""

    prompt_field: str = "prompt"
    completion_field: str = "completion"
    messages_field: str = "messages"
    chat_template: Optional[str] = None  # Jinja source; None: the built-in template
    eos_token: str = "<|endoftext|>"
    bos_token: str = ""
    # data.parse_special_tokens: message contents that spell a special token mean it (a data
    # set rendered with its own markers). Off: contents are text. Never on for program output.
    parse_special_tokens: bool = False


def row_messages(obj: Any, fmt: ChatFormat) -> List[Dict[str, str]]:
    """A row (dict) → its messages, validated. RowError names the field at fault."""
    if not isinstance(obj, dict):
        raise RowError("row is not an object")
    if fmt.messages_field in obj and obj[fmt.messages_field] is not None:
        msgs = obj[fmt.messages_field]
        if isinstance(msgs, str):
            try:
                msgs = json.loads(msgs)
            except json.JSONDecodeError:
                raise RowError(f"field {fmt.messages_field!r} is not a list of messages") from None
        if not isinstance(msgs, list) or not msgs:
            raise RowError(f"field {fmt.messages_field!r} is not a non-empty list of messages")
        out = []
        for i, m in enumerate(msgs):
            if not isinstance(m, dict) or m.get("role") not in ROLES or not isinstance(m.get("content"), str):
                raise RowError(f"{fmt.messages_field}[{i}]: expected {{role: system|user|assistant, content: text}}")
            msg = {"role": m["role"], "content": m["content"]}
            if "weight" in m:
                if m["role"] != "assistant" or m["weight"] not in (0, 1) or isinstance(m["weight"], bool):
                    raise RowError(f"{fmt.messages_field}[{i}].weight: 0 or 1, on an assistant message only")
                msg["weight"] = int(m["weight"])
            out.append(msg)
        if not any(m["role"] == "assistant" and m["content"].strip() and learned(m) for m in out):
            raise RowError(f"field {fmt.messages_field!r} has no assistant message to learn")
        return out
    p, c = obj.get(fmt.prompt_field), obj.get(fmt.completion_field)
    if not isinstance(p, str) or not isinstance(c, str):
        raise RowError(f"needs text fields {fmt.prompt_field!r} and {fmt.completion_field!r} (or {fmt.messages_field!r})")
    if not c.strip():
        raise RowError(f"field {fmt.completion_field!r} is empty")
    return [{"role": "user", "content": p}, {"role": "assistant", "content": c}]


def learned(message: Dict[str, Any]) -> bool:
    """Whether an assistant message carries loss (`weight` 1, the default; 0 = context only)."""
    return message.get("weight", 1) != 0


def _builtin_header(role: str) -> Markup:
    return Markup(f"<|{role}|>\n")


_NL = Markup("\n")


@functools.lru_cache(maxsize=8)
def _compiled(template: str):
    import jinja2
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    def raise_exception(msg):
        raise jinja2.exceptions.TemplateError(msg)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    env.globals["raise_exception"] = raise_exception
    return env.from_string(template)


def _render(fmt: ChatFormat, messages: Sequence[Dict[str, str]], add_generation_prompt: bool) -> str:
    return _compiled(fmt.chat_template).render(messages=list(messages), add_generation_prompt=add_generation_prompt,
                                               eos_token=fmt.eos_token, bos_token=fmt.bos_token)


_PROBE = re.compile("\ue000(\\d+)\ue001")


def _render_pieces(fmt: ChatFormat, messages: Sequence[Dict[str, str]], add_generation_prompt: bool) -> List[str]:
    """The template's rendering as pieces that join to it: Markup (the template's text) and
    content (messages' text, as is or trimmed by the template). The template is rendered once
    more with a probe in place of each content; what is not a probe is the template's. A
    template that rewrites content otherwise gives one Unsplit piece."""
    real = _render(fmt, messages, add_generation_prompt)
    contents = [m["content"] for m in messages]
    if any("\ue000" in c for c in contents):
        return [Unsplit.of(real, contents)] if real else []
    probe = [{**m, "content": f"\ue000{i}\ue001"} for i, m in enumerate(messages)]
    parts = _PROBE.split(_render(fmt, probe, add_generation_prompt))  # text, index, text, index, ..., text
    out: List[str] = []
    at = 0
    for k, part in enumerate(parts):
        if k % 2 == 0:
            if not real.startswith(part, at):
                return [Unsplit.of(real, contents)] if real else []
            out.append(Markup(part))
            at += len(part)
            continue
        c, after = contents[int(part)], parts[k + 1]
        for cand in (c, c.strip()):  # as is, or trimmed (`| trim`, Llama 3's template)
            if real.startswith(cand, at) and real.startswith(after, at + len(cand)):
                out.append(cand)
                at += len(cand)
                break
        else:
            return [Unsplit.of(real, contents)] if real else []
    if at != len(real):
        return [Unsplit.of(real, contents)] if real else []
    return _merged(out)


def _merged(pieces: Sequence[str]) -> List[str]:
    """Drop empty pieces and join neighbouring Markup (an empty message leaves two side by side):
    the template's text is encoded in one piece, as it was before content was cut out of it."""
    out: List[str] = []
    for p in pieces:
        if not p:
            continue
        if out and isinstance(p, Markup) and type(out[-1]) is Markup:
            out[-1] = Markup(out[-1] + p)
        else:
            out.append(p)
    return out


def _cut(pieces: Sequence[str], start: int, end: Optional[int] = None) -> List[str]:
    """The pieces' text from character `start` to `end`, each piece keeping its kind."""
    out: List[str] = []
    at = 0
    for p in pieces:
        lo, hi = max(start, at), min(len(p) + at, end if end is not None else len(p) + at)
        if lo < hi:
            out.append(p if (lo, hi) == (at, at + len(p)) else _same_kind(p, p[lo - at:hi - at]))
        at += len(p)
    return out


def _same_kind(piece: str, text: str) -> str:
    if isinstance(piece, Unsplit):
        return Unsplit.of(text, piece.contents)
    return Markup(text) if isinstance(piece, Markup) else text


def render_segments(messages: Sequence[Dict[str, str]], fmt: ChatFormat) -> List[Segment]:
    """The conversation as ordered segments; the document's final EOS is left to packing."""
    if fmt.chat_template is None:
        segs: List[Segment] = []
        for i, m in enumerate(messages):
            if m["role"] == "assistant":
                segs += [(_builtin_header("assistant"), False), (m["content"], learned(m))]
                if i != len(messages) - 1:
                    segs.append((EOS, learned(m)))  # ends the turn (the document's last EOS is packing's)
            else:
                segs += [(_builtin_header(m["role"]), False), (m["content"], False), (_NL, False)]
        return [sg for sg in segs if sg[0] is None or sg[0]]
    segs = []
    done = ""
    for i, m in enumerate(messages):
        if m["role"] != "assistant":
            continue
        before_p = _render_pieces(fmt, messages[:i], add_generation_prompt=True)
        upto_p = _render_pieces(fmt, messages[:i + 1], add_generation_prompt=False)
        before, upto = "".join(before_p), "".join(upto_p)
        if not before.startswith(done) or not upto.startswith(before):
            raise RowError("the tokenizer's chat_template does not render a conversation as a prefix of its extension")
        segs += [(p, False) for p in _cut(before_p, len(done))] + [(p, learned(m)) for p in _cut(upto_p, len(before))]
        done = upto
    full_p = _render_pieces(fmt, messages, add_generation_prompt=False)
    segs += [(p, False) for p in _cut(full_p, len(done))]
    return [s for s in segs if s[0]]


def prompt_segments(messages: Sequence[Dict[str, str]], fmt: ChatFormat) -> List[Segment]:
    """What the model sees before it answers (the assistant header included), cut into the
    same segments SFT tokenized (segments are tokenized separately, so a prompt tokenized as
    one string would not be the token sequence the policy was fine-tuned on)."""
    if fmt.chat_template is None:
        segs = [sg for m in messages for sg in ((_builtin_header(m["role"]), False), (m["content"], False), (_NL, False))]
        return [sg for sg in segs if sg[0]] + [(_builtin_header("assistant"), False)]
    return [(p, False) for p in _render_pieces(fmt, messages, add_generation_prompt=True)]


def feedback_turn_segments(feedback: str, fmt: ChatFormat, turn_closed: bool = True) -> List[Segment]:
    """What follows a policy's answer in a multi-turn episode (issue 44): the end of its turn
    (unless ``turn_closed``), the verifier's ``feedback`` as the next user message, and the
    assistant header of the next answer; all not learned (feedback is context, never loss).

    ``turn_closed``: the policy's tokens already end its turn (it stopped on EOS, or on the
    template's end-of-turn token ``fmt.eos_token``). Otherwise (cut at max_new_tokens) the end
    of turn is added here. Built-in template: exactly what SFT renders between two assistant
    turns (EOS, then the user block, then the header). With a chat template: the template's text
    after an assistant message (after ``fmt.eos_token`` when closed), then what it renders for a
    user message with the generation prompt, found by rendering a probe conversation with and
    without the feedback; a template that does not render it as an extension is rejected (RowError).
    """
    if fmt.chat_template is None:
        segs: List[Segment] = [] if turn_closed else [(EOS, False)]
        segs += [(_builtin_header("user"), False), (feedback, False), (_NL, False), (_builtin_header("assistant"), False)]
        return [sg for sg in segs if sg[0] is None or sg[0]]
    answer = "\u2063answer\u2063"  # a probe no template rewrites
    probe = [{"role": "user", "content": "question"}, {"role": "assistant", "content": answer}]
    before = _render(fmt, probe, add_generation_prompt=False)
    after_p = _render_pieces(fmt, probe + [{"role": "user", "content": feedback}], add_generation_prompt=True)
    after = "".join(after_p)
    if answer not in before or not after.startswith(before):
        raise RowError("the tokenizer's chat_template does not render a conversation as a prefix of its extension")
    end = before[before.rindex(answer) + len(answer):]
    k = end.find(fmt.eos_token) if (turn_closed and fmt.eos_token) else -1
    end = end[k + len(fmt.eos_token):] if k >= 0 else end
    return [(p, False) for p in _merged([Markup(end), *_cut(after_p, len(before))])]


def feedback_turn_ids(feedback: str, fmt: ChatFormat, tok, eos_id: int, turn_closed: bool = True) -> List[int]:
    """Token ids of :func:`feedback_turn_segments` (``tok``: a HF `tokenizers.Tokenizer`, as for
    :func:`tokenize_segments`); every one is masked out of the loss. The feedback is a
    program's output: always encoded as text, whatever ``fmt.parse_special_tokens`` says."""
    return tokenize_segments(feedback_turn_segments(feedback, fmt, turn_closed), tok, eos_id)[0]


def render_prompt(messages: Sequence[Dict[str, str]], fmt: ChatFormat) -> str:
    """The prompt as text (the concatenation of `prompt_segments`)."""
    return "".join(t for t, _ in prompt_segments(messages, fmt))


def plain_text(messages: Sequence[Dict[str, str]]) -> str:
    """The conversation's text for training a tokenizer on it."""
    return "".join(_builtin_header(m["role"]) + m["content"] + "\n" for m in messages)


def special_spellings(tok) -> List[str]:
    """The spellings of `tok`'s special tokens (none for a tokenizer-like without any)."""
    if not hasattr(tok, "get_added_tokens_decoder"):
        return []
    return [t.content for t in tok.get_added_tokens_decoder().values() if t.special and t.content]


class _Batch:
    def __init__(self, encode_batch) -> None:
        self.encode_batch = encode_batch


def tokenize_segments(segments: Sequence[Segment], tok, eos_id: int,
                      parse_special_tokens: bool = False) -> Tuple[List[int], List[bool]]:
    """Token ids and per-token learned flags of a rendered conversation. Segments are encoded
    separately (their boundaries are the loss-mask boundaries). `tok`: a HF
    `tokenizers.Tokenizer` (or anything with its `encode_batch`). Markup segments are encoded
    with special tokens parsed; content as text (unless `parse_special_tokens`: a data set that
    means its special tokens). An Unsplit segment is parsed, refused (RowError) when one of its
    message contents spells a special token."""
    if not hasattr(tok, "encode_batch"):  # a bare encode_batch function (a tokenizer without special tokens)
        tok = _Batch(tok)
    plain = tok if parse_special_tokens else plain_copy(tok)
    if not parse_special_tokens:
        spellings = None
        for t, _ in segments:
            if isinstance(t, Unsplit):
                spellings = special_spellings(tok) if spellings is None else spellings
                bad = next((sp for sp in spellings for c in t.contents if sp in c), None)
                if bad is not None:
                    raise RowError(f"a message spells the special token {bad!r} and the tokenizer's chat_template "
                                   f"rewrites message content, so it cannot be kept as text (data.parse_special_tokens "
                                   f"if the data set means it)")
    marked = [t for t, _ in segments if t is not None and isinstance(t, (Markup, Unsplit))]
    texts = [t for t, _ in segments if t is not None and not isinstance(t, (Markup, Unsplit))]
    enc_m = iter([e.ids for e in tok.encode_batch(marked)] if marked else [])
    enc_t = iter([e.ids for e in plain.encode_batch(texts)] if texts else [])
    encoded = (next(enc_m) if isinstance(t, (Markup, Unsplit)) else next(enc_t) for t, _ in segments if t is not None)
    ids: List[int] = []
    mask: List[bool] = []
    for text, learn in segments:
        seg = [eos_id] if text is None else next(encoded)
        ids += seg
        mask += [learn] * len(seg)
    return ids, mask
