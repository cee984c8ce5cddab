"""Which Ray cluster a job runs on, and whether that cluster can hold it.

Resolution follows Ray's own `ray.init()` order, minus its process scan:

1. `RAY_ADDRESS` (as under `ray job submit`): that cluster. `RAY_ADDRESS=local` asks for a
   private instance; `RAY_ADDRESS=auto` for the recorded `ray start` cluster (below), and is an
   error when there is none rather than an attach to whatever runs on the machine.
2. The cluster that `ray start --head` recorded for this machine, if its GCS still answers:
   Ray writes its address to `<ray temp dir>/ray_current_cluster` (`/tmp/ray` unless
   `RAY_TMPDIR`/`TMPDIR` say otherwise) and `ray stop` removes it.
3. Otherwise a new private local instance, owned by this job and stopped with it.

Why not `ray.init(address="auto")`: when nothing is recorded, "auto" attaches to *any* GCS it
finds by scanning processes, including the private instance of a notebook, test or benchmark
that happens to run beside the job, which then dies with that program (issue 16).

A private instance is lean, because it shares the machine with the job's own workers and
on few cores every extra Ray process slows the step: a Ray Python process costs 0.8-0.9% of a
core even when idle, and when the training threads fill the cores, whatever CPU another
process takes comes out of the step (bench/step_overhead.py measures every process's share;
README "step inside the product": 0.82x -> 0.95x of the step outside Ray), and at start-up
every process started competes with the job's own. It runs without the dashboard (Ray's API
server runs without its modules), without the autoscaler's monitor and the log monitor (it
tails every worker log 10 times a second for drivers that asked for logs; ours ask for none:
PRIVATE_SKIPPED_DAEMONS), without Ray Train's metrics export and preemption watcher (PRIVATE_TRAIN_ENV),
without the idle workers Ray prestarts for a first driver (PRIVATE_SYSTEM_CONFIG), and without
Ray Train's placement-group cleaner and autoscaling coordinator (lean_train.py), none of which
one job-owned machine uses. Whoever wants the dashboard starts `ray start --head`, which the
job joins.
It is started with token auth chosen explicitly (`RAY_AUTH_MODE=token`, Ray's default for
new instances), which is secure and spares the "token authentication is enabled" notice.
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
from dataclasses import dataclass, replace
from typing import Dict, List, Optional

from elastic.launch.runtime.stop import reinstall

ENV = "RAY_ADDRESS"
FROM_ENV, RECORDED, PRIVATE, CONNECTED = "RAY_ADDRESS", "ray start", "private", "connected"


class ClusterError(RuntimeError):
    """The cluster cannot be reached or cannot hold the job; the message is one line."""


@dataclass(frozen=True)
class ClusterChoice:
    kind: str                 # FROM_ENV | RECORDED | PRIVATE | CONNECTED
    address: Optional[str]    # GCS address (None for a private instance until it starts)
    record: str               # the `ray start` record file that was consulted
    note: str = ""            # e.g. a stale record that was ignored

    def describe(self) -> str:
        """The job's first console line: which cluster, where, and why."""
        if self.kind == FROM_ENV:
            return f"[elastic] ray: joined the cluster in RAY_ADDRESS at {self.address}"
        if self.kind == RECORDED:
            return f"[elastic] ray: joined the cluster started with `ray start` on this machine at {self.address} (recorded in {self.record})"
        if self.kind == CONNECTED:
            return f"[elastic] ray: using this process's Ray connection at {self.address}"
        why = "RAY_ADDRESS=local" if os.environ.get(ENV) == "local" else f"no RAY_ADDRESS, {self.note or 'no `ray start` cluster recorded in ' + self.record}"
        return f"[elastic] ray: started a private local instance at {self.address} for this job ({why}); it stops with the job"


def record_file() -> str:
    """Where `ray start --head` records this machine's cluster (Ray's own lookup)."""
    from ray._common.utils import get_ray_address_file

    return get_ray_address_file(None)


def gcs_answers(address: str, timeout_s: float = 2.0) -> bool:
    """Whether something accepts connections at host:port (a recorded GCS that still runs)."""
    host, _, port = address.rpartition(":")
    try:
        with socket.create_connection((host.strip("[]"), int(port)), timeout=timeout_s):
            return True
    except (OSError, ValueError):
        return False


def recorded_cluster() -> tuple[Optional[str], str, str]:
    """(address of the live recorded `ray start` cluster or None, record path, note)."""
    path = record_file()
    try:
        with open(path) as f:
            addr = f.read().strip()
    except OSError:
        return None, path, ""
    if not addr:
        return None, path, ""
    if not gcs_answers(addr):
        return None, path, f"the `ray start` cluster recorded in {path} ({addr}) is not running"
    return addr, path, ""


def resolve_cluster() -> ClusterChoice:
    """Decide where the job runs without starting or joining anything (a process already
    connected to Ray, e.g. a test or notebook, keeps its connection)."""
    import ray

    if ray.is_initialized():
        return ClusterChoice(CONNECTED, ray.get_runtime_context().gcs_address, "")
    return choose_cluster()


def choose_cluster() -> ClusterChoice:
    """RAY_ADDRESS, else the live recorded `ray start` cluster, else a private instance."""
    env = os.environ.get(ENV, "").strip()
    if env == "local":
        return ClusterChoice(PRIVATE, None, record_file())
    if env and env != "auto":
        return ClusterChoice(FROM_ENV, env, "")
    addr, path, note = recorded_cluster()
    if addr:
        return ClusterChoice(RECORDED, addr, path)
    if env == "auto":
        raise ClusterError(f"RAY_ADDRESS=auto but no running cluster started with `ray start` is recorded in {path}"
                           f"{' (' + note + ')' if note else ''}; set RAY_ADDRESS to the cluster's address, or unset it "
                           "to start a private local instance")
    return ClusterChoice(PRIVATE, None, path, note)


def choose_token_auth() -> None:
    """Token auth for a new private instance, chosen explicitly rather than by Ray's default
    (same result, without Ray's notice). RAY_AUTH_MODE set by the user wins."""
    if "RAY_AUTH_MODE" in os.environ:
        return
    try:  # Ray's own switch: sets the variable and refreshes its cached C++ config
        from ray._private.authentication.authentication_token_setup import _enable_token_auth

        _enable_token_auth()
    except ImportError:
        pass  # another Ray: it chooses (and says so) itself


# Ray Train services that a private instance cannot use: the metrics callbacks feed Ray's
# Prometheus export, which nothing scrapes on a job-owned instance, and the preemption watcher
# (an actor of its own) waits for node-drain notices that one machine never gets.
PRIVATE_TRAIN_ENV = {"RAY_TRAIN_METRICS_ENABLED": "0", "RAY_TRAIN_ENABLE_PREEMPTION_WATCHER": "0"}


# Ray prestarts one idle worker process per CPU for the first driver, without the job's
# runtime environment; every process of ours asks for that environment (the driver's env_vars),
# so Ray starts new ones and the prestarted ones idle: 0.7 CPU-seconds each at start-up, taken
# from the job's own processes.
PRIVATE_SYSTEM_CONFIG = {"prestart_worker_first_driver": False}


def private_instance_env() -> Dict[str, str]:
    """PRIVATE_TRAIN_ENV, with the user's own value wherever they set one (theirs wins)."""
    return {k: os.environ.get(k, v) for k, v in PRIVATE_TRAIN_ENV.items()}


# Head-node daemons Ray starts for every new instance that a private instance does not use
# (module docstring): the autoscaler's monitor (one machine never grows; only `ray status` reads
# what it reports) and the log monitor (ours ask for no worker logs). Each is a Python process:
# 0.7-0.8 CPU-seconds to start on the 2-core machine while the job starts its own, then a share
# of a core while idle. (The dashboard's API server stays, though it runs no dashboard: without
# it the dashboard agent logs a failed lookup of its address every second.)
PRIVATE_SKIPPED_DAEMONS = ("start_monitor", "start_log_monitor")


@contextlib.contextmanager
def without_daemons(names=PRIVATE_SKIPPED_DAEMONS):
    """While a private instance starts, its node skips the daemons `names` (Ray has no switch for
    them in `ray.init`; this uses its node class's start methods, best effort: another Ray
    starts them)."""
    try:
        from ray._private.node import Node
    except ImportError:
        yield
        return
    saved = {n: Node.__dict__[n] for n in names if n in Node.__dict__}
    for n in saved:
        setattr(Node, n, lambda self, *args, **kwargs: None)
    try:
        yield
    finally:
        for n, f in saved.items():
            setattr(Node, n, f)


def stop_log_monitor() -> None:
    """Stop this private instance's log monitor (see the module docstring). Ray has no switch
    for it in `ray.init`, so this uses its node handle; best effort: another Ray keeps it."""
    try:
        from ray._private import worker

        worker._global_node.kill_log_monitor(check_alive=False)
    except Exception as e:  # a private API: never fail a job over it
        logging.getLogger(__name__).debug("log monitor left running: %s", e)


# How many times a private instance's start is tried when its node does not come up in time.
# On a busy machine (other jobs starting beside it) the raylet can give up on its dashboard agent
# (a Python process that writes its ports to a file within a fixed 15 s, Ray's C++ constant) and
# exit, and `ray.init` then fails after 30 s with "The current node timed out during startup".
# Seen on the 2-core CI machine when a job in a subprocess started its instance while another
# job trained. A second try on a fresh session starts in the usual few seconds.
PRIVATE_START_TRIES = 3
NODE_START_TIMEOUT = "timed out during startup"


def start_private(init, tries: int = PRIVATE_START_TRIES) -> None:
    """Run `init` (a `ray.init` that starts a private instance) until its node comes up, at most
    `tries` times; between tries, the processes the failed start left (its GCS and agents:
    this process's children that were not there before) are ended. Any other error, or the
    last timeout, is raised as it came."""
    import psutil

    me = psutil.Process()
    for attempt in range(1, tries + 1):
        before = {c.pid for c in me.children(recursive=True)}
        try:
            with without_daemons():
                init()
            return
        except Exception as e:
            if NODE_START_TIMEOUT not in str(e) or attempt == tries:
                raise
            left = [c for c in me.children(recursive=True) if c.pid not in before]
            for c in left:
                try:
                    c.kill()
                except psutil.Error:
                    pass
            psutil.wait_procs(left, timeout=10)
            logging.getLogger(__name__).warning("private Ray instance: the node did not start in time; "
                                                "trying again (%d of %d)", attempt + 1, tries)


_private_address: list = []  # the GCS address of the private instance this process started


def private_instance() -> bool:
    """Whether this process is connected to a private instance it started (connect)."""
    import ray

    return bool(_private_address) and ray.is_initialized() and ray.get_runtime_context().gcs_address == _private_address[-1]


# Every `ray.init` of a job: worker output stays in the session's log files, Ray's own lines at
# WARNING and above (the driver shows its own progress line instead).
QUIET_INIT = dict(log_to_driver=False, logging_level=logging.WARNING)


def start_private_instance(num_cpus: int, env_vars: Dict[str, str]) -> str:
    """Start this process's private instance (the module docstring says what it leaves out) with
    `num_cpus` logical CPUs and `env_vars` for every process of its jobs; returns its GCS address.
    Jobs this process runs on it afterwards run as on a job's own instance (`private_instance`):
    `connect` starts one this way, and so does a program that runs several jobs on one instance
    of its own (the test suite's session cluster, tests/conftest.py)."""
    import ray

    choose_token_auth()
    quiet_train = private_instance_env()
    for k, v in quiet_train.items():  # the driver reads some, the controller actor the others
        os.environ.setdefault(k, v)
    start_private(lambda: ray.init(address="local", num_cpus=num_cpus, include_dashboard=False,
                                   runtime_env={"env_vars": {**quiet_train, **env_vars}},
                                   _system_config=PRIVATE_SYSTEM_CONFIG, **QUIET_INIT))
    stop_log_monitor()  # (when without_daemons could not keep it from starting)
    address = ray.get_runtime_context().gcs_address
    _private_address.append(address)
    return address


def connect(choice: ClusterChoice, num_cpus: int, env_vars: Dict[str, str]) -> ClusterChoice:
    """Start or join the chosen cluster; returns the choice with its address filled in.

    Worker output stays in the Ray session's log files (log_to_driver=False): the driver shows
    its own progress line instead. `env_vars` reach the workers of a private instance or a
    recorded local cluster; a cluster given through RAY_ADDRESS (e.g. `ray job submit`) brings
    its own runtime environment.
    """
    import ray

    if choice.kind == CONNECTED:
        return choice
    try:
        if choice.kind == FROM_ENV:
            ray.init(address=choice.address, **QUIET_INIT)
        elif choice.kind == RECORDED:
            ray.init(address=choice.address, runtime_env={"env_vars": env_vars}, **QUIET_INIT)
        else:
            start_private_instance(num_cpus, env_vars)
        reinstall()  # ray.init replaced the SIGTERM handler of an entry point (stop.py)
    except (ConnectionError, RuntimeError, ValueError) as e:
        where = f"the cluster at {choice.address} ({choice.kind})" if choice.address else "a private local Ray instance"
        last = str(e).strip().splitlines()[-1] if str(e).strip() else type(e).__name__
        raise ClusterError(f"cannot start or join {where}: {last}") from None
    return replace(choice, address=ray.get_runtime_context().gcs_address)


def _fmt(res: Dict[str, float]) -> str:
    return "{" + ", ".join(f"{k}: {v:g}" for k, v in sorted(res.items())) + "}"


def shortfall(bundles: List[Dict[str, float]], total: Dict[str, float], free: Dict[str, float]) -> str:
    """What the cluster lacks for `bundles`, in words, from its total and free resources."""
    need: Dict[str, float] = {}
    for b in bundles:
        for k, v in b.items():
            need[k] = need.get(k, 0.0) + v
    missing = [f"{k} {v:g} needed, the cluster has {total.get(k, 0):g}" for k, v in sorted(need.items()) if total.get(k, 0) + 1e-9 < v]
    if missing:
        return "; ".join(missing)
    busy = [f"{k} {v:g} needed, {free.get(k, 0):g} of {total.get(k, 0):g} free (the rest is in use)"
            for k, v in sorted(need.items()) if free.get(k, 0) + 1e-9 < v]
    if busy:
        return "; ".join(busy)
    return f"no node can hold one of the bundles {', '.join(_fmt(b) for b in bundles)} (resources are spread over nodes)"


def wait_for_resources(bundles: List[Dict[str, float]], what: str, timeout_s: float, setting: str) -> None:
    """Block until the cluster can place `bundles` at once, at most `timeout_s` seconds.

    A probe placement group is the question Ray itself answers (per-node fit, custom
    resources, GPUs), and a pending one asks an autoscaling cluster to add nodes, so a
    bounded wait covers clusters that grow on demand. The probe is removed before training
    starts. Raises ClusterError naming what is missing.
    """
    import ray
    from ray.util.placement_group import placement_group, remove_placement_group

    bundles = [{k: v for k, v in b.items() if v > 0} for b in bundles]
    bundles = [b for b in bundles if b]
    if not bundles:
        return
    pg = placement_group(bundles, strategy="PACK")
    try:
        ready, _ = ray.wait([pg.ready()], timeout=max(0.0, timeout_s))
    finally:
        remove_placement_group(pg)
    if ready:
        return
    lack = shortfall(bundles, ray.cluster_resources(), ray.available_resources())
    raise ClusterError(f"the cluster at {ray.get_runtime_context().gcs_address} cannot hold {what} after waiting "
                       f"{timeout_s:g}s ({setting}): {lack}")
