"""The SFT race: wall-clock time to a held-out loss target, ours against TRL's SFTTrainer (issue 57, item 6).

    .venv/bin/python bench/sft_race.py [--sides ours,trl-unpacked,trl-packed] [--budget-s 600]
        [--save-every-s 20] [--seed 0]

Tokens per second alone do not say who reaches a quality first: the last peer bench saw TRL's
unpacked layout end at a lower *training* loss by taking five times our optimizer steps on the
same tokens. This race asks the question a user has: from the same weights, on the same data and
token budget, who first reaches a held-out loss, counting every second from the command.

* **The start** (off both clocks): a BPE tokenizer trained on the SFT rows
  (`elastic.data.tokenizer.train_bpe`, 1024 tokens: data.vocab_size of the config, the role
  markers special) and the `tiny` model drawn with `Transformer.init_weights(seed)`, written in
  Hugging Face format (`save_hf`). Both sides load that directory.
* **Data**: datasets/graded-tasks/python/sft.jsonl (2000 conversations), the loss on the
  assistant turns only, tokenized once by our chat code (`bench/trl_peer.py sft_rows`; TRL gets
  `input_ids` + `completion_mask`, so both sides train on identical token ids).
* **Ours** (`ours`, and the variants in OURS_SETS): `jobs/sft.py --config
  jobs/configs/sft-graded-python.yaml` with the start as `model.init_from`, its whole 800-step
  schedule (the warm start of the GRPO recipe stops it at step 350), in-run evaluation off, a
  checkpoint every `--save-every-s` s (`checkpoint.every_s`). 512-token packed rows with
  document-masked attention, 8 rows a step, AdamW(0.9, 0.95, wd 0.1), lr 3e-3, 10 warm-up steps,
  cosine to 0.1x. Its clock includes its data preparation (tokenize + pack) and Ray's start-up.
* **TRL** (the pins of bench/time_to_quality.py, its own environment): `SFTTrainer` with the
  same optimizer, peak lr, warm-up share (10/800 of its steps) and cosine to 0.1x, 8 rows per
  step, for the same number of real tokens as our schedule (`num_train_epochs` = our schedule's
  real tokens / the data's), in its two layouts: `trl-unpacked` (its default: one conversation per
  row, padded to the batch's longest) and `trl-packed` (BFD packing into 512-token rows,
  padding-free). 1 process x 2 torch threads, fp32. A callback writes the model every
  `--save-every-s` s (`save_pretrained`).
* The budget stops either side (SIGINT for ours, `should_training_stop` for TRL).

**One evaluator, off the clock**: every save is loaded by the same code
(`elastic.model.hf.from_pretrained`) and scored on the 256 held-out conversations
(datasets/graded-tasks/python/heldout_sft.jsonl, no task shared with train):

    heldout_loss(save) = sum over held-out assistant tokens of -log p(token) / their count
    se(save)           = sd over conversations of their own mean NLL / sqrt(256)
    wall_s(save)       = the save's step end - the side's command start
    target             = the best held-out loss of TRL's saves (either layout) within the budget
    time_to_target     = wall_s of a side's first save with heldout_loss <= target
    ratio              = ours' time_to_target / TRL's best time_to_target      (< 1: ours sooner)

Writes bench/results/sft_race.json and sft_race.png (held-out loss vs wall seconds, one side per
line, +-1 se bands) and deletes what it wrote elsewhere (`--keep DIR` keeps the runs).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Dict, List, Optional

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench.time_to_quality import TRL_ENV, TRL_PINS, kill_tree, our_saves, read_jsonl, trl_python  # noqa: E402

PY = sys.executable
SFT_CONFIG = "jobs/configs/sft-graded-python.yaml"
TRAIN = REPO / "datasets/graded-tasks/python/sft.jsonl"
HELDOUT = REPO / "datasets/graded-tasks/python/heldout_sft.jsonl"
THREADS = 2
# the config's schedule (jobs/configs/sft-graded-python.yaml), given to TRL in its own terms
LR, WARMUP, STEPS, MIN_LR, ROWS_PER_STEP, SEQ = 3e-3, 10, 800, 0.1, 8, 512
# Our candidate defaults: each keeps the schedule's token budget (steps x rows x 512).
OURS_SETS: Dict[str, List[str]] = {
    "ours": [],
    "ours-lr1e-3": ["train.lr=1.0e-3"],
    "ours-batch4": ["train.global_batch_size=4", "train.micro_batch_size=2", f"train.steps={2 * STEPS}",
                    f"train.warmup_steps={2 * WARMUP}"],
}
TRL_LAYOUTS = ("trl-unpacked", "trl-packed")


# ----------------------------------------------------------------------------- the start
def make_start(work: Path, seed: int) -> Path:
    """A tokenizer trained on the rows and the seeded tiny model, as one HF directory."""
    from elastic.config.dims import preset_model_dims
    from elastic.config.load import load_config
    from elastic.data.chat import ChatFormat, render_segments, row_messages
    from elastic.data.tokenizer import train_bpe
    from elastic.model.hf import _seeded_state, save_hf
    from elastic.model.llama import ModelArgs

    cfg = load_config(str(REPO / SFT_CONFIG), job="sft")
    chat = ChatFormat()
    texts = ["".join(str(t) for t, _ in render_segments(row_messages(json.loads(line), chat), chat) if t is not None)
             for line in TRAIN.read_text().splitlines() if line.strip()]
    tok = train_bpe(texts, cfg.data.vocab_size)
    tj = work / "tokenizer.json"
    tok.save(str(tj))
    args = ModelArgs(**preset_model_dims(cfg))
    hf = work / "start"
    save_hf(_seeded_state(args, seed), args, str(hf), str(tj))
    return hf


# ----------------------------------------------------------------------------- our side
def ours(work: Path, start: Path, a: argparse.Namespace, variant: str) -> Dict[str, Any]:
    rd = work / "runs" / variant
    sets = OURS_SETS[variant]
    steps = next((int(s.split("=")[1]) for s in sets if s.startswith("train.steps=")), STEPS)
    cmd = [PY, "jobs/sft.py", "--config", SFT_CONFIG, "--set", f"run.storage_path={work}/runs",
           "--set", f"run.name={variant}", "--set", f"run.seed={a.seed}", "--set", f"model.init_from={start}",
           "--set", "eval.every_steps=0", "--set", "train.until_step=0", "--set", f"checkpoint.every_steps={steps}",
           "--set", f"checkpoint.every_s={a.save_every_s}", "--set", "checkpoint.keep_last=1000",
           "--set", "train.log_every=100"] + [x for kv in sets for x in ("--set", kv)]
    t0 = time.time()
    with open(work / f"{variant}.log", "w") as f:
        p = subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT, cwd=REPO, start_new_session=True,
                             env=dict(os.environ, WANDB_MODE="disabled"))
    stopped = False
    while p.poll() is None:
        now = time.time() - t0
        if now >= a.budget_s and not stopped:
            stopped = True
            kill_tree(p, signal.SIGINT)
        if now >= a.budget_s + 60:
            kill_tree(p, signal.SIGKILL)
        time.sleep(0.5)
    wall = time.time() - t0
    kill_tree(p, signal.SIGKILL)
    if p.returncode and not stopped:
        tail = "\n".join((work / f"{variant}.log").read_text(errors="replace").splitlines()[-15:])
        raise RuntimeError(f"our SFT ({variant}) exited {p.returncode}:\n{tail}")
    saves = our_saves(rd, t0, a.budget_s)
    metrics = [r for r in read_jsonl(rd / "metrics.jsonl") if "step_s" in r]
    return {"command": cmd, "config": SFT_CONFIG, "overrides": sets, "wall_s": wall, "stopped_at_budget": stopped,
            "saves": saves, "steps_done": max((r["step"] for r in metrics), default=0),
            "real_tokens": sum(r["tokens"] for r in metrics), "schedule_steps": steps,
            "train_loss": [{"step": r["step"], "wall_s": r["time"] - t0, "loss": r["loss"]} for r in metrics]}


# ----------------------------------------------------------------------------- TRL's side
def trl(work: Path, start: Path, a: argparse.Namespace, layout: str, tokens: int) -> Dict[str, Any]:
    py = trl_python(Path(a.trl_env))
    out = work / layout
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.time()
    spec = {"hf": str(start), "tokenizer_json": str(work / "tokenizer.json"), "dir": str(out), "t0": t0,
            "budget_s": a.budget_s, "save_every_s": a.save_every_s, "seed": a.seed, "layout": layout, "tokens": tokens}
    (work / f"{layout}.json").write_text(json.dumps(spec))
    cmd = [str(py), str(Path(__file__).resolve()), "--child", str(work / f"{layout}.json")]
    with open(work / f"{layout}.log", "w") as log:
        p = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, cwd=REPO, start_new_session=True,
                             env=dict(os.environ, WANDB_MODE="disabled"))
        try:
            p.wait(timeout=a.budget_s + 180)
        except subprocess.TimeoutExpired:
            kill_tree(p, signal.SIGKILL)
            p.wait()
    wall = time.time() - t0
    if p.returncode:
        tail = "\n".join((work / f"{layout}.log").read_text(errors="replace").splitlines()[-15:])
        raise RuntimeError(f"TRL's SFTTrainer ({layout}) exited {p.returncode}:\n{tail}")
    saves = [{"path": str(out / f"save-{r['step']}"), "step": r["step"], "wall_s": r["time"] - t0}
             for r in read_jsonl(out / "saves.jsonl") if r["time"] - t0 <= a.budget_s + 1]
    logs = read_jsonl(out / "logs.jsonl")
    return {"command": cmd, "spec": {k: v for k, v in spec.items() if k != "t0"}, "trl_pins": TRL_PINS, "wall_s": wall,
            "saves": saves, "steps_done": max((r["step"] for r in logs), default=0),
            "real_tokens": max((r["tokens"] for r in logs), default=0),
            "train_loss": [{"step": r["step"], "wall_s": r["time"] - t0, "loss": r["loss"]} for r in logs if "loss" in r]}


def child(spec_path: str) -> None:
    """TRL's SFTTrainer (runs in the pinned environment, in its own process: imports count)."""
    spec = json.loads(Path(spec_path).read_text())
    import torch

    torch.set_num_threads(THREADS)
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import SFTConfig, SFTTrainer

    from bench.trl_peer import sft_rows

    t0, out = spec["t0"], Path(spec["dir"])
    rows = sft_rows(Path(spec["tokenizer_json"]), TRAIN)
    data_tokens = sum(len(r) for r in rows["input_ids"])
    ds = Dataset.from_dict(rows)
    tok = AutoTokenizer.from_pretrained(spec["hf"])
    model = AutoModelForCausalLM.from_pretrained(spec["hf"], dtype=torch.float32)
    packed = spec["layout"] == "trl-packed"
    seen = {"tokens": 0}

    class Race(TrainerCallback):
        last = time.time()

        def on_step_end(self, args, state, control, model=None, **kw):
            now = time.time()
            last_step = now - t0 >= spec["budget_s"] or seen["tokens"] >= spec["tokens"]
            if last_step:
                control.should_training_stop = True
            if last_step or now - Race.last >= spec["save_every_s"] or state.global_step >= state.max_steps:
                model.save_pretrained(out / f"save-{state.global_step}", safe_serialization=True)
                with open(out / "saves.jsonl", "a") as f:
                    f.write(json.dumps({"step": state.global_step, "time": now}) + "\n")
                Race.last = time.time()

        def on_log(self, args, state, control, logs=None, **kw):
            if logs and "loss" in logs:
                with open(out / "logs.jsonl", "a") as f:
                    f.write(json.dumps({"step": state.global_step, "time": time.time(), "loss": float(logs["loss"]),
                                        "tokens": seen["tokens"]}) + "\n")

    cfg = SFTConfig(output_dir=str(out), use_cpu=True, bf16=False, num_train_epochs=spec["tokens"] / data_tokens,
                    per_device_train_batch_size=ROWS_PER_STEP, gradient_accumulation_steps=1, learning_rate=LR,
                    lr_scheduler_type="cosine_with_min_lr", lr_scheduler_kwargs={"min_lr_rate": MIN_LR},
                    warmup_steps=WARMUP / STEPS, adam_beta1=0.9, adam_beta2=0.95, weight_decay=0.1, max_grad_norm=1.0,
                    logging_steps=10, save_strategy="no", report_to=[], seed=spec["seed"], dataloader_num_workers=0,
                    disable_tqdm=True, gradient_checkpointing=False, completion_only_loss=True, max_length=SEQ,
                    packing=packed, eos_token=tok.eos_token)
    trainer = SFTTrainer(model=model, args=cfg, train_dataset=ds, processing_class=tok, callbacks=[Race()])
    collate = trainer.data_collator

    def counting(examples):  # real (non-padding) tokens of every batch the trainer takes
        seen["tokens"] += int(sum(len(e["input_ids"]) for e in examples))
        return collate(examples)

    trainer.data_collator = counting
    trainer.train()


# ----------------------------------------------------------------------------- the evaluator
def evaluator(tokenizer_json: Path):
    """score(path) -> {heldout_loss, se}: the same code for every save (ours or TRL's)."""
    import torch

    from bench.trl_peer import sft_rows
    from elastic.model.hf import from_pretrained

    torch.set_num_threads(THREADS)
    rows = sft_rows(tokenizer_json, HELDOUT)
    order = sorted(range(len(rows["input_ids"])), key=lambda i: len(rows["input_ids"][i]))

    @torch.no_grad()
    def score(path: str) -> Dict[str, Any]:
        t = time.time()
        model = from_pretrained(path).eval()
        nll = [0.0] * len(order)
        count = [0] * len(order)
        for b in range(0, len(order), 32):
            idx = order[b:b + 32]
            width = max(len(rows["input_ids"][i]) for i in idx)
            ids = torch.zeros(len(idx), width, dtype=torch.long)  # right-padded: causal, so padding is never seen
            learned = torch.zeros(len(idx), width, dtype=torch.bool)
            for k, i in enumerate(idx):
                n = len(rows["input_ids"][i])
                ids[k, :n] = torch.tensor(rows["input_ids"][i])
                learned[k, :n] = torch.tensor(rows["completion_mask"][i], dtype=torch.bool)
            logp = torch.log_softmax(model(ids).float()[:, :-1], dim=-1)
            tok_nll = -logp.gather(-1, ids[:, 1:, None])[..., 0]
            w = learned[:, 1:]
            for k, i in enumerate(idx):
                nll[i] = float(tok_nll[k][w[k]].sum())
                count[i] = int(w[k].sum())
        per_row = [s / c for s, c in zip(nll, count)]
        return {"heldout_loss": sum(nll) / sum(count), "se": statistics.stdev(per_row) / math.sqrt(len(per_row)),
                "eval_s": round(time.time() - t, 1)}

    return score


def time_to(curve: List[Dict[str, Any]], target: float) -> Optional[float]:
    return next((c["wall_s"] for c in curve if c["heldout_loss"] <= target + 1e-12), None)


def plot(res: Dict[str, Any], path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.2))
    for key, side in res["sides"].items():
        c = side["curve"]
        x = [p["wall_s"] for p in c]
        y = [p["heldout_loss"] for p in c]
        se = [p["se"] for p in c]
        (line,) = ax.plot(x, y, marker="o", ms=3, label=key)
        ax.fill_between(x, [v - s for v, s in zip(y, se)], [v + s for v, s in zip(y, se)], color=line.get_color(), alpha=0.2)
    if res.get("target") is not None:
        ax.axhline(res["target"], color="grey", ls="--", lw=1, label=f"target (TRL's best) {res['target']:.3f}")
    ax.set_yscale("log")
    ax.set_xlabel("wall seconds from the command (start-up included)")
    ax.set_ylabel("held-out loss (assistant tokens, nats)")
    ax.set_title("SFT: held-out loss vs wall clock, 2 CPU cores")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sides", default="ours," + ",".join(TRL_LAYOUTS),
                    help=f"comma-separated: any of {', '.join(list(OURS_SETS) + list(TRL_LAYOUTS))}")
    ap.add_argument("--budget-s", type=float, default=600.0, help="each side's wall seconds from its command")
    ap.add_argument("--save-every-s", type=float, default=20.0)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--trl-env", default=str(TRL_ENV))
    ap.add_argument("--out", default=str(REPO / "bench/results/sft_race.json"))
    ap.add_argument("--keep", default="", help="keep the run directories under this path (default: deleted)")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.child:
        child(a.child)
        return 0
    sides_wanted = [s for s in a.sides.split(",") if s]
    bad = [s for s in sides_wanted if s not in OURS_SETS and s not in TRL_LAYOUTS]
    if bad:
        ap.error(f"--sides: unknown {', '.join(bad)}")
    work = Path(a.keep) if a.keep else Path(tempfile.mkdtemp(prefix="sft-race-"))
    work.mkdir(parents=True, exist_ok=True)
    t_bench = time.time()
    try:
        if any(s in TRL_LAYOUTS for s in sides_wanted):
            trl_python(Path(a.trl_env))  # installed before any clock starts
        start = make_start(work, a.seed)
        score = evaluator(work / "tokenizer.json")
        first = score(str(start))
        sides: Dict[str, Dict[str, Any]] = {}
        budget_tokens = None
        # ours first: its schedule's real tokens are TRL's token budget
        for key in sorted(sides_wanted, key=lambda s: s in TRL_LAYOUTS):
            print(f"[sft-race] {key}: {a.budget_s:.0f} s budget", flush=True)
            if key in OURS_SETS:
                sides[key] = ours(work, start, a, key)
                if key == "ours" or budget_tokens is None:
                    budget_tokens = sides[key]["real_tokens"] if not sides[key]["stopped_at_budget"] else None
            else:
                if budget_tokens is None:  # ours not run (or cut by the budget): the schedule at full rows, steps x rows x seq_len
                    budget_tokens = STEPS * ROWS_PER_STEP * SEQ
                sides[key] = trl(work, start, a, key, budget_tokens)
            print(f"[sft-race] {key}: {len(sides[key]['saves'])} saves, {sides[key]['steps_done']} steps, "
                  f"{sides[key]['real_tokens']:,} tokens in {sides[key]['wall_s']:.0f} s", flush=True)
        for key, side in sides.items():  # the evaluator, off both clocks
            side["curve"] = [{"step": 0, "wall_s": 0.0, **{k: first[k] for k in ("heldout_loss", "se")}}]
            for s in side["saves"]:
                r = score(s["path"])
                side["curve"].append({"step": s["step"], "wall_s": round(s["wall_s"], 1),
                                      "heldout_loss": round(r["heldout_loss"], 5), "se": round(r["se"], 5)})
            best = min(side["curve"], key=lambda c: c["heldout_loss"])
            print(f"[sft-race] {key}: best held-out loss {best['heldout_loss']:.4f} at {best['wall_s']:.0f} s", flush=True)
            del side["saves"]
        trl_keys = [k for k in sides if k in TRL_LAYOUTS]
        target = min((c["heldout_loss"] for k in trl_keys for c in sides[k]["curve"][1:]), default=None)
        times = {k: time_to(s["curve"][1:], target) for k, s in sides.items()} if target is not None else {}
        trl_best = min((times[k] for k in trl_keys if times.get(k) is not None), default=None)
        res = {"what": "SFT race: wall seconds to a held-out loss target from the same start, ours vs TRL SFTTrainer",
               "formulas": {"heldout_loss": "sum of -log p over held-out assistant tokens / their count",
                            "se": "sd over the 256 conversations of their mean NLL / sqrt(256)",
                            "target": "TRL's best held-out loss over its saves (either layout)",
                            "ratio": "ours' time_to_target / TRL's best time_to_target (< 1: ours sooner)"},
               "machine": f"{os.cpu_count()} CPUs", "budget_s": a.budget_s, "save_every_s": a.save_every_s,
               "seed": a.seed, "token_budget": budget_tokens, "start_heldout_loss": first["heldout_loss"],
               "target": target, "time_to_target_s": times,
               "ratio": {k: round(times[k] / trl_best, 3) for k in sides if k in OURS_SETS and times.get(k) and trl_best},
               "sides": sides, "command": " ".join([Path(PY).name, "bench/sft_race.py", *(argv or sys.argv[1:])]),
               "bench_wall_s": round(time.time() - t_bench, 1), "date": time.strftime("%Y-%m-%d")}
        out = Path(a.out)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(res, indent=1) + "\n")
        plot(res, out.with_suffix(".png"))
        rows = [["side", "best loss", "time to target s", "ratio"]]
        for k, s in sides.items():
            rows.append([k, f"{min(c['heldout_loss'] for c in s['curve']):.4f}", str(times.get(k)), str(res["ratio"].get(k, "-"))])
        w = [max(len(r[i]) for r in rows) for i in range(4)]
        print("\n".join("  ".join(c.ljust(w[i]) for i, c in enumerate(r)) for r in rows))
        print(f"[sft-race] target {target}; wrote {out} and {out.with_suffix('.png')}")
    finally:
        if not a.keep:
            shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
