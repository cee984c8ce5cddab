"""One live run per run directory: the lease refuses a second owner while the first lives,
is taken over once its owner is gone (dead pid on this machine, or a heartbeat older than
the TTL elsewhere), and works the same on a local path and on an S3 URI (a real local S3
server, moto)."""

import json
import os
import socket
import subprocess
import sys
import time

import pytest

from elastic.launch.runtime.lease import LEASE, LeaseHeld, RunLease, machine


def _dead_pid() -> int:
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    return p.pid


def test_second_lease_refused_while_first_lives_then_released(tmp_path):
    run = str(tmp_path / "run")
    with RunLease(run, heartbeat_s=0.2) as first:
        rec = json.loads((tmp_path / "run" / LEASE).read_text())
        assert rec["pid"] == os.getpid() and rec["host"] == socket.gethostname()
        with pytest.raises(LeaseHeld) as e:
            RunLease(run).acquire()
        msg = str(e.value)
        assert "\n" not in msg and f"pid {os.getpid()}" in msg and run in msg and "live run" in msg
        hb = rec["heartbeat"]
        time.sleep(0.6)
        assert json.loads((tmp_path / "run" / LEASE).read_text())["heartbeat"] > hb  # it heartbeats
        assert first.took_over is None
    assert not (tmp_path / "run" / LEASE).exists()
    with RunLease(run) as again:  # released: the next launch gets it
        assert again.took_over is None


def test_lease_of_a_dead_process_on_this_machine_is_taken_over(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    dead = {"token": "t0", "pid": _dead_pid(), "start": 1, **machine(), "heartbeat": time.time(), "ttl_s": 3600,
            "started": time.time()}
    (run / LEASE).write_text(json.dumps(dead))
    with RunLease(str(run)) as lease:  # fresh heartbeat, long TTL: the dead pid decides
        assert lease.took_over["pid"] == dead["pid"]
        assert json.loads((run / LEASE).read_text())["pid"] == os.getpid()


def test_lease_from_another_host_lives_until_its_heartbeat_is_older_than_the_ttl(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    other = {"token": "t1", "pid": 1, "start": 1, "host": "trainer-7", "boot_id": "x", "pidns": "y",
             "heartbeat": time.time() - 5, "ttl_s": 30, "started": time.time() - 60}
    (run / LEASE).write_text(json.dumps(other))
    with pytest.raises(LeaseHeld, match="pid 1 on host trainer-7"):
        RunLease(str(run)).acquire()
    other["heartbeat"] = time.time() - 31
    (run / LEASE).write_text(json.dumps(other))
    with RunLease(str(run)) as lease:
        assert lease.took_over["host"] == "trainer-7"


def test_unreadable_lease_is_replaced(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    (run / LEASE).write_text('{"token": "t2", "pid"')
    with RunLease(str(run)) as lease:
        assert lease.took_over == {"unreadable": True}


def test_the_owner_hears_when_another_process_takes_its_lease(tmp_path):
    run = tmp_path / "run"
    lost = []
    with RunLease(str(run), heartbeat_s=0.1, on_lost=lost.append):
        (run / LEASE).write_text(json.dumps({"token": "intruder", "pid": 42, "host": "elsewhere", "heartbeat": time.time()}))
        time.sleep(0.5)
        assert lost and lost[0]["token"] == "intruder"
        assert json.loads((run / LEASE).read_text())["token"] == "intruder"  # never overwritten back
    assert (run / LEASE).exists()  # not released: it is not ours any more


@pytest.fixture
def s3_uri(monkeypatch):
    moto_server = pytest.importorskip("moto.server")
    from pyarrow import fs as pafs

    server = moto_server.ThreadedMotoServer(ip_address="127.0.0.1", port=0)
    server.start()
    host, port = server.get_host_and_port()
    for k, v in {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1"}.items():
        monkeypatch.setenv(k, v)
    s3 = pafs.S3FileSystem(endpoint_override=f"{host}:{port}", scheme="http", region="us-east-1", allow_bucket_creation=True)
    s3.create_dir("runs-bucket")
    yield f"s3://runs-bucket/store/demo?endpoint_override={host}:{port}&scheme=http&region=us-east-1", s3
    server.stop()


def test_lease_on_an_s3_uri(s3_uri):
    uri, s3 = s3_uri
    with RunLease(uri, heartbeat_s=0.2, settle_s=0.1) as first:
        rec = json.loads(s3.open_input_stream("runs-bucket/store/demo/lease.json").read())
        assert rec["pid"] == os.getpid() and rec["token"] == first.owner["token"]
        with pytest.raises(LeaseHeld, match="in use by a live run"):
            RunLease(uri, settle_s=0.1).acquire()
    assert s3.get_file_info("runs-bucket/store/demo/lease.json").type.name == "NotFound"
    dead = {"token": "t3", "pid": _dead_pid(), "start": 1, **machine(), "heartbeat": time.time(), "ttl_s": 3600}
    with s3.open_output_stream("runs-bucket/store/demo/lease.json") as f:
        f.write(json.dumps(dead).encode())
    with RunLease(uri, settle_s=0.1) as lease:
        assert lease.took_over["pid"] == dead["pid"]
