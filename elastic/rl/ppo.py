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

Exact resume: the critic and its optimizer are checkpointed with the policy (the loop's `aux`
modules, one DCP checkpoint, reshardable), the KL controller's state and the prompt cursor are in
the job state; sampling seeds derive from the step. A run stopped and resumed, at any world
size, continues with the same values as an uninterrupted one.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Dict, Iterator, List, Optional

import numpy as np
import torch

from elastic.rl.algorithms.aggregation import StepCounts
from elastic.rl.algorithms.gae import gae_advantages_returns, token_level_rewards
from elastic.rl.grpo import GRPOJob, Rollout, StepOutcome, add_behaviour, off_policy_weights, scoring_temperature
from elastic.rl.algorithms.kl_controller import build_kl_controller, kl_controller_from_state_dict
from elastic.rl.algorithms.logprobs import token_entropy, token_logprobs
from elastic.rl.algorithms.loss import grpo_loss
from elastic.rl.prompts import completion_id, flat, group_of
from elastic.rl.algorithms.value_loss import clipped_value_loss
from elastic.train.job import Update, WorkerContext
from elastic.train.step import LossFn, LossOutput, Micro, StepOutput, batch_attention, to_device


def critic_config(cfg):
    """The config the critic is built from: the policy's, with a scalar head and its own source."""
    src = cfg.rl.critic_init or cfg.reward.model_path or cfg.model.init_from
    lora = dataclasses.replace(cfg.model.lora, rank=0)
    return dataclasses.replace(cfg, model=dataclasses.replace(cfg.model, init_from=src, num_labels=1, lora=lora))


class PPOJob(GRPOJob):
    state_keys = ("prompt_cursor", "kl_ctl", "rollout_buffer")

    # ------------------------------------------------------------------ the critic
    def build_aux(self, cfg, device, param_dtype) -> Dict[str, Any]:
        from elastic.train.loop import build_sharded_model, resolve_compile
        from elastic.train.optim import build_optimizer

        t = cfg.train
        self._critic_cfg = critic_config(cfg)
        self.critic, _, _ = build_sharded_model(self._critic_cfg, device, param_dtype)
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
                self._counts = StepCounts(sequences=len(kept), tokens=max(1, int(outcome.lengths[kept].sum())),
                                          max_new_tokens=rl.max_new_tokens)
                micro, part_rows, pad = self._kept_micro_batches(
                    m, part, by_k, keep, lambda rs: self._ppo_micro_batches(rs, keep, values, adv, ret))
                yield Update(micro_batches=micro, normaliser=1.0, tokens=int(sum(len(r.tokens) for r in part_rows)),
                             compute_tokens=2 * int(sum(len(r.prompt) + len(r.tokens) for r in part_rows + pad)))
        self.reward.forget([r.key for r in rows])
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
        """V at each completion token (the critic's head at the position before it), by k."""
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
        T = max(1, max(len(r.tokens) for r in rows))
        B = len(rows)
        mask = torch.zeros(B, T, dtype=torch.float64)
        vals = torch.zeros(B, T, dtype=torch.float64)
        kl = torch.zeros(B, T, dtype=torch.float64)
        scores = torch.zeros(B, dtype=torch.float64)
        for b, r in enumerate(rows):
            n = len(r.tokens)
            if keep[r.k]:
                mask[b, :n] = 1.0
            vals[b, :n] = torch.from_numpy(values[r.k])
            if r.ref_logp is not None:
                kl[b, :n] = torch.from_numpy(r.old_logp.astype(np.float64) - r.ref_logp.astype(np.float64))
            scores[b] = float(outcome.rewards[r.k])
        rewards = token_level_rewards(scores, mask, kl if coef else None, coef)
        raw, ret = gae_advantages_returns(rewards, vals, mask, rl.gamma, rl.lam, whiten=False)
        # whitening over every kept completion token of the step, on all ranks (verl's
        # masked_whiten: unbiased variance), then the KL the controller sees
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
        temp = scoring_temperature(rl)

        def loss(model, mb: Micro) -> LossOutput:
            counts = self._counts
            logits = model(mb["tokens"], mb["positions"], mb["doc_ids"], batch_attention(model, mb))[:, :-1].float()
            targets, mask = mb["tokens"][:, 1:], mb["cmask"][:, 1:]
            logp = token_logprobs(logits, targets, temp)
            with torch.no_grad():
                ent = token_entropy(logits, temp)
            ref = mb["ref_logp"][:, 1:] if "ref_logp" in mb else None
            is_w, is_stats = off_policy_weights(rl, mb, mb["old_logp"][:, 1:], mask)
            pg, stats = grpo_loss(logp, mb["old_logp"][:, 1:], mb["adv_tok"][:, 1:], mask, loss_agg=rl.loss_agg, counts=counts,
                                  clip_low=rl.clip_low, clip_high=rl.clip_high, clip_ratio_c=rl.clip_ratio_c,
                                  ref_logp=ref, kl_coef=0.0, kl_estimator=rl.kl_estimator, entropy=ent, is_weights=is_w)
            v = self.critic(mb["tokens"], mb["positions"], mb["doc_ids"], batch_attention(self.critic, mb))[:, :-1, 0].float()
            vf, vclip = clipped_value_loss(v, mb["old_values"][:, 1:], mb["returns"][:, 1:], mask, rl.cliprange_value,
                                           rl.loss_agg, counts=counts)
            total = self._pg_coef * pg + rl.vf_coef * vf
            stats = {**stats, **is_stats}
            stats["loss_sum"] = stats["loss"] * self._pg_coef + rl.vf_coef * vf.detach().double()
            stats["vf_loss"] = vf.detach().double()
            stats["vf_clipped_tokens"] = (vclip.double() * (mask != 0).sum()).detach()
            stats["vf_tokens"] = (mask != 0).sum().double()
            return LossOutput(total, stats)

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
