"""Our jobs against TRL on the same work, on this machine: GRPO steps, SFT tokens and start-up.

Both sides start from the same weights: our python-tasks SFT policy (`--policy`, a checkpoint
`<run>/step_N`; without it one is trained here with jobs/configs/sft-python-tasks.yaml) exported
to Hugging Face format with jobs/export_hf.py, which is what TRL loads.

* **GRPO** (jobs/configs/grpo-python-tasks.yaml): the same prompts in the same order (read
  from our run's rollouts.jsonl and given to TRL unshuffled), 16 prompts × 4 completions per
  step, 128 new tokens, temperature 1.0, no KL, token-mean loss, AdamW(0.9, 0.95, wd 0.1),
  lr 3e-4 constant, grad clip 1.0, one optimizer step per rollout batch. Micro-batches (a memory
  knob: the sum of their gradients is the same): ours 16 rows (the config), TRL 4
  (`per_device_train_batch_size`, as the bench first ran it). Not settled: one TRL run at 16 took
  20.4 s/step against 1.64 at 4, but TRL runs at 4 have also taken 8-30 s/step when another
  process ran beside them (its two torch threads spin-wait for each other), so that pair does
  not show 16 is slower for TRL.
  Our reward: the `python_tests` verifier in the bubblewrap sandbox on the CPU reward pool. TRL's
  reward: the *same harness* run as a plain subprocess, two at a time (an unsandboxed baseline,
  which favours TRL).
* **SFT** (jobs/configs/sft-python-tasks.yaml rows): ours packs conversations into 512-token
  rows with document-masked attention; TRL's `SFTTrainer` runs its default layout (one row per
  conversation, padded to the batch's longest: `unpacked`) and its packed layout (BFD packing,
  padding-free: `packed`), on the same token ids (we tokenize the rows once, with the loss mask,
  and hand TRL `input_ids` + `completion_mask`).
* **Start-up**: seconds from the command to the end of the first training step. Ours for the
  default pretrain job (`jobs/pretrain.py`, no arguments); for GRPO both sides'
  `overhead_s = first_step_s - steady s/step` (what the job spends before its first step).

Formulas (the same on both sides, from the step-end times each side records):

    s_per_step       = (t_end[last] - t_end[first]) / (steps - 1)      steady: step 1 excluded
    gen_tokens_per_s = Σ generated tokens (steps 2..) / Σ step time (steps 2..)
    real_tokens_per_s (SFT) = Σ non-padding tokens (steps 3..) / Σ step time (steps 3..)
    first_step_s     = t_end[1] - t_command                    (imports, Ray, data, workers...)
    ratio            = TRL's seconds / our seconds  (or our tokens/s / TRL's): > 1 means we are faster

Mismatches, said in the JSON too: process layout (ours 2 Ray Train workers × 1 thread under
FSDP2 over gloo, plus Ray's own processes and the reward actors; TRL 1 process × 2 threads),
generation engine (ours: static KV cache, continuous batching; TRL: `transformers.generate`),
sandbox (ours on, TRL's none). Runs alternate ours / TRL, `--rounds` times; each figure is the
median over rounds and each ratio the median of the per-round ratios. Everything it writes goes
to a temporary directory that is deleted at the end.

  python bench/trl_peer.py                       # all parts, 2 rounds (~25 min on 2 cores)
  python bench/trl_peer.py --parts grpo --rounds 3 --policy runs/sft-python-tasks/step_00000400
  python bench/trl_peer.py --smoke               # CI: tiny runs, checks the plumbing, no targets
                                                 # (our jobs on one Ray instance, GRPO's beside SFT's)
"""

from __future__ import annotations

import argparse
import concurrent.futures
import contextlib
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench.smoke_cluster import shared_instance  # noqa: E402

PY = sys.executable
GRPO_CONFIG = REPO / "jobs/configs/grpo-python-tasks.yaml"
SFT_CONFIG = REPO / "jobs/configs/sft-python-tasks.yaml"
TARGETS = {"grpo_step_ratio": 1.5, "sft_tokens_ratio": 1.3, "startup_first_step_s": 15.0}
GROUP, MICRO = 4, 4  # completions per prompt; TRL's rows per micro-batch (see above)
OURS_MICRO, OURS_WORKERS = 16, 2  # grpo-python-tasks.yaml: rl.micro_batch_size, scaling.max_workers
THREADS = 2  # TRL's torch threads: the machine's cores, as a user on a laptop would run it
# Smoke: logical CPUs of the shared instance, what our GRPO and SFT runs hold side by side (2
# train workers each, GRPO's 2 reward actors, SFT's packers).
SMOKE_CPUS = 12


# ----------------------------------------------------------------------------- helpers
def run(cmd: Sequence[str], log: Path, env: Optional[Dict[str, str]] = None, timeout: float = 1800) -> Dict[str, float]:
    """Run `cmd` to completion, output to `log`; its launch epoch and wall seconds."""
    e = dict(os.environ, WANDB_MODE="disabled", **(env or {}))
    t0 = time.time()
    e["PEER_T0"] = repr(t0)
    with open(log, "w") as f:
        p = subprocess.run(list(cmd), stdout=f, stderr=subprocess.STDOUT, env=e, cwd=REPO, timeout=timeout)
    wall = time.time() - t0
    if p.returncode != 0:
        tail = log.read_text(errors="replace").splitlines()[-15:]
        raise RuntimeError(f"{' '.join(map(str, cmd))} exited {p.returncode}; last lines of {log}:\n" + "\n".join(tail))
    return {"t0": t0, "wall_s": wall}


def records(path: Path) -> List[Dict[str, Any]]:
    from elastic.records import read_records

    return list(read_records(str(path))) if path.exists() else []


def step_figures(ends: Sequence[float], t0: float, skip: int = 1) -> Dict[str, float]:
    """s_per_step over steps skip+1.. (from step-end times) and first_step_s."""
    if len(ends) <= skip:
        raise RuntimeError(f"need more than {skip} steps, got {len(ends)}")
    return {"s_per_step": (ends[-1] - ends[skip - 1]) / (len(ends) - skip), "first_step_s": ends[0] - t0,
            "steps": len(ends)}


def last_checkpoint(run_dir: Path) -> Path:
    steps = sorted(run_dir.glob("step_*"))
    if not steps:
        raise RuntimeError(f"no checkpoint in {run_dir}")
    return steps[-1]


def median(xs: Sequence[float]) -> Optional[float]:
    xs = [x for x in xs if x is not None]
    return statistics.median(xs) if xs else None


# ----------------------------------------------------------------------------- the policy
def make_policy(work: Path, policy: Optional[str], sft_steps: int, workers: int = 0) -> Dict[str, Path]:
    """Our checkpoint (given, or trained here: on `workers` workers, 0 for the config's 2) and its
    Hugging Face export."""
    if policy:
        ckpt = Path(policy).resolve()
    else:
        print(f"[peer] training the starting policy: {sft_steps} SFT steps ({SFT_CONFIG.name})", flush=True)
        scaling = ["--set", f"scaling.min_workers={workers}", "--set", f"scaling.max_workers={workers}"] if workers else []
        run([PY, "jobs/sft.py", "--config", str(SFT_CONFIG), "--set", f"run.storage_path={work}/runs",
             "--set", "run.name=policy", "--set", f"train.steps={sft_steps}", "--set", f"checkpoint.every_steps={sft_steps}",
             "--set", "eval.every_steps=0", *scaling], work / "policy.log")
        ckpt = last_checkpoint(work / "runs/policy")
    hf = work / "hf"
    run([PY, "jobs/export_hf.py", "--checkpoint", str(ckpt), "--out", str(hf)], work / "export.log")
    return {"checkpoint": ckpt, "hf": hf, "tokenizer_json": ckpt.parent / "tokenizer.json"}


# ----------------------------------------------------------------------------- GRPO
def ours_grpo(work: Path, pol: Dict[str, Path], steps: int, shape: Dict[str, int], tag: str) -> Dict[str, Any]:
    name = f"ours-grpo-{tag}"
    t = run([PY, "jobs/grpo.py", "--config", str(GRPO_CONFIG), "--set", f"run.storage_path={work}/runs",
             "--set", f"run.name={name}", "--set", f"model.init_from={pol['checkpoint']}", "--set", "model.init_sft_config=",
             "--set", f"train.steps={steps}", "--set", "rl.eval_every=0", "--set", f"checkpoint.every_steps={steps}",
             "--set", f"rl.prompts_per_step={shape['prompts']}", "--set", f"rl.max_new_tokens={shape['max_new_tokens']}",
             # the config's micro-batch (16 rows), or a worker's whole share when a smaller shape has fewer
             "--set", f"rl.micro_batch_size={min(OURS_MICRO, shape['prompts'] * GROUP // OURS_WORKERS)}"],
            work / f"{name}.log")
    rd = work / "runs" / name
    recs = sorted((r for r in records(rd / "metrics.jsonl") if "step_s" in r), key=lambda r: r["step"])
    rollouts = records(rd / "rollouts.jsonl")
    gen = {}
    for r in rollouts:
        gen[r["step"]] = gen.get(r["step"], 0) + int(r["tokens"])
    f = step_figures([r["time"] for r in recs], t["t0"])
    steady = recs[1:]
    span = recs[-1]["time"] - recs[0]["time"]
    f.update({"job_s": t["wall_s"], "gen_tokens_per_s": sum(gen.get(r["step"], 0) for r in steady) / span,
              "reward_mean": statistics.mean(float(r["reward"]) for r in rollouts),
              "generate_s": median([r.get("generate_s") for r in steady]),
              "reward_wait_s": median([r.get("reward_wait_s") for r in steady]),
              "update_s": median([r.get("update_s") for r in steady])})
    # the prompts of each step, in slot order, for TRL
    prompts: Dict[int, Dict[int, str]] = {}
    for r in rollouts:
        prompts.setdefault(r["step"], {})[int(r["k"])] = r["problem"]
    order = [prompts[s][k] for s in sorted(prompts) for k in sorted(prompts[s]) if k % GROUP == 0]
    shutil.rmtree(rd, ignore_errors=True)
    return {"figures": f, "prompt_order": order}


def trl_grpo(work: Path, pol: Dict[str, Path], steps: int, shape: Dict[str, int], order: List[str], tag: str) -> Dict[str, Any]:
    spec = work / f"trl-grpo-{tag}.json"
    out = work / f"trl-grpo-{tag}.out.json"
    spec.write_text(json.dumps({"hf": str(pol["hf"]), "tokenizer_json": str(pol["tokenizer_json"]), "steps": steps,
                                "order": order, "out": str(out), "dir": str(work / f"trl-grpo-{tag}"), **shape}))
    t = run([PY, __file__, "--child", "grpo", str(spec)], work / f"trl-grpo-{tag}.log")
    res = json.loads(out.read_text())
    f = step_figures(res["ends"], t["t0"])
    span = res["ends"][-1] - res["ends"][0]
    f.update({"job_s": t["wall_s"], "gen_tokens_per_s": sum(res["gen_tokens"][1:]) / span,
              "reward_mean": res["reward_mean"], "reward_s": median(res["reward_s"][1:]),
              "prompt_tokens_equal": res["prompt_tokens_equal"]})
    shutil.rmtree(work / f"trl-grpo-{tag}", ignore_errors=True)
    return {"figures": f}


def child_grpo(spec: Dict[str, Any]) -> None:
    """TRL's GRPOTrainer on our exported policy (runs in its own process: imports count)."""
    import concurrent.futures as cf
    import secrets

    import torch

    torch.set_num_threads(THREADS)
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from elastic.data.chat import ChatFormat, prompt_segments, tokenize_segments
    from elastic.data.tokenizer import from_json, info_from_file
    from elastic.reward.tasks import load_tasks
    from elastic.reward.verifiers.python_tests.verifier import (EvalSettings, extract_program, harness_input, judge,
                                                                parse_report, plan, run_limits, unsandboxed_argv)
    from elastic.sandbox.command import RunOutcome

    tasks = load_tasks(str(REPO / "datasets/python-tasks/train.jsonl"), {"prompt": "instruction"}, ("tests",),
                       python_limits=(2.0, 512)).tasks
    info = info_from_file(spec["tokenizer_json"])
    ours = from_json(info.json)
    hf_tok = AutoTokenizer.from_pretrained(spec["hf"])
    chat = ChatFormat()
    texts, equal = [], 0
    for tid in spec["order"]:
        segs = prompt_segments([{"role": "user", "content": tasks[tid].prompt}], chat)
        ids = tokenize_segments(segs, ours, info.eos_id)[0]
        text = "".join(t for t, _ in segs)
        texts.append(text)
        equal += hf_tok(text, add_special_tokens=False)["input_ids"] == ids
    ds = Dataset.from_dict({"prompt": texts, "task_id": list(spec["order"])})
    settings = EvalSettings()
    argv = unsandboxed_argv(settings)
    env = {"PATH": "/usr/local/bin:/usr/bin:/bin", "LC_ALL": "C", "LANG": "C"}

    def one(tid: str, completion: str) -> float:
        t = tasks[tid].tests
        p = plan(t)
        program = extract_program(completion, t)
        if program is None:
            return 0.0
        nonce = secrets.token_hex(16)
        limits = run_limits(t, len(p.names))
        try:
            c = subprocess.run(argv, input=harness_input(program, t, p, nonce), capture_output=True, env=env, cwd="/",
                               timeout=limits.wall_s)
        except subprocess.TimeoutExpired:
            return 0.0
        o = RunOutcome(exit_code=c.returncode, stdout=c.stdout, stderr=c.stderr)
        return float(judge(tid, o, parse_report(o.stdout, nonce), p, limits, settings).reward)

    pool = cf.ThreadPoolExecutor(THREADS)
    reward_s: List[float] = []
    rewards: List[float] = []

    def python_tests(prompts, completions, task_id, **_):
        t0 = time.perf_counter()
        got = list(pool.map(one, task_id, completions))
        reward_s.append(time.perf_counter() - t0)
        rewards.extend(got)
        return got

    ends: List[float] = []
    gen_tokens: List[float] = []
    n = spec["prompts"] * GROUP  # completions per step

    class Clock(TrainerCallback):
        def on_step_end(self, args, state, control, **kw):
            ends.append(time.time())

        def on_log(self, args, state, control, logs=None, **kw):
            if logs and "completions/mean_length" in logs:
                gen_tokens.append(logs["completions/mean_length"] * n)

    model = AutoModelForCausalLM.from_pretrained(spec["hf"], dtype=torch.float32)
    cfg = GRPOConfig(output_dir=spec["dir"], use_cpu=True, bf16=False, max_steps=spec["steps"], num_generations=GROUP,
                     per_device_train_batch_size=min(MICRO, n), gradient_accumulation_steps=n // min(MICRO, n),
                     max_completion_length=spec["max_new_tokens"],
                     temperature=1.0, top_p=1.0, beta=0.0, loss_type="dapo", learning_rate=3e-4,
                     lr_scheduler_type="constant", warmup_steps=0, adam_beta1=0.9, adam_beta2=0.95, weight_decay=0.1,
                     max_grad_norm=1.0, logging_steps=1, save_strategy="no", report_to=[], shuffle_dataset=False,
                     gradient_checkpointing=False,
                     seed=0, dataloader_num_workers=0, disable_tqdm=True)
    trainer = GRPOTrainer(model=model, reward_funcs=[python_tests], args=cfg, train_dataset=ds, processing_class=hf_tok,
                          callbacks=[Clock()])
    trainer.train()
    pool.shutdown()
    Path(spec["out"]).write_text(json.dumps({"ends": ends, "gen_tokens": gen_tokens, "reward_s": reward_s,
                                             "reward_mean": statistics.mean(rewards) if rewards else 0.0,
                                             "prompt_tokens_equal": equal / max(1, len(texts))}))


# ----------------------------------------------------------------------------- SFT
def ours_sft(work: Path, pol: Dict[str, Path], steps: int, tag: str) -> Dict[str, Any]:
    name = f"ours-sft-{tag}"
    t = run([PY, "jobs/sft.py", "--config", str(SFT_CONFIG), "--set", f"run.storage_path={work}/runs",
             "--set", f"run.name={name}", "--set", f"model.init_from={pol['checkpoint']}", "--set", f"train.steps={steps}",
             "--set", "eval.every_steps=0", "--set", f"checkpoint.every_steps={steps}", "--set", "train.warmup_steps=0",
             "--set", "train.lr=3e-4", "--set", "train.min_lr_ratio=1.0"], work / f"{name}.log")
    rd = work / "runs" / name
    recs = sorted((r for r in records(rd / "metrics.jsonl") if "step_s" in r), key=lambda r: r["step"])
    steady = recs[2:]
    span = recs[-1]["time"] - recs[1]["time"]
    f = {"real_tokens_per_s": sum(r["tokens"] for r in steady) / span, "steps": len(recs),
         "first_step_s": recs[0]["time"] - t["t0"], "job_s": t["wall_s"],
         "loss_last10": statistics.mean(r["loss"] for r in recs[-10:]),
         "tokens_per_step": statistics.mean(r["tokens"] for r in recs)}
    shutil.rmtree(rd, ignore_errors=True)
    return {"figures": f}


def trl_sft(work: Path, pol: Dict[str, Path], steps: int, layout: str, tag: str) -> Dict[str, Any]:
    spec = work / f"trl-sft-{layout}-{tag}.json"
    out = work / f"trl-sft-{layout}-{tag}.out.json"
    spec.write_text(json.dumps({"hf": str(pol["hf"]), "tokenizer_json": str(pol["tokenizer_json"]), "steps": steps,
                                "layout": layout, "out": str(out), "dir": str(work / f"trl-sft-{tag}")}))
    t = run([PY, __file__, "--child", "sft", str(spec)], work / f"trl-sft-{layout}-{tag}.log")
    res = json.loads(out.read_text())
    ends, toks = res["ends"], res["tokens"]
    span = ends[-1] - ends[1]
    f = {"real_tokens_per_s": sum(toks[2:len(ends)]) / span, "steps": len(ends), "first_step_s": ends[0] - t["t0"],
         "job_s": t["wall_s"], "loss_last10": res["loss_last10"], "tokens_per_step": statistics.mean(toks[:len(ends)])}
    shutil.rmtree(work / f"trl-sft-{tag}", ignore_errors=True)
    return {"figures": f}


def sft_rows(tokenizer_json: Path, path: Path = REPO / "datasets/python-tasks/sft.jsonl") -> Dict[str, List]:
    """The SFT rows of `path` tokenized as our SFT does (segments, loss mask, final EOS)."""
    from elastic.data.chat import ChatFormat, render_segments, row_messages, tokenize_segments
    from elastic.data.tokenizer import from_json, info_from_file

    info = info_from_file(str(tokenizer_json))
    tok = from_json(info.json)
    chat = ChatFormat()
    ids, masks = [], []
    with open(path) as f:
        for line in f:
            msgs = row_messages(json.loads(line), chat)
            i, m = tokenize_segments(render_segments(msgs, chat) + [(None, True)], tok, info.eos_id)
            ids.append(i)
            masks.append([int(x) for x in m])
    return {"input_ids": ids, "completion_mask": masks}


def child_sft(spec: Dict[str, Any]) -> None:
    import torch

    torch.set_num_threads(THREADS)
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import SFTConfig, SFTTrainer

    ds = Dataset.from_dict(sft_rows(Path(spec["tokenizer_json"])))
    tok = AutoTokenizer.from_pretrained(spec["hf"])
    packed = spec["layout"] == "packed"
    ends: List[float] = []
    losses: List[float] = []
    tokens: List[int] = []

    class Clock(TrainerCallback):
        def on_step_end(self, args, state, control, **kw):
            ends.append(time.time())

        def on_log(self, args, state, control, logs=None, **kw):
            if logs and "loss" in logs:
                losses.append(float(logs["loss"]))

    model = AutoModelForCausalLM.from_pretrained(spec["hf"], dtype=torch.float32)
    cfg = SFTConfig(output_dir=spec["dir"], use_cpu=True, bf16=False, max_steps=spec["steps"], per_device_train_batch_size=8,
                    gradient_accumulation_steps=1, learning_rate=3e-4, lr_scheduler_type="constant", warmup_steps=0,
                    adam_beta1=0.9, adam_beta2=0.95, weight_decay=0.1, max_grad_norm=1.0, logging_steps=1,
                    save_strategy="no", report_to=[], seed=0, dataloader_num_workers=0, disable_tqdm=True, gradient_checkpointing=False,
                    completion_only_loss=True, max_length=512, packing=packed, eos_token=tok.eos_token)
    trainer = SFTTrainer(model=model, args=cfg, train_dataset=ds, processing_class=tok, callbacks=[Clock()])
    collate = trainer.data_collator

    def counting(examples):  # non-padding tokens of every batch the trainer takes
        b = collate(examples)
        tokens.append(int(sum(len(e["input_ids"]) for e in examples)))
        return b

    trainer.data_collator = counting
    trainer.train()
    Path(spec["out"]).write_text(json.dumps({"ends": ends, "tokens": tokens,
                                             "loss_last10": statistics.mean(losses[-10:]) if losses else None}))


# ----------------------------------------------------------------------------- start-up
def ours_startup(work: Path, steps: int, tag: str) -> Dict[str, Any]:
    name = f"ours-pretrain-{tag}"
    # The default job as a user runs it (only its run directory and step count moved here).
    t = run([PY, "jobs/pretrain.py", "--set", f"run.storage_path={work}/runs", "--set", f"run.name={name}",
             "--set", f"train.steps={steps}"], work / f"{name}.log")
    rd = work / "runs" / name
    recs = sorted((r for r in records(rd / "metrics.jsonl") if "step_s" in r), key=lambda r: r["step"])
    f = {"first_step_s": recs[0]["time"] - t["t0"], "job_s": t["wall_s"],
         "first_step_started_s": recs[0]["time"] - recs[0]["step_s"] - t["t0"]}
    shutil.rmtree(rd, ignore_errors=True)
    return {"figures": f}


# ----------------------------------------------------------------------------- main
def grpo_part(a: argparse.Namespace, work: Path, pol: Dict[str, Path], shape: Dict[str, int],
              ours0: Optional[Dict[str, Any]] = None) -> Dict[str, Any]:
    """Ours then TRL, `--rounds` times (`ours0`: our run of round 0, already done): res["grpo"]."""
    ours_r, trl_r, ratios = [], [], []
    for i in range(a.rounds):
        o = ours0 if i == 0 and ours0 else ours_grpo(work, pol, a.grpo_steps, shape, str(i))
        print(f"[peer] grpo round {i}: ours {o['figures']['s_per_step']:.2f} s/step", flush=True)
        t = trl_grpo(work, pol, a.grpo_steps, shape, o["prompt_order"], str(i))
        print(f"[peer] grpo round {i}: TRL {t['figures']['s_per_step']:.2f} s/step", flush=True)
        ours_r.append(o["figures"]), trl_r.append(t["figures"])
        ratios.append(t["figures"]["s_per_step"] / o["figures"]["s_per_step"])
    return {"ours": ours_r, "trl": trl_r, "step_ratio_per_round": ratios, "step_ratio": median(ratios),
            "overhead_ours_s": median([r["first_step_s"] - r["s_per_step"] for r in ours_r]),
            "overhead_trl_s": median([r["first_step_s"] - r["s_per_step"] for r in trl_r])}


def sft_part(a: argparse.Namespace, work: Path, pol: Dict[str, Path],
             ours0: Optional[Dict[str, Any]] = None) -> Dict[str, Any]:
    """Ours then TRL's two layouts, `--rounds` times (`ours0`: our run of round 0, already done): res["sft"]."""
    rows = {"ours": [], "unpacked": [], "packed": []}
    for i in range(a.rounds):
        o = ours0 if i == 0 and ours0 else ours_sft(work, pol, a.sft_steps, str(i))
        rows["ours"].append(o["figures"])
        per_step = o["figures"]["tokens_per_step"]
        for layout in ("unpacked", "packed"):
            # TRL processes about the same real tokens as our run; the smoke runs the 3
            # steps its figure needs (real tokens/s from the third step on)
            guess = 90 * 8 if layout == "unpacked" else 512 * 8
            steps = 3 if a.smoke else max(4, round(a.sft_steps * per_step / guess))
            t = trl_sft(work, pol, steps, layout, str(i))
            rows[layout].append(t["figures"])
        print(f"[peer] sft round {i}: ours {o['figures']['real_tokens_per_s']:,.0f} tok/s, TRL unpacked "
              f"{rows['unpacked'][-1]['real_tokens_per_s']:,.0f}, packed {rows['packed'][-1]['real_tokens_per_s']:,.0f}",
              flush=True)
    best = [max(u["real_tokens_per_s"], p["real_tokens_per_s"]) for u, p in zip(rows["unpacked"], rows["packed"])]
    ratios = [o["real_tokens_per_s"] / b for o, b in zip(rows["ours"], best)]
    return {**rows, "tokens_ratio_per_round": ratios, "tokens_ratio": median(ratios),
            "best_trl_layout": "unpacked" if median([u["real_tokens_per_s"] for u in rows["unpacked"]])
            >= median([p["real_tokens_per_s"] for p in rows["packed"]]) else "packed"}


def table(rows: List[List[str]]) -> str:
    w = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return "\n".join("  ".join(c.ljust(w[i]) for i, c in enumerate(r)) for r in rows)


def fmt(x: Optional[float], spec: str = ".2f") -> str:
    return "-" if x is None else format(x, spec)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--parts", default="grpo,sft,startup")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--policy", default="", help="our SFT checkpoint <run>/step_N (default: train one here)")
    ap.add_argument("--policy-steps", type=int, default=400, help="SFT steps when training the policy here")
    ap.add_argument("--grpo-steps", type=int, default=6)
    ap.add_argument("--prompts", type=int, default=16, help="GRPO prompts per step (x4 completions)")
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--sft-steps", type=int, default=30, help="our SFT steps (512-token rows of 8); TRL runs the same tokens")
    ap.add_argument("--startup-steps", type=int, default=3)
    ap.add_argument("--smoke", action="store_true", help="tiny runs: checks the plumbing, not the targets")
    ap.add_argument("--out", default=str(REPO / "bench/results/trl_peer.json"))
    ap.add_argument("--child", nargs=2, metavar=("PART", "SPEC"), help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.child:
        part, spec = a.child
        {"grpo": child_grpo, "sft": child_sft}[part](json.loads(Path(spec).read_text()))
        return 0
    if a.smoke:
        a.rounds, a.policy_steps, a.grpo_steps, a.sft_steps, a.prompts, a.max_new_tokens = 1, 2, 2, 3, 4, 32
    parts = [p for p in a.parts.split(",") if p]
    work = Path(tempfile.mkdtemp(prefix="trl-peer-"))
    res: Dict[str, Any] = {"smoke": a.smoke, "parts": parts, "rounds": a.rounds, "targets": TARGETS}
    # Smoke: our jobs of the policy, GRPO and SFT parts join one Ray instance (bench/smoke_cluster.py)
    # instead of each starting its own; start-up measures the default job as a user runs it, after.
    cluster = contextlib.ExitStack()
    try:
        if a.smoke and {"grpo", "sft"} & set(parts):
            cluster.enter_context(shared_instance(SMOKE_CPUS))
        # the smoke's policy is a starting point, not a figure: 2 steps on 1 worker (one process fewer)
        pol = make_policy(work, a.policy, a.policy_steps, 1 if a.smoke else 0) if {"grpo", "sft"} & set(parts) else {}
        shape = {"prompts": a.prompts, "max_new_tokens": a.max_new_tokens}
        g0 = s0 = None
        if a.smoke and {"grpo", "sft"} <= set(parts):
            # Our two runs side by side (Ray jobs whose train workers run one thread each: CI's
            # 2 cores), then TRL's runs one at a time (two threads each, which spin on a busy
            # machine). The smoke checks the plumbing: its figures are no targets either way.
            with concurrent.futures.ThreadPoolExecutor(1) as side:
                sft0 = side.submit(ours_sft, work, pol, a.sft_steps, "0")
                g0 = ours_grpo(work, pol, a.grpo_steps, shape, "0")
                s0 = sft0.result()
        if "grpo" in parts:
            res["grpo_shape"] = shape
            res["grpo"] = grpo_part(a, work, pol, shape, g0)
        if "sft" in parts:
            res["sft"] = sft_part(a, work, pol, s0)
        cluster.close()
        if "startup" in parts:
            st = [ours_startup(work, a.startup_steps, str(i))["figures"] for i in range(a.rounds)]
            res["startup"] = {"ours_pretrain": st, "first_step_s": median([s["first_step_s"] for s in st])}
    finally:
        cluster.close()
        shutil.rmtree(work, ignore_errors=True)
    import torch
    import transformers
    import trl

    res["mismatches"] = ["process layout: ours 2 Ray Train workers x 1 thread (FSDP2, gloo) + reward actors; TRL 1 process "
                         f"x {THREADS} threads", "reward: ours sandboxed (bubblewrap, reward pool); TRL the same harness as a "
                         "plain subprocess, 2 at a time", "generation: ours static KV cache + continuous batching; TRL "
                         "transformers.generate", "SFT layout: ours 512-token packed rows, document-masked attention",
                         f"GRPO micro-batches: ours 16 rows (grpo-python-tasks.yaml), TRL {MICRO}"]
    res["context"] = {"host": platform.node(), "cpus": os.cpu_count(), "loadavg": os.getloadavg(), "torch": torch.__version__,
                      "transformers": transformers.__version__, "trl": trl.__version__, "date": time.strftime("%Y-%m-%d")}
    rows = [["figure", "ours", "TRL", "ratio (>1: ours faster)", "target"]]
    if "grpo" in res:
        g = res["grpo"]
        rows.append(["GRPO s/step", fmt(median([r["s_per_step"] for r in g["ours"]])),
                     fmt(median([r["s_per_step"] for r in g["trl"]])), fmt(g["step_ratio"]), f">= {TARGETS['grpo_step_ratio']}"])
        rows.append(["GRPO generated tok/s", fmt(median([r["gen_tokens_per_s"] for r in g["ours"]]), ".0f"),
                     fmt(median([r["gen_tokens_per_s"] for r in g["trl"]]), ".0f"), "", ""])
        rows.append(["GRPO first step s (command -> end)", fmt(median([r["first_step_s"] for r in g["ours"]]), ".1f"),
                     fmt(median([r["first_step_s"] for r in g["trl"]]), ".1f"), "", ""])
        rows.append(["GRPO overhead s (first - steady)", fmt(g["overhead_ours_s"], ".1f"), fmt(g["overhead_trl_s"], ".1f"),
                     fmt(g["overhead_trl_s"] / g["overhead_ours_s"] if g["overhead_ours_s"] else None), "ours <= TRL"])
        rows.append(["GRPO job s", fmt(median([r["job_s"] for r in g["ours"]]), ".1f"),
                     fmt(median([r["job_s"] for r in g["trl"]]), ".1f"), "", ""])
    if "sft" in res:
        s = res["sft"]
        for layout in ("unpacked", "packed"):
            rows.append([f"SFT real tok/s vs TRL {layout}", fmt(median([r["real_tokens_per_s"] for r in s["ours"]]), ".0f"),
                         fmt(median([r["real_tokens_per_s"] for r in s[layout]]), ".0f"), "", ""])
        rows.append(["SFT ratio vs TRL's best layout", "", s["best_trl_layout"], fmt(s["tokens_ratio"]),
                     f">= {TARGETS['sft_tokens_ratio']}"])
        rows.append(["SFT loss (mean of last 10 steps)", fmt(median([r["loss_last10"] for r in s["ours"]]), ".3f"),
                     fmt(median([r["loss_last10"] for r in s[s["best_trl_layout"]]]), ".3f"), "", ""])
    if "startup" in res:
        rows.append(["default pretrain: first step s", fmt(res["startup"]["first_step_s"], ".1f"), "", "",
                     f"<= {TARGETS['startup_first_step_s']:.0f}"])
    print(table(rows))
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    Path(a.out).write_text(json.dumps(res, indent=1))
    print(f"[peer] wrote {a.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
