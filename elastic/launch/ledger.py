"""Check the sample ledger: every sample of the consumed range trained on exactly once.

`ledger.jsonl` has one line per (step, rank, attempt) with the global sample ids that rank
trained on. Steps redone after a restart appear once per attempt; only the last attempt's
record of a step counts (the earlier one's gradient was discarded with the restart).
"""

from __future__ import annotations

from collections import Counter
from typing import Dict, List

from elastic.records import read_records


def final_assignment(path: str) -> Dict[int, Dict[int, List[int]]]:
    """step -> rank -> sample ids, from the last attempt that ran each step."""
    by_step: Dict[int, Dict[float, Dict[int, List[int]]]] = {}
    for r in read_records(path):
        by_step.setdefault(r["step"], {}).setdefault(r["start_time"], {})[r["rank"]] = r["sample_ids"]
    return {s: attempts[max(attempts)] for s, attempts in by_step.items()}


def check(path: str, global_batch: int, steps: int) -> Dict:
    final = final_assignment(path)
    ids = [i for s in sorted(final) for r in sorted(final[s]) for i in final[s][r]]
    counts = Counter(ids)
    dup = sorted(i for i, c in counts.items() if c > 1)
    short_steps = sorted(s for s, ranks in final.items() if sum(len(v) for v in ranks.values()) != global_batch)
    missing_steps = sorted(set(range(1, steps + 1)) - set(final))
    return {
        "ok": not dup and not short_steps and not missing_steps and len(ids) == steps * global_batch,
        "samples": len(ids), "unique": len(counts), "duplicates": dup[:20], "steps_missing": missing_steps,
        "steps_with_wrong_batch": short_steps,
        "world_sizes": sorted({len(ranks) for ranks in final.values()}),
    }
