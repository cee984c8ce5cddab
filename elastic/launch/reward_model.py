"""Driver side of reward-model training: DPO's pair reading and checks (elastic/launch/dpo.py),
no reference model, the reward-model job on the workers (elastic/rl/reward_model.py).

The run's checkpoints are scalar-head models (`model.num_labels: 1`); `jobs/export_hf.py`
writes them as Hugging Face *ForSequenceClassification directories, and `reward.kind: model`
serves them to GRPO and PPO.
"""

from __future__ import annotations

from typing import Optional, TextIO

from elastic.config import Config, ConfigError
from elastic.data.preference import PairFormat
from elastic.launch.dpo import DPOLaunch
from elastic.launch.driver import JobResult, RunPaths, build_torch_trainer, run_job


class RewardModelLaunch(DPOLaunch):
    job = "reward_model"
    label = "reward-model training"

    def pair_format(self, cfg: Config) -> PairFormat:
        d = cfg.dpo
        return PairFormat(d.prompt_field, d.chosen_field, d.rejected_field, cfg.reward_model.margin_field)

    def plan(self, cfg: Config, paths: RunPaths, say) -> None:
        if cfg.model.num_labels != 1:
            raise ConfigError(f"model.num_labels: a reward model has one score (set it to 1), got {cfg.model.num_labels}")
        if cfg.model.lora.rank > 0:
            raise ConfigError("model.lora.rank: LoRA reward models are not supported yet (the new score head would stay "
                              "frozen with the base); train all weights")
        super().plan(cfg, paths, say)

    def describe(self) -> list:
        cfg, tr, he = self.cfg, self.pairs["train"], self.pairs["heldout"]
        rm = cfg.reward_model
        extra = (f", margin from {rm.margin_field!r}" if rm.margin_field else "") + (
            f", centring {rm.center_rewards_coefficient:g}" if rm.center_rewards_coefficient else "")
        lines = [f"[elastic] reward model: {len(tr)} pairs ({tr.tokens()} tokens)"
                 + (f", {len(he)} held out" if he is not None else "")
                 + f"; Bradley-Terry loss{extra}; backbone from {cfg.model.init_from}, new score head"]
        return lines + self.bad_rows_lines()

    def start(self, cfg: Config, paths: RunPaths) -> None:
        pass  # no reference model, nothing to precompute

    def trainer(self, cfg: Config, paths: RunPaths, gpu: bool):
        import ray

        from elastic.rl.reward_model import rm_loop_per_worker

        return build_torch_trainer(cfg, paths, gpu, rm_loop_per_worker,
                                   {"pairs": ray.put(self.pairs), "bad_rows_total": self.bad.total})


def run_reward_model(cfg: Config, out: Optional[TextIO] = None, progress: bool = True) -> JobResult:
    return run_job(cfg, RewardModelLaunch(), out, progress)
