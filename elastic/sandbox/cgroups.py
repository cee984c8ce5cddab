"""Per-run cgroups: the layer that bounds process count and memory even for root.

Root ignores RLIMIT_NPROC, so a fork bomb is only stopped by a pids cgroup (and by the PID
namespace being killed on the wall clock). Each sandboxed run gets its own child cgroup of
*this process's* cgroup (nested, so any limit an operator put around the whole job still
applies), with ``pids.max`` and a memory limit; afterwards every process left in it is
SIGKILLed, its OOM/failcnt counters are read (our evidence for ``memory_limit``) and it is
removed. cgroup v1 (separate ``pids`` and ``memory`` hierarchies) and v2 (unified) are both
handled; when neither is writable the layer is simply reported as missing.
"""

from __future__ import annotations

import os
import signal
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, List, Optional, Set

ROOT = Path("/sys/fs/cgroup")


def _own_paths() -> Dict[str, str]:
    """Controller name ('pids', 'memory', or '' for v2) -> this process's cgroup path."""
    out: Dict[str, str] = {}
    try:
        for line in Path("/proc/self/cgroup").read_text().splitlines():
            _, ctrls, path = line.split(":", 2)
            for c in ctrls.split(",") if ctrls else [""]:
                out[c] = path
    except OSError:
        pass
    return out


def _pid_alive(pid: str) -> bool:
    """Whether the process that owns a resource named after its pid still exists."""
    if not pid.isdigit():
        return True  # not ours to judge
    return os.path.exists(f"/proc/{pid}")


def _write(path: Path, value: str) -> None:
    with open(path, "w") as f:
        f.write(value)


def _read_int(path: Path) -> Optional[int]:
    try:
        return int(path.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None


@dataclass
class CgroupStats:
    """What the kernel says happened in one run's cgroup."""

    memory_limit_hit: bool = False  # failcnt > 0 or an OOM kill: evidence for memory_limit
    oom_kills: int = 0
    max_memory_bytes: Optional[int] = None
    pids_limit_hit: bool = False


@dataclass
class RunCgroup:
    """The cgroup directories of one run (one per controller hierarchy in v1)."""

    pids_dir: Optional[Path] = None
    memory_dir: Optional[Path] = None
    version: int = 1
    dirs: List[Path] = field(default_factory=list)

    def procs_files(self) -> List[str]:
        return [str(d / "cgroup.procs") for d in self.dirs]

    def _pids(self) -> List[int]:
        pids: List[int] = []
        for d in self.dirs:
            try:
                pids += [int(x) for x in (d / "cgroup.procs").read_text().split()]
            except (OSError, ValueError):
                pass
        return pids

    def kill_all(self, timeout_s: float = 5.0) -> None:
        """SIGKILL everything left in the cgroup until it is empty (fork races included).

        Polls from 0.5 ms up to 20 ms: the common leftover is a process already exiting
        (bwrap's init after its monitor reported), gone within a millisecond.
        """
        deadline = time.monotonic() + timeout_s
        pause = 0.0005
        while time.monotonic() < deadline:
            pids = self._pids()
            if not pids:
                return
            for p in pids:
                try:
                    os.kill(p, signal.SIGKILL)
                except (ProcessLookupError, PermissionError):
                    pass
            time.sleep(pause)
            pause = min(pause * 2, 0.02)

    def stats(self) -> CgroupStats:
        s = CgroupStats()
        if self.memory_dir is not None:
            d = self.memory_dir
            if self.version == 1:
                fail = _read_int(d / "memory.failcnt") or 0
                s.max_memory_bytes = _read_int(d / "memory.max_usage_in_bytes")
                try:
                    for line in (d / "memory.oom_control").read_text().splitlines():
                        if line.startswith("oom_kill "):
                            s.oom_kills = int(line.split()[1])
                except (OSError, ValueError):
                    pass
                s.memory_limit_hit = fail > 0 or s.oom_kills > 0
            else:
                s.max_memory_bytes = _read_int(d / "memory.peak")
                try:
                    ev = dict(l.split() for l in (d / "memory.events").read_text().splitlines())
                    s.oom_kills = int(ev.get("oom_kill", 0))
                    s.memory_limit_hit = int(ev.get("max", 0)) > 0 or s.oom_kills > 0
                except (OSError, ValueError):
                    pass
        if self.pids_dir is not None:
            try:
                for line in (self.pids_dir / "pids.events").read_text().splitlines():
                    k, v = line.split()
                    if k == "max" and int(v) > 0:
                        s.pids_limit_hit = True
            except (OSError, ValueError):
                pass
        return s

    def reset_peaks(self) -> None:
        """Reset the peak-usage and failure counters between two jobs of one session (v1:
        writing 0 to ``memory.max_usage_in_bytes`` and ``memory.failcnt``; v2 kernels that
        allow it: any write to ``memory.peak``). Best effort: where the kernel refuses, the
        peak stays cumulative, which only makes the memory evidence more conservative."""
        d = self.memory_dir
        if d is None:
            return
        names = ("memory.max_usage_in_bytes", "memory.failcnt") if self.version == 1 else ("memory.peak",)
        for name in names:
            try:
                _write(d / name, "0")
            except OSError:
                pass

    def set_limits(self, pids_max: int, memory_bytes: int) -> None:
        """(Re)write the limits: pids.max, and memory (plus swap, where accounted) in an order
        the kernel accepts whether they grow or shrink (v1 wants memory <= memory+swap)."""
        if self.pids_dir is not None:
            _write(self.pids_dir / "pids.max", str(pids_max))
        d = self.memory_dir
        if d is None:
            return
        if self.version == 2:
            _write(d / "memory.max", str(memory_bytes))
            return
        mem, memsw = d / "memory.limit_in_bytes", d / "memory.memsw.limit_in_bytes"
        try:
            _write(mem, str(memory_bytes))
        except OSError:  # growing above the current memory+swap limit: raise that first
            _write(memsw, str(memory_bytes))
            _write(mem, str(memory_bytes))
        try:
            _write(memsw, str(memory_bytes))
        except OSError:  # swap not accounted here
            pass

    def try_remove(self) -> bool:
        """One non-blocking attempt: SIGKILL what is left, rmdir if empty; True when gone."""
        pids = self._pids()
        for p in pids:
            try:
                os.kill(p, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        if pids:
            return False
        for d in list(self.dirs):
            try:
                d.rmdir()
            except FileNotFoundError:
                pass
            except OSError:
                return False
            self.dirs.remove(d)
        return True

    def remove(self) -> None:
        self.kill_all()
        for d in self.dirs:
            for _ in range(50):
                try:
                    d.rmdir()
                    break
                except FileNotFoundError:
                    break
                except OSError:
                    time.sleep(0.02)


class CgroupFactory:
    """Detects once which controllers can be delegated here, then makes one cgroup per run."""

    def __init__(self) -> None:
        own = _own_paths()
        self.version = 0
        self.pids_parent: Optional[Path] = None
        self.memory_parent: Optional[Path] = None
        self.error = ""
        if (ROOT / "pids").is_dir() or (ROOT / "memory").is_dir():
            self.version = 1
            for ctrl in ("pids", "memory"):
                parent = ROOT / ctrl / own.get(ctrl, "/").lstrip("/")
                if self._probe(parent, ctrl):
                    setattr(self, f"{ctrl}_parent", parent)
        elif (ROOT / "cgroup.controllers").is_file():
            self.version = 2
            parent = ROOT / own.get("", "/").lstrip("/")
            if self._probe(parent, "pids"):
                self.pids_parent = parent
            if self._probe(parent, "memory"):
                self.memory_parent = parent

    def _probe(self, parent: Path, ctrl: str) -> bool:
        d = parent / f"elastic-probe-{os.getpid()}-{uuid.uuid4().hex[:6]}"
        try:
            d.mkdir()
        except OSError as e:
            self.error = f"{parent}: {e.strerror}"
            return False
        try:
            knob = "pids.max" if ctrl == "pids" else ("memory.limit_in_bytes" if self.version == 1 else "memory.max")
            _write(d / knob, "64" if ctrl == "pids" else str(64 << 20))
            return True
        except OSError as e:
            self.error = f"{d / knob}: {e.strerror}"
            return False
        finally:
            try:
                d.rmdir()
            except OSError:
                pass

    def sweep_stale(self) -> Set[str]:
        """Remove run cgroups left by a process that died mid-run (e.g. a killed pool actor);
        returns the owners of run cgroups that are still alive."""
        alive: Set[str] = set()
        for parent in {p for p in (self.pids_parent, self.memory_parent) if p is not None}:
            for d in parent.glob("elastic-sbx-*"):
                owner = d.name.split("-")[2]
                if _pid_alive(owner):
                    alive.add(owner)
                    continue
                RunCgroup(version=self.version, dirs=[d]).remove()
        return alive

    @property
    def pids(self) -> bool:
        return self.pids_parent is not None

    @property
    def memory(self) -> bool:
        return self.memory_parent is not None

    def create(self, pids_max: int, memory_bytes: int) -> RunCgroup:
        """A fresh cgroup with the limits set; raises OSError if the kernel refuses."""
        name = f"elastic-sbx-{os.getpid()}-{uuid.uuid4().hex[:10]}"
        rc = RunCgroup(version=self.version)
        try:
            if self.version == 2 and (self.pids or self.memory):
                d = (self.pids_parent or self.memory_parent) / name  # type: ignore[operator]
                d.mkdir()
                rc.dirs.append(d)
                if self.pids:
                    _write(d / "pids.max", str(pids_max))
                    rc.pids_dir = d
                if self.memory:
                    _write(d / "memory.max", str(memory_bytes))
                    try:
                        _write(d / "memory.swap.max", "0")
                    except OSError:
                        pass
                    rc.memory_dir = d
                return rc
            if self.pids_parent is not None:
                d = self.pids_parent / name
                d.mkdir()
                rc.dirs.append(d)
                _write(d / "pids.max", str(pids_max))
                rc.pids_dir = d
            if self.memory_parent is not None:
                d = self.memory_parent / name
                d.mkdir()
                rc.dirs.append(d)
                _write(d / "memory.limit_in_bytes", str(memory_bytes))
                try:  # no swap either, where the kernel accounts it
                    _write(d / "memory.memsw.limit_in_bytes", str(memory_bytes))
                except OSError:
                    pass
                rc.memory_dir = d
            return rc
        except OSError:
            rc.remove()
            raise
