"""Quick pass rates of a checkpoint on the python-tasks or math-tasks sets (no Ray, one process).

    .venv/bin/python datasets/python-tasks/check_policy.py runs/sft-python-tasks
    .venv/bin/python datasets/python-tasks/check_policy.py runs/sft-math-tasks --tasks math
        [--samples 4] [--temperature 0.8,1.0] [--max-new-tokens 160] [--show 3] [--json out.json]

For each split (train, held-out) it reports greedy pass@1 and, with --samples k at each given
temperature, the mean pass rate over k samples per task (pass@1 estimated from k samples) and
the share of tasks with at least one pass among the k. The prompt is rendered exactly as SFT and GRPO render it (elastic/data/chat.py,
built-in template unless the run's tokenizer has a chat template).

Python: the last ```python (or untagged) block of the completion is run with the task's test
in a child process with a timeout, NOT sandboxed: use it only on your own model's output on
your own machine (the reward service's python_tests verifier is the sandboxed path).
Math: the number after the last '####' must equal the target.
"""

from __future__ import annotations

import argparse
import concurrent.futures as cf
import glob
import json
import os
import re
import subprocess
import sys
import tempfile
from typing import List, Optional

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, REPO)

_BLOCK = re.compile(r"```(?:python|py)?[ \t]*\n(.*?)```", re.S)
_FINAL = re.compile(r"####\s*(-?[\d,]*\.?\d+)")


def extract_code(text: str) -> Optional[str]:
    blocks = _BLOCK.findall(text)
    return blocks[-1] if blocks else None


def python_passes(task: dict, completion: str, timeout_s: float = 5.0) -> bool:
    code = extract_code(completion)
    if code is None:
        return False
    src = code + "\n\n" + task["test"] + f"\n\ncheck({task['entry_point']})\n"
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "t.py")
        with open(path, "w") as f:
            f.write(src)
        try:
            r = subprocess.run([sys.executable, "-I", path], cwd=d, capture_output=True, timeout=timeout_s,
                               env={"PATH": "/usr/bin:/bin"})
        except subprocess.TimeoutExpired:
            return False
    return r.returncode == 0


def math_passes(task: dict, completion: str) -> bool:
    m = _FINAL.findall(completion)
    return bool(m) and m[-1].replace(",", "") == task["target"]


def latest_step(run: str) -> str:
    steps = sorted(glob.glob(os.path.join(run, "step_*")))
    if not steps:
        raise SystemExit(f"{run}: no step_* checkpoint")
    return steps[-1]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("run", help="run directory (runs/<name>) or a step_N directory")
    ap.add_argument("--tasks", choices=["python", "math"], default="python")
    ap.add_argument("--samples", type=int, default=4, help="samples per task at --temperature (0: greedy only)")
    ap.add_argument("--temperature", default="0.8", help="sampling temperature(s), comma-separated")
    ap.add_argument("--max-new-tokens", type=int, default=160)
    ap.add_argument("--show", type=int, default=0, help="print this many greedy held-out completions")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", help="write per-task results here")
    ap.add_argument("--data", help="directory with train.jsonl and heldout.jsonl (default: the shipped set)")
    ap.add_argument("--splits", default="train,heldout", help="comma-separated: train, heldout")
    args = ap.parse_args(argv)

    import torch
    from tokenizers import Tokenizer

    from elastic.data.chat import ChatFormat, prompt_segments, tokenize_segments
    from elastic.data.tokenizer import EOS, read_tokenizer_config
    from elastic.generation.generate import generate
    from elastic.model.hf import from_pretrained

    torch.set_num_threads(max(1, os.cpu_count() or 1))
    step = args.run if os.path.isfile(os.path.join(args.run, "train_state.json")) else latest_step(args.run)
    run = os.path.dirname(os.path.abspath(step))
    tok_path = os.path.join(run, "tokenizer.json")
    tok = Tokenizer.from_file(tok_path)
    cfg = read_tokenizer_config(tok_path)
    template = cfg.get("chat_template") if isinstance(cfg.get("chat_template"), str) else None
    fmt = ChatFormat(chat_template=template)
    eos = tok.token_to_id(EOS)
    model = from_pretrained(step).eval()

    data_dir = args.data or os.path.join(REPO, "datasets", "python-tasks" if args.tasks == "python" else "math-tasks")
    passes = python_passes if args.tasks == "python" else math_passes
    report = {"checkpoint": step, "tasks": args.tasks}
    per_task = []
    for split in args.splits.split(","):
        rows = [json.loads(line) for line in open(os.path.join(data_dir, f"{split}.jsonl"))]
        prompts = [tokenize_segments(prompt_segments([{"role": "user", "content": r["instruction"]}], fmt),
                                     tok, eos)[0] for r in rows]

        def run_gen(temp: float, k: int) -> List[List[str]]:
            ps = [p for p in prompts for _ in range(k)]
            outs = generate(model, ps, args.max_new_tokens, temperature=temp, stop_token_ids=[eos],
                            seed=args.seed, max_batch=64)
            texts = [tok.decode([t for t in o.tokens if t != eos], skip_special_tokens=True) for o in outs]
            return [texts[i * k:(i + 1) * k] for i in range(len(rows))]

        def score(groups: List[List[str]]) -> List[List[bool]]:
            with cf.ThreadPoolExecutor(8) as ex:
                futs = [[ex.submit(passes, r, t) for t in g] for r, g in zip(rows, groups)]
                return [[f.result() for f in g] for g in futs]

        greedy = run_gen(0.0, 1)
        g_ok = score(greedy)
        res = {"tasks": len(rows), "greedy_pass@1": sum(o[0] for o in g_ok) / len(rows)}
        sampled_ok = {}
        for temp in ([float(t) for t in args.temperature.split(",")] if args.samples > 0 else []):
            s_ok = sampled_ok[temp] = score(run_gen(temp, args.samples))
            n = len(rows)
            res[f"T{temp}"] = {"mean": sum(sum(o) for o in s_ok) / (n * args.samples),
                               f"any_of_{args.samples}": sum(any(o) for o in s_ok) / n,
                               "tasks_all_pass": sum(all(o) for o in s_ok), "tasks_none_pass": sum(not any(o) for o in s_ok)}
        report[split] = res
        for i, r in enumerate(rows):
            per_task.append({"split": split, "task_id": r["task_id"], "greedy": g_ok[i][0], "greedy_text": greedy[i][0],
                             "sampled": {str(t): ok[i] for t, ok in sampled_ok.items()}})
        if split == "heldout" and args.show:
            for r, g, ok in list(zip(rows, greedy, g_ok))[:args.show]:
                print(f"--- {r['task_id']} ({'pass' if ok[0] else 'fail'})\n{g[0]}")
    print(json.dumps(report, indent=1))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"report": report, "tasks": per_task}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
