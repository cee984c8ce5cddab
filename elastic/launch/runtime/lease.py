"""One live run per run directory: a lease file, `<run dir>/lease.json`, with a heartbeat.

Two launches of the same `run.name` and `run.storage_path` would otherwise both train into
one directory: both resume from the same checkpoint, append to the same metrics, and
overwrite each other's checkpoints (torchtitan and Lightning refuse to overwrite a live run
for the same reason). The lease names its owner (host, pid, boot id, pid namespace, process
start time, a random token) and is refreshed every `heartbeat_s` by a daemon thread.

A lease is live when its owner is provably alive:
  - on the same machine (same host name, boot id and pid namespace): the pid still runs and
    started at the recorded time (so a reused pid does not count);
  - elsewhere: its heartbeat is younger than `ttl_s` (wall clocks of the two hosts compared).
A lease that is not live is stale (its run crashed or was SIGKILLed) and is taken over, so a
relaunch after a crash still resumes.

Works on a local path and on any pyarrow filesystem URI (s3://, gs://, ...). Local creation
is exclusive (hard link of a complete file); replacing a stale lease, and any write on an
object store (which has no create-if-absent), is followed by a settle delay and a read-back:
the later writer wins and the other refuses.
"""

from __future__ import annotations

import json
import os
import secrets
import socket
import sys
import threading
import time
from typing import Callable, Optional

LEASE = "lease.json"


class LeaseHeld(RuntimeError):
    """Another live run holds the run directory; the message is one line naming it."""


def _read_text(path: str) -> str:
    try:
        with open(path) as f:
            return f.read().strip()
    except OSError:
        return ""


def _pidns() -> str:
    try:
        return os.readlink("/proc/self/ns/pid")
    except OSError:
        return ""


def process_start(pid: int) -> Optional[int]:
    """Start time of `pid` in clock ticks since boot (Linux /proc), None if it does not run."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
        return int(stat[stat.rindex(b")") + 2:].split()[19])
    except (OSError, ValueError, IndexError):
        pass
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return None
    except PermissionError:
        pass
    return -1  # runs, start time unknown (no /proc)


def machine() -> dict:
    return {"host": socket.gethostname(), "boot_id": _read_text("/proc/sys/kernel/random/boot_id"), "pidns": _pidns()}


class _Store:
    """The lease file on a local path or a pyarrow filesystem URI."""

    def __init__(self, run_dir: str):
        self.local = "://" not in run_dir
        if self.local:
            self.path = os.path.join(run_dir, LEASE)
            self.where = self.path
        else:
            from pyarrow import fs as pafs

            self.fs, base = pafs.FileSystem.from_uri(run_dir)
            self.path = f"{base.rstrip('/')}/{LEASE}"
            uri, q, query = run_dir.partition("?")
            self.where = f"{uri.rstrip('/')}/{LEASE}{q}{query}"

    def read(self) -> Optional[bytes]:
        if self.local:
            try:
                with open(self.path, "rb") as f:
                    return f.read()
            except FileNotFoundError:
                return None
        from pyarrow import fs as pafs

        if self.fs.get_file_info(self.path).type == pafs.FileType.NotFound:
            return None
        try:
            with self.fs.open_input_stream(self.path) as f:
                return f.read()
        except FileNotFoundError:
            return None

    def _tmp(self, data: bytes) -> str:
        os.makedirs(os.path.dirname(self.path), exist_ok=True)
        tmp = f"{self.path}.{secrets.token_hex(4)}.tmp"
        with open(tmp, "wb") as f:
            f.write(data)
        return tmp

    def create(self, data: bytes) -> bool:
        """Write if absent; False if a lease appeared. Exclusive on a local path only."""
        if not self.local:
            self.write(data)
            return True
        tmp = self._tmp(data)
        try:
            os.link(tmp, self.path)  # atomic create-if-absent of a complete file
            return True
        except FileExistsError:
            return False
        finally:
            os.unlink(tmp)

    def write(self, data: bytes) -> None:
        """Replace the lease; readers see the old or the new file, never part of one."""
        if self.local:
            os.replace(self._tmp(data), self.path)
            return
        self.fs.create_dir(self.path.rsplit("/", 1)[0], recursive=True)
        with self.fs.open_output_stream(self.path) as f:  # object stores publish whole objects
            f.write(data)

    def delete(self) -> None:
        try:
            if self.local:
                os.unlink(self.path)
            else:
                self.fs.delete_file(self.path)
        except (FileNotFoundError, OSError):
            pass


class RunLease:
    """Hold `<run_dir>/lease.json` while a run trains into `run_dir`.

    `with RunLease(run_dir) as lease:` acquires (raising LeaseHeld when a live run holds it),
    heartbeats in the background, and releases on exit. `lease.took_over` is the stale owner
    record it replaced, if any. `on_lost` is called once if another process takes the lease
    (this run's heartbeat stalled past the TTL).
    """

    def __init__(self, run_dir: str, heartbeat_s: float = 5.0, ttl_s: float = 30.0, settle_s: Optional[float] = None,
                 on_lost: Optional[Callable[[dict], None]] = None):
        self.run_dir, self.heartbeat_s, self.ttl_s = run_dir, heartbeat_s, ttl_s
        self.store = _Store(run_dir)
        self.settle_s = settle_s if settle_s is not None else (0.2 if self.store.local else 2.0)
        self.on_lost = on_lost
        self.took_over: Optional[dict] = None
        self.owner = {"token": secrets.token_hex(8), "pid": os.getpid(), "start": process_start(os.getpid()), **machine(),
                      "run_dir": run_dir, "argv": " ".join(sys.argv)[:200], "started": time.time(),
                      "heartbeat_s": heartbeat_s, "ttl_s": ttl_s}
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None

    # -- liveness -------------------------------------------------------------------------
    def is_live(self, rec: dict, now: Optional[float] = None) -> bool:
        """Whether the owner of lease record `rec` provably still runs (see module doc)."""
        me = machine()
        if rec.get("host") == me["host"] and rec.get("boot_id") and rec.get("boot_id") == me["boot_id"] and rec.get("pidns") == me["pidns"]:
            start = process_start(int(rec.get("pid", -1)))
            return start is not None and (start == -1 or rec.get("start") in (None, -1) or start == rec.get("start"))
        age = (now or time.time()) - float(rec.get("heartbeat", 0))
        return age <= float(rec.get("ttl_s", self.ttl_s))

    def describe(self, rec: dict) -> str:
        age = time.time() - float(rec.get("heartbeat", 0))
        started = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(float(rec.get("started", 0))))
        return (f"run directory {self.run_dir} is in use by a live run: pid {rec.get('pid')} on host {rec.get('host')}, "
                f"started {started}, heartbeat {age:.0f}s ago (lease {self.store.where}); wait for it to finish, "
                f"stop it, or choose another run.name")

    # -- acquire / release ----------------------------------------------------------------
    def _record(self) -> bytes:
        return json.dumps({**self.owner, "heartbeat": time.time()}).encode()

    def _parse(self, raw: Optional[bytes]) -> Optional[dict]:
        if raw is None:
            return None
        try:
            rec = json.loads(raw)
            return rec if isinstance(rec, dict) and "token" in rec else {}
        except (json.JSONDecodeError, UnicodeDecodeError):
            return {}  # unreadable: a crash mid-write on a filesystem without atomic replace

    def acquire(self) -> "RunLease":
        for _ in range(5):
            cur = self._parse(self.store.read())
            if cur is None:
                if not self.store.create(self._record()):
                    continue  # another launch created it just now: look at it
                if not self.store.local and not self._verify():
                    continue
                break
            if cur and cur.get("token") != self.owner["token"] and self.is_live(cur):
                raise LeaseHeld(self.describe(cur))
            self.store.write(self._record())
            if self._verify():
                self.took_over = cur or {"unreadable": True}
                break
        else:
            raise LeaseHeld(f"run directory {self.run_dir}: could not take the lease {self.store.where} (other launches keep replacing it)")
        self._thread = threading.Thread(target=self._beat, name="elastic-run-lease", daemon=True)
        self._thread.start()
        return self

    def _verify(self) -> bool:
        """After a write that may race another launch: the later writer wins."""
        time.sleep(self.settle_s)
        back = self._parse(self.store.read())
        if back and back.get("token") == self.owner["token"]:
            return True
        if back and self.is_live(back):
            raise LeaseHeld(self.describe(back))
        return False

    def _beat(self) -> None:
        while not self._stop.wait(self.heartbeat_s):
            try:
                cur = self._parse(self.store.read())
                if cur and cur.get("token") != self.owner["token"]:
                    if self.on_lost:
                        self.on_lost(cur)
                    return  # never overwrite the lease of the run that took over
                self.store.write(self._record())
            except Exception:  # a storage hiccup must not end training; the next beat retries
                continue

    def release(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=self.heartbeat_s + 5)
        try:
            cur = self._parse(self.store.read())
            if cur and cur.get("token") == self.owner["token"]:
                self.store.delete()
        except Exception:
            pass  # a lease left behind is stale once this process is gone

    def __enter__(self) -> "RunLease":
        return self.acquire()

    def __exit__(self, *exc) -> None:
        self.release()
