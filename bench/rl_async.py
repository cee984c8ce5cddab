"""Colocated vs disaggregated GRPO at the same total CPUs (issue 41): steps per minute, generated
tokens per second and the reward curve over the same steps, alternating the placements.

    .venv/bin/python bench/rl_async.py --policy <sft-python-tasks run>/step_N [--rounds 2 --steps 12]

Layouts (GRPO on datasets/python-tasks, jobs/configs/grpo-python-tasks.yaml, the same policy, the
same prompts and seeds; the reward pool's 2 actors on both sides):

* colocated: 2 Ray Train workers x 1 CPU generate, wait for rewards and train;
* disaggregated (rl.max_staleness 1): 1 Ray Train worker x 1 CPU trains while 1 rollout actor x
  1 CPU generates the next step;
* disaggregated (rl.max_staleness 0), for reference: the same split, no overlap.

The ratio that matters is steps per minute, disaggregated over colocated, from the steady steps
(the first step of each run, start-up, excluded). On a 2-core machine both layouts hold 2 cores
of torch threads, and the reward pool shares them; overlap there can only show as less waiting,
not as more compute. Without --policy a policy is trained here first (SFT, --policy-steps).
Prints a table and writes bench/results/rl_async.json; deletes what it writes under its
scratch directory.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Dict, List

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench.trl_peer import GRPO_CONFIG, PY, last_checkpoint, records, run  # noqa: E402

LAYOUTS = {
    "colocated": ["--set", "rl.rollout.placement=colocated", "--set", "scaling.min_workers=2", "--set", "scaling.max_workers=2"],
    "disagg_k1": ["--set", "rl.rollout.placement=disaggregated", "--set", "rl.max_staleness=1", "--set", "rl.rollout.workers=1",
                  "--set", "scaling.min_workers=1", "--set", "scaling.max_workers=1"],
    "disagg_k0": ["--set", "rl.rollout.placement=disaggregated", "--set", "rl.max_staleness=0", "--set", "rl.rollout.workers=1",
                  "--set", "scaling.min_workers=1", "--set", "scaling.max_workers=1"],
}


def one_run(work: Path, policy: str, layout: str, steps: int, prompts: int, tag: str) -> Dict[str, Any]:
    name = f"{layout}-{tag}"
    t = run([PY, "jobs/grpo.py", "--config", str(GRPO_CONFIG), "--set", f"run.storage_path={work}/runs",
             "--set", f"run.name={name}", "--set", f"model.init_from={policy}", "--set", "model.init_sft_config=",
             "--set", f"train.steps={steps}", "--set", "rl.eval_every=0", "--set", f"checkpoint.every_steps={steps}",
             "--set", f"rl.prompts_per_step={prompts}", "--set", f"rl.micro_batch_size={prompts * 4 // 2}",
             "--set", "rl.rollout.cpus_per_worker=1", "--set", "scaling.cpus_per_worker=1", *LAYOUTS[layout]],
            work / f"{name}.log")
    rd = work / "runs" / name
    recs = sorted((r for r in records(rd / "metrics.jsonl") if "step_s" in r), key=lambda r: r["step"])
    gen: Dict[int, int] = {}
    for r in records(rd / "rollouts.jsonl"):
        gen[r["step"]] = gen.get(r["step"], 0) + int(r["tokens"])
    steady = recs[1:]
    span = steady[-1]["time"] - recs[0]["time"]  # the end of step 1 to the end of the last step
    out = {"job_s": t["wall_s"], "steps_per_min": 60.0 * len(steady) / span,
           "gen_tokens_per_s": sum(gen.get(r["step"], 0) for r in steady) / span,
           "reward_by_step": [r["reward_mean"] for r in recs],
           "rollout_wait_s": statistics.median([r.get("rollout_wait_s", r.get("generate_s", 0.0)) for r in steady]),
           "reward_wait_s": statistics.median([r.get("reward_wait_s", 0.0) for r in steady]),
           "update_s": statistics.median([r.get("update_s", 0.0) for r in steady])}
    idle = [r["rollout_idle_frac"] for r in steady if "rollout_idle_frac" in r]
    if idle:
        out["rollout_idle_frac"] = statistics.median(idle)
    shutil.rmtree(rd, ignore_errors=True)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--policy", default="", help="our SFT checkpoint <run>/step_N (default: train one here)")
    ap.add_argument("--policy-steps", type=int, default=400)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--layouts", default="colocated,disagg_k1,disagg_k0")
    ap.add_argument("--smoke", action="store_true", help="tiny runs: the plumbing, not the figures")
    ap.add_argument("--out", default=str(REPO / "bench/results/rl_async.json"))
    a = ap.parse_args()
    if a.smoke:
        a.rounds, a.steps, a.prompts, a.policy_steps = 1, 3, 2, 4
    work = Path(tempfile.mkdtemp(prefix="rl-async-"))
    try:
        policy = a.policy
        if not policy:
            print(f"[rl_async] training the starting policy ({a.policy_steps} SFT steps)", flush=True)
            run([PY, "jobs/sft.py", "--config", str(REPO / "jobs/configs/sft-python-tasks.yaml"), "--set",
                 f"run.storage_path={work}/runs", "--set", "run.name=policy", "--set", f"train.steps={a.policy_steps}",
                 "--set", f"checkpoint.every_steps={a.policy_steps}", "--set", "eval.every_steps=0"], work / "policy.log")
            policy = str(last_checkpoint(work / "runs/policy"))
        layouts = a.layouts.split(",")
        res: Dict[str, List[Dict[str, Any]]] = {k: [] for k in layouts}
        for i in range(a.rounds):
            order = layouts if i % 2 == 0 else layouts[::-1]  # alternate which side runs first
            for lay in order:
                r = one_run(work, policy, lay, a.steps, a.prompts, str(i))
                res[lay].append(r)
                print(f"[rl_async] round {i} {lay}: {r['steps_per_min']:.1f} steps/min, {r['gen_tokens_per_s']:.0f} gen tok/s",
                      flush=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)

    def med(lay: str, k: str) -> float:
        return statistics.median(r[k] for r in res[lay])

    base = med("colocated", "steps_per_min") if "colocated" in res else None
    rows = [["layout", "steps/min", "ratio", "gen tok/s", "rollout wait s", "reward wait s", "update s", "rollout idle"]]
    for lay in layouts:
        idle = [r["rollout_idle_frac"] for r in res[lay] if "rollout_idle_frac" in r]
        rows.append([lay, f"{med(lay, 'steps_per_min'):.1f}", f"{med(lay, 'steps_per_min') / base:.2f}" if base else "",
                     f"{med(lay, 'gen_tokens_per_s'):.0f}", f"{med(lay, 'rollout_wait_s'):.2f}", f"{med(lay, 'reward_wait_s'):.2f}",
                     f"{med(lay, 'update_s'):.2f}", f"{statistics.median(idle):.2f}" if idle else ""])
    w = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    for r in rows:
        print("  ".join(c.ljust(n) for c, n in zip(r, w)))
    print("ratio = steps/min over colocated's (medians of the rounds); rollout wait: colocated's generate_s")
    for lay in layouts:
        print(f"reward by step, {lay}, round 0: " + " ".join(f"{x:.3f}" for x in res[lay][0]["reward_by_step"]))
    import os

    out = {"smoke": a.smoke, "rounds": a.rounds, "steps": a.steps, "prompts": a.prompts, "layouts": res,
           "context": {"cpus": os.cpu_count(), "loadavg": os.getloadavg(), "date": time.strftime("%Y-%m-%d")}}
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    Path(a.out).write_text(json.dumps(out, indent=1))
    print(f"[rl_async] wrote {a.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
