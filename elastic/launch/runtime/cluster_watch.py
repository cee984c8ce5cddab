"""While a run trains: say when the cluster can no longer hold what the run needs (issue 58 item 6).

The driver checks before any work that the cluster holds `min_workers` train workers plus a
data packer (driver.py `required_bundles`, `wait_for_resources`). Nodes can leave after that: a
run that grew onto a node that joined, and lost it, may be left on a cluster too small for its
smallest shape (a 1-CPU head under a train worker and a packer of 1 CPU each). Ray Train then
retries and Ray Data's actors wait for resources with no word on the console, for ever. The
watch looks at the cluster's total resources every `period_s`; once they have been short of
the run's needs for `after_s`, it says so in one line (and once more when that changes, and
when the cluster can hold the run again). It reads only `ray.cluster_resources()`, which counts
live nodes.
"""

from __future__ import annotations

import threading
import time
from typing import Callable, Dict, List, Optional


class ClusterWatch:
    def __init__(self, bundles: List[Dict[str, float]], words: str, say: Callable[[str], None],
                 period_s: float = 10.0, after_s: float = 30.0, resources: Optional[Callable[[], Dict[str, float]]] = None):
        self.bundles, self.words, self.say = bundles, words, say
        self.period_s, self.after_s = period_s, after_s
        self.resources = resources
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None
        self._short_since: Optional[float] = None
        self.said: Optional[str] = None

    def check(self, now: float) -> Optional[str]:
        """One look; returns the line said now, if any."""
        from elastic.launch.runtime.cluster import shortfall

        if self.resources is not None:
            total = self.resources()
        else:
            import ray

            total = ray.cluster_resources()
        # Against the totals only: "in use" is what the run itself holds; this asks whether the
        # cluster could hold the run at all.
        need: Dict[str, float] = {}
        for bundle in self.bundles:
            for k, v in bundle.items():
                need[k] = need.get(k, 0.0) + v
        if all(total.get(k, 0.0) + 1e-9 >= v for k, v in need.items()):
            self._short_since = None
            if self.said is not None:
                self.said = None
                line = f"[elastic] the cluster can hold {self.words} again"
                self.say(line)
                return line
            return None
        lack = shortfall(self.bundles, total, total)  # the words
        if self._short_since is None:
            self._short_since = now
        if now - self._short_since >= self.after_s and lack != self.said:
            self.said = lack
            line = (f"[elastic] waiting: the cluster (live nodes) cannot hold {self.words}: {lack}. The run resumes when "
                    f"nodes join; or stop it and lower scaling.min_workers, scaling.cpus_per_worker or data.tokenize_cpus")
            self.say(line)
            return line
        return None

    def _loop(self) -> None:
        while not self._stop.wait(self.period_s):
            try:
                self.check(time.monotonic())
            except Exception:  # a cluster going away: the run's own error says it
                pass

    def __enter__(self) -> "ClusterWatch":
        self._thread = threading.Thread(target=self._loop, name="cluster-watch", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
