"""The Ray actor pool: ordered results, code extraction, and surviving a killed actor."""

from __future__ import annotations

import threading
import time

import pytest

from elastic.config.schema import RewardSection
from tests.reward_helpers import FIXTURES, leftover_cgroups, leftover_programs, leftover_scratch


def fence(lang, src):
    return f"Here is my answer.\n```{lang}\n{src}\n```\n"


@pytest.fixture(scope="module")
def pool(ray_local, tmp_path_factory):
    from elastic.reward.pool import RewardPool

    section = RewardSection(num_actors=2, max_in_flight_per_actor=2, item_deadline_s=120.0, max_retries=2,
                            timing="wall", timing_runs=1, warmup_runs=0,
                            cache_dir=str(tmp_path_factory.mktemp("reward-cache")))
    p = RewardPool(section, FIXTURES)
    yield p
    p.shutdown()


def batch(pool):
    items, expected = [], []
    for pid in ("pair-sum", "range-sum"):
        prob = pool.problems[pid]
        for sol, status in (("fast", "ok"), ("wrong", "wrong_answer")):
            lang, src = prob.solutions[sol]
            items.append((pid, fence(lang, src)))
            expected.append(status)
        items.append((pid, fence(prob.language, prob.reference_source)))
        expected.append("ok")
    return items, expected


def test_batch_in_order_with_extraction(pool):
    items, expected = batch(pool)
    items += [("pair-sum", "I would use a hash map."), ("no-such-problem", "```c\nint main(){}\n```")]
    expected += ["compile_error", "sandbox_error"]
    results = pool.evaluate_batch(items)
    assert [r.status for r in results] == expected
    assert [r.problem_id for r in results] == [pid for pid, _ in items]
    assert results[-2].reason == "no code block found"
    assert pool.layers()["net_namespace"]


def test_killed_actor_mid_batch(pool):
    import ray

    items, expected = batch(pool)
    items, expected = items * 2, expected * 2
    out = {}
    th = threading.Thread(target=lambda: out.setdefault("r", pool.evaluate_batch(items)))
    before = pool.replaced
    th.start()
    time.sleep(1.5)  # both actors are busy by now
    ray.kill(pool.actors[0])
    th.join(timeout=300)
    results = out["r"]
    assert len(results) == len(items) and all(r is not None for r in results)
    assert [r.status for r in results] == expected  # retried elsewhere: none misclassified
    assert pool.replaced > before
    assert any(r.attempts > 1 for r in results)
    # the replacement actor serves new work
    again = pool.evaluate_batch(items[:3])
    assert [r.status for r in again] == expected[:3]
    assert leftover_programs() == []
    # the killed actor could not clean up; its replacement swept its scratch dirs and cgroups
    assert ray.get(pool.actors[0].pid.remote()) > 0
    assert leftover_scratch() == [] and leftover_cgroups() == []


def test_item_deadline_is_infra_failure(ray_local, pool, tmp_path):
    """A stuck evaluation breaches the pool deadline: retried, then sandbox_error (not a verdict)."""
    from elastic.reward.pool import RewardPool

    section = RewardSection(num_actors=1, item_deadline_s=1.0, max_retries=1, timing_runs=1, warmup_runs=0,
                            cache_dir=str(tmp_path))
    slow = RewardPool(section, FIXTURES, problems=pool.problems)
    try:
        sleeper = fence("c", "#include <unistd.h>\nint main(void){ for(;;) pause(); }")
        [r] = slow.evaluate_batch([("pair-sum", sleeper)])
        assert r.status == "sandbox_error" and "deadline" in r.reason and r.attempts == 2
        assert slow.replaced == 2
    finally:
        slow.shutdown()
