"""Which cluster a job picks, decided before anything starts: RAY_ADDRESS, else the cluster
`ray start` recorded for this machine if its GCS still answers, else a private instance;
never a process scan. The record lives where Ray keeps it (`$RAY_TMPDIR/ray/ray_current_cluster`
here, so the test never sees the machine's real one)."""

import socket

import pytest

from elastic.launch.runtime.cluster import FROM_ENV, PRIVATE, RECORDED, ClusterError, choose_cluster, record_file, shortfall


@pytest.fixture
def ray_tmp(tmp_path, monkeypatch):
    monkeypatch.setenv("RAY_TMPDIR", str(tmp_path))
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    (tmp_path / "ray").mkdir()
    return tmp_path / "ray" / "ray_current_cluster"


def test_record_is_where_ray_keeps_it(ray_tmp):
    assert record_file() == str(ray_tmp)


def test_ray_address_wins(ray_tmp, monkeypatch):
    monkeypatch.setenv("RAY_ADDRESS", "10.1.2.3:6379")
    c = choose_cluster()
    assert (c.kind, c.address) == (FROM_ENV, "10.1.2.3:6379")
    assert c.describe() == "[elastic] ray: joined the cluster in RAY_ADDRESS at 10.1.2.3:6379"
    monkeypatch.setenv("RAY_ADDRESS", "local")
    assert choose_cluster().kind == PRIVATE


def test_nothing_recorded_means_a_private_instance(ray_tmp):
    c = choose_cluster()
    assert c.kind == PRIVATE and c.address is None
    line = c.describe()
    assert line.startswith("[elastic] ray: started a private local instance") and str(ray_tmp) in line


def test_a_live_record_is_joined_and_a_stale_one_ignored(ray_tmp):
    with socket.socket() as srv:  # stands in for the recorded GCS port: something answers there
        srv.bind(("127.0.0.1", 0))
        srv.listen()
        addr = f"127.0.0.1:{srv.getsockname()[1]}"
        ray_tmp.write_text(addr)
        c = choose_cluster()
        assert (c.kind, c.address) == (RECORDED, addr)
        assert "`ray start`" in c.describe() and addr in c.describe()
    c = choose_cluster()  # closed: the cluster is gone but `ray stop` never ran
    assert c.kind == PRIVATE and "not running" in c.note and "not running" in c.describe()


def test_ray_address_auto_needs_a_recorded_cluster(ray_tmp, monkeypatch):
    monkeypatch.setenv("RAY_ADDRESS", "auto")
    with pytest.raises(ClusterError) as e:
        choose_cluster()
    assert "\n" not in str(e.value) and "RAY_ADDRESS=auto" in str(e.value) and str(ray_tmp) in str(e.value)


def test_shortfall_names_what_is_missing():
    bundles = [{"CPU": 1, "GPU": 1}, {"CPU": 1, "GPU": 1}, {"CPU": 1}]
    assert shortfall(bundles, {"CPU": 8, "GPU": 1}, {"CPU": 8, "GPU": 1}) == "GPU 2 needed, the cluster has 1"
    assert shortfall(bundles, {"CPU": 8, "GPU": 2}, {"CPU": 2, "GPU": 2}) == "CPU 3 needed, 2 of 8 free (the rest is in use)"
    assert shortfall(bundles, {"CPU": 8, "GPU": 2}, {"CPU": 8, "GPU": 2}).startswith("no node can hold")


def test_a_private_start_that_times_out_is_tried_again_without_what_it_left():
    """Ray's node start can time out on a busy machine (the raylet gives up on its dashboard agent
    after a fixed 15 s); start_private tries again, after ending the processes the failed start
    left behind (here: a child that stands for its GCS). Other errors pass through at once."""
    import subprocess

    from elastic.launch.runtime.cluster import start_private

    left, tries = [], []

    def init():
        tries.append(1)
        if len(tries) == 1:
            left.append(subprocess.Popen(["sleep", "600"]))
            raise Exception("The current node timed out during startup. This could happen because ...")

    start_private(init)
    assert len(tries) == 2 and left[0].poll() is not None  # tried again; the first start's child is gone

    def always(error):
        def init():
            tries.append(1)
            raise error
        return init

    tries.clear()
    with pytest.raises(Exception, match="timed out during startup"):  # the last try's error, as it came
        start_private(always(Exception("The current node timed out during startup.")), tries=2)
    assert len(tries) == 2
    tries.clear()
    with pytest.raises(ValueError):
        start_private(always(ValueError("bad argument")))
    assert len(tries) == 1
