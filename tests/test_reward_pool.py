"""The Ray actor pool: ordered results, extraction, dedup, and surviving a killed actor."""

from __future__ import annotations

import threading

import pytest

from elastic.config.schema import RewardSection
from tests.reward_helpers import (FIXTURES, evaluating_actor_pids, fence, kill_pid, leftover_cgroups, leftover_programs,
                                  leftover_scratch, mixed_items, wait_until)


@pytest.fixture(scope="module")
def pool(ray_local, tmp_path_factory):
    from elastic.reward.pool import RewardPool

    section = RewardSection(num_actors=2, max_in_flight_per_actor=2, item_deadline_s=120.0, max_retries=2,
                            timing="wall", timing_runs=1, warmup_runs=0,
                            cache_dir=str(tmp_path_factory.mktemp("reward-cache")))
    p = RewardPool(section, FIXTURES)
    yield p
    p.shutdown()


def test_batch_in_order_with_extraction(pool):
    items, expected = mixed_items(pool.problems, "order")
    items += [("pair-sum", "I would use a hash map."), ("no-such-problem", "```c\nint main(){}\n```")]
    expected += ["compile_error", "sandbox_error"]
    results = pool.evaluate_batch(items)
    assert [r.status for r in results] == expected
    assert [r.problem_id for r in results] == [pid for pid, _ in items]
    assert results[-2].reason == "no code block found"
    assert not any(r.dedup for r in results)  # every program distinct
    assert pool.layers()["net_namespace"]


def test_identical_programs_evaluated_once(pool):
    prob = pool.problems["pair-sum"]
    lang, src = prob.solutions["fast"]
    once = fence(lang, src + "\n/* dedup */\n")
    before = pool.stats()
    # the same program 4 times in a batch (with different prose around it), plus a wrong one twice
    wlang, wsrc = prob.solutions["wrong"]
    wrong = fence(wlang, wsrc + "\n/* dedup */\n")
    items = [("pair-sum", once), ("pair-sum", "Try this:\n" + once), ("pair-sum", once), ("pair-sum", wrong),
             ("pair-sum", once), ("pair-sum", wrong)]
    results = pool.evaluate_batch(items)
    assert [r.status for r in results] == ["ok"] * 3 + ["wrong_answer", "ok", "wrong_answer"]
    after = pool.stats()
    assert after["evaluations"] - before["evaluations"] == 2
    assert after["dedup_hits"] - before["dedup_hits"] == 4
    assert sum(not r.dedup for r in results) == 2
    assert len({r.reward for r in results if r.status == "ok"}) == 1  # one measurement for all copies
    # a later batch finds them in the dedup window: nothing evaluated again
    again = pool.evaluate_batch([("pair-sum", once), ("pair-sum", wrong)])
    assert [r.status for r in again] == ["ok", "wrong_answer"] and all(r.dedup for r in again)
    assert pool.stats()["evaluations"] == after["evaluations"]


def test_feedback_is_made_in_the_pool_with_the_failing_test(pool):
    """Multi-turn feedback (rl.feedback) is made in the pool, where the problem's tests are:
    code_opt's details show the first failing test's input, expected and actual output (the
    trainer, which has no tests, could not), within the byte budget; one evaluation serves every
    mode (the dedup window), and a submission without a Request gets no feedback."""
    from elastic.reward.request import Request

    prob = pool.problems["pair-sum"]
    lang, src = prob.solutions["wrong"]
    wrong = fence(lang, src + "\n/* feedback */\n")
    before = pool.stats()["evaluations"]
    details, verdict, small, plain = pool.evaluate_batch([
        ("pair-sum", wrong, Request(feedback="details", feedback_bytes=4096)),
        ("pair-sum", wrong, Request(feedback="verdict")),
        ("pair-sum", wrong, Request(feedback="details", feedback_bytes=48)),
        ("pair-sum", wrong)])
    assert pool.stats()["evaluations"] - before == 1
    assert details.status == "wrong_answer"
    failed = next(t for t in details.tests if t.status == "wrong_answer")
    case = next(c for c in prob.tests if c.name == failed.name)
    text = details.feedback
    assert text.startswith(f"Verdict: wrong answer on test {failed.name}")
    assert "Input:\n" + case.input.decode().strip() in text  # from the problem's own test files
    assert "Expected output:\n" + case.expected.decode().strip() in text
    assert "Your output:\n" + failed.output.strip() in text
    assert verdict.feedback == "Verdict: wrong answer."
    assert len(small.feedback.encode()) <= 48 and small.feedback.endswith("[truncated]")
    assert text.startswith(small.feedback[:-len("\n[truncated]")])
    assert plain.feedback is None


def test_killed_actor_mid_batch(pool):
    import ray

    items, expected = mixed_items(pool.problems, "kill", copies=2)
    out = {}
    th = threading.Thread(target=lambda: out.setdefault("r", pool.evaluate_batch(items)))
    before = pool.replaced
    th.start()
    assert wait_until(lambda: evaluating_actor_pids(), timeout_s=60), "no actor started evaluating"
    kill_pid(evaluating_actor_pids()[0])  # SIGKILL mid-evaluation: a crash, not a polite stop
    th.join(timeout=300)
    results = out["r"]
    assert len(results) == len(items) and all(r is not None for r in results)
    assert [r.status for r in results] == expected  # retried elsewhere: none misclassified
    assert pool.replaced > before
    assert any(r.attempts > 1 for r in results)
    # the replacement actor serves new work
    more, more_expected = mixed_items(pool.problems, "after-kill")
    assert [r.status for r in pool.evaluate_batch(more[:3])] == more_expected[:3]
    assert wait_until(lambda: leftover_programs() == [], 10), leftover_programs()
    # the killed actor could not clean up; a sandbox on this node swept its scratch dirs and cgroups
    assert all(ray.get([a.pid.remote() for a in pool.actors]))
    assert wait_until(lambda: leftover_scratch(dead_owners_only=True) == []
                      and leftover_cgroups(dead_owners_only=True) == [], timeout_s=10)


def test_item_deadline_is_infra_failure(ray_local, pool, tmp_path):
    """A stuck evaluation breaches the pool deadline: retried, then sandbox_error (not a verdict)."""
    from elastic.reward.pool import RewardPool

    section = RewardSection(num_actors=1, item_deadline_s=1.0, max_retries=1, timing_runs=1, warmup_runs=0,
                            dedup_window=1, cache_dir=str(tmp_path))
    slow = RewardPool(section, FIXTURES, problems=pool.problems)
    try:
        sleeper = fence("c", "#include <unistd.h>\nint main(void){ for(;;) pause(); }")
        [r] = slow.evaluate_batch([("pair-sum", sleeper)])
        assert r.status == "sandbox_error" and "deadline" in r.reason and r.attempts == 2
        assert slow.replaced == 2
        # infrastructure failures are never cached: the same program is tried afresh
        slow.evaluate_batch([("pair-sum", sleeper)])
        assert slow.stats()["dedup_hits"] == 0 and slow.replaced == 4
    finally:
        slow.shutdown()


def test_dedup_window_is_bounded(ray_local, pool, tmp_path):
    """A window of one program: A, B, A evaluates A twice; 0 turns dedup off."""
    import dataclasses

    from elastic.reward.pool import RewardPool

    a, b = (fence("c", "int main(void){ return 1; } /* %s */" % t) for t in "ab")
    for window, batches, evaluations in ((1, [[a], [b], [a]], 3), (0, [[a, a]], 2)):
        section = dataclasses.replace(pool.section, num_actors=1, dedup_window=window, cache_dir=str(tmp_path))
        small = RewardPool(section, FIXTURES, problems=pool.problems)
        try:
            rs = [r for batch in batches for r in small.evaluate_batch([("pair-sum", x) for x in batch])]
            assert [r.status for r in rs] == ["runtime_error"] * len(rs) and not any(r.dedup for r in rs)
            assert small.stats()["evaluations"] == evaluations
        finally:
            small.shutdown()
