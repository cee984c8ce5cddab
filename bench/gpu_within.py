"""`bench/gpu_check.py --within MINUTES`: the GPU check as a plan for a short window.

GPU time comes in short windows (15 minutes, start-up included) and can close mid-run. The plan
runs first what has never been measured on a GPU, each part writing its result file the moment
it finishes (`<out stem>-<part>.json`, and the whole JSON rewritten after every part):

  grpo           SFT on python-tasks for a few steps, then GRPO on python-tasks from it for a few
                 steps at 1 worker: rollouts on the GPU, rewards in the sandboxed CPU pool
  throughput_1b  the 1b model at one shape (seq 4096, global batch 8, micro-batch 2, compiled,
                 vocabulary 128256) through Ray Train, beside the HF transformers peer on the same
                 shape: tokens/s, MFU and the ratio ours / peer
  generation_1b  1b generation against HF `generate()` (bench/generate_throughput.py, batch 16)
  checkpoint_1b  the asynchronous save's stall at 1b, from throughput_1b's run (no new run)
  slowdown       why steps ran slower after the first held-out evaluation (88-91k -> 53-57k tok/s
                 on the H200, bench/results/gpu-nvidia-h200-2026-11-28.md #5): one pretraining
                 run per suspect, steps after step `mid` against steps before it. A: evaluation
                 and a save at `mid` (what was seen); B: the save only; C: the evaluation only;
                 D: as A with torch.compile off. The verdict names the suspect whose removal
                 removes the slowdown (see `verdict`)
  tests, jobs, generation, memory   the rest of the check, as time allows

Before each part the plan compares the time left with the part's estimate (ESTIMATE_S, seconds
on one H100; SMOKE_S on the 2-core CPU with --smoke) and skips what does not fit, saying so in
the result; every command it starts gets the time left as its timeout, so `--within 9` ends
within 9 minutes whatever a part does. With --smoke the same parts run at toy sizes on CPU
(CI: tests/test_bench_smoke.py).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from typing import Any, Callable, Dict, List, Optional

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)

PLAN = ("grpo", "throughput_1b", "generation_1b", "checkpoint_1b", "slowdown", "tests", "jobs", "generation", "memory")
# Seconds a part takes (estimates from the H200 check of 2026-11-28 and the H100 grid of
# 2026-11-25: a job's start-up ~30 s, a 1b compile ~60 s), and on CPU at smoke sizes (measured here).
ESTIMATE_S = {"grpo": 150, "throughput_1b": 210, "generation_1b": 90, "checkpoint_1b": 0, "slowdown": 240,
              "tests": 100, "jobs": 420, "generation": 240, "memory": 1}
SMOKE_S = {"grpo": 120, "throughput_1b": 90, "generation_1b": 30, "checkpoint_1b": 0, "slowdown": 150,
           "tests": 30, "jobs": 200, "generation": 30, "memory": 1}
MARGIN_S = 10  # left at the end for writing the results
SFT_CONFIG, GRPO_CONFIG = "jobs/configs/sft-python-tasks.yaml", "jobs/configs/grpo-python-tasks.yaml"
THROUGHPUT_1B = ["--preset", "1b", "--seq-len", "4096", "--global-batch", "8", "--micro-batch", "2", "--compile", "on",
                 "--vocab", "128256", "--warmup", "3", "--steps", "6", "--ckpt-every", "5"]
SLOWDOWN = {  # variant -> (what it keeps of the observed run, overrides; {mid} and {end} filled in)
    "A": ("evaluation and save at mid", ["checkpoint.every_steps={mid}", "eval.every_steps={mid}"]),
    "B": ("save at mid, no evaluation", ["checkpoint.every_steps={mid}", "eval.every_steps=0"]),
    "C": ("evaluation at mid, no save before the end", ["checkpoint.every_steps={end}", "eval.every_steps={mid}"]),
    "D": ("as A, torch.compile off", ["checkpoint.every_steps={mid}", "eval.every_steps={mid}", "train.compile=false"]),
}


class Window:
    """The time left in the window; every command's timeout comes from it."""

    def __init__(self, minutes: float) -> None:
        self.t0 = time.time()
        self.end = self.t0 + 60.0 * minutes

    def left(self) -> float:
        return self.end - time.time() - MARGIN_S

    def timeout(self, cap: float = 3600.0) -> float:
        return max(1.0, min(cap, self.left()))


def _run_json(gc, cmd: List[str], path: str, timeout: float) -> Dict[str, Any]:
    """gpu_check's `_json_run` (exit, results, or why there are none), stopped at the window."""
    try:
        return gc._json_run(cmd, path, timeout=int(max(1, timeout)), tail=12)
    except subprocess.TimeoutExpired:
        return {"returncode": -9, "error": f"timed out after {timeout:.0f} s (the window)"}


def part_grpo(gc, smoke: bool, storage: str, w: Window, logs: str) -> Dict[str, Any]:
    """SFT python-tasks (a few steps) -> GRPO python-tasks from it (a few steps), 1 worker."""
    sft_steps = 4 if smoke else 40
    sft = gc.run_job("sft", "jobs/sft.py", storage,
                     [f"train.steps={sft_steps}", f"checkpoint.every_steps={sft_steps}", "eval.every_steps=0",
                      "train.warmup_steps=1"], w.timeout(), logs, config=SFT_CONFIG, run_name="gw-sft")
    if not sft.get("checkpoint"):
        return {"returncode": 1, "error": "the SFT run left no checkpoint", "sft": sft}
    over = (list(gc.SMOKE_JOB_OVERRIDES["grpo"]) if smoke else
            ["train.steps=6", "checkpoint.every_steps=3", "rl.eval_every=0", "rl.prompts_per_step=8"])
    over += [f"model.init_from={sft['checkpoint']}", *gc.sandbox_overrides("grpo")]
    grpo = gc.run_job("grpo", "jobs/grpo.py", storage, over, w.timeout(), logs, config=GRPO_CONFIG, run_name="gw-grpo")
    return {"returncode": grpo["returncode"], "sft": sft, "grpo": grpo}


def part_throughput_1b(gc, smoke: bool, storage: str, w: Window, logs: str) -> Dict[str, Any]:
    """Ours at one shape through Ray Train, then the HF peer at the same shape."""
    path = os.path.join(storage, "tp1b.json")
    args = ["--smoke", "--ac", "none"] if smoke else THROUGHPUT_1B
    ours = _run_json(gc, [sys.executable, os.path.join(HERE, "train_throughput.py"), *args, "--out", path], path, w.timeout())
    rows = (ours.get("results") or {}).get("results") or []
    row = rows[0] if rows else {}
    targs = (ours.get("results") or {}).get("args") or {}
    vocab = 512 if smoke else 128256
    peer_cmd = [sys.executable, os.path.join(HERE, "hf_peer.py"), "--preset", str(targs.get("preset", "1b")),
                "--seq-len", str(targs.get("seq_len", 4096)), "--global-batch", str(targs.get("global_batch", 8)),
                "--micro-batch", "2", "--compile", "off" if smoke else "on", "--vocab", str(vocab),
                "--warmup", "2" if smoke else "3", "--steps", "2" if smoke else "6"]
    peer: Dict[str, Any]
    try:
        p = subprocess.run(peer_cmd, capture_output=True, text=True, cwd=REPO, timeout=w.timeout())
        line = p.stdout.strip().splitlines()[-1:] if p.returncode == 0 else []
        peer = json.loads(line[0]) if line else {"error": (p.stderr.strip().splitlines() or [""])[-1]}
    except subprocess.TimeoutExpired:
        peer = {"error": "timed out (the window)"}
    ratio = (row["tokens_per_s"] / peer["tokens_per_s"]) if row.get("tokens_per_s") and peer.get("tokens_per_s") else None
    ok = ours["returncode"] == 0 and "error" not in row and "error" not in peer
    return {"returncode": 0 if ok else 1, "ours": row, "peer": peer, "ratio_vs_peer": ratio,
            "formula": "ratio = ours tokens/s / HF peer tokens/s (same shape, batch and steps)",
            **({"error": ours.get("error") or row.get("error") or peer.get("error")} if not ok else {})}


def part_generation_1b(gc, smoke: bool, storage: str, w: Window, logs: str) -> Dict[str, Any]:
    path = os.path.join(storage, "gen1b.json")
    args = ["--smoke"] if smoke else ["--presets", "1b", "--batch", "16", "--new-tokens", "64", "--repeats", "1"]
    return _run_json(gc, [sys.executable, os.path.join(HERE, "generate_throughput.py"), *args, "--out", path], path,
                     w.timeout())


def checkpoint_from(throughput: Optional[Dict[str, Any]]) -> Dict[str, Any]:
    """The asynchronous save's stall and background write of the throughput_1b run."""
    row = (throughput or {}).get("ours") or {}
    ck = row.get("checkpoints") or []
    if not ck:
        return {"returncode": 1, "error": "throughput_1b measured no save"}
    mid = [c for c in ck if not c.get("final")]
    return {"returncode": 0, "saves": ck, "step_s": row.get("step_s"),
            "async_stall_s": mid[0]["stall_s"] if mid else None,
            "formula": "stall_s = the saving step's wait on the save (staging); write_s = its background write"}


def _rate(recs: List[Dict[str, Any]], lo: int, hi: int) -> Optional[float]:
    """tokens/s over steps lo..hi, without steps that evaluated or saved (tokens / step_s summed)."""
    rs = [r for r in recs if lo <= r["step"] <= hi and "checkpoint_stall_s" not in r and not r.get("eval_s")]
    s = sum(r["step_s"] for r in rs)
    return sum(r["tokens"] for r in rs) / s if rs and s > 0 else None


def slowdown_ratio(recs: List[Dict[str, Any]], mid: int, end: int) -> Dict[str, Any]:
    """Steps mid+3..end-1 against steps 3..mid-1 (the first two warm up; the one after mid may
    register the save): after / before, 1.0 = no slowdown."""
    before, after = _rate(recs, 3, mid - 1), _rate(recs, mid + 3, end - 1)
    return {"before_tok_s": before, "after_tok_s": after,
            "after_over_before": (after / before) if before and after else None}


def verdict(ratios: Dict[str, Optional[float]], slow: float = 0.9) -> str:
    """Which suspect the runs point at: a variant is slow when after/before < `slow`. A slow and
    B (no evaluation) not: the evaluation; then D (no compile) not slow: its recompiles. A slow and
    C (no save) not: the save. A not slow: the slowdown did not reproduce."""
    def is_slow(k: str) -> Optional[bool]:
        v = ratios.get(k)
        return None if v is None else v < slow

    a, b, c, d = (is_slow(k) for k in "ABCD")
    if a is None:
        return "not measured (run A failed or was cut)"
    if not a:
        return "no slowdown after step mid in run A (not reproduced)"
    if b is False and c is not False:
        return "the evaluation (" + ("its torch.compile recompiles: D is not slow" if d is False else
                                     "not compile: D is slow too" if d else "D not measured") + ")"
    if c is False and b is not False:
        return "the save at mid (C, without it, is not slow)"
    if b and c:
        return "neither alone: B and C are both slow (something else after step mid)"
    return "inconclusive"


def part_slowdown(gc, smoke: bool, storage: str, w: Window, logs: str) -> Dict[str, Any]:
    from elastic.records import METRICS, read_records

    mid, end = (4, 9) if smoke else (8, 16)
    out: Dict[str, Any] = {"mid": mid, "steps": end,
                           "formula": "after_over_before = tokens/s(steps mid+3..end-1) / tokens/s(steps 3..mid-1), "
                                      "steps that evaluated or saved left out"}
    ratios: Dict[str, Optional[float]] = {}
    for k, (what, over) in SLOWDOWN.items():
        if w.left() < (25 if smoke else 45):
            out[k] = {"what": what, "skipped": f"{w.left():.0f} s left"}
            continue
        o = [x.format(mid=mid, end=end) for x in over] + [f"train.steps={end}", "train.warmup_steps=1"]
        if smoke:
            o += ["eval.samples=4"]
        r = gc.run_job("pretrain", "jobs/pretrain.py", storage, o, w.timeout(), logs, run_name=f"gw-slow-{k}",
                       keep_records=True)
        recs = [x for x in r.pop("records", []) if "step" in x]
        res = {"what": what, "overrides": o, "returncode": r["returncode"], **slowdown_ratio(recs, mid, end)}
        ratios[k] = res["after_over_before"]
        out[k] = res
    out["verdict"] = verdict(ratios)
    out["returncode"] = 0 if out.get("A", {}).get("returncode") == 0 else 1
    return out


def run_plan(gc, a, env: Dict[str, Any], out: str, write: Callable[[Dict[str, Any]], None]) -> Dict[str, Any]:
    """The plan in order; `write(res)` after every part (the window can close at any moment)."""
    w = Window(a.within)
    est = SMOKE_S if a.smoke else ESTIMATE_S
    res: Dict[str, Any] = {"within_min": a.within, "plan": list(PLAN), "smoke": a.smoke, "environment": env,
                           "estimates_s": est, "parts": []}
    storage = tempfile.mkdtemp(prefix="elastic-gpuwithin-")
    stem = os.path.splitext(out)[0]
    runners = {"grpo": part_grpo, "throughput_1b": part_throughput_1b, "generation_1b": part_generation_1b}
    try:
        for part in PLAN:
            left = w.left()
            if left < est[part]:
                res[part] = {"skipped": f"{left:.0f} s left in the window, the part takes ~{est[part]} s"}
                print(f"[gpu_check] {part}: skipped ({res[part]['skipped']})", flush=True)
                write(res)
                continue
            print(f"[gpu_check] {part} ... ({left:.0f} s left)", flush=True)
            t0 = time.time()
            try:
                if part in runners:
                    r = runners[part](gc, a.smoke, storage, w, a.logs)
                elif part == "checkpoint_1b":
                    r = checkpoint_from(res.get("throughput_1b"))
                elif part == "slowdown":
                    r = part_slowdown(gc, a.smoke, storage, w, a.logs)
                elif part == "tests":
                    r = gc.part_tests(a.smoke, timeout=w.timeout())
                elif part == "jobs":
                    r = gc.part_jobs(a.smoke, storage, w.timeout(), 16 if not a.smoke else 0, a.logs,
                                     ["pretrain", "sft", "dpo"], deadline=w.end - MARGIN_S)
                elif part == "generation":
                    r = gc.part_generation(a.smoke, storage, "125m", "1,16,64", timeout=w.timeout())
                else:
                    r = gc.part_memory(env.get("device_gib"))
            except Exception as e:  # a part's failure is its result; the plan goes on
                r = {"returncode": 1, "error": f"{type(e).__name__}: {str(e).splitlines()[0][:300] if str(e) else ''}"}
            r = r if isinstance(r, dict) else {"result": r}
            r["wall_s"] = round(time.time() - t0, 1)
            res[part] = r
            res["parts"].append(part)
            with open(f"{stem}-{part}.json", "w") as f:
                json.dump(r, f, indent=2, default=str)
            write(res)
            print(f"[gpu_check] {part} done in {r['wall_s']:.0f} s -> {stem}-{part}.json", flush=True)
    finally:
        import shutil

        shutil.rmtree(storage, ignore_errors=True)
    res["wall_s"] = round(time.time() - w.t0, 1)
    return res
