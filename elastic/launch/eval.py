"""Evaluate checkpoints on tasks, sharded over Ray workers, resumable: the driver of jobs/eval.py.

    results = run_eval(EvalRequest(models=["runs/tiny-demo"], tasks=["hellaswag", "heldout_text"],
                                   out_dir="runs/tiny-demo/eval"))

* **Models**: a run directory (every `step_N` in it, in step order), one `step_N` checkpoint, or
  a Hugging Face directory. Weights load with `elastic.model.hf.from_pretrained`; the tokenizer
  is the one that goes with them (elastic/config/init_from.py).
* **Sharding**: items are cut into units of `unit_items`; Ray actors (one GPU each where the
  cluster has GPUs, else `cpus_per_worker` CPUs) take units as they free up, one checkpoint at a
  time so a worker loads each model once.
* **Resumable**: each finished unit's per-item records are appended to
  `<out>/<model>/<task>.items.jsonl` (one line per item, flushed) by the driver; a rerun reads
  them and computes only the items not there. A unit lost with a worker is simply run again.
* **Code tasks**: workers generate; completions go to a sandboxed `python_tests` reward service
  (elastic/reward/service.py) started by the driver, never run in a model's process.
* Output: `<out>/eval.json` (metrics and per-item records of every model x task), a console
  table, and `<out>/eval_vs_step.png` (each task's headline metric vs training step) when several checkpoints of one
  run were evaluated.
"""

from __future__ import annotations

import json
import os
import re
import time
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Sequence, Tuple

from elastic.eval.metrics import FORMULAS, aggregate, headline
from elastic.eval.spec import Doc, EvalConfigError, TaskSpec, find_spec

STEP_RE = re.compile(r"^step_(\d+)$")


@dataclass
class EvalRequest:
    models: List[str]
    tasks: List[str]
    out_dir: str = ""
    workers: int = 0              # 0: one per GPU, else min(2, CPUs)
    cpus_per_worker: float = 1.0
    unit_items: int = 32
    limit: int = 0                # overrides every task's limit when > 0
    token_budget: int = 8192
    dtype: str = "auto"           # auto: bfloat16 on GPU, float32 on CPU
    seed: int = 0
    resume: bool = True
    allow_weak_isolation: bool = False  # code tasks without bubblewrap (reward.allow_weak_isolation)
    # Generation tasks generate with weight-only quantized weights (full | int8 | int4;
    # elastic/generation/quantized.py); scoring tasks (perplexity, multiple choice) stay full.
    weights: str = "full"


@dataclass
class ModelRef:
    label: str  # "step_100", or the directory name for HF models
    path: str
    step: Optional[int]
    run: str    # the run directory ("" for HF models)


@dataclass
class TaskData:
    spec: TaskSpec
    docs: List[Doc]
    contexts: List[str]  # every item's full context, few-shot examples drawn in item order (lm-eval's way)
    bad_rows: int = 0
    bad_examples: List[str] = field(default_factory=list)


def resolve_models(paths: Sequence[str]) -> List[ModelRef]:
    """Expand run directories into their checkpoints; one-line EvalConfigError for a path that
    is none of run / checkpoint / HF directory."""
    out: List[ModelRef] = []
    for p in paths:
        ap = os.path.abspath(p)
        if not os.path.isdir(ap):
            raise EvalConfigError(f"{p}: no such directory")
        if os.path.isfile(os.path.join(ap, "train_state.json")):
            m = STEP_RE.match(os.path.basename(ap))
            out.append(ModelRef(os.path.basename(ap), ap, int(m.group(1)) if m else None, os.path.dirname(ap)))
            continue
        steps = sorted((int(m.group(1)), e) for e in os.listdir(ap) if (m := STEP_RE.match(e))
                       and os.path.isfile(os.path.join(ap, e, "train_state.json")))
        if steps:
            out.extend(ModelRef(name, os.path.join(ap, name), s, ap) for s, name in steps)
        elif os.path.isfile(os.path.join(ap, "config.json")):
            out.append(ModelRef(os.path.basename(ap.rstrip(os.sep)), ap, None, ""))
        else:
            raise EvalConfigError(f"{p}: not a run directory (no step_N checkpoints), a checkpoint (train_state.json) "
                                  "or a Hugging Face directory (config.json)")
    labels = [m.label for m in out]
    dup = {x for x in labels if labels.count(x) > 1}
    if dup:  # the same step of two runs: qualify by run name
        out = [ModelRef(f"{os.path.basename(m.run)}/{m.label}" if m.label in dup and m.run else m.label, m.path, m.step, m.run) for m in out]
    return out


def load_task(name: str, limit: int = 0) -> TaskData:
    """Spec + items + few-shot pool, read and checked on the driver before any worker starts."""
    from elastic.eval.formats import read_docs

    spec = find_spec(name)
    docs, bad = read_docs(spec.data, spec)
    n = limit or spec.limit
    if n:
        docs = docs[:n]
    pool, same = docs, True
    if spec.num_fewshot:
        if spec.fewshot_data:
            pool, _ = read_docs(spec.fewshot_data, spec)
            same = False
        else:
            pool, _ = read_docs(spec.data, spec)  # the whole file, not only the limited items
        if len(pool) - (1 if same else 0) < spec.num_fewshot:
            raise EvalConfigError(f"{spec.source or spec.task}: num_fewshot {spec.num_fewshot} but the few-shot pool has {len(pool)} items")
    from elastic.eval.requests import fewshot_contexts

    contexts = fewshot_contexts(spec, docs, pool, same) if spec.type != "perplexity" else [""] * len(docs)
    return TaskData(spec, docs, contexts, _bad_count(bad), _bad_examples(bad))


def _bad_count(bad) -> int:
    if bad is None:
        return 0
    if isinstance(bad, int):
        return bad
    return int(getattr(bad, "total", None) if hasattr(bad, "total") else (bad.get("total", 0) if isinstance(bad, dict) else len(bad)))


def _bad_examples(bad) -> List[str]:
    ex = getattr(bad, "examples", None) if bad is not None and not isinstance(bad, (int, dict, list)) else None
    if ex is None and isinstance(bad, dict):
        ex = bad.get("examples")
    return list(ex or [])[:3]


# --- the worker ---

def _worker_cls():
    import ray

    @ray.remote
    class EvalWorker:
        """Holds one model at a time; evaluates units of items on it."""

        def __init__(self, dtype: str, token_budget: int, weights: str = "full") -> None:
            import torch

            self.device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
            name = dtype if dtype != "auto" else ("bfloat16" if self.device.type == "cuda" else "float32")
            self.dtype = getattr(torch, name)
            self.token_budget = token_budget
            self.weights = weights
            self.path: Optional[str] = None
            self.ev = None
            if self.device.type == "cpu":
                torch.set_num_threads(max(1, int(os.environ.get("ELASTIC_EVAL_THREADS", "1"))))

        def _load(self, path: str) -> None:
            if self.path == path:
                return
            from elastic.config.init_from import resolve_init_from
            from elastic.eval.evaluate import ItemEvaluator, TokenizerView
            from elastic.model.hf import from_pretrained

            src = resolve_init_from(path, key="--model")
            model = from_pretrained(path, device=self.device, dtype=self.dtype).eval()
            self.ev = ItemEvaluator(model, TokenizerView.from_file(src.tokenizer), int(model.args.max_seq_len),
                                    token_budget=self.token_budget)
            if self.weights != "full":  # generation tasks only: a quantized copy generates
                from elastic.generation.quantized import QuantizedCopy

                self.ev.gen_model = QuantizedCopy(self.weights).refresh(model)
            self.path = path

        def run(self, path: str, spec: TaskSpec, items: List[Tuple[int, Doc, str]], seed: int) -> Tuple[List[Dict[str, Any]], float]:
            t0 = time.perf_counter()
            self._load(path)
            return self.ev.run(spec, items, seed), time.perf_counter() - t0

    return EvalWorker


# --- resumable per-item store ---

def _items_path(out_dir: str, model: ModelRef, task: str) -> str:
    return os.path.join(out_dir, model.label.replace("/", "__"), f"{task}.items.jsonl")


def read_done(path: str) -> Dict[str, Dict[str, Any]]:
    """Records already written (a torn last line from a crash is ignored and recomputed)."""
    done: Dict[str, Dict[str, Any]] = {}
    if not os.path.isfile(path):
        return done
    with open(path) as f:
        for line in f:
            try:
                rec = json.loads(line)
            except json.JSONDecodeError:
                continue
            done[rec["id"]] = rec
    return done


def _append(path: str, records: List[Dict[str, Any]]) -> None:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "a") as f:
        for r in records:
            f.write(json.dumps(r) + "\n")
        f.flush()
        os.fsync(f.fileno())


# --- the driver ---

@dataclass
class EvalResult:
    out_dir: str
    metrics: Dict[str, Dict[str, Dict[str, float]]]  # model label -> task -> metrics
    models: List[ModelRef]
    tasks: Dict[str, TaskData]
    computed_items: int
    reused_items: int
    wall_s: float
    plots: List[str]
    items_per_s: float


def default_out_dir(models: List[ModelRef]) -> str:
    runs = {m.run for m in models}
    if len(runs) == 1 and "" not in runs:
        return os.path.join(next(iter(runs)), "eval")
    return os.path.abspath("eval-results")


def run_eval(req: EvalRequest, say=print) -> EvalResult:
    import ray

    from elastic.launch.runtime.cluster import connect, resolve_cluster
    from elastic.launch.driver import worker_env

    t0 = time.perf_counter()
    tasks = {}
    for name in req.tasks:
        td = load_task(name, req.limit)
        if td.spec.task in tasks:
            raise EvalConfigError(f"{name}: task {td.spec.task!r} is listed twice")
        tasks[td.spec.task] = td
    models = resolve_models(req.models)
    if any(td.spec.type == "code" for td in tasks.values()) and not req.allow_weak_isolation:
        from elastic.sandbox.isolation import detect, unavailable_message

        iso = detect()  # untrusted programs run in bubblewrap or not at all: say so before any work
        if iso.wrapper != "bwrap":
            raise EvalConfigError(f"code tasks: {unavailable_message(iso)}")
    if req.weights not in ("full", "int8", "int4"):
        raise EvalConfigError(f"--weights must be full|int8|int4, got {req.weights!r}")
    out_dir = os.path.abspath(req.out_dir or default_out_dir(models) + ("" if req.weights == "full" else f"-{req.weights}"))
    os.makedirs(out_dir, exist_ok=True)
    say(f"[eval] {len(models)} model{'s' if len(models) > 1 else ''} x {len(tasks)} task{'s' if len(tasks) > 1 else ''} "
        f"({', '.join(f'{t} {len(d.docs)}' for t, d in tasks.items())} items) -> {out_dir}")
    for t, d in tasks.items():
        if d.bad_rows:
            say(f"[eval] {t}: {d.bad_rows} bad rows skipped; first: {'; '.join(d.bad_examples)}")

    # what is left to do
    done: Dict[Tuple[str, str], Dict[str, Dict]] = {}
    todo: List[Tuple[ModelRef, str, List[Tuple[int, Doc]]]] = []
    reused = 0
    for m in models:
        for t, td in tasks.items():
            have = read_done(_items_path(out_dir, m, t)) if req.resume else {}
            if not req.resume and os.path.exists(_items_path(out_dir, m, t)):
                os.remove(_items_path(out_dir, m, t))
            keep = {d.id for d in td.docs}
            have = {k: v for k, v in have.items() if k in keep}
            reused += len(have)
            done[(m.label, t)] = have
            left = [(i, d, c) for i, (d, c) in enumerate(zip(td.docs, td.contexts)) if d.id not in have]
            for s in range(0, len(left), req.unit_items):
                todo.append((m, t, left[s:s + req.unit_items]))
    total = sum(len(u[2]) for u in todo)
    if reused:
        say(f"[eval] resuming: {reused} items already done, {total} to compute")

    computed = 0
    if todo:
        connect(resolve_cluster(), max(os.cpu_count() or 1, 2), worker_env())
        gpus = int(ray.cluster_resources().get("GPU", 0))
        if req.weights == "int4" and (not gpus or req.dtype not in ("auto", "bfloat16")):
            raise EvalConfigError("--weights int4 needs CUDA and bfloat16 (torchao 0.18 has no CPU int4 weight-only kernel); "
                                  "use int8 or full")
        n_workers = req.workers or (gpus if gpus else max(1, min(2, int(ray.cluster_resources().get("CPU", 1) // req.cpus_per_worker))))
        n_workers = min(n_workers, len(todo))
        opts = {"num_gpus": 1} if gpus else {"num_cpus": req.cpus_per_worker}
        Worker = _worker_cls()
        threads = str(max(1, int(req.cpus_per_worker)))
        workers = [Worker.options(**opts, runtime_env={"env_vars": {"ELASTIC_EVAL_THREADS": threads}}).remote(req.dtype, req.token_budget, req.weights)
                   for _ in range(n_workers)]
        say(f"[eval] {n_workers} worker{'s' if n_workers > 1 else ''} ({'1 GPU' if gpus else f'{req.cpus_per_worker:g} CPU'} each), "
            f"{len(todo)} units of up to {req.unit_items} items")
        computed = _drive(workers, todo, tasks, out_dir, req, say, done)
        for w in workers:
            ray.kill(w)

    _score_code(tasks, models, out_dir, done, say, req.allow_weak_isolation)
    metrics = {m.label: {t: aggregate(td.spec, list(done[(m.label, t)].values())) for t, td in tasks.items()} for m in models}
    wall = time.perf_counter() - t0
    plots = write_outputs(out_dir, models, tasks, metrics, done)
    for line in table(models, tasks, metrics):
        say(line)
    res = EvalResult(out_dir, metrics, models, tasks, computed, reused, wall, plots, computed / wall if wall > 0 else 0.0)
    say(f"[eval] {computed} items computed ({res.items_per_s:.1f}/s over {wall:.0f}s), {reused} reused; "
        f"results in {os.path.join(out_dir, 'eval.json')}")
    return res


def _drive(workers, todo, tasks, out_dir, req, say, done) -> int:
    """Hand units to free workers, one checkpoint after another; write each unit's records as
    it lands. Progress: items done / total, windowed rate, ETA."""
    import ray

    from elastic.launch.runtime.progress import fmt_duration

    queue = list(todo)
    free = list(workers)
    running: Dict[Any, Tuple[Any, Tuple]] = {}
    total = sum(len(u[2]) for u in todo)
    computed, t0, last_say, recent = 0, time.perf_counter(), 0.0, []
    while queue or running:
        while free and queue:
            w = free.pop()
            unit = queue.pop(0)
            m, t, items = unit
            td = tasks[t]
            ref = w.run.remote(m.path, td.spec, items, req.seed)
            running[ref] = (w, unit)
        ready, _ = ray.wait(list(running), num_returns=1)
        for ref in ready:
            w, (m, t, items) = running.pop(ref)
            free.append(w)
            try:
                recs, _secs = ray.get(ref)
            except ray.exceptions.RayActorError:
                raise
            if tasks[t].spec.type != "code":  # code records are written after the sandbox verdicts
                _append(_items_path(out_dir, m, t), recs)
            for r in recs:
                done[(m.label, t)][r["id"]] = r
            computed += len(items)
            now = time.perf_counter()
            recent = [(tt, n) for tt, n in recent if now - tt < 60] + [(now, len(items))]
            if now - last_say > 5 or computed == total:
                span = max(now - recent[0][0], 1e-6) if len(recent) > 1 else now - t0
                rate = sum(n for _, n in recent[1:]) / span if len(recent) > 1 else computed / max(now - t0, 1e-6)
                eta = (total - computed) / rate if rate > 0 else None
                say(f"[eval] {computed}/{total} items, {rate:.1f} items/s (last 60 s), ETA {fmt_duration(eta)}")
                last_say = now
    return computed


def _score_code(tasks, models, out_dir, done, say, allow_weak: bool) -> None:
    """Completions of code tasks -> sandboxed python_tests verdicts (a reward service on CPU
    actors), written with the records so a rerun does not re-run them."""
    code = [t for t, td in tasks.items() if td.spec.type == "code"]
    pending = [(m, t, r) for m in models for t in code for r in done[(m.label, t)].values() if "verdicts" not in r]
    if not pending:
        return
    from elastic.config.schema import RewardSection
    from elastic.reward.verifiers.python_tests.verifier import PythonTests
    from elastic.reward.service import start_service
    from elastic.reward.tasks import Task

    rtasks = {}
    for t in code:
        for d in tasks[t].docs:
            tests = PythonTests(entry_point=d.entry_point, test=d.test, test_list=list(d.test_list), test_setup=d.test_setup,
                                prompt=d.context)
            rtasks[f"{t}/{d.id}"] = Task(id=f"{t}/{d.id}", prompt=d.context, tests=tests)
    section = RewardSection(kind="python_tests", allow_weak_isolation=allow_weak)
    client = start_service(section, None, name=f"eval-reward-{os.getpid()}", tasks=rtasks)
    try:
        items = [(f"{m.label}|{t}|{r['id']}|{j}", f"{t}/{r['id']}", c) for m, t, r in pending for j, c in enumerate(r["completions"])]
        client.submit(items)
        keys = [k for k, _, _ in items]
        got: Dict[str, Any] = {}
        deadline = time.monotonic() + 600 + 5 * len(keys)
        while len(got) < len(keys) and time.monotonic() < deadline:
            got.update(client.results([k for k in keys if k not in got], timeout_s=30))
            say(f"[eval] sandboxed tests: {len(got)}/{len(keys)} completions judged")
        for m, t, r in pending:
            r["verdicts"] = [got[f"{m.label}|{t}|{r['id']}|{j}"].status if f"{m.label}|{t}|{r['id']}|{j}" in got else "sandbox_error"
                             for j in range(len(r["completions"]))]
        for m in models:
            for t in code:
                recs = [r for mm, tt, r in pending if mm is m and tt == t]
                if recs:
                    _append(_items_path(out_dir, m, t), recs)
    finally:
        client.shutdown()


def table(models: List[ModelRef], tasks: Dict[str, TaskData], metrics) -> List[str]:
    """A console table: one row per task (its headline metric; every metric is in eval.json),
    one column per model, ± the standard error where the metric has one."""
    head = ["task", "n", "metric"] + [m.label for m in models] + ["formula"]
    rows = [head]
    for t, td in tasks.items():
        h = headline(td.spec)
        cells = []
        for m in models:
            mt = metrics[m.label][t]
            v, se = mt.get(h), mt.get(f"{h}_stderr")
            cells.append("n/a" if v is None else f"{v:.4f}" + (f" ± {se:.3f}" if se is not None and se == se else ""))
        first = metrics[models[0].label][t] if models else {}
        n = f"{first.get('n', 0)}" + (f" ({first['skipped']} skipped)" if first.get("skipped") else "")
        rows.append([t, n, h] + cells + [FORMULAS.get("pass@k" if h.startswith("pass@") else h, "")])
    widths = [max(len(r[i]) for r in rows) for i in range(len(head))]
    return ["  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows]


def write_outputs(out_dir, models, tasks, metrics, done) -> List[str]:
    """eval.json (atomically) and, for several checkpoints of one run, a metric-vs-step plot per task."""
    doc = {"formulas": FORMULAS,
           "tasks": {t: {"spec": {k: v for k, v in vars(td.spec).items()}, "items": len(td.docs), "bad_rows": td.bad_rows}
                     for t, td in tasks.items()},
           "models": [{"label": m.label, "path": m.path, "step": m.step, "run": m.run} for m in models],
           "metrics": metrics,
           "items": {m.label: {t: sorted(done[(m.label, t)].values(), key=lambda r: r.get("index", 0)) for t in tasks} for m in models}}
    path = os.path.join(out_dir, "eval.json")
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(doc, f, indent=1)
    os.replace(tmp, path)
    stepped = [m for m in models if m.step is not None]
    if len(stepped) < 2 or len({m.run for m in stepped}) != 1:
        return []
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = []
    for t, td in tasks.items():
        h = headline(td.spec)
        pts = [(m.step, metrics[m.label][t][h]) for m in stepped if h in metrics[m.label][t]]
        if len(pts) >= 2:
            panels.append((t, h, pts))
    if not panels:
        return []
    cols = min(3, len(panels))
    rows = -(-len(panels) // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(4.3 * cols, 3.2 * rows), squeeze=False)
    for ax, (t, h, pts) in zip(axes.ravel(), panels):
        ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o")
        ax.set_xlabel("training step")
        ax.set_ylabel(h)
        ax.set_title(t, fontsize=9)
        ax.grid(alpha=0.3)
    for ax in axes.ravel()[len(panels):]:
        ax.axis("off")
    fig.suptitle(f"{os.path.basename(stepped[0].run)}: headline metric vs training step (formulas in eval.json)", fontsize=9)
    fig.tight_layout()
    p = os.path.join(out_dir, "eval_vs_step.png")
    fig.savefig(p, dpi=110)
    plt.close(fig)
    return [p]


def contamination_report(run_dir: str, res: EvalResult, n: int = 13) -> List[str]:
    """Token 13-gram overlap of every evaluated task's items with `run_dir`'s training shards
    (elastic/eval/contamination.py), as console lines; also written to `<out>/contamination.json`."""
    from elastic.eval.contamination import contamination

    if not os.path.isfile(os.path.join(run_dir, "tokenizer.json")):
        raise EvalConfigError(f"--contamination {run_dir}: not a run directory (no tokenizer.json)")
    info: Dict[str, Any] = {}
    got = contamination({t: td.docs for t, td in res.tasks.items()}, {t: td.spec for t, td in res.tasks.items()},
                        run_dir, n=n, scan_info=info)
    with open(os.path.join(res.out_dir, "contamination.json"), "w") as f:
        json.dump({"run": os.path.abspath(run_dir), "n": n, "unit": "tokens of the run's tokenizer", "scan": info,
                   "tasks": got}, f, indent=1)
    lines = [f"[eval] contamination: items with any {n}-token n-gram in {run_dir}'s training data "
             f"({info.get('tokens_scanned', 0):,} tokens scanned in {info.get('seconds', '?')} s)"]
    for t, r in got.items():
        lines.append(f"[eval]   {t}: {r['contaminated']}/{r['items_with_ngrams']} items "
                     f"({r['contaminated_fraction']:.1%}), mean overlap {r['mean_overlap']:.4f}"
                     + (f"; e.g. {', '.join(r['contaminated_ids'][:3])}" if r["contaminated_ids"] else ""))
    return lines
