"""What a training step costs inside the product against the same step outside it.

Three ways to train the same model on the same batch shape (default: `tiny`, 16 x 256 tokens,
fp32, AdamW, micro-batches of 8, as jobs/configs/tiny.yaml), each in its own process and
measured in this one benchmark run (the machine is shared and noisy, so only ratios are
reported):

  plain  a plain PyTorch loop: one process, `--threads` threads, no torch.distributed
  fsdp1  the project's `parallelize` (FSDP2) + `train_step` at world size 1 over gloo, no Ray
  ray    `jobs/pretrain.py`'s path (Ray Train, the shard cache, the per-worker loop) with one
         worker holding `--threads` CPUs; tokens/s over its steady steps from metrics.jsonl,
         with its step-time split (data wait, forward, backward, optimizer, sync)

Each mode runs `--warmup` steps that are not counted, then `--steps` measured steps. The
modes alternate over `--reps` repetitions and the median is kept.

Where the in-Ray gap goes: over the measured steps, the ray mode reads every process's CPU time
from /proc (the train worker's share of the machine against each other process's: Ray's
daemons and actors, the store builder, shard builds) and the fsdp1 mode its own share. On a
machine whose cores the training threads fill, what the others take is what the step loses.

  .venv/bin/python bench/step_overhead.py                # prints a table, writes bench/results/step_overhead.json
  .venv/bin/python bench/step_overhead.py --modes plain,fsdp1 --profile-steps 10 --out bench/results/step_profile.json
                                                          # where fsdp1's extra time goes, per op
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)


def _config(a, *extra: str):
    from elastic.config import load_config

    return load_config(os.path.join(REPO, "jobs", "configs", "tiny.yaml"), list(extra) + [
        f"train.global_batch_size={a.batch}", f"train.micro_batch_size={a.micro}", f"data.seq_len={a.seq_len}",
        f"train.steps={a.warmup + a.steps}", "train.warmup_steps=0", "wandb.mode=disabled",
        "scaling.min_workers=1", "scaling.max_workers=1", f"scaling.cpus_per_worker={a.threads}",
        f"checkpoint.every_steps={10 * (a.warmup + a.steps)}"])


def _batch(args, batch: int, seq_len: int, seed: int):
    import numpy as np

    rng = np.random.default_rng(seed)
    tokens = rng.integers(0, args.vocab_size, size=(batch, seq_len), dtype=np.int32)
    labels = np.concatenate([tokens[:, 1:], np.full((batch, 1), -100, np.int32)], axis=1)
    return {"tokens": tokens, "labels": labels, "positions": np.tile(np.arange(seq_len, dtype=np.int32), (batch, 1)),
            "doc_ids": np.zeros((batch, seq_len), np.int32)}


class _Profile:
    """With ``--profile-steps N``: torch.profiler (CPU) over the last N measured steps, reduced
    to self CPU time per op and step (what the plain/fsdp1 comparison is made of)."""

    def __init__(self, a) -> None:
        self.n, self.start, self.prof = a.profile_steps, a.warmup + a.steps - a.profile_steps, None

    def at(self, step: int) -> None:
        if self.n and step == self.start:
            from torch.profiler import ProfilerActivity, profile

            self.prof = profile(activities=[ProfilerActivity.CPU])
            self.prof.__enter__()

    def result(self) -> dict:
        if self.prof is None:
            return {}
        self.prof.__exit__(None, None, None)
        ops = {e.key: e.self_cpu_time_total / self.n / 1e6 for e in self.prof.key_averages()}
        return {"profile_self_s_per_step": ops}


def child_plain(a) -> dict:
    """A loop anyone would write: model, AdamW, accumulate over micro-batches, clip, step."""
    import torch
    import torch.nn.functional as F

    from elastic.config import resolved_model_dims
    from elastic.model import ModelArgs, Transformer
    from elastic.model.attention import build_attention_metadata, choose_backend

    torch.set_num_threads(a.threads)
    cfg = _config(a)
    args = ModelArgs(**resolved_model_dims(cfg))
    model = Transformer(args, attention_backend=choose_backend(cfg.model.attention, torch.device("cpu")))
    model.init_weights(seed=0)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.1, betas=(0.9, 0.95))
    times = []
    prof = _Profile(a)
    for step in range(a.warmup + a.steps):
        prof.at(step)
        rows = _batch(args, a.batch, a.seq_len, step)
        t0 = time.perf_counter()
        n = int((rows["labels"] != -100).sum())
        for i in range(0, a.batch, a.micro):
            mb = {k: torch.from_numpy(v[i:i + a.micro]).long() for k, v in rows.items()}
            meta = build_attention_metadata(mb["doc_ids"], model.attention_backend)
            logits = model(mb["tokens"], mb["positions"], mb["doc_ids"], meta)
            loss = F.cross_entropy(logits.float().flatten(0, 1), mb["labels"].flatten(), ignore_index=-100, reduction="sum")
            (loss / n).backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        times.append(time.perf_counter() - t0)
    return {"step_s": times[a.warmup:], **prof.result()}


def child_fsdp1(a) -> dict:
    """The project's FSDP2 wrapping and train_step at world size 1 (gloo), outside Ray."""
    import torch
    import torch.distributed as dist

    from elastic.train.loop import build_model
    from elastic.train.optim import build_optimizer
    from elastic.train.parallelize import parallelize
    from elastic.train.step import causal_lm_loss, label_count, split_micro, train_step
    from elastic.train.comm import Comm
    from elastic.train.timing import StepTimer

    torch.set_num_threads(a.threads)
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", str(29500 + os.getpid() % 1000))
    dist.init_process_group("gloo", rank=0, world_size=1)
    cfg = _config(a)
    dev = torch.device("cpu")
    comm = Comm(dev)
    model, args, _ = build_model(cfg, dev)
    model = parallelize(model, dev, torch.float32)
    opt = build_optimizer(model, 1e-3, 0.1, (0.9, 0.95), fused=False)
    times, phases, marks = [], [], []
    prof = _Profile(a)
    for step in range(a.warmup + a.steps):
        prof.at(step)
        if step == a.warmup:
            marks.append((time.perf_counter(), _process_cpu()))
        rows = _batch(args, a.batch, a.seq_len, step)
        timer = StepTimer(dev)
        t0 = time.perf_counter()
        train_step(model, opt, split_micro(rows, a.micro), causal_lm_loss, float(label_count(rows)), 1.0, comm, timer)
        times.append(time.perf_counter() - t0)
        phases.append(timer.seconds())
    marks.append((time.perf_counter(), _process_cpu()))
    dist.destroy_process_group()
    split = {k: statistics.median(p.get(k, 0.0) for p in phases[a.warmup:]) for k in ("forward_s", "backward_s", "optimizer_s")}
    (t0, c0), (t1, c1) = marks
    own = (c1[os.getpid()][1] - c0[os.getpid()][1]) / (t1 - t0) / (os.cpu_count() or 1)
    return {"step_s": times[a.warmup:], "split": {**split, "step_s": statistics.median(times[a.warmup:])},
            "own_cpu_share": own, **prof.result()}


def _process_cpu() -> dict:
    """{pid: (name, CPU seconds so far)} of every process on this machine (Linux /proc)."""
    hz, out = os.sysconf("SC_CLK_TCK"), {}
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/stat") as f:
                stat = f.read()
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                argv = f.read().split(b"\0")
        except OSError:
            continue
        rest = stat[stat.rindex(")") + 2:].split()
        name = os.path.basename(argv[0].decode(errors="replace")) or stat[stat.index("(") + 1:stat.rindex(")")]
        if name.startswith("python") and len(argv) > 1:  # Ray's Python daemons: name them by their script
            args = [x.decode(errors="replace") for x in argv[1:] if x]
            script = next((x for x in args if x.endswith(".py")), None)
            name = os.path.basename(script) if script else ("python -m " + args[args.index("-m") + 1] if "-m" in args[:-1]
                                                            else "python -c" if "-c" in args else name)
        out[int(pid)] = (name, (int(rest[11]) + int(rest[12])) / hz)
    return out


class _SteadyCPU:
    """Where the machine's CPU goes during the ray mode's measured steps: a driver thread follows
    metrics.jsonl and reads every process's CPU time when the first measured step begins and
    when the last one has been logged. The train worker's share against everything else's is
    the evidence for the in-Ray gap on a machine whose cores the training threads fill."""

    def __init__(self, metrics: str, first: int, last: int):
        import threading

        self.metrics, self.first, self.last = metrics, first, last
        self.marks: list = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _step(self) -> int:
        try:
            with open(self.metrics) as f:
                return max((json.loads(ln).get("step", 0) for ln in f if ln.strip()), default=0)
        except (OSError, ValueError):
            return 0

    def _run(self) -> None:
        for target in (self.first, self.last):
            while not self._stop.is_set() and self._step() < target:
                time.sleep(0.05)
            if self._stop.is_set():
                return
            self.marks.append((time.perf_counter(), _process_cpu()))

    def result(self) -> dict:
        self._stop.set()
        self._thread.join(timeout=5)
        if len(self.marks) < 2:
            return {}
        (t0, a), (t1, b) = self.marks
        share = {}
        for pid, (name, cpu) in b.items():
            used = cpu - a.get(pid, (name, 0.0))[1]
            if used > 0:
                key = "train worker" if name == "ray::RayTrainWorker" else name
                share[key] = share.get(key, 0.0) + used / (t1 - t0) / (os.cpu_count() or 1)
        return {"window_s": t1 - t0, "cpu_share": dict(sorted(share.items(), key=lambda kv: -kv[1]))}


def child_ray(a) -> dict:
    """jobs/pretrain.py's path with one worker holding `--threads` CPUs (a private Ray instance)."""
    from elastic.launch.pretrain import run_pretraining
    from elastic.records import read_records

    os.environ["RAY_ADDRESS"] = "local"
    store = tempfile.mkdtemp(prefix="step-overhead-")
    cfg = _config(a, f"run.storage_path={store}", "run.name=ray", *a.set)
    # Steps warmup+1 .. the one before the last (the last writes a checkpoint).
    cpu = _SteadyCPU(os.path.join(store, "ray", "metrics.jsonl"), a.warmup, a.warmup + a.steps - 1)
    res = run_pretraining(cfg, progress=False, out=open(os.devnull, "w"))
    recs = [r for r in read_records(os.path.join(res.records_dir or res.local_dir, "metrics.jsonl")) if "step" in r]
    steady = [r for r in recs if r["step"] > a.warmup]
    keys = ("data_wait_s", "forward_s", "backward_s", "optimizer_s", "sync_s", "step_s")
    split = {k: statistics.median(r.get(k, 0.0) for r in steady) for k in keys}
    return {"step_s": [r["step_s"] for r in steady], "split": split, "tokens_per_step": steady[0]["tokens"] if steady else 0,
            **cpu.result()}


CHILDREN = {"plain": child_plain, "fsdp1": child_fsdp1, "ray": child_ray}


def run_child(mode: str, a) -> dict:
    cmd = [sys.executable, os.path.abspath(__file__), "--child", mode] + [
        f"--{k.replace('_', '-')}={v}" for k, v in vars(a).items() if k not in ("child", "out", "reps", "modes", "set")] + [
        f"--set={o}" for o in a.set]
    p = subprocess.run(cmd, capture_output=True, text=True, cwd=REPO)
    last = [ln for ln in p.stdout.splitlines() if ln.startswith("{")]
    if p.returncode != 0 or not last:
        raise RuntimeError(f"{mode} failed (exit {p.returncode}): {p.stderr.strip().splitlines()[-3:]}")
    return json.loads(last[-1])


def _profile_diff(runs: dict) -> dict:
    """Self CPU per step, fsdp1 minus plain, summed over repetitions' medians: total and by op."""
    def med(mode):
        keys = set().union(*(r.get("profile_self_s_per_step", {}) for r in runs[mode]))
        return {k: statistics.median(r.get("profile_self_s_per_step", {}).get(k, 0.0) for r in runs[mode]) for k in keys}
    p, f = med("plain"), med("fsdp1")
    diff = {k: f.get(k, 0.0) - p.get(k, 0.0) for k in set(p) | set(f)}
    top = sorted(diff.items(), key=lambda kv: -abs(kv[1]))[:12]
    tp, tf = sum(p.values()), sum(f.values())
    print(f"\nprofiled self CPU per step: plain {tp * 1e3:.1f} ms, fsdp1 {tf * 1e3:.1f} ms "
          f"(fsdp1 costs {tf / tp:.3f}x); largest differences (fsdp1 - plain, ms per step):")
    for k, v in top:
        print(f"  {v * 1e3:+8.2f}  {k}")
    return {"plain_self_s": tp, "fsdp1_self_s": tf, "top": dict(top)}


def _median_cpu_share(shares: list) -> dict:
    """Per process name, the median over repetitions of its share of the machine's CPU."""
    shares = [s for s in shares if s]
    if not shares:
        return {}
    keys = set().union(*shares)
    med = {k: statistics.median(s.get(k, 0.0) for s in shares) for k in keys}
    return dict(sorted(med.items(), key=lambda kv: -kv[1]))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--child", choices=sorted(CHILDREN))
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--micro", type=int, default=8)
    ap.add_argument("--seq-len", type=int, default=256)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--modes", default="plain,fsdp1,ray")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="config override for the ray mode")
    ap.add_argument("--profile-steps", type=int, default=0,
                    help="plain and fsdp1: profile the last N measured steps (torch.profiler) and print where "
                         "fsdp1's extra time goes, per op (its step times are then not comparable)")
    ap.add_argument("--out", default=os.path.join(REPO, "bench", "results", "step_overhead.json"))
    a = ap.parse_args(argv)
    if a.child:
        print(json.dumps(CHILDREN[a.child](a)))
        return 0
    modes = a.modes.split(",")
    tokens = a.batch * a.seq_len
    runs = {m: [] for m in modes}
    for rep in range(a.reps):
        for m in (modes if rep % 2 == 0 else modes[::-1]):  # alternate the order: drift hits all modes alike
            r = run_child(m, a)
            r["load1"] = os.getloadavg()[0]
            runs[m].append(r)
            print(f"  rep {rep + 1}/{a.reps} {m:6s} {tokens / statistics.median(r['step_s']):9.0f} tokens/s "
                  f"(load {r['load1']:.1f})", flush=True)
    tps = {m: statistics.median(tokens / statistics.median(r["step_s"]) for r in runs[m]) for m in modes}
    print(f"\nstep cost, tiny model, {a.batch} x {a.seq_len} tokens, micro-batch {a.micro}, fp32 AdamW, {a.threads} threads")
    print(f"{'mode':8s} {'tokens/s':>10s} {'vs plain':>9s} {'vs fsdp1':>9s}")
    for m in modes:
        vp = f"{tps[m] / tps['plain']:.2f}" if "plain" in tps else "-"
        vf = f"{tps[m] / tps['fsdp1']:.2f}" if "fsdp1" in tps else "-"
        print(f"{m:8s} {tps[m]:10.0f} {vp:>9s} {vf:>9s}")
    profile = {}
    if a.profile_steps and "plain" in runs and "fsdp1" in runs:
        profile = _profile_diff(runs)
    cpu = {}
    if "ray" in runs:
        split = runs["ray"][-1]["split"]
        print("ray step split (median s): " + ", ".join(f"{k} {v:.3f}" for k, v in split.items()))
        cpu = _median_cpu_share([r.get("cpu_share", {}) for r in runs["ray"]])
        if cpu:
            others = sum(v for k, v in cpu.items() if k != "train worker")
            top = ", ".join(f"{k} {v:.1%}" for k, v in list((k, v) for k, v in cpu.items() if k != "train worker")[:8])
            print(f"ray mode, machine CPU over the measured steps (median of reps): train worker {cpu.get('train worker', 0):.1%}, "
                  f"every other process {others:.1%} ({top})")
    if "fsdp1" in runs:
        print(f"fsdp1 mode: its process had {statistics.median(r['own_cpu_share'] for r in runs['fsdp1']):.1%} of the machine's CPU")
    os.makedirs(os.path.dirname(a.out), exist_ok=True)
    with open(a.out, "w") as f:
        json.dump({"args": {k: v for k, v in vars(a).items() if k != "child"}, "tokens_per_s": tps,
                   "ratios": {"fsdp1_vs_plain": tps.get("fsdp1", 0) / tps["plain"] if "plain" in tps else None,
                              "ray_vs_fsdp1": tps.get("ray", 0) / tps["fsdp1"] if "fsdp1" in tps else None},
                   "profile_fsdp1_minus_plain": profile, "ray_cpu_share": cpu,
                   "runs": runs, "cpu_count": os.cpu_count(), "time": time.time()}, f, indent=2)
    print(f"wrote {a.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
