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
"""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Sequence, Tuple

ROLES = ("system", "user", "assistant")
EOS = None  # a segment whose text is None stands for the tokenizer's EOS token

Segment = Tuple[Optional[str], bool]  # (text or EOS, learned?)


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


def _builtin_header(role: str) -> str:
    return f"<|{role}|>\n"


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
                segs.append((_builtin_header(m["role"]) + m["content"] + "\n", False))
        return segs
    segs = []
    done = ""
    for i, m in enumerate(messages):
        if m["role"] != "assistant":
            continue
        before = _render(fmt, messages[:i], add_generation_prompt=True)
        upto = _render(fmt, messages[:i + 1], add_generation_prompt=False)
        if not before.startswith(done) or not upto.startswith(before):
            raise RowError("the tokenizer's chat_template does not render a conversation as a prefix of its extension")
        segs += [(before[len(done):], False), (upto[len(before):], learned(m))]
        done = upto
    full = _render(fmt, messages, add_generation_prompt=False)
    if len(full) > len(done):
        segs.append((full[len(done):], False))
    return [s for s in segs if s[0]]


def prompt_segments(messages: Sequence[Dict[str, str]], fmt: ChatFormat) -> List[Segment]:
    """What the model sees before it answers (the assistant header included), cut into the
    same segments SFT tokenized (segments are tokenized separately, so a prompt tokenized as
    one string would not be the token sequence the policy was fine-tuned on)."""
    if fmt.chat_template is None:
        return [(_builtin_header(m["role"]) + m["content"] + "\n", False) for m in messages] + [(_builtin_header("assistant"), False)]
    return [(_render(fmt, messages, add_generation_prompt=True), False)]


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
        return segs + [(_builtin_header("user") + feedback + "\n", False), (_builtin_header("assistant"), False)]
    answer = "\u2063answer\u2063"  # a probe no template rewrites
    probe = [{"role": "user", "content": "question"}, {"role": "assistant", "content": answer}]
    before = _render(fmt, probe, add_generation_prompt=False)
    after = _render(fmt, probe + [{"role": "user", "content": feedback}], add_generation_prompt=True)
    if answer not in before or not after.startswith(before):
        raise RowError("the tokenizer's chat_template does not render a conversation as a prefix of its extension")
    end = before[before.rindex(answer) + len(answer):]
    k = end.find(fmt.eos_token) if (turn_closed and fmt.eos_token) else -1
    end = end[k + len(fmt.eos_token):] if k >= 0 else end
    return [(end + after[len(before):], False)]


def feedback_turn_ids(feedback: str, fmt: ChatFormat, encode_batch, eos_id: int, turn_closed: bool = True) -> List[int]:
    """Token ids of :func:`feedback_turn_segments` (``encode_batch``: a HF tokenizer's, as for
    :func:`tokenize_segments`); every one is masked out of the loss."""
    return tokenize_segments(feedback_turn_segments(feedback, fmt, turn_closed), encode_batch, eos_id)[0]


def render_prompt(messages: Sequence[Dict[str, str]], fmt: ChatFormat) -> str:
    """The prompt as text (the concatenation of `prompt_segments`)."""
    return "".join(t for t, _ in prompt_segments(messages, fmt))


def plain_text(messages: Sequence[Dict[str, str]]) -> str:
    """The conversation's text for training a tokenizer on it."""
    return "".join(_builtin_header(m["role"]) + m["content"] + "\n" for m in messages)


def tokenize_segments(segments: Sequence[Segment], encode_batch, eos_id: int) -> Tuple[List[int], List[bool]]:
    """Token ids and per-token learned flags of a rendered conversation. Segments are encoded
    separately (their boundaries are the loss-mask boundaries). `encode_batch`: a HF
    `tokenizers.Tokenizer.encode_batch` (returns Encodings)."""
    texts = [t for t, _ in segments if t is not None]
    encoded = iter([e.ids for e in encode_batch(texts)] if texts else [])
    ids: List[int] = []
    mask: List[bool] = []
    for text, learn in segments:
        seg = [eos_id] if text is None else next(encoded)
        ids += seg
        mask += [learn] * len(seg)
    return ids, mask
