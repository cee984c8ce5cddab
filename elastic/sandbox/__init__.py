"""The sandbox: the security boundary around untrusted programs (generated code, a user's reward
function). It knows nothing of rewards, models or Ray, imports nothing else of this package, and
fails closed: without a working bubblewrap it refuses to run unless weak isolation is asked for.

    command.py        Sandbox: run one untrusted command under every isolation layer (the door)
    session.py        RunSession: one bubblewrap instance serving many runs of one evaluation
    isolation.py      which layers this machine gives (bubblewrap, unshare, cgroups), detected once
    cgroups.py        per-run cgroups: process count and memory bounds that bind even root
    launcher.py       the trusted exec shim (cgroup attach, rlimits, CPU pin), compiled once
    runner_source.py  C source of the in-sandbox runner a session talks to

Verifiers (elastic/reward/verifiers) build on it; so can anything else that runs code it does
not trust (execution feedback, user environments).
"""

from elastic.sandbox.command import Limits, PreparedRun, RunOutcome, Sandbox
from elastic.sandbox.isolation import SandboxUnavailable
from elastic.sandbox.session import RunSession

__all__ = ["Limits", "PreparedRun", "RunOutcome", "RunSession", "Sandbox", "SandboxUnavailable"]
