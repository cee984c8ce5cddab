"""Multi-turn episodes (rl.turns > 1 or rl.env, issue 44) as both RL placements play them: one place for
"score every answered turn, build the next user message", so the colocated trainers
(elastic/rl/grpo.py) and the disaggregated fleet's rollout actors (elastic/rl/rollout/worker.py)
produce the same episodes from the same seeds.

A batch of rows (each {key, problem, seed}) is played by the generation engine's round loop
(elastic/generation/episodes.py `play_episodes`; on the trainers through
`fsdp_generate_turns`) with a :class:`TurnScorer` as its `respond` callback:

- with ``rl.env`` (a user environment, elastic/reward/verifiers/user_env.py) each episode first
  asks the pool for its first user message (:func:`first_messages`, key ``f"{key}:reset"``),
  which becomes the row's prompt;
- after every round, each answered turn t (0-based) of row i goes to the run's reward service
  under ``f"{key}:t{t}"`` with a :class:`~elastic.reward.request.Request` (:func:`turn_request`):
  the ``rl.feedback`` mode, or with ``rl.env`` the episode's earlier answers (the actor replays
  them); the caller waits for those verdicts;
- the next user message is the pool's ``Result.feedback``, made in the pool where the task is at
  hand (elastic/reward/feedback.py: code_opt's failing test input and expected output), or the
  environment's; here only its tokens are capped at ``rl.feedback_max_tokens`` (the template's
  come on top) and put in the chat template (elastic/data/chat.py ``feedback_turn_ids``). No
  message (a pass, an environment's done, a ``sandbox_error``: the infrastructure's, not a
  verdict) or the last turn ends the episode;
- turn t samples with ``turn_seed(seed, t)``, so a resumed run, or a unit a rollout actor
  generates again after its predecessor died, reproduces the episode (the service returns the
  cached verdict of a key it already has).

:func:`episode_rows` turns the played episodes into what a rollout carries: the tokens after
the prompt (answers and feedback), the policy's spans into them (the only tokens in the loss),
one record per answered turn (verdict, answer, feedback) and how the episode ended.
"""

from __future__ import annotations

from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

from elastic.data.chat import ChatFormat, feedback_turn_ids
from elastic.data.tokenizer import plain_copy
from elastic.generation.episodes import Episode, turn_seed
from elastic.reward.feedback import MARKER
from elastic.reward.request import Request
from elastic.reward.result import Result
from elastic.rl.algorithms.turns import cap_tokens

RESULT_POLL_S = 30.0  # one results() call's wait; the loop waits as long as the pool takes


def turn_request(rl: Any, history: Sequence[str]) -> Request:
    """What a turn's submission asks of the pool besides its verdict: the feedback of mode
    rl.feedback, or with rl.env the episode's earlier answers (`history`, oldest first)."""
    return Request(history=tuple(history)) if rl.env else Request(feedback=rl.feedback)


def reset_key(key: str) -> str:
    """The reward-service key of an episode's first message (rl.env), forgotten with its turns'."""
    return f"{key}:reset"


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


def first_messages(reward: Any, rows: Sequence[Dict[str, Any]], text_tokens: Callable[[str], List[int]],
                   room: int, failure_reward: float) -> Tuple[List[Optional[str]], List[List[int]], Dict[int, Any]]:
    """rl.env: every episode's first user message from the environment's reset(task), one pool
    call per row {key, problem, prompt} under reset_key(key) before generation (identical resets
    are evaluated once), as the policy's input (`text_tokens`: rl.prompt_format and the chat
    template). Returns (the messages, the prompts, {row: Result} of the episodes that cannot
    start: reset raised, hung or returned no text, or its message of more than `room` tokens
    leaves no room to answer). Those keep the row's own prompt and None; their Result (a
    sandbox_error: no verdict on the policy, which has not acted yet) stands for every turn, so
    the episode ends after its first answer and is dropped like any sandbox_error."""
    keys = [reset_key(r["key"]) for r in rows]
    if keys:
        reward.submit([(k, r["problem"], "", Request(reset=True)) for k, r in zip(keys, rows)], wait=False)
    got = wait_results(reward, keys)
    texts: List[Optional[str]] = []
    prompts: List[List[int]] = []
    failed: Dict[int, Any] = {}
    for i, (k, r) in enumerate(zip(keys, rows)):
        res = got[k]
        ids = text_tokens(res.feedback) if res.status == "ok" and res.feedback else None
        if ids is not None and len(ids) <= room:
            texts.append(res.feedback)
            prompts.append(list(ids))
            continue
        why = (f"rl.env reset: {res.status}: {res.reason}" if ids is None else
               f"rl.env reset: the first message of {len(ids)} tokens leaves no room to answer ({room} tokens at most)")
        failed[i] = Result(r["problem"], "sandbox_error", failure_reward, reason=why[:300])
        texts.append(None)
        prompts.append(list(r["prompt"]))
    return texts, prompts, failed


def episode_setup(rl: Any, reward: Any, tok: Any, chat: ChatFormat, eos_id: int, text_tokens: Callable[[str], List[int]],
                  max_seq_len: int, failure_reward: float, mine: Sequence[Dict[str, Any]],
                  every: Sequence[Dict[str, Any]]) -> Tuple["TurnScorer", List[List[int]], List[Optional[str]], List[int]]:
    """What a generation call of episodes needs, the same in both placements: (the TurnScorer of
    the call's own episodes `mine`, their prompts, their first messages, the prompt lengths of
    `every` episode of the step, every rank's or every unit's: the episodes' room comes from
    these, so it depends neither on the world size nor on how the fleet cut the step). Heads are
    {key, problem, seed, prompt}; `mine` is a subset of `every`. With rl.env the prompts are the
    environments' first messages (first_messages, asked for `every` head: the service evaluates
    a key once, so each caller gets the same answers; an episode that cannot start keeps its
    prompt, None, and is answered sandbox_error), else the heads' own prompts and None."""
    prompts, firsts, failed = [list(h["prompt"]) for h in every], [None] * len(every), {}
    if rl.env:
        firsts, prompts, failed = first_messages(reward, every, text_tokens, max_seq_len - rl.max_new_tokens,
                                                 failure_reward)
    at = {h["key"]: i for i, h in enumerate(every)}
    idx = [at[h["key"]] for h in mine]
    scorer = TurnScorer(rl, reward, tok, chat, eos_id, mine, {j: failed[i] for j, i in enumerate(idx) if i in failed})
    return scorer, [prompts[i] for i in idx], [firsts[i] for i in idx], [len(p) for p in prompts]


class Feedback:
    """The next user message after a turn: the pool's ``Result.feedback`` (see the module
    docstring), its tokens capped here, where the tokenizer is."""

    def __init__(self, rl: Any, tok: Any, chat: ChatFormat, eos_id: int) -> None:
        self.rl, self.tok, self.chat, self.eos_id = rl, tok, chat, int(eos_id)
        self.marker = [e.ids for e in tok.encode_batch([MARKER])][0]

    def __call__(self, result: Any, turn_closed: bool) -> Tuple[Optional[str], Optional[List[int]]]:
        """(the message as shown, its token ids with the template around it), or (None, None)
        when the episode ends here (no message: a pass, done, a sandbox_error). `turn_closed`:
        the answer ended with the stop token (else the template closes it first)."""
        fb = result.feedback
        if fb is None:
            return None, None
        ids = [e.ids for e in plain_copy(self.tok).encode_batch([fb])][0]  # as feedback_turn_ids encodes it
        if len(ids) > self.rl.feedback_max_tokens:  # the message's own tokens; the template's come on top
            fb = self.tok.decode(cap_tokens(ids, self.rl.feedback_max_tokens, self.marker), skip_special_tokens=False)
        return fb, feedback_turn_ids(fb, self.chat, self.tok, self.eos_id, turn_closed=turn_closed)


class TurnScorer:
    """`respond(answered, last)` of play_episodes for rows [{key, problem, seed}, ...]: scores
    each answered turn through `reward` (a RewardClient) and returns the next messages' ids.
    `turns[i]` collects row i's turn records: turn (1-based), key, tokens, finish, text, seed,
    status, reward, speedup, reason, and the feedback it got. `failed`: rows whose environment
    did not start (first_messages), answered with that Result without asking the pool."""

    def __init__(self, rl: Any, reward: Any, tok: Any, chat: ChatFormat, eos_id: int,
                 rows: Sequence[Dict[str, Any]], failed: Optional[Dict[int, Any]] = None) -> None:
        self.rl, self.reward, self.tok, self.rows = rl, reward, tok, list(rows)
        self.failed = dict(failed or {})
        self.feedback = Feedback(rl, tok, chat, eos_id)
        self.turns: List[List[Dict[str, Any]]] = [[] for _ in self.rows]

    def __call__(self, answered, last: bool) -> Dict[int, Optional[List[int]]]:
        items, keys = [], []
        for i, t, c in answered:
            r = self.rows[i]
            text = self.tok.decode(list(c.tokens), skip_special_tokens=True)
            key = f"{r['key']}:t{t}"
            before = [x["text"] for x in self.turns[i]]
            self.turns[i].append({"turn": t + 1, "key": key, "tokens": len(c.tokens), "finish": c.finish_reason,
                                  "text": text, "seed": turn_seed(r["seed"], t)})
            keys.append(key)
            if i not in self.failed:
                items.append((key, r["problem"], text, turn_request(self.rl, before)))
        if items:
            self.reward.submit(items, wait=False)
        got = wait_results(self.reward, [k for k, *_ in items])
        out: Dict[int, Optional[List[int]]] = {}
        for (i, t, c), key in zip(answered, keys):
            res = self.failed[i] if i in self.failed else got[key]
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
