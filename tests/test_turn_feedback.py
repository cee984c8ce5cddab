"""Multi-turn pieces of issue 44: verifier feedback (elastic/reward/feedback.py), its byte and
token caps, episode rewards and policy-token masks (elastic/rl/algorithms/turns.py), the
feedback turn in the chat template (elastic/data/chat.py), and that feedback tokens change no
gradient of the GRPO loss."""

from __future__ import annotations

import pytest
import torch

from elastic.config import ConfigError, load_config
from elastic.data.chat import ChatFormat, feedback_turn_ids, feedback_turn_segments, render_segments, tokenize_segments
from elastic.reward.feedback import MARKER, cut_bytes, feedback_text
from elastic.reward.result import OUTPUT_HEAD, Result
from elastic.reward.result import TestResult as Case
from elastic.reward.tasks import DEFAULT_FIELDS, Task, row_task
from elastic.rl.algorithms.aggregation import StepCounts
from elastic.rl.algorithms.gae import gae_advantages_returns
from elastic.rl.algorithms.logprobs import token_entropy, token_logprobs
from elastic.rl.algorithms.loss import grpo_loss
from elastic.rl.algorithms.turns import cap_tokens, episode_budget, episode_reward, policy_token_mask
from tests.reward_helpers import FIXTURES, fast_settings


# -- feedback from real verifier results ----------------------------------------------------------
@pytest.fixture(scope="module")
def pair_sum():
    from elastic.reward import load_problem

    return load_problem(FIXTURES / "pair-sum")


def test_code_opt_wrong_answer_real_run_shows_the_failing_test(pair_sum, tmp_path):
    """One real sandboxed compile + run: the wrong solution fails the first test; the result now
    carries what the program printed, and details show input, expected and actual."""
    from elastic.reward import evaluate
    from elastic.sandbox.isolation import SandboxUnavailable

    src = (FIXTURES / "pair-sum" / "solutions" / "wrong.c").read_text()
    try:
        r = evaluate(pair_sum, src, "c", fast_settings(tmp_path, compile_time_limit_s=10.0))
    except SandboxUnavailable as e:
        pytest.skip(f"no sandbox: {e}")
    assert r.status == "wrong_answer", r
    failed = next(t for t in r.tests if t.status == "wrong_answer")
    case = next(c for c in pair_sum.tests if c.name == failed.name)
    assert failed.output and len(failed.output.encode()) <= OUTPUT_HEAD
    assert failed.output.encode() != case.expected
    task = Task(pair_sum.id, "p", problem=pair_sum)
    text = feedback_text(r, "code_opt", "details", 2048, task=task)
    assert f"test {failed.name}" in text and "Your output:\n" + failed.output.strip() in text
    assert case.expected.decode().strip() in text and "Input:" in text
    assert str(tmp_path) not in text  # nothing from outside the report (no paths)
    assert feedback_text(r, "code_opt", "verdict", 2048, task=task) == "Verdict: wrong answer."


def _code_opt_result(status, **kw):
    return Result("pair-sum", status, -0.5, **kw)


def test_code_opt_compile_error_timeout_and_pass():
    diag = "\n".join(f"prog.c:{i}:1: error: expected ';' before '}}' token" for i in range(1, 40))
    r = _code_opt_result("compile_error", reason="compiler exited with status 1", compile_output=diag)
    text = feedback_text(r, "code_opt", "details", 4096)
    assert text.startswith("Verdict: compilation failed (compiler exited with status 1)\nCompiler output:\nprog.c:1:1")
    assert "prog.c:12:1" in text and "prog.c:13:1" not in text  # first lines only
    to = _code_opt_result("timeout", reason="test 02: exceeded 1s wall / 1s CPU",
                          tests=[Case("01", "ok", 0.01), Case("02", "timeout", 1.0, "exceeded 1s wall / 1s CPU"),
                                 Case("03", "skipped")])
    assert feedback_text(to, "code_opt", "details", 4096) == "Verdict: time limit exceeded on test 02: exceeded 1s wall / 1s CPU"
    assert feedback_text(_code_opt_result("memory_limit", tests=[Case("01", "memory_limit", 0.1, "memory limit 64 MB exceeded")]),
                         "code_opt", "verdict", 100) == "Verdict: memory limit exceeded."
    assert feedback_text(Result("p", "ok", 1.0), "code_opt", "details", 100) is None
    assert feedback_text(Result("p", "sandbox_error", -0.5, reason="actor died"), "code_opt", "details", 100) is None


def test_python_tests_real_run_shows_the_failing_assert():
    from elastic.reward.settings import EvalSettings
    from elastic.reward.verifiers.python_tests.verifier import PythonTests, evaluate_python
    from elastic.sandbox.isolation import SandboxUnavailable

    spec = PythonTests(entry_point="add", test_list=["assert add(1, 2) == 3", "assert add(2, 2) == 4"])
    try:
        r = evaluate_python("t", spec, "```python\ndef add(a, b):\n    return a - b\n```", EvalSettings(failure_reward=-0.5))
    except SandboxUnavailable as e:
        pytest.skip(f"no sandbox: {e}")
    assert r.status == "wrong_answer", r
    text = feedback_text(r, "python_tests", "details", 1024)
    failed = next(t for t in r.tests if t.status == "wrong_answer")
    assert text == f"Verdict: wrong answer on {failed.name}\n{failed.detail}"
    assert "add(1, 2) == 3" in text
    assert feedback_text(r, "python_tests", "verdict", 1024) == "Verdict: wrong answer."
    load = Result("t", "syntax_error", -0.5, reason="x" * 5000 + " SyntaxError: invalid syntax (line 3)", language="python")
    t2 = feedback_text(load, "python_tests", "details", 4096)
    assert t2.startswith("Verdict: the program does not parse\n...") and t2.endswith("invalid syntax (line 3)")
    assert len(t2.encode()) < 700  # the tail, not the whole reason


def test_python_tasks_files_and_repair_rows_are_what_make_py_writes():
    """datasets/python-tasks/make.py --check: all five files (repair_sft.jsonl's feedback comes
    from the real python_tests verifier in the sandbox, so this also holds the shipped feedback
    equal to what feedback_text says of each wrong attempt today). A repair row is a train task's
    instruction, a failed attempt that is not learned, its feedback, and the canonical answer,
    which is all SFT learns of it."""
    import json
    import subprocess
    import sys
    from pathlib import Path

    from elastic.reward.settings import EvalSettings
    from elastic.reward.verifiers.programs import default_sandbox
    from elastic.sandbox.isolation import SandboxUnavailable

    try:
        default_sandbox(EvalSettings().env_allow, EvalSettings().allow_weak_isolation)
    except SandboxUnavailable as e:
        pytest.skip(f"no sandbox: {e}")
    d = Path(__file__).resolve().parents[1] / "datasets" / "python-tasks"
    r = subprocess.run([sys.executable, str(d / "make.py"), "--check"], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr[-2000:]
    train = {json.loads(x)["task_id"]: json.loads(x) for x in open(d / "train.jsonl")}
    rows = [json.loads(x) for x in open(d / "repair_sft.jsonl")]
    assert len(rows) == 96 and {k: sum(r["kind"] == k for r in rows) for k in ("syntax", "off_by_one", "wrong_return")} \
        == {"syntax": 32, "off_by_one": 32, "wrong_return": 32}
    fmt = ChatFormat()

    class Enc:  # one id per character: the learned text can be read off the mask
        def __init__(self, t):
            self.ids = [ord(ch) for ch in t]

    for row in rows:
        t = train[row["task_id"]]  # train tasks only: held-out ids are not in train.jsonl
        user, wrong, fb, fix = row["messages"]
        assert [m["role"] for m in row["messages"]] == ["user", "assistant", "user", "assistant"]
        assert user["content"] == t["instruction"] and wrong["weight"] == 0 and "weight" not in fix
        assert fix["content"] == "```python\n" + t["prompt"] + t["canonical_solution"] + "```" != wrong["content"]
        assert fb["content"].startswith(("Verdict: wrong answer on check\nassert candidate(",
                                         "Verdict: the program does not parse\nSyntaxError: ",
                                         "Verdict: runtime error on check\n")), fb["content"]
        ids, mask = tokenize_segments(render_segments(row["messages"], fmt), lambda ts: [Enc(x) for x in ts], eos_id=0)
        assert "".join(chr(i) for i, m in zip(ids, mask) if m) == fix["content"]


def test_math_gold_answer_only_in_details_and_only_when_the_task_allows():
    from elastic.reward.verifiers.math_answer import score_math

    passed, reason = score_math("The answer is \\boxed{41}", "42")
    r = Result("m", "wrong_answer", 0.0, reason=reason)
    assert not passed and "42" in reason  # the verifier's reason names the reference: never shown
    hidden = row_task({"id": "m", "prompt": "6*7?", "answer": "42"}, "f:1", 0, "f",
                      {**DEFAULT_FIELDS, "id": "id"}, ("answer",))
    shown = row_task({"id": "m", "prompt": "6*7?", "answer": "42", "reveal_answer": True}, "f:1", 0, "f",
                     {**DEFAULT_FIELDS, "id": "id"}, ("answer",))
    assert not hidden.reveal_answer and shown.reveal_answer
    for task in (None, hidden, shown):
        assert feedback_text(r, "math_answer", "verdict", 200, task=task) == "Your answer is wrong."
    assert feedback_text(r, "math_answer", "details", 200, task=hidden) == "Your answer is wrong."
    assert feedback_text(r, "math_answer", "details", 200, task=shown) == "Your answer is wrong.\nThe correct answer is 42."
    truthy = Task("m", "p", answer="42", fields={"reveal_answer": "yes"})  # only the flag, never a field
    assert "42" not in feedback_text(r, "math_answer", "details", 200, task=truthy)
    assert feedback_text(Result("m", "ok", 1.0), "math_answer", "details", 200, task=shown) is None


# -- caps -----------------------------------------------------------------------------------------
@pytest.mark.parametrize("cap", [13, 14, 15, 16, 17, 31, 64, 100])
def test_byte_cap_never_exceeded_and_cut_on_a_character_boundary(cap):
    text = "é€😀a" * 40  # 2-, 3-, 4- and 1-byte characters
    out = cut_bytes(text, cap, MARKER)
    assert len(out.encode("utf-8")) <= cap and out.endswith(MARKER)
    assert text.startswith(out[:-len(MARKER)])  # a clean head: no half character, no replacement char
    big = Result("p", "compile_error", -0.5, compile_output="\n".join(["ошибка: 😀 " * 30] * 12))
    fb = feedback_text(big, "code_opt", "details", cap)
    assert len(fb.encode("utf-8")) <= cap
    assert cut_bytes("short", cap) == "short"


def test_feedback_rejects_bad_mode_and_tiny_cap():
    r = Result("p", "wrong_answer", 0.0)
    with pytest.raises(ValueError, match="mode"):
        feedback_text(r, "code_opt", "all", 100)
    with pytest.raises(ValueError, match="max_bytes"):
        feedback_text(r, "code_opt", "verdict", len(MARKER))


@pytest.mark.parametrize("n,cap", [(0, 5), (5, 5), (6, 5), (50, 5), (50, 1), (3, 2)])
def test_token_cap(n, cap):
    ids = list(range(100, 100 + n))
    marker = [7, 8, 9]
    out = cap_tokens(ids, cap, marker)
    assert len(out) <= cap
    if n <= cap:
        assert out == ids
    else:
        keep = max(cap - len(marker), 0)
        assert out == ids[:keep] + marker[:cap - keep]
    with pytest.raises(ValueError):
        cap_tokens(ids, 0)


# -- episode rewards and masks, by hand -----------------------------------------------------------
def test_episode_reward_by_hand():
    assert episode_reward([0.7]) == 0.7
    assert episode_reward([0.7], "discounted", 0.5, cost=0.3) == 0.7  # one turn: today's reward, whatever the settings
    assert episode_reward([0.0, -0.5, 1.0], "last") == 1.0
    assert episode_reward([0.0, -0.5, 1.0], "last", cost=0.1) == pytest.approx(0.8)
    assert episode_reward([0.0, -0.5, 1.0], "discounted", 0.5) == pytest.approx(0.0 - 0.25 + 0.25)
    assert episode_reward([-1.0, 1.0], "discounted", 0.9, cost=0.05) == pytest.approx(-1.0 + 0.9 - 0.05)
    assert episode_reward([1.0, 2.0], "discounted", 1.0) == 3.0
    for bad in (dict(turn_rewards=[]), dict(turn_rewards=[1.0], mode="sum"), dict(turn_rewards=[1.0], discount=0.0),
                dict(turn_rewards=[1.0], discount=1.5), dict(turn_rewards=[1.0], cost=-0.1)):
        with pytest.raises(ValueError):
            episode_reward(**bad)


def test_episode_budget_is_the_whole_steps_not_a_ranks():
    """The room of every episode comes from all the step's prompts, so splitting them over 1 or 2
    ranks gives each the same cache size (a resized run, the same episodes)."""
    lens = [12, 30, 7, 19]
    want = 30 + 3 * 8 + 2 * (32 + 64)
    assert episode_budget(lens, 3, 8, 32, 4096) == want
    assert episode_budget(lens, 3, 8, 32, 100) == 100  # capped at max_seq_len
    assert episode_budget([5], 1, 8, 32, 4096) == 13  # one turn: prompt + answer, no feedback room


def test_policy_token_mask_by_hand():
    # prompt 0..2, turn 1 at 3..5, feedback 6..8, turn 2 at 9..10, padding 11
    m = policy_token_mask([(3, 6), (9, 11)], 12)
    assert m.tolist() == [0, 0, 0, 1, 1, 1, 0, 0, 0, 1, 1, 0]
    b = policy_token_mask([[(0, 2)], [], [(1, 2), (3, 4)]], 4)
    assert b.tolist() == [[1, 1, 0, 0], [0, 0, 0, 0], [0, 1, 0, 1]]
    assert policy_token_mask([], 3).tolist() == [0, 0, 0]
    with pytest.raises(ValueError, match="outside"):
        policy_token_mask([(2, 5)], 4)
    with pytest.raises(ValueError, match="overlaps"):
        policy_token_mask([(0, 3), (2, 4)], 4)


# -- masking: feedback changes no gradient ---------------------------------------------------------
def _loss_grad(logits, tokens, mask, old, ref):
    x = logits.clone().requires_grad_(True)
    logp = token_logprobs(x, tokens)
    ent = token_entropy(x)
    counts = StepCounts(sequences=int(mask.any(-1).sum()), tokens=int(mask.sum()), max_new_tokens=tokens.shape[1])
    adv = torch.tensor([1.0, -0.5], dtype=torch.float64)
    loss, stats = grpo_loss(logp, old, adv, mask, loss_agg="token_mean", counts=counts, clip_low=0.2, clip_high=0.28,
                            ref_logp=ref, kl_coef=0.1, kl_estimator="k3", entropy=ent)
    loss.backward()
    return x.grad, stats


def test_changed_feedback_tokens_change_no_gradient_kl_or_entropy():
    g = torch.Generator().manual_seed(0)
    B, T, V = 2, 10, 11
    mask = policy_token_mask([[(2, 5), (7, 9)], [(1, 4), (6, 10)]], T)
    feedback = ~mask
    feedback[:, :1] = False  # the prompt's first position: leave it as it is
    logits = torch.randn(B, T, V, generator=g, dtype=torch.float64)
    tokens = torch.randint(0, V, (B, T), generator=g)
    old = torch.randn(B, T, generator=g, dtype=torch.float64) - 2
    ref = torch.randn(B, T, generator=g, dtype=torch.float64) - 2
    grad, stats = _loss_grad(logits, tokens, mask, old, ref)
    # the feedback tokens (and their logits, old and reference log-probs) are all different
    logits2 = torch.where(feedback.unsqueeze(-1), torch.randn(B, T, V, generator=g, dtype=torch.float64) * 5, logits)
    tokens2 = torch.where(feedback, (tokens + 3) % V, tokens)
    old2 = torch.where(feedback, old - 7, old)
    ref2 = torch.where(feedback, ref + 3, ref)
    grad2, stats2 = _loss_grad(logits2, tokens2, mask, old2, ref2)
    assert torch.equal(grad, grad2)
    assert torch.count_nonzero(grad[feedback]) == 0 and torch.count_nonzero(grad[mask]) > 0
    for k in ("loss", "pg_loss", "kl_loss", "kl_sum", "entropy_sum", "ratio_sum", "tokens"):
        assert torch.equal(stats[k], stats2[k]), k
    # PPO's GAE (verl's observation-span layout): rewards and values on feedback are never read
    r = torch.zeros(B, T, dtype=torch.float64)
    r[0, 8], r[1, 9] = 1.0, -1.0
    v = torch.randn(B, T, generator=g, dtype=torch.float64)
    a, ret = gae_advantages_returns(r, v, mask.double(), 1.0, 0.95)
    a2, ret2 = gae_advantages_returns(torch.where(feedback, 5.0, r), torch.where(feedback, -9.0, v), mask.double(), 1.0, 0.95)
    assert torch.equal(a, a2) and torch.equal(ret, ret2)


# -- the feedback turn in the chat template --------------------------------------------------------
CHATML = ("{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
          "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


@pytest.fixture(scope="module")
def bpe():
    from elastic.data.tokenizer import EOS, train_bpe

    tok = train_bpe(["<|user|>\nfix the test\n<|assistant|>\nint main() { return 0; }\n"] * 20, 300)
    return tok, tok.token_to_id(EOS)


def test_feedback_turn_builtin_matches_what_sft_renders_between_turns(bpe):
    tok, eos = bpe
    fmt = ChatFormat()
    fb = "Verdict: wrong answer on test 01"
    msgs = [{"role": "user", "content": "q"}, {"role": "assistant", "content": "A1"},
            {"role": "user", "content": fb}, {"role": "assistant", "content": "A2"}]
    ids, learned = tokenize_segments(render_segments(msgs, fmt), tok, eos)
    head, _ = tokenize_segments(render_segments(msgs[:2], fmt), tok, eos)
    tail, _ = tokenize_segments([("A2", True)], tok, eos)
    open_turn = feedback_turn_ids(fb, fmt, tok, eos, turn_closed=False)
    assert open_turn[0] == eos
    assert head + open_turn + tail == ids  # SFT's token sequence exactly
    assert feedback_turn_ids(fb, fmt, tok, eos) == open_turn[1:]
    start = len(head) + 1
    assert not any(learned[start:start + len(open_turn) - 1])  # feedback is not learned in SFT either


def test_feedback_turn_chat_template():
    fmt = ChatFormat(chat_template=CHATML, eos_token="<|im_end|>")
    assert feedback_turn_segments("bad", fmt) == [("\n<|im_start|>user\n", False), ("bad", False),
                                                  ("<|im_end|>\n<|im_start|>assistant\n", False)]
    assert "".join(t for t, _ in feedback_turn_segments("bad", fmt, turn_closed=False)) == \
        "<|im_end|>\n<|im_start|>user\nbad<|im_end|>\n<|im_start|>assistant\n"
    kinds = [type(t).__name__ for t, _ in feedback_turn_segments("bad", fmt)]
    assert kinds == ["Markup", "str", "Markup"]  # only the template's text may hold special tokens


# -- config ---------------------------------------------------------------------------------------
def test_turn_settings_validate_in_one_line():
    cfg = load_config(None, [], job="grpo")
    assert (cfg.rl.turns, cfg.rl.turn_reward, cfg.rl.turn_discount, cfg.rl.turn_cost, cfg.rl.feedback,
            cfg.rl.feedback_max_tokens) == (1, "last", 1.0, 0.0, "verdict", 256)
    load_config(None, ["rl.turn_reward=discounted", "rl.turn_discount=0.9", "rl.turn_cost=0.1", "rl.feedback=details"],
                job="grpo")
    for over, key in ((["rl.turns=2", "generation.draft=ngram"], "generation.draft"), (["rl.turns=0"], "rl.turns"),
                      (["rl.turns=2", "generation.weights=int8"], "generation.weights"),
                      (["rl.turn_reward=sum"], "rl.turn_reward"), (["rl.turn_discount=0"], "rl.turn_discount"),
                      (["rl.turn_discount=1.1"], "rl.turn_discount"), (["rl.turn_cost=-1"], "rl.turn_cost"),
                      (["rl.feedback=all"], "rl.feedback"), (["rl.feedback_max_tokens=4"], "rl.feedback_max_tokens")):
        with pytest.raises(ConfigError) as ei:
            load_config(None, over, job="grpo")
        msg = str(ei.value)
        assert "\n" not in msg and msg.startswith(key + ":"), msg
    assert load_config(None, ["rl.turns=3"], job="grpo").rl.turns == 3  # GRPO, colocated: built (tests/test_grpo_turns.py)


# -- bench/multiturn_grpo.py's arithmetic (the runs themselves are minutes: not in CI) -------------
def test_multiturn_bench_interleave_fixed_share_and_token_budget():
    from bench.multiturn_grpo import closest_step, fixed_share, interleave

    mixed = interleave([f"s{i}" for i in range(10)], ["r0", "r1"])
    assert mixed == ["s0", "s1", "s2", "s3", "s4", "r0", "s5", "s6", "s7", "s8", "s9", "r1"]
    assert interleave(["a"], []) == ["a"] and interleave([], ["r"]) == ["r"]
    assert fixed_share(0.25, 0.5) == pytest.approx(1 / 3)  # of the 75% failed at turn 1, 25 points fixed
    assert fixed_share(0.0, 0.0) == 0.0 and fixed_share(1.0, 1.0) is None and fixed_share(None, 0.5) is None
    cum = {1: 100, 2: 210, 3: 290, 4: 420}
    assert closest_step(cum, 300) == 3 and closest_step(cum, 250) == 2 and closest_step(cum, 10_000) == 4


class _CharTok:
    """One id per character (decode drops nothing): the messages can be read off the ids."""

    class _E:
        def __init__(self, t):
            self.ids = [ord(ch) for ch in t]

    def encode_batch(self, texts):
        return [self._E(t) for t in texts]

    def decode(self, ids, skip_special_tokens=True):
        return "".join(chr(i) for i in ids)


class _Service:
    """The reward service's client interface (submit / results) over fixed answers: records what
    each submission asked (its Request), so the test reads what both placements send."""

    def __init__(self, answer):
        self.answer, self.asked, self.done = answer, [], {}

    def submit(self, items, wait=True):
        for key, task, text, request in items:
            self.asked.append((key, task, text, request))
            self.done[key] = self.answer(task, text, request)

    def results(self, keys, timeout_s):
        return {k: self.done[k] for k in keys if k in self.done}


@pytest.mark.parametrize("env", ["", "m:Env"])
def test_turn_scorer_takes_the_pools_message_and_sends_the_request(env):
    """elastic/rl/episodes.py (both placements): each turn is submitted with Request(feedback=
    rl.feedback), or with rl.env the episode's earlier answers; the next user message is the
    pool's Result.feedback, only its tokens capped here; no message ends the episode; an episode
    whose environment did not start (first_messages) gets its reset's Result, never asked."""
    from types import SimpleNamespace

    from elastic.generation.episodes import turn_seed
    from elastic.reward.request import Request
    from elastic.rl.episodes import TurnScorer, first_messages, reset_key

    rl = SimpleNamespace(env=env, feedback="details", feedback_max_tokens=20, max_new_tokens=4)
    long_msg = "x" * 50

    def answer(task, text, request):
        if request.reset:
            return Result(task, "ok", 0.0, feedback="" if task == "broken" else f"go {task}")
        passed = text == "yes"
        return Result(task, "ok" if passed else "wrong_answer", float(passed), feedback=None if passed else long_msg)

    svc, tok, fmt = _Service(answer), _CharTok(), ChatFormat()
    rows = [{"key": f"s:{i}", "problem": p, "seed": i, "prompt": [1, 2]} for i, p in enumerate(("a", "b", "broken"))]
    failed = {}
    if env:
        texts, prompts, failed = first_messages(svc, rows, lambda t: [ord(c) for c in t],
                                                room=100, failure_reward=-1.0)
        assert texts == ["go a", "go b", None] and prompts == [[ord(c) for c in "go a"], [ord(c) for c in "go b"], [1, 2]]
        assert list(failed) == [2] and failed[2].status == "sandbox_error" and failed[2].reward == -1.0
        assert [k for k, *_ in svc.asked] == [reset_key(r["key"]) for r in rows] == ["s:0:reset", "s:1:reset", "s:2:reset"]
        assert first_messages(svc, rows[:1], lambda t: [0] * len(t), room=3, failure_reward=0.0)[2][0].reason.startswith(
            "rl.env reset: the first message of 4 tokens leaves no room")
        svc.asked.clear()
    scorer = TurnScorer(rl, svc, tok, fmt, eos_id=0, rows=rows, failed=failed)
    ans = lambda text, finish="stop": SimpleNamespace(tokens=[ord(c) for c in text], finish_reason=finish)
    out = scorer([(0, 0, ans("no")), (1, 0, ans("yes")), (2, 0, ans("no"))], last=False)
    assert out[1] is None and scorer.turns[1][0]["status"] == "ok"  # passed: no message
    assert (out[2] is None) == bool(env)  # a failed reset's sandbox_error ends the episode
    fb = scorer.turns[0][0]["feedback"]
    assert len(tok.encode_batch([fb])[0].ids) <= rl.feedback_max_tokens < len(long_msg)  # the trainer's token cap
    assert fb.startswith("x") and fb.endswith(MARKER.strip())
    assert out[0] == feedback_turn_ids(fb, fmt, tok, 0, turn_closed=True)
    out = scorer([(0, 1, ans("yes"))], last=True)
    assert out == {0: None} and scorer.turns[0][1]["seed"] == turn_seed(0, 1)
    sent = {k: r for k, _, _, r in svc.asked}
    assert "s:2:t0" not in sent if env else "s:2:t0" in sent
    want = (lambda before: Request(history=before)) if env else (lambda before: Request(feedback="details"))
    assert sent["s:0:t0"] == want(()) and sent["s:0:t1"] == want(("no",)) and sent["s:1:t0"] == want(())
