"""Issue 58 item 6: a cluster left too small by a node that went says so within a minute, once,
with what it lacks and the keys to change (elastic/launch/runtime/cluster_watch.py)."""

from elastic.launch.runtime.cluster_watch import ClusterWatch


def test_says_once_when_the_cluster_cannot_hold_the_run_and_again_when_it_can():
    total = {"CPU": 2.0}
    said = []
    w = ClusterWatch([{"CPU": 1.0}, {"CPU": 1.0}], "1 train worker x {CPU: 1} plus a data packer {CPU: 1}", said.append,
                     after_s=30.0, resources=lambda: dict(total))
    assert w.check(0.0) is None  # fits
    total["CPU"] = 1.0  # a node left
    assert w.check(10.0) is None and w.check(39.0) is None  # short for 29 s: not yet
    line = w.check(40.0)
    assert line is not None and "cannot hold 1 train worker" in line and "CPU 2 needed, the cluster has 1" in line
    assert "scaling.min_workers" in line and "data.tokenize_cpus" in line and "\n" not in line
    assert w.check(50.0) is None and w.check(60.0) is None  # said once
    total["CPU"] = 2.0
    assert w.check(70.0) == "[elastic] the cluster can hold 1 train worker x {CPU: 1} plus a data packer {CPU: 1} again"
    assert len(said) == 2
