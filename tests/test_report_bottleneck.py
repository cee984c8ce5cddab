"""The bottleneck classifier names the right limiter on synthetic metric streams, one per class,
and its thresholds and ranking rules hold at their edges."""

from __future__ import annotations

import math

import pytest

from elastic.report import THRESHOLDS, diagnose
from elastic.report.bottleneck import steady_records
from elastic.report.spikes import LOSS_MIN_REL, LOSS_Z, upward_spikes
from tests.report_synth import Profile, Sim, simulate

CFG = {"train": {"micro_batch_size": 8, "lr": 3e-3, "warmup_steps": 10, "grad_clip": 1.0, "compile": False,
                 "activation_checkpointing": "none"},
       "data": {"tokenize_cpus": 1.0}, "checkpoint": {"every_steps": 20},
       "reward": {"num_actors": 2, "timing": "wall", "timing_runs": 5},
       "rl": {"group_size": 4, "prompts_per_step": 4, "max_new_tokens": 256},
       "scaling": {"cpus_per_worker": 1.0, "worker_group_start_timeout_s": 60.0}}


def run(sim: Sim, recovery=None):
    metrics, events, _ = simulate(sim)
    return diagnose(metrics, events, recovery, CFG)


def test_input_bound_names_data_wait_and_tokenize_cpus():
    d = run(Sim(profile=Profile(data_wait=0.45)))  # ~0.45 of ~1.4 s steps
    assert d.name == "input"
    assert 0.25 < d.score < 0.40
    assert "waited for data" in d.evidence and f"{d.score:.0%}" in d.evidence
    assert "data.tokenize_cpus (now 1.0)" in d.lever


def test_just_below_input_threshold_is_not_input():
    # data wait ~8% of the step: under the 10% threshold, nothing else waits → compute on CPU
    d = run(Sim(profile=Profile(data_wait=0.085)))
    assert d.figures["data_wait_share"] < THRESHOLDS["input"]
    assert d.name == "compute"


def test_communication_bound_from_profiled_steps_only():
    d = run(Sim(profile=Profile(comm_frac=0.45), profile_every=10))
    assert d.name == "communication"
    assert d.figures["comm_sampled_steps"] == 20  # 200 steps, every 10th profiled
    assert 0.35 < d.score < 0.45  # 45% of fwd+bwd ≈ 41% of the step, on the profiled steps
    assert "train.micro_batch_size (now 8)" in d.lever and "HSDP" in d.lever
    assert "activation_checkpointing" not in d.lever  # memory is not tight here


def test_communication_lever_makes_room_first_when_memory_is_tight():
    d = run(Sim(device="cuda:0", mfu=0.3, device_mem_gib=80.0, mem_frac=0.95, profile=Profile(comm_frac=0.45)))
    assert d.name == "communication"  # time beats headroom
    assert "train.activation_checkpointing: full" in d.lever
    assert [f.name for f in d.findings] == ["communication", "memory"]


def test_checkpoint_bound():
    d = run(Sim(every=5, profile=Profile(checkpoint=1.5)))
    assert d.name == "checkpoint"
    assert "checkpoint.every_steps (now 20)" in d.lever


def test_synchronous_checkpoints_point_at_async_save():
    d = diagnose(*simulate(Sim(every=5, profile=Profile(checkpoint=1.5)))[:2], None,
                 {**CFG, "checkpoint": {"every_steps": 5, "async_save": False}})
    assert d.name == "checkpoint" and "synchronous" in d.evidence
    assert d.lever.startswith("checkpoint.async_save: true (now False)")


def test_async_checkpoints_state_the_stall_per_save_and_the_background_write():
    # Each save stalls ~0.9 s, ~0.8 s of it waiting for the previous save's 6 s background
    # write: writes outlast the 5 steps between saves.
    d = run(Sim(every=5, profile=Profile(checkpoint=0.9, checkpoint_wait=0.8, checkpoint_write=6.0)))
    f = d.figures
    assert d.name == "checkpoint"
    assert f["checkpoint_async"] is True and f["checkpoint_saves"] == 200 // 5
    assert 0.8 < f["checkpoint_stall_s_mean"] < 1.0 and 5.0 < f["checkpoint_write_s_mean"] < 7.0
    assert d.evidence.startswith(f"checkpointing blocked training {d.score:.0%} of step time ({f['checkpoint_stall_s_mean']:.3g} s stall per save")
    assert "s of it waiting for the previous save; background write" in d.evidence
    assert "each save waits for the previous one's background write" in d.lever and "checkpoint.every_steps (now 20)" in d.lever
    # the cost of a checkpoint (Young's rule) is every blocked second per save: stall + registration
    assert math.isclose(f["checkpoint_blocked_per_save_s"], f["checkpoint_stall_s_mean"] + 0.004, rel_tol=0.02)


def test_short_async_stalls_are_no_finding():
    d = run(Sim(every=20, profile=Profile(checkpoint=0.01, checkpoint_write=3.0)))
    assert "checkpoint" not in [x.name for x in d.findings]
    assert d.figures["checkpoint_share"] < 0.01 and 2.5 < d.figures["checkpoint_write_s_mean"] < 3.5


def test_waiting_for_the_slowest_rank_is_sync():
    d = run(Sim(profile=Profile(sync=0.4)))
    assert d.name == "sync"
    assert "slowest rank" in d.evidence and "slowest_rank_step_s" in d.lever


def test_largest_share_wins_and_others_are_listed():
    d = run(Sim(profile=Profile(data_wait=0.3, comm_frac=0.6)))
    names = [f.name for f in d.findings]
    assert d.name == "communication" and "input" in names
    assert d.findings[0].score >= d.findings[1].score


def test_memory_headroom_named_when_nothing_waits():
    d = run(Sim(device="cuda:0", mfu=0.45, device_mem_gib=80.0, mem_frac=0.95))
    assert d.name == "memory"
    assert math.isclose(d.score, 0.95, rel_tol=1e-6)
    assert "76.0 GiB" in d.evidence and "80.0 GiB" in d.evidence
    assert "train.activation_checkpointing: full" in d.lever and "train.micro_batch_size" in d.lever


def test_gpu_low_mfu_is_compute_efficiency():
    d = run(Sim(device="cuda:0", mfu=0.12, device_mem_gib=80.0, mem_frac=0.5))
    assert d.name == "compute"
    assert "MFU 12%" in d.evidence and "low" in d.evidence
    assert "train.compile: true (now False)" in d.lever and "flash attention" in d.lever


def test_gpu_high_mfu_is_compute_bound_and_says_so():
    d = run(Sim(device="cuda:0", mfu=0.5, device_mem_gib=80.0, mem_frac=0.5))
    assert d.name == "compute"
    assert "compute-bound at MFU 50%" in d.evidence
    assert "train.compile" not in d.lever


def test_cpu_compute_verdict_never_rests_on_mfu():
    low, high = run(Sim(device="cpu", mfu=0.01)), run(Sim(device="cpu", mfu=0.6))
    for d in (low, high):
        assert d.name == "compute"
        assert "nominal on cpu" in d.evidence and "not the evidence" in d.evidence
        assert "low" not in d.evidence
    assert low.lever == high.lever  # MFU changes nothing on CPU


def test_instability_from_skipped_steps():
    d = run(Sim(steps=200, skipped={50, 51, 120}))
    assert d.name == "instability"
    assert d.figures["stability"]["skipped_steps"] == [50, 51, 120]
    assert "3 of 200 steps" in d.evidence
    assert "train.lr (now 0.003)" in d.lever and "train.warmup_steps (now 10)" in d.lever


def test_instability_from_loss_spikes_found_without_events():
    metrics, events, _ = simulate(Sim(steps=300, loss_spikes={100, 180, 250}))
    events = [e for e in events if e["event"] not in ("bad_step", "loss_spike")]
    d = diagnose(metrics, events, None, CFG)
    assert d.name == "instability"
    assert sorted(s for s, _ in d.figures["stability"]["loss_spikes"]) == [100, 180, 250]


def test_one_bad_step_is_not_instability():
    d = run(Sim(steps=200, skipped={77}))
    assert d.name != "instability"
    assert d.figures["stability"]["skipped_steps"] == [77]  # still reported


def test_stop_on_bad_steps_makes_instability_dominant():
    metrics, events, t = simulate(Sim(steps=100, skipped={98, 99, 100}, profile=Profile(data_wait=0.5)))
    events.append({"event": "stop", "time": t, "reason": "5 consecutive bad steps (non-finite loss)"})
    d = diagnose(metrics, events, None, CFG)
    assert d.name == "instability" and d.score == 1.0
    assert "stopped on it" in d.evidence
    assert "input" in [f.name for f in d.findings]


def test_restarts_below_95_percent_goodput_with_young_interval():
    sim = Sim(steps=200, every=10, profile=Profile(checkpoint=0.5), restarts=[(55, "failure", 1), (130, "failure", 2)])
    metrics, events, _ = simulate(sim)
    wall = metrics[-1]["time"] - sim.t0
    recovery = {"goodput": 0.80, "training_s": wall, "useful_s": 0.8 * wall,
                "restarts": [{"cause": "failure", "steps_redone": 5, "recovery_s": 15.0},
                             {"cause": "failure", "steps_redone": 0, "recovery_s": 15.0}]}
    d = diagnose(metrics, events, recovery, CFG)
    assert d.name == "restarts"
    assert math.isclose(d.score, 0.20)
    assert "goodput 20%" not in d.evidence and "goodput 80%" in d.evidence
    assert "2 restarts (2 failure)" in d.evidence and "5 steps redone" in d.evidence
    # Young: sqrt(2 × C × MTBF) with C the mean checkpoint seconds and MTBF = wall / failures
    ckpts = [r["checkpoint_s"] for r in metrics if "checkpoint_s" in r]
    step_s = sum(r["step_s"] for r in steady_records(metrics, events)) / len(steady_records(metrics, events))
    expect = round(math.sqrt(2 * (sum(ckpts) / len(ckpts)) * wall / 2) / step_s)
    assert f"checkpoint.every_steps ≈ {expect} (now 20) by Young's rule" in d.lever


def test_goodput_loss_without_restart_is_overhead():
    metrics, events, _ = simulate(Sim(steps=100))
    d = diagnose(metrics, events, {"goodput": 0.85, "training_s": 200.0, "restarts": []}, CFG)
    assert d.name == "overhead"
    assert "no restart" in d.evidence


def test_goodput_at_96_percent_is_fine():
    metrics, events, _ = simulate(Sim(steps=100))
    d = diagnose(metrics, events, {"goodput": 0.96, "training_s": 200.0, "restarts": [{"cause": "resize"}]}, CFG)
    assert d.name == "compute"


def test_grpo_generation_bound():
    d = run(Sim(grpo=True, profile=Profile(generate=4.0, reward_wait=0.2, logprob=0.3, update=0.8)))
    assert d.name == "generation"
    assert "rl.max_new_tokens (now 256)" in d.lever and "rl.group_size (now 4)" in d.lever
    assert "900 generated tokens/s" in d.evidence


def test_grpo_reward_wait_bound():
    d = run(Sim(grpo=True, profile=Profile(generate=1.0, reward_wait=1.5, logprob=0.2, update=0.5)))
    assert d.name == "reward_wait"
    assert 0.4 < d.score < 0.5
    assert "reward.num_actors (now 2)" in d.lever and "6 evaluations/s" in d.evidence


def test_grpo_cpu_contention_is_named_with_its_evidence():
    """Generation that got well under its cores while the trainer also waited on the reward pool:
    the finding says the two shared CPUs (the measured share) and the lever puts the pool apart."""
    metrics, events, _ = simulate(Sim(grpo=True, profile=Profile(generate=1.0, reward_wait=1.5, logprob=0.2, update=0.5)))
    for r in metrics:
        if "generate_s" in r:
            r["generate_cpu_frac"] = 0.55
    d = diagnose(metrics, events, None, CFG)
    assert d.name == "reward_wait"
    assert "Generation got 55% of its cores" in d.evidence and "CPUs the trainers do not use" in d.lever
    for r in metrics:  # generation that had its cores: no contention claimed
        if "generate_s" in r:
            r["generate_cpu_frac"] = 0.97
    d = diagnose(metrics, events, None, CFG)
    assert "of its cores" not in d.evidence and "CPUs the trainers do not use" not in d.lever


def test_grpo_generation_largest_below_threshold_is_named():
    # 45% sampling, 40% log-probs + update: nothing is a finding, sampling is the larger part
    d = run(Sim(grpo=True, profile=Profile(generate=4.5, reward_wait=1.0, logprob=1.0, update=3.0)))
    assert d.name == "generation"
    assert 0.4 < d.score < 0.5
    assert "below its 50%" in d.evidence and "rl.max_new_tokens" in d.lever


def test_grpo_loss_jumps_are_not_instability():
    # the surrogate loss (not the gradient norm) jumps on steps 30, 60, 90: in pretraining
    # records those are spikes, in GRPO records they are not
    for grpo, expected in ((True, "compute"), (False, "instability")):
        prof = Profile(generate=0.5, reward_wait=0.05, logprob=0.5, update=2.0)
        metrics, events, _ = simulate(Sim(grpo=grpo, profile=prof))
        for r in metrics:
            if r["step"] in (30, 60, 90):
                r["loss"] = 3 * abs(r["loss"]) + 1.0
        d = diagnose(metrics, events, None, CFG)
        assert d.name == expected, (grpo, d.name, d.evidence)


def test_grpo_update_bound_is_compute():
    d = run(Sim(grpo=True, profile=Profile(generate=0.5, reward_wait=0.05, logprob=0.5, update=2.0)))
    assert d.name == "compute"
    assert d.figures["compute_share"] > 0.7


def test_first_step_of_each_attempt_is_not_steady():
    # a 20 s pipeline start on the first step of every attempt would be 10% of the run otherwise
    sim = Sim(steps=100, first_step_wait=20.0, restarts=[(40, "resize", 1), (70, "resize", 2)])
    metrics, events, _ = simulate(sim)
    d = diagnose(metrics, events, None, CFG)
    assert d.name != "input"
    assert d.steps_analyzed == len(metrics) - 3
    assert all(r["data_wait_s"] < 1.0 for r in steady_records(metrics, events))


def test_older_records_without_breakdown():
    old = [{"step": i, "loss": 5.0 - i * 0.01, "data_wait_s": 0.3, "step_s": 1.0, "tokens": 1000, "mfu": 0.01,
            "time": 1000.0 + i} for i in range(1, 51)]
    d = diagnose(old, [], None, None)
    assert d.name == "input" and d.device == "unknown"
    old2 = [dict(r, data_wait_s=0.01) for r in old]
    d2 = diagnose(old2, [], None, None)
    assert d2.name == "compute" and "nominal on unknown" in d2.evidence


def test_no_records_is_unknown():
    d = diagnose([], [], None, None)
    assert d.name == "unknown" and d.steps_analyzed == 0


@pytest.mark.parametrize("values,expect", [
    ([8.0 * math.exp(-i / 10) + 2 for i in range(100)], []),  # a fast-falling loss is not a spike
    ([3.0 + 0.01 * ((-1) ** i) for i in range(60)], []),  # flat and noisy
    ([3.0 + 0.01 * ((-1) ** i) if i != 40 else 4.0 for i in range(60)], [40]),
    ([3.0] * 30 + [float("nan")] + [3.0] * 10 + [3.5] + [3.0] * 5, [41]),  # NaN never enters the history
])
def test_spike_detector(values, expect):
    found = upward_spikes(list(range(len(values))), values, LOSS_Z, LOSS_MIN_REL)
    assert [s for s, _ in found] == expect


def _disagg_records(rollout_wait: float, idle: float, n: int = 6):
    recs = []
    for s in range(1, n + 1):
        step_s = rollout_wait + 0.1 + 0.2 + 0.7
        recs.append({"step": s, "step_s": step_s, "rollout_wait_s": rollout_wait, "reward_wait_s": 0.1, "logprob_s": 0.2,
                     "update_s": 0.7, "rollout_fleet": 2, "rollout_idle_frac": idle, "rollout_tokens_per_s": 900.0,
                     "tokens": 1000, "mfu": 0.01, "world_size": 2, "time": 100.0 + s, **({"warmup": True} if s == 1 else {})})
    return recs


def test_disaggregated_trainers_waiting_on_the_fleet_name_rollout_wait_and_its_levers():
    cfg = {**CFG, "rl": {**CFG["rl"], "max_staleness": 1, "rollout": {"workers": 2}}}
    d = diagnose(_disagg_records(rollout_wait=1.0, idle=0.05), [], None, cfg)
    assert d.name == "rollout_wait" and d.score == pytest.approx(1.0 / 2.0)
    assert "waited for the rollout fleet 50%" in d.evidence and "2 rollout actors" in d.evidence
    assert "rl.rollout.workers (now 2)" in d.lever and "rl.max_staleness (now 1)" in d.lever


def test_disaggregated_fleet_idle_while_trainers_never_wait_says_training_limits():
    cfg = {**CFG, "rl": {**CFG["rl"], "rollout": {"workers": 2}}, "scaling": {**CFG["scaling"], "max_workers": 2}}
    d = diagnose(_disagg_records(rollout_wait=0.01, idle=0.8), [], None, cfg)
    assert d.name == "compute"
    assert "fleet was idle 80%" in d.evidence and "more trainers (scaling.max_workers (now 2))" in d.evidence
