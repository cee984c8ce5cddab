"""Evaluation knobs, built from the ``reward`` config section (or defaults for the CLI)."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import List, Optional


def default_cache_dir() -> str:
    return os.environ.get("ELASTIC_REWARD_CACHE") or str(Path.home() / ".cache" / "elastic" / "reward")


@dataclass
class EvalSettings:
    timing: str = "wall"  # wall | instructions
    timing_runs: int = 5  # wall mode: timed runs after warm-up (median taken)
    warmup_runs: int = 1
    failure_reward: float = 0.0
    reward_floor: float = 0.1
    speedup_scale: float = 2.0
    cache_dir: str = field(default_factory=default_cache_dir)
    compile_time_limit_s: float = 30.0
    compile_memory_mb: int = 1024
    instructions_time_limit_s: float = 120.0
    env_allow: List[str] = field(default_factory=list)
    cpu: Optional[int] = None  # core to pin runs to; None: the last allowed core
    # Without a working bubblewrap the sandbox refuses to start (SandboxUnavailable) unless this
    # is set: then programs run under `unshare` (no filesystem isolation) or no namespaces at all.
    allow_weak_isolation: bool = False
    # python_tests: the interpreter run inside the sandbox (only /usr is visible there, so it
    # must live under /usr; resolved on the sandbox's PATH /usr/local/bin:/usr/bin:/bin).
    python_executable: str = "python3"

    @classmethod
    def from_section(cls, section, cpu: Optional[int] = None) -> "EvalSettings":
        """From a :class:`elastic.config.schema.RewardSection`."""
        return cls(timing=section.timing, timing_runs=section.timing_runs, warmup_runs=section.warmup_runs,
                   failure_reward=section.failure_reward, reward_floor=section.reward_floor,
                   speedup_scale=section.speedup_scale, cache_dir=section.cache_dir or default_cache_dir(),
                   compile_time_limit_s=section.compile_time_limit_s,
                   instructions_time_limit_s=section.instructions_time_limit_s,
                   env_allow=list(section.env_allow), cpu=cpu,
                   allow_weak_isolation=getattr(section, "allow_weak_isolation", False),
                   python_executable=getattr(section, "python_executable", "python3"))

    def pinned_cpu(self) -> Optional[int]:
        if not hasattr(os, "sched_getaffinity"):
            return None
        allowed = sorted(os.sched_getaffinity(0))
        if self.cpu is None:
            return allowed[-1]
        return allowed[self.cpu % len(allowed)]
