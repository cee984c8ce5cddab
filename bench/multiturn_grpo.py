"""Single-turn vs 3-turn GRPO from the same SFT policy, at the same policy tokens trained (issue 44,
"Measure"): held-out pass@1 at turn 1 and at turn 3, and the share of turn-1 failures fixed at
turns 2-3, before and after training.

    .venv/bin/python bench/multiturn_grpo.py [--policy <run>/step_N] [--sft-steps 400] [--steps 24]
        [--prompts 8] [--group 4] [--max-single-steps 72] [--smoke]

What runs (2 CPU workers, the reward pool's python_tests verifier in its sandbox, all from
jobs/configs/grpo-python-tasks.yaml with `rl.feedback: details`):

1. **The SFT policy** (skipped with --policy): jobs/configs/sft-python-tasks.yaml trained on
   datasets/python-tasks sft.jsonl + repair_sft.jsonl (the 96 (wrong attempt, feedback, fix)
   rows spread evenly through the 480 single-turn rows), --sft-steps steps. Only the fix of a
   repair row is learned (its wrong attempt has `"weight": 0`, elastic/data/chat.py).
2. **3-turn GRPO** (`rl.turns: 3`), --steps steps. Its step-0 held-out evaluation is the "before"
   row and its last-step one the "after" row (`rl.eval_samples: 1`: one greedy episode per
   held-out task, feedback as in training, `heldout_pass_at_turn_t`; elastic/rl/grpo.py
   `_heldout_eval_turns`). Its policy tokens trained (metrics.jsonl `tokens`: the tokens of the
   episodes' answers in the loss, feedback and prompts excluded, filtered groups excluded) set
   the budget.
3. **Single-turn GRPO** (`rl.turns: 1`), same prompts per step, group, seed, learning rate and
   prompt order, up to --max-single-steps steps with a checkpoint after every step. **How the
   budgets are equalised**: of its checkpoints, the one whose cumulative policy tokens trained is
   closest to the 3-turn run's total is taken (a single-turn episode is one answer, so it needs
   more steps for the same tokens; both token counts and their ratio are printed). If even the
   last checkpoint falls short, the last one is taken and the ratio says by how much.
4. **Held-out evaluation of that checkpoint with 3 turns**: a 1-step `rl.turns: 3` GRPO job
   started from it, whose step-0 evaluation is read (the same code path and greedy episodes as
   run 2's, so single-turn training is judged on the same pass@t curve).

pass@1 here is greedy (one episode per task, 32 held-out tasks: one task is 3.1 points). "fixed
at turns 2-3" = (pass by turn 3 - pass at turn 1) / (1 - pass at turn 1): of the tasks failed at
turn 1, the share passed after feedback. The ratio column is each row's turn-3 pass@1 over the
single-turn run's ("n/a" where that is 0). Nothing is timed against anything (the runs are
sequential; their wall seconds are in the JSON for planning only). Prints a table, writes
bench/results/multiturn_grpo.json and deletes its scratch directory (runs, checkpoints, logs).

Time with the defaults (2026-12-02, 2 cores shared with other jobs, load average 18-38): the
SFT policy 8 min, the three GRPO jobs 15 min (3-turn 5 min, single-turn 7 min, evaluation 2 min).
`--policy` skips the SFT part; `--smoke` checks the plumbing only.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench.trl_peer import GRPO_CONFIG, PY, SFT_CONFIG, last_checkpoint, records, run  # noqa: E402

DATA = REPO / "datasets" / "python-tasks"
TURNS = 3


def interleave(rows: Sequence[str], extra: Sequence[str]) -> List[str]:
    """`rows` with `extra` spread evenly among them (extra[j] after row ceil((j+1) * n/m)), so
    a prefix of the file holds both kinds in proportion."""
    out: List[str] = []
    j, every = 0, len(rows) / max(len(extra), 1)
    for i, r in enumerate(rows):
        out.append(r)
        while j < len(extra) and (j + 1) * every <= i + 1:
            out.append(extra[j])
            j += 1
    return out + list(extra[j:])


def fixed_share(p1: Optional[float], pk: Optional[float]) -> Optional[float]:
    """Of the tasks failed at turn 1 (1 - p1), the share passed by turn k: (pk - p1) / (1 - p1)."""
    if p1 is None or pk is None or p1 >= 1.0:
        return None
    return (pk - p1) / (1.0 - p1)


def closest_step(cumulative: Dict[int, int], budget: int) -> int:
    """The step whose cumulative tokens is closest to `budget` (the earlier one on a tie)."""
    return min(sorted(cumulative), key=lambda s: abs(cumulative[s] - budget))


def sft_policy(work: Path, steps: int) -> Path:
    lines = interleave((DATA / "sft.jsonl").read_text().splitlines(), (DATA / "repair_sft.jsonl").read_text().splitlines())
    src = work / "sft_repair.jsonl"
    src.write_text("\n".join(lines) + "\n")
    print(f"[multiturn] SFT policy: {steps} steps on {len(lines)} rows (sft.jsonl + repair_sft.jsonl)", flush=True)
    run([PY, "jobs/sft.py", "--config", str(SFT_CONFIG), "--set", f"run.storage_path={work}/runs", "--set", "run.name=policy",
         "--set", f"data.source={src}", "--set", f"train.steps={steps}", "--set", f"checkpoint.every_steps={steps}",
         "--set", "eval.every_steps=0"], work / "policy.log")
    return last_checkpoint(work / "runs/policy")


def grpo(work: Path, name: str, policy: Path, turns: int, steps: int, a: argparse.Namespace,
         every_step_checkpoint: bool = False, eval_every: int = 0, shape: Optional[Sequence[int]] = None) -> Dict[str, Any]:
    """One GRPO run from `policy`; its step records, eval records and wall seconds. `shape`:
    (prompts per step, group size) instead of --prompts, --group (the evaluation job's one step)."""
    prompts, group = shape or (a.prompts, a.group)
    ckpt = ["--set", "checkpoint.every_steps=1", "--set", f"checkpoint.keep_last={steps + 1}"] if every_step_checkpoint \
        else ["--set", f"checkpoint.every_steps={steps}"]
    t = run([PY, "jobs/grpo.py", "--config", str(GRPO_CONFIG), "--set", f"run.storage_path={work}/runs",
             "--set", f"run.name={name}", "--set", f"model.init_from={policy}", "--set", "model.init_sft_config=",
             "--set", f"train.steps={steps}", "--set", f"rl.turns={turns}", "--set", "rl.feedback=details",
             "--set", f"rl.feedback_max_tokens={a.feedback_max_tokens}", "--set", f"rl.max_new_tokens={a.max_new_tokens}",
             "--set", f"rl.prompts_per_step={prompts}", "--set", f"rl.group_size={group}", "--set", f"train.lr={a.lr}",
             "--set", f"rl.micro_batch_size={max(1, prompts * group // 2)}",
             "--set", "rl.eval_samples=1", "--set", "rl.eval_k=[1]", "--set", f"rl.eval_every={eval_every}", *ckpt],
            work / f"{name}.log")
    rd = work / "runs" / name
    recs = records(rd / "metrics.jsonl")
    steps_ = sorted((r for r in recs if "step_s" in r), key=lambda r: r["step"])
    evals = {r["step"]: r for r in recs if any(k.startswith(("heldout_", "initial_heldout_")) for k in r)}
    return {"dir": rd, "wall_s": t["wall_s"], "steps": steps_, "evals": evals}


def curve(rec: Dict[str, Any], prefix: str = "") -> Dict[str, Optional[float]]:
    """pass@1 by turn t (t = 1..TURNS) from an eval record, or from its `initial_` copy."""
    out = {f"turn_{t}": rec.get(f"{prefix}heldout_pass_at_turn_{t}") for t in range(1, TURNS + 1)}
    out["fixed_2_3"] = fixed_share(out["turn_1"], out[f"turn_{TURNS}"])
    out["tasks"] = rec.get(f"{prefix}heldout_problems")
    return out


def window(steps: List[Dict[str, Any]], key: str, n: int = 5) -> List[Optional[float]]:
    """Mean of `key` over the first and the last n steps."""
    def mean(rs):
        xs = [r[key] for r in rs if r.get(key) is not None]
        return statistics.mean(xs) if xs else None
    return [mean(steps[:n]), mean(steps[-n:])]


def fmt(x: Optional[float], spec: str = ".3f") -> str:
    return "n/a" if x is None else format(x, spec)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--policy", default="", help="an SFT checkpoint <run>/step_N (default: train one here)")
    ap.add_argument("--sft-steps", type=int, default=400)
    ap.add_argument("--steps", type=int, default=24, help="3-turn GRPO steps (sets the token budget)")
    ap.add_argument("--max-single-steps", type=int, default=0, help="single-turn GRPO steps at most (default 3 x --steps)")
    ap.add_argument("--prompts", type=int, default=8, help="rl.prompts_per_step (both runs)")
    ap.add_argument("--group", type=int, default=4, help="rl.group_size (both runs)")
    ap.add_argument("--lr", type=float, default=3e-4)
    ap.add_argument("--max-new-tokens", type=int, default=96, help="per answer (turn)")
    ap.add_argument("--feedback-max-tokens", type=int, default=64)
    ap.add_argument("--smoke", action="store_true", help="tiny runs: the plumbing, not the figures")
    ap.add_argument("--out", default=str(REPO / "bench/results/multiturn_grpo.json"))
    a = ap.parse_args(argv)
    if a.smoke:
        a.sft_steps, a.steps, a.prompts, a.group = 4, 2, 2, 2
    max_single = a.max_single_steps or 3 * a.steps
    work = Path(tempfile.mkdtemp(prefix="multiturn-grpo-"))
    t_start = time.time()
    try:
        policy = Path(a.policy).resolve() if a.policy else sft_policy(work, a.sft_steps)
        print(f"[multiturn] 3-turn GRPO: {a.steps} steps from {policy.name}", flush=True)
        multi = grpo(work, "turns3", policy, TURNS, a.steps, a, eval_every=a.steps)
        budget = sum(int(r["tokens"]) for r in multi["steps"])
        print(f"[multiturn] single-turn GRPO: up to {max_single} steps, checkpoints every step "
              f"(budget {budget} policy tokens)", flush=True)
        single = grpo(work, "turns1", policy, 1, max_single, a, every_step_checkpoint=True)
        cum, total = {}, 0
        for r in single["steps"]:
            total += int(r["tokens"])
            cum[int(r["step"])] = total
        pick = closest_step(cum, budget)
        ck = single["dir"] / f"step_{pick:08d}"
        if not ck.is_dir():
            raise RuntimeError(f"no checkpoint {ck}")
        print(f"[multiturn] single-turn step {pick}: {cum[pick]} tokens; its held-out episodes with {TURNS} turns", flush=True)
        ev = grpo(work, "eval_turns1", ck, TURNS, 1, a, eval_every=1, shape=(2, 2))  # its one step is not used
        first_eval = multi["evals"].get(1, {})
        before = curve(first_eval, "initial_")
        after_multi = curve(multi["evals"].get(a.steps, {}))
        after_single = curve(ev["evals"].get(1, {}), "initial_")
        single_steps = [r for r in single["steps"] if int(r["step"]) <= pick]
        res = {
            "before": {**before, "policy": str(policy.name)},
            "single_turn": {**after_single, "grpo_steps": pick, "policy_tokens": cum[pick], "wall_s": single["wall_s"],
                            "train_pass_rate_first_last5": window(single_steps, "pass_rate"),
                            "train_reward_first_last5": window(single_steps, "reward_mean")},
            "three_turn": {**after_multi, "grpo_steps": a.steps, "policy_tokens": budget, "wall_s": multi["wall_s"],
                           "train_pass_at_turn_1_first_last5": window(multi["steps"], "pass_at_turn_1"),
                           f"train_pass_at_turn_{TURNS}_first_last5": window(multi["steps"], f"pass_at_turn_{TURNS}"),
                           "train_fixed_by_feedback_first_last5": window(multi["steps"], "fixed_by_feedback_rate"),
                           "train_turns_mean_first_last5": window(multi["steps"], "turns_mean")},
        }
    finally:
        shutil.rmtree(work, ignore_errors=True)
    base = res["single_turn"][f"turn_{TURNS}"]
    rows = [["policy", "GRPO steps", "policy tokens", "pass@1 turn 1", "turn 2", "turn 3", "fixed at 2-3",
             "turn-3 ratio"]]
    for label, k in (("SFT (before)", "before"), ("single-turn GRPO", "single_turn"), (f"{TURNS}-turn GRPO", "three_turn")):
        r = res[k]
        rows.append([label, str(r.get("grpo_steps", 0)), str(r.get("policy_tokens", 0)), fmt(r["turn_1"]), fmt(r["turn_2"]),
                     fmt(r["turn_3"]), fmt(r["fixed_2_3"]), fmt(r["turn_3"] / base) if base and r["turn_3"] is not None else "n/a"])
    w = [max(len(x[i]) for x in rows) for i in range(len(rows[0]))]
    for x in rows:
        print("  ".join(c.ljust(n) for c, n in zip(x, w)))
    tok_ratio = res["three_turn"]["policy_tokens"] / max(res["single_turn"]["policy_tokens"], 1)
    print(f"held-out: {res['before']['tasks']} tasks, one greedy {TURNS}-turn episode each (feedback: details); "
          f"policy tokens 3-turn / single-turn = {tok_ratio:.3f}; turn-3 ratio = over single-turn GRPO's")
    m = res["three_turn"]
    print(f"3-turn training, mean of first / last 5 steps: pass@turn 1 {fmt(m['train_pass_at_turn_1_first_last5'][0])} -> "
          f"{fmt(m['train_pass_at_turn_1_first_last5'][1])}, pass@turn {TURNS} "
          f"{fmt(m[f'train_pass_at_turn_{TURNS}_first_last5'][0])} -> {fmt(m[f'train_pass_at_turn_{TURNS}_first_last5'][1])}, "
          f"fixed by feedback {fmt(m['train_fixed_by_feedback_first_last5'][0])} -> {fmt(m['train_fixed_by_feedback_first_last5'][1])}")
    s = res["single_turn"]
    print(f"single-turn training, pass rate first / last 5 steps: {fmt(s['train_pass_rate_first_last5'][0])} -> "
          f"{fmt(s['train_pass_rate_first_last5'][1])}")
    out = {"smoke": a.smoke, "args": {k: v for k, v in vars(a).items() if k != "out"}, "max_single_steps": max_single,
           "token_ratio_3turn_over_single": tok_ratio, "results": res, "total_wall_s": time.time() - t_start,
           "context": {"cpus": os.cpu_count(), "loadavg": os.getloadavg(), "date": time.strftime("%Y-%m-%d")}}
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    Path(a.out).write_text(json.dumps(out, indent=1))
    print(f"[multiturn] wrote {a.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
