"""One rollout actor of a disaggregated RL run: its own copy of the policy, the generation engine,
and a line to the reward service.

The coordinator (elastic/rl/rollout/coordinator.py) hands it a unit of work: completions of one
step, each with its prompt, its seed and its reward key, and the weights of the policy version
that must generate them. The actor loads that version if it holds another one, generates the unit
in one continuous-batching call (`elastic.generation.generate`, the engine the colocated trainers
use, with the same per-completion seeds), streams every finished completion to the reward service
at once (reward work starts before the unit ends), and returns the tokens with their behaviour
log-probabilities (at the temperature the loss scores at, for the off-policy correction).
With generation.weights int8 | int4 it generates, and computes those log-probabilities, with a
weight-only quantized copy of its policy remade whenever it loads a version
(elastic/generation/quantized.py): the behaviour policy is then the quantized one.

With rl.turns > 1 or rl.env a row is a whole episode (`_episodes`): the actor plays it against the
reward service turn by turn, continuing from the KV cache, with the trainers' own scorer
(elastic/rl/episodes.py), and returns the episode's tokens, policy spans and per-turn verdicts;
with rl.env also its prompt, the environment's first message (reset on the pool's actors).

It knows nothing of the trainers or of Ray Train: weights arrive as object-store buckets
(elastic/rl/rollout/weights.py).
"""

from __future__ import annotations

import os
import signal
import time
import warnings
from functools import partial
from typing import Any, Dict, List, Optional, Tuple

import numpy as np
import torch

# Fault injection for tests and drills: ELASTIC_FAULT_KILL_ROLLOUT="step=S,once=PATH" makes the
# first actor that generates a unit of 1-based step S SIGKILL itself after that unit's first
# finished completion (PATH is created first, so it happens once per run).
FAULT_ENV = "ELASTIC_FAULT_KILL_ROLLOUT"


def _fault() -> Optional[Tuple[int, str]]:
    spec = os.environ.get(FAULT_ENV, "")
    if not spec:
        return None
    kv = dict(p.split("=", 1) for p in spec.split(",") if "=" in p)
    return int(kv["step"]), kv.get("once", "")


class RolloutWorker:
    """Ray actor body (the launch side wraps it with `ray.remote` and its resources)."""

    def __init__(self, cfg_dict: Dict[str, Any], tokenizer_json: str, eos_id: int, reward_service: str,
                 chat_format: Any = None) -> None:
        from elastic.config import from_dict
        from elastic.data.tokenizer import from_json
        from elastic.train.loop import build_model, load_initial_weights, resolve_param_dtype

        self.cfg = from_dict(cfg_dict)
        rl = self.cfg.rl
        self.rl = rl
        gpu = rl.rollout.gpus_per_worker > 0 and torch.cuda.is_available()
        self.device = torch.device("cuda", torch.cuda.current_device()) if gpu else torch.device("cpu")
        if self.device.type == "cpu":
            torch.set_num_threads(max(1, int(rl.rollout.cpus_per_worker)))
        self.model, _, _ = build_model(self.cfg, self.device)
        load_initial_weights(self.model, self.cfg)  # the frozen base under LoRA; overwritten otherwise
        dtype = resolve_param_dtype(self.cfg.train.param_dtype, self.device)
        if dtype != torch.float32:
            self.model.to(dtype)
        self.model.eval()
        for p in self.model.parameters():
            p.requires_grad_(False)
        from elastic.generation.quantized import QuantizedCopy

        # generation.weights: int8 | int4 generate with a quantized copy remade per version.
        self.quant = QuantizedCopy(self.cfg.generation.weights)
        self.gen_model = self.quant.refresh(self.model)
        self.tok = from_json(tokenizer_json)
        self.eos_id = int(eos_id)
        self.chat = chat_format  # multi-turn: the template of the feedback messages
        self.reward_service = reward_service
        self._reward = None
        self.version = -1
        self.pid = os.getpid()

    def ping(self) -> Dict[str, Any]:
        return {"pid": self.pid, "device": str(self.device), "threads": torch.get_num_threads()}

    def _client(self):
        if self._reward is None:
            from elastic.reward.service import connect

            self._reward = connect(self.reward_service)
        return self._reward

    def _load(self, version: int, weights: Tuple[Any, List[Any]]) -> Dict[str, float]:
        import ray

        from elastic.rl.rollout.weights import load_into, unpack

        if version == self.version:
            return {}
        t0 = time.perf_counter()
        entries, refs = weights
        buckets = ray.get(list(refs))
        with warnings.catch_warnings():  # object-store arrays are read-only; they are only read
            warnings.simplefilter("ignore", UserWarning)
            nbytes = load_into(self.model, unpack(entries, buckets))
        self.gen_model = self.quant.refresh(self.model)
        self.version = version
        return {"load_s": time.perf_counter() - t0, "load_bytes": float(nbytes)}

    def generate(self, step: int, version: int, weights: Tuple[Any, List[Any]], rows: List[Dict[str, Any]],
                 heads: Optional[List[Dict[str, Any]]] = None) -> Dict[str, Any]:
        """Generate one unit: rows of {k, prompt, seed, key, problem}. Returns {"rows": [{k,
        tokens, logprobs, truncated}], "version", "gen_s", "tokens", "load_s", "pid"}; with
        rl.turns > 1 or rl.env each row is a whole episode (`_episodes`) and also carries spans,
        turns and episode_end, and with rl.env its prompt and first message. `heads`: with rl.env,
        every row of the step (the episodes' room comes from all their first messages)."""
        from elastic.generation.generate import generate

        rl = self.rl
        info = self._load(version, weights)
        client = self._client()
        fault = _fault()
        kill_now = False
        if fault is not None and fault[0] == step + 1 and fault[1] and not os.path.exists(fault[1]):
            open(fault[1], "w").close()
            kill_now = True
        if rl.turns > 1 or rl.env:
            return {**self._episodes(rows, client, kill_now, heads), "version": version, "pid": self.pid, **info}

        def on_finish(i: int, c) -> None:
            r = rows[i]
            client.submit([(r["key"], r["problem"], self.tok.decode(c.tokens, skip_special_tokens=True))], wait=False)
            if kill_now:  # mid-generation: the rest of the unit is unfinished
                os.kill(os.getpid(), signal.SIGKILL)

        t0, c0 = time.perf_counter(), time.process_time()
        outs = generate(self.gen_model, [r["prompt"] for r in rows], rl.max_new_tokens, temperature=rl.temperature,
                        top_p=rl.top_p, top_k=rl.top_k, stop_token_ids=[self.eos_id], seed=[r["seed"] for r in rows],
                        on_finish=on_finish, max_batch=rl.rollout_batch, kv_cache=self.cfg.generation.kv_cache,
                        block_size=self.cfg.generation.block_size, **self._draft_kwargs())
        gen_s = time.perf_counter() - t0
        client.stats()  # the streamed submits have all been taken (their errors raise here)
        temp = rl.temperature if rl.temperature > 0 else 1.0
        lps = [np.asarray(c.logprobs, np.float32) for c in outs]
        if temp != 1.0:  # the engine's log-probs are at temperature 1; the loss scores at `temp`
            lps = self._logprobs_at([r["prompt"] for r in rows], [list(c.tokens) for c in outs], temp)
        out_rows = [{"k": r["k"], "tokens": list(c.tokens), "logprobs": lp.tolist(), "truncated": c.finish_reason == "length"}
                    for r, c, lp in zip(rows, outs, lps)]
        return {"rows": out_rows, "version": version, "gen_s": gen_s, "cpu_s": time.process_time() - c0,
                "tokens": sum(len(c.tokens) for c in outs), "pid": self.pid, **info}

    def _episodes(self, rows: List[Dict[str, Any]], client: Any, kill_now: bool,
                  heads: Optional[List[Dict[str, Any]]]) -> Dict[str, Any]:
        """rl.turns > 1 or rl.env: the unit's rows as one EpisodeBatch (elastic/generation/episodes.py
        `play_episodes`, the trainers' round loop) set up as the trainers set theirs up
        (elastic/rl/episodes.py episode_setup: with rl.env the environments' first messages as the
        prompts, asked for the step's every head; the TurnScorer: every answered turn scored by the
        reward service under f"{key}:t{turn}" with the trainers' Request, the pool's feedback or
        the environment's message as the next user message, turn_seed per turn), so at
        max_staleness 0 the episodes are the colocated run's. Each row's `logprobs` cover all of
        its tokens (0 on feedback, which no loss term reads)."""
        from elastic.generation.episodes import play_episodes
        from elastic.rl.episodes import episode_rows, episode_sampling, episode_setup
        from elastic.rl.rollout.steps import message_tokens

        rl = self.rl
        every = heads if rl.env else rows  # without rl.env the rows' step_prompt_len stands for the step
        scorer, prompts, firsts, room_lens = episode_setup(
            rl, client, self.tok, self.chat, self.eos_id, partial(message_tokens, rl, self.tok, self.chat, self.eos_id),
            self.model.args.max_seq_len, self.cfg.reward.failure_reward, rows, every)
        if not rl.env:
            room_lens = [r["step_prompt_len"] for r in rows]

        def respond(answered, last: bool):
            out = scorer(answered, last)
            if kill_now:  # fault injection: after the first round's verdicts, mid-episode
                os.kill(os.getpid(), signal.SIGKILL)
            return out

        t0, c0 = time.perf_counter(), time.process_time()
        eps = play_episodes(self.gen_model, prompts, rl.max_new_tokens, rl.turns, respond,
                            **episode_sampling(rl, room_lens, self.model.args.max_seq_len, self.eos_id),
                            seed=[r["seed"] for r in rows])
        gen_s = time.perf_counter() - t0  # with the reward waits between turns, as colocated
        got = episode_rows(eps, scorer.turns)
        temp = rl.temperature if rl.temperature > 0 else 1.0
        if temp != 1.0:  # the engine's log-probs are at temperature 1; the loss scores at `temp`
            lps = self._logprobs_at(prompts, [g["tokens"] for g in got], temp)
        else:
            lps = []
            for e, g in zip(eps, got):
                lp = np.zeros(len(g["tokens"]), np.float32)
                for (a, b), turn in zip(g["spans"], e.logprobs):
                    lp[a:b] = turn
                lps.append(lp)
        out_rows = [{"k": r["k"], **g, "spans": [list(x) for x in g["spans"]], "logprobs": lp.tolist(),
                     **({"prompt": list(p), "first_message": first} if rl.env else {})}
                    for r, g, lp, p, first in zip(rows, got, lps, prompts, firsts)]
        return {"rows": out_rows, "gen_s": gen_s, "cpu_s": time.process_time() - c0,
                "tokens": sum(b - a for g in got for a, b in g["spans"])}

    def _draft_kwargs(self) -> Dict[str, Any]:
        """generate()'s speculative-decoding arguments from generation.draft ({} when off), as the
        colocated GRPO job passes them; a draft model directory is loaded once, on this actor."""
        g = self.cfg.generation
        if g.draft == "none":
            return {}
        draft: Any = g.draft
        if draft != "ngram":
            if getattr(self, "_draft_model", None) is None:
                from elastic.generation.speculative import load_draft

                self._draft_model = load_draft(g.draft, device=self.device, dtype=next(self.model.parameters()).dtype)
            draft = self._draft_model
        return {"draft": draft, "draft_tokens": g.draft_tokens, "draft_ngram": g.draft_ngram}

    @torch.no_grad()
    def _logprobs_at(self, prompts: List[List[int]], completions: List[List[int]], temp: float) -> List[np.ndarray]:
        """log p(token) at temperature `temp` of each completion's tokens, one forward per
        completion (prompt + completion; an episode's completion is all its tokens after the
        prompt)."""
        from elastic.model.attention import build_attention_metadata

        res = []
        for prompt, toks in zip(prompts, completions):
            seq = torch.tensor([list(prompt) + list(toks)], device=self.device)
            pos = torch.arange(seq.shape[1], device=self.device)[None]
            doc = torch.zeros_like(seq)
            meta = build_attention_metadata(doc, self.model.attention_backend)
            logits = self.gen_model(seq, pos, doc, meta)[0, :-1].float() / temp  # the policy that sampled
            lp = torch.log_softmax(logits, -1).gather(-1, seq[0, 1:, None])[:, 0]
            a = len(prompt) - 1
            res.append(lp[a:a + len(toks)].cpu().numpy().astype(np.float32))
        return res
