"""Shared helpers of the reward tests: fixture paths, fast settings, leftover checks."""

from __future__ import annotations

import os
import signal
import tempfile
import time
from pathlib import Path
from typing import Callable, List, Tuple

from elastic.reward.settings import EvalSettings

REPO = Path(__file__).resolve().parents[1]
FIXTURES = REPO / "tests" / "fixtures" / "code-opt"
SHIPPED = REPO / "datasets" / "code-opt"


def fast_settings(cache_dir: Path, **kw) -> EvalSettings:
    """One untimed-warm-up-free timed run: tests compare statuses and coarse rewards only."""
    base = dict(timing="wall", timing_runs=1, warmup_runs=0, cache_dir=str(cache_dir), compile_time_limit_s=15.0)
    base.update(kw)
    return EvalSettings(**base)


def leftover_programs() -> List[str]:
    """This session's sandboxed programs still alive (we always run them as ./prog). Programs of
    another test session on the host (pytest-xdist's other worker runs its own sandboxes at the
    same time) are not counted: see `ours`."""
    found = []
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            argv0 = Path(f"/proc/{d}/cmdline").read_bytes().split(b"\0")[0]
            state = [l for l in Path(f"/proc/{d}/status").read_text().splitlines() if l.startswith("State:")]
        except OSError:
            continue
        if argv0 == b"./prog" and not (state and "Z" in state[0]) and _program_is_ours(int(d)):
            found.append(d)
    return found


def _program_is_ours(pid: int) -> bool:
    """A sandboxed program belongs to this session when the sandbox that runs it does (its run
    cgroup is named elastic-sbx-<owner pid>-...: `ours`), or, on a host without run cgroups, when
    it descends from this process or was orphaned (reparented to init: a leak, whoever made it)."""
    try:
        cg = Path(f"/proc/{pid}/cgroup").read_text()
    except OSError:
        return False
    names = [part for line in cg.splitlines() for part in line.split("/") if part.startswith("elastic-sbx-")]
    if names:
        return ours(names[0])
    return own_process(pid) or _ppid(pid) == 1


def _ppid(pid: int) -> int:
    """The parent pid from /proc/<pid>/stat (after the parenthesised name); -1 if it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return int(f.read().rsplit(")", 1)[1].split()[1])
    except (OSError, ValueError, IndexError):
        return -1


def ours(name: str) -> bool:
    """Whether a sandbox's scratch dir or run cgroup (elastic-sbx-<owner pid>-...) is this test
    session's: its owner descends from this process (the sandbox itself, or a Ray worker of the
    session's cluster), or is dead (then nobody can tell whose it was, and it must be swept: it
    counts). pytest-xdist runs two sessions side by side; each checks only its own."""
    owner = _owner(name)
    return owner is None or _owner_dead(name) or own_process(owner)


def _owner(name: str):
    """The owner pid in a sandbox's elastic-sbx-<owner pid>-... name (None if it has none)."""
    owner = name.split("-")[2]
    return int(owner) if owner.isdigit() else None


def _owner_dead(name: str) -> bool:
    owner = _owner(name)
    return owner is not None and not os.path.exists(f"/proc/{owner}")


def leftover_scratch(dead_owners_only: bool = False) -> List[str]:
    return [p.name for p in Path(tempfile.gettempdir()).glob("elastic-sbx-*")
            if ours(p.name) and (not dead_owners_only or _owner_dead(p.name))]


def _run_cgroups() -> List[str]:
    out = []
    for ctrl in ("pids", "memory", "unified"):
        root = Path("/sys/fs/cgroup") / ctrl
        if root.is_dir():
            try:
                out += [str(p) for p in root.rglob("elastic-sbx-*")]
            except OSError:
                pass
    return out


# Run cgroups that other process trees left before this test session (e.g. a killed run in a
# sibling cgroup that no sandbox of ours sweeps): not this session's doing.
_BEFORE_SESSION = set(_run_cgroups())


def leftover_cgroups(dead_owners_only: bool = False) -> List[str]:
    """This session's run cgroups (`ours`) created since it started; a live sandbox keeps one for
    its spare launcher, so callers either close their sandbox first or look only at owners that
    died."""
    return [p for p in _run_cgroups()
            if p not in _BEFORE_SESSION and ours(Path(p).name) and (not dead_owners_only or _owner_dead(Path(p).name))]


def fence(lang: str, src: str) -> str:
    """A model-style completion around one program."""
    return f"Here is my answer.\n```{lang}\n{src}\n```\n"


def mixed_items(problems, tag: str, copies: int = 1) -> Tuple[List[Tuple[str, str]], List[str]]:
    """(items, expected statuses): fast/wrong/reference of both fixture problems, each source
    made distinct by a comment naming `tag`, so no two items are the same program."""
    items, expected = [], []
    for c in range(copies):
        for pid in ("pair-sum", "range-sum"):
            prob = problems[pid]
            for lang, src, status in (prob.solutions["fast"] + ("ok",), prob.solutions["wrong"] + ("wrong_answer",),
                                      (prob.language, prob.reference_source, "ok")):
                items.append((pid, fence(lang, f"{src}\n/* {tag} {c} {len(items)} */\n")))
                expected.append(status)
    return items, expected


def own_process(pid: int) -> bool:
    """Whether `pid` descends from this test process. The tests' Ray cluster is started here
    (`ray.init(address="local")`: raylet, then its workers, are our descendants), so this tells
    our Ray workers from those of anyone else's Ray session on a shared machine, which a test
    must never signal."""
    me = os.getpid()
    while pid > 1:
        if pid == me:
            return True
        pid = _ppid(pid)
    return False


def evaluating_actor_pids() -> List[int]:
    """This session's pool actors busy in `evaluate` right now (Ray titles a process by the
    method it runs)."""
    found = []
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            argv0 = Path(f"/proc/{d}/cmdline").read_bytes().split(b"\0")[0]
        except OSError:
            continue
        if argv0 == b"ray::RewardActor.evaluate" and own_process(int(d)):
            found.append(int(d))
    return found


def kill_pid(pid: int) -> None:
    os.kill(pid, signal.SIGKILL)


def wait_until(cond: Callable[[], object], timeout_s: float, every_s: float = 0.05) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if cond():
            return True
        time.sleep(every_s)
    return bool(cond())
