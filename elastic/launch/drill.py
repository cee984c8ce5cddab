"""Elastic drill: on one machine, run the tiny pretraining job elastically on a real multi-node
Ray cluster and inject the events elastic training must survive, then check the outcome.

Schedule (driven by the run's own progress in metrics.jsonl):
  1. start with the head only (1 trainer slot)        → world size 1
  2. after `add_after` steps, a node joins              → resize 1 → 2 (the run's batches are
     held until Ray Train decides it, so the run cannot end first)
  3. `gap` steps later, once a world-size-2 checkpoint is registered, that node's processes are
     killed → failure, 2 → 1
  4. `gap` steps later, a train worker gets SIGKILL      → failure, 1 → 1
  5. the run finishes; a fixed-size run of the same config runs for comparison.
Reported: restarts (cause, world sizes, recovery seconds, steps redone), goodput, the ledger
check (every sample of the consumed range trained on exactly once), the shard cache's own build
records (every shard tokenized once in the whole run, whatever restarted) and the largest
per-step loss difference from the fixed-size run.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from typing import Dict, List, Optional

from elastic.launch import ledger as ledger_lib
from elastic.launch.runtime.local_cluster import LocalCluster
from elastic.report.recovery import analyze, format_table, read_jsonl

REGISTER_S = 4.0  # Ray Train's controller registers a reported checkpoint on its next poll (0.5 s: lean_train.POLL_S), with room for a loaded machine
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def drill_overrides(storage: str, name: str, steps: int, min_w: int, max_w: int, extra: Optional[List[str]] = None) -> List[str]:
    o = {
        "run.storage_path": storage, "run.name": name, "data.seq_len": 128, "data.vocab_size": 1024,
        "data.tokenizer_sample_mb": 1, "data.shard_mb": 0.25, "data.ledger": "true", "data.tokenize_cpus": 0.5,
        "model.dim": 64, "model.n_layers": 2, "model.n_heads": 4, "model.n_kv_heads": 2, "model.ffn_hidden": 128,
        "train.steps": steps, "train.global_batch_size": 8, "train.micro_batch_size": 2, "train.warmup_steps": 3,
        "train.lr": 0.005, "train.param_dtype": "fp32", "train.log_every": 5, "checkpoint.every_steps": 2,
        "checkpoint.keep_last": 3, "scaling.min_workers": min_w, "scaling.max_workers": max_w,
        "scaling.resources_per_worker": "{trainer: 1}", "scaling.elastic_resize_monitor_interval_s": 3,
        "scaling.max_failures": 10, "scaling.worker_group_start_timeout_s": 10, "wandb.mode": "disabled",
    }
    # worker_group_start_timeout_s bounds the wait for the group's placement group only. After a
    # node loss, a train worker's collective fails within a second, before the GCS declares the
    # node dead (about 5 s on LocalCluster), so the first restart still counts the dead node and
    # waits out this timeout before the smaller size is tried: 10 s rather than 20 s of it.
    return [f"{k}={v}" for k, v in o.items()] + list(extra or [])


class Job:
    """A job's driver (`jobs/<script>`, default pretraining) as a subprocess attached to the cluster."""

    def __init__(self, cluster: LocalCluster, storage: str, name: str, overrides: List[str], log: str,
                 script: str = "pretrain.py"):
        self.dir = os.path.join(storage, name)
        env = {**os.environ, **cluster.env, "RAY_ADDRESS": cluster.address,
               "PYTHONPATH": os.pathsep.join([REPO, os.environ.get("PYTHONPATH", "")]), "WANDB_MODE": "disabled"}
        args = [sys.executable, os.path.join(REPO, "jobs", script)]
        for o in overrides:
            args += ["--set", o]
        self.log = log
        with open(log, "w") as f:
            self.proc = subprocess.Popen(args, stdout=f, stderr=subprocess.STDOUT, env=env, cwd=REPO, start_new_session=True)

    def metrics(self) -> List[Dict]:
        return read_jsonl(os.path.join(self.dir, "metrics.jsonl"))

    def events(self) -> List[Dict]:
        return read_jsonl(os.path.join(self.dir, "events.jsonl"))

    def wait_for(self, cond, what: str, timeout: float) -> None:
        end = time.time() + timeout
        while time.time() < end:
            if cond():
                return
            if self.proc.poll() is not None:
                raise RuntimeError(f"job exited ({self.proc.returncode}) while waiting for {what}; log: {self.log}")
            time.sleep(0.5)
        raise TimeoutError(f"timed out after {timeout}s waiting for {what}; log: {self.log}")

    def steps_at(self, world: int, since: float) -> int:
        return sum(1 for r in self.metrics() if r["world_size"] == world and r["time"] >= since)

    def checkpoint_done_since(self, since: float, settle_s: float = 0.0) -> bool:
        """A checkpoint reported to Ray Train after `since` and at least `settle_s` ago."""
        now = time.time()
        return any(e["event"] == "checkpoint_done" and since <= e["time"] <= now - settle_s for e in self.events())

    def finish(self, timeout: float) -> int:
        try:
            return self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            raise


def final_losses(metrics: List[Dict]) -> Dict[int, float]:
    out: Dict[int, float] = {}
    for r in metrics:
        out[r["step"]] = r["loss"]  # the last completion of a redone step counts
    return out


def _drill_cluster(out_dir: str):
    """(storage dir, hold file, a started head with 2 CPUs and 1 trainer slot): the drills' set-up.
    While the hold file exists the train workers get no batch (see run_drill)."""
    os.makedirs(out_dir, exist_ok=True)
    hold = os.path.join(out_dir, "hold-data")
    cluster = LocalCluster(head_cpus=2, head_resources={"trainer": 1},
                           env={"PYTHONPATH": REPO, "RAY_TRAIN_ENABLE_STATE_TRACKING": "0",
                                "ELASTIC_FAULT_DATA_HOLD": hold}).start()
    return os.path.join(out_dir, "runs"), hold, cluster


def run_drill(out_dir: str, steps: int = 40, add_after: int = 4, gap: int = 3, timeout: float = 900, baseline: bool = True) -> Dict:
    storage, hold, cluster = _drill_cluster(out_dir)
    injected: List[Dict] = []
    try:
        job = Job(cluster, storage, "drill", drill_overrides(storage, "drill", steps, 1, 2), os.path.join(out_dir, "drill.log"))
        t0 = time.time()
        job.wait_for(lambda: job.steps_at(1, t0) >= add_after, f"{add_after} steps at world size 1", timeout)
        # Until Ray Train decides to grow the group, the world-size-1 workers get no batch (the
        # reader's hold file): a node takes 5-10 s to start and the resize comes seconds later,
        # while the tiny model's steps take 0.3 s, so unheld the run could end before it resized.
        open(hold, "w").close()
        node = cluster.add_node(num_cpus=1, resources={"trainer": 1})
        t_add = time.time()
        injected.append({"event": "add_node", "time": t_add})
        try:
            job.wait_for(lambda: any(e["event"] == "resize_decision" and e.get("num_workers") == 2 and e["time"] >= t_add
                                     for e in job.events()), "Ray Train's decision to resize to 2 workers", timeout)
        finally:
            os.remove(hold)
        # The node goes only once a checkpoint written at world size 2 has had time to be registered
        # (rank 0 logs `checkpoint_done` when it reports the save; Ray Train's controller registers it
        # on its next poll, every 0.5 s): killing earlier tests nothing more and, with asynchronous saves,
        # loses every world-size-2 step, which the ledger check below must see.
        job.wait_for(lambda: job.steps_at(2, t_add) >= gap and job.checkpoint_done_since(t_add, settle_s=REGISTER_S),
                     f"{gap} steps and a registered checkpoint at world size 2", timeout)
        node.kill()
        t_kill = time.time()
        injected.append({"event": "kill_node", "time": t_kill})
        job.wait_for(lambda: job.steps_at(1, t_kill) >= gap, f"{gap} steps at world size 1 after the node loss", timeout)
        starts = [e for e in job.events() if e["event"] == "start"]
        workers = [e for e in job.events() if e["event"] == "worker" and e["time"] >= starts[-1]["time"] - 1]
        victim = workers[-1]["pid"]
        os.kill(victim, signal.SIGKILL)
        t_sig = time.time()
        injected.append({"event": "sigkill_worker", "time": t_sig, "pid": victim})
        rc = job.finish(timeout)
        drill_wall = time.time() - t0
        acc = analyze(job.dir)
        led = ledger_lib.check(os.path.join(job.dir, "ledger.jsonl"), 8, steps)
        result: Dict = {"exit_code": rc, "wall_s": drill_wall, "injected": injected, "recovery": acc, "ledger": led,
                        "cache": cache_check(os.path.join(job.dir, "cache"))}
        if baseline:
            base = Job(cluster, storage, "fixed", drill_overrides(storage, "fixed", steps, 1, 1), os.path.join(out_dir, "fixed.log"))
            result["baseline_exit_code"] = base.finish(timeout)
            a, b = final_losses(job.metrics()), final_losses(base.metrics())
            diffs = {s: abs(a[s] - b[s]) for s in a if s in b}
            worst = max(diffs, key=diffs.get) if diffs else None
            result["loss_compare"] = {
                "steps_compared": len(diffs),
                "max_abs_diff": diffs[worst] if worst else None, "at_step": worst,
                "max_rel_diff": max((diffs[s] / abs(b[s]) for s in diffs), default=None),
                "first_loss": b.get(1), "last_loss": b.get(steps),
            }
        return result
    finally:
        cluster.stop()


def run_early_loss_drill(out_dir: str, steps: int = 16, timeout: float = 600) -> Dict:
    """A node that joins and dies before the run's first checkpoint (issue 58 item 6): world size
    1 on the head, a node joins and the group grows to 2, the node is SIGKILLed before any save
    (the only save is the final one), the run starts over at world size 1 and must finish."""
    storage, hold, cluster = _drill_cluster(out_dir)
    try:
        job = Job(cluster, storage, "early", drill_overrides(storage, "early", steps, 1, 2, [f"checkpoint.every_steps={10 * steps}"]),
                  os.path.join(out_dir, "early.log"))
        t0 = time.time()
        job.wait_for(lambda: job.steps_at(1, t0) >= 2, "2 steps at world size 1", timeout)
        open(hold, "w").close()  # no batch until the group has grown (see run_drill)
        node = cluster.add_node(num_cpus=1, resources={"trainer": 1})
        t_add = time.time()
        try:
            job.wait_for(lambda: any(e["event"] == "resize_decision" and e.get("num_workers") == 2 and e["time"] >= t_add
                                     for e in job.events()), "Ray Train's decision to resize to 2 workers", timeout)
        finally:
            os.remove(hold)
        job.wait_for(lambda: job.steps_at(2, t_add) >= 1, "a step at world size 2", timeout)
        saved_before = sorted(n for n in os.listdir(job.dir) if n.startswith("step_"))
        node.kill()
        t_kill = time.time()
        rc = job.finish(timeout)
        m = job.metrics()
        return {"exit_code": rc, "wall_s": time.time() - t0, "recover_s": time.time() - t_kill,
                "checkpoints_before_kill": saved_before, "last_step": m[-1]["step"] if m else None,
                "world_sizes": [r["world_size"] for r in m], "recovery": analyze(job.dir)}
    finally:
        cluster.stop()


def cache_check(cache_root: str) -> Dict:
    """Tokenized once: every cached shard has exactly one committed build in the cache's records."""
    from elastic.data.store import build_summary

    per_key = build_summary(cache_root)
    return {"ok": bool(per_key) and all(v["max_builds_per_shard"] == 1 for v in per_key.values()),
            "shards": sum(v["shards"] for v in per_key.values()), "builds": sum(v["builds"] for v in per_key.values()),
            "tokenize_cpu_s": sum(v["cpu_s"] for v in per_key.values()), "per_key": per_key}


def print_report(r: Dict) -> None:
    print(f"drill exit code {r['exit_code']}, wall {r['wall_s']:.0f}s")
    print(format_table(r["recovery"]))
    led = r["ledger"]
    print(f"ledger: {'OK' if led['ok'] else 'FAILED'} — {led['samples']} samples, {led['unique']} unique, "
          f"duplicates {led['duplicates']}, missing steps {led['steps_missing']}, wrong-size steps "
          f"{led['steps_with_wrong_batch']}, world sizes {led['world_sizes']}")
    c = r.get("cache")
    if c:
        print(f"cache: {'OK' if c['ok'] else 'FAILED'} — {c['shards']} shards, {c['builds']} builds "
              f"(tokenized once each: {c['ok']}), {c['tokenize_cpu_s']:.1f} tokenize CPU-s")
    lc = r.get("loss_compare")
    if lc:
        print(f"vs fixed world size: {lc['steps_compared']} steps, max |Δloss| {lc['max_abs_diff']:.2e} at step {lc['at_step']} "
              f"(max relative {lc['max_rel_diff']:.2e}); loss {lc['first_loss']:.3f} -> {lc['last_loss']:.3f}")
