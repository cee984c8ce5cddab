"""A real multi-node Ray cluster on one machine: a `ray start --head` plus extra `ray start`
nodes, each its own raylet in its own process group, so killing a node is a real node loss.

Every port is picked free at start and the cluster has its own temp dir, so several
clusters (and other Ray users) can share the machine; `stop()` kills exactly this cluster.
Token authentication is on (as `ray start --head` does by default since Ray 2.52), with a
token of its own: every node and driver gets RAY_AUTH_MODE=token and RAY_AUTH_TOKEN_PATH
through `env` (pass `cluster.env` to any process that should reach the cluster).

`env` also sets RAY_TMPDIR so that the cluster's temp dir is `$RAY_TMPDIR/ray`: there `ray
start --head` records the cluster (`ray_current_cluster`) exactly as it does in `/tmp/ray`
for a default `ray start`, so a driver given `env` and no RAY_ADDRESS finds it the way it
would find the machine's cluster, while the real `/tmp/ray` record stays untouched. The head
runs the dashboard (on a free port, 127.0.0.1): Ray Train's placement-group cleaner needs
its state API to notice a dead controller. Its GCS checks the nodes' raylets every second
(HEALTH_CHECK), so a killed node is declared dead in about 5 s rather than Ray's 15.
"""

from __future__ import annotations

import importlib.util
import json
import os
import secrets
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from typing import Dict, List, Optional


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class Node:
    name: str
    proc: subprocess.Popen
    log: str

    def kill(self) -> None:
        """SIGKILL the node's whole process group: raylet, object store, its workers."""
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.proc.wait(timeout=30)


# How the head's GCS checks that each node's raylet lives (Ray's system config). A killed node's
# raylet refuses the check at once, so it is declared dead after `failure_threshold` periods:
# 3 s x 5 = 15 s by Ray's defaults, 1 s x 5 = 5 s here, and only then do its actors die and the
# job restart without it. A raylet that is alive but slow (a loaded machine) has to miss 5 checks
# in a row, each waiting Ray's own timeout, before it is declared dead, as with the defaults.
HEALTH_CHECK = {"health_check_period_ms": 1000, "health_check_failure_threshold": 5}


@dataclass
class LocalCluster:
    head_cpus: float = 2
    # GPUs the head advertises (Ray takes the number as given: a CPU machine can advertise
    # GPUs to test how jobs fit a GPU cluster; nothing then runs on a real GPU).
    head_gpus: float = 0
    head_resources: Dict[str, float] = field(default_factory=dict)
    env: Dict[str, str] = field(default_factory=dict)
    nodes: List[Node] = field(default_factory=list)
    address: str = ""
    temp_dir: str = ""

    def _ray(self) -> str:
        return os.path.join(os.path.dirname(sys.executable), "ray")

    def _ports(self) -> List[str]:
        extra = []
        if importlib.util.find_spec("grpc") is not None:  # with ray[client] the head serves Ray Client on 10001
            extra.append(f"--ray-client-server-port={free_port()}")
        return extra + [f"--dashboard-agent-listen-port={free_port()}", f"--dashboard-agent-grpc-port={free_port()}",
                f"--metrics-export-port={free_port()}", f"--runtime-env-agent-port={free_port()}"]

    def _spawn(self, name: str, args: List[str]) -> Node:
        log = os.path.join(self.temp_dir, f"{name}.log")
        env = {**os.environ, **self.env}
        with open(log, "w") as f:
            p = subprocess.Popen([self._ray(), "start", "--block", *args], stdout=f, stderr=subprocess.STDOUT,
                                 env=env, start_new_session=True)
        node = Node(name, p, log)
        self.nodes.append(node)
        return node

    def start(self, timeout: float = 90) -> "LocalCluster":
        # Short path: Ray's unix socket paths must stay under ~107 characters.
        base = tempfile.mkdtemp(prefix="rc", dir="/tmp")
        self.temp_dir = os.path.join(base, "ray")
        os.makedirs(self.temp_dir)
        token_path = os.path.join(base, "auth_token")
        with open(os.open(token_path, os.O_WRONLY | os.O_CREAT, 0o600), "w") as f:
            f.write(secrets.token_hex(32))
        self.env.update(RAY_AUTH_MODE="token", RAY_AUTH_TOKEN_PATH=token_path, RAY_TMPDIR=base)
        port = free_port()
        self.address = f"127.0.0.1:{port}"
        self._spawn("head", ["--head", f"--port={port}", "--node-ip-address=127.0.0.1", f"--num-cpus={self.head_cpus}",
                             f"--num-gpus={self.head_gpus}", f"--resources={json.dumps(self.head_resources)}", "--include-dashboard=true",
                             "--dashboard-host=127.0.0.1", f"--dashboard-port={free_port()}",
                             f"--temp-dir={self.temp_dir}", f"--system-config={json.dumps(HEALTH_CHECK)}",
                             *self._ports()])
        self.wait_nodes(1, timeout)
        return self

    def add_node(self, num_cpus: float = 1, resources: Optional[Dict[str, float]] = None) -> Node:
        return self._spawn(f"node{len(self.nodes)}", [f"--address={self.address}", "--node-ip-address=127.0.0.1",
                                                      f"--num-cpus={num_cpus}", f"--resources={json.dumps(resources or {})}",
                                                      *self._ports()])

    def alive_nodes(self) -> int:
        """Nodes the GCS reports alive (asked from a short-lived subprocess, not this one)."""
        code = "import ray; ray.init(address=%r, logging_level='ERROR'); print(sum(n['Alive'] for n in ray.nodes()))" % self.address
        try:
            r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, env={**os.environ, **self.env})
        except subprocess.TimeoutExpired:
            return -1
        try:
            return int(r.stdout.strip().splitlines()[-1])
        except (ValueError, IndexError):
            return -1

    def wait_nodes(self, n: int, timeout: float = 90) -> None:
        end = time.time() + timeout
        while time.time() < end:
            head = self.nodes[0].proc if self.nodes else None
            if head is not None and head.poll() is not None:
                tail = open(self.nodes[0].log).read().strip().splitlines()[-1:]
                raise RuntimeError(f"ray head exited with {head.returncode}: {tail} (log {self.nodes[0].log})")
            if self.alive_nodes() == n:
                return
            time.sleep(1)
        raise TimeoutError(f"cluster did not reach {n} alive nodes in {timeout}s (logs in {self.temp_dir})")

    @property
    def record(self) -> str:
        """Where the head recorded the cluster's address (what `ray.init()` would read)."""
        return os.path.join(self.temp_dir, "ray_current_cluster")

    def stop(self) -> None:
        for node in reversed(self.nodes):
            node.kill()
        self.nodes.clear()
