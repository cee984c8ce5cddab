"""Start-up of the default job: from the command to its first training step.

Runs `jobs/pretrain.py` with the embedded default config, as a user does, only with its run in
a scratch directory (`run.storage_path`) and `train.until_step=2` (the first step is then the
default job's first step: no final checkpoint falls into it). Two cases, alternating:

- **cold**: a new run directory (the tokenizer is trained, every shard is tokenized);
- **warm**: a new run directory holding the cold run's shard cache and tokenizer (a rerun whose
  data is built; no checkpoint, so training starts at step 0).

Per run, from the command's start (this script's `Popen`; the job's own `summary.json` counts
from the process's start, a few ms later): `first_step_s` = the first step record's `time`,
`startup_s` = that minus its `step_s`; `cpu_s` = CPU-seconds of every process of the job (the
driver and all its descendants: Ray's daemons and workers) until the first step record appears
(sampled every 0.5 s from /proc); `processes` = how many there were. Medians over `--reps`.
With `--repo` another checkout runs the same way (e.g. the commit before, for a before/after),
alternating with this one.

  python bench/startup.py                      # 3 cold + 3 warm runs of this checkout
  python bench/startup.py --repo /tmp/before   # and of another checkout, alternating
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from typing import Dict, List

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def tree_cpu(root: int) -> Dict[int, tuple]:
    """{pid: (CPU-seconds, command)} of `root` and its descendants, from /proc."""
    rows, hz = {}, os.sysconf("SC_CLK_TCK")
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open(f"/proc/{d}/stat") as f:
                st = f.read()
            with open(f"/proc/{d}/cmdline") as f:
                cmd = f.read().replace("\0", " ").strip()
        except OSError:
            continue
        rest = st[st.rindex(")") + 2:].split()
        rows[int(d)] = (int(rest[1]), (int(rest[11]) + int(rest[12])) / hz, cmd)
    keep, frontier = {}, {root}
    if root in rows:
        keep[root] = rows[root][1:]
    while frontier:
        frontier = {pid for pid, (pp, _, _) in rows.items() if pp in frontier and pid not in keep}
        keep.update({pid: rows[pid][1:] for pid in frontier})
    return keep


def run_once(repo: str, storage: str, warm_from: str = "") -> dict:
    run = os.path.join(storage, "tiny-demo")
    shutil.rmtree(storage, ignore_errors=True)
    os.makedirs(run)
    if warm_from:
        shutil.copytree(os.path.join(warm_from, "cache"), os.path.join(run, "cache"))
        shutil.copy(os.path.join(warm_from, "tokenizer.json"), run)
    cmd = [sys.executable, "jobs/pretrain.py", "--set", f"run.storage_path={storage}", "--set", "train.until_step=2"]
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    t0 = time.time()
    p = subprocess.Popen(cmd, cwd=repo, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    seen: Dict[int, tuple] = {}
    metrics = os.path.join(run, "metrics.jsonl")

    def sample() -> None:
        while p.poll() is None:
            first = os.path.exists(metrics) and os.path.getsize(metrics) > 0
            seen.update(tree_cpu(p.pid))
            if first:
                return
            time.sleep(0.5)

    th = threading.Thread(target=sample, daemon=True)
    th.start()
    console = p.communicate()[0]
    th.join()
    if p.returncode != 0:
        raise RuntimeError(f"{repo}: exit {p.returncode}\n{console[-3000:]}")
    with open(metrics) as f:
        r1 = json.loads(f.readline())
    return {"first_step_s": r1["time"] - t0, "startup_s": r1["time"] - r1["step_s"] - t0, "step1_s": r1["step_s"],
            "cpu_s": sum(c for c, _ in seen.values()), "processes": len(seen),
            "cpu_by_process": sorted(((round(c, 2), a[:80]) for c, a in seen.values()), reverse=True),
            "console": [ln for ln in console.splitlines() if "waiting for" in ln or " ray: " in ln or "done in" in ln],
            "load": os.getloadavg()[0]}


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--repo", default="", help="another checkout, run alternating with this one")
    ap.add_argument("--out", default=os.path.join(REPO, "bench", "results", "startup.json"))
    a = ap.parse_args(argv)
    repos = {"this": REPO, **({"other": os.path.abspath(a.repo)} if a.repo else {})}
    scratch = tempfile.mkdtemp(prefix="startup-")
    runs: Dict[str, List[dict]] = {f"{k} {case}": [] for k in repos for case in ("cold", "warm")}
    try:
        for rep in range(a.reps):
            for name, repo in repos.items():
                cold = run_once(repo, os.path.join(scratch, f"{name}-cold"))
                runs[f"{name} cold"].append(cold)
                warm = run_once(repo, os.path.join(scratch, f"{name}-warm"), os.path.join(scratch, f"{name}-cold", "tiny-demo"))
                runs[f"{name} warm"].append(warm)
                for case, r in (("cold", cold), ("warm", warm)):
                    print(f"[{rep + 1}/{a.reps}] {name} {case}: first step done at {r['first_step_s']:.1f} s "
                          f"(start-up {r['startup_s']:.1f} s), {r['cpu_s']:.1f} CPU-s in {r['processes']} processes, "
                          f"load {r['load']:.1f}", flush=True)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    med = {k: {f: round(statistics.median(r[f] for r in rs), 2) for f in ("first_step_s", "startup_s", "step1_s", "cpu_s", "processes")}
           for k, rs in runs.items() if rs}
    for k, m in med.items():
        print(f"{k}: median first step done at {m['first_step_s']} s, start-up {m['startup_s']} s, "
              f"{m['cpu_s']} CPU-s in {m['processes']} processes")
    os.makedirs(os.path.dirname(a.out), exist_ok=True)
    with open(a.out, "w") as f:
        json.dump({"date": time.strftime("%Y-%m-%d"), "repos": repos, "medians": med, "runs": runs}, f, indent=1)
    print(f"written {a.out}")


if __name__ == "__main__":
    main()
