"""Does GRPO learn? The graded-python recipe, 3 seeds: held-out pass@1 before and after, with its
standard error, against the wall clock (issue 57, "a recipe where GRPO clearly learns").

    .venv/bin/python bench/grpo_learns.py [--policy <run>/step_N] [--seeds 0,1,2] [--steps 200]
    .venv/bin/python bench/grpo_learns.py --collect runs/grpo-a runs/grpo-b ...   # runs made already

What runs: the SFT warm start (jobs/configs/sft-graded-python.yaml: the 800-step schedule stopped
at step 350; skipped with --policy), then for each seed `jobs/grpo.py --config
jobs/configs/grpo-graded-python.yaml --set model.init_from=<policy> --set run.seed=<seed>` (2 CPU
workers, the python_tests verifier in its sandbox on the reward pool). Each run's own held-out
evaluation gives the figures: 256 held-out tasks (datasets/graded-tasks/python/heldout.jsonl),
4 samples per task at T=1.0, at step 0 (the starting policy) and every 50 steps.

Formulas: pass@1 = mean over tasks of (passing samples / 4); its standard error = sd over tasks
of the per-task share / sqrt(256); a seed's lift = pass@1(last step) - pass@1(step 0), and its z
= lift / sqrt(se0^2 + se1^2) (the two evaluations use different samples; the tasks are the same,
so this z is conservative). Wall seconds are the job's, from its start (start-up included, the
in-run evaluations included). Writes bench/results/grpo_learns.json and grpo_learns.png (pass@1
vs wall seconds per seed, with a one-standard-error band) and deletes the runs it made.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Dict, List

REPO = Path(__file__).resolve().parents[1]
PY = sys.executable
SFT_CONFIG = "jobs/configs/sft-graded-python.yaml"
GRPO_CONFIG = "jobs/configs/grpo-graded-python.yaml"
RESULTS = REPO / "bench" / "results"


def read_jsonl(path: Path) -> List[Dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def collect(run: Path) -> Dict[str, Any]:
    """One run's curve from its metrics.jsonl and summary.json."""
    m = read_jsonl(run / "metrics.jsonl")
    s = json.loads((run / "summary.json").read_text())
    first = next(r for r in m if r["step"] == 1)
    t0 = first["time"] - s["first_step_s"]  # the job's start
    init = next(r for r in m if "initial_heldout_pass_at_1" in r)
    curve = [{"step": 0, "wall_s": round(s["startup_s"], 1), "pass_at_1": init["initial_heldout_pass_at_1"],
              "se": init["initial_heldout_se_pass_at_1"], "pass_at_4": init.get("initial_heldout_pass_at_4")}]
    curve += [{"step": r["step"], "wall_s": round(r["time"] - t0, 1), "pass_at_1": r["heldout_pass_at_1"],
               "se": r["heldout_se_pass_at_1"], "pass_at_4": r.get("heldout_pass_at_4")}
              for r in m if "heldout_pass_at_1" in r]
    cfg = json.loads((run / "config.json").read_text()) if (run / "config.json").exists() else {}
    lift = curve[-1]["pass_at_1"] - curve[0]["pass_at_1"]
    se = (curve[0]["se"] ** 2 + curve[-1]["se"] ** 2) ** 0.5
    steps = [r for r in m if "zero_var_frac" in r]

    def phase(a: int, b: int, key: str) -> float:
        vals = [r[key] for r in steps if a < r["step"] <= b and key in r]
        return round(sum(vals) / len(vals), 4) if vals else float("nan")

    last = steps[-1]["step"]
    phases = [(0, 20), (20, 50), (50, 100), (100, last)]
    return {"run": str(run), "seed": cfg.get("run", {}).get("seed"), "job_s": round(s["job_s"], 1),
            "startup_s": round(s["startup_s"], 1), "curve": curve, "lift": round(lift, 4), "lift_se": round(se, 4),
            "z": round(lift / se, 2) if se > 0 else None,
            "by_phase": {f"{a}-{b}": {k: phase(a, b, k) for k in ("pass_rate", "zero_var_frac", "entropy", "step_s")}
                         for a, b in phases}}


def plot(rows: List[Dict[str, Any]], path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.4, 4.0))
    for r in rows:
        xs = [c["wall_s"] for c in r["curve"]]
        ys = [c["pass_at_1"] for c in r["curve"]]
        se = [c["se"] for c in r["curve"]]
        line, = ax.plot(xs, ys, marker="o", label=f"seed {r['seed']}")
        ax.fill_between(xs, [y - e for y, e in zip(ys, se)], [y + e for y, e in zip(ys, se)], alpha=0.2,
                        color=line.get_color())
    ax.set_xlabel("wall seconds from the GRPO command (start-up and evaluations included)")
    ax.set_ylabel("held-out pass@1 (256 tasks, 4 samples, T=1)")
    ax.set_title("GRPO on graded-python from its SFT start (band: 1 s.e.)")
    ax.set_ylim(0, 1)
    ax.grid(alpha=0.3)
    ax.legend()
    fig.subplots_adjust(left=0.12, right=0.97, top=0.92, bottom=0.14)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--policy", help="the SFT checkpoint (default: train jobs/configs/sft-graded-python.yaml here)")
    ap.add_argument("--seeds", default="0,1,2")
    ap.add_argument("--steps", type=int, default=0, help="GRPO steps (default: the config's)")
    ap.add_argument("--collect", nargs="*", help="read these GRPO run directories instead of running")
    ap.add_argument("--out", default=str(RESULTS / "grpo_learns.json"))
    a = ap.parse_args(argv)
    commands: List[str] = []
    scratch = None
    if a.collect:
        runs = [Path(p) for p in a.collect]
    else:
        scratch = Path(tempfile.mkdtemp(prefix="grpo_learns_"))
        policy = a.policy
        if not policy:
            cmd = [PY, "jobs/sft.py", "--config", SFT_CONFIG, "--set", f"run.storage_path={scratch}"]
            commands.append(" ".join(cmd[1:]))
            subprocess.run(cmd, cwd=REPO, check=True)
            policy = str(sorted((scratch / "sft-graded-python").glob("step_*"))[-1])  # train.until_step
        runs = []
        for seed in [int(x) for x in a.seeds.split(",")]:
            cmd = [PY, "jobs/grpo.py", "--config", GRPO_CONFIG, "--set", f"model.init_from={policy}",
                   "--set", f"run.seed={seed}", "--set", f"run.name=grpo-seed{seed}", "--set", f"run.storage_path={scratch}"]
            if a.steps:
                cmd += ["--set", f"train.steps={a.steps}", "--set", f"rl.eval_every={a.steps}"]
            commands.append(" ".join(cmd[1:]))
            t = time.time()
            subprocess.run(cmd, cwd=REPO, check=True)
            print(f"seed {seed}: {time.time() - t:.0f} s wall", flush=True)
            runs.append(scratch / f"grpo-seed{seed}")
    rows = [collect(r) for r in runs]
    lifts = [r["lift"] for r in rows]
    out = {"what": "held-out pass@1 of GRPO (jobs/configs/grpo-graded-python.yaml) from its SFT start, per seed",
           "formulas": {"pass_at_1": "mean over 256 held-out tasks of passing/4 samples at T=1.0",
                        "se": "sd over tasks of the per-task share / sqrt(tasks)",
                        "lift": "pass@1(last step) - pass@1(step 0)", "z": "lift / sqrt(se0^2 + se1^2)"},
           "machine": f"{os.cpu_count()} CPUs", "commands": commands or [f"(collected) {r}" for r in a.collect],
           "seeds": rows, "mean_lift": round(sum(lifts) / len(lifts), 4),
           "every_seed_above_2_se": all((r["z"] or 0) > 2 for r in rows),
           "max_job_s": max(r["job_s"] for r in rows)}
    Path(a.out).write_text(json.dumps(out, indent=1) + "\n")
    plot(rows, Path(a.out).with_suffix(".png"))
    print(f"{'seed':>4} {'before':>14} {'after':>14} {'lift':>7} {'z':>6} {'job s':>6}")
    for r in rows:
        c0, c1 = r["curve"][0], r["curve"][-1]
        print(f"{r['seed']!s:>4} {c0['pass_at_1']:.3f} ± {c0['se']:.3f} {c1['pass_at_1']:.3f} ± {c1['se']:.3f} "
              f"{r['lift']:+.3f} {r['z']!s:>6} {r['job_s']:>6.0f}")
    print(f"mean lift {out['mean_lift']:+.3f}; every seed > 2 s.e.: {out['every_seed_above_2_se']}; "
          f"-> {a.out} and {Path(a.out).with_suffix('.png')}")
    if scratch is not None:
        shutil.rmtree(scratch, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
