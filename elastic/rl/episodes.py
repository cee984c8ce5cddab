"""Multi-turn episodes (rl.turns > 1, issue 44) as both RL placements play them: one place for
"score every answered turn, build the next user message", so the colocated trainers
(elastic/rl/grpo.py) and the disaggregated fleet's rollout actors (elastic/rl/rollout/worker.py)
produce the same episodes from the same seeds.

A batch of rows (each {key, problem, seed}) is played by the generation engine's round loop
(elastic/generation/episodes.py `play_episodes`; on the trainers through
`fsdp_generate_turns`) with a :class:`TurnScorer` as its `respond` callback:

- after every round, each answered turn t (0-based) of row i goes to the run's reward service
  under ``f"{key}:t{t}"``, and the caller waits for those verdicts;
- a pass, a ``sandbox_error`` (the infrastructure's, not a verdict) or the last turn ends the
  episode; otherwise the verifier's feedback (elastic/reward/feedback.py, ``rl.feedback``), its
  tokens capped at ``rl.feedback_max_tokens`` (the template's come on top), becomes the next user
  message (elastic/data/chat.py ``feedback_turn_ids``);
- turn t samples with ``turn_seed(seed, t)``, so a resumed run, or a unit a rollout actor
  generates again after its predecessor died, reproduces the episode (the service returns the
  cached verdict of a key it already has).

:func:`episode_rows` turns the played episodes into what a rollout carries: the tokens after
the prompt (answers and feedback), the policy's spans into them (the only tokens in the loss),
one record per answered turn (verdict, answer, feedback) and how the episode ended.
"""

from __future__ import annotations

from typing import Any, Dict, List, Optional, Sequence, Tuple

from elastic.data.chat import ChatFormat, feedback_turn_ids
from elastic.generation.episodes import Episode, turn_seed
from elastic.reward.feedback import MARKER, feedback_text
from elastic.rl.algorithms.turns import cap_tokens

RESULT_POLL_S = 30.0  # one results() call's wait; the loop waits as long as the pool takes


def feedback_kind(reward_kind: str) -> str:
    """The verifier whose feedback the policy sees: reward.kind's first term that is not the
    reward model's ("" when there is none)."""
    from elastic.reward.verifiers.registry import parse_kind

    return next((n for n, _ in parse_kind(reward_kind) if n != "model"), "")


def episode_sampling(rl: Any, prompt_lens: Sequence[int], max_seq_len: int, eos_id: int,
                     greedy: bool = False) -> Dict[str, Any]:
    """The EpisodeBatch arguments of a generation call: the sequence room of every episode
    (elastic/rl/algorithms/turns.py `episode_budget` of `prompt_lens`, the lengths of ALL the
    prompts the call stands for: the step's, every rank's, so the room does not depend on the
    world size or on how the fleet cut the step into units) and the sampling settings (`greedy`:
    held-out evaluation)."""
    from elastic.rl.algorithms.turns import episode_budget

    room = episode_budget(prompt_lens, rl.turns, rl.max_new_tokens, rl.feedback_max_tokens, max_seq_len)
    out: Dict[str, Any] = {"max_total_tokens": room, "stop_token_ids": [eos_id]}
    if greedy:
        out["temperature"] = 0.0
    else:
        out.update(temperature=rl.temperature, top_p=rl.top_p, top_k=rl.top_k)
    return out


def wait_results(reward: Any, keys: Sequence[str]) -> Dict[str, Any]:
    """{key: Result} for every key (submitted before), waiting as long as the pool takes (the
    client raises if the service or its pool is gone)."""
    got: Dict[str, Any] = {}
    while len(got) < len(keys):
        got.update(reward.results([k for k in keys if k not in got], timeout_s=RESULT_POLL_S))
    return got


class Feedback:
    """The next user message after a turn that did not pass (see the module docstring)."""

    def __init__(self, rl: Any, kind: str, tok: Any, chat: ChatFormat, eos_id: int) -> None:
        self.rl, self.kind, self.tok, self.chat, self.eos_id = rl, kind, tok, chat, int(eos_id)
        self.marker = [e.ids for e in tok.encode_batch([MARKER])][0]

    def __call__(self, result: Any, turn_closed: bool) -> Tuple[Optional[str], Optional[List[int]]]:
        """(the feedback text as shown, its token ids with the template around it), or
        (None, None) when the episode ends here (a pass or a sandbox_error). `turn_closed`: the
        answer ended with the stop token (else the template closes it first)."""
        fb = feedback_text(result, self.kind, self.rl.feedback)
        if fb is None:
            return None, None
        ids = [e.ids for e in self.tok.encode_batch([fb])][0]
        if len(ids) > self.rl.feedback_max_tokens:  # the message's own tokens; the template's come on top
            fb = self.tok.decode(cap_tokens(ids, self.rl.feedback_max_tokens, self.marker), skip_special_tokens=False)
        return fb, feedback_turn_ids(fb, self.chat, self.tok.encode_batch, self.eos_id, turn_closed=turn_closed)


class TurnScorer:
    """`respond(answered, last)` of play_episodes for rows [{key, problem, seed}, ...]: scores
    each answered turn through `reward` (a RewardClient) and returns the next messages' ids.
    `turns[i]` collects row i's turn records: turn (1-based), key, tokens, finish, text, seed,
    status, reward, speedup, reason, and the feedback it got."""

    def __init__(self, rl: Any, kind: str, reward: Any, tok: Any, chat: ChatFormat, eos_id: int,
                 rows: Sequence[Dict[str, Any]]) -> None:
        self.reward, self.tok, self.rows = reward, tok, list(rows)
        self.feedback = Feedback(rl, kind, tok, chat, eos_id)
        self.turns: List[List[Dict[str, Any]]] = [[] for _ in self.rows]

    def __call__(self, answered, last: bool) -> Dict[int, Optional[List[int]]]:
        items = []
        for i, t, c in answered:
            r = self.rows[i]
            text = self.tok.decode(list(c.tokens), skip_special_tokens=True)
            key = f"{r['key']}:t{t}"
            self.turns[i].append({"turn": t + 1, "key": key, "tokens": len(c.tokens), "finish": c.finish_reason,
                                  "text": text, "seed": turn_seed(r["seed"], t)})
            items.append((key, r["problem"], text))
        self.reward.submit(items, wait=False)
        got = wait_results(self.reward, [k for k, _, _ in items])
        out: Dict[int, Optional[List[int]]] = {}
        for (i, t, c), (key, _, _) in zip(answered, items):
            res = got[key]
            rec = self.turns[i][-1]
            rec.update(status=res.status, reward=float(res.reward), speedup=res.speedup, reason=(res.reason or "")[:300])
            text, ids = (None, None) if last else self.feedback(res, c.finish_reason == "stop")
            if text is not None:
                rec["feedback"] = text
            out[i] = ids
        return out


def episode_rows(episodes: Sequence[Episode], turns: Sequence[List[Dict[str, Any]]]) -> List[Dict[str, Any]]:
    """What each played episode's rollout carries: {tokens (after the prompt), spans (the
    policy's answers, [start, end) into tokens), turns (its TurnScorer records), episode_end
    (done | turns | length), truncated (it ran out of room, or its last answer was cut at
    max_new_tokens)}."""
    out = []
    for e, recs in zip(episodes, turns):
        p = e.prompt_len
        out.append({"tokens": list(e.tokens[p:]), "spans": [(a - p, b - p) for a, b in e.policy_spans],
                    "turns": recs, "episode_end": e.finish_reason,
                    "truncated": e.finish_reason == "length" or e.finish_reasons[-1] == "length"})
    return out
