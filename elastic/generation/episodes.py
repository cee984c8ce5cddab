"""Multi-turn episodes with KV-cache continuation (issue 44: multi-turn RL with execution feedback).

An episode is a prompt, the policy's answer (turn 0), then up to `turns - 1` more rounds of
feedback (token ids the caller already tokenized: end-of-turn + user message + assistant
header) followed by another answer. Each episode keeps one static-cache slot for its whole life
(elastic/generation/static_cache.py, driven through decoder.CachedDecoder); a new turn prefills
only the feedback tokens, plus the previous turn's last sampled token (a decode step writes a
token's key/value only when it is the next step's input, so the last one of a turn is not yet
cached), at the slot's own positions, attending over what the slot already holds
(`ExtendAttention`). The history is never re-prefilled.

    from elastic.generation.episodes import generate_turns
    eps = generate_turns(model, prompts, max_new_tokens=256, turns=3,
                         feedback_fn=lambda i, turn, completion: ids_or_None,
                         max_total_tokens=4096, temperature=1.0, stop_token_ids=[eos], seed=[...])
    eps[i].tokens             # prompt + answer 0 + feedback 0 + answer 1 + ...
    eps[i].policy_spans       # [(start, end)] per turn, into tokens: the tokens to train on
    eps[i].feedback_spans     # [(start, end)] per feedback (masked out of the loss)
    eps[i].logprobs[t]        # log p of each policy token of turn t (raw logits, as generate())
    eps[i].finish_reasons[t]  # "stop" | "length" per turn
    eps[i].finish_reason      # "done" (feedback_fn returned None) | "turns" | "length"

Scheduling: **round based.** `EpisodeBatch` holds every episode in a slot at once (no admission
queue: n episodes = n slots of `max_total_tokens`). `decode()` decodes every episode that has a
turn to answer, each until its own stop or budget (rows leave the step as they finish; the step
computes rows [0, highest live slot]); `extend(i, ids)` queues episode i's feedback, and the next
`decode()` prefills all queued feedback in one right-padded forward and goes on. An episode whose
feedback is not ready simply sits out that `decode()` and keeps its slot (its cache is untouched:
the continuation rewrites from its last token on), so a caller fed by an asynchronous reward pool
can call `decode()` with whichever episodes are ready. `generate_turns` is the plain loop: decode
all, ask `feedback_fn` for every episode that finished a turn, decode again. `play_episodes` is
the same loop with one batched callback per round (`respond(answered, last)`), for a caller that
scores a whole round at once (the RL trainers and the rollout fleet's actors).

Capacity: an episode's whole sequence (prompt, answers, feedback) is at most `max_total_tokens`.
A turn ends with "length" at `max_new_tokens` or when the sequence reaches that bound; in the
latter case, or when the feedback plus one new token would not fit, the episode ends with
finish_reason "length" (the feedback is then not appended).

Seeds: turn t of an episode with seed s samples token j with the randomness of
(`turn_seed(s, t)`, j) (sampling.py's counter scheme; turn_seed(s, 0) = s). So turn 0 equals
`generate(model, [prompt], seed=[s])`, and turn t equals a fresh `generate` over the whole
history with seed `turn_seed(s, t)` (up to floating-point near-ties): the tests check exactly
that, and a resumed run reproduces its episodes from the seeds alone.

Not done here: the paged cache, speculative decoding, CUDA graphs for the feedback prefill (it is
an uncaptured forward like every prefill; the decode step itself is CachedDecoder's, in any mode).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Callable, Dict, List, Optional, Sequence, Tuple, Union

import torch
import torch.nn as nn
import torch.nn.functional as F

from elastic.generation.completion import Completion, check_inputs, row_seeds
from elastic.generation.decoder import CachedDecoder, check_unsharded, model_device, resolve_mode
from elastic.generation.sampling import SamplingParams, sample
from elastic.generation.step import forward_hidden

__all__ = ["Episode", "EpisodeBatch", "ExtendAttention", "generate_turns", "play_episodes", "turn_seed"]

M64 = (1 << 64) - 1


def _int64(s: int) -> int:
    """A seed as a signed 64-bit value (as generate() passes it to the sampler)."""
    s &= M64
    return s - (1 << 64) if s >= 1 << 63 else s


def turn_seed(seed: int, turn: int) -> int:
    """The sampling seed of an episode's turn: `seed` itself for turn 0, else a splitmix64 mix of
    (seed, turn), 63-bit non-negative (what sampling.counter_uniform takes)."""
    if turn == 0:
        return seed
    z = ((seed & M64) + 0x9E3779B97F4A7C15 * (turn + 1)) & M64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & M64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & M64
    return (z ^ (z >> 31)) & ((1 << 63) - 1)


@dataclass
class Episode:
    tokens: List[int] = field(default_factory=list)  # the whole sequence, prompt first
    prompt_len: int = 0
    seed: int = 0
    policy_spans: List[Tuple[int, int]] = field(default_factory=list)    # per turn, [start, end)
    feedback_spans: List[Tuple[int, int]] = field(default_factory=list)  # per feedback, [start, end)
    logprobs: List[List[float]] = field(default_factory=list)            # per turn, per policy token
    finish_reasons: List[str] = field(default_factory=list)              # per turn: "stop" | "length"
    finish_reason: Optional[str] = None  # None while open; "done" | "turns" | "length"

    @property
    def turns(self) -> int:
        return len(self.policy_spans)

    def turn(self, t: int) -> Completion:
        """Turn t's answer as a Completion (what generate() would return for it)."""
        a, b = self.policy_spans[t]
        return Completion(self.tokens[a:b], list(self.logprobs[t]), self.finish_reasons[t])

    def loss_mask(self) -> List[int]:
        """1 on policy tokens, 0 on prompt and feedback tokens, over `tokens`."""
        m = [0] * len(self.tokens)
        for a, b in self.policy_spans:
            m[a:b] = [1] * (b - a)
        return m


class ExtendAttention:
    """New tokens appended to cached sequences: row j of a right-padded [m, T] batch holds
    `lens[j]` tokens at positions start[j] .. start[j] + lens[j] - 1 of slot slots[j]. Their
    keys/values are written there (padding is not written), and each query attends causally over
    its slot's cache entries [0, its position]."""

    def __init__(self, cache, slots: torch.Tensor, start: torch.Tensor, lens: torch.Tensor, T: int, S: int):
        dev = start.device
        self.cache, self.slots, self.S = cache, slots, S
        t = torch.arange(T, device=dev)
        valid = t[None, :] < lens[:, None]  # [m, T]
        self.jj, self.tt = valid.nonzero(as_tuple=True)
        self.dst_slot = slots[self.jj]
        self.dst_pos = start[self.jj] + self.tt
        qpos = start[:, None] + t[None, :]  # [m, T]
        keys = torch.arange(S, device=dev)
        dtype = cache.k[0].dtype
        self.mask = torch.zeros(len(slots), 1, T, S, dtype=dtype, device=dev).masked_fill_(
            keys[None, None, None, :] > qpos[:, None, :, None], float("-inf"))

    def attend(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """q: [m, Hq, T, D]; k, v: [m, Hkv, T, D] → [m, Hq, T, D]."""
        kc, vc = self.cache.k[layer], self.cache.v[layer]
        kc[self.dst_slot, :, self.dst_pos] = k[self.jj, :, self.tt]
        vc[self.dst_slot, :, self.dst_pos] = v[self.jj, :, self.tt]
        ks, vs = kc[self.slots, :, :self.S], vc[self.slots, :, :self.S]
        return F.scaled_dot_product_attention(q, ks, vs, attn_mask=self.mask, enable_gqa=ks.shape[1] != q.shape[1])


class EpisodeBatch:
    """Episodes in cache slots, decoded round by round (see the module docstring)."""

    def __init__(self, model: nn.Module, prompts: List[List[int]], max_new_tokens: int,
                 max_total_tokens: Optional[int] = None, temperature: float = 0.0, top_p: float = 1.0,
                 top_k: int = 0, stop_token_ids: Sequence[int] = (), stop_sequences: Sequence[Sequence[int]] = (),
                 seed: Union[int, Sequence[int], None] = None, mode: str = "auto"):
        check_inputs(model, prompts, max_new_tokens, temperature, top_p, top_k)
        if max_new_tokens < 1:
            raise ValueError("generate_turns: max_new_tokens must be >= 1")
        check_unsharded(model)
        self.model, self.max_new = model, max_new_tokens
        self.max_total = int(max_total_tokens or model.args.max_seq_len)
        longest = max(len(p) for p in prompts)
        if longest + 1 > self.max_total:
            raise ValueError(f"generate_turns: a prompt of {longest} tokens leaves no room in max_total_tokens "
                             f"{self.max_total}")
        self.stop_ids = set(int(t) for t in stop_token_ids)
        self.stop_seqs = [[int(t) for t in q] for q in stop_sequences]
        if any(not q for q in self.stop_seqs):
            raise ValueError("generate_turns: stop_sequences must not contain an empty sequence")
        mode = resolve_mode(os.environ.get("ELASTIC_GENERATE_MODE", "auto") if mode == "auto" else mode,
                            model_device(model))
        capacity = self.max_total if mode == "eager" else -(-self.max_total // 16) * 16
        self.dec = CachedDecoder(model, len(prompts), capacity, SamplingParams(float(temperature), int(top_k),
                                                                              float(top_p)), mode)
        seeds = row_seeds(seed, len(prompts))
        self.episodes = [Episode(tokens=[int(t) for t in p], prompt_len=len(p), seed=s) for p, s in zip(prompts, seeds)]
        self.generating: List[bool] = [False] * len(prompts)  # answering a turn now
        self.pending: Dict[int, List[int]] = {}  # feedback queued for the next decode()
        self._start()

    # --------------------------------------------------------------------------- host side
    def _open_turn(self, i: int) -> None:
        e = self.episodes[i]
        e.policy_spans.append((len(e.tokens), len(e.tokens)))
        e.logprobs.append([])
        e.finish_reasons.append("length")
        self.generating[i] = True

    def _record(self, i: int, tok: int, logp: float) -> None:
        """Append a sampled token to episode i's current turn; end the turn (or episode) if due."""
        e = self.episodes[i]
        e.tokens.append(tok)
        e.logprobs[-1].append(logp)
        a, _ = e.policy_spans[-1]
        e.policy_spans[-1] = (a, len(e.tokens))
        ans = e.tokens[a:]
        if tok in self.stop_ids or any(ans[-len(q):] == q for q in self.stop_seqs if len(ans) >= len(q)):
            e.finish_reasons[-1] = "stop"
        elif len(ans) < self.max_new and len(e.tokens) < self.max_total:
            return
        self.generating[i] = False
        self.dec.release([i])
        if len(e.tokens) >= self.max_total:
            e.finish_reason = "length"

    def _start(self) -> None:
        n = len(self.episodes)
        for i in range(n):
            self._open_turn(i)
        toks, lps = self.dec.prefill(list(range(n)), [e.tokens for e in self.episodes],
                                     [_int64(turn_seed(e.seed, 0)) for e in self.episodes])
        for i, (t, lp) in enumerate(zip(toks, lps)):
            self._record(i, t, lp)

    # --------------------------------------------------------------------------- API
    def idle(self) -> List[int]:
        """Episodes that finished a turn and wait for feedback (open, not generating, not queued)."""
        return [i for i, e in enumerate(self.episodes)
                if e.finish_reason is None and not self.generating[i] and i not in self.pending]

    def extend(self, i: int, feedback: Optional[Sequence[int]]) -> bool:
        """Queue feedback for episode i's next turn (prefilled by the next decode()); None ends the
        episode ("done"). False if the episode ended instead (no room: "length")."""
        e = self.episodes[i]
        if e.finish_reason is not None or self.generating[i] or i in self.pending:
            raise ValueError(f"generate_turns: episode {i} is not waiting for feedback")
        if feedback is None:
            e.finish_reason = "done"
            return False
        fb = [int(t) for t in feedback]
        bad = [t for t in fb if not 0 <= t < self.model.args.vocab_size]
        if not fb or bad:
            raise ValueError(f"generate_turns: feedback for episode {i} is empty or has ids outside the vocabulary")
        if len(e.tokens) + len(fb) + 1 > self.max_total:
            e.finish_reason = "length"
            return False
        self.pending[i] = fb
        return True

    def finish(self, i: int, reason: str = "turns") -> None:
        if self.episodes[i].finish_reason is None:
            self.episodes[i].finish_reason = reason

    @torch.no_grad()
    def decode(self) -> List[int]:
        """Prefill the queued feedback, then decode every generating episode to the end of its turn.
        Returns the episodes that answered a turn in this call."""
        ran = [i for i in range(len(self.episodes)) if self.generating[i]] + sorted(self.pending)
        if self.pending:
            self._prefill_feedback()
        while any(self.generating):
            live = [i for i, g in enumerate(self.generating) if g]
            b = self.dec.bucket(live[-1] + 1)
            toks, lps = self.dec.step(b, max(len(self.episodes[i].tokens) for i in live))
            for i in live:
                self._record(i, toks[i], lps[i])
        return sorted(ran)

    def _prefill_feedback(self) -> None:
        """One right-padded forward over [last answer token] + feedback of every queued episode, at
        its slot's positions; samples the first token of each one's new turn."""
        dec, dev = self.dec, self.dec.tok.device
        idx = sorted(self.pending)
        seqs, starts = [], []
        for i in idx:
            e = self.episodes[i]
            fb = self.pending.pop(i)
            starts.append(len(e.tokens) - 1)  # the last token: sampled, not yet in the cache
            seqs.append([e.tokens[-1]] + fb)
            e.feedback_spans.append((len(e.tokens), len(e.tokens) + len(fb)))
            e.tokens.extend(fb)
        T = max(len(s) for s in seqs)
        tokens = torch.zeros(len(seqs), T, dtype=torch.long)
        for j, s in enumerate(seqs):
            tokens[j, :len(s)] = torch.tensor(s)
        tokens = tokens.to(dev)
        lens = torch.tensor([len(s) for s in seqs], device=dev)
        start = torch.tensor(starts, device=dev)
        slots = torch.tensor(idx, device=dev)
        qpos = (start[:, None] + torch.arange(T, device=dev)[None, :]).clamp(max=dec.capacity - 1)
        S = max(a + len(s) for a, s in zip(starts, seqs))
        att = ExtendAttention(dec.cache, slots, start, lens, T, S)
        h = forward_hidden(self.model, tokens, dec.rope[qpos], att)
        logits = self.model.output(h[torch.arange(len(idx), device=dev), lens - 1]).float()
        seed_t = torch.tensor([turn_seed(self.episodes[i].seed, self.episodes[i].turns) for i in idx],
                              dtype=torch.long, device=dev)
        nxt, logp = sample(logits, dec.params, seed_t, torch.zeros(len(idx), dtype=torch.long, device=dev))
        dec.tok[slots] = nxt
        dec.pos[slots] = start + lens
        dec.seed[slots] = seed_t
        dec.gen[slots] = 1
        dec.live[slots] = 1
        out = torch.stack((nxt.double(), logp.double())).tolist()
        for i, t, lp in zip(idx, out[0], out[1]):
            self._open_turn(i)
            self._record(i, int(t), lp)


@torch.no_grad()
def generate_turns(model: nn.Module, prompts: List[List[int]], max_new_tokens: int, turns: int,
                   feedback_fn: Callable[[int, int, Completion], Optional[Sequence[int]]],
                   max_total_tokens: Optional[int] = None, temperature: float = 0.0, top_p: float = 1.0,
                   top_k: int = 0, stop_token_ids: Sequence[int] = (), stop_sequences: Sequence[Sequence[int]] = (),
                   seed: Union[int, Sequence[int], None] = None, mode: str = "auto") -> List[Episode]:
    """Up to `turns` answers per prompt; after turn t, `feedback_fn(i, t, completion)` gives the
    token ids to append before turn t + 1, or None to end episode i ("done"). Round based: see the
    module docstring. `max_new_tokens` is per turn; `max_total_tokens` bounds a whole episode
    (default: the model's max_seq_len)."""
    if turns < 1:
        raise ValueError(f"generate_turns: turns must be >= 1, got {turns}")
    if not prompts:
        return []
    batch = EpisodeBatch(model, prompts, max_new_tokens, max_total_tokens, temperature, top_p, top_k,
                         stop_token_ids, stop_sequences, seed, mode)
    batch.decode()
    for _ in range(1, turns):
        waiting = batch.idle()
        if not waiting:
            break
        for i in waiting:
            e = batch.episodes[i]
            batch.extend(i, feedback_fn(i, e.turns - 1, e.turn(e.turns - 1)))
        batch.decode()
    for i in range(len(prompts)):
        batch.finish(i, "turns")
    return batch.episodes


Answered = List[Tuple[int, int, Completion]]  # (episode, turn, that turn's answer)


@torch.no_grad()
def play_episodes(model: nn.Module, prompts: List[List[int]], max_new_tokens: int, turns: int,
                  respond: Callable[[Answered, bool], Dict[int, Optional[Sequence[int]]]],
                  max_total_tokens: Optional[int] = None, **kwargs) -> List[Episode]:
    """Up to `turns` answers per prompt, one `respond` call per round. After every round,
    `respond(answered, last)` gets (episode, turn, completion) for each episode that answered a
    turn in it (also those that ran out of room, whose turn must still be scored) and returns
    {episode: feedback ids, or None to end it}; `last` is True after turn `turns` (the return
    value is then ignored). `kwargs`: EpisodeBatch's sampling arguments. The one round loop of
    both RL placements (elastic/train/fsdp_generate.py fsdp_generate_turns on a sharded policy,
    elastic/rl/rollout/worker.py on a rollout actor's copy), so they play the same episodes."""
    if turns < 1:
        raise ValueError(f"play_episodes: turns must be >= 1, got {turns}")
    if not prompts:
        return []
    batch = EpisodeBatch(model, prompts, max_new_tokens, max_total_tokens=max_total_tokens, **kwargs)
    batch.decode()
    answered = list(range(len(prompts)))  # turn 0 (some may have ended at their first token)
    for t in range(turns):
        if not answered:
            break
        eps = batch.episodes
        last = t == turns - 1
        fb = respond([(i, eps[i].turns - 1, eps[i].turn(eps[i].turns - 1)) for i in answered], last)
        if last:
            break
        for i in answered:
            if eps[i].finish_reason is None:  # not out of room
                batch.extend(i, fb.get(i))
        answered = batch.decode()
    for i in range(len(prompts)):
        batch.finish(i, "turns")
    return batch.episodes
