"""The scaling-law ladder: a grid of ordinary pretraining runs, fitted (docs/ladder.md).

Each cell (a model size x a FLOP budget, or a size x a token count) is an ordinary run of
`run_pretraining` with its own `run.name` under `<ladder dir>/runs/`, so it checkpoints,
resumes and reports like any run, and runs on GPUs exactly as pretraining does. The ladder
directory is `<run.storage_path>/<run.name>` of the ladder's config (for a URI, records and
fits live in /tmp/elastic-runs/<run.name> on the driver, as a run's summary does):

    cells/<cell>.json   a finished cell's record (N, D, FLOPs, held-out val loss, ...): never re-run
    ladder.jsonl        cell starts, finishes, skips and failures, with times
    tokenizer.json      the one tokenizer every cell uses (losses in the same units)
    cache/              the shard cache the cells share (same tokenizer and seq_len), local ladders
    runs/<cell>/        the cells' run directories (checkpoints, metrics.jsonl, console.log)
    fit.json, plots/    the fits (elastic/scaling) and figures

Per-size rule (OLMo-style, ladder.* in elastic/config/schema.py): with N the parameters
counted by flops_per_token,
    lr    = clip(train.lr x (N / ref_params)^lr_exponent, lr_min, lr_max)
    batch = clip(2^round(log2(train.global_batch_size x (N / ref_params)^batch_exponent)), batch_min, batch_max)
sequences of data.seq_len; warm-up is warmup_fraction of the cell's steps, then cosine decay.

What is fitted: each cell's held-out validation loss (`val_loss`, eval.samples packed samples
of the held-out shards) at its last step, in nats per token.
"""

from __future__ import annotations

import dataclasses
import gc
import json
import math
import os
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Dict, List, Optional, TextIO

from elastic.config import Config, ConfigError, load_config
from elastic.config.load import resolved_model_dims
from elastic.config.micro_batch import fitted_micro_batch

SIZE_KEYS = ("dim", "n_layers", "n_heads", "n_kv_heads", "ffn_hidden")

# The CI smoke ladder: 2 sizes x 2 token counts of tiny cells, a few steps each, one worker.
SMOKE_OVERRIDES = [
    "ladder.mode=grid",
    "ladder.sizes=[{dim: 16, n_layers: 1, n_heads: 2, ffn_hidden: 32}, {dim: 32, n_layers: 1, n_heads: 2, ffn_hidden: 64}]",
    "ladder.tokens=[1024, 2048]", "ladder.min_steps=1", "ladder.bootstrap=20", "ladder.holdout=1",
    "ladder.batch_exponent=0", "ladder.ref_params=10000",
    "data.vocab_size=300", "data.seq_len=64", "data.tokenizer_sample_mb=0.5",
    "train.global_batch_size=4", "train.micro_batch_size=4", "train.lr=0.01", "train.log_every=1",
    "scaling.min_workers=1", "scaling.max_workers=1", "eval.samples=8", "checkpoint.every_steps=4",
    "wandb.mode=disabled", "run.name=ladder-smoke",
]


@dataclass
class Cell:
    """One ladder run, planned: its size, budget, rule-derived batch/LR and its config."""

    name: str
    size_index: int
    size: Dict[str, int]
    n_params: float          # N: flops_per_token(args, 0) / 6 (non-embedding + output projection)
    flops_per_token: float   # flops_per_token(args, data.seq_len)
    steps: int
    batch: int               # sequences per global batch
    lr: float
    warmup: int
    tokens: int              # D = steps x batch x seq_len
    flops: float             # C = flops_per_token x D
    budget: float            # the planned budget (isoflop) or token count (grid) the cell belongs to
    overrides: List[str] = field(default_factory=list)
    cfg: Optional[Config] = None

    def record_base(self) -> dict:
        return {"name": self.name, "size": self.size, "N": self.n_params, "D": self.tokens, "C": self.flops,
                "budget": self.budget, "flops_per_token": self.flops_per_token, "steps": self.steps,
                "batch": self.batch, "lr": self.lr, "warmup": self.warmup}


@dataclass
class LadderPlan:
    base: Config
    config_path: Optional[str]
    overrides: List[str]
    dir: str        # where records, tokenizer, fits live (local)
    runs_dir: str   # the cells' storage_path (local path or URI)
    cells: List[Cell]
    concurrent: int


@dataclass
class LadderResult:
    dir: str
    ran: List[str]
    skipped: List[str]
    failed: Dict[str, str]
    fit: Optional[dict]
    wall_s: float


def _err(key: str, msg: str) -> ConfigError:
    return ConfigError(f"{key}: {msg}")


def load_ladder_config(path: Optional[str], overrides: List[str], smoke: bool = False) -> tuple:
    """(base Config, the overrides that produced it): `smoke` (or ladder.smoke) puts SMOKE_OVERRIDES
    under the user's overrides, so the user's still win."""
    overrides = list(overrides)
    base = load_config(path, overrides)
    if smoke or base.ladder.smoke:
        overrides = SMOKE_OVERRIDES + ["ladder.smoke=true"] + overrides
        base = load_config(path, overrides)
    return base, overrides


def validate_ladder(cfg: Config) -> None:
    """The ladder section on its own; one-line ConfigError naming the key."""
    lad = cfg.ladder
    if lad.mode not in ("isoflop", "grid"):
        raise _err("ladder.mode", f"must be isoflop|grid, got {lad.mode!r}")
    if not lad.sizes:
        raise _err("ladder.sizes", "is empty: list model sizes, e.g. [{dim: 64, n_layers: 2, n_heads: 4}]")
    for i, s in enumerate(lad.sizes):
        bad = sorted(set(s) - set(SIZE_KEYS))
        if bad:
            raise _err(f"ladder.sizes[{i}]", f"unknown key {bad[0]!r} (known: {', '.join(SIZE_KEYS)})")
        for k in ("dim", "n_layers", "n_heads"):
            if k not in s:
                raise _err(f"ladder.sizes[{i}]", f"needs {k} (dim, n_layers and n_heads set a size)")
        for k, v in s.items():
            if v < 1:
                raise _err(f"ladder.sizes[{i}].{k}", f"must be >= 1, got {v}")
        if s["dim"] % s["n_heads"]:
            raise _err(f"ladder.sizes[{i}]", f"dim {s['dim']} is not divisible by n_heads {s['n_heads']}")
        if s["n_heads"] % s.get("n_kv_heads", s["n_heads"]):
            raise _err(f"ladder.sizes[{i}]", f"n_heads {s['n_heads']} is not divisible by n_kv_heads {s['n_kv_heads']}")
    dup = [i for i, s in enumerate(lad.sizes) if lad.sizes.index(s) != i]
    if dup:
        raise _err(f"ladder.sizes[{dup[0]}]", "repeats an earlier size")
    key, values = ("ladder.flops", lad.flops) if lad.mode == "isoflop" else ("ladder.tokens", lad.tokens)
    if not values:
        raise _err(key, f"is empty: ladder.mode {lad.mode} needs at least one value")
    if any(v <= 0 for v in values):
        raise _err(key, f"must all be > 0, got {values}")
    if len(set(values)) != len(values):
        raise _err(key, "lists a value more than once")
    if not 0 <= lad.min_tokens_per_param < lad.max_tokens_per_param:
        raise _err("ladder.min_tokens_per_param", f"must be in [0, ladder.max_tokens_per_param={lad.max_tokens_per_param})")
    for k in ("min_steps", "batch_min"):
        if getattr(lad, k) < 1:
            raise _err(f"ladder.{k}", f"must be >= 1, got {getattr(lad, k)}")
    if lad.batch_max < lad.batch_min:
        raise _err("ladder.batch_max", f"must be >= ladder.batch_min={lad.batch_min}, got {lad.batch_max}")
    if lad.ref_params <= 0:
        raise _err("ladder.ref_params", f"must be > 0, got {lad.ref_params}")
    if not 0 < lad.lr_min <= lad.lr_max:
        raise _err("ladder.lr_min", f"must be in (0, ladder.lr_max={lad.lr_max}], got {lad.lr_min}")
    if not 0 <= lad.warmup_fraction < 1:
        raise _err("ladder.warmup_fraction", f"must be in [0, 1), got {lad.warmup_fraction}")
    groups = len(lad.flops) if lad.mode == "isoflop" else len(lad.sizes)
    if not 0 <= lad.holdout < groups:
        what = "budgets in ladder.flops" if lad.mode == "isoflop" else "sizes in ladder.sizes"
        raise _err("ladder.holdout", f"must be in [0, {groups}) (the {groups} {what}; at least one must stay in the fit), got {lad.holdout}")
    if lad.concurrent < 0:
        raise _err("ladder.concurrent", f"must be >= 0 (0 = as many as the cluster holds), got {lad.concurrent}")
    if lad.bootstrap < 0:
        raise _err("ladder.bootstrap", f"must be >= 0, got {lad.bootstrap}")
    if not 0 < lad.level < 1:
        raise _err("ladder.level", f"must be in (0, 1), got {lad.level}")


def size_tag(s: Dict[str, int]) -> str:
    """d64l3h4 (+ k<kv heads>, f<ffn> when set): a cell name part."""
    return (f"d{s['dim']}l{s['n_layers']}h{s['n_heads']}" + (f"k{s['n_kv_heads']}" if "n_kv_heads" in s else "")
            + (f"f{s['ffn_hidden']}" if "ffn_hidden" in s else ""))


def _num_tag(v: float) -> str:
    return f"{v:.3g}".replace("+", "").replace("e0", "e")


def model_counts(cfg: Config) -> tuple:
    """(N, FLOPs per token) of `cfg`'s model by the trainer's MFU formula
    (elastic/model/llama.py flops_per_token): N = flops_per_token(args, 0) / 6."""
    from elastic.model import ModelArgs, flops_per_token

    dims = {k: v for k, v in resolved_model_dims(cfg).items() if k in {f.name for f in dataclasses.fields(ModelArgs)}}
    args = ModelArgs(**dims)
    return flops_per_token(args, 0) / 6.0, flops_per_token(args, cfg.data.seq_len)


def size_rule(cfg: Config, n: float) -> tuple:
    """(global batch in sequences, lr) for a model of N parameters (module docstring)."""
    lad, t = cfg.ladder, cfg.train
    lr = min(lad.lr_max, max(lad.lr_min, t.lr * (n / lad.ref_params) ** lad.lr_exponent))
    raw = t.global_batch_size * (n / lad.ref_params) ** lad.batch_exponent
    batch = int(min(lad.batch_max, max(lad.batch_min, 2 ** round(math.log2(max(raw, 1e-9))))))
    return batch, lr


def _micro(cfg: Config, batch: int) -> int:
    """The largest micro-batch <= train.micro_batch_size that divides one worker's share."""
    return fitted_micro_batch(max(1, batch // cfg.scaling.min_workers), cfg.train.micro_batch_size)


def plan_ladder(path: Optional[str], overrides: List[str], smoke: bool = False) -> LadderPlan:
    """Every cell's config, built and validated before anything runs (one-line ConfigError)."""
    from elastic.launch.driver import run_paths

    base, overrides = load_ladder_config(path, overrides, smoke)
    validate_ladder(base)
    lad, seq = base.ladder, base.data.seq_len
    paths = run_paths(base)
    ladder_dir, runs_dir = paths.local_dir, f"{paths.run_dir.rstrip('/')}/runs"
    tokenizer = base.data.tokenizer or os.path.join(ladder_dir, "tokenizer.json")
    cells: List[Cell] = []
    for i, size in enumerate(lad.sizes):
        size_over = [f"model.{k}={v}" for k, v in size.items()]
        try:
            probe = load_config(path, overrides + size_over)
        except ConfigError as e:
            raise ConfigError(f"ladder.sizes[{i}] ({size_tag(size)}): {e}") from None
        n, fpt = model_counts(probe)
        batch, lr = size_rule(base, n)
        tok_step = batch * seq
        targets = lad.flops if lad.mode == "isoflop" else lad.tokens
        for target in targets:
            steps = max(1, round(target / (fpt * tok_step))) if lad.mode == "isoflop" else max(1, round(target / tok_step))
            d = steps * tok_step
            if lad.mode == "isoflop" and (steps < lad.min_steps or not lad.min_tokens_per_param <= d / n <= lad.max_tokens_per_param):
                continue
            name = f"{size_tag(size)}-{'C' if lad.mode == 'isoflop' else 'T'}{_num_tag(target)}"
            warm = int(round(lad.warmup_fraction * steps))
            cell_over = size_over + [
                f"run.storage_path={runs_dir}", f"run.name={name}", f"data.tokenizer={tokenizer}",
                f"train.steps={steps}", f"train.global_batch_size={batch}", f"train.micro_batch_size={_micro(base, batch)}",
                f"train.lr={lr:.6g}", f"train.warmup_steps={warm}", f"eval.every_steps={steps}", "train.until_step=0",
            ]
            cells.append(Cell(name, i, dict(size), n, fpt, steps, batch, lr, warm, d, fpt * d, float(target), cell_over))
    if not cells:
        raise _err("ladder.sizes", "no cell is left: every size x budget falls outside ladder.min_steps / "
                                   "ladder.min_tokens_per_param..max_tokens_per_param")
    for c in cells:
        if lad.mode == "grid" and c.steps < lad.min_steps:
            raise _err("ladder.tokens", f"cell {c.name} has {c.steps} steps, fewer than ladder.min_steps={lad.min_steps}")
        try:
            # Checked without the tokenizer file (it may not exist yet): everything else is final.
            c.cfg = load_config(path, overrides + [o for o in c.overrides if not o.startswith("data.tokenizer=")])
        except ConfigError as e:
            raise ConfigError(f"ladder cell {c.name}: {e}") from None
    cells.sort(key=lambda c: (c.flops, c.n_params))
    return LadderPlan(base, path, overrides, ladder_dir, runs_dir, cells, lad.concurrent)


def holdout_names(plan_cells: List[dict], cfg: Config) -> List[str]:
    """Cells held out of the fit: those of the `ladder.holdout` largest budgets (isoflop) or sizes (grid)."""
    k = cfg.ladder.holdout
    if k <= 0:
        return []
    if cfg.ladder.mode == "isoflop":
        top = sorted({c["budget"] for c in plan_cells})[-k:]
        return [c["name"] for c in plan_cells if c["budget"] in top]
    top = sorted({c["N"] for c in plan_cells})[-k:]
    return [c["name"] for c in plan_cells if c["N"] in top]


class Ledger:
    """ladder.jsonl and the console, from several cell threads at once."""

    def __init__(self, ladder_dir: str, out: TextIO):
        self.path, self.out, self.lock = os.path.join(ladder_dir, "ladder.jsonl"), out, threading.Lock()

    def event(self, rec: dict, line: Optional[str] = None) -> None:
        with self.lock:
            with open(self.path, "a") as f:
                f.write(json.dumps({"time": time.time(), **rec}) + "\n")
            if line:
                print(line, file=self.out, flush=True)


def _write_json(path: str, obj) -> None:
    tmp = f"{path}.tmp{os.getpid()}.{threading.get_ident()}"
    with open(tmp, "w") as f:
        json.dump(obj, f, indent=2)
    os.replace(tmp, path)


def read_cells(ladder_dir: str) -> Dict[str, dict]:
    d = os.path.join(ladder_dir, "cells")
    out = {}
    if os.path.isdir(d):
        for fn in sorted(os.listdir(d)):
            if fn.endswith(".json"):
                with open(os.path.join(d, fn)) as f:
                    rec = json.load(f)
                out[rec["name"]] = rec
    return out


def _fmt_n(v: float) -> str:
    for div, unit in ((1e9, "B"), (1e6, "M"), (1e3, "k")):
        if v >= div:
            return f"{v / div:.3g}{unit}"
    return f"{v:.3g}"


def final_val_loss(records_dir: str, steps: int) -> tuple:
    """(val_loss at the last step, the mean train loss of the last min(10, steps) steps) from metrics.jsonl."""
    from elastic.records import METRICS, read_records

    recs = [r for r in read_records(f"{records_dir.rstrip('/')}/{METRICS}") if "step" in r]
    val = [r for r in recs if r["step"] == steps and "val_loss" in r]
    last = [r["loss"] for r in recs if r["step"] > steps - min(10, steps)]
    return (val[-1]["val_loss"] if val else None), (sum(last) / len(last) if last else None)


def run_cell(plan: LadderPlan, cell: Cell, ledger: Ledger, index: int) -> dict:
    """Run (or resume) one cell as an ordinary pretraining run and record it."""
    from elastic.launch.driver import run_paths
    from elastic.launch.pretrain import run_pretraining

    cfg = load_config(plan.config_path, plan.overrides + cell.overrides)
    paths = run_paths(cfg)
    wait_for_cell_room(cfg, cell, ledger)
    if "://" not in paths.run_dir:  # the cells share one shard cache (same tokenizer, seq_len, shards)
        os.makedirs(paths.run_dir, exist_ok=True)
        link, shared = os.path.join(paths.run_dir, "cache"), os.path.join(plan.dir, "cache")
        os.makedirs(shared, exist_ok=True)
        if not os.path.lexists(link):
            os.symlink(shared, link)
    total = len(plan.cells)
    ledger.event({"event": "cell_start", "cell": cell.name},
                 f"[ladder] cell {index}/{total} {cell.name}: N {_fmt_n(cell.n_params)}, D {_fmt_n(cell.tokens)} tokens "
                 f"({cell.tokens / cell.n_params:.3g}/param), C {cell.flops:.3g} FLOPs, {cell.steps} steps x {cell.batch} seq, "
                 f"lr {cell.lr:.3g}: started")
    t0 = time.time()
    os.makedirs(paths.local_dir, exist_ok=True)
    with open(os.path.join(paths.local_dir, "console.log"), "a") as log:
        res = run_pretraining(cfg, "pretrain", out=log, progress=True)
    gc.collect()  # the finished run's store builder (held in reference cycles) dies now, and its data actors' CPUs return
    if res.stopped:
        raise RuntimeError(f"the run stopped itself: {res.stopped}")
    val, train_loss = final_val_loss(res.records_dir or res.local_dir, cell.steps)
    if val is None:
        raise RuntimeError(f"no val_loss at step {cell.steps} in {res.records_dir}/metrics.jsonl")
    rec = {**cell.record_base(), "val_loss": val, "train_loss_last10": train_loss, "wall_s": round(time.time() - t0, 1),
           "run_job_s": round(res.job_s, 1), "tokens_per_s": res.summary.get("tokens_per_s"),
           "run_dir": res.run_dir, "finished": time.time()}
    _write_json(os.path.join(plan.dir, "cells", f"{cell.name}.json"), rec)
    ledger.event({"event": "cell_done", "cell": cell.name, "val_loss": val, "wall_s": rec["wall_s"]},
                 f"[ladder] cell {index}/{total} {cell.name}: done in {rec['wall_s']:.0f}s, val_loss {val:.4f}")
    return rec


def wait_for_cell_room(cfg: Config, cell: Cell, ledger: Ledger, timeout_s: float = 600.0) -> None:
    """Before a cell starts: wait (at most `timeout_s`) until the cluster has the CPUs one cell holds
    free, so the data actors of the cell that just finished (they leave asynchronously) do not
    make this one fail its own resource check. Past the timeout the run's own check decides."""
    import ray

    gc.collect()
    need = min(cell_cpus(cfg), ray.cluster_resources().get("CPU", 0.0))
    t0 = time.time()
    while ray.available_resources().get("CPU", 0.0) + 1e-9 < need and time.time() - t0 < timeout_s:
        time.sleep(1.0)
        gc.collect()
    if time.time() - t0 > 5:
        ledger.event({"event": "cell_wait", "cell": cell.name, "waited_s": round(time.time() - t0, 1), "cpus": need})


def check_records(plan: LadderPlan, done: Dict[str, dict]) -> None:
    """A recorded cell must be the cell this config plans (same N, steps, batch, lr): a ladder
    whose rule or sizes changed under the same run.name is a one-line ConfigError, not a silent mix."""
    for c in plan.cells:
        rec = done.get(c.name)
        if rec is None:
            continue
        now = {"N": c.n_params, "steps": c.steps, "batch": c.batch, "lr": c.lr}
        diff = [k for k, v in now.items() if not math.isclose(float(rec.get(k, float("nan"))), float(v), rel_tol=1e-6)]
        if diff:
            was = ", ".join(f"{k} {rec.get(k)}" for k in diff)
            new = ", ".join(f"{k} {now[k]:.6g}" for k in diff)
            raise ConfigError(f"ladder cell {c.name}: recorded in {plan.dir}/cells with {was}, but this config plans {new}; "
                              "use another run.name (or remove that record and its run directory)")


def shared_tokenizer(plan: LadderPlan, say) -> None:
    """Train (once) the tokenizer every cell uses, unless data.tokenizer names one; also checks
    the data source before any run starts (DataError, one line)."""
    if plan.base.data.tokenizer:
        return
    path = os.path.join(plan.dir, "tokenizer.json")
    if os.path.exists(path):
        return
    from elastic.launch.data_plans import plan_job_data

    cfg = dataclasses.replace(plan.base, eval=dataclasses.replace(plan.base.eval, every_steps=0))
    p = plan_job_data(cfg, plan.dir, "pretrain").train
    say(f"[ladder] tokenizer: vocab {p.tokenizer.vocab_size} ({p.tokenizer.bytes_per_token:.2f} bytes/token), "
        f"shared by every cell: {path}")


def cell_cpus(cfg: Config) -> float:
    """CPUs one cell holds at once: its train workers, plus two data pipelines (the train and
    held-out shard builds each keep a Ray Data actor of data.tokenize_cpus while they live)."""
    s = cfg.scaling
    return s.max_workers * s.cpus_per_worker + 2 * cfg.data.tokenize_cpus


def concurrency(cfg: Config, cells: List[Cell], asked: int) -> tuple:
    """(cells at once, a note or ""): `asked` (0 = auto), capped at what the connected cluster holds
    at once: its GPUs / scaling.min_workers on GPU clusters, and its CPUs / cell_cpus. More cells
    than that would wait on each other's data actors (a cell holding its worker cannot finish
    without its held-out build)."""
    import ray

    res = ray.cluster_resources()
    s = cfg.scaling
    per = max(cell_cpus(c.cfg) for c in cells)
    fit = max(1, int(res.get("CPU", 0) // per)) if per > 0 else len(cells)
    if cfg.scaling.use_gpu != "false" and res.get("GPU", 0) >= 1:
        fit = min(fit, max(1, int(res["GPU"] // s.min_workers)))
    if asked <= 0:
        return fit, ""
    if asked > fit:
        return fit, (f"[ladder] ladder.concurrent={asked}, but the cluster holds {fit} cell(s) at once "
                     f"({res.get('CPU', 0):g} CPUs / {per:g} per cell (workers + 2 data actors)"
                     f"{', ' + format(res.get('GPU', 0), 'g') + ' GPUs' if res.get('GPU') else ''}): running {fit} at a time")
    return asked, ""


def run_ladder(path: Optional[str], overrides: List[str], smoke: bool = False, fit_only: bool = False,
               out: Optional[TextIO] = None) -> LadderResult:
    """Plan every cell (config errors first), run the unfinished ones (`concurrent` at a time,
    smallest compute first), then fit and plot. Raises ConfigError / DataError / LeaseHeld /
    ClusterError with one line; a cell that fails is reported and the others go on."""
    from elastic.launch.runtime.cluster import connect, resolve_cluster, PRIVATE
    from elastic.launch.runtime.lease import RunLease
    from elastic.launch.driver import private_cpus, worker_env

    out = out or sys.stdout

    def say(line: str) -> None:
        print(line, file=out, flush=True)

    t0 = time.time()
    plan = plan_ladder(path, overrides, smoke)
    os.makedirs(os.path.join(plan.dir, "cells"), exist_ok=True)
    done = read_cells(plan.dir)
    check_records(plan, done)
    todo = [c for c in plan.cells if c.name not in done]
    ran, failed = [], {}
    say(f"[ladder] {plan.dir}: {len(plan.cells)} cells ({plan.base.ladder.mode}), {len(plan.cells) - len(todo)} already finished")
    with RunLease(plan.dir):
        ledger = Ledger(plan.dir, out)
        for c in plan.cells:
            if c.name in done:
                ledger.event({"event": "cell_skip", "cell": c.name, "reason": "finished"})
        if todo and not fit_only:
            shared_tokenizer(plan, say)
            import ray

            choice = resolve_cluster()
            started_here = choice.kind == PRIVATE
            ncpu = max(private_cpus(c.cfg) for c in plan.cells) * max(1, plan.concurrent)
            choice = connect(choice, ncpu, worker_env())
            say(choice.describe())
            k, note = concurrency(plan.base, plan.cells, plan.concurrent)
            if note:
                say(note)
            say(f"[ladder] {len(todo)} cell(s) to run, {k} at a time; each cell's console: {plan.runs_dir}/<cell>/console.log")
            order = {c.name: i + 1 for i, c in enumerate(plan.cells)}
            try:
                with ThreadPoolExecutor(max_workers=k) as pool:
                    futs = {pool.submit(run_cell, plan, c, ledger, order[c.name]): c for c in todo}
                    for f, c in futs.items():
                        try:
                            f.result()
                            ran.append(c.name)
                        except Exception as e:  # one cell failing does not stop the others
                            msg = (str(e).strip().splitlines() or [type(e).__name__])[-1][:300]
                            failed[c.name] = f"{type(e).__name__}: {msg}"
                            ledger.event({"event": "cell_failed", "cell": c.name, "error": failed[c.name]},
                                         f"[ladder] cell {c.name}: FAILED ({failed[c.name]})")
            finally:
                if started_here:
                    ray.shutdown()
        fit = write_fit(plan, say)
    return LadderResult(plan.dir, ran, [c.name for c in plan.cells if c.name in done], failed, fit, time.time() - t0)


def write_fit(plan: LadderPlan, say) -> Optional[dict]:
    """fit.json and plots from the recorded cells (those of this plan's grid)."""
    from elastic.scaling.report import fit_ladder

    names = {c.name for c in plan.cells}
    recs = [r for n, r in read_cells(plan.dir).items() if n in names]
    planned = [c.record_base() for c in plan.cells]
    held = holdout_names(planned, plan.base)
    lad = plan.base.ladder
    fit = fit_ladder(recs, held, plan.dir, mode=lad.mode, resamples=lad.bootstrap, level=lad.level, seed=plan.base.run.seed,
                     planned=len(plan.cells))
    for line in fit.get("console", []):
        say(line)
    return fit
