"""Input-pipeline scale figures: tokenize+pack efficiency, tokenization CPU per run against
world size, and the data-wait share of step time.

1. **tokenize+pack per core.** The store builder builds `--shards` shards (read → tokenize →
   pack → commit to the cache) on a local Ray cluster of `--cpus` CPUs, through its Ray Data
   pipeline with `--cpus` packer actors (wall time from the first build start to the last
   commit: actor start-up, once per run, left out and reported apart). Baseline, same shards
   and same number of cores: bare HF `tokenizers` `Tokenizer.encode_batch` over the shards'
   documents (already read, in memory; RAYON_NUM_THREADS=`--cpus`). Both as tokens per
   CPU-second (process CPU time: the tokenizer's threads included; robust on a shared
   machine) and tokens/s/core from wall time. Tokens = real tokens including one EOS per
   document, for both. Goal: ratio >= 0.8.
2. **Tokenization CPU-seconds of a run at world size 1, 2, 4.** The same short pretraining job
   at each world size (`--run-steps` steps); CPU-seconds summed from the shard cache's build
   records (each build task measures its own process time). Goal: equal, not ×W. With
   `--repo` pointing at a checkout whose workers each tokenize the whole stream, the job
   writes the same figure to `$ELASTIC_TOKENIZE_LOG` (an instrumentation patch, see the
   README's Measured section) and that is summed instead.
3. **Data wait of the default job.** `jobs/pretrain.py` with the embedded default config
   (`--job-steps` overrides its step count), data_wait_s ÷ step_s from metrics.jsonl, over all
   steps and over steady steps (the first step of each worker-group attempt left out, as the
   run report does). Goal: < 2%.

  python bench/data_throughput.py                       # all three, ~15 min on 2 cores
  python bench/data_throughput.py --only 1 --cpus 2
  python bench/data_throughput.py --repo /tmp/before    # figures 2 and 3 of another checkout
  python bench/data_throughput.py --smoke               # tiny, what CI runs (one Ray instance for all,
                                                        # figure 3 beside figure 2; deletes its runs)
"""

from __future__ import annotations

import argparse
import concurrent.futures
import contextlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from typing import Dict, List

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

from bench.smoke_cluster import shared_instance  # noqa: E402
from elastic.records import read_records  # noqa: E402

# Smoke: one Ray instance for figure 1's builds and every job (bench/smoke_cluster.py), its
# logical CPUs what figure 3's job and a world-size run hold at once (2 workers and 2 packers
# each; figure 1 then has more than --cpus, its packer actors stay --cpus).
SMOKE_CPUS = 8


# ---------------------------------------------------------------- 1. per-core efficiency


BARE = r"""
import json, os, sys, time
from tokenizers import Tokenizer
docs = json.load(open(sys.argv[1]))
tok = Tokenizer.from_file(sys.argv[2])
tok.encode_batch(docs[:8])  # warm the thread pool
c0, t0 = time.process_time(), time.perf_counter()
enc = tok.encode_batch(docs)
cpu, wall = time.process_time() - c0, time.perf_counter() - t0
print(json.dumps({"tokens": sum(len(e.ids) + 1 for e in enc), "cpu_s": cpu, "wall_s": wall}))
"""


def per_core(a, tmp: str) -> Dict:
    import ray

    from elastic.data import prepare_data_plan
    from elastic.data.builder import start_builder
    from elastic.data.documents import read_shard
    from elastic.data.store import ShardCache

    plan = prepare_data_plan(a.source, "**/*", "auto", "text", "", a.vocab, a.tokenizer_mb, a.seq_len, a.shard_mb, 0,
                             True, tokenizer_save_path=os.path.join(tmp, "tok.json"), tokenize_cpus=1.0)
    plan.shards = plan.shards[: a.shards]
    docs = [d for s in plan.shards for d in read_shard(s, plan.text_field)[0]]
    with open(os.path.join(tmp, "docs.json"), "w") as f:
        json.dump(docs, f)
    runs = []
    for _ in range(a.repeat):
        env = {**os.environ, "RAYON_NUM_THREADS": str(a.cpus)}
        out = subprocess.run([sys.executable, "-c", BARE, os.path.join(tmp, "docs.json"), os.path.join(tmp, "tok.json")],
                             capture_output=True, text=True, env=env, check=True)
        runs.append(json.loads(out.stdout.strip().splitlines()[-1]))
    bare = min(runs, key=lambda r: r["cpu_s"])  # the least disturbed run

    own = not ray.is_initialized()  # smoke: this process already holds the run's shared instance
    if own:
        ray.init(address="local", num_cpus=a.cpus, include_dashboard=False, log_to_driver=False,
                 runtime_env={"env_vars": {"PYTHONPATH": REPO}})
    builder = None
    try:
        root = os.path.join(tmp, "cache")
        # One Ray Data pipeline with `--cpus` packer actors (elastic/data/builder.py).
        builder = start_builder({"train": plan}, root, build_ahead=len(plan.shards), actors=a.cpus)
        t0 = time.perf_counter()
        ray.get([builder.meta.remote("train", i) for i in range(len(plan.shards))])
        wall_with_startup = time.perf_counter() - t0
    finally:
        if own:
            ray.shutdown()
        elif builder is not None:  # the instance goes on: end the builder and its pipeline's actors
            ray.get(builder.close.remote(), timeout=15)
            ray.kill(builder)
    builds = read_records(ShardCache(root, plan).builds_log)
    # Wall time of the builds themselves, first start to last commit: actor start-up (a
    # process and the tokenizer, once per run) is not tokenization.
    wall = max(b["time"] for b in builds) - min(b["time"] - b["wall_s"] for b in builds)
    tokens, cpu = sum(b["tokens"] for b in builds), sum(b["cpu_s"] for b in builds)
    tok_cpu = sum(b.get("tokenize_cpu_s", 0) for b in builds)
    res = {
        "shards": len(plan.shards), "documents": len(docs), "cpus": a.cpus,
        "bare": {**bare, "tokens_per_cpu_s": bare["tokens"] / bare["cpu_s"], "tokens_per_s_per_core": bare["tokens"] / bare["wall_s"] / a.cpus},
        "store": {"tokens": tokens, "cpu_s": cpu, "wall_s": wall, "wall_with_startup_s": wall_with_startup,
                  "tokens_per_cpu_s": tokens / cpu,
                  "tokens_per_s_per_core": tokens / wall / a.cpus, "read_tokenize_pack_cpu_s": tok_cpu},
    }
    res["ratio_cpu"] = res["store"]["tokens_per_cpu_s"] / res["bare"]["tokens_per_cpu_s"]
    # The same without writing the cache file (what a streaming pipeline's tokenize stage does).
    res["ratio_cpu_read_tokenize_pack"] = tokens / max(tok_cpu, 1e-9) / res["bare"]["tokens_per_cpu_s"]
    # What one GPU's trainer eats, and so how many tokenize cores it needs now that each token
    # is tokenized once per run (not once per worker): tokens/s = MFU x peak / FLOPs per token.
    from elastic.config import PRESETS
    from elastic.model import ModelArgs, flops_per_token

    margs = ModelArgs(**{**PRESETS[a.preset], "vocab_size": a.gpu_vocab, "max_seq_len": a.gpu_seq_len})
    fpt = flops_per_token(margs, a.gpu_seq_len)
    need = a.mfu * a.peak / fpt
    res["trainer"] = {"preset": a.preset, "seq_len": a.gpu_seq_len, "mfu": a.mfu, "peak": a.peak, "flops_per_token": fpt,
                      "tokens_per_s_per_gpu": need, "cores_per_gpu": need / res["store"]["tokens_per_cpu_s"]}
    res["ratio_wall"] = res["store"]["tokens_per_s_per_core"] / res["bare"]["tokens_per_s_per_core"]
    return res


# ---------------------------------------------------------------- jobs (figures 2 and 3)


def run_job(repo: str, storage: str, name: str, overrides: List[str], log: str, ray_address: str = "local") -> Dict:
    """One jobs/pretrain.py run of `repo` in its own process and private Ray instance (smoke:
    on the run's shared instance, `ray_address`)."""
    env = {**os.environ, "RAY_ADDRESS": ray_address, "WANDB_MODE": "disabled", "PYTHONPATH": repo,
           "ELASTIC_TOKENIZE_LOG": os.path.join(storage, name + "-tokenize.jsonl")}
    args = [sys.executable, os.path.join(repo, "jobs", "pretrain.py"), "--set", f"run.storage_path={storage}",
            "--set", f"run.name={name}", "--set", "wandb.mode=disabled"]
    for o in overrides:
        args += ["--set", o]
    t0 = time.time()
    with open(log, "w") as f:
        rc = subprocess.run(args, stdout=f, stderr=subprocess.STDOUT, env=env, cwd=repo).returncode
    run_dir = os.path.join(storage, name)
    metrics = [r for r in read_records(os.path.join(run_dir, "metrics.jsonl")) if "step" in r]
    return {"rc": rc, "wall_s": time.time() - t0, "run_dir": run_dir, "metrics": metrics, "log": log,
            "tokenize_log": env["ELASTIC_TOKENIZE_LOG"]}


def log_tail(job: Dict, n: int = 20) -> str:
    """The end of a failed job's log (a smoke run deletes its runs, the log with them)."""
    with open(job["log"], errors="replace") as f:
        return "\n".join(f.read().splitlines()[-n:])


def tokenize_cpu(job: Dict) -> Dict:
    """Tokenization CPU-seconds and tokens of a run: the cache's build records, or the
    instrumentation log of a checkout without a cache."""
    cache = os.path.join(job["run_dir"], "cache")
    if os.path.isdir(cache):
        from elastic.data.store import build_summary

        s = build_summary(cache)
        return {"source": "cache build records", "cpu_s": sum(v["cpu_s"] for v in s.values()),
                "read_tokenize_pack_cpu_s": sum(v["tokenize_cpu_s"] for v in s.values()),
                "tokens": sum(v["tokens"] for v in s.values()), "builds": sum(v["builds"] for v in s.values())}
    recs = read_records(job["tokenize_log"])
    cpu = sum(r["cpu_s"] for r in recs)
    return {"source": "ELASTIC_TOKENIZE_LOG", "cpu_s": cpu, "read_tokenize_pack_cpu_s": cpu,
            "tokens": sum(r.get("tokens", 0) for r in recs), "builds": sum(1 for r in recs if r.get("fn") == "tokenize_and_pack")}


def world_sizes(a, tmp: str) -> List[Dict]:
    rows = []
    for w in a.worlds:
        over = [f"train.steps={a.run_steps}", "train.global_batch_size=16", "train.micro_batch_size=4",
                f"data.shard_mb={a.run_shard_mb}", f"scaling.min_workers={w}", f"scaling.max_workers={w}",
                f"checkpoint.every_steps={a.run_steps}", "data.tokenize_cpus=1"] + a.extra
        job = run_job(a.repo, tmp, f"ws{w}", over, os.path.join(tmp, f"ws{w}.log"), a.ray_address)
        if job["rc"] != 0:
            raise SystemExit(f"world size {w} run failed (exit {job['rc']}); log: {job['log']}\n" + log_tail(job))
        t = tokenize_cpu(job)
        trained = sum(r["tokens"] for r in job["metrics"])
        rows.append({"world_size": w, "tokenize_cpu_s": t["cpu_s"], "read_tokenize_pack_cpu_s": t["read_tokenize_pack_cpu_s"],
                     "tokens_tokenized": t["tokens"],
                     "tokens_trained": trained, "tokenized_per_trained": t["tokens"] / max(1, trained),
                     "builds": t["builds"], "source": t["source"], "wall_s": job["wall_s"],
                     "load_avg_1m_at_end": os.getloadavg()[0]})
    base = rows[0]["tokenize_cpu_s"]
    for r in rows:
        r["cpu_vs_world_1"] = r["tokenize_cpu_s"] / base if base else None
    return rows


def wait_share(run_dir: str) -> Dict:
    """data_wait_s ÷ step_s over all steps, and over steady steps (the first step of each
    worker-group attempt left out: a new group's first batch waits for the first shard)."""
    metrics = [r for r in read_records(os.path.join(run_dir, "metrics.jsonl")) if "step" in r]
    starts = sorted(e["time"] for e in read_records(os.path.join(run_dir, "events.jsonl")) if e.get("event") == "start")
    firsts = {min((i for i, r in enumerate(metrics) if r["time"] >= t), default=-1) for t in starts} | {0}
    steady = [r for i, r in enumerate(metrics) if i not in firsts]

    def share(rs):
        return sum(r.get("data_wait_s", 0.0) for r in rs) / max(1e-9, sum(r["step_s"] for r in rs))

    return {"steps": len(metrics), "share_all": share(metrics), "share_steady": share(steady),
            "mean_step_s": sum(r["step_s"] for r in metrics) / max(1, len(metrics)),
            "mean_data_wait_s_steady": sum(r.get("data_wait_s", 0.0) for r in steady) / max(1, len(steady)),
            "max_data_wait_s_steady": max((r.get("data_wait_s", 0.0) for r in steady), default=0.0),
            "first_step_data_wait_s": metrics[0].get("data_wait_s") if metrics else None}


def default_job(a, tmp: str) -> Dict:
    over = [f"train.steps={a.job_steps}"] if a.job_steps else []
    job = run_job(a.repo, tmp, "default", over + a.extra, os.path.join(tmp, "default.log"), a.ray_address)
    if job["rc"] != 0:
        raise SystemExit(f"default job failed (exit {job['rc']}); log: {job['log']}\n" + log_tail(job))
    t = tokenize_cpu(job)
    trained = sum(r["tokens"] for r in job["metrics"])
    return {**wait_share(job["run_dir"]), "wall_s": job["wall_s"], "tokenize_cpu_s": t["cpu_s"],
            "tokens_tokenized": t["tokens"], "tokens_trained": trained, "load_avg_1m_at_end": os.getloadavg()[0]}


# ---------------------------------------------------------------- main


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", default="1,2,3", help="which figures (1, 2, 3)")
    ap.add_argument("--repo", default=REPO, help="checkout whose jobs/pretrain.py runs figures 2 and 3")
    ap.add_argument("--source", default="stdlib")
    ap.add_argument("--cpus", type=int, default=2)
    ap.add_argument("--shards", type=int, default=8, help="shards built for figure 1")
    ap.add_argument("--shard-mb", type=float, default=1.0)
    ap.add_argument("--vocab", type=int, default=2048)
    ap.add_argument("--seq-len", type=int, default=256)
    ap.add_argument("--tokenizer-mb", type=float, default=2.0)
    ap.add_argument("--repeat", type=int, default=3, help="bare encode_batch repetitions (least CPU kept)")
    ap.add_argument("--preset", default="1b", help="trainer model for the cores-per-GPU line")
    ap.add_argument("--gpu-seq-len", type=int, default=4096)
    ap.add_argument("--gpu-vocab", type=int, default=32768)
    ap.add_argument("--mfu", type=float, default=0.5)
    ap.add_argument("--peak", type=float, default=989e12, help="peak FLOP/s of one GPU (H100/H200 dense bf16)")
    ap.add_argument("--worlds", default="1,2,4")
    ap.add_argument("--run-steps", type=int, default=40)
    ap.add_argument("--run-shard-mb", type=float, default=0.25)
    ap.add_argument("--job-steps", type=int, default=0, help="0: the default job's own step count")
    ap.add_argument("--set", dest="extra", action="append", default=[], help="extra overrides for the jobs")
    ap.add_argument("--smoke", action="store_true", help="tiny, on one Ray instance; figure 3's job beside figure 2's runs; "
                    "deletes its runs")
    ap.add_argument("--out", default="bench/results/data_throughput.json")
    a = ap.parse_args(argv)
    a.worlds = [int(w) for w in a.worlds.split(",")]
    only = {int(x) for x in a.only.split(",")}
    if a.smoke:
        a.shards, a.shard_mb, a.tokenizer_mb, a.repeat = 2, 0.1, 0.3, 1
        a.worlds, a.run_steps, a.run_shard_mb, a.job_steps = [1, 2], 3, 0.05, 3
        a.extra += ["data.vocab_size=512", "data.tokenizer_sample_mb=0.3", "data.seq_len=64", "model.dim=64",
                    "model.n_layers=1", "model.n_heads=4", "model.n_kv_heads=2", "model.ffn_hidden=128"]
    a.repo = os.path.abspath(a.repo)
    tmp = tempfile.mkdtemp(prefix="elastic-dt-")
    res: Dict = {"args": {k: v for k, v in vars(a).items()}, "note": "2-core machine shared with other jobs: wall-clock figures are noisy; CPU-second figures are not"}
    a.ray_address = "local"  # each job starts its own instance
    try:
        with contextlib.ExitStack() as stack:
            if a.smoke:
                a.ray_address = stack.enter_context(shared_instance(SMOKE_CPUS))
            figures(a, only, tmp, res)
    finally:
        if a.smoke:  # a smoke run leaves nothing behind (a full run keeps its job logs)
            shutil.rmtree(tmp, ignore_errors=True)
    os.makedirs(os.path.dirname(a.out) or ".", exist_ok=True)
    with open(a.out, "w") as f:
        json.dump(res, f, indent=2)
    print(f"wrote {a.out}" + ("" if a.smoke else f" (runs under {tmp})"))
    return 0


def figures(a, only, tmp: str, res: Dict) -> None:
    """Figures 1, 2, 3 in turn, each printed when measured. Smoke: figure 3's job runs beside
    figure 2's (pretraining jobs with one-thread train workers; CI has 2 cores); figure 1 runs
    alone (its bare baseline runs two tokenizer threads, and measures CPU-seconds)."""
    with concurrent.futures.ThreadPoolExecutor(1) as side:
        if 1 in only:
            r = res["per_core"] = per_core(a, tmp)
            print(f"1. tokenize+pack vs bare encode_batch, {r['shards']} shards, {r['documents']} documents, {a.cpus} cores")
            print(f"   {'':<36}{'tokens':>10}{'CPU s':>9}{'tok/CPU-s':>11}{'wall s':>9}{'tok/s/core':>12}")
            for k, label in (("bare", "bare encode_batch"), ("store", "store build (read+tok+pack+write)")):
                x = r[k]
                print(f"   {label:<36}{x['tokens']:>10}{x['cpu_s']:>9.2f}{x['tokens_per_cpu_s']:>11.0f}{x['wall_s']:>9.2f}{x['tokens_per_s_per_core']:>12.0f}")
            print(f"   ratio store/bare: {r['ratio_cpu']:.2f} per CPU-second, {r['ratio_wall']:.2f} per core from wall time (goal >= 0.8); "
                  f"{r['ratio_cpu_read_tokenize_pack']:.2f} per CPU-second without the cache write")
            t = r["trainer"]
            print(f"   a {t['preset']} trainer at MFU {t['mfu']} x peak {t['peak']:.3e} eats {t['tokens_per_s_per_gpu']:.0f} tok/s/GPU "
                  f"(seq {t['seq_len']}): {t['cores_per_gpu']:.2f} tokenize cores/GPU at the store's tokens per CPU-second")
        fig3 = side.submit(default_job, a, tmp) if a.smoke and {2, 3} <= only else None
        if 2 in only:
            rows = res["world_sizes"] = world_sizes(a, tmp)
            print(f"2. tokenization CPU of a {a.run_steps}-step run (global batch 16) by world size [{rows[0]['source']}]")
            print(f"   {'world':>6}{'tokenize CPU s':>16}{'vs W=1':>8}{'read+tok+pack CPU s':>21}{'tokens tokenized':>18}"
                  f"{'tokens trained':>16}{'ratio':>7}")
            for x in rows:
                print(f"   {x['world_size']:>6}{x['tokenize_cpu_s']:>16.2f}{x['cpu_vs_world_1']:>8.2f}{x['read_tokenize_pack_cpu_s']:>21.2f}"
                      f"{x['tokens_tokenized']:>18}{x['tokens_trained']:>16}{x['tokenized_per_trained']:>7.2f}")
        if 3 in only:
            r = res["default_job"] = fig3.result() if fig3 else default_job(a, tmp)
            print(f"3. default job ({r['steps']} steps): data wait {r['share_all']:.2%} of step time over all steps, "
                  f"{r['share_steady']:.2%} over steady steps (goal < 2%); first step waited {r['first_step_data_wait_s']:.2f} s, "
                  f"steady mean {r['mean_data_wait_s_steady'] * 1e3:.1f} ms, max {r['max_data_wait_s_steady'] * 1e3:.0f} ms; "
                  f"mean step {r['mean_step_s']:.2f} s")
            print(f"   tokenized {r['tokens_tokenized']} tokens in {r['tokenize_cpu_s']:.2f} CPU-s for {r['tokens_trained']} "
                  f"trained; machine load (1 min) at the end {r['load_avg_1m_at_end']:.1f}")


if __name__ == "__main__":
    sys.exit(main())
