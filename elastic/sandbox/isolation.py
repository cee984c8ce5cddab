"""Detect, once per process, which isolation layers this machine gives the sandbox.

Each layer is probed by actually using it (bubblewrap may be installed yet refused inside a
container; cgroups may be mounted read-only), and every missing layer is logged as a loud
WARNING, never skipped silently. The report is part of every Result's provenance and of the
benchmark output.

The sandbox fails closed: without a working bubblewrap, creating a
:class:`elastic.sandbox.command.Sandbox` raises :class:`SandboxUnavailable` (one line saying
how to install it) unless the user opted into weaker isolation
(``reward.allow_weak_isolation``, ``EvalSettings.allow_weak_isolation``): then untrusted
programs run under ``unshare`` (network and PID namespaces, no filesystem isolation) or, with
no usable ``unshare`` either, with nothing but rlimits, cgroups and a clean environment, and
:func:`warn_weak` logs what is missing.
"""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
import tempfile
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional

from elastic.sandbox.cgroups import CgroupFactory

log = logging.getLogger("elastic.reward")

WEAK_OPT_IN = "reward.allow_weak_isolation: true (EvalSettings.allow_weak_isolation=True)"


class SandboxUnavailable(RuntimeError):
    """No working bubblewrap, and weaker isolation was not opted into: nothing untrusted runs."""


def unavailable_message(iso: "Isolation") -> str:
    """The one-line refusal: why, how to install bubblewrap, and the opt-in's name."""
    why = iso.bwrap_error or "bubblewrap is not usable here"
    return (f"refusing to run untrusted programs without bubblewrap ({why}): install it "
            f"(`apt-get install bubblewrap`, or `bash scripts/setup.sh`), or opt into weaker isolation "
            f"(unshare or no namespaces, no filesystem isolation) with {WEAK_OPT_IN}")

# Unshare variants tried in order when bubblewrap is unusable: (argv prefix, has pid ns).
_UNSHARE_VARIANTS = [
    (["unshare", "--net", "--pid", "--fork", "--kill-child"], True),
    (["unshare", "--map-root-user", "--net", "--pid", "--fork", "--kill-child"], True),
    (["unshare", "--net"], False),
    (["unshare", "--map-root-user", "--net"], False),
]


def _works(argv: List[str], timeout: float = 10.0) -> bool:
    try:
        r = subprocess.run(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                           stderr=subprocess.DEVNULL, timeout=timeout, env={"PATH": "/usr/bin:/bin"})
        return r.returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


def system_binds() -> List[str]:
    """bwrap arguments exposing the toolchain read-only: /usr, the /lib* and /bin links, ld cache.

    Only what compilers and the C runtime need is visible; /home, /root, /work, /tmp and most
    of /etc are not.
    """
    args: List[str] = ["--ro-bind", "/usr", "/usr"]
    for p in ("/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32"):
        if os.path.islink(p):
            args += ["--symlink", os.readlink(p), p]
        elif os.path.isdir(p):
            args += ["--ro-bind", p, p]
    for p in ("/etc/ld.so.cache", "/etc/ld.so.conf", "/etc/ld.so.conf.d", "/etc/alternatives"):
        if os.path.exists(p):
            args += ["--ro-bind", p, p]
    return args


BWRAP_BASE = ["--unshare-all", "--die-with-parent", "--new-session", "--cap-drop", "ALL", "--hostname", "sandbox"]


@dataclass
class Isolation:
    """The detected layers; `wrapper` is how a command is wrapped ("bwrap", "unshare" or "")."""

    wrapper: str = ""
    unshare_prefix: List[str] = field(default_factory=list)
    pid_namespace: bool = False
    cgroups: Optional[CgroupFactory] = None
    cpu_pinning: bool = False
    cgroup_error: str = ""
    bwrap_error: str = ""  # why bubblewrap is not the wrapper ("" when it is)

    def report(self) -> Dict[str, Any]:
        cg = self.cgroups
        return {
            "process_group": True,
            "rlimits": True,
            "clean_env": True,
            "scratch_dir": True,
            "net_namespace": self.wrapper or False,
            "pid_namespace": (self.wrapper if self.pid_namespace else False),
            "mount_namespace": "bwrap" if self.wrapper == "bwrap" else False,
            "scratch_tmpfs_quota": self.wrapper == "bwrap",
            "cgroup_pids": f"v{cg.version}" if cg is not None and cg.pids else False,
            "cgroup_memory": f"v{cg.version}" if cg is not None and cg.memory else False,
            "cpu_pinning": self.cpu_pinning,
            "running_as_root": os.geteuid() == 0,
        }


def _probe_bwrap() -> str:
    """"" when bubblewrap works here, else why not."""
    if shutil.which("bwrap") is None:
        return "`bwrap` not found on PATH"
    with tempfile.TemporaryDirectory(prefix="elastic-probe-") as d:
        argv = ["bwrap", *BWRAP_BASE, *system_binds(), "--proc", "/proc", "--dev", "/dev",
                "--size", str(1 << 20), "--tmpfs", "/tmp", "--bind", d, "/sandbox", "--chdir", "/sandbox",
                "/bin/sh", "-c", "echo ok > probe"]
        if _works(argv) and os.path.exists(os.path.join(d, "probe")):
            return ""
        return "`bwrap` is installed but could not start a sandbox (user namespaces refused in this container?)"


_DETECTED: Optional[Isolation] = None


def detect(force: bool = False, allow_bwrap: bool = True) -> Isolation:
    """Probe once per process (cached); log a WARNING per missing layer.

    Without a working bubblewrap (or with `allow_bwrap` False, for tests) the weaker wrapper
    that would be used is still probed, but a Sandbox refuses to use it unless weak isolation
    was opted into (see :class:`SandboxUnavailable`, :func:`warn_weak`)."""
    global _DETECTED
    if _DETECTED is not None and not force:
        return _DETECTED
    iso = Isolation()
    iso.bwrap_error = _probe_bwrap() if allow_bwrap else "bubblewrap disabled by the caller"
    if not iso.bwrap_error:
        iso.wrapper, iso.pid_namespace = "bwrap", True
    elif shutil.which("unshare"):
        for prefix, has_pid in _UNSHARE_VARIANTS:
            if _works(prefix + ["true"]):
                iso.wrapper, iso.unshare_prefix, iso.pid_namespace = "unshare", prefix, has_pid
                break
    iso.cgroups = CgroupFactory()
    iso.cgroup_error = iso.cgroups.error
    iso.cpu_pinning = hasattr(os, "sched_setaffinity")
    rep = iso.report()
    if iso.wrapper != "bwrap":
        log.warning("SANDBOX WARNING: %s; sandboxes refuse to start unless %s", iso.bwrap_error, WEAK_OPT_IN)
    for key in ("cgroup_pids", "cgroup_memory"):
        if not rep[key]:
            log.warning("SANDBOX WARNING: %s unavailable (%s): %s", key, iso.cgroup_error or "not mounted/writable",
                        "fork bombs are bounded only by RLIMIT_NPROC (ignored for root) and the wall clock"
                        if key == "cgroup_pids" else "memory is bounded only by RLIMIT_AS")
    if not iso.cpu_pinning:
        log.warning("SANDBOX WARNING: no sched_setaffinity: wall timings are not pinned to one core")
    _DETECTED = iso
    return iso


_WARNED_WEAK: set = set()


def warn_weak(iso: Isolation) -> None:
    """Weak isolation was opted into: say loudly (once per wrapper) what is missing."""
    key = (iso.wrapper, tuple(iso.unshare_prefix))
    if key in _WARNED_WEAK:
        return
    _WARNED_WEAK.add(key)
    if not iso.wrapper:
        log.warning("SANDBOX WARNING: no bubblewrap and no usable `unshare`: untrusted programs run WITHOUT "
                    "network, PID or mount namespaces (they can reach the network and signal other processes)")
    elif iso.wrapper != "bwrap":
        log.warning("SANDBOX WARNING: bubblewrap unusable, falling back to `%s`: no read-only filesystem "
                    "view and no tmpfs quota on the scratch directory", " ".join(iso.unshare_prefix))
    if not iso.pid_namespace:
        log.warning("SANDBOX WARNING: no PID namespace: a program can signal processes outside its sandbox")
