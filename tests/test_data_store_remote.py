"""Remote run storage on a local S3-compatible server (moto's ThreadedMotoServer, from the
package registry): the shard cache, its build records and the run's metrics/events/ledger live
in the bucket, a relaunch resumes from it and tokenizes nothing again.

pyarrow reaches the server through the standard AWS variables (AWS_ENDPOINT_URL and keys), so
run directories are plain `s3://bucket/...` URIs, as on real S3. The job runs as a subprocess
with its own private Ray instance, which inherits those variables (as a real cluster's nodes
would carry their credentials).
"""

import glob
import os
import subprocess
import sys
import tempfile

import pyarrow.fs as pafs
import pytest

from elastic.records import append_record, read_records
from elastic.train.checkpoint import latest_complete
from tests.conftest import REPO
from tests.helpers import make_text_corpus, small_run_overrides

BUCKET = "elastic-test"


@pytest.fixture(scope="module")
def s3(tmp_path_factory):
    moto_server = pytest.importorskip("moto.server")
    server = moto_server.ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    env = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1",
           "AWS_ENDPOINT_URL": f"http://{host}:{port}", "AWS_EC2_METADATA_DISABLED": "true"}
    old = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    pafs.S3FileSystem(endpoint_override=f"{host}:{port}", scheme="http", allow_bucket_creation=True).create_dir(BUCKET)
    yield env
    for k, v in old.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v
    server.stop()


def test_records_append_and_read_on_s3(s3):
    """Several writers append to one records file in the bucket; every record comes back, each
    writer's in its order, a part cut short is never seen (a PUT is atomic)."""
    path = f"s3://{BUCKET}/records/events.jsonl"
    for i in range(300):  # crosses a part boundary (PART_LINES)
        append_record(path, {"i": i, "writer": "a"})
    code = ("import sys; sys.path.insert(0, %r)\nfrom elastic.records import append_record\n"
            "for i in range(5): append_record(%r, {'i': i, 'writer': 'b'})") % (str(REPO), path)
    subprocess.run([sys.executable, "-c", code], check=True, env={**os.environ})
    recs = read_records(path)
    assert [r["i"] for r in recs if r["writer"] == "a"] == list(range(300))
    assert [r["i"] for r in recs if r["writer"] == "b"] == list(range(5))
    fs, p = pafs.FileSystem.from_uri(path)
    parts = fs.get_file_info(pafs.FileSelector(p + ".parts"))
    assert len(parts) == 3  # writer a: 256 + 44 lines; writer b: 5
    assert read_records(f"s3://{BUCKET}/records/missing.jsonl") == []


def _job(overrides, log):
    args = [sys.executable, str(REPO / "jobs" / "pretrain.py")]
    for o in overrides:
        args += ["--set", o]
    env = {**os.environ, "RAY_ADDRESS": "local", "WANDB_MODE": "disabled"}
    with open(log, "w") as f:
        return subprocess.run(args, stdout=f, stderr=subprocess.STDOUT, env=env, timeout=900).returncode


def test_run_on_s3_keeps_cache_and_records_in_the_bucket_and_resumes(s3, tmp_path):
    from elastic.data.store import build_summary
    from elastic.launch import ledger

    corpus = make_text_corpus(tmp_path / "corpus")
    storage = f"s3://{BUCKET}/runs"
    name = f"remote-{os.getpid()}"
    run = f"{storage}/{name}"
    steps, stop = 6, 3
    base = small_run_overrides(storage, name, corpus, steps)
    stages = set(glob.glob(os.path.join(tempfile.gettempdir(), "elastic-ckpt-*")))
    assert _job(base + [f"train.until_step={stop}"], tmp_path / "first.log") == 0, (tmp_path / "first.log").read_text()[-3000:]
    first = build_summary(f"{run}/cache")
    assert len(first) == 1 and next(iter(first.values()))["builds"] >= 1, first
    assert _job(base, tmp_path / "second.log") == 0, (tmp_path / "second.log").read_text()[-3000:]

    metrics = read_records(f"{run}/metrics.jsonl")
    assert [r["step"] for r in metrics] == list(range(1, steps + 1))
    starts = [e for e in read_records(f"{run}/events.jsonl") if e.get("event") == "start"]
    assert [s["step"] for s in starts] == [0, stop]  # the relaunch resumed from the bucket's checkpoint
    check = ledger.check(f"{run}/ledger.jsonl", 8, steps)
    assert check["ok"], check
    summary = build_summary(f"{run}/cache")
    per_key = next(iter(summary.values()))
    assert per_key["max_builds_per_shard"] == 1, summary  # the relaunch reused the bucket's cache
    fs, p = pafs.FileSystem.from_uri(f"{run}/cache")
    names = [i.base_name for i in fs.get_file_info(pafs.FileSelector(p, recursive=True))]
    assert sum(n.endswith(".arrow") for n in names) == per_key["shards"]
    assert not any(".tmp-" in n for n in names)
    # Checkpoints: DCP staged locally, each rank uploaded its files, Ray Train registered the
    # directory without copying it again; no local stage is left behind.
    found = latest_complete(run)
    assert found and found[0] == f"{run}/step_{steps:08d}" and found[1]["step"] == steps
    assert set(glob.glob(os.path.join(tempfile.gettempdir(), "elastic-ckpt-*"))) <= stages
    # Nothing of the run's records went to a local mirror on this machine.
    mirror = os.path.join(tempfile.gettempdir(), "elastic-runs", name)
    assert not os.path.exists(os.path.join(mirror, "metrics.jsonl"))
