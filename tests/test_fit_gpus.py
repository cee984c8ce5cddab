"""A GPU job fits the cluster it finds (elastic/launch/runtime/fit.py, scaling.fit).

The first H100 run: the README's command asked for 2 workers x {GPU: 1} on a one-GPU machine,
waited 60 s and stopped. These tests use a real `ray start` cluster that advertises GPUs it
does not have (Ray takes `--num-gpus` as given): the job sees a GPU cluster, Ray Train places
its workers on GPU bundles, and the process group runs over gloo (ELASTIC_TORCH_BACKEND), since
there is no CUDA here. What is tested is the driver's decision and that the run goes through.
"""

from __future__ import annotations

import json

from elastic.config import load_config
from elastic.launch.runtime.fit import fit_to_gpus
from elastic.launch.runtime.local_cluster import LocalCluster
from tests.helpers import make_text_corpus, read_jsonl, small_run_overrides
from tests.test_launch import _env, _run


def _cfg(**kv):
    return load_config(None, [f"{k}={v}" for k, v in kv.items()])


def test_fixed_size_run_takes_the_gpus_there_are():
    cfg = _cfg()  # the defaults: 2 workers, global batch 16, micro-batch 8
    assert (cfg.scaling.min_workers, cfg.scaling.max_workers) == (2, 2)
    fitted, note = fit_to_gpus(cfg, 1.0)
    assert (fitted.scaling.min_workers, fitted.scaling.max_workers) == (1, 1)
    assert fitted.train.global_batch_size == cfg.train.global_batch_size  # the data order does not change
    assert note.startswith("[elastic] scaling: the cluster has 1 GPU; running 1 worker instead of "
                           "scaling.min_workers=2, max_workers=2")
    for gpus in (0.0, 2.0, 8.0):  # none (CPU run), enough, more than enough: unchanged
        same, note = fit_to_gpus(cfg, gpus)
        assert same is cfg and note is None


def test_world_size_must_split_the_global_batch():
    cfg = _cfg(**{"scaling.min_workers": 4, "scaling.max_workers": 4, "train.global_batch_size": 16,
                  "train.micro_batch_size": 4})
    fitted, note = fit_to_gpus(cfg, 3.0)  # 16 sequences do not split over 3 workers: 2
    assert (fitted.scaling.min_workers, fitted.scaling.max_workers) == (2, 2)
    assert "the cluster has 3 GPUs; running 2 workers" in note


def test_elastic_run_keeps_its_max_and_starts_on_what_there_is():
    cfg = _cfg(**{"scaling.min_workers": 4, "scaling.max_workers": 8, "train.global_batch_size": 840,
                  "train.micro_batch_size": 1})
    fitted, note = fit_to_gpus(cfg, 2.0)
    assert (fitted.scaling.min_workers, fitted.scaling.max_workers) == (2, 8)
    assert "running 2..8 workers (elastic: grows as GPUs join)" in note


def test_strict_keeps_the_configured_sizes():
    cfg = _cfg(**{"scaling.fit": "strict"})
    same, note = fit_to_gpus(cfg, 1.0)
    assert same is cfg and note is None


def test_default_job_runs_on_a_one_gpu_cluster_and_strict_waits_in_one_line(tmp_path):
    corpus = make_text_corpus(tmp_path / "corpus")
    cluster = LocalCluster(head_cpus=4, head_gpus=1).start()
    try:
        env = _env({**cluster.env, "ELASTIC_TORCH_BACKEND": "gloo"})
        # The helpers' small run asks for 2 workers, like the default job.
        r = _run(small_run_overrides(tmp_path / "runs", "onegpu", corpus, 4), env)
        assert r.returncode == 0, (r.stdout + r.stderr)[-4000:]
        assert not r.stderr.strip(), r.stderr
        fit_line = [ln for ln in r.stdout.splitlines() if ln.startswith("[elastic] scaling:")]
        assert fit_line == ["[elastic] scaling: the cluster has 1 GPU; running 1 worker instead of scaling.min_workers=2, "
                            "max_workers=2 (global batch unchanged; scaling.fit=strict waits for 2 GPUs)"], r.stdout
        starts = [e for e in read_jsonl(tmp_path / "runs" / "onegpu" / "events.jsonl") if e.get("event") == "start"]
        assert [e["world_size"] for e in starts] == [1]
        with open(tmp_path / "runs" / "onegpu" / "config.json") as f:
            assert json.load(f)["scaling"]["min_workers"] == 1  # the config the run used

        strict = small_run_overrides(tmp_path / "runs", "strict", corpus, 4,
                                     **{"scaling.fit": "strict", "scaling.resource_wait_s": 2})
        r = _run(strict, env)
        assert r.returncode == 4, r.stdout + r.stderr
        err = [ln for ln in r.stderr.splitlines() if ln.strip()]
        assert len(err) == 1 and "GPU 2 needed, the cluster has 1" in err[0], r.stderr
    finally:
        cluster.stop()


def test_dpo_chain_reports_a_cluster_too_small_in_one_line(tmp_path):
    """jobs/dpo.py trains the default SFT policy first; a cluster that cannot hold that run is
    one line and exit code 4, as for every entry point (it was a traceback)."""
    import subprocess
    import sys

    from tests.conftest import REPO

    cluster = LocalCluster(head_cpus=1).start()
    try:
        r = subprocess.run([sys.executable, str(REPO / "jobs" / "dpo.py"), "--set", f"run.storage_path={tmp_path / 'runs'}",
                            "--set", "scaling.resource_wait_s=2"],
                           capture_output=True, text=True, env=_env(cluster.env), timeout=600, cwd=REPO)
        assert r.returncode == 4, r.stdout + r.stderr
        err = [ln for ln in r.stderr.splitlines() if ln.strip()]
        assert len(err) == 1 and err[0].startswith("cluster error: the cluster at "), r.stderr
        assert "after waiting 2s (scaling.resource_wait_s)" in err[0]
    finally:
        cluster.stop()
