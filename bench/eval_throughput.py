"""Evaluation throughput: our evaluator (elastic/eval) against lm-evaluation-harness's HF backend
on the same exported model, the same items and the same machine, in one run.

The model is a random Llama of `--dim` x `--layers` (`--seq` context) with a byte-level BPE
trained here (`--vocab`, on the shipped eval files' text), exported with
elastic.model.hf.save_hf into a temporary directory that both sides load:

  lm-eval     lm_eval.models.huggingface.HFLM(pretrained=<dir>, dtype=float32, batch_size=
              `--lm-eval-batch`), constructed once; timed: `lm_eval.evaluator.evaluate(lm,
              task_dict)` on a task dict loaded beforehand, i.e. lm-eval's request building
              (contexts, tokenization), scoring and metrics; not timed: the model load and the
              dataset load (TaskManager.load). Its defaults stay on, among them logits_cache,
              which runs a context once for all of an item's one-token continuations (MMLU's
              " A".." D"): lm-eval already shares contexts there.
  ours        elastic.model.hf.from_pretrained + TokenizerView.from_file, ItemEvaluator(
              token_budget=`--token-budget`); timed: few-shot contexts (fewshot_contexts),
              ItemEvaluator.run (encoding, request building, loglik.score) and metrics.aggregate.
  no-share    ours with loglik.score(share=False): one tree per (item, choice), the same
              packing and batching, no context computed once for several continuations
              (neither an item's choices nor a few-shot prefix common to items). It shows what the shared-context trees buy; perplexity has one
              continuation per window, so it is not run there.

Tasks (the shipped files, datasets/eval; every row by default, `--repeat R` replicates them):
hellaswag and arc_easy (multiple choice, 0-shot), mmlu_elementary_mathematics (5-shot, the first
5 rows of the dev file: lm-eval gets fewshot_split dev and sampler first_n; every item's context
must equal lm-eval's) and heldout_text (rolling perplexity; lm-eval's wikitext task over the
same texts).

Timing: per task, one untimed warm-up call per system (that call's per-item numbers are the
parity check), then `--trials` timed calls, systems alternating, best quoted. items/s = items
/ wall seconds (CUDA synchronised). torch threads are the same for every system (`--threads`,
default all cores). Every ratio is ours / lm-eval within this run. Every trial's seconds are in
the JSON (trial_seconds): on a shared machine single trials can be several times slower.

Parity: per task the largest |log-likelihood ours - lm-eval| over every choice of every item
(perplexity: per document). A run where it exceeds `--tol` (perplexity: the larger of tol x
max(1, tokens / 100) and 1e-6 x |ll|, lm-eval's sum being float32; as tests/test_eval_parity.py)
exits 1: no speedup is reported for different numbers.

    python bench/eval_throughput.py                       # dim 256, 4 layers, every row, best of 5
    python bench/eval_throughput.py --repeat 4 --lm-eval-batch auto
    python bench/eval_throughput.py --smoke               # tiny model, 8 items per task, < 1 min

Prints a table and writes bench/results/eval_throughput.json; the model, the task files and
lm-eval's datasets cache live in a temporary directory deleted at the end.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import dataclasses
import io
import json
import logging
import math
import os
import platform
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Dict, List

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import torch  # noqa: E402

# (our task, lm-eval's task, what it measures)
TASKS = [("hellaswag", "hellaswag", "multiple choice, 0-shot"),
         ("arc_easy", "arc_easy", "multiple choice, 0-shot"),
         ("mmlu_elementary_mathematics", "mmlu", "multiple choice, 5-shot first_n from dev"),
         ("heldout_text", "wikitext", "rolling perplexity")]
MMLU_SUBJECT = "elementary_mathematics"


# --- the model ---

def tokenizer_texts() -> List[str]:
    """Every string of the shipped eval files plus the project's docs: what the BPE learns from."""
    out: List[str] = []

    def strings(v):
        if isinstance(v, str):
            out.append(v)
        elif isinstance(v, list):
            for x in v:
                strings(x)
        elif isinstance(v, dict):
            for x in v.values():
                strings(x)

    for p in sorted((REPO / "datasets" / "eval").glob("*.jsonl")):
        for line in p.read_text().splitlines():
            if line.strip():
                strings(json.loads(line))
    for p in sorted((REPO / "docs").glob("*.md")) + [REPO / "README.md"]:
        if p.is_file():
            out.extend(x for x in p.read_text().split("\n\n") if x.strip())
    return out


def build_model_dir(path: Path, dim: int, layers: int, seq: int, vocab: int, seed: int = 0, std: float = 0.15) -> Dict[str, Any]:
    """tests/lm_eval_ref.tiny_llama_dir at a chosen size: random weights N(0, std) scaled by
    1/sqrt(fan_in/64) (norms 1, so choices' log-likelihoods differ clearly), our BPE, save_hf."""
    from elastic.data.tokenizer import train_bpe
    from elastic.model import ModelArgs, Transformer
    from elastic.model.hf import save_hf

    path.mkdir(parents=True, exist_ok=True)
    tok_dir = path.parent / f".{path.name}-tokenizer"
    tok_dir.mkdir(exist_ok=True)
    tok = train_bpe(tokenizer_texts(), vocab)
    tok.save(str(tok_dir / "tokenizer.json"))
    heads = max(1, dim // 64)
    args = ModelArgs(vocab_size=tok.get_vocab_size(), dim=dim, n_layers=layers, n_heads=heads,
                     n_kv_heads=max(1, heads // 2), ffn_hidden=-(-8 * dim // 3 // 32) * 32, max_seq_len=seq,
                     tie_embeddings=False)
    model = Transformer(args)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for _, p in model.named_parameters():
            if p.ndim >= 2:
                p.copy_(torch.randn(p.shape, generator=g) * std / math.sqrt(max(1.0, p.shape[-1] / 64)))
            else:
                p.fill_(1.0)
    save_hf(dict(model.named_parameters()), args, str(path), str(tok_dir / "tokenizer.json"))
    shutil.rmtree(tok_dir)
    return {"vocab_size": args.vocab_size, "vocab_requested": vocab, "dim": dim, "n_layers": layers, "n_heads": heads,
            "n_kv_heads": args.n_kv_heads, "ffn_hidden": args.ffn_hidden, "max_seq_len": seq,
            "params": model.num_params(exclude_embeddings=False)}


# --- the items, both sides ---

@dataclasses.dataclass
class Task:
    ours: str
    theirs: str
    what: str
    spec: Any
    docs: list          # our Docs, replicated (ids made unique)
    pool: list          # few-shot pool (our side)
    same_file: bool
    lm_cfg: dict        # lm-eval task config (tests/lm_eval_ref.lm_eval_task_yamls + local files)


def prepare(ours: str, theirs: str, what: str, n: int, repeat: int, work: Path) -> Task:
    """The first `n` items (0: all) of the shipped file, `repeat` times over, for both sides: our
    Docs, and for lm-eval a JSONL of the same rows (the raw lines our reader accepted)."""
    from elastic.eval.formats import read_docs
    from elastic.eval.spec import find_spec
    from tests.lm_eval_ref import lm_eval_task_yamls

    spec = find_spec(ours)
    if spec.num_fewshot and spec.fewshot_sampler != "first_n":
        # lm-eval's MMLU (tasks/mmlu/default/_default_template_yaml) takes the dev split's first
        # rows in order; the shipped MMLU YAML says first_n too, and a user YAML that left the
        # sampler at random would give other contexts than lm-eval's: both sides use first_n here.
        spec = dataclasses.replace(spec, fewshot_sampler="first_n")
    docs, _ = read_docs(spec.data, spec)
    docs = docs[:n] if n else docs
    pool, same = docs, True
    if spec.num_fewshot:
        if spec.fewshot_data:
            pool, _ = read_docs(spec.fewshot_data, spec)
            same = False
        else:
            pool, _ = read_docs(spec.data, spec)
    lines = Path(spec.data).read_text().splitlines()
    rows = [json.loads(lines[int(d.where.rsplit(":", 1)[1]) - 1]) for d in docs]
    if theirs == "wikitext":
        rows = [{"text": d.text} for d in docs]
        assert all(r["text"] == d.text for r, d in zip(rows, docs))
    data = work / f"{ours}.jsonl"
    with open(data, "w") as f:
        for _ in range(repeat):
            for r in rows:
                f.write(json.dumps(r) + "\n")
    all_docs = [dataclasses.replace(d, id=f"{d.id}#{k}" if repeat > 1 else d.id) for k in range(repeat) for d in docs]
    cfg = lm_eval_task_yamls({theirs: str(data)}, mmlu_subject=MMLU_SUBJECT)[theirs]
    if spec.num_fewshot:
        assert theirs == "mmlu" and spec.fewshot_sampler == "first_n" and not same, (ours, spec)
        cfg["dataset_kwargs"]["data_files"]["dev"] = os.path.abspath(spec.fewshot_data)
        cfg.update(fewshot_split="dev", num_fewshot=spec.num_fewshot, fewshot_config={"sampler": "first_n"})
    else:
        cfg["num_fewshot"] = 0
    return Task(ours, theirs, what, spec, all_docs, pool, same, cfg)


def load_lm_eval_task(task: Task, work: Path):
    """lm-eval's task dict for one task, from a YAML written under `work` (as run_lm_eval does),
    with simple_evaluate's per-task set-up (few-shot seed)."""
    import yaml
    from lm_eval.tasks import TaskManager

    import lm_eval
    from tests.lm_eval_ref import _TASK_MODULES, _Dumper, _fn_refs

    tdir = work / f"tasks_{task.theirs}"
    tdir.mkdir(parents=True, exist_ok=True)
    pkg_tasks = Path(lm_eval.__file__).parent / "tasks"
    for dst, src in _TASK_MODULES.items():
        shutil.copyfile(pkg_tasks / src, tdir / dst)
    cfg = _fn_refs(copy.deepcopy(task.lm_cfg))
    cfg["task"] = task.theirs
    cfg["dataset_kwargs"]["cache_dir"] = str(work / "hf_cache" / "datasets")
    with open(tdir / f"{task.theirs}.yaml", "w") as f:
        yaml.dump(cfg, f, Dumper=_Dumper, sort_keys=False, allow_unicode=True)
    loaded = TaskManager(include_path=str(tdir), include_defaults=False).load([task.theirs])
    for t in loaded["tasks"].values():
        t.set_fewshot_seed(seed=1234)
    return loaded


# --- the systems ---

def sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def run_lm_eval_once(lm, loaded, log_samples: bool):
    """One lm-eval evaluation; its progress bars (tqdm on stderr, not switchable from here) go
    to a string."""
    from lm_eval.evaluator import evaluate

    with contextlib.redirect_stderr(io.StringIO()):
        return evaluate(lm=lm, task_dict=loaded, bootstrap_iters=0, log_samples=log_samples)


def run_ours(ev, task: Task):
    from elastic.eval.metrics import aggregate
    from elastic.eval.requests import fewshot_contexts

    ctxs = fewshot_contexts(task.spec, task.docs, task.pool, task.same_file) if task.spec.type != "perplexity" \
        else [""] * len(task.docs)
    recs = ev.run(task.spec, [(i, d, c) for i, (d, c) in enumerate(zip(task.docs, ctxs))])
    return ctxs, recs, aggregate(task.spec, recs)


def run_no_share(ev, task: Task):
    """Ours with `share=False`: one tree per (item, choice), no context computed once for
    several continuations (same packing and batching)."""
    from elastic.eval import loglik
    from elastic.eval.requests import fewshot_contexts

    ctxs = fewshot_contexts(task.spec, task.docs, task.pool, task.same_file)
    reqs = ev.requests(task.spec, [(i, d, c) for i, (d, c) in enumerate(zip(task.docs, ctxs))])
    return [x[0] for r in loglik.score(ev.model, reqs, ev.max_len, ev.token_budget, share=False) for x in r]


def timed(fn, device: str):
    sync(device)
    t0 = time.perf_counter()
    out = fn()
    sync(device)
    return time.perf_counter() - t0, out


# --- parity ---

def parity(task: Task, ctxs, recs, ref) -> Dict[str, Any]:
    """max |Δll| and the tolerance check; few-shot contexts must be equal item by item."""
    assert len(ref) == len(recs) == len(task.docs), (task.ours, len(ref), len(recs))
    worst, ok = 0.0, True
    for c, r, x in zip(ctxs, recs, ref):
        if task.spec.type == "perplexity":
            d = abs(r["ll"] - x["lls"][0])
            # float32 reference: see tests/test_eval_parity.py ppl_tolerance (1e-6 of |ll| = 16 ulps)
            ok &= d <= max(TOL * max(1.0, r["tokens"] / 100), 1e-6 * abs(x["lls"][0]))
        else:
            assert c == x["arguments"][0][0], f"{task.ours} item {r['index']}: context differs from lm-eval's:\n{c!r}\n{x['arguments'][0][0]!r}"
            assert len(r["lls"]) == len(x["lls"])
            d = max(abs(a - b) for a, b in zip(r["lls"], x["lls"]))
            ok &= d <= TOL
        worst = max(worst, d)
    return {"max_abs_dll": worst, "within_tol": bool(ok)}


TOL = 1e-4


# --- main ---

def main(argv=None) -> int:
    global TOL
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dim", type=int, default=256)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--seq", type=int, default=512, help="context window (max_position_embeddings; lm-eval's max_length)")
    ap.add_argument("--vocab", type=int, default=None, help="BPE vocabulary asked for (the text may give fewer; default 2048, smoke 1024)")
    ap.add_argument("--tasks", default=",".join(t[0] for t in TASKS), help="subset of our task names")
    ap.add_argument("--items", type=int, default=0, help="first N rows of each shipped file (0: all)")
    ap.add_argument("--repeat", type=int, default=1, help="replicate the rows R times (a longer measurement)")
    ap.add_argument("--trials", type=int, default=5, help="timed calls per system after the warm-up (best quoted)")
    ap.add_argument("--lm-eval-batch", default="16", help="HFLM batch_size (an int or 'auto')")
    ap.add_argument("--token-budget", type=int, default=8192, help="ours: tokens per scoring forward")
    ap.add_argument("--no-share", action=argparse.BooleanOptionalAction, default=True,
                    help="also time ours with one request per choice (multiple-choice tasks)")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--threads", type=int, default=0, help="torch CPU threads for every system (0: all cores)")
    ap.add_argument("--tol", type=float, default=TOL, help="largest |Δll| accepted (perplexity: x max(1, tokens/100), at least 1e-6 x |ll|)")
    ap.add_argument("--smoke", action="store_true", help="dim 64, 2 layers, vocab 1024, 8 items per task, 1 trial")
    ap.add_argument("--out", default=str(REPO / "bench" / "results" / "eval_throughput.json"))
    a = ap.parse_args(argv)
    if a.smoke:
        a.dim, a.layers, a.items, a.repeat, a.trials = 64, 2, 8, 1, 1
        a.vocab = a.vocab or 1024
    a.vocab = a.vocab or 2048
    TOL = a.tol
    torch.set_num_threads(a.threads or os.cpu_count() or 1)
    names = [t for t in a.tasks.split(",") if t]
    known = {t[0]: t for t in TASKS}
    assert set(names) <= set(known), f"--tasks from {', '.join(known)}"
    for name in ("lm-eval", "lm_eval", "datasets", "transformers"):
        logging.getLogger(name).setLevel(logging.ERROR)
    scratch = Path(tempfile.mkdtemp(prefix="eval-bench-"))
    try:
        return _run(a, [known[n] for n in names], scratch)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def _run(a, tasks, scratch: Path) -> int:
    from tests.lm_eval_ref import _offline, _records

    t0 = time.perf_counter()
    model_info = build_model_dir(scratch / "model", a.dim, a.layers, a.seq, a.vocab)
    model_dir = str(scratch / "model")
    with _offline(str(scratch / "hf_cache")):
        import datasets

        datasets.disable_progress_bars()  # one table, not a progress bar per task load
        from lm_eval.models.huggingface import HFLM

        from elastic.eval.evaluate import ItemEvaluator, TokenizerView
        from elastic.model.hf import from_pretrained

        bs = a.lm_eval_batch if a.lm_eval_batch == "auto" else int(a.lm_eval_batch)
        lm = HFLM(pretrained=model_dir, dtype="float32", device=a.device, batch_size=bs)
        model = from_pretrained(model_dir, device=a.device, dtype=torch.float32).eval()
        ev = ItemEvaluator(model, TokenizerView.from_file(os.path.join(model_dir, "tokenizer.json")),
                           int(model.args.max_seq_len), token_budget=a.token_budget)
        print(f"device {a.device} ({torch.cuda.get_device_name(0) if a.device == 'cuda' else platform.processor() or 'cpu'}), "
              f"float32, {torch.get_num_threads()} torch threads; model dim {a.dim} x {a.layers} layers, "
              f"{model_info['n_heads']} heads ({model_info['n_kv_heads']} kv), vocab {model_info['vocab_size']} (BPE asked "
              f"{a.vocab}), seq {a.seq}, {model_info['params'] / 1e6:.2f}M params; lm-eval batch_size {a.lm_eval_batch}, "
              f"ours token_budget {a.token_budget}; best of {a.trials} after a warm-up", flush=True)
        head = (f"{'task':<28} {'items':>5} {'lm-eval it/s':>12} {'ours it/s':>10} {'ratio':>6} "
                f"{'no-share it/s':>13} {'ratio':>6} {'max |Δll|':>10}")
        print(head)
        rows, all_ok = [], True
        data_dir = scratch / "data"
        data_dir.mkdir()
        for ours, theirs, what in tasks:
            task = prepare(ours, theirs, what, a.items, a.repeat, data_dir)
            tl = time.perf_counter()
            loaded = load_lm_eval_task(task, scratch)
            load_s = time.perf_counter() - tl
            # warm-up calls: their per-item numbers are the parity check
            res = run_lm_eval_once(lm, loaded, log_samples=True)
            ref = _records(res["samples"][theirs], res["configs"][theirs]["output_type"])
            ctxs, recs, agg = run_ours(ev, task)
            par = parity(task, ctxs, recs, ref)
            share = a.no_share and task.spec.type == "multiple_choice"
            if share:
                flat = run_no_share(ev, task)
                ours_flat = [x for r in recs for x in r["lls"]]
                par["no_share_max_abs_dll_vs_ours"] = max(abs(x - y) for x, y in zip(flat, ours_flat))
            all_ok &= par["within_tol"]
            trials = {"lm_eval": [], "ours": [], "no_share": []}
            for _ in range(a.trials):  # alternating, so that a change in machine load hits every system
                trials["lm_eval"].append(timed(lambda: run_lm_eval_once(lm, loaded, False), a.device)[0])
                trials["ours"].append(timed(lambda: run_ours(ev, task), a.device)[0])
                if share:
                    trials["no_share"].append(timed(lambda: run_no_share(ev, task), a.device)[0])
            best = {k: min(v, default=math.inf) for k, v in trials.items()}
            n = len(task.docs)
            ips = {k: (n / v if v < math.inf else None) for k, v in best.items()}
            ratio = ips["ours"] / ips["lm_eval"]
            ratio_ns = ips["no_share"] / ips["lm_eval"] if ips["no_share"] else None
            theirs_agg = res["results"][theirs]
            row = {"task": ours, "lm_eval_task": theirs, "what": what, "items": n,
                   "continuations": sum(len(d.choices) for d in task.docs) if share else None,
                   "seconds": {k: (v if v < math.inf else None) for k, v in best.items()}, "trial_seconds": trials,
                   "items_per_s": ips, "ratio": ratio, "ratio_no_share": ratio_ns,
                   "sharing_gain": (ips["ours"] / ips["no_share"]) if ips["no_share"] else None,
                   "lm_eval_task_load_s": load_s, **par,
                   "metrics": {"ours": agg, "lm_eval": {k: v for k, v in theirs_agg.items() if k != "alias"}}}
            rows.append(row)
            ns = f"{ips['no_share']:>13.1f} {ratio_ns:>5.2f}x" if share else f"{'-':>13} {'-':>6}"
            print(f"{ours:<28} {n:>5} {ips['lm_eval']:>12.1f} {ips['ours']:>10.1f} {ratio:>5.2f}x {ns} "
                  f"{par['max_abs_dll']:>10.2e}{'' if par['within_tol'] else '  OVER TOLERANCE'}", flush=True)
    tot = {k: sum(r["seconds"][k] for r in rows) for k in ("lm_eval", "ours")}
    items = sum(r["items"] for r in rows)
    overall = (items / tot["ours"]) / (items / tot["lm_eval"])
    print(f"{'all tasks':<28} {items:>5} {items / tot['lm_eval']:>12.1f} {items / tot['ours']:>10.1f} {overall:>5.2f}x")
    print("items/s = items / wall seconds of one call, best of the trials. lm-eval: evaluate(HFLM, task dict) = its request "
          "building (contexts, tokenization) + scoring + metrics, model and dataset loads excluded (HFLM logits_cache on: "
          "one-token continuations such as MMLU's letters share their context there too). ours: fewshot_contexts + "
          "ItemEvaluator.run + metrics.aggregate. no-share: ours with share=False (one tree per item x choice). ratio = x it/s / lm-eval it/s "
          "in this run. max |Δll| = largest |ours - lm-eval| log-likelihood per choice (perplexity: per document).")
    env = {"torch": torch.__version__, "python": platform.python_version(), "cpu_count": os.cpu_count(),
           "threads": torch.get_num_threads(), "device": a.device, "dtype": "float32"}
    for mod in ("lm_eval", "transformers"):
        try:
            env[mod] = __import__(mod).__version__
        except (ImportError, AttributeError):
            pass
    if a.device == "cuda":
        env["gpu"] = torch.cuda.get_device_name(0)
    settings = {k: getattr(a, k) for k in ("dim", "layers", "seq", "vocab", "items", "repeat", "trials", "lm_eval_batch",
                                           "token_budget", "tol", "smoke")}
    os.makedirs(os.path.dirname(os.path.abspath(a.out)), exist_ok=True)
    with open(a.out, "w") as f:
        json.dump({"environment": env, "settings": settings, "model": model_info, "results": rows,
                   "overall": {"items": items, "seconds": tot, "ratio": overall}, "all_within_tol": all_ok,
                   "wall_s": time.perf_counter() - t0, "scratch": str(scratch)}, f, indent=2)
    print(f"wrote {a.out}")
    return 0 if all_ok else 1


if __name__ == "__main__":
    sys.exit(main())
