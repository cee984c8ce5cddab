"""The race: wall-clock time to a held-out pass@1 target, ours against TRL's GRPOTrainer (issue 57).

    .venv/bin/python bench/time_to_quality.py [--policy <sft-graded-python run>/step_00000350]
        [--budget-s 600] [--save-every-s 60] [--steps 400] [--fault] [--seed 0]

Both sides start from the same policy: the graded-python SFT warm start (an 800-step schedule
stopped at step 350, jobs/configs/sft-graded-python.yaml; trained here, off both clocks, unless
`--policy` names it), exported to Hugging Face format with jobs/export_hf.py, which TRL loads.

* **Ours**: `jobs/grpo.py --config jobs/configs/grpo-graded-python.yaml` with the policy as
  `model.init_from`, its in-run evaluation off (`rl.eval_every=0`: the race's evaluator is off the
  clock), a checkpoint every `--save-every-s` seconds (`checkpoint.every_s`) and every one kept;
  `--steps` steps at most, stopped at the budget (the bench sends SIGINT past it).
* **TRL** (`trl==1.16.0`, `transformers==5.25.0`, `accelerate==1.16.0`, `datasets==5.2.0`,
  installed by the bench into their own virtual environment, `.cache/time-to-quality/trl-venv`;
  torch and the rest come from ours through a .pth at the end of its path, so both sides run the
  same torch build): `GRPOTrainer` on the same train tasks (shuffled by its own sampler, seed
  `--seed`), 16 prompts x 8 completions per optimizer step, 96 new tokens, temperature 1.0,
  no KL (`beta=0`), clip 0.2 / 0.28, one update per rollout batch, token-mean loss
  (`loss_type="dapo"`), group-std advantages, AdamW(0.9, 0.95, wd 0.1), lr 3e-4 constant, grad
  clip 1.0, fp32. Its reward function calls our `python_tests` verifier in the bubblewrap
  sandbox (`evaluate_python_batch`, two sandboxes in two threads: ours has 2 reward actors).
  A callback makes the Trainer write a full checkpoint (`checkpoint-N`: model, optimizer, RNG)
  every `--save-every-s` seconds and stops training at the budget.
* **Cores**: the machine's (2 here). Ours: 2 Ray Train workers x 1 torch thread (FSDP2 over
  gloo) + 2 reward actors; TRL: 1 process x 2 torch threads + 2 sandbox threads.
* **The fault** (`--fault`): at `--fault-at-s` (0.4 x the fault-free race's budget) one of our train workers gets SIGKILL (Ray
  Train restarts the group from the last checkpoint by itself); TRL's process gets SIGKILL at the
  same moment and the bench restarts it with `trainer.train(resume_from_checkpoint=True)` (its
  last `checkpoint-N`), as a user would script it. The clock keeps running through both.

**One evaluator, off the clock**, after both runs: every saved policy (ours exported to HF with
`export_checkpoint`, TRL's `checkpoint-N` as it is) is loaded by the same code
(`elastic.model.hf.from_pretrained`), samples 4 completions per task for the 256 held-out tasks
(datasets/graded-tasks/python/heldout.jsonl, disjoint from train) at temperature 1.0, 96 new
tokens, with one fixed seed, and is scored by the sandboxed verifier. The starting policy is
scored once, at 0 s for both.

Formulas:

    pass@1(save)      = mean over the 256 tasks of (passing samples / 4)
    se(save)          = sd over tasks of the per-task share / sqrt(256)
    wall_s(save)      = the save's time (its step's end) - the side's command start
    target            = TRL's best pass@1 over its saves within its budget
    time_to_target    = wall_s of a side's first save with pass@1 >= target (none: not reached)
    ratio             = ours' time_to_target / TRL's                        (< 1: ours faster)
    fault_cost_s      = time_to_target with the fault - without; with --fault the target is the
                        fault-free race's (--baseline, default bench/results/time_to_quality.json)

Writes bench/results/time_to_quality.json (or with --fault: time_to_quality_fault.json) and a PNG
beside it (pass@1 vs wall seconds, one-standard-error bands) and deletes its run directories.
One race of each side takes the budget plus start-up; the evaluation about 30-40 s per save.
"""

from __future__ import annotations

import argparse
import concurrent.futures as cf
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

PY = sys.executable
SFT_CONFIG = "jobs/configs/sft-graded-python.yaml"
GRPO_CONFIG = "jobs/configs/grpo-graded-python.yaml"
TRAIN = REPO / "datasets/graded-tasks/python/train.jsonl"
HELDOUT = REPO / "datasets/graded-tasks/python/heldout.jsonl"
TRL_PINS = ["trl==1.16.0", "transformers==5.25.0", "accelerate==1.16.0", "datasets==5.2.0"]
TRL_ENV = REPO / ".cache/time-to-quality/trl-venv"
# the recipe's shape (grpo-graded-python.yaml), both sides
PROMPTS, GROUP, MAX_NEW, TEMPERATURE, LR = 16, 8, 96, 1.0, 3e-4
TRL_MICRO = 4  # TRL's rows per micro-batch (bench/trl_peer.py's; ours: the config's 16)
EVAL_SAMPLES, EVAL_SEED = 4, 1234
TIME_LIMIT_S = 2.0  # reward.python_time_limit_s of the config
THREADS = 2
# Our variants: the recipe as shipped (colocated: the trainers generate, wait for rewards, then
# train), and the asynchronous rollout fleet (docs/grpo.md "Placements": step s trains on
# completions of policy s-1 while the fleet generates step s+1's, truncated importance sampling).
OURS_SETS = {"ours": [], "ours-async": ["rl.rollout.placement=disaggregated", "rl.rollout.workers=2",
                                        "rl.max_staleness=1"]}


# ----------------------------------------------------------------------------- helpers
def read_jsonl(path: Path) -> List[Dict[str, Any]]:
    """The project's tolerant reader (a missing file: none; a line cut by a kill: skipped)."""
    from elastic.records import read_records

    return read_records(str(path))


def our_saves(rd: Path, t0: float, budget_s: float) -> List[Dict[str, Any]]:
    """Our run's complete checkpoints written within the budget: path, step, wall_s from t0."""
    saves = []
    for d in sorted(rd.glob("step_*")):
        st = d / "train_state.json"
        if d.name.endswith("partial") or not st.exists():
            continue
        s = json.loads(st.read_text())
        if s["time"] - t0 <= budget_s:
            saves.append({"path": str(d), "step": s["step"], "wall_s": s["time"] - t0})
    return saves


def run(cmd: Sequence[str], log: Path, timeout: float = 3600) -> None:
    with open(log, "w") as f:
        p = subprocess.run(list(cmd), stdout=f, stderr=subprocess.STDOUT, cwd=REPO, timeout=timeout,
                           env=dict(os.environ, WANDB_MODE="disabled"))
    if p.returncode:
        tail = "\n".join(log.read_text(errors="replace").splitlines()[-15:])
        raise RuntimeError(f"{' '.join(map(str, cmd))} exited {p.returncode}; last lines of {log}:\n{tail}")


def trl_python(env: Path) -> Path:
    """The pinned TRL environment (made once, then reused): its own copies of TRL and its HF
    libraries, the rest from ours (a .pth at the end of its path)."""
    py = env / "bin/python"
    stamp = env / ".pins"
    if py.exists() and stamp.exists() and stamp.read_text() == " ".join(TRL_PINS):
        return py
    print(f"[race] installing {' '.join(TRL_PINS)} into {env}", flush=True)
    shutil.rmtree(env, ignore_errors=True)
    subprocess.run([PY, "-m", "venv", str(env)], check=True)
    site = subprocess.run([str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          check=True, capture_output=True, text=True).stdout.strip()
    ours = subprocess.run([PY, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          check=True, capture_output=True, text=True).stdout.strip()
    Path(site, "zz_elastic_base.pth").write_text(ours + "\n")
    subprocess.run([str(py), "-m", "pip", "install", "-q", "--no-deps", "--ignore-installed", *TRL_PINS], check=True)
    stamp.write_text(" ".join(TRL_PINS))
    return py


# ----------------------------------------------------------------------------- the policy
def make_policy(work: Path, policy: Optional[str]) -> Dict[str, Any]:
    if policy:
        ckpt = Path(policy).resolve()
        cmd: List[str] = []
    else:
        cmd = [PY, "jobs/sft.py", "--config", SFT_CONFIG, "--set", f"run.storage_path={work}/runs",
               "--set", "run.name=policy", "--set", "eval.every_steps=0"]
        print(f"[race] training the starting policy ({SFT_CONFIG}, off both clocks)", flush=True)
        run(cmd, work / "policy.log")
        ckpt = sorted((work / "runs/policy").glob("step_*"))[-1]
    hf = work / "hf"
    run([PY, "jobs/export_hf.py", "--checkpoint", str(ckpt), "--out", str(hf)], work / "export.log")
    return {"checkpoint": ckpt, "hf": hf, "tokenizer_json": ckpt.parent / "tokenizer.json", "command": cmd}


# ----------------------------------------------------------------------------- our side
def kill_tree(proc: subprocess.Popen, sig: int) -> None:
    try:
        os.killpg(proc.pid, sig)
    except ProcessLookupError:
        pass


def ours(work: Path, pol: Dict[str, Any], a: argparse.Namespace, fault: bool, variant: str = "ours") -> Dict[str, Any]:
    name = variant + ("-fault" if fault else "")
    rd = work / "runs" / name
    cmd = [PY, "jobs/grpo.py", "--config", GRPO_CONFIG, "--set", f"run.storage_path={work}/runs",
           "--set", f"run.name={name}", "--set", f"run.seed={a.seed}", "--set", f"model.init_from={pol['checkpoint']}",
           "--set", "model.init_sft_config=", "--set", "rl.eval_every=0", "--set", f"train.steps={a.steps}",
           "--set", f"checkpoint.every_steps={a.steps}", "--set", f"checkpoint.every_s={a.save_every_s}",
           "--set", "checkpoint.keep_last=1000"] + [x for kv in OURS_SETS[variant] for x in ("--set", kv)]
    log = work / f"{name}.log"
    t0 = time.time()
    with open(log, "w") as f:
        p = subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT, cwd=REPO, start_new_session=True,
                             env=dict(os.environ, WANDB_MODE="disabled"))
    injected: Dict[str, Any] = {}
    stopped_at_budget = False
    while p.poll() is None:
        now = time.time() - t0
        if fault and not injected and now >= a.fault_at_s:
            ev = read_jsonl(rd / "events.jsonl")
            starts = [e for e in ev if e.get("event") == "start"]
            workers = [e for e in ev if e.get("event") == "worker" and starts and e["time"] >= starts[-1]["time"] - 1]
            if workers:
                os.kill(workers[-1]["pid"], signal.SIGKILL)
                injected = {"event": "sigkill_train_worker", "wall_s": time.time() - t0, "pid": workers[-1]["pid"],
                            "rank": workers[-1].get("rank")}
                print(f"[race] ours: SIGKILL train worker {workers[-1]['pid']} at {injected['wall_s']:.0f} s", flush=True)
        if now >= a.budget_s and not stopped_at_budget:  # the budget: stop the job as a user would (Ctrl-C)
            stopped_at_budget = True
            kill_tree(p, signal.SIGINT)
        if now >= a.budget_s + 60:
            kill_tree(p, signal.SIGKILL)
        time.sleep(0.5)
    wall = time.time() - t0
    kill_tree(p, signal.SIGKILL)  # what Ray left behind
    saves = our_saves(rd, t0, a.budget_s)
    metrics = [r for r in read_jsonl(rd / "metrics.jsonl") if "step_s" in r]
    return {"command": cmd, "config": GRPO_CONFIG, "overrides": OURS_SETS[variant], "wall_s": wall, "exit_code": p.returncode,
            "stopped_at_budget": stopped_at_budget, "saves": saves, "fault": injected or None,
            "steps_done": max((r["step"] for r in metrics), default=0),
            "restarts": sum(1 for e in read_jsonl(rd / "events.jsonl") if e.get("event") == "start") - 1,
            "train_reward": [{"step": r["step"], "wall_s": r["time"] - t0, "reward": r.get("reward_mean")}
                             for r in metrics if "reward_mean" in r],
            "run_dir": str(rd)}


# ----------------------------------------------------------------------------- TRL's side
def trl(work: Path, pol: Dict[str, Any], a: argparse.Namespace, fault: bool) -> Dict[str, Any]:
    py = trl_python(Path(a.trl_env))
    name = "trl-fault" if fault else "trl"
    out = work / name
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.time()
    spec = {"hf": str(pol["hf"]), "tokenizer_json": str(pol["tokenizer_json"]), "dir": str(out), "t0": t0,
            "budget_s": a.budget_s, "save_every_s": a.save_every_s, "seed": a.seed, "resume": False}
    cmd = [str(py), str(Path(__file__).resolve()), "--child", str(work / f"{name}.json")]
    (work / f"{name}.json").write_text(json.dumps(spec))
    injected: Dict[str, Any] = {}
    log = open(work / f"{name}.log", "w")
    p = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, cwd=REPO, start_new_session=True,
                         env=dict(os.environ, WANDB_MODE="disabled"))
    while True:
        while p.poll() is None:
            if fault and not injected and time.time() - t0 >= a.fault_at_s:
                kill_tree(p, signal.SIGKILL)
                p.wait()
                injected = {"event": "sigkill_trainer", "wall_s": time.time() - t0}
                print(f"[race] TRL: SIGKILL at {injected['wall_s']:.0f} s; restarting from its last checkpoint", flush=True)
                break
            if time.time() - t0 >= a.budget_s + 120:
                kill_tree(p, signal.SIGKILL)
            time.sleep(0.5)
        if injected and not injected.get("restarted"):
            injected["restarted"] = True
            spec["resume"] = any(out.glob("checkpoint-*"))
            injected["resumed_from"] = sorted(out.glob("checkpoint-*"), key=lambda d: int(d.name.split("-")[1]))[-1].name \
                if spec["resume"] else None
            (work / f"{name}.json").write_text(json.dumps(spec))
            p = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, cwd=REPO, start_new_session=True,
                                 env=dict(os.environ, WANDB_MODE="disabled"))
            continue
        break
    wall = time.time() - t0
    log.close()
    if p.returncode:
        tail = "\n".join((work / f"{name}.log").read_text(errors="replace").splitlines()[-15:])
        raise RuntimeError(f"TRL's GRPOTrainer exited {p.returncode}:\n{tail}")
    saves = {}
    for r in read_jsonl(out / "saves.jsonl"):  # a save of the killed process may be repeated after resume: the latest
        d = out / f"checkpoint-{r['step']}"
        if (d / "model.safetensors").exists() and r["time"] - t0 <= a.budget_s + 1:
            saves[r["step"]] = {"path": str(d), "step": r["step"], "wall_s": r["time"] - t0}
    logs = read_jsonl(out / "logs.jsonl")
    return {"command": cmd, "spec": {k: v for k, v in spec.items() if k != "t0"}, "trl_pins": TRL_PINS, "wall_s": wall,
            "saves": sorted(saves.values(), key=lambda s: s["wall_s"]), "fault": injected or None,
            "steps_done": max((r["step"] for r in logs), default=0),
            "train_reward": [{"step": r["step"], "wall_s": r["time"] - t0, "reward": r.get("reward"),
                              "frac_reward_zero_std": r.get("frac_reward_zero_std")} for r in logs],
            "run_dir": str(out)}


def child(spec_path: str) -> None:
    """TRL's GRPOTrainer (runs in the pinned environment, in its own process: imports count)."""
    spec = json.loads(Path(spec_path).read_text())
    import torch

    torch.set_num_threads(THREADS)
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from elastic.data.chat import ChatFormat, prompt_segments
    from elastic.reward.tasks import load_tasks
    from elastic.reward.verifiers.python_tests.verifier import EvalSettings, evaluate_python_batch
    from elastic.sandbox.command import Sandbox

    t0, out = spec["t0"], Path(spec["dir"])
    tasks = load_tasks(str(TRAIN), {"prompt": "instruction"}, ("tests",), python_limits=(TIME_LIMIT_S, 512)).tasks
    chat = ChatFormat()
    ids = sorted(tasks)
    texts = ["".join(t for t, _ in prompt_segments([{"role": "user", "content": tasks[i].prompt}], chat)) for i in ids]
    ds = Dataset.from_dict({"prompt": texts, "task_id": ids})
    settings = EvalSettings()
    boxes = [Sandbox() for _ in range(THREADS)]
    pool = cf.ThreadPoolExecutor(THREADS)

    def python_tests(prompts, completions, task_id, **_):
        items = [(t, tasks[t].tests, c) for t, c in zip(task_id, completions)]
        half = (len(items) + 1) // 2
        parts = pool.map(lambda k: evaluate_python_batch(items[k * half:(k + 1) * half], settings, boxes[k]), range(THREADS))
        return [float(r.reward) for part in parts for r in part]

    class Race(TrainerCallback):
        last = time.time()
        pending = 0.0

        def on_train_begin(self, args, state, control, **kw):
            Race.last = time.time()

        def on_step_end(self, args, state, control, **kw):
            now = time.time()
            if now - t0 >= spec["budget_s"]:
                control.should_training_stop = True
                control.should_save = True
            elif now - Race.last >= spec["save_every_s"]:
                control.should_save = True
            if control.should_save:
                Race.pending = now

        def on_save(self, args, state, control, **kw):
            Race.last = time.time()
            with open(out / "saves.jsonl", "a") as f:
                f.write(json.dumps({"step": state.global_step, "time": Race.pending}) + "\n")

        def on_log(self, args, state, control, logs=None, **kw):
            if logs and "reward" in logs:
                with open(out / "logs.jsonl", "a") as f:
                    f.write(json.dumps({"step": state.global_step, "time": time.time(), **{
                        k: logs.get(k) for k in ("reward", "frac_reward_zero_std", "completions/mean_length")}}) + "\n")

    tok = AutoTokenizer.from_pretrained(spec["hf"])
    model = AutoModelForCausalLM.from_pretrained(spec["hf"], dtype=torch.float32)
    n = PROMPTS * GROUP
    cfg = GRPOConfig(output_dir=str(out), use_cpu=True, bf16=False, max_steps=100000, num_generations=GROUP,
                     per_device_train_batch_size=TRL_MICRO, gradient_accumulation_steps=n // TRL_MICRO,
                     max_completion_length=MAX_NEW, temperature=TEMPERATURE, top_p=1.0, beta=0.0, loss_type="dapo",
                     scale_rewards="group", epsilon=0.2, epsilon_high=0.28, num_iterations=1, learning_rate=LR,
                     lr_scheduler_type="constant", warmup_steps=0, adam_beta1=0.9, adam_beta2=0.95, weight_decay=0.1,
                     max_grad_norm=1.0, logging_steps=1, save_strategy="steps", save_steps=10 ** 9, report_to=[],
                     gradient_checkpointing=False, seed=spec["seed"], dataloader_num_workers=0, disable_tqdm=True)
    trainer = GRPOTrainer(model=model, reward_funcs=[python_tests], args=cfg, train_dataset=ds, processing_class=tok,
                          callbacks=[Race()])
    trainer.train(resume_from_checkpoint=True if spec["resume"] else None)
    pool.shutdown()


# ----------------------------------------------------------------------------- the evaluator
def evaluator(tokenizer_json: Path):
    """score(hf_dir) -> {pass_at_1, se, per_task}: the same code for every policy."""
    import torch
    from tokenizers import Tokenizer

    from elastic.data.chat import ChatFormat, prompt_segments, tokenize_segments
    from elastic.data.tokenizer import EOS
    from elastic.generation.generate import generate
    from elastic.model.hf import from_pretrained
    from elastic.reward.tasks import load_tasks
    from elastic.reward.verifiers.python_tests.verifier import EvalSettings, evaluate_python_batch
    from elastic.sandbox.command import Sandbox

    torch.set_num_threads(THREADS)
    tasks = load_tasks(str(HELDOUT), {"prompt": "instruction"}, ("tests",), python_limits=(TIME_LIMIT_S, 512)).tasks
    ids = sorted(tasks)
    tok = Tokenizer.from_file(str(tokenizer_json))
    eos = tok.token_to_id(EOS)
    chat = ChatFormat()
    prompts = [tokenize_segments(prompt_segments([{"role": "user", "content": tasks[i].prompt}], chat), tok, eos)[0]
               for i in ids]
    settings = EvalSettings()
    boxes = [Sandbox() for _ in range(THREADS)]

    def score(hf_dir: str) -> Dict[str, Any]:
        t = time.time()
        model = from_pretrained(hf_dir).eval()
        outs = generate(model, [p for p in prompts for _ in range(EVAL_SAMPLES)], MAX_NEW, temperature=TEMPERATURE,
                        stop_token_ids=[eos], seed=EVAL_SEED, max_batch=64)
        texts = [tok.decode([x for x in o.tokens if x != eos], skip_special_tokens=True) for o in outs]
        items = [(ids[k // EVAL_SAMPLES], tasks[ids[k // EVAL_SAMPLES]].tests, s) for k, s in enumerate(texts)]
        half = (len(items) + 1) // 2
        with cf.ThreadPoolExecutor(THREADS) as ex:
            parts = list(ex.map(lambda k: evaluate_python_batch(items[k * half:(k + 1) * half], settings, boxes[k]),
                                range(THREADS)))
        ok = [r.status == "ok" for part in parts for r in part]
        share = [sum(ok[k * EVAL_SAMPLES:(k + 1) * EVAL_SAMPLES]) / EVAL_SAMPLES for k in range(len(ids))]
        return {"pass_at_1": statistics.mean(share), "se": statistics.stdev(share) / len(share) ** 0.5,
                "eval_s": round(time.time() - t, 1)}

    return score


def curve_of(side: Dict[str, Any], start: Dict[str, Any], score, work: Path, tag: str) -> List[Dict[str, Any]]:
    from elastic.model.hf import export_checkpoint

    curve = [{"step": 0, "wall_s": 0.0, "pass_at_1": start["pass_at_1"], "se": start["se"]}]
    for s in side["saves"]:
        path = s["path"]
        if tag != "trl":
            path = str(work / "eval" / f"{tag}-{Path(s['path']).name}")
            export_checkpoint(s["path"], path)
        r = score(path)
        curve.append({"step": s["step"], "wall_s": round(s["wall_s"], 1), "pass_at_1": r["pass_at_1"], "se": r["se"]})
        print(f"[race] {tag}: step {s['step']:4d} at {s['wall_s']:6.0f} s: held-out pass@1 {r['pass_at_1']:.3f} "
              f"± {r['se']:.3f} ({r['eval_s']} s to score)", flush=True)
    return curve


def time_to(curve: List[Dict[str, Any]], target: float) -> Optional[float]:
    return next((c["wall_s"] for c in curve if c["step"] > 0 and c["pass_at_1"] >= target - 1e-12), None)


def plot(res: Dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.2))
    labels = {"ours": ("elastic GRPO (colocated)", "tab:blue"), "ours-async": ("elastic GRPO (async fleet, staleness 1)",
              "tab:green"), "trl": (f"TRL GRPOTrainer ({TRL_PINS[0]})", "tab:orange")}
    for key, side in res["sides"].items():
        label, color = labels[key]
        c = side["curve"]
        x = [p["wall_s"] for p in c]
        y = [p["pass_at_1"] for p in c]
        e = [p["se"] for p in c]
        ax.plot(x, y, "o-", color=color, label=label, ms=3)
        ax.fill_between(x, [a - b for a, b in zip(y, e)], [a + b for a, b in zip(y, e)], color=color, alpha=0.2)
        f = side.get("fault")
        if f:
            ax.axvline(f["wall_s"], color=color, ls=":", lw=1)
    ax.axhline(res["target"], color="gray", ls="--", lw=1, label=f"target: TRL's best {res['target']:.3f}")
    ax.set_xlabel("wall seconds from the command (start-up included)")
    ax.set_ylabel("held-out pass@1 (256 tasks x 4 samples)")
    title = "Time to quality: graded-python GRPO, 2 CPU cores" + (" (SIGKILL at dotted line)" if res["fault"] else "")
    ax.set_title(title, fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--policy", default="", help="our SFT checkpoint (sft-graded-python step_00000350); default: train it here")
    ap.add_argument("--budget-s", type=float, default=600.0, help="each side's wall seconds from its command")
    ap.add_argument("--save-every-s", type=float, default=60.0, help="both sides save a checkpoint this often")
    ap.add_argument("--steps", type=int, default=800, help="our train.steps (an upper bound: the budget stops it)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--fault", action="store_true", help="SIGKILL a training worker at --fault-at-s on each side")
    ap.add_argument("--fault-at-s", type=float, default=0.0,
                    help="wall seconds of the SIGKILL (default: 0.4 x the fault-free race's budget, else 0.4 x --budget-s)")
    ap.add_argument("--baseline", default=str(REPO / "bench/results/time_to_quality.json"),
                    help="with --fault: the race without it (its target, and each side's time for the fault's cost)")
    ap.add_argument("--sides", default="ours,trl", help=f"comma-separated: trl and any of {', '.join(OURS_SETS)}")
    ap.add_argument("--reuse", default="", help="take the sides not run now (e.g. trl) from this earlier race's JSON")
    ap.add_argument("--trl-env", default=str(TRL_ENV))
    ap.add_argument("--out", default="", help="JSON path (default bench/results/time_to_quality[_fault].json)")
    ap.add_argument("--keep", default="", help="keep the run directories under this path (default: deleted)")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.child:
        child(a.child)
        return 0
    if a.fault and not a.fault_at_s:
        prior = Path(a.baseline) if a.baseline and Path(a.baseline).exists() else None
        a.fault_at_s = 0.4 * (json.loads(prior.read_text())["budget_s"] if prior else a.budget_s)
    out = Path(a.out or REPO / "bench/results" / ("time_to_quality_fault.json" if a.fault else "time_to_quality.json"))
    work = Path(a.keep) if a.keep else Path(tempfile.mkdtemp(prefix="ttq-"))
    work.mkdir(parents=True, exist_ok=True)
    t_bench = time.time()
    try:
        if "trl" in a.sides.split(","):
            trl_python(Path(a.trl_env))  # installed before any clock starts
        pol = make_policy(work, a.policy)
        sides: Dict[str, Dict[str, Any]] = {}
        for key in a.sides.split(","):
            print(f"[race] {key}: {a.budget_s:.0f} s budget{' with a fault' if a.fault else ''}", flush=True)
            sides[key] = trl(work, pol, a, a.fault) if key == "trl" else ours(work, pol, a, a.fault, key)
            print(f"[race] {key}: {len(sides[key]['saves'])} saves, {sides[key]['steps_done']} steps in "
                  f"{sides[key]['wall_s']:.0f} s", flush=True)
        score = evaluator(pol["tokenizer_json"])
        start = score(str(pol["hf"]))
        print(f"[race] starting policy: held-out pass@1 {start['pass_at_1']:.3f} ± {start['se']:.3f}", flush=True)
        for key, side in sides.items():
            side["curve"] = curve_of(side, start, score, work, key)
        if a.reuse:  # sides of an earlier race on the same policy (their curves: the same evaluator, same seed)
            old = json.loads(Path(a.reuse).read_text())
            if abs(old["start"]["pass_at_1"] - start["pass_at_1"]) > 1e-9:
                raise SystemExit(f"--reuse {a.reuse}: its starting policy scored {old['start']['pass_at_1']:.4f}, "
                                 f"this one {start['pass_at_1']:.4f}: not the same policy")
            for k, side in old["sides"].items():
                if k not in sides:
                    sides[k] = {**side, "reused_from": a.reuse}
    finally:
        if not a.keep:
            shutil.rmtree(work, ignore_errors=True)
    res: Dict[str, Any] = {"fault": a.fault, "budget_s": a.budget_s, "save_every_s": a.save_every_s, "seed": a.seed,
                           "policy": {"checkpoint": str(pol["checkpoint"]), "sft_command": pol["command"]},
                           "heldout": str(HELDOUT.relative_to(REPO)), "eval": {"samples": EVAL_SAMPLES, "seed": EVAL_SEED,
                           "temperature": TEMPERATURE, "max_new_tokens": MAX_NEW}, "start": start,
                           "sides": {k: {x: v for x, v in s.items() if x != "run_dir"} for k, s in sides.items()}}
    base = json.loads(Path(a.baseline).read_text()) if a.fault and a.baseline and Path(a.baseline).exists() else None
    if "trl" in sides:
        # with the fault: the fault-free race's target, so that each side's fault cost compares like with like
        res["target"] = base["target"] if base else max(c["pass_at_1"] for c in sides["trl"]["curve"])
        res["target_from"] = f"TRL's best in {a.baseline} (the race without the fault)" if base else "TRL's best in this race"
        for s in sides.values():
            s["time_to_target_s"] = time_to(s["curve"], res["target"])
        t = sides["trl"]["time_to_target_s"]
        res["ratios"] = {k: (s["time_to_target_s"] / t if s["time_to_target_s"] is not None and t else None)
                         for k, s in sides.items() if k != "trl"}
        got = [r for r in res["ratios"].values() if r is not None]
        res["ratio"] = min(got) if got else None  # ours' best variant
        if base:
            for k, side in sides.items():
                before = base["sides"].get(k, {}).get("time_to_target_s")
                side["fault_cost_s"] = (side["time_to_target_s"] - before
                                        if side["time_to_target_s"] is not None and before is not None else None)
        res["goal"] = "ours' time to TRL's best held-out pass@1 <= 0.5 x TRL's"
    import torch

    res["context"] = {"cpus": os.cpu_count(), "loadavg_end": os.getloadavg(), "torch": torch.__version__,
                      "date": time.strftime("%Y-%m-%d"), "bench_wall_s": round(time.time() - t_bench, 1)}
    rows = [["side", "saves", "steps", "best pass@1", "time to target s", "fault at s", "fault cost s"]]
    for k, s in sides.items():
        best = max(s["curve"], key=lambda c: c["pass_at_1"])
        rows.append([k, str(len(s["saves"])), str(s["steps_done"]), f"{best['pass_at_1']:.3f} ± {best['se']:.3f}",
                     "-" if s.get("time_to_target_s") is None else f"{s['time_to_target_s']:.0f}",
                     "-" if not s.get("fault") else f"{s['fault']['wall_s']:.0f}",
                     "-" if s.get("fault_cost_s") is None else f"{s['fault_cost_s']:.0f}"])
    w = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    print("\n".join("  ".join(c.ljust(w[i]) for i, c in enumerate(r)) for r in rows))
    if "target" in res:
        for k, r in res["ratios"].items():
            print(f"target {res['target']:.3f} (TRL's best): time ratio {k}/TRL = "
                  f"{'not reached' if r is None else format(r, '.2f')} (goal <= 0.5)")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(res, indent=1))
    if "target" in res and len(sides) > 1:
        plot(res, out.with_suffix(".png"))
    print(f"[race] wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
