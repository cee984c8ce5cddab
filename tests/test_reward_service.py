"""The run's shared reward service: streaming callers, idempotent keys, dedup, actor loss,
and a clear error (never a hang) when the service or its pool is gone.

Real Ray (the session's `ray_local` cluster), real gcc, real sandbox; callers are Ray tasks,
i.e. separate processes like train workers.
"""

from __future__ import annotations

import time
import uuid

import pytest

from elastic.config.schema import RewardSection
from elastic.reward import load_problems
from tests.reward_helpers import FIXTURES, evaluating_actor_pids, fence, kill_pid, mixed_items, wait_until


@pytest.fixture(scope="module")
def problems():
    return load_problems(FIXTURES)


@pytest.fixture(scope="module")
def service(ray_local, tmp_path_factory):
    from elastic.reward.service import start_service

    section = RewardSection(num_actors=2, max_in_flight_per_actor=2, item_deadline_s=120.0, max_retries=2,
                            timing="wall", timing_runs=1, warmup_runs=0,
                            cache_dir=str(tmp_path_factory.mktemp("reward-cache")))
    client = start_service(section, FIXTURES, name=f"reward-test-{uuid.uuid4().hex[:8]}")
    yield client
    client.shutdown()


def _caller(name: str, items, expected_keys, wait: bool = True):
    """A train worker: connect by name, stream completions one by one (without waiting for the
    service's answer, as GRPO's trainers do, when `wait` is False), then wait for all."""
    from elastic.reward.service import connect

    client = connect(name)
    for key, pid, completion in items:
        assert (client.submit([(key, pid, completion)], wait=wait) is None) == (not wait)
        time.sleep(0.01)
    got = client.results(expected_keys, timeout_s=240)
    return {k: r.status for k, r in got.items()}


def test_two_concurrent_streaming_callers(service, problems):
    import ray

    caller = ray.remote(num_cpus=0)(_caller)
    items, expected = mixed_items(problems, "stream", copies=2)
    keyed = [(f"0:{i // 2}:{i % 2}", pid, c) for i, (pid, c) in enumerate(items)]
    halves = [keyed[0::2], keyed[1::2]]  # two workers, interleaved samples
    before = service.stats()["evaluations"]
    refs = [caller.remote(service.name, h, [k for k, _, _ in h], wait) for h, wait in zip(halves, (True, False))]
    got = {}
    for part in ray.get(refs, timeout=300):
        got.update(part)
    assert got == {k: s for (k, _, _), s in zip(keyed, expected)}
    s = service.stats()
    assert s["evaluations"] - before == len(items)  # all distinct programs
    assert s["keys_pending"] == 0 and s["error"] is None
    assert service.forget([k for k, _, _ in keyed]) == len(keyed)
    assert service.stats()["keys_done"] == 0


def test_resubmitting_a_key_never_evaluates_again(service, problems):
    items, expected = mixed_items(problems, "idem")
    keyed = [(f"1:{i}:0", pid, c) for i, (pid, c) in enumerate(items)]
    before = service.stats()["evaluations"]
    assert service.submit(keyed) == len(keyed)
    assert service.submit(keyed) == 0  # in flight: ignored
    first = service.results([k for k, _, _ in keyed], timeout_s=240)
    assert [first[k].status for k, _, _ in keyed] == expected
    assert service.submit(keyed) == 0  # done: ignored (a restarted worker resubmits its step)
    again = service.results([k for k, _, _ in keyed], timeout_s=1)
    assert {k: r.to_dict() for k, r in again.items()} == {k: r.to_dict() for k, r in first.items()}
    assert service.stats()["evaluations"] - before == len(items)
    with pytest.raises(KeyError):
        service.results(["never-submitted"], timeout_s=1)


def test_identical_program_is_a_dedup_hit(service, problems):
    lang, src = problems["range-sum"].solutions["fast"]
    same = fence(lang, src + "\n// group of four\n")
    keyed = [(f"2:0:{i}", "range-sum", ("Sample %d:\n" % i) + same) for i in range(4)]
    before = service.stats()
    service.submit(keyed)
    got = service.results([k for k, _, _ in keyed], timeout_s=240)
    after = service.stats()
    assert [got[k].status for k, _, _ in keyed] == ["ok"] * 4
    assert after["evaluations"] - before["evaluations"] == 1
    assert after["dedup_hits"] - before["dedup_hits"] == 3
    assert sorted(r.dedup for r in got.values()) == [False, True, True, True]


def test_killed_pool_actor_mid_evaluation_scores_nothing_wrong(service, problems):
    items, expected = mixed_items(problems, "kill", copies=2)
    keyed = [(f"3:{i}:0", pid, c) for i, (pid, c) in enumerate(items)]
    before = service.stats()["replaced_actors"]
    service.submit(keyed)
    assert wait_until(lambda: evaluating_actor_pids(), timeout_s=60), "no pool actor started evaluating"
    kill_pid(evaluating_actor_pids()[0])
    got = service.results([k for k, _, _ in keyed], timeout_s=300)
    assert [got[k].status for k, _, _ in keyed] == expected  # not wrong_answer/compile_error because of the kill
    assert any(r.attempts > 1 for r in got.values())
    s = service.stats()
    assert s["replaced_actors"] > before and s["infra_failures"] >= 1 and s["error"] is None


def test_service_gone_is_a_clear_error(ray_local, problems, tmp_path):
    import ray

    from elastic.reward.service import RewardServiceError, connect, start_service

    section = RewardSection(num_actors=1, timing_runs=1, warmup_runs=0, cache_dir=str(tmp_path))
    name = f"reward-gone-{uuid.uuid4().hex[:8]}"
    client = start_service(section, FIXTURES, name=name, problems=problems)
    lang, src = problems["pair-sum"].solutions["fast"]
    client.submit([("k", "pair-sum", fence(lang, src))])
    ray.kill(client.actor)
    t0 = time.monotonic()
    with pytest.raises(RewardServiceError, match="is gone"):
        client.results(["k"], timeout_s=120)
    assert time.monotonic() - t0 < 30
    client.submit([("k2", "pair-sum", fence(lang, src))], wait=False)  # sent without waiting: its failure shows next
    with pytest.raises(RewardServiceError, match="is gone"):
        client.results(["k2"], timeout_s=120)
    with pytest.raises(RewardServiceError, match="no reward service named"):
        connect(name, timeout_s=1)


def test_pool_that_cannot_place_actors_fails_within_the_bound(ray_local, problems, tmp_path):
    """No node offers the actors' resource: callers get an error after unavailable_after_s, not a hang."""
    from elastic.reward.service import RewardServiceError, start_service

    section = RewardSection(num_actors=1, actor_resource="no-such-node-label", item_deadline_s=1.0, max_retries=50,
                            unavailable_after_s=3.0, cache_dir=str(tmp_path))
    client = start_service(section, FIXTURES, name=f"reward-unplaceable-{uuid.uuid4().hex[:8]}", problems=problems)
    try:
        lang, src = problems["pair-sum"].solutions["fast"]
        client.submit([("k", "pair-sum", fence(lang, src))])
        t0 = time.monotonic()
        with pytest.raises(RewardServiceError, match="unavailable.*no evaluation completed"):
            client.results(["k"], timeout_s=120)
        assert time.monotonic() - t0 < 3.0 + 10  # the bound plus scheduling slack on a loaded machine
        assert client.stats()["unavailable"]
        with pytest.raises(RewardServiceError, match="unavailable"):
            client.submit([("k2", "pair-sum", fence(lang, src))])
    finally:
        client.shutdown()
