"""PPO with a critic (`rl.algorithm: ppo`): GRPO's rollouts and rewards, a value model, GAE.

What is shared with GRPO (elastic/rl/grpo.py): prompts from the global cursor, generation on the
FSDP policy with per-completion seeds, rewards streamed to the verifier pool and/or the
reward-model service (`reward.kind: model`), old and reference log-probabilities, the clipped
policy objective and its aggregation modes. What PPO adds, one global step s:

1. **Values**: the critic (a scalar-head model, `model.num_labels: 1` style, sharded like the
   policy; initialised from `rl.critic_init`, else `reward.model_path`, else the policy with a
   new head) gives V at every completion token (the state before it).
2. **Token-level rewards** (elastic/rl/algorithms/gae.py): the sequence reward on the last completion
   token, minus `kl_coef * (log pi_old - log pi_ref)` on every token (k1, in the reward as
   OpenRLHF and verl do); kl_coef comes from the KL controller (fixed or adaptive,
   elastic/rl/algorithms/kl_controller.py), updated once per step with the step's mean KL.
3. **GAE** per completion (gamma, lam; verl's semantics), returns = A + V; advantages whitened
   with the mean and variance of *all* the step's completion tokens (one collective), so the
   numbers do not depend on the world size.
4. **Update**: each optimizer step's loss is the clipped policy loss on the token advantages
   (multiplied by 0 during `rl.critic_warmup_steps`) plus `rl.vf_coef` x the clipped value loss
   (elastic/rl/algorithms/value_loss.py). The critic has its own AdamW (`rl.critic_lr`), stepped after the
   policy's, its gradients clipped at `train.grad_clip`.

Multi-turn episodes (`rl.turns > 1` or `rl.env`, colocated; issue 44): GRPO's episode generation
as it is (`GRPOJob._generate` -> `_generate_episodes`: the row's `tokens` are answers and feedback,
`spans` the policy's answers, the reward `episode_reward` of the turns'). What PPO does with such
a row (:func:`rank_gae`, :func:`ppo_loss`): the critic's values over the whole sequence; the
response mask is the policy's spans (feedback tokens are observations inside the response, verl's
multi-turn layout); the episode reward on the last policy token and the KL penalty on policy
tokens only; GAE with `skip_masked=True` (verl main's "skip values and TD-error on observation
tokens"), so the advantages and returns of an episode's policy tokens are those of GAE over its
policy tokens alone, concatenated: a feedback span is no time step, its values and rewards are
never read. Whitening statistics, the value loss, the clipped policy loss and the entropy
statistic (there is no entropy bonus term) count policy tokens only.

Exact resume: the critic and its optimizer are checkpointed with the policy (the loop's `aux`
modules, one DCP checkpoint, reshardable), the KL controller's state and the prompt cursor are in
the job state; sampling seeds derive from the step. A run stopped and resumed, at any world
size, continues with the same values as an uninterrupted one.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Dict, Iterator, List, NamedTuple, Optional

import numpy as np
import torch

from elastic.rl.algorithms.aggregation import StepCounts
from elastic.rl.algorithms.gae import gae_advantages_returns, token_level_rewards
from elastic.rl.grpo import GRPOJob, Rollout, StepOutcome, add_behaviour, off_policy_weights, scoring_temperature
from elastic.rl.algorithms.kl_controller import build_kl_controller, kl_controller_from_state_dict
from elastic.rl.algorithms.logprobs import token_entropy, token_logprobs
from elastic.rl.algorithms.loss import grpo_loss
from elastic.rl.prompts import completion_id, flat, group_of
from elastic.rl.algorithms.turns import policy_token_mask
from elastic.rl.algorithms.value_loss import clipped_value_loss
from elastic.train.job import Update, WorkerContext
from elastic.train.step import LossFn, LossOutput, Micro, StepOutput, batch_attention, to_device


def critic_config(cfg):
    """The config the critic is built from: the policy's, with a scalar head and its own source."""
    src = cfg.rl.critic_init or cfg.reward.model_path or cfg.model.init_from
    lora = dataclasses.replace(cfg.model.lora, rank=0)
    return dataclasses.replace(cfg, model=dataclasses.replace(cfg.model, init_from=src, num_labels=1, lora=lora))


def response_mask(r: Rollout, T: int) -> torch.Tensor:
    """``[T]`` float64: 1 on the tokens the policy generated in ``r.tokens`` (all of a
    single-turn completion; an episode's answer spans, not the feedback between them), 0 after."""
    if r.spans is not None:
        return policy_token_mask(list(r.spans), T).to(torch.float64)
    m = torch.zeros(T, dtype=torch.float64)
    m[:len(r.tokens)] = 1.0
    return m


class RankGAE(NamedTuple):
    """:func:`rank_gae`'s result: each ``[B, T]`` float64 over the rows' ``tokens``."""

    mask: torch.Tensor        # 1 on the policy's tokens of kept rows
    values: torch.Tensor      # V at rollout time (every token, feedback included)
    kl: torch.Tensor          # log pi_old - log pi_ref on mask tokens, 0 elsewhere
    rewards: torch.Tensor     # token-level rewards
    advantages: torch.Tensor  # raw GAE advantages (not whitened), 0 off the mask
    returns: torch.Tensor     # advantages + values on the mask, 0 off it


def rank_gae(rows: List[Rollout], values: Dict[int, np.ndarray], rewards: np.ndarray, keep: np.ndarray,
             kl_coef: float, gamma: float, lam: float) -> RankGAE:
    """This rank's GAE before the step-wide whitening (:class:`RankGAE`, B = len(rows), T = the
    longest ``tokens``).

    ``values[k]`` (``[len(tokens)]``): the critic's V at every token after the prompt, feedback
    included; ``rewards [N]`` the step's shaped sequence (episode) rewards by k; ``keep [N]``
    False for a dropped row (its mask is all 0: no score, no advantage). ``mask`` is
    :func:`response_mask` of each kept row; ``kl`` = log pi_old - log pi_ref on mask tokens (0
    elsewhere, and 0 without reference log-probs). Token rewards: the row's reward on its last
    mask token (an episode's last policy token), minus ``kl_coef * kl``
    (:func:`~elastic.rl.algorithms.gae.token_level_rewards`). GAE is verl main's
    ``compute_gae_advantage_return`` (``skip_masked=True``: a masked position carries the next
    policy token's value and lastgaelam through unchanged), so on a multi-turn row the result
    equals GAE over its policy tokens alone, concatenated; what the critic or the rewards hold at
    feedback positions is never read."""
    T = max(1, max(len(r.tokens) for r in rows))
    B = len(rows)
    mask = torch.zeros(B, T, dtype=torch.float64)
    vals = torch.zeros(B, T, dtype=torch.float64)
    kl = torch.zeros(B, T, dtype=torch.float64)
    scores = torch.zeros(B, dtype=torch.float64)
    for b, r in enumerate(rows):
        n = len(r.tokens)
        if keep[r.k]:
            mask[b] = response_mask(r, T)
        vals[b, :n] = torch.from_numpy(np.asarray(values[r.k], np.float64))
        if r.ref_logp is not None:
            kl[b, :n] = torch.from_numpy(r.old_logp.astype(np.float64) - r.ref_logp.astype(np.float64))
        scores[b] = float(rewards[r.k])
    kl = torch.where(mask.bool(), kl, torch.zeros((), dtype=torch.float64))  # feedback is not the policy's action
    tok_rewards = token_level_rewards(scores, mask, kl if kl_coef else None, kl_coef)
    raw, ret = gae_advantages_returns(tok_rewards, vals, mask, gamma, lam, skip_masked=True, whiten=False)
    return RankGAE(mask, vals, kl, tok_rewards, raw, ret)


def ppo_loss(logits: torch.Tensor, values: torch.Tensor, mb: Micro, rl, counts: StepCounts, pg_coef: float) -> LossOutput:
    """One micro-batch's PPO loss: ``pg_coef`` x the clipped policy loss on the token advantages
    plus ``rl.vf_coef`` x the clipped value loss, and their statistics.

    ``logits [B, L-1, V]`` (the policy's, differentiable) and ``values [B, L-1]`` (the critic's)
    at positions 0..L-2, each predicting / valuing token t+1 of ``mb["tokens"] [B, L]``; ``mb``
    from ``PPOJob._ppo_micro_batches`` (``cmask``, ``old_logp``, ``adv_tok``, ``returns``,
    ``old_values``, maybe ``ref_logp`` and behaviour log-probs, aligned with the tokens). Both
    losses, the KL and the entropy statistic are over ``cmask`` (1 on the policy's own tokens: in
    an episode, not on feedback), each masked input zeroed with ``torch.where`` before any
    arithmetic, so logits, values, advantages or returns at feedback positions change no gradient."""
    temp = scoring_temperature(rl)
    targets, mask = mb["tokens"][:, 1:], mb["cmask"][:, 1:]
    logp = token_logprobs(logits, targets, temp)
    with torch.no_grad():
        ent = token_entropy(logits, temp)
    ref = mb["ref_logp"][:, 1:] if "ref_logp" in mb else None
    is_w, is_stats = off_policy_weights(rl, mb, mb["old_logp"][:, 1:], mask)
    pg, stats = grpo_loss(logp, mb["old_logp"][:, 1:], mb["adv_tok"][:, 1:], mask, loss_agg=rl.loss_agg, counts=counts,
                          clip_low=rl.clip_low, clip_high=rl.clip_high, clip_ratio_c=rl.clip_ratio_c,
                          ref_logp=ref, kl_coef=0.0, kl_estimator=rl.kl_estimator, entropy=ent, is_weights=is_w)
    vf, vclip = clipped_value_loss(values, mb["old_values"][:, 1:], mb["returns"][:, 1:], mask, rl.cliprange_value,
                                   rl.loss_agg, counts=counts)
    total = pg_coef * pg + rl.vf_coef * vf
    stats = {**stats, **is_stats}
    stats["loss_sum"] = stats["loss"] * pg_coef + rl.vf_coef * vf.detach().double()
    stats["vf_loss"] = vf.detach().double()
    stats["vf_clipped_tokens"] = (vclip.double() * (mask != 0).sum()).detach()
    stats["vf_tokens"] = (mask != 0).sum().double()
    return LossOutput(total, stats)


class PPOJob(GRPOJob):
    state_keys = ("prompt_cursor", "kl_ctl", "rollout_buffer")

    # ------------------------------------------------------------------ the critic
    def build_aux(self, cfg, device, param_dtype, mesh=None) -> Dict[str, Any]:
        from elastic.train.loop import build_sharded_model, resolve_compile
        from elastic.train.optim import build_optimizer

        t = cfg.train
        self._critic_cfg = critic_config(cfg)
        self.critic, _, _ = build_sharded_model(self._critic_cfg, device, param_dtype, mesh)
        if resolve_compile(t.compile, device):
            for block in self.critic.layers:
                block.compile()
        self.critic_opt = build_optimizer(self.critic, cfg.rl.critic_lr, t.weight_decay, (t.beta1, t.beta2),
                                          fused=device.type == "cuda")
        return {"critic": (self.critic, self.critic_opt)}

    def init_aux(self, cfg) -> None:
        from elastic.train.loop import load_initial_weights

        load_initial_weights(self.critic, self._critic_cfg)

    def start(self, ctx: WorkerContext, state: Dict[str, Any]) -> None:
        super().start(ctx, state)
        rl = self.rl
        saved = state.get("kl_ctl")
        self.kl_ctl = (kl_controller_from_state_dict(saved) if saved else
                       build_kl_controller(rl.kl_ctl, kl_coef=rl.kl_coef, target_kl=rl.kl_target, horizon=rl.kl_horizon))
        self._pg_coef = 1.0
        self._ppo_metrics: Dict[str, Any] = {}

    def state(self) -> Dict[str, Any]:
        return {**super().state(), "kl_ctl": self.kl_ctl.state_dict()}

    # ------------------------------------------------------------------ one step
    def updates(self, step: int) -> Iterator[Update]:
        rl = self.rl
        self._metrics, self._update_stats, self._ppo_metrics = {}, [], {}
        self._step = step
        self._pg_coef = 0.0 if step < rl.critic_warmup_steps else 1.0
        if step == 0 and rl.eval_every and self.heldout:
            self._initial_eval = {f"initial_{k}": v for k, v in self._heldout_eval(0).items()}
        prompts = self.stream.step(step, rl.prompts_per_step)
        ks = flat(self.mine)
        rows = self._generate(step, prompts, ks)
        self.count_forward(sum(len(r.prompt) + len(r.tokens) for r in rows))
        self._old_and_ref(rows)
        values = self._values(rows)
        outcome = self._collect_rewards(step, prompts, rows)
        keep = np.array([s != "sandbox_error" for s in outcome.statuses])
        adv, ret = self._advantages(rows, values, outcome, keep)
        by_k = {r.k: r for r in rows}
        G = rl.group_size
        self._step_ids = [completion_id(prompts[group_of(k, G)[0]][0], group_of(k, G)[1], G) for k in ks]
        for _ in range(rl.updates_per_rollout):
            for m, part in enumerate(self.mine):
                mb_ks = range(m * (self.N // rl.minibatches_per_update), (m + 1) * (self.N // rl.minibatches_per_update))
                kept = [k for k in mb_ks if keep[k]]
                if not kept:
                    continue
                # lengths count policy tokens (an episode's answers); an episode's bound is turns x max_new_tokens
                self._counts = StepCounts(sequences=len(kept), tokens=max(1, int(outcome.lengths[kept].sum())),
                                          max_new_tokens=rl.max_new_tokens * rl.turns)
                micro, part_rows, pad = self._kept_micro_batches(
                    m, part, by_k, keep, lambda rs: self._ppo_micro_batches(rs, keep, values, adv, ret))
                yield Update(micro_batches=micro, normaliser=1.0, tokens=int(sum(r.policy_len for r in part_rows)),
                             compute_tokens=2 * int(sum(len(r.prompt) + len(r.tokens) for r in part_rows + pad)))
        self._forget(rows)
        self._cursor = (step + 1) * rl.prompts_per_step

    def _old_and_ref(self, rows: List[Rollout]) -> None:
        """Old log-probs always (the KL in the reward and the ratio need them), reference ones
        when there is a reference (rl.kl_coef > 0)."""
        for r, lp in zip(rows, self._completion_logprobs(self.ctx.model, rows)):
            r.old_logp = lp
        if self.ref_model is not None:
            for r, lp in zip(rows, self._completion_logprobs(self.ref_model, rows)):
                r.ref_logp = lp

    @torch.no_grad()
    def _values(self, rows: List[Rollout]) -> Dict[int, np.ndarray]:
        """V at each token after the prompt (the critic's head at the position before it), by k:
        an episode's feedback tokens too (GAE skips them, the value loss masks them)."""
        out: Dict[int, np.ndarray] = {}
        mbs = self.rl.micro_batch_size
        for i in range(0, len(rows), mbs):
            part = rows[i:i + mbs]
            self.count_forward(sum(len(r.prompt) + len(r.tokens) for r in part))
            t = to_device(self._sequence_batch(part), self.ctx.device)
            v = self.critic(t["tokens"], t["positions"], t["doc_ids"], batch_attention(self.critic, t))[:, :-1, 0].float().cpu().numpy()
            for j, r in enumerate(part):
                a = len(r.prompt) - 1
                out[r.k] = v[j, a:a + len(r.tokens)].astype(np.float64).copy()
        return out

    def _advantages(self, rows: List[Rollout], values: Dict[int, np.ndarray], outcome: StepOutcome,
                    keep: np.ndarray):
        """Token advantages (whitened over the whole step) and returns of this rank's rows, by k."""
        rl, comm = self.rl, self.ctx.comm
        coef = self.kl_ctl.value if self.ref_model is not None else 0.0
        mask, vals, kl, _, raw, ret = rank_gae(rows, values, outcome.rewards, keep, coef, rl.gamma, rl.lam)
        # whitening over every kept policy token of the step, on all ranks (verl's masked_whiten:
        # unbiased variance; raw is 0 off the mask), then the KL the controller sees
        seq_kl = ((kl * mask).sum(-1) / mask.sum(-1).clamp_min(1)).sum()
        n_seq = float((mask.sum(-1) > 0).sum())
        sums = comm.sum([float(raw.sum()), float((raw ** 2).sum()), float(mask.sum()), float(seq_kl), n_seq,
                         float((ret * mask).sum()), float((ret ** 2 * mask).sum()), float((vals * mask).sum()),
                         float((((ret - vals) * mask) ** 2).sum())])
        s, s2, n, kl_sum, seqs, rs, rs2, vs, ev2 = sums
        mean = s / max(n, 1.0)
        var = (s2 - n * mean * mean) / max(n - 1.0, 1.0)
        adv = ((raw - mean) / math.sqrt(max(var, 0.0) + 1e-8)) * mask
        step_kl = kl_sum / max(seqs, 1.0)
        ret_mean = rs / max(n, 1.0)
        ret_var = rs2 / max(n, 1.0) - ret_mean ** 2
        self._ppo_metrics.update(kl_coef=coef, kl_in_reward=step_kl if self.ref_model is not None else None,
                                 returns_mean=ret_mean, values_mean=vs / max(n, 1.0),
                                 explained_variance=1.0 - (ev2 / max(n, 1.0)) / ret_var if ret_var > 1e-12 else None,
                                 critic_warmup=self._pg_coef == 0.0)
        if self.ref_model is not None:
            self.kl_ctl.update(step_kl, n_steps=self.N)
        out_adv = {r.k: adv[b, :len(r.tokens)].numpy().astype(np.float32) for b, r in enumerate(rows)}
        out_ret = {r.k: ret[b, :len(r.tokens)].numpy().astype(np.float32) for b, r in enumerate(rows)}
        return out_adv, out_ret

    def _ppo_micro_batches(self, rows: List[Rollout], keep, values, adv, ret) -> List[Dict[str, np.ndarray]]:
        out = []
        for i in range(0, len(rows), self.rl.micro_batch_size):
            part = rows[i:i + self.rl.micro_batch_size]
            b = self._sequence_batch(part)
            L = b["tokens"].shape[1]
            arrays = {k: np.zeros((len(part), L), np.float32) for k in ("old_logp", "ref_logp", "adv_tok", "returns", "old_values")}
            for j, r in enumerate(part):
                a, n = len(r.prompt), len(r.tokens)
                arrays["old_logp"][j, a:a + n] = r.old_logp
                if r.ref_logp is not None:
                    arrays["ref_logp"][j, a:a + n] = r.ref_logp
                arrays["adv_tok"][j, a:a + n] = adv[r.k]
                arrays["returns"][j, a:a + n] = ret[r.k]
                arrays["old_values"][j, a:a + n] = values[r.k]
                if not keep[r.k]:
                    b["cmask"][j] = 0.0
            if not any(r.ref_logp is not None for r in part):
                arrays.pop("ref_logp")
            b.update(arrays)
            if self.fleet is not None:
                add_behaviour(b, part, self._step, self.ctx.cfg.generation.weights != "full")
            out.append(b)
        return out

    # ------------------------------------------------------------------ loss
    def loss_fn(self) -> LossFn:
        rl = self.rl

        def loss(model, mb: Micro) -> LossOutput:
            logits = model(mb["tokens"], mb["positions"], mb["doc_ids"], batch_attention(model, mb))[:, :-1].float()
            v = self.critic(mb["tokens"], mb["positions"], mb["doc_ids"], batch_attention(self.critic, mb))[:, :-1, 0].float()
            return ppo_loss(logits, v, mb, rl, self._counts, self._pg_coef)

        return loss

    def observe(self, out: StepOutput) -> None:
        """After the policy's optimizer step: the critic's (skipped with it on a bad step)."""
        super().observe(out)
        if not out.skipped:
            gc = self.ctx.cfg.train.grad_clip
            gn = torch.nn.utils.clip_grad_norm_(self.critic.parameters(), gc if gc > 0 else float("inf"))
            self._ppo_metrics["critic_grad_norm"] = float(gn.full_tensor() if hasattr(gn, "full_tensor") else gn)
            self.critic_opt.step()
        self.critic_opt.zero_grad(set_to_none=True)

    def step_metrics(self) -> Dict[str, Any]:
        m = super().step_metrics()
        m.pop("adv_mean", None)
        m.pop("adv_std", None)
        m.pop("zero_var_frac", None)
        if self._update_stats:
            s = {k: sum(u.get(k, 0.0) for u in self._update_stats) for k in ("vf_loss", "vf_clipped_tokens", "vf_tokens")}
            m.update(value_loss=s["vf_loss"] / len(self._update_stats),
                     value_clip_frac=s["vf_clipped_tokens"] / max(s["vf_tokens"], 1.0))
        m.update({k: v for k, v in self._ppo_metrics.items() if v is not None})
        m["algorithm"] = "ppo"
        return m


def ppo_loop_per_worker(config: Dict[str, Any]) -> None:
    """Ray Train entry for PPO: the shared loop skeleton with the PPO job."""
    from elastic.train.loop import run_worker

    run_worker(config, PPOJob)
