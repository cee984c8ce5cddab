"""Curation on Ray Data: raw documents -> curated Parquet that pretraining reads, and a report.

Three steps, each resumable (docs/curate.md):

1. Per-document pass. The input files are grouped into blocks (`curate.block_mb`; a larger
   JSONL file is cut at newlines, a larger Parquet file at row groups; the plan depends only on
   the files). Ray Data feeds the blocks that have no
   marker yet to a pool of `curate.workers` stateful actors (`map_batches` with a class: the
   language model and word lists load once per actor). An actor reads its block, runs the
   per-document stages, computes each kept document's content hash and MinHash band keys, and
   commits `work/blocks/block-NNNNN.parquet` then its marker `block-NNNNN.json` (write to a
   temporary name, then rename): a crash loses at most the blocks in flight.
2. Dedup (global, on the driver): exact duplicates by content hash, then near duplicates by
   LSH (documents sharing a (band, key) are joined; each connected component keeps the
   document earliest in the input). The decisions depend on the input alone, never on the
   workers or the blocks. Committed as `work/dedup.parquet`.
3. Final pass: Ray Data tasks write each block's kept documents to `data/part-NNNNN.parquet`
   (columns text, id; input order) and its removed ones to `removed/part-NNNNN.parquet`, then a
   marker `work/done/part-NNNNN.json`.

Then `curate_report.json` and `curate_funnel.png` are written beside `data/`.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import os
import time
import warnings
from collections import Counter
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Optional, Tuple

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from elastic.config import ConfigError
from elastic.data.curate import DocPipeline, check_curate_config, doc_stage_names
from elastic.data.curate.dedup import exact_duplicates, near_duplicates
from elastic.data.curate.reader import (ROW_BITS, Block, InputFile, infer_markup_format, plan_blocks, read_block,
                                        relative_name)
from elastic.data.documents import BadRows
from elastic.data.sources import DataError, resolve_files, stdlib_source

REPORT = "curate_report.json"
FUNNEL = "curate_funnel.png"
EXAMPLE_CHARS = 300
# Reason prefix -> the stage that gives it (the funnel's steps).
REASON_STAGE = {"lang": "langid", "gopher": "gopher_quality", "gopher_rep": "gopher_repetition", "c4": "c4",
                "fineweb": "fineweb", "toxic": "toxicity", "perplexity": "perplexity",
                "exact_dup": "exact_dedup", "near_dup": "near_dedup"}


def stage_of(reason: str) -> str:
    return REASON_STAGE.get(reason.split(":", 1)[0], reason.split(":", 1)[0])


@dataclass
class CurateResult:
    output: str
    data_dir: str
    report_path: str
    funnel_path: str
    report: Dict[str, Any]
    wall_s: float


# ---------------------------------------------------------------- plan


STDLIB_DOCSTRINGS = "stdlib-docstrings"


def _source_root(source: str) -> str:
    if source in ("stdlib", STDLIB_DOCSTRINGS):
        return stdlib_source()[0]
    if "://" in source:
        return source.split("://", 1)[1].rstrip("/")
    p = os.path.abspath(source)
    return p if os.path.isdir(p) else os.path.dirname(p)


def plan_inputs(cs) -> List[InputFile]:
    """The sorted input files. "stdlib-docstrings": the standard library's .py files, each read
    as the document made of its docstrings (format "pydoc")."""
    pydoc = cs.source == STDLIB_DOCSTRINGS
    markup = cs.format in ("html", "warc")
    files = resolve_files("stdlib" if pydoc else cs.source, cs.glob, "auto" if markup else cs.format)
    root = _source_root(cs.source)
    return [InputFile(i, f.uri, "pydoc" if pydoc else infer_markup_format(f.path, cs.format, f.format),
                      relative_name(f.path, root), f.size)
            for i, f in enumerate(files)]


def _fingerprint(cs, files: List[InputFile]) -> str:
    """What decides the output: the config (less worker count and report options) and the inputs."""
    conf = dataclasses.asdict(cs)
    for k in ("workers", "output", "examples_per_reason"):
        conf.pop(k, None)
    if "perplexity" not in cs.stages:  # outputs curated before these settings existed still resume
        for k in ("perplexity_use_gpu", "perplexity_dtype", "perplexity_token_budget"):
            conf.pop(k, None)
    body = json.dumps({"config": conf, "files": [(f.name, f.size) for f in files]}, sort_keys=True)
    return hashlib.sha256(body.encode()).hexdigest()[:16]


def _atomic_write_bytes(path: str, data: bytes) -> None:
    """Write under a temporary name, then rename: a killed process leaves no half file (no
    fsync: the unit of recovery is a crashed job, not a crashed machine)."""
    tmp = f"{path}.tmp-{os.getpid()}"
    with open(tmp, "wb") as f:
        f.write(data)
    os.replace(tmp, path)


def _atomic_json(path: str, obj: Any) -> None:
    _atomic_write_bytes(path, json.dumps(obj, indent=1, sort_keys=True).encode())


def _atomic_parquet(path: str, table: pa.Table) -> None:
    tmp = f"{path}.tmp-{os.getpid()}"
    pq.write_table(table, tmp, compression="zstd")
    os.replace(tmp, path)


class Layout:
    def __init__(self, output: str):
        self.root = os.path.abspath(output)
        self.data = os.path.join(self.root, "data")
        self.removed = os.path.join(self.root, "removed")
        self.work = os.path.join(self.root, "work")
        self.blocks = os.path.join(self.work, "blocks")
        self.done = os.path.join(self.work, "done")
        self.plan = os.path.join(self.work, "plan.json")
        self.dedup = os.path.join(self.work, "dedup.parquet")

    def block_parquet(self, i: int) -> str:
        return os.path.join(self.blocks, f"block-{i:05d}.parquet")

    def block_marker(self, i: int) -> str:
        return os.path.join(self.blocks, f"block-{i:05d}.json")

    def part(self, i: int) -> str:
        return os.path.join(self.data, f"part-{i:05d}.parquet")

    def removed_part(self, i: int) -> str:
        return os.path.join(self.removed, f"part-{i:05d}.parquet")

    def done_marker(self, i: int) -> str:
        return os.path.join(self.done, f"part-{i:05d}.json")

    def make(self) -> None:
        for d in (self.data, self.removed, self.blocks, self.done):
            os.makedirs(d, exist_ok=True)


# ---------------------------------------------------------------- step 1: per-document pass

BLOCK_SCHEMA = pa.schema([("order", pa.int64()), ("id", pa.string()), ("text", pa.string()), ("reason", pa.string()),
                          ("content_hash", pa.binary()), ("bands", pa.list_(pa.uint64())), ("lang", pa.string()),
                          ("lang_score", pa.float64()), ("perplexity", pa.float64())])


def curate_block(pipe: DocPipeline, block: Block, layout: Layout, examples: int) -> Dict[str, Any]:
    """Read, run the per-document stages, commit the block file and then its marker."""
    t0 = time.perf_counter()
    cs = pipe.cs
    bad = BadRows(keep=examples)
    docs = read_block(block, cs.text_field, cs.id_field, bad)
    bytes_in = sum(len(d["text"].encode("utf-8")) for d in docs)
    out, counts = pipe.run(docs)
    cols = {name: [d.get(name) for d in out] for name in BLOCK_SCHEMA.names}
    cols["bands"] = [d.get("bands") if d.get("bands") else None for d in out]
    _atomic_parquet(layout.block_parquet(block.index), pa.table(cols, schema=BLOCK_SCHEMA))
    reasons = Counter(d["reason"] for d in out if d["reason"])
    ex: Dict[str, List[Dict[str, str]]] = {}
    for d in out:
        r = d["reason"]
        if r and len(ex.setdefault(r, [])) < examples:
            ex[r].append({"id": d["id"], "text": d["text"][:EXAMPLE_CHARS]})
    summary = {"block": block.index, "docs_in": len(docs), "bytes_in": bytes_in, "removed": dict(reasons),
               "counts": counts, "bad_rows": bad.to_dict(), "examples": ex, "seconds": time.perf_counter() - t0}
    _atomic_json(layout.block_marker(block.index), summary)
    return summary


class BlockCurator:
    """Ray Data actor (map_batches with a class): the stages are built once per actor."""

    def __init__(self, cs, root: str):
        scorer = None
        if "perplexity" in cs.stages and not cs.perplexity_scorer:  # the model loads once per actor
            from elastic.launch.curate_scorer import make_scorer

            scorer = make_scorer(cs)
        self.pipe = DocPipeline(cs, scorer=scorer)
        self.layout = Layout(root)
        self.examples = cs.examples_per_reason

    def __call__(self, batch: Dict[str, Any]) -> Dict[str, List[str]]:
        out = []
        for spec in batch["block"]:
            block = _block_from_json(str(spec))
            out.append(json.dumps(curate_block(self.pipe, block, self.layout, self.examples)))
        return {"summary": out}


def _block_to_json(b: Block) -> str:
    return json.dumps({"index": b.index, "files": [dataclasses.asdict(f) for f in b.files]})


def _block_from_json(s: str) -> Block:
    d = json.loads(s)
    return Block(d["index"], tuple(InputFile(**f) for f in d["files"]))


# ---------------------------------------------------------------- step 2: dedup


def run_dedup(cs, layout: Layout, blocks: List[Block]) -> pa.Table:
    """Global exact + near dedup over the kept documents of every block -> (order, reason, dup_of).

    Reads only the order, id, hash and band columns; the band keys stay numpy (uint64[n, bands]),
    so the driver holds ~8 * bands bytes per document plus the exact hashes."""
    import numpy as np

    if os.path.exists(layout.dedup):
        return pq.read_table(layout.dedup)
    want_exact, want_near = "exact_dedup" in cs.stages, "near_dedup" in cs.stages
    orders, ids, hashes, band_orders, bands = [], [], [], [], []
    for b in blocks:
        t = pq.read_table(layout.block_parquet(b.index), columns=["order", "id", "reason", "content_hash", "bands"])
        t = t.filter(pc.equal(t.column("reason"), ""))
        if t.num_rows == 0:
            continue
        orders.append(t.column("order").to_numpy())
        ids.append(t.column("id").combine_chunks())
        if want_exact:
            hashes.extend(t.column("content_hash").to_pylist())
        if want_near:
            bt = t.filter(pc.invert(pc.is_null(t.column("bands"))))
            if bt.num_rows:
                flat = pc.list_flatten(bt.column("bands")).to_numpy()
                bands.append(flat.reshape(bt.num_rows, -1))
                band_orders.append(bt.column("order").to_numpy())
    all_orders = np.concatenate(orders) if orders else np.zeros(0, np.int64)  # ascending: input order
    removed: Dict[int, Tuple[str, int]] = {}
    if want_exact and len(all_orders):
        for k, keep in exact_duplicates(all_orders.tolist(), hashes).items():
            removed[k] = ("exact_dup", keep)
    if want_near and bands:
        bo, ba = np.concatenate(band_orders), np.concatenate(bands)
        live = ~np.isin(bo, np.fromiter(removed, dtype=np.int64, count=len(removed)))
        for k, keep in near_duplicates(bo[live], ba[live]).items():
            removed[k] = ("near_dup", keep)
    ks = sorted(removed)
    keep_at = np.searchsorted(all_orders, np.asarray([removed[k][1] for k in ks], dtype=np.int64))
    all_ids = pa.concat_arrays(ids) if ids else pa.array([], pa.string())
    table = pa.table({"order": pa.array(ks, pa.int64()),
                      "reason": pa.array([removed[k][0] for k in ks], pa.string()),
                      "dup_of": all_ids.take(pa.array(keep_at, pa.int64())) if ks else pa.array([], pa.string())})
    _atomic_parquet(layout.dedup, table)
    return table


# ---------------------------------------------------------------- step 3: final pass

OUT_SCHEMA = pa.schema([("text", pa.string()), ("id", pa.string())])
REMOVED_SCHEMA = pa.schema([("id", pa.string()), ("reason", pa.string()), ("dup_of", pa.string()), ("text", pa.string())])
PPL = pa.field("perplexity", pa.float64())  # both outputs, when the perplexity stage is on


def finish_block(index: int, root: str, dedup: Dict[int, Tuple[str, str]], examples: int,
                 ppl: bool = False) -> Dict[str, Any]:
    layout = Layout(root)
    t = pq.read_table(layout.block_parquet(index),
                      columns=["order", "id", "text", "reason"] + (["perplexity"] if ppl else [])).to_pylist()
    kept, removed = [], []
    ex: Dict[str, List[Dict[str, str]]] = {}
    for d in t:
        reason, dup_of = d["reason"], None
        if not reason and d["order"] in dedup:
            reason, dup_of = dedup[d["order"]]
            if len(ex.setdefault(reason, [])) < examples:
                ex[reason].append({"id": d["id"], "dup_of": dup_of, "text": d["text"][:EXAMPLE_CHARS]})
        if reason:
            removed.append({"id": d["id"], "reason": reason, "dup_of": dup_of, "text": d["text"],
                            "perplexity": d.get("perplexity")})
        else:
            kept.append(d)
    if removed:
        rs = REMOVED_SCHEMA.append(PPL) if ppl else REMOVED_SCHEMA
        _atomic_parquet(layout.removed_part(index), pa.Table.from_pylist(removed, schema=rs))
    if kept:
        cols = {"text": [d["text"] for d in kept], "id": [d["id"] for d in kept]}
        if ppl:
            cols["perplexity"] = [d["perplexity"] for d in kept]
        _atomic_parquet(layout.part(index), pa.table(cols, schema=OUT_SCHEMA.append(PPL) if ppl else OUT_SCHEMA))
    summary = {"block": index, "docs_out": len(kept), "bytes_out": sum(len(d["text"].encode("utf-8")) for d in kept),
               "dedup_removed": dict(Counter(r["reason"] for r in removed if r["reason"] in ("exact_dup", "near_dup"))),
               "dedup_examples": ex}
    _atomic_json(layout.done_marker(index), summary)
    return summary


def _finish_batch(batch: Dict[str, Any], root: str, dedup_ref, examples: int, ppl: bool = False) -> Dict[str, List[str]]:
    import ray

    dedup = ray.get(dedup_ref[0]) if isinstance(dedup_ref, list) else dedup_ref
    return {"summary": [json.dumps(finish_block(int(i), root, dedup, examples, ppl)) for i in batch["index"]]}


# ---------------------------------------------------------------- report


def _merge_examples(dst: Dict[str, list], src: Dict[str, list], n: int) -> None:
    for r, xs in src.items():
        d = dst.setdefault(r, [])
        d.extend(xs[: max(0, n - len(d))])


def build_report(cs, files: List[InputFile], blocks: List[Block], step1: List[dict], step3: List[dict],
                 wall_s: float, resumed: Dict[str, int], layout: Layout) -> Dict[str, Any]:
    step1 = sorted(step1, key=lambda s: s["block"])
    step3 = sorted(step3, key=lambda s: s["block"])
    docs_in = sum(s["docs_in"] for s in step1)
    bytes_in = sum(s["bytes_in"] for s in step1)
    reasons: Counter = Counter()
    counts: Counter = Counter()
    bad = BadRows(keep=cs.examples_per_reason * 4)
    examples: Dict[str, list] = {}
    for s in step1:
        reasons.update(s["removed"])
        counts.update(s["counts"])
        bad.merge(BadRows.from_dict(s["bad_rows"]))
        _merge_examples(examples, s["examples"], cs.examples_per_reason)
    for s in step3:
        reasons.update(s["dedup_removed"])
        _merge_examples(examples, s["dedup_examples"], cs.examples_per_reason)
    docs_out = sum(s["docs_out"] for s in step3)
    bytes_out = sum(s["bytes_out"] for s in step3)
    per_stage: Counter = Counter()
    for r, n in reasons.items():
        per_stage[stage_of(r)] += n
    funnel = [{"stage": "input", "docs": docs_in}]
    left = docs_in
    # Removals before the stages (the reader's: "html:no_text") come first.
    for st in sorted(s for s in per_stage if s not in cs.stages) + list(cs.stages):
        left -= per_stage.get(st, 0)
        funnel.append({"stage": st, "removed": per_stage.get(st, 0), "docs": left})
    pii = {k[4:]: v for k, v in counts.items() if k.startswith("pii_")}
    return {
        "source": cs.source, "output": layout.data, "stages": list(cs.stages),
        "files": len(files), "blocks": len(blocks), "workers": cs.workers,
        "resumed": resumed,
        "docs_in": docs_in, "docs_out": docs_out, "bytes_in": bytes_in, "bytes_out": bytes_out,
        "removed_by_stage": dict(sorted(per_stage.items())),
        "removed_by_reason": dict(sorted(reasons.items())),
        "funnel": funnel,
        "pii_redactions": pii,
        "stage_counts": {k: v for k, v in sorted(counts.items()) if not k.startswith("pii_")},
        "bad_rows": bad.to_dict(),
        "examples": dict(sorted(examples.items())),
        "wall_s": round(wall_s, 3),
        # docs/s and MB/s: documents (bytes of text) read, over this run's wall time, whole job.
        "docs_per_s": round(docs_in / wall_s, 1) if wall_s > 0 else None,
        "mb_per_s": round(bytes_in / 1e6 / wall_s, 3) if wall_s > 0 else None,
        "per_stage_config": {"languages": cs.languages, "lang_min_score": cs.lang_min_score,
                             "gopher_quality": cs.gopher_quality, "gopher_repetition": cs.gopher_repetition,
                             "c4": cs.c4, "fineweb": cs.fineweb, "skip_rules": cs.skip_rules,
                             "toxic_threshold": cs.toxic_threshold,
                             "minhash": [cs.minhash_ngram, cs.minhash_bands, cs.minhash_rows, cs.minhash_seed]},
    }


def plot_funnel(report: Dict[str, Any], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    f = report["funnel"]
    labels = [s["stage"] for s in f]
    docs = [s["docs"] for s in f]
    fig, ax = plt.subplots(figsize=(7, 0.45 * len(f) + 1.2))
    y = list(range(len(f)))[::-1]
    ax.barh(y, docs, color="#4c72b0")
    top = max(docs) if docs and max(docs) > 0 else 1
    for yi, s in zip(y, f):
        txt = f"{s['docs']:,}" + (f"  (-{s['removed']:,})" if s.get("removed") else "")
        ax.text(s["docs"] + top * 0.01, yi, txt, va="center", fontsize=8)
    ax.set_yticks(y)
    ax.set_yticklabels(labels)
    ax.set_xlim(0, top * 1.3)
    ax.set_xlabel("documents left")
    ax.set_title(f"curation funnel: {report['docs_in']:,} -> {report['docs_out']:,} documents "
                 f"({report['bytes_out'] / 1e6:.1f} of {report['bytes_in'] / 1e6:.1f} MB)", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


# ---------------------------------------------------------------- driver


def run_curation(cs, say: Callable[[str], None] = print, stop_after_blocks: Optional[int] = None) -> CurateResult:
    """Curate `cs.source` into `cs.output` (see the module docstring). `stop_after_blocks`
    (tests) commits that many new blocks of step 1 and stops as a crash would."""
    t0 = time.perf_counter()
    check_curate_config(cs)
    if "perplexity" in cs.stages and not cs.perplexity_scorer:
        from elastic.launch.curate_scorer import check_model

        problem = check_model(cs.perplexity_model)
        if problem:
            raise ConfigError(problem)
    files = plan_inputs(cs)  # DataError before any work
    blocks = plan_blocks(files, max(1, int(cs.block_mb * 1e6)))
    layout = Layout(cs.output)
    fp = _fingerprint(cs, files)
    if os.path.exists(layout.plan):
        with open(layout.plan) as f:
            old = json.load(f).get("fingerprint")
        if old != fp:
            raise ConfigError(f"curate.output {layout.root} holds a curation of another input or config "
                              "(delete it or choose another output)")
    layout.make()
    _atomic_json(layout.plan, {"fingerprint": fp, "files": len(files), "blocks": len(blocks)})

    step1: Dict[int, dict] = {}
    for b in blocks:
        m = layout.block_marker(b.index)
        if os.path.exists(m) and os.path.exists(layout.block_parquet(b.index)):
            with open(m) as f:
                step1[b.index] = json.load(f)
    todo = [b for b in blocks if b.index not in step1]
    if stop_after_blocks is not None:
        todo = todo[:stop_after_blocks]
    resumed = {"blocks_done_before": len(step1), "blocks_run": len(todo)}
    say(f"[curate] {len(files)} files in {len(blocks)} blocks, stages: {', '.join(cs.stages)}"
        + (f"; resuming: {len(step1)} blocks already done" if step1 else ""))

    import ray
    import ray.data

    from elastic.launch.runtime.cluster import connect, resolve_cluster
    from elastic.launch.driver import worker_env

    connect(resolve_cluster(), max(os.cpu_count() or 1, 2), worker_env())
    logging.getLogger("ray.data").setLevel(logging.ERROR)
    ctx = ray.data.DataContext.get_current()
    ctx.enable_progress_bars = False
    ctx.print_on_execution_start = False
    ctx.verbose_stats_logs = False
    if todo:
        warnings.filterwarnings("ignore", message=".*ray_remote_args.*deprecated")  # max_restarts below
        ds = ray.data.from_items([{"block": _block_to_json(b)} for b in todo], override_num_blocks=len(todo))
        n = min(cs.workers, len(todo))
        from elastic.launch.curate_scorer import wants_gpu

        gpus = ray.cluster_resources().get("GPU", 0)
        res = {"num_cpus": 1}
        if wants_gpu(cs, gpus):  # the perplexity model: one GPU per actor
            n, res = max(1, min(n, int(gpus))), {"num_cpus": 1, "num_gpus": 1}
        ds = ds.map_batches(BlockCurator, fn_constructor_kwargs={"cs": cs, "root": layout.root}, batch_size=1,
                            compute=ray.data.ActorPoolStrategy(size=n), max_restarts=0, **res)
        for row in ds.iter_rows():
            s = json.loads(row["summary"])
            step1[s["block"]] = s
    if stop_after_blocks is not None and len(step1) < len(blocks):
        raise InterruptedError(f"stopped after {len(todo)} blocks (stop_after_blocks)")

    dedup_t = run_dedup(cs, layout, blocks) if any(s in cs.stages for s in ("exact_dedup", "near_dedup")) else \
        pa.table({"order": pa.array([], pa.int64()), "reason": pa.array([], pa.string()), "dup_of": pa.array([], pa.string())})
    dedup = {o: (r, d) for o, r, d in zip(dedup_t.column("order").to_pylist(), dedup_t.column("reason").to_pylist(),
                                         dedup_t.column("dup_of").to_pylist())}

    step3: Dict[int, dict] = {}
    for b in blocks:
        m = layout.done_marker(b.index)
        if os.path.exists(m):
            with open(m) as f:
                step3[b.index] = json.load(f)
    todo3 = [b.index for b in blocks if b.index not in step3]
    if todo3:
        ref = ray.put(dedup)
        ds = ray.data.from_items([{"index": i} for i in todo3], override_num_blocks=len(todo3))
        ds = ds.map_batches(_finish_batch, fn_kwargs={"root": layout.root, "dedup_ref": [ref],
                                                      "examples": cs.examples_per_reason,
                                                      "ppl": "perplexity" in cs.stages},
                            batch_size=1, num_cpus=1,
                            compute=ray.data.TaskPoolStrategy(size=max(1, min(cs.workers, len(todo3)))))
        for row in ds.iter_rows():
            s = json.loads(row["summary"])
            step3[s["block"]] = s
    wall = time.perf_counter() - t0
    report = build_report(cs, files, blocks, list(step1.values()), list(step3.values()), wall, resumed, layout)
    report_path = os.path.join(layout.root, REPORT)
    _atomic_json(report_path, report)
    funnel_path = os.path.join(layout.root, FUNNEL)
    plot_funnel(report, funnel_path)
    return CurateResult(layout.root, layout.data, report_path, funnel_path, report, wall)


def read_curated(data_dir: str) -> pa.Table:
    """The curated documents in order (every part file, by name)."""
    parts = sorted(p for p in os.listdir(data_dir) if p.endswith(".parquet"))
    tables = [pq.read_table(os.path.join(data_dir, p)) for p in parts]
    return pa.concat_tables(tables) if tables else pa.table({"text": pa.array([], pa.string()), "id": pa.array([], pa.string())})


__all__ = ["run_curation", "CurateResult", "read_curated", "DataError", "ConfigError", "ROW_BITS", "doc_stage_names"]
