"""A user's environment (rl.env: "module:Class", elastic/reward/verifiers/user_env.py), stepped by
stateless replay on a REAL reward pool (Ray actors on a local cluster): first messages, turns
whose message depends on the replayed answers, a raise, a hang and a failed reset scored (never
fatal, the pool goes on), the same answer from any actor, and the contract checks (a
non-deterministic replay, a result of the wrong form, a malformed spec)."""

from __future__ import annotations

import time

import pytest

from elastic.config.schema import RewardSection
from elastic.reward.request import Request
from elastic.reward.tasks import Task

COUNTER = "tests.fixtures.user_envs.envs:Counter"


@pytest.fixture(scope="module")
def env_pool(ray_local, tmp_path_factory):
    """Two actors, dedup off (every submission is evaluated: the replay itself is under test), a
    0.5 s time limit per environment call (the hang's)."""
    from elastic.reward.pool import RewardPool

    section = RewardSection(num_actors=2, dedup_window=0, function_timeout_s=0.5,
                            cache_dir=str(tmp_path_factory.mktemp("reward-cache")))
    tasks = {t: Task(t, f"count to {i}", fields={"n": i}) for i, t in enumerate(["a", "b", "bad-reset-1"])}
    pool = RewardPool(section, tasks=tasks, env=COUNTER)
    yield pool
    pool.shutdown()


def test_env_episode_scored_on_the_pool_with_replay(env_pool):
    first, t1, t2 = env_pool.evaluate_batch([
        ("a", "", Request(reset=True)),
        ("a", "hello", Request()),                        # turn 1
        ("a", "four", Request(history=("hello",))),       # turn 2: 'hello' replayed first
    ])
    assert (first.status, first.feedback) == ("ok", "Task a: count to 0")
    assert (t1.status, t1.reward, t1.feedback) == ("wrong_answer", 0.0, "turn 1: 5 characters so far, try again")
    assert (t2.status, t2.reward, t2.feedback) == ("ok", 1.0, None)  # done at turn 2: no next message
    # the message of a turn depends on the replayed answers: another history, another message
    [other] = env_pool.evaluate_batch([("b", "hi", Request())])
    assert other.feedback == "turn 1: 2 characters so far, try again"
    # the pool cuts a message to the caller's byte budget (the first message is never cut)
    [cut] = env_pool.evaluate_batch([("a", "x" * 40, Request(feedback_bytes=20))])
    assert len(cut.feedback.encode()) <= 20 and cut.feedback.endswith("[truncated]")


def test_env_raise_hang_and_failed_reset_are_scored_not_fatal(env_pool):
    t0 = time.monotonic()
    raised, hung, bad, after = env_pool.evaluate_batch([
        ("a", "raise", Request(history=("hello",))),
        ("b", "hang", Request()),
        ("bad-reset-1", "", Request(reset=True)),
        ("a", "again", Request(history=("hello",))),
    ])
    assert raised.status == "runtime_error" and raised.reward == 0.0 and raised.feedback is None
    assert "ValueError: cannot step 'raise'" in raised.reason
    assert hung.status == "timeout" and hung.feedback is None and "did not return within 1 s" in hung.reason  # 2 calls x 0.5 s
    assert bad.status == "runtime_error" and "RuntimeError: no episode for bad-reset-1" in bad.reason
    assert (after.status, after.reward) == ("ok", 1.0)  # the pool and the killed child go on
    assert time.monotonic() - t0 < 300  # the hang was killed, not waited for (it sleeps an hour)
    assert env_pool.stats()["replaced_actors"] == 0  # scored on the actors, no infrastructure failure


def test_env_replay_is_the_same_on_any_actor(env_pool):
    """Dedup is off: each copy is evaluated, spread over both actors; a deterministic environment
    gives every copy the same message and reward, whichever actor replayed it."""
    before = env_pool.stats()["evaluations"]
    got = env_pool.evaluate_batch([("b", "second", Request(history=("first answer",)))] * 6
                                  + [("b", "first answer", Request())] * 2)
    assert env_pool.stats()["evaluations"] - before == 8
    assert {(r.status, r.reward, r.feedback) for r in got[:6]} == {("ok", 1.0, None)}
    assert {r.feedback for r in got[6:]} == {"turn 1: 12 characters so far, try again"}


def test_replay_contract_checks_without_a_pool():
    from elastic.reward.verifiers.user_env import EnvError, check_spec, replay, resolve_env
    from tests.fixtures.user_envs.envs import BadStep, Counter, Forgetful

    task = {"id": "a", "prompt": "p", "answer": None, "fields": {}}
    assert replay(Counter, task, (), None) == "Task a: p"
    assert replay(Counter, task, ("abc",), "de") == (None, 1.0, True)
    assert replay(Counter, task, (), "abc") == replay(Counter, task, (), "abc")  # fresh instance each time
    Forgetful.made = 0
    assert replay(Forgetful, task, (), "x") == ("again", 0.0, False)  # instance 1 goes on after turn 1
    with pytest.raises(EnvError, match="not deterministic"):
        replay(Forgetful, task, ("x",), "y")  # instance 2 ends at turn 1: the replay ended early
    with pytest.raises(EnvError, match="not a \\(feedback, reward, done\\) tuple"):
        replay(BadStep, task, (), "x")
    for bad in ("counter", "a:b:c", "mod:", ":Cls", "my-envs:Counter"):
        with pytest.raises(ValueError, match="rl.env: .* is not 'module:Class'"):
            check_spec(bad)
    with pytest.raises(ValueError, match="has no class 'Nope' with reset"):
        resolve_env("tests.fixtures.user_envs.envs:Nope")
    assert resolve_env(COUNTER) is Counter
