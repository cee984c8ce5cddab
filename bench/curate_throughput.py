"""Curation throughput against datatrove: documents/s and MB/s per core, same corpus, same rules.

Two corpora from the running interpreter's standard library (no download), each plus planted
duplicates (every 10th document copied exactly, every 10th at offset 5 copied with every 50th
word replaced: a near duplicate), written once as JSONL (~8 MB files) that both sides read:
"source", one document per .py file (code: the web-text rules remove nearly all of it early,
so mostly language ID and the first Gopher rules run), and "docstrings", the docstrings of
each file (English prose: most documents go through every rule).

Two pipelines, each run by both sides in a child process on one core (per-core figures):

- filters: Unicode repair (ftfy) -> language ID (py3langid, en >= 0.65) -> Gopher quality ->
  Gopher repetition -> C4 -> FineWeb -> PII redaction -> Parquet.
- dedup:   Unicode repair -> PII -> MinHash near dedup (5-gram shingles, 14 bands x 8 rows) ->
  Parquet.

Ours: the job's own per-block functions (elastic/launch/curate.py: curate_block, run_dedup,
finish_block) called in one process, no Ray. datatrove: LocalPipelineExecutor(tasks=1,
workers=1) with JsonlReader, FTFYFormatter, LambdaFilter(py3langid), GopherQualityFilter,
GopherRepetitionFilter, C4QualityFilter, FineWebQualityFilter, PIIFormatter, the four MinHash
steps, ParquetWriter. Differences, stated: datatrove's English word tokenizer needs spaCy, so
datatrove is given our regex word/sentence splitter (elastic/data/curate/text.py) through its
WordTokenizer interface — both sides split words the same way; datatrove's LanguageFilter needs
a fastText model download, so it runs py3langid in a LambdaFilter (the same model as ours);
datatrove's PIIFormatter does e-mail and IPv4 only (ours adds IPv6 and phone numbers); our
exact-dedup and toxicity stages are off (datatrove's bad-words list is a download); datatrove
normalises numbers/dates before MinHash, we do not; datatrove hashes shingles with xxh64 (through a
two-line shim: xxhash >= 4 takes bytes only), we with xxh32.

Per core: documents (and MB of text) read / CPU-seconds of the child (robust on a shared
machine), and / wall seconds. Ratio = ours / datatrove on docs per CPU-second; goal >= 1.
With --ray, also the whole job on Ray Data (`run_curation`, workers = --cpus) on the docstrings
corpus for the union of both pipelines: wall docs/s per core, the Ray cluster's start left out.

  python bench/curate_throughput.py --ray           # stdlib (~1,790 files) + plants, ~6 min on 2 cores
  python bench/curate_throughput.py --smoke         # 60 files, what CI runs
Writes JSON (--out) and deletes its scratch directory.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import shutil
import subprocess
import sys
import tempfile
import time
from typing import Dict, List

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

FILTER_STAGES = ["unicode", "langid", "gopher_quality", "gopher_repetition", "c4", "fineweb", "pii"]
DEDUP_STAGES = ["unicode", "pii", "near_dedup"]
CONFIGS = {"filters": FILTER_STAGES, "dedup": DEDUP_STAGES}
CORPORA = ("source", "docstrings")


# ---------------------------------------------------------------- corpus


def build_corpus(out_dir: str, kind: str, limit: int = 0, file_mb: float = 8.0) -> Dict[str, float]:
    """kind "source": each stdlib .py file is a document; "docstrings": its docstrings are."""
    from elastic.data.curate.reader import docstrings
    from elastic.data.sources import resolve_files, stdlib_source

    root = stdlib_source()[0]
    files = resolve_files("stdlib")
    if limit:
        files = files[:limit]
    docs = []
    for f in files:
        with open(f.path, "rb") as fh:
            text = fh.read().decode("utf-8", errors="replace")
        if kind == "docstrings":
            text = docstrings(text)
        if text.strip():
            docs.append({"id": os.path.relpath(f.path, root), "text": text})
    plants = []
    for i, d in enumerate(docs):
        if i % 10 == 0:
            plants.append({"id": d["id"] + "#copy", "text": d["text"]})
        elif i % 10 == 5:
            r = random.Random(i)
            words = d["text"].split(" ")
            for k in range(49, len(words), 50):
                words[k] = f"zq{r.randrange(10**6)}"
            plants.append({"id": d["id"] + "#near", "text": " ".join(words)})
    rows = docs + plants
    os.makedirs(out_dir, exist_ok=True)
    n, size, fh = 0, 0, None
    total = 0
    for row in rows:
        line = (json.dumps(row) + "\n").encode()
        if fh is None or size + len(line) > file_mb * 1e6:
            if fh:
                fh.close()
            fh = open(os.path.join(out_dir, f"corpus-{n:03d}.jsonl"), "wb")
            n, size = n + 1, 0
        fh.write(line)
        size += len(line)
        total += len(row["text"].encode("utf-8"))
    fh.close()
    return {"docs": len(rows), "planted_exact": sum(p["id"].endswith("#copy") for p in plants),
            "planted_near": sum(p["id"].endswith("#near") for p in plants), "text_mb": total / 1e6, "files": n}


# ---------------------------------------------------------------- the two sides (child processes)


def run_ours(corpus: str, scratch: str, stages: List[str]) -> Dict[str, float]:
    import dataclasses

    from elastic.config.schema import CurateSection
    from elastic.data.curate import DocPipeline
    from elastic.data.curate.reader import plan_blocks
    from elastic.launch.curate import Layout, curate_block, finish_block, plan_inputs, run_dedup

    cs = dataclasses.replace(CurateSection(), source=corpus, glob="*.jsonl", output=scratch, stages=stages)
    files = plan_inputs(cs)
    blocks = plan_blocks(files, int(cs.block_mb * 1e6))
    lay = Layout(scratch)
    lay.make()
    pipe = DocPipeline(cs)
    s1 = [curate_block(pipe, b, lay, 5) for b in blocks]
    dedup = {}
    if "near_dedup" in stages:
        t = run_dedup(cs, lay, blocks)
        dedup = {o: (r, d) for o, r, d in zip(*(t.column(c).to_pylist() for c in ("order", "reason", "dup_of")))}
    s3 = [finish_block(b.index, lay.root, dedup, 5) for b in blocks]
    return {"docs_in": sum(s["docs_in"] for s in s1), "bytes_in": sum(s["bytes_in"] for s in s1),
            "docs_out": sum(s["docs_out"] for s in s3)}


def _datatrove_tokenizer():
    from datatrove.utils.word_tokenizers import WordTokenizer

    from elastic.data.curate.text import _SENT_END, split_words

    class RegexTokenizer(WordTokenizer):
        """Our word splitter behind datatrove's interface (its English default needs spaCy)."""

        def word_tokenize(self, text):
            return split_words(text)

        def span_tokenize(self, text):
            spans, start = [], 0
            for m in _SENT_END.finditer(text):
                spans.append((start, m.end()))
                start = m.end()
            if start < len(text):
                spans.append((start, len(text)))
            return spans

        def sent_tokenize(self, text):
            return [text[a:b] for a, b in self.span_tokenize(text)]

    return RegexTokenizer("en")


_LID = None


def _english(doc) -> bool:
    global _LID
    if _LID is None:
        from py3langid.langid import MODEL_FILE, LanguageIdentifier

        _LID = LanguageIdentifier.from_model_file(MODEL_FILE, norm_probs=True)
    lang, score = _LID.classify(doc.text[:10000])
    return lang == "en" and score >= 0.65


def run_datatrove(corpus: str, scratch: str, stages: List[str]) -> Dict[str, float]:
    import pyarrow.parquet as pq
    from datatrove.executor import LocalPipelineExecutor
    from datatrove.pipeline.dedup.minhash import (MinhashConfig, MinhashDedupBuckets, MinhashDedupCluster,
                                                  MinhashDedupFilter, MinhashDedupSignature)
    from datatrove.pipeline.filters import (C4QualityFilter, FineWebQualityFilter, GopherQualityFilter,
                                            GopherRepetitionFilter, LambdaFilter)
    from datatrove.pipeline.formatters import FTFYFormatter, PIIFormatter
    from datatrove.pipeline.readers import JsonlReader
    from datatrove.pipeline.writers import ParquetWriter

    import xxhash
    from datatrove.utils.hashes import xxhash as dt_xxhash

    # xxhash >= 4 takes bytes only; datatrove 0.x hands it str (xxhash 3 encoded it as UTF-8).
    dt_xxhash.xxhash64 = lambda d: xxhash.xxh64_intdigest(d.encode("utf-8") if isinstance(d, str) else d)
    dt_xxhash.xxhash32 = lambda d: xxhash.xxh32_intdigest(d.encode("utf-8") if isinstance(d, str) else d)
    tok = _datatrove_tokenizer()
    counted = {"docs": 0, "bytes": 0}

    def count(data, rank: int = 0, world_size: int = 1):
        for doc in data:
            counted["docs"] += 1
            counted["bytes"] += len(doc.text.encode("utf-8"))
            yield doc

    def run(pipeline, tasks=1):
        LocalPipelineExecutor(pipeline=pipeline, tasks=tasks, workers=1, skip_completed=False,
                              logging_dir=os.path.join(scratch, "logs", str(time.monotonic_ns()))).run()

    out = os.path.join(scratch, "out")
    reader = JsonlReader(corpus, glob_pattern="*.jsonl", text_key="text", id_key="id")
    if "near_dedup" not in stages:
        run([reader, count, FTFYFormatter(), LambdaFilter(_english), GopherQualityFilter(language=tok),
             GopherRepetitionFilter(language=tok), C4QualityFilter(language=tok), FineWebQualityFilter(language=tok),
             PIIFormatter(), ParquetWriter(out)])
    else:
        cfg = MinhashConfig()  # 5-grams, 14 buckets x 8 hashes
        sigs, buckets, remove = (os.path.join(scratch, d) for d in ("sigs", "buckets", "remove"))
        run([reader, count, FTFYFormatter(), PIIFormatter(), MinhashDedupSignature(sigs, config=cfg, language=tok)])
        run([MinhashDedupBuckets(sigs, buckets, config=cfg)], tasks=cfg.num_buckets)
        run([MinhashDedupCluster(buckets, remove, config=cfg)])
        run([JsonlReader(corpus, glob_pattern="*.jsonl", text_key="text", id_key="id"), FTFYFormatter(),
             PIIFormatter(), MinhashDedupFilter(remove), ParquetWriter(out)])
    docs_out = sum(pq.ParquetFile(os.path.join(r, f)).metadata.num_rows
                   for r, _, fs in os.walk(out) for f in fs if f.endswith(".parquet"))
    return {"docs_in": counted["docs"], "bytes_in": counted["bytes"], "docs_out": docs_out}


def child(side: str, corpus: str, scratch: str, config: str) -> None:
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    c0, t0 = time.process_time(), time.perf_counter()
    res = (run_ours if side == "ours" else run_datatrove)(corpus, scratch, CONFIGS[config])
    res.update(cpu_s=time.process_time() - c0, wall_s=time.perf_counter() - t0)
    print("RESULT " + json.dumps(res))


def measure(side: str, corpus: str, scratch: str, config: str) -> Dict[str, float]:
    d = tempfile.mkdtemp(dir=scratch, prefix=f"{side}-{config}-")
    env = {**os.environ, "PYTHONPATH": REPO, "OMP_NUM_THREADS": "1", "DATATROVE_COLORIZE_LOGS": "0"}
    r = subprocess.run([sys.executable, os.path.abspath(__file__), "--child", side, "--corpus", corpus,
                        "--scratch", d, "--config", config], capture_output=True, text=True, env=env, cwd=REPO)
    if r.returncode != 0:
        raise SystemExit(f"{side}/{config} failed:\n{r.stdout[-2000:]}\n{r.stderr[-3000:]}")
    res = json.loads(next(ln for ln in r.stdout.splitlines() if ln.startswith("RESULT "))[7:])
    shutil.rmtree(d, ignore_errors=True)
    mb = res["bytes_in"] / 1e6
    res.update(docs_per_cpu_s=res["docs_in"] / res["cpu_s"], mb_per_cpu_s=mb / res["cpu_s"],
               docs_per_s=res["docs_in"] / res["wall_s"], mb_per_s=mb / res["wall_s"])
    return res


def measure_ray(corpus: str, scratch: str, cpus: int) -> Dict[str, float]:
    import dataclasses

    import ray

    from elastic.config.schema import CurateSection
    from elastic.launch.curate import run_curation
    from elastic.launch.driver import worker_env

    ray.init(address="local", num_cpus=cpus, include_dashboard=False, log_to_driver=False,
             runtime_env={"env_vars": worker_env()})
    try:
        cs = dataclasses.replace(CurateSection(), source=corpus, glob="*.jsonl", output=os.path.join(scratch, "ray-out"),
                                 stages=FILTER_STAGES + ["near_dedup"], workers=cpus, block_mb=0.5)
        res = run_curation(cs, say=lambda s: None)
        r = res.report
        return {"workers": cpus, "docs_in": r["docs_in"], "docs_out": r["docs_out"], "wall_s": res.wall_s,
                "docs_per_s_per_core": r["docs_in"] / res.wall_s / cpus,
                "mb_per_s_per_core": r["bytes_in"] / 1e6 / res.wall_s / cpus,
                "removed_by_stage": r["removed_by_stage"]}
    finally:
        ray.shutdown()


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--smoke", action="store_true", help="60 stdlib files, both pipelines, no Ray row")
    ap.add_argument("--limit", type=int, default=0, help="stdlib files used (0 = all)")
    ap.add_argument("--cpus", type=int, default=2, help="workers of the --ray row")
    ap.add_argument("--ray", action="store_true", help="also time the whole job on Ray Data")
    ap.add_argument("--write-corpus", metavar="DIR", help="only write the docstrings corpus with its planted copies "
                    "as JSONL into DIR (an input for jobs/curate.py) and exit")
    ap.add_argument("--out", default=os.path.join(REPO, "bench", "results", "curate_throughput.json"))
    ap.add_argument("--child", choices=["ours", "datatrove"], help=argparse.SUPPRESS)
    ap.add_argument("--corpus", help=argparse.SUPPRESS)
    ap.add_argument("--scratch", help=argparse.SUPPRESS)
    ap.add_argument("--config", choices=list(CONFIGS), help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.child:
        child(a.child, a.corpus, a.scratch, a.config)
        return 0
    limit = 60 if a.smoke and not a.limit else a.limit
    if a.write_corpus:
        info = build_corpus(a.write_corpus, "docstrings", limit, file_mb=0.5)
        print(f"wrote {info['docs']:,} documents ({info['planted_exact']} exact and {info['planted_near']} near copies "
              f"planted) to {a.write_corpus}")
        return 0
    scratch = tempfile.mkdtemp(prefix="curate-bench-")
    try:
        rows, infos = [], {}
        for kind in CORPORA:
            corpus = os.path.join(scratch, f"corpus-{kind}")
            # docstrings: 0.5 MB files, so the --ray row has several blocks for its workers
            file_mb = 1.0 if a.smoke else (8.0 if kind == "source" else 0.5)
            info = infos[kind] = build_corpus(corpus, kind, limit, file_mb=file_mb)
            print(f"corpus {kind}: {info['docs']:,} documents ({info['planted_exact']} exact and {info['planted_near']} "
                  f"near copies planted), {info['text_mb']:.1f} MB of text in {info['files']} JSONL files")
            for config in CONFIGS:
                ours = measure("ours", corpus, scratch, config)
                base = measure("datatrove", corpus, scratch, config)
                rows.append({"corpus": kind, "pipeline": config, "stages": CONFIGS[config], "ours": ours, "datatrove": base,
                             "ratio_docs_per_cpu_s": ours["docs_per_cpu_s"] / base["docs_per_cpu_s"],
                             "ratio_wall": ours["docs_per_s"] / base["docs_per_s"]})
        print(f"\n{'corpus':<10} {'pipeline':<8} {'side':<10} {'docs in':>7} {'out':>6} {'cpu s':>6} {'docs/cpu-s':>10} "
              f"{'MB/cpu-s':>8} {'docs/s':>7} {'MB/s':>5} {'ratio':>6}")
        for r in rows:
            for side in ("ours", "datatrove"):
                m = r[side]
                ratio = f"{r['ratio_docs_per_cpu_s']:.2f}x" if side == "ours" else ""
                print(f"{r['corpus']:<10} {r['pipeline']:<8} {side:<10} {m['docs_in']:>7,} {m['docs_out']:>6,} "
                      f"{m['cpu_s']:>6.1f} {m['docs_per_cpu_s']:>10.1f} {m['mb_per_cpu_s']:>8.2f} {m['docs_per_s']:>7.1f} "
                      f"{m['mb_per_s']:>5.2f} {ratio:>6}")
        print("ratio = ours/datatrove, documents per CPU-second on one core (goal >= 1)")
        ray_row = None
        if a.ray and not a.smoke:
            ray_row = measure_ray(os.path.join(scratch, "corpus-docstrings"), scratch, a.cpus)
        if ray_row:
            print(f"\nwhole job on Ray Data, docstrings corpus ({ray_row['workers']} workers, filters + near dedup): "
                  f"{ray_row['docs_in']:,} -> {ray_row['docs_out']:,} documents in {ray_row['wall_s']:.1f}s, "
                  f"{ray_row['docs_per_s_per_core']:.1f} docs/s/core, {ray_row['mb_per_s_per_core']:.2f} MB/s/core")
        res = {"smoke": a.smoke, "corpus": infos, "results": rows, "ray_job": ray_row,
               "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
               "environment": {"python": platform.python_version(), "cpus": os.cpu_count(),
                               "datatrove": _version("datatrove"), "machine": platform.machine()},
               "command": "python bench/curate_throughput.py " + " ".join(argv if argv is not None else sys.argv[1:])}
        os.makedirs(os.path.dirname(os.path.abspath(a.out)), exist_ok=True)
        with open(a.out, "w") as f:
            json.dump(res, f, indent=1)
        print(f"\nwrote {a.out}")
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return 0


def _version(pkg: str) -> str:
    try:
        from importlib.metadata import version

        return version(pkg)
    except Exception:
        return ""


if __name__ == "__main__":
    sys.exit(main())
