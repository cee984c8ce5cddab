"""The GRPO job: rollouts on the train workers, rewards from the shared CPU reward service, the
clipped-ratio update on the same FSDP2 workers. It plugs into the shared per-worker loop
(elastic/train/loop.py) like pretraining does; this file is only what makes GRPO different.

One global step s (every rank runs the same code on its own completions):

1. **Prompts** from the global prompt cursor (elastic/rl/prompts.py): the same problems at
   any world size. Step s has P prompts × G samples = N completions, numbered globally;
   each rank generates exactly the completions it will train on.
2. **Generate** with the KV cache on the FSDP-sharded policy, parameters gathered once
   (elastic/train/fsdp_generate.py; with generation.weights int8|int4, on a weight-only
   quantized copy of the gathered weights made for this step); each completion is sampled with its own seed,
   `rollout_seed(run.seed, s, prompt slot, sample)`, so it does not depend on the rank or the
   batch. Every finished completion is submitted to the reward service at once.
3. While the pool compiles and runs those programs: **old log-probs** (only when a rollout
   is used for more than one optimizer step; with one, old = current, detached) and
   **reference log-probs** (only when `rl.kl_coef` > 0).
4. **Rewards**: wait for this rank's results (the service retries infrastructure failures;
   a `sandbox_error` is never a verdict: that completion is dropped from the step), then
   share (reward, status, length) of all N completions across ranks, so every rank computes
   the same group advantages (overlong shaping first, then `rl.adv_norm`) and the same step
   counts for the loss normalisers; zero-variance groups are dropped when configured.
   Dropped completions leave the micro-batches (`train_plan`): they cost no forward or
   backward, only the ledger and the rollout records still carry them.
5. **Update**: `rl.updates_per_rollout` × `rl.minibatches_per_update` optimizer steps, each
   `grpo_loss` with weights normalised by the whole minibatch (all ranks), so the gradient does
   not depend on the split over workers and micro-batches.

The job's state in the checkpoint is the prompt cursor (s·P); sampling needs no RNG state
because seeds are derived from the step. A resumed run therefore regenerates the same
completions and resubmits them under the same keys (the service returns the cached result).
"""

from __future__ import annotations

import math
import os
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, Iterator, List, Optional, Sequence, Tuple

import numpy as np
import torch

from elastic.data.chat import ChatFormat
from elastic.data.tokenizer import from_json
from elastic.records import append_record
from elastic.rl.algorithms.advantages import group_advantages, weight_negatives, zero_variance_groups
from elastic.rl.algorithms.aggregation import StepCounts
from elastic.rl.algorithms.logprobs import token_entropy, token_logprobs
from elastic.rl.algorithms.loss import grpo_loss
from elastic.rl.algorithms.overlong import overlong_penalty
from elastic.eval.pass_at_k import mean_pass_at_k
from elastic.rl.prompts import completion_id, flat, group_of, rank_completions
from elastic.rl.seeds import derive_seed
from elastic.train.checkpoint_files import TableRef, TableState
from elastic.train.job import Job, Update, WorkerContext
from elastic.train.step import LossFn, LossOutput, Micro, StepOutput, batch_attention, to_device

ROLLOUTS = "rollouts.jsonl"
EVAL_VERDICTS = "eval_verdicts.jsonl"
STATUS_RATES = ("compile_error", "syntax_error", "wrong_answer", "runtime_error", "timeout", "memory_limit",
                "sandbox_error")


@dataclass
class Rollout:
    """One completion of this rank, as generated."""

    k: int                 # index in the step (0..N-1)
    problem: str
    prompt: List[int]
    tokens: List[int]      # completion tokens
    truncated: bool
    key: str = ""
    old_logp: Optional[np.ndarray] = None
    ref_logp: Optional[np.ndarray] = None
    # Disaggregated placement: the log-probs of the policy version that generated it (at the
    # scoring temperature) and that version (elastic/rl/rollout/plan.py).
    behav_logp: Optional[np.ndarray] = None
    version: Optional[int] = None
    # Multi-turn episodes (rl.turns > 1): `tokens` is everything after the prompt (answers and
    # feedback); `spans` are the policy's answers as [start, end) into `tokens` (the only tokens
    # in the loss, the KL and the entropy); `turns` one record per answered turn (key, status,
    # reward, speedup, reason, tokens, text, finish).
    spans: Optional[List[Tuple[int, int]]] = None
    turns: Optional[List[Dict[str, Any]]] = None
    episode_end: Optional[str] = None  # "done" (passed) | "turns" (rl.turns reached) | "length" (no room left)
    first_message: Optional[str] = None  # rl.env: the environment's first user message (the prompt's text)

    @property
    def policy_len(self) -> int:
        """How many tokens the policy generated (all of `tokens` for a single-turn completion)."""
        return len(self.tokens) if self.spans is None else sum(b - a for a, b in self.spans)


@dataclass
class StepOutcome:
    """What every rank knows about all N completions of the step after the exchange."""

    rewards: np.ndarray          # [N] shaped reward (after overlong shaping)
    raw_rewards: np.ndarray      # [N] the service's reward
    statuses: List[str]
    lengths: np.ndarray          # [N]
    truncated: np.ndarray        # [N] bool
    speedups: List[Optional[float]]
    keep: np.ndarray             # [N] bool: in the loss (not sandbox_error, not a filtered group)
    advantages: np.ndarray       # [N]
    zero_var_groups: int = 0
    stats: Dict[str, float] = field(default_factory=dict)


def scoring_temperature(rl) -> float:
    """The temperature log-probabilities are taken at: the sampling one (1 for greedy)."""
    return rl.temperature if rl.temperature > 0 else 1.0


def make_grpo_loss(rl, counts: Callable[[], StepCounts]) -> LossFn:
    """The loss_fn of a GRPO optimizer step. A micro-batch holds prompt+completion rows
    (`tokens`, `positions`, `doc_ids`), `cmask` (1 on kept completion tokens), `adv` [B], and
    optionally `old_logp` / `ref_logp` aligned with the tokens; `counts()` gives the whole
    optimizer step's StepCounts (same on every rank). Tokens are scored at the sampling
    temperature (the distribution they were drawn from, as verl and TRL do)."""
    temp = scoring_temperature(rl)

    def loss(model, mb: Micro) -> LossOutput:
        meta = batch_attention(model, mb)
        logits = model(mb["tokens"], mb["positions"], mb["doc_ids"], meta)[:, :-1].float()
        targets = mb["tokens"][:, 1:]
        mask = mb["cmask"][:, 1:]
        logp = token_logprobs(logits, targets, temp)
        old = mb["old_logp"][:, 1:] if "old_logp" in mb else logp.detach()
        ref = mb["ref_logp"][:, 1:] if "ref_logp" in mb else None
        with torch.no_grad():
            ent = token_entropy(logits, temp)
        is_w, is_stats = off_policy_weights(rl, mb, old, mask)
        total, stats = grpo_loss(logp, old, mb["adv"], mask, loss_agg=rl.loss_agg, counts=counts(),
                                 clip_low=rl.clip_low, clip_high=rl.clip_high, clip_ratio_c=rl.clip_ratio_c,
                                 ref_logp=ref, kl_coef=rl.kl_coef,
                                 kl_estimator=rl.kl_estimator, entropy=ent, is_weights=is_w)
        stats = {**stats, **is_stats}
        stats["loss_sum"] = stats["loss"]  # already this micro-batch's share of the step loss
        return LossOutput(total, stats)

    return loss


def off_policy_weights(rl, mb: Micro, old: torch.Tensor, mask: torch.Tensor):
    """The truncated importance weights of a micro-batch's tokens and their statistics (sums, so
    they add over micro-batches and ranks), when it carries behaviour log-probs (disaggregated
    placement); (None, {}) otherwise. `old` [B, T-1]: pi_old at the targets."""
    if "behav_logp" not in mb:
        return None, {}
    from elastic.rl.algorithms.off_policy import truncated_is_weights

    valid = mask != 0
    off = mb["off_policy"].unsqueeze(-1).expand_as(old) & valid
    w, capped = truncated_is_weights(old, mb["behav_logp"][:, 1:], off, rl.is_cap)
    stats = {"off_policy_tokens": off.double().sum(), "is_capped_tokens": (capped & valid).double().sum(),
             "is_weight_sum": torch.where(off, w.detach().double(), torch.zeros((), dtype=torch.float64, device=w.device)).sum()}
    return (w if rl.is_correction == "tis" else None), stats


def train_plan(keep: np.ndarray, parts: Sequence[Sequence[int]], micro_batch_size: int) -> Tuple[List[List[int]], int]:
    """Which completions one rank trains on in one minibatch, and how many micro-batches.

    keep: [N] bool over the whole step (the same on every rank); parts: every rank's completion
    indices of this minibatch (rank r's at parts[r]). Returns, per rank, its kept indices, and the
    micro-batch count every rank runs: the largest ceil(kept / micro_batch_size) over ranks. FSDP
    gathers parameters in every forward, so all ranks must run the same count; a rank with fewer
    kept completions pads with micro-batches of one dropped completion, masked (loss and
    gradient 0). Such a rank always has one: it keeps fewer than another rank's share."""
    kept = [[k for k in part if keep[k]] for part in parts]
    return kept, max(-(-len(ks) // micro_batch_size) for ks in kept)


def add_behaviour(b: Dict[str, np.ndarray], part: List[Rollout], step: int, quantized: bool = False) -> None:
    """A micro-batch's behaviour log-probs aligned with its tokens (`behav_logp`, [B, L]) and
    which rows an older version generated (`off_policy`, [B] bool), for the TIS weights.
    `quantized` (generation.weights int8|int4): every row was sampled by a quantized copy, not
    by pi_old, so every row is off-policy and gets its truncated weight."""
    L = b["tokens"].shape[1]
    behav = np.zeros((len(part), L), np.float32)
    for j, r in enumerate(part):
        a = len(r.prompt)
        behav[j, a:a + len(r.tokens)] = r.behav_logp
    b["behav_logp"] = behav
    b["off_policy"] = np.array([quantized or r.version < step for r in part], bool)


def _first_pass(r: Rollout) -> Optional[int]:
    """The first turn (1-based) of an episode that passed, or None (also for a single-turn row)."""
    return next((t["turn"] for t in r.turns or [] if t.get("status") == "ok"), None)


def _set_episode(r: Rollout, got: Dict[str, Any]) -> None:
    """Fill a rollout from its played episode (elastic/rl/episodes.py episode_rows; or the same
    fields from a rollout actor, where spans arrive as lists)."""
    r.tokens, r.truncated = list(got["tokens"]), bool(got["truncated"])
    r.spans = [(int(a), int(b)) for a, b in got["spans"]]
    r.turns, r.episode_end = list(got["turns"]), got["episode_end"]


def decode_text(tok, ids: List[int]) -> str:
    return tok.decode(ids, skip_special_tokens=True)


class GRPOJob(Job):
    state_keys = ("prompt_cursor", "rollout_buffer")
    micro_batch_keys = ("rl.micro_batch_size",)
    wait_phase = "rollout"

    def __init__(self) -> None:
        self._cursor = 0
        self._counts: Optional[StepCounts] = None
        self._metrics: Dict[str, Any] = {}
        self._update_stats: List[Dict[str, float]] = []

    # ------------------------------------------------------------------ setup
    def start(self, ctx: WorkerContext, state: Dict[str, Any]) -> None:
        self._step_ids: List[int] = []  # completion ids of the step being run (for the ledger)
        from elastic.reward.service import connect

        self.ctx = ctx
        cfg, rl = ctx.cfg, ctx.cfg.rl
        self.rl = rl
        # Prompts come from the driver (workers need no access to the problem directory).
        self.prompt_texts: Dict[str, str] = ctx.config["prompt_texts"]
        self.heldout = list(ctx.config["heldout_ids"])
        self.tok = from_json(ctx.config["tokenizer_json"])
        self.chat: ChatFormat = ctx.config["chat_format"]
        self.eos_id: int = ctx.config["eos_id"]
        from elastic.rl.rollout.steps import StepPlanner

        self.planner = StepPlanner(cfg, self.prompt_texts, ctx.config["train_ids"], ctx.config["tokenizer_json"],
                                   self.chat, self.eos_id)
        self.stream = self.planner.stream  # the global prompt cursor (one, shared with the rows it plans)
        self._initial_eval: Dict[str, Any] = {}
        self.reward = connect(ctx.config["reward_service"])
        # reward.kind's `model` term: its weight times the reward model's score is added to
        # what the verifier pool returned (elastic/launch/reward_model_service.py).
        from elastic.reward.verifiers.registry import parse_kind

        self.rm = ctx.config.get("rm_service")
        # With rl.env the environment scores every turn: reward.kind, its model term too, scores nothing.
        self.rm_weight = 0.0 if rl.env else dict(parse_kind(cfg.reward.kind)).get("model", 0.0)
        self.run_name = cfg.run.name
        self.N = rl.prompts_per_step * rl.group_size
        # Every rank's completions per minibatch (all ranks plan the same micro-batch counts).
        self.parts = [rank_completions(self.N, rl.minibatches_per_update, ctx.world_size, r) for r in range(ctx.world_size)]
        self.mine = self.parts[ctx.rank]
        self.updates_per_step = rl.updates_per_rollout * rl.minibatches_per_update
        # Under LoRA the reference is the policy with its adapters disabled (no second copy).
        self.lora = ctx.cfg.model.lora.rank > 0
        self.ref_model = self._reference_model() if rl.kl_coef > 0 and not self.lora else None
        self._cursor = int(state.get("prompt_cursor") or 0)
        self.fleet = None
        if rl.rollout.placement == "disaggregated":
            from elastic.rl.rollout import FleetClient, coordinator_name

            self.fleet = FleetClient(coordinator_name(cfg.run.name), ctx.rank, ctx.world_size, rl.rollout.sync_every,
                                     rl.rollout.bucket_mb)
            buffered = state.get("rollout_buffer")
            if ctx.leader and isinstance(buffered, TableRef):  # read from the checkpoint by the one rank that sends it
                from elastic.rl.rollout.buffer_table import from_table

                buffered = from_table(buffered.read())
            self.fleet.reset(self._cursor // rl.prompts_per_step, buffered if ctx.leader else None, ctx.comm)

    def _reference_model(self) -> torch.nn.Module:
        """The frozen starting policy (model.init_from), sharded like the policy."""
        from elastic.train.loop import build_sharded_model, load_initial_weights, resolve_param_dtype

        cfg = self.ctx.cfg
        model, _, _ = build_sharded_model(cfg, self.ctx.device, resolve_param_dtype(cfg.train.param_dtype, self.ctx.device),
                                          self.ctx.mesh)
        load_initial_weights(model, cfg)
        for p in model.parameters():
            p.requires_grad_(False)
        return model

    def prompt_tokens(self, problem: str) -> List[int]:
        """The policy's input for a task (elastic/rl/rollout/steps.py)."""
        return self.planner.prompt_tokens(problem)

    # ------------------------------------------------------------------ one step
    def updates(self, step: int) -> Iterator[Update]:
        rl, ctx = self.rl, self.ctx
        self._metrics, self._update_stats = {}, []
        self._step = step
        if step == 0 and rl.eval_every and self.heldout:  # the starting policy, for "before vs after"
            self._initial_eval = {f"initial_{k}": v for k, v in self._heldout_eval(0).items()}
        prompts = self.stream.step(step, rl.prompts_per_step)
        ks = flat(self.mine)
        rollouts = self._generate(step, prompts, ks)
        self.count_forward(sum(len(r.prompt) + len(r.tokens) for r in rollouts))  # prefill + decode
        t0 = time.perf_counter()
        self._logprob_passes(rollouts)
        self._metrics["logprob_s"] = time.perf_counter() - t0
        outcome = self._collect_rewards(step, prompts, rollouts)
        by_k = {r.k: r for r in rollouts}
        G = rl.group_size
        # The ledger gets every completion this rank sampled for the step, once, through
        # consumed_sample_ids(): also those of filtered groups, which no update carries.
        self._step_ids = [completion_id(prompts[group_of(k, G)[0]][0], group_of(k, G)[1], G) for k in ks]
        for _ in range(rl.updates_per_rollout):
            for m, part in enumerate(self.mine):
                mb_ks = range(m * (self.N // rl.minibatches_per_update), (m + 1) * (self.N // rl.minibatches_per_update))
                kept = [k for k in mb_ks if outcome.keep[k]]
                if not kept:
                    continue  # nothing to learn from this minibatch (all filtered): no optimizer step
                self._counts = StepCounts(sequences=len(kept), tokens=max(1, int(outcome.lengths[kept].sum())),
                                          max_new_tokens=rl.max_new_tokens * rl.turns)
                micro, rows, pad = self._kept_micro_batches(m, part, by_k, outcome.keep,
                                                            lambda rs: self._micro_batches(rs, outcome))
                yield Update(micro_batches=micro, normaliser=1.0, tokens=int(sum(r.policy_len for r in rows)),
                             compute_tokens=int(sum(len(r.prompt) + len(r.tokens) for r in rows + pad)))
        self._forget(rollouts)
        self._cursor = (step + 1) * rl.prompts_per_step

    def _forget(self, rows: List[Rollout]) -> None:
        """Drop the step's results from the reward service: a completion's key, each of an
        episode's turn keys (f"{key}:t{turn}"; an episode was scored turn by turn) and with rl.env
        its first message's (elastic/rl/episodes.py reset_key)."""
        from elastic.rl.episodes import reset_key

        self.reward.forget([r.key for r in rows if r.turns is None] + [t["key"] for r in rows if r.turns for t in r.turns]
                           + ([reset_key(r.key) for r in rows] if self.rl.env else []))

    def consumed_sample_ids(self) -> List[int]:
        ids, self._step_ids = self._step_ids, []
        return ids

    def _cache_kwargs(self) -> Dict[str, Any]:
        """The engine's KV cache (generation.kv_cache, generation.block_size) for every call."""
        g = self.ctx.cfg.generation
        return {"kv_cache": g.kv_cache, "block_size": g.block_size}

    def _generate(self, step: int, prompts: List[Tuple[int, str]], ks: List[int]) -> List[Rollout]:
        from elastic.train.fsdp_generate import fsdp_generate

        rl = self.rl
        plan = self.planner.rows(step, ks)
        rows = [Rollout(p["k"], p["problem"], p["prompt"], [], False, key=p["key"]) for p in plan]
        if self.fleet is not None:
            return self._take(step, rows)
        seeds = [p["seed"] for p in plan]
        t0, c0 = time.perf_counter(), time.process_time()
        if rl.turns > 1 or rl.env:
            self._generate_episodes(rows, seeds, step)
            self._gen_t0 = t0
            self._metrics["generate_s"] = time.perf_counter() - t0  # with the reward waits between turns
            self._metrics["_gen_tokens"] = sum(r.policy_len for r in rows)
            return rows
        submitted = set()

        def on_finish(i: int, completion) -> None:  # stream each finished program to the pool
            r = rows[i]
            r.tokens, r.truncated = list(completion.tokens), completion.finish_reason == "length"
            self.reward.submit([(r.key, r.problem, decode_text(self.tok, r.tokens))], wait=False)
            submitted.add(i)

        spec = self._draft_kwargs()
        outs = fsdp_generate(self.ctx.model, [r.prompt for r in rows], rl.max_new_tokens, temperature=rl.temperature,
                             top_p=rl.top_p, top_k=rl.top_k, stop_token_ids=[self.eos_id], seed=seeds, on_finish=on_finish,
                             max_batch=rl.rollout_batch, weights=self.ctx.cfg.generation.weights,
                             **spec, **self._cache_kwargs())
        for i, (r, c) in enumerate(zip(rows, outs)):
            if i not in submitted:
                on_finish(i, c)
        gen_s = time.perf_counter() - t0
        self._gen_t0 = t0
        self._metrics["generate_s"] = gen_s
        q = getattr(self.ctx.model, "_elastic_quantized", None)
        if q is not None and q.weights != "full":  # generation.weights: making the quantized copy (in generate_s)
            self._metrics["quantize_s"] = q.refresh_s
        if self.ctx.device.type == "cpu" and gen_s > 0:
            # The cores generation got: process CPU seconds / (wall seconds × torch threads). Well
            # below 1 on CPU means something else ran on this worker's cores meanwhile (the
            # report names it: usually the reward actors on the same machine).
            self._metrics["generate_cpu_frac"] = (time.process_time() - c0) / (gen_s * torch.get_num_threads())
        self._metrics["_gen_tokens"] = sum(len(r.tokens) for r in rows)
        if spec:  # this rank's speculative decoding: accepted / proposed drafts, tokens per policy forward
            st = spec["spec_stats"]
            self._metrics["spec_acceptance_rate"] = st.acceptance_rate
            self._metrics["spec_tokens_per_forward"] = st.tokens_per_round
        return rows

    def _generate_episodes(self, rows: List[Rollout], seeds: List[int], step: int) -> None:
        """rl.turns > 1 or rl.env: each row is an episode, played under gathered parameters
        (elastic/train/fsdp_generate.py fsdp_generate_turns) with the scorer both placements use
        (elastic/rl/episodes.py: with rl.env the environment's first message as the prompt; every
        answered turn scored under f"{key}:t{turn}", this rank waits, the pool's feedback (or the
        environment's message) as the next user message, turn t sampled with turn_seed(seed, t),
        so a resumed run reproduces the same episodes). The episodes' room (`episode_budget`)
        comes from every prompt of the step, all ranks' (`_episode_setup`), so it is the same at any
        world size."""
        from elastic.rl.episodes import episode_rows, episode_sampling
        from elastic.train.fsdp_generate import fsdp_generate_turns

        rl = self.rl
        mine = [{"key": r.key, "problem": r.problem, "seed": s, "prompt": r.prompt} for r, s in zip(rows, seeds)]
        every = [{k: p[k] for k in ("key", "problem", "seed", "prompt")} for p in self.planner.rows(step, range(self.N))]
        scorer, prompts, firsts, room_lens = self._episode_setup(mine, every)
        eps = fsdp_generate_turns(self.ctx.model, prompts, rl.max_new_tokens, rl.turns, scorer,
                                  **episode_sampling(rl, room_lens, self.ctx.model.args.max_seq_len, self.eos_id),
                                  seed=seeds)
        for r, got, p, first in zip(rows, episode_rows(eps, scorer.turns), prompts, firsts):
            _set_episode(r, got)
            r.prompt, r.first_message = p, first

    def _episode_setup(self, mine: List[Dict[str, Any]], every: List[Dict[str, Any]]
                       ) -> Tuple[Any, List[List[int]], List[Optional[str]], List[int]]:
        """elastic/rl/episodes.py episode_setup on this rank's episodes `mine` of the step's `every`."""
        from elastic.rl.episodes import episode_setup

        return episode_setup(self.rl, self.reward, self.tok, self.chat, self.eos_id, self.planner.text_tokens,
                             self.ctx.model.args.max_seq_len, self.ctx.cfg.reward.failure_reward, mine, every)

    def _episode_result(self, r: Rollout) -> Any:
        """An episode's verdict: the last turn's status and speed-up, the episode reward of its
        turns' rewards (rl.turn_reward, rl.turn_discount, rl.turn_cost)."""
        from types import SimpleNamespace

        from elastic.rl.algorithms.turns import episode_reward

        rl, last = self.rl, r.turns[-1]
        return SimpleNamespace(reward=episode_reward([t["reward"] for t in r.turns], rl.turn_reward, rl.turn_discount,
                                                     rl.turn_cost),
                               status=last["status"], speedup=last["speedup"], reason=last["reason"])

    def _episode_record(self, r: Rollout) -> Dict[str, Any]:
        """rollouts.jsonl fields of an episode: every turn's verdict, its answer and the feedback it got."""
        first = _first_pass(r)
        return {"turns_used": len(r.turns), "episode_end": r.episode_end, "fixed_by_feedback": first is not None and first > 1,
                "first_pass_turn": first, "policy_spans": [list(x) for x in r.spans],
                "turns": [{k: v for k, v in t.items() if k != "key"} for t in r.turns],
                **({"first_message": r.first_message} if self.rl.env else {})}

    def _draft_kwargs(self) -> Dict[str, Any]:
        """generate()'s speculative-decoding arguments from the `generation` section ({} when off);
        a draft model directory is loaded once, on this worker's device."""
        g = self.ctx.cfg.generation
        if g.draft == "none":
            return {}
        draft: Any = g.draft
        if draft != "ngram":
            if getattr(self, "_draft_model", None) is None:
                from elastic.generation.speculative import load_draft

                self._draft_model = load_draft(g.draft, device=self.ctx.device,
                                               dtype=next(self.ctx.model.parameters()).dtype)
            draft = self._draft_model
        from elastic.generation.speculative import SpecStats

        return dict(draft=draft, draft_tokens=g.draft_tokens, draft_ngram=g.draft_ngram, spec_stats=SpecStats())

    def _take(self, step: int, rows: List[Rollout]) -> List[Rollout]:
        """Disaggregated: publish this step's version (sync steps), then wait for this rank's
        completions from the rollout fleet and hand them to the reward service (the actors
        already streamed them there; a key it has is not evaluated twice, and after a resume the
        checkpoint's completions reach a fresh service this way). Episodes (rl.turns > 1) come
        with every turn's verdict: the actor played them against the service."""
        t0 = time.perf_counter()
        self._metrics.update(self.fleet.publish(self.ctx.model, step))
        t1 = time.perf_counter()
        got = {r["k"]: r for r in self.fleet.take(step)}
        wait = time.perf_counter() - t1
        for r in rows:
            g = got[r.k]
            r.tokens, r.truncated, r.version = list(g["tokens"]), bool(g["truncated"]), int(g["version"])
            r.behav_logp = np.asarray(g["logprobs"], np.float32)  # over all of `tokens` (0 on feedback)
            if g.get("turns") is not None:  # an episode: its turns were scored by the actor, verdicts included
                _set_episode(r, g)
            if "first_message" in g:  # rl.env: the environment's first message was the prompt
                r.prompt, r.first_message = list(g["prompt"]), g["first_message"]
        self.reward.submit([(r.key, r.problem, decode_text(self.tok, r.tokens)) for r in rows if r.turns is None],
                           wait=False)
        self._gen_t0 = t0
        self._metrics["rollout_wait_s"] = wait
        self._metrics["staleness"] = max(step - r.version for r in rows)
        self._metrics["_gen_tokens"] = sum(r.policy_len for r in rows)
        return rows

    def _kept_micro_batches(self, m: int, part: List[int], by_k: Dict[int, Rollout], keep: np.ndarray,
                            make: Callable[[List[Rollout]], List[Dict[str, np.ndarray]]]):
        """Minibatch m's micro-batches on this rank: its kept completions only, padded to the
        micro-batch count every rank runs (`train_plan`) with one masked dropped completion each.
        Returns (micro-batches, rows trained on, padding rows)."""
        kept, n_micro = train_plan(keep, [p[m] for p in self.parts], self.rl.micro_batch_size)
        rows = [by_k[k] for k in kept[self.ctx.rank]]
        micro = make(rows) if rows else []
        pad = [by_k[k] for k in part if not keep[k]][:1] * max(0, n_micro - len(micro))
        return micro + (make(pad[:1]) * len(pad) if pad else []), rows, pad

    def _sequence_batch(self, rows: List[Rollout]) -> Dict[str, np.ndarray]:
        """Prompt + completion per row, right-padded to the longest; one document per row.
        `cmask[b, t]` is 1 where token t is a completion token (a target of position t-1)."""
        L = max(len(r.prompt) + len(r.tokens) for r in rows)
        B = len(rows)
        tokens = np.zeros((B, L), np.int64)
        doc = np.full((B, L), -1, np.int64)
        pos = np.zeros((B, L), np.int64)
        cmask = np.zeros((B, L), np.float32)
        for b, r in enumerate(rows):
            seq = r.prompt + r.tokens
            n = len(seq)
            tokens[b, :n] = seq
            doc[b, :n] = 0
            pos[b, :n] = np.arange(n)
            if r.spans is None:
                cmask[b, len(r.prompt):n] = 1.0
            else:  # multi-turn: the policy's answers only, never the feedback between them
                for a, e in r.spans:
                    cmask[b, len(r.prompt) + a:len(r.prompt) + e] = 1.0
        return {"tokens": tokens, "doc_ids": doc, "positions": pos, "cmask": cmask}

    @torch.no_grad()
    def _completion_logprobs(self, model, rows: List[Rollout]) -> List[np.ndarray]:
        """Per row, log p(completion token) under `model` (forward passes in micro-batches; every
        rank runs the same number, as FSDP gathers per forward)."""
        out: List[np.ndarray] = []
        mbs = self.rl.micro_batch_size
        for i in range(0, len(rows), mbs):
            part = rows[i:i + mbs]
            self.count_forward(sum(len(r.prompt) + len(r.tokens) for r in part))
            b = self._sequence_batch(part)
            t = to_device(b, self.ctx.device)
            logits = model(t["tokens"], t["positions"], t["doc_ids"], batch_attention(model, t))
            lp = token_logprobs(logits[:, :-1].float(), t["tokens"][:, 1:], scoring_temperature(self.rl)).cpu().numpy()
            for j, r in enumerate(part):
                a = len(r.prompt) - 1
                out.append(lp[j, a:a + len(r.tokens)].copy())
        return out

    def _has_reference(self) -> bool:
        return self.ref_model is not None or (self.lora and self.rl.kl_coef > 0)

    def _logprob_passes(self, rows: List[Rollout]) -> None:
        if self.updates_per_step > 1:  # the policy moves between updates: freeze what it was
            for r, lp in zip(rows, self._completion_logprobs(self.ctx.model, rows)):
                r.old_logp = lp
        if self.ref_model is not None:
            for r, lp in zip(rows, self._completion_logprobs(self.ref_model, rows)):
                r.ref_logp = lp
        elif self.lora and self.rl.kl_coef > 0:
            from elastic.model.lora import adapters_disabled

            with adapters_disabled(self.ctx.model):
                for r, lp in zip(rows, self._completion_logprobs(self.ctx.model, rows)):
                    r.ref_logp = lp

    def _collect_rewards(self, step: int, prompts, rows: List[Rollout]) -> StepOutcome:
        rl = self.rl
        t0 = time.perf_counter()
        keys = [r.key for r in rows if r.turns is None]  # episodes were scored turn by turn
        got: Dict[str, Any] = {r.key: self._episode_result(r) for r in rows if r.turns is not None}
        while len(got) < len(rows):
            got.update(self.reward.results([k for k in keys if k not in got], timeout_s=30.0))
        self._metrics["reward_wait_s"] = time.perf_counter() - t0
        self._metrics["_reward_span_s"] = time.perf_counter() - self._gen_t0
        scores = self._rm_scores(rows)
        mine = [(r.k, float(got[r.key].reward) + self.rm_weight * (float(sc) if sc is not None else 0.0), got[r.key].status,
                 r.policy_len, r.truncated, got[r.key].speedup, sc, _first_pass(r),
                 len(r.turns) if r.turns else 1) for r, sc in zip(rows, scores)]
        # Every completion with its verdict, for people reading what the policy writes (once:
        # tensor-parallel peers hold the same rows).
        path = os.path.join(self.ctx.local_dir, ROLLOUTS)
        for r, sc in zip(rows if self.ctx.tp_rank == 0 else [], scores):
            res = got[r.key]
            append_record(path, {"step": step + 1, "k": r.k, "problem": r.problem, "status": res.status,
                                 "reward": res.reward + self.rm_weight * (sc or 0.0),
                                 **({"rm_score": sc} if sc is not None else {}),
                                 "speedup": res.speedup, "reason": (res.reason or "")[:300],
                                 "tokens": r.policy_len, "truncated": r.truncated, "completion": decode_text(self.tok, r.tokens),
                                 **(self._episode_record(r) if r.turns is not None else {})})
        parts = self.ctx.comm.all_gather_object(mine)
        everything = sorted((x for p in parts for x in p), key=lambda x: x[0])
        assert [x[0] for x in everything] == list(range(self.N)), "every completion of the step exactly once"
        raw = np.array([x[1] for x in everything], np.float64)
        statuses = [x[2] for x in everything]
        lengths = np.array([x[3] for x in everything], np.int64)
        trunc = np.array([x[4] for x in everything], bool)
        speedups = [x[5] for x in everything]
        rm_scores = [x[6] for x in everything if x[6] is not None]
        shaped = raw + overlong_penalty(torch.from_numpy(lengths), torch.from_numpy(trunc), rl.max_new_tokens * rl.turns,
                                        rl.overlong_buffer, rl.overlong_penalty, rl.truncation_penalty).numpy()
        valid = np.array([s != "sandbox_error" for s in statuses])
        P, G = rl.prompts_per_step, rl.group_size
        adv = np.zeros(self.N)
        keep = valid.copy()
        zero_var = 0
        for p in range(P):
            idx = np.arange(p * G, (p + 1) * G)
            v = idx[valid[idx]]
            if len(v) < 2:  # no baseline left (infrastructure failures): nothing to learn
                keep[idx] = False
                continue
            r = torch.from_numpy(shaped[v])[None]
            if bool(zero_variance_groups(r)[0]):
                zero_var += 1
                if rl.filter_zero_variance:
                    keep[idx] = False
                    continue
            adv[v] = weight_negatives(group_advantages(r, rl.adv_norm), rl.negative_weight)[0].numpy()
        passed = [s == "ok" for s in statuses]
        sp = [s for s, ok in zip(speedups, passed) if ok and s is not None]
        m = {
            "reward_mean": float(raw.mean()), "reward_std": float(raw.std()), "reward_max": float(raw.max()),
            "pass_rate": float(np.mean(passed)), "speedup_mean": float(np.mean(sp)) if sp else None,
            "zero_var_frac": zero_var / P, "kept_frac": float(keep.mean()),
            "adv_mean": float(adv[keep].mean()) if keep.any() else 0.0, "adv_std": float(adv[keep].std()) if keep.any() else 0.0,
            "resp_len_mean": float(lengths.mean()), "resp_len_max": int(lengths.max()), "trunc_rate": float(trunc.mean()),
        }
        if rm_scores:  # the reward model's own score (before its weight), over all N completions
            m["rm_score_mean"] = float(np.mean(rm_scores))
        for s in STATUS_RATES:
            m[f"{s}_rate"] = float(np.mean([x == s for x in statuses]))
        if rl.turns > 1:  # the share of episodes passed by turn t, and of those fixed by feedback
            first = [x[7] for x in everything]
            for t in range(1, rl.turns + 1):
                m[f"pass_at_turn_{t}"] = float(np.mean([f is not None and f <= t for f in first]))
            m["fixed_by_feedback_rate"] = float(np.mean([f is not None and f > 1 for f in first]))
            m["turns_mean"] = float(np.mean([x[8] for x in everything]))
        self._metrics.update(m)
        return StepOutcome(shaped, raw, statuses, lengths, trunc, speedups, keep, adv, zero_var, m)

    def _rm_scores(self, rows: List[Rollout]) -> List[Optional[float]]:
        """The reward model's score of each of this rank's completions (prompt + completion, the
        policy's tokens), or None per row without a `model` term. Timed into reward_wait_s."""
        if self.rm is None:
            return [None] * len(rows)
        t0 = time.perf_counter()
        got = self.rm.score([r.prompt + r.tokens for r in rows])
        self._metrics["reward_wait_s"] = self._metrics.get("reward_wait_s", 0.0) + time.perf_counter() - t0
        return [float(x) for x in got]

    def _micro_batches(self, rows: List[Rollout], outcome: StepOutcome) -> List[Dict[str, np.ndarray]]:
        out = []
        for i in range(0, len(rows), self.rl.micro_batch_size):
            part = rows[i:i + self.rl.micro_batch_size]
            b = self._sequence_batch(part)
            L = b["tokens"].shape[1]
            old = np.zeros((len(part), L), np.float32)
            ref = np.zeros((len(part), L), np.float32)
            for j, r in enumerate(part):
                a = len(r.prompt)
                if r.old_logp is not None:
                    old[j, a:a + len(r.tokens)] = r.old_logp
                if r.ref_logp is not None:
                    ref[j, a:a + len(r.tokens)] = r.ref_logp
                if not outcome.keep[r.k]:
                    b["cmask"][j] = 0.0
            b["adv"] = np.array([outcome.advantages[r.k] for r in part], np.float32)
            if self.fleet is not None:
                add_behaviour(b, part, self._step, self.ctx.cfg.generation.weights != "full")
            if any(r.old_logp is not None for r in part):
                b["old_logp"] = old
            if any(r.ref_logp is not None for r in part):
                b["ref_logp"] = ref
            out.append(b)
        return out

    # ------------------------------------------------------------------ loss
    def loss_fn(self) -> LossFn:
        return make_grpo_loss(self.rl, lambda: self._counts)

    def observe(self, out: StepOutput) -> None:
        self._update_stats.append(out.stats)

    # ------------------------------------------------------------------ records
    def state(self) -> Dict[str, Any]:
        out: Dict[str, Any] = {"prompt_cursor": self._cursor}
        if self.fleet is not None and self.ctx.leader:  # rank 0 writes train_state.json
            # The generated steps whose policy versions the checkpoint no longer has: a Parquet
            # table beside the shards, made and written by the save's background write.
            from elastic.rl.rollout.buffer_table import rows_in, to_table

            buffered = self.fleet.buffer(self._cursor // self.rl.prompts_per_step)
            out["rollout_buffer"] = TableState(buffered, to_table, rows_in(buffered))
        return out

    def evaluate(self, step: int) -> Dict[str, Any]:
        """Held-out evaluation on the steps it is due (every rl.eval_every and the last); the
        step-1 record also carries the starting policy's (`initial_*`, measured before step 1)."""
        rl, ctx = self.rl, self.ctx
        out, self._initial_eval = dict(self._initial_eval), {}
        if rl.eval_every and self.heldout and (step % rl.eval_every == 0 or step == ctx.cfg.train.steps):
            out.update(self._heldout_eval(step))
        return out

    def _heldout_eval(self, step: int) -> Dict[str, Any]:
        """pass@k on the held-out tasks: rl.eval_samples completions per task (1: greedy; more:
        sampled at rl.temperature with seeds derived from the step, task and sample), scored by
        the reward service; the unbiased pass@k (Chen et al. 2021) averaged over tasks, and the
        mean speed-up of passing programs where there is one. Each rank generates a share; every
        rank enters generation, which gathers parameters collectively. Every verdict goes to
        eval_verdicts.jsonl in the run directory."""
        from elastic.train.fsdp_generate import fsdp_generate

        rl, ctx = self.rl, self.ctx
        n = rl.eval_samples
        if (rl.turns > 1 or rl.env) and n == 1:  # rl.env: n is 1 (config)
            return self._heldout_eval_turns(step)
        items = [(t, j) for t in self.heldout for j in range(n)]
        mine = items[ctx.rank::ctx.world_size]
        if n == 1:
            outs = fsdp_generate(ctx.model, [self.prompt_tokens(t) for t, _ in mine], rl.max_new_tokens,
                                 temperature=0.0, stop_token_ids=[self.eos_id], max_batch=rl.rollout_batch,
                                 **self._draft_kwargs(), **self._cache_kwargs())
        else:
            seeds = [derive_seed(ctx.cfg.run.seed, "eval", step, self.heldout.index(t), j) for t, j in mine]
            outs = fsdp_generate(ctx.model, [self.prompt_tokens(t) for t, _ in mine], rl.max_new_tokens,
                                 temperature=rl.temperature, top_p=rl.top_p, top_k=rl.top_k,
                                 stop_token_ids=[self.eos_id], seed=seeds, max_batch=rl.rollout_batch,
                                 **self._draft_kwargs(), **self._cache_kwargs())
        self.count_forward(sum(len(self.prompt_tokens(t)) + len(o.tokens) for (t, _), o in zip(mine, outs)))
        keys = [f"{self.run_name}:eval{step}:{t}:{j}" for t, j in mine]
        texts = [decode_text(self.tok, o.tokens) for o in outs]
        got: Dict[str, Any] = {}
        if ctx.tp_rank == 0:  # tensor-parallel peers hold the same items: one asks, all use it
            self.reward.submit([(k, t, c) for k, (t, _), c in zip(keys, mine, texts)])
            while len(got) < len(keys):
                got.update(self.reward.results([k for k in keys if k not in got], timeout_s=30.0))
            self.reward.forget(keys)
        got = ctx.share_with_tp_peers(got)
        path = os.path.join(ctx.local_dir, EVAL_VERDICTS)
        for k, (t, j), c in zip(keys if ctx.tp_rank == 0 else [], mine, texts):
            r = got[k]
            append_record(path, {"step": step, "task": t, "sample": j, "status": r.status, "reward": r.reward,
                                 "speedup": r.speedup, "reason": (r.reason or "")[:300], "completion": c[:4000]})
        res = [(t, got[k].status, got[k].speedup) for k, (t, _) in zip(keys, mine)]
        alls = [x for p in ctx.comm.all_gather_object(res) for x in p]
        per_task: Dict[str, List[str]] = {}
        for t, st, _ in alls:
            if st != "sandbox_error":  # infrastructure: neither a pass nor a fail
                per_task.setdefault(t, []).append(st)
        if not per_task:
            return {}
        out: Dict[str, Any] = {"heldout_problems": len(per_task), "heldout_samples": n}
        for kk in sorted(set(rl.eval_k)):
            pk = mean_pass_at_k([(len(v), sum(s == "ok" for s in v)) for v in per_task.values()], kk)
            if pk is not None:
                out[f"heldout_pass_at_{kk}"] = pk
        # The standard error of pass@1 over tasks: sd of the per-task pass shares / sqrt(tasks)
        # (the tasks are the sample; a task's own n samples make its share less noisy).
        shares = np.array([np.mean([s == "ok" for s in v]) for v in per_task.values()])
        out["heldout_se_pass_at_1"] = float(shares.std(ddof=1) / np.sqrt(len(shares))) if len(shares) > 1 else 0.0
        sp = [x for _, st, x in alls if st == "ok" and x is not None]
        if sp:
            out["heldout_speedup"] = float(np.mean(sp))
        return out

    def _heldout_eval_turns(self, step: int) -> Dict[str, Any]:
        """rl.turns > 1 (or rl.env) with rl.eval_samples 1: one greedy episode per held-out task,
        first message and feedback as in training (the same scorer); `heldout_pass_at_turn_t` is
        the share of tasks passed by turn t (the pass@t curve; `heldout_pass_at_1` is turn 1's,
        the single-turn greedy pass@1). Every turn's verdict goes to eval_verdicts.jsonl (with its `turn`)."""
        from elastic.rl.episodes import episode_sampling, reset_key
        from elastic.train.fsdp_generate import fsdp_generate_turns

        rl, ctx = self.rl, self.ctx
        mine = self.heldout[ctx.rank::ctx.world_size]
        path = os.path.join(ctx.local_dir, EVAL_VERDICTS)
        head = lambda t: {"key": f"{self.run_name}:eval{step}:{t}:0", "problem": t, "seed": 0,  # noqa: E731
                          "prompt": self.prompt_tokens(t)}
        heads = [head(t) for t in mine]
        scorer, prompts, _, room_lens = self._episode_setup(heads, [head(t) for t in self.heldout])  # every rank's tasks
        keys: List[str] = [reset_key(h["key"]) for h in heads] if rl.env else []

        def respond(answered, last: bool) -> Dict[int, Optional[List[int]]]:
            out = scorer(answered, last)  # tensor-parallel peers submit the same keys: the service keeps one
            for i, _, _ in answered:
                rec = scorer.turns[i][-1]
                keys.append(rec["key"])
                if ctx.tp_rank == 0:
                    append_record(path, {"step": step, "task": mine[i], "sample": 0, "turn": rec["turn"],
                                         "status": rec["status"], "reward": rec["reward"], "speedup": rec["speedup"],
                                         "reason": rec["reason"], "completion": rec["text"][:4000]})
            return out

        eps = fsdp_generate_turns(ctx.model, prompts, rl.max_new_tokens, rl.turns, respond,
                                  **episode_sampling(rl, room_lens, ctx.model.args.max_seq_len, self.eos_id, greedy=True))
        self.count_forward(sum(len(e.tokens) for e in eps))
        res = [(t, [(x["turn"], x["status"], x["speedup"]) for x in recs]) for t, recs in zip(mine, scorer.turns)]
        alls = [x for p in ctx.comm.all_gather_object(res) for x in p]
        if ctx.tp_rank == 0:
            self.reward.forget(keys)
        # a task whose last verdict is sandbox_error is neither a pass nor a fail
        scored = [v for _, v in alls if v and v[-1][1] != "sandbox_error"]
        if not scored:
            return {}
        out: Dict[str, Any] = {"heldout_problems": len(scored), "heldout_samples": 1}
        first = [next((t for t, st, _ in v if st == "ok"), None) for v in scored]
        for t in range(1, rl.turns + 1):
            out[f"heldout_pass_at_turn_{t}"] = float(np.mean([f is not None and f <= t for f in first]))
        out["heldout_pass_at_1"] = out["heldout_pass_at_turn_1"]
        out["heldout_fixed_by_feedback"] = float(np.mean([f is not None and f > 1 for f in first]))
        sp = [x for v in scored for _, st, x in v if st == "ok" and x is not None]
        if sp:
            out["heldout_speedup"] = float(np.mean(sp))
        return out

    def step_metrics(self) -> Dict[str, Any]:
        rl = self.rl
        m = {k: v for k, v in self._metrics.items() if not k.startswith("_")}
        gen_s = self._metrics.get("generate_s") or 0.0
        gen_tokens = self._metrics.get("_gen_tokens", 0)
        m["gen_tokens_per_s"] = gen_tokens * self.ctx.world_size / gen_s if gen_s else None
        span = self._metrics.get("_reward_span_s")
        m["reward_evals_per_s"] = self.N / span if span else None
        if self.fleet is not None and self.ctx.leader:  # the rollout fleet since the last step
            st = self.fleet.stats()
            tps = st["tokens_per_s"]
            m.update(rollout_fleet=st["fleet"], rollout_idle_frac=st["idle_frac"], rollout_actors_lost=st["lost"],
                     rollout_tokens_per_s=sum(tps.values()) if tps else None,
                     rollout_tokens_per_s_by_actor=tps or None)
        if self._update_stats:
            s = {k: sum(u.get(k, 0.0) for u in self._update_stats) for k in self._update_stats[0]}
            n = max(s.get("tokens", 0.0), 1.0)
            m.update(policy_loss=s.get("pg_loss", 0.0) / len(self._update_stats),
                     # KL to the reference only where there is one (kl_coef > 0): not a measured 0.
                     kl=s.get("kl_sum", 0.0) / n if self._has_reference() else None, entropy=s.get("entropy_sum", 0.0) / n,
                     clip_frac_low=s.get("clip_low_tokens", 0.0) / n, clip_frac_high=s.get("clip_high_tokens", 0.0) / n,
                     # dual clip (rl.clip_ratio_c): tokens with A < 0 whose ratio exceeded c
                     clip_frac_dual=s.get("clip_dual_tokens", 0.0) / n if rl.clip_ratio_c else None,
                     optimizer_updates=len(self._update_stats))
            if "off_policy_tokens" in s:  # disaggregated: the truncated importance weights (elastic/rl/algorithms/off_policy.py)
                off = s["off_policy_tokens"]
                m.update(off_policy_frac=off / n, is_weight_mean=s["is_weight_sum"] / off if off else None,
                         is_capped_frac=s["is_capped_tokens"] / off if off else None)
        return {k: v for k, v in m.items() if v is not None}


def grpo_loop_per_worker(config: Dict[str, Any]) -> None:
    """Ray Train entry for GRPO: the shared loop skeleton with the GRPO job."""
    from elastic.train.loop import run_worker

    run_worker(config, GRPOJob)
