"""The ``python_tests`` verifier: run a Python program against a task's tests in the sandbox.

Two task forms (:class:`PythonTests`): HumanEval (``test`` defines ``check(candidate)``,
called with the program's ``entry_point`` function) and MBPP (``test_list``: one assert
statement per test, ``test_setup`` run first). The verdict (:func:`evaluate_python`):

* ``ok``: the harness reported every test as run and passed;
* ``syntax_error``: no Python code in the completion, or the program does not compile;
* ``runtime_error``: the program raised while loading (``import`` of a missing module,
  ``sys.exit()``...), or its own code raised in a test (any exception, an ``AssertionError``
  inside the program included), or its process ended or the harness stopped before every test
  reported (``os._exit``, killing the harness, the output cap);
* ``wrong_answer``: a test's assertion failed, the program returned something that is not
  plain builtin data, or the test's own code raised on the returned value (``len(None)``);
* ``timeout``: a test (or loading the program) ran over ``time_limit_s``, or the sandbox's
  wall clock ran out;
* ``memory_limit``: ``MemoryError`` in the program, or its process killed with evidence of
  the memory cgroup's limit;
* ``sandbox_error``: the infrastructure failed (the sandbox did not start, the task's own
  test set-up fails, a test passes a non-data argument); never a verdict on the program.

Tests run in order and stop at the first failure (later ones are ``skipped``). HumanEval's
``check`` is one test named ``check``; its failing assertion's source line is the reason.
MBPP's tests are ``test_0``, ``test_1``...

Protocol (elastic/reward/verifiers/python_tests/harness.py, run as ``python3 -I -S -B harness.py``, stdin a
file holding two length-prefixed marshal records): the harness reads the program, makes
itself non-dumpable, forks; the child loads the program and serves calls; only then does the
parent read the tests and a random per-run nonce, run the tests with the program's functions
replaced by proxies, and write ``@<nonce> S <n>``, ``@<nonce> T <i> <status> <s> <detail>``
per test and ``@<nonce> E <n>`` on the original stdout (``C`` when the program does not
load, ``H`` when the task is broken). A pass needs every one of those lines, consistent;
an exit status is never evidence.

Threat model. The usual reward hacks of RL on code fail by construction:

* the program never runs in the process that runs the tests and writes the report: it is a
  forked child whose stdout is redirected to stderr, forked before the nonce and the tests
  were read (they are not in its memory), and the harness is non-dumpable and the sandbox's
  init (``bwrap --as-pid-1``: no other process of the sandbox holds its stdin or stdout), so
  without capabilities (bubblewrap drops them all) the child can open neither
  /proc/<harness>/mem nor /proc/<harness>/fd; printed "PASSED" lines, ``sys.exit(0)``,
  ``os._exit(0)`` or closing its channel all leave report lines missing, which is a failure;
  signals to the harness never reach it (the kernel drops them for an init without a handler;
  the harness handles SIGALRM, its timer, and SIGINT, which only fail the program itself);
* a function's return value crosses a pipe as marshal data after an exact-type check: only
  None/bool/int/float/complex/str/bytes and list/tuple/set/frozenset/dict of those; an
  object whose ``__eq__`` always returns True is ``wrong_answer`` ("returned a non-builtin
  value"), and the parent checks again what it unmarshals;
* monkeypatching builtins, ``AssertionError``, ``print``, ``sys.modules`` or the test's
  modules (``math.isclose = lambda *a: True``) changes only the child: the tests, their
  imports and the task's prompt helpers (``poly`` of HumanEval/32, ``encode_cyclic`` of /38:
  the prompt's trusted definitions, not the program's) live in the parent.

Batch mode (:func:`evaluate_python_batch`; ``harness.py --batch``). One sandbox and one
interpreter for several programs (of tasks with the same limits but time), run one at a time;
bubblewrap only. The supervisor is the sandbox's init, non-dumpable; stdin holds, per program,
its source, its tests with their nonce, and a key for the supervisor's line about it. For each
program the supervisor reads only the source, forks a runner that does exactly what the
single-program harness does (the runner forks the program's process, then reads that
program's tests from the shared stdin), waits for the runner under the program's own wall
limit, kills every other process of the sandbox and reaps them all, empties the writable
places, removes System V IPC objects, and only then reads the program's key and writes
``@<key> R <i> <exit 0 | exit n | signal n | deadline | unclean> <seconds>``. What program i
can and cannot do to program j:

* it cannot learn j's tests or nonce: when j's runner is forked the supervisor has read
  neither (they stay in the stdin file, which only the non-dumpable supervisor and runners
  hold; the program's process closes its copy before its code runs). It can learn the sources
  of the programs before it in the batch (the supervisor read them and fork copies memory);
* it cannot outlive its turn: every process but init is SIGKILLed and reaped (its orphans
  are init's) before j's source is even read; its files go (/tmp, the working directory,
  /dev/shm: the only writable places, since / and /dev are read-only and /proc/sys is bound
  read-only; POSIX message queues are refused in both modes, RLIMIT_MSGQUEUE 0); if that
  fails the supervisor stops and the rest are evaluated alone;
* it cannot reach the report channel (nor forge j's lines without j's nonce, nor the
  supervisor's line about j without j's key, read after i is gone);
* it can spoil what the batch's outcome says about everyone (the memory cgroup's counters,
  the output cap, the wall clock, a sandbox failure): so a batch verdict is kept only when it
  needs nothing of the outcome: the runner exited 0, and the report is complete and decides
  the verdict by itself (:func:`report_decides`; an ``ok`` also needs the batch under its
  output cap). Any other program of the batch is evaluated alone, with the single-program
  path: program i can cost the others time, never change a verdict.

Each runner gets the program's own RLIMIT_CPU (a fresh process: a fresh count); the other
limits are the sandbox's, as for one program, plus one process (the supervisor). Differences
that remain: a program can tell the two modes apart (its parent is not PID 1; its memory holds
earlier programs' sources) and so choose to behave differently, which only changes its own
verdict; the programs of a batch share one interpreter start, so one string-hash seed (a
program whose result depends on set order is nondeterministic alone too), and find a few
stateless modules already imported (``harness.WARM_MODULES``: typing...); the supervisor's
~10 MB count toward the memory cgroup (a program near it is OOM-killed sooner, then re-run
alone); kernel state outside the writable places that cannot be listed (keyrings, sockets in
TIME_WAIT on loopback) can reach only a later program that uses the same facility.

What remains. The child is the program's: it can answer calls however it likes (e.g. with
answers special-cased to the test inputs it receives), which is the task's weakness, not the
harness's. Arguments are copied, so a test that checks an in-place mutation of its argument
cannot pass. The harness trusts marshal.loads with what the child sends (a memory-corruption
bug there is out of scope). As the sandbox's init the harness reaps only its own child: a
program's orphans stay zombies (counted against the pids limit) until the run ends. Without
ctypes the harness stays dumpable (batch mode then refuses to run), and under the weak
isolation opt-in (no bubblewrap: root keeps CAP_SYS_PTRACE, the stdin file is readable on
the host) a determined program can read the harness's memory, find the nonce and forge the
report: the nonce then only defeats printed fakes and early exits; the sandbox (namespaces,
cgroup, rlimits, clean environment, scratch tmpfs) is what contains the damage.
"""

from __future__ import annotations

import ast
import atexit
import dataclasses
import builtins
import keyword
import logging
import marshal
import os
import re
import secrets
import shutil
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

from elastic.reward.verifiers.programs import classify
from elastic.reward.result import Result, TestResult
from elastic.sandbox.command import Limits, RunOutcome, Sandbox
from elastic.reward.settings import EvalSettings

log = logging.getLogger("elastic.reward")

HARNESS = Path(__file__).with_name("harness.py")
INTERPRETER_FLAGS = ("-I", "-S", "-B")  # isolated (no PYTHON* env, no user site), no site, no .pyc writes
STARTUP_S = 2.0  # wall allowance beyond the tests' own limits: interpreter start, harness, teardown
SANDBOX_PATH = "/usr/local/bin:/usr/bin:/bin"  # the sandbox's PATH (sandbox._clean_env)
# Under bubblewrap: the harness is the PID namespace's init, so nothing in the sandbox but it
# holds stdin (the tests, the nonce) and the report channel (bwrap's own init did, dumpable:
# a program read the nonce from /proc/1/fd/0 and wrote a pass to /proc/1/fd/1); only /tmp,
# the working directory and /dev/shm are writable (/proc/sys was, with the host's uid 0).
SANDBOX_LAYOUT = {"as_pid_1": True, "readonly_root": True}


@dataclass
class PythonTests:
    """A task's tests (a plain picklable value)."""

    entry_point: str = ""  # HumanEval: the function passed to check(candidate); MBPP: optional
    test: str = ""  # HumanEval: source defining check(candidate) (and maybe METADATA, imports)
    test_list: List[str] = field(default_factory=list)  # MBPP: one assert statement per test
    test_setup: str = ""  # MBPP test_setup_code, run before the tests
    prompt: str = ""  # HumanEval prompt (signature + docstring), used when the completion is only a body
    time_limit_s: float = 3.0  # per test (HumanEval: the whole check), and for loading the program
    memory_mb: int = 512

    @classmethod
    def from_humaneval(cls, record: Dict, **kw) -> "PythonTests":
        """From a HumanEval record (``prompt``, ``test``, ``entry_point``)."""
        return cls(entry_point=record["entry_point"], test=record["test"], prompt=record.get("prompt", ""), **kw)

    @classmethod
    def from_mbpp(cls, record: Dict, **kw) -> "PythonTests":
        """From an MBPP record (``test_list``, ``test_setup_code``; ``entry_point`` if present)."""
        return cls(entry_point=record.get("entry_point", ""), test_list=list(record["test_list"]),
                   test_setup=record.get("test_setup_code", "") or "", **kw)


def _parse(src: str, what: str, where: str) -> ast.Module:
    try:
        return ast.parse(src)
    except (SyntaxError, ValueError) as e:
        msg = e.msg if isinstance(e, SyntaxError) else str(e)
        line = f" (line {e.lineno})" if isinstance(e, SyntaxError) and e.lineno else ""
        raise ValueError(f"{where}: python_tests.{what} does not parse: {msg}{line}") from None


def check_tests(spec: PythonTests, where: str) -> None:
    """Raise a one-line ValueError naming `where` and the field when `spec` is unusable."""
    if not isinstance(spec, PythonTests):
        raise ValueError(f"{where}: python_tests must be a PythonTests, got {type(spec).__name__}")
    if not spec.test.strip() and not spec.test_list:
        raise ValueError(f"{where}: python_tests has no tests (neither test nor test_list)")
    if spec.test.strip() and spec.test_list:
        raise ValueError(f"{where}: python_tests has both test (HumanEval form) and test_list (MBPP form)")
    if spec.entry_point and (not spec.entry_point.isidentifier() or keyword.iskeyword(spec.entry_point)):
        raise ValueError(f"{where}: python_tests.entry_point {spec.entry_point!r} is not a Python identifier")
    if spec.test.strip():
        if not spec.entry_point:
            raise ValueError(f"{where}: python_tests.entry_point is required with test (HumanEval form)")
        tree = _parse(spec.test, "test", where)
        if not any(isinstance(n, ast.FunctionDef) and n.name == "check" for n in tree.body):
            raise ValueError(f"{where}: python_tests.test defines no top-level check(candidate)")
    for i, t in enumerate(spec.test_list):
        if not isinstance(t, str) or not t.strip():
            raise ValueError(f"{where}: python_tests.test_list[{i}] is empty")
        tree = _parse(t, f"test_list[{i}]", where)
        if not any(isinstance(n, ast.Assert) for n in ast.walk(tree)):
            raise ValueError(f"{where}: python_tests.test_list[{i}] has no assert statement")
    if spec.test_setup.strip():
        _parse(spec.test_setup, "test_setup", where)
    if not spec.time_limit_s > 0:
        raise ValueError(f"{where}: python_tests.time_limit_s must be > 0, got {spec.time_limit_s}")
    if spec.memory_mb < 32:
        raise ValueError(f"{where}: python_tests.memory_mb must be >= 32, got {spec.memory_mb}")


# -- program extraction ----------------------------------------------------------------------
_FENCE = re.compile(r"^[ \t]*(```+|~~~+)[ \t]*([A-Za-z0-9_+#.-]*)[^\n]*\n(.*?)^[ \t]*\1[ \t]*$", re.S | re.M)
_OPEN_FENCE = re.compile(r"^[ \t]*(```+|~~~+)[ \t]*([A-Za-z0-9_+#.-]*)[^\n]*\n", re.M)
_PY_TAGS = {"", "python", "py", "python3", "py3"}


def _defines(program: str, name: str) -> bool:
    """Whether `program` binds `name` at top level (def, async def, class, assignment). A regex,
    so the parent never parses untrusted code."""
    n = re.escape(name)
    return re.search(rf"^(?:(?:async[ \t]+)?def|class)[ \t]+{n}\b|^{n}[ \t]*(?::[^=\n]*)?=(?!=)", program, re.M) is not None


def extract_program(completion: str, spec: PythonTests) -> Optional[str]:
    """The program to run: the last ```python / ```py / untagged fenced block, else the raw
    completion (an unclosed last fence, as when generation stopped at the token limit, counts
    as a block to the end). With a HumanEval prompt: a body only (the entry point not defined
    at top level) is appended to the prompt; a full program gets the prompt first (its
    imports and helpers; its own definitions override the prompt's stub). None when nothing
    usable remains (empty, or only blocks tagged with another language)."""
    blocks = [(m.group(2).lower(), m.group(3)) for m in _FENCE.finditer(completion)]
    py = [body for tag, body in blocks if tag in _PY_TAGS and body.strip()]
    if py:
        program = py[-1]
    elif blocks:
        return None  # fenced code, none of it Python
    else:
        opened = list(_OPEN_FENCE.finditer(completion))
        if opened:
            if opened[-1].group(2).lower() not in _PY_TAGS:
                return None
            program = completion[opened[-1].end():]
        else:
            program = completion
    if not program.strip():
        return None
    prompt = spec.prompt
    if not prompt.strip() or not spec.entry_point:
        return program
    if program.lstrip().startswith(prompt.strip()):
        return program
    if _defines(program, spec.entry_point):
        return prompt.rstrip("\n") + "\n\n\n" + program
    if not _defines(prompt, spec.entry_point):
        return program
    sep = "" if prompt.endswith("\n") or program.startswith("\n") else "\n"
    return prompt + sep + program


# -- the plan the harness gets (derived from the trusted tests; cached) ---------------------------
@dataclass(frozen=True)
class _Plan:
    form: str  # humaneval | mbpp
    names: Tuple[str, ...]  # test names
    proxies: Tuple[str, ...]  # names bound to the program's functions in the tests' namespace
    helpers: Tuple[str, ...]  # names bound to the prompt's (trusted) definitions


_PLANS: Dict[tuple, _Plan] = {}
_BUILTIN_NAMES = frozenset(dir(builtins))


def _loaded_names(tree: ast.AST) -> set:
    return {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)}


def _bound_at_top(tree: ast.Module) -> set:
    out = set()
    for n in tree.body:
        if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            out.add(n.name)
        elif isinstance(n, (ast.Import, ast.ImportFrom)):
            out |= {(a.asname or a.name).split(".")[0] for a in n.names}
        elif isinstance(n, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
            targets = n.targets if isinstance(n, ast.Assign) else [n.target]
            for t in targets:
                out |= {x.id for x in ast.walk(t) if isinstance(x, ast.Name)}
    return out


def plan(spec: PythonTests, where: str = "task") -> _Plan:
    """What the harness binds for `spec`'s tests (checked first: ValueError naming `where`)."""
    key = (spec.entry_point, spec.test, tuple(spec.test_list), spec.test_setup, spec.prompt)
    p = _PLANS.get(key)
    if p is not None:
        return p
    check_tests(spec, where)
    ep = spec.entry_point
    if spec.test.strip():
        form, names = "humaneval", ("check",)
        referenced = _loaded_names(ast.parse(spec.test))
        proxies = (ep,)
    else:
        form, names = "mbpp", tuple(f"test_{i}" for i in range(len(spec.test_list)))
        setup = _bound_at_top(ast.parse(spec.test_setup)) if spec.test_setup.strip() else set()
        trees = [ast.parse(t) for t in spec.test_list]
        referenced = set().union(*(_loaded_names(t) for t in trees))
        called = {n.func.id for t in trees for n in ast.walk(t) if isinstance(n, ast.Call) and isinstance(n.func, ast.Name)}
        proxies = tuple(sorted({c for c in called if c not in setup and (c not in _BUILTIN_NAMES or c == ep)}
                               | ({ep} if ep else set())))
    helpers: Tuple[str, ...] = ()
    if spec.prompt.strip():
        try:
            defined = {n.name for n in ast.parse(spec.prompt).body
                       if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))}
        except (SyntaxError, ValueError):
            defined = set()
        helpers = tuple(sorted((defined & referenced) - set(proxies) - {ep}))
    p = _Plan(form, names, proxies, helpers)
    if len(_PLANS) > 4096:
        _PLANS.clear()
    _PLANS[key] = p
    return p


# -- running -----------------------------------------------------------------------------------
_PRIVATE_DIRS: Dict[Tuple[str, str], str] = {}


def _private_dir(kind: str, scratch_root: Optional[str]) -> str:
    """A directory of this process, removed at exit; named like the launcher's builds, so a
    killed process's leftovers are swept with them (launcher._sweep_dead_builds)."""
    root = scratch_root or tempfile.gettempdir()
    key = (kind, root)
    if key not in _PRIVATE_DIRS or not os.path.isdir(_PRIVATE_DIRS[key]):
        d = tempfile.mkdtemp(prefix=f"elastic-launcher-{os.getpid()}-{kind}-", dir=root)  # 0700
        atexit.register(shutil.rmtree, d, True)
        _PRIVATE_DIRS[key] = d
    return _PRIVATE_DIRS[key]


def harness_path(scratch_root: Optional[str] = None) -> str:
    """This process's read-only copy of the harness; its directory (nothing else in it) is
    what the sandbox sees of the host besides /usr."""
    d = _private_dir("pyharness", scratch_root)
    dst = os.path.join(d, "harness.py")
    if not os.path.isfile(dst):
        shutil.copyfile(HARNESS, dst)
        os.chmod(dst, 0o444)
        os.chmod(d, 0o755)  # readable where the sandbox is not root
    return dst


class _StdinFile:
    """A private (0600) file for one run's stdin (program, tests, nonce), in a 0700 directory
    that is never exposed to a sandbox; removed on close (whatever removed it first)."""

    def __init__(self, scratch_root: Optional[str]) -> None:
        fd, self.name = tempfile.mkstemp(prefix="in-", dir=_private_dir("pyin", scratch_root))
        self.f = os.fdopen(fd, "wb")

    def write(self, data: bytes) -> None:
        self.f.write(data)
        self.f.flush()

    def close(self) -> None:
        self.f.close()
        try:
            os.unlink(self.name)
        except FileNotFoundError:  # at exit, the directory may have gone first
            pass

    def __enter__(self) -> "_StdinFile":
        return self

    def __exit__(self, *exc) -> None:
        self.close()



def _record(obj) -> bytes:
    data = marshal.dumps(obj, 4)
    return len(data).to_bytes(4, "big") + data


def _tests_record(spec: PythonTests, p: _Plan, nonce: str) -> bytes:
    return _record({"nonce": nonce, "time_limit": float(spec.time_limit_s), "form": p.form, "entry": spec.entry_point,
                    "test": spec.test, "tests": list(spec.test_list), "setup": spec.test_setup, "prompt": spec.prompt,
                    "proxies": list(p.proxies), "helpers": list(p.helpers)})


def harness_input(program: str, spec: PythonTests, p: _Plan, nonce: str) -> bytes:
    """The harness's stdin: the program (read before it forks), then the tests and the nonce."""
    return _record(program) + _tests_record(spec, p, nonce)


def run_limits(spec: PythonTests, n_tests: int) -> Limits:
    wall = STARTUP_S + spec.time_limit_s * (n_tests + 1)
    return Limits(wall_s=wall, cpu_s=wall, memory_mb=spec.memory_mb, pids=64, nofile=64, fsize_mb=16,
                  stdout_bytes=1 << 20, stderr_keep_bytes=4 << 10, stderr_max_bytes=1 << 20, scratch_mb=64)


def _interpreter_argv(settings: EvalSettings) -> List[str]:
    return [settings.python_executable, *INTERPRETER_FLAGS, "harness.py"]


_AHEAD_LOCK = threading.Lock()


class _HarnessRun:
    """One harness run under bubblewrap, launched (cgroup, rlimits) and set up (namespaces,
    mounts; ``setup_ahead``) before its program and tests exist: its stdin is an empty private
    file, already open in the sandbox, filled just before the run is released.

    The sandbox keeps one for the next evaluation (``Sandbox._python_ahead``), prepared while
    the current one runs, so bubblewrap's set-up is off the next evaluation's critical path
    (what the C path gets from RunQueue and the spare launcher). It is used only when the next
    evaluation asks for the same command and limits, else cancelled (its program never runs).

    It is used only by the thread that prepared it: bubblewrap's ``--die-with-parent`` is
    PR_SET_PDEATHSIG, which fires when the *thread* that spawned it exits, so a run prepared
    by a thread that has gone (a finished thread pool's) is dead, and one taken over by another
    thread could be killed mid-run when its creator exits."""

    def __init__(self, sandbox: Sandbox, argv: List[str], limits: Limits, harness: str) -> None:
        self.key = (tuple(argv), dataclasses.astuple(limits))
        self.thread = threading.current_thread()
        self.stdin = _StdinFile(sandbox.scratch_root)
        try:
            self.run = sandbox.prepare(argv, Path(harness).parent, limits, stdin_path=Path(self.stdin.name),
                                       tmpfs_workdir=True, files={"harness.py": Path(harness)}, setup_ahead=True,
                                       **SANDBOX_LAYOUT)
        except BaseException:
            self.stdin.close()
            raise

    def release(self, payload: bytes) -> None:
        self.stdin.write(payload)
        self.run.release()

    def finish(self) -> RunOutcome:
        try:
            return self.run.finish()
        finally:
            self.stdin.close()

    def cancel(self) -> None:
        try:
            self.run.cancel()
        finally:
            self.stdin.close()

    def usable(self, key: tuple) -> bool:
        """Same command and limits, prepared by this thread, and its wrapper still alive."""
        proc = self.run.proc
        return (self.key == key and self.thread is threading.current_thread() and proc is not None
                and proc.poll() is None and not self.run.out.sandbox_failed)


def run_harness(sandbox: Sandbox, program: str, spec: PythonTests, settings: EvalSettings,
                p: Optional[_Plan] = None) -> Tuple[RunOutcome, str, _Plan, Limits]:
    """Run the harness on `program` in the sandbox: (outcome, nonce, plan, limits).

    Under bubblewrap: on the run the previous evaluation set up (when it matches), and the next
    evaluation's run is set up while this one runs. One evaluation at a time per sandbox (as
    for the rest of Sandbox)."""
    p = p or plan(spec)
    nonce = secrets.token_hex(16)
    limits = run_limits(spec, len(p.names))
    harness = harness_path(sandbox.scratch_root)
    argv = _interpreter_argv(settings)
    payload = harness_input(program, spec, p, nonce)
    if sandbox.iso.wrapper != "bwrap":  # weak isolation: a host scratch dir is the working directory
        with _StdinFile(sandbox.scratch_root) as stdin, \
                sandbox.scratch() as d:
            stdin.write(payload)
            shutil.copyfile(harness, d / "harness.py")
            return sandbox.run(argv, d, limits, stdin_path=Path(stdin.name)), nonce, p, limits
    for attempt in range(2):
        with _AHEAD_LOCK:
            run, sandbox._python_ahead = sandbox._python_ahead, None
        if run is not None and (attempt or not run.usable((tuple(argv), dataclasses.astuple(limits)))):
            run.cancel()
            run = None
        ahead = run is not None
        if run is None:
            run = _HarnessRun(sandbox, argv, limits, harness)
        try:
            run.release(payload)
        except BaseException:
            run.cancel()
            raise
        try:  # the next evaluation's run: launched and set up while this one runs
            nxt: Optional[_HarnessRun] = _HarnessRun(sandbox, argv, limits, harness)
            with _AHEAD_LOCK:
                nxt, sandbox._python_ahead = sandbox._python_ahead, nxt
            if nxt is not None:  # another thread's (a sandbox is meant for one at a time)
                nxt.cancel()
        except Exception as e:  # only a lost optimisation
            log.warning("python_tests: could not prepare the next sandbox ahead: %s", e)
        o = run.finish()
        if not (o.sandbox_failed and ahead):  # a run set up ahead that died meanwhile: once more, fresh
            break
    return o, nonce, p, limits


@dataclass
class Report:
    """The harness's report lines of one run (only those carrying the run's nonce)."""

    started: Optional[int] = None
    ended: Optional[int] = None
    load: Optional[Tuple[str, str]] = None  # (status, detail) when the program did not load
    broken: Optional[str] = None  # the task itself failed
    tests: Dict[int, Tuple[str, float, str]] = field(default_factory=dict)
    inconsistent: str = ""


def parse_report(stdout: bytes, nonce: str) -> Report:
    r = Report()
    tag = f"@{nonce} "
    for raw in stdout.decode("utf-8", "replace").splitlines():
        if not raw.startswith(tag):
            continue  # not the harness's (no nonce): ignored, never evidence
        kind, _, rest = raw[len(tag):].partition(" ")
        try:
            if kind == "S" and r.started is None:
                r.started = int(rest)
            elif kind == "E" and r.ended is None:
                r.ended = int(rest)
            elif kind == "C" and r.load is None:
                status, _, detail = rest.partition(" ")
                r.load = (status, detail)
            elif kind == "H" and r.broken is None:
                r.broken = rest
            elif kind == "T":
                i, status, wall, detail = (rest.split(" ", 3) + [""])[:4]
                if int(i) in r.tests:
                    r.inconsistent = f"test {i} reported twice"
                r.tests[int(i)] = (status, float(wall), detail)
            else:
                r.inconsistent = f"unexpected report line {kind!r}"
        except ValueError:
            r.inconsistent = f"malformed report line {kind!r}"
    return r


_LOAD_STATUSES = {"syntax_error", "runtime_error", "memory_limit", "timeout"}
_TEST_STATUSES = {"ok", "wrong_answer", "runtime_error", "memory_limit", "timeout"}


def _died(o: RunOutcome, limits: Limits, detail: str) -> Tuple[str, str]:
    """The program's process ended on its own or was killed: memory evidence or not."""
    if o.cgroup.oom_kills > 0 or o.cgroup.memory_limit_hit:
        return "memory_limit", f"memory limit {limits.memory_mb} MB exceeded ({detail})"
    return "runtime_error", detail


def judge(task_id: str, o: RunOutcome, report: Report, p: _Plan, limits: Limits, settings: EvalSettings) -> Result:
    """The verdict from the report, with the raw outcome only to explain a missing report."""
    fail = settings.failure_reward

    def failed(status: str, reason: str, tests: Optional[List[TestResult]] = None) -> Result:
        return Result(task_id, status, fail, reason=reason, tests=tests or [], language="python")

    if o.sandbox_failed:
        return failed("sandbox_error", o.sandbox_error)
    if report.broken is not None:
        return failed("sandbox_error", f"broken task: {report.broken}")
    if report.load is not None:
        status, detail = report.load
        if status == "died":
            status, detail = _died(o, limits, detail)
        elif status not in _LOAD_STATUSES:
            status = "runtime_error"
        return failed(status, detail)
    tests: List[TestResult] = []
    verdict: Optional[Tuple[str, str]] = None
    for i, name in enumerate(p.names):
        if verdict is not None:
            tests.append(TestResult(name, "skipped"))
            continue
        got = report.tests.get(i)
        if got is None:  # the harness never reported this test: why, from the outcome
            status, detail = classify(o, limits)
            if status == "ok" or status == "sandbox_error":
                status = "runtime_error"
                code = f"signal {o.signal}" if o.signal is not None else f"exit code {o.exit_code}"
                detail = f"the harness stopped before reporting this test ({code})"
            elif status == "timeout":
                detail = f"the sandbox's wall clock ran out ({limits.wall_s:g}s)"
            tests.append(TestResult(name, status, 0.0, detail))
            verdict = (status, f"{name}: {detail}")
            continue
        status, wall, detail = got
        if status == "died":
            status, detail = _died(o, limits, detail)
        elif status not in _TEST_STATUSES:
            status, detail = "runtime_error", f"unknown test status {status!r}"
        tests.append(TestResult(name, status, wall, detail))
        if status != "ok":
            verdict = (status, f"{name}: {detail}")
    if verdict is not None:
        return failed(verdict[0], verdict[1], tests)
    n = len(p.names)
    # Every test reported ok: also the bookends, and nothing beyond them.
    problem = ""
    if report.inconsistent:
        problem = report.inconsistent
    elif report.started != n or report.ended != n:
        problem = f"the harness reported {report.started}/{report.ended} tests, expected {n}"
    elif set(report.tests) != set(range(n)):
        problem = "the harness reported tests that do not exist"
    elif o.timed_out or o.output_limit:
        problem = classify(o, limits)[1]
    if problem:
        status = "timeout" if o.timed_out else "runtime_error"
        return failed(status, problem, tests)
    return Result(task_id, "ok", 1.0, tests=tests, language="python")


def evaluate_python(task_id: str, spec: PythonTests, completion: str, settings: Optional[EvalSettings] = None,
                    sandbox: Optional[Sandbox] = None) -> Result:
    """Extract the program from `completion`, run `spec`'s tests on it in the sandbox, judge.

    Never raises for a program or a task: a malformed task or an infrastructure failure is
    ``sandbox_error`` (a SandboxUnavailable from creating the default sandbox does raise)."""
    from elastic.reward.verifiers.programs import default_sandbox

    settings = settings or EvalSettings()
    sandbox = sandbox or default_sandbox(settings.env_allow, settings.allow_weak_isolation)
    t0 = time.perf_counter()
    try:
        p = plan(spec, task_id)
        program = extract_program(completion, spec)
        if program is None:
            r = Result(task_id, "syntax_error", settings.failure_reward, reason="no Python code found",
                       language="python")
        else:
            o, nonce, p, limits = run_harness(sandbox, program, spec, settings, p)
            r = judge(task_id, o, parse_report(o.stdout, nonce), p, limits, settings)
    except ValueError as e:  # check_tests: the task, not the program
        r = Result(task_id, "sandbox_error", settings.failure_reward, reason=f"broken task: {e}", language="python")
    except Exception as e:  # infrastructure bug: never a verdict on the program
        log.exception("python_tests evaluation of %s crashed", task_id)
        r = Result(task_id, "sandbox_error", settings.failure_reward, reason=f"{type(e).__name__}: {e}",
                   language="python")
    r.duration_s = time.perf_counter() - t0
    r.sandbox = sandbox.layers
    return r


# -- batch mode ------------------------------------------------------------------------------------
BATCH_MAX = 64  # programs in one sandbox at most (callers send fewer: reward.batch_size)
_CLEAN = RunOutcome(exit_code=0)  # what judge sees of a batch for a program its report decides alone


@dataclass
class _Entry:
    """One program of a batch."""

    index: int  # in the caller's items
    task_id: str
    spec: PythonTests
    program: str
    plan: _Plan
    limits: Limits  # as when run alone
    nonce: str = ""
    key: str = ""  # tags the supervisor's line about this program


def _confinement(limits: Limits) -> tuple:
    """What the programs of one batch must share: every limit but the wall clock and CPU time
    (memory, processes, files... are the sandbox's, set once for the batch)."""
    return dataclasses.astuple(dataclasses.replace(limits, wall_s=0.0, cpu_s=None))


def batch_limits(per: List[Limits]) -> Limits:
    """The sandbox's limits for programs run one after another: the sum of their wall (and CPU)
    budgets; everything else as for one of them, plus one process (the supervisor)."""
    wall = sum(l.wall_s for l in per)
    return dataclasses.replace(per[0], wall_s=wall, cpu_s=wall, pids=per[0].pids + 1)


def batch_input(entries: List[_Entry]) -> bytes:
    """The ``harness.py --batch`` stdin: a count, then per program (source, wall, RLIMIT_CPU as a
    run alone gets it, length of the tests' record), the tests with their nonce (today's second
    record), and the key of the supervisor's line about it."""
    out = _record(len(entries))
    for e in entries:
        tests = _tests_record(e.spec, e.plan, e.nonce)
        cpu = e.limits.cpu_limit  # Sandbox._rlimits: (cpu_limit, cpu_limit + 1)
        out += _record((e.program, float(e.limits.wall_s), cpu, cpu + 1, len(tests) - 4)) + tests + _record(e.key)
    return out


def runner_status(stdout: bytes, key: str, index: int) -> Tuple[str, float]:
    """The supervisor's line about program `index` (tagged with its key): ("exit 0", runner
    seconds)...; ("", 0) unless there is exactly one, well formed."""
    tag = f"@{key} "
    got = [l[len(tag):] for l in stdout.decode("utf-8", "replace").splitlines() if l.startswith(tag)]
    f = got[0].split() if len(got) == 1 else []
    if len(f) != 5 or f[0] != "R" or f[1] != str(index):
        return "", 0.0
    try:
        return f"{f[2]} {f[3]}", float(f[4])
    except ValueError:
        return "", 0.0


def report_decides(report: Report, p: _Plan) -> bool:
    """Whether :func:`judge`'s verdict on `report` comes from the report alone, never from the
    run's outcome (its exit, wall clock, output caps, cgroup counters), which in a batch are
    every program's together. Mirrors judge's order."""
    if report.broken is not None:
        return True
    if report.load is not None:
        return report.load[0] != "died"
    for i in range(len(p.names)):
        got = report.tests.get(i)
        if got is None or got[0] == "died":
            return False
        if got[0] != "ok":
            return True
    n = len(p.names)
    return (not report.inconsistent and report.started == n and report.ended == n
            and set(report.tests) == set(range(n)))


def _run_batch(entries: List[_Entry], settings: EvalSettings, sandbox: Sandbox,
               results: List[Optional[Result]]) -> None:
    """Run `entries` in one sandbox; fill `results` for the programs whose batch verdict is
    their own (the rest stay None: they are evaluated alone)."""
    t0 = time.perf_counter()
    for e in entries:
        e.nonce, e.key = secrets.token_hex(16), secrets.token_hex(16)
    limits = batch_limits([e.limits for e in entries])
    harness = harness_path(sandbox.scratch_root)
    try:
        with _StdinFile(sandbox.scratch_root) as stdin:
            stdin.write(batch_input(entries))
            o = sandbox.run([*_interpreter_argv(settings), "--batch"], Path(harness).parent, limits,
                            stdin_path=Path(stdin.name), tmpfs_workdir=True, files={"harness.py": Path(harness)},
                            **SANDBOX_LAYOUT)
    except Exception:  # infrastructure: the programs are evaluated alone
        log.exception("python_tests: a batch of %d programs crashed; evaluating them alone", len(entries))
        return
    if o.sandbox_failed:
        return
    share = (time.perf_counter() - t0) / len(entries)
    reported = 0
    for i, e in enumerate(entries):
        status, _ = runner_status(o.stdout, e.key, i)
        reported += bool(status)
        if status != "exit 0":  # the runner was killed, hit its deadline, or the sandbox stopped first
            continue
        report = parse_report(o.stdout, e.nonce)
        if not report_decides(report, e.plan):  # the verdict would need the batch's outcome
            continue
        r = judge(e.task_id, _CLEAN, report, e.plan, e.limits, settings)
        if r.status == "ok" and o.output_limit:  # alone, the output cap could have been this program's
            continue
        r.duration_s = share
        r.sandbox = sandbox.layers
        results[e.index] = r
    if not reported:
        log.warning("python_tests: the batch harness reported nothing (%s); evaluating %d programs alone: %s",
                    classify(o, limits)[1] or "exit code %s" % o.exit_code, len(entries),
                    o.stderr.decode(errors="replace").strip()[-300:])


def evaluate_python_batch(items: Sequence[Tuple[str, PythonTests, str]], settings: Optional[EvalSettings] = None,
                          sandbox: Optional[Sandbox] = None) -> List[Result]:
    """:func:`evaluate_python` of each ``(task_id, spec, completion)``, in order, with the
    programs run together in one sandbox and one interpreter (``harness.py --batch``).

    A batch verdict is kept only when it is the program's own: its runner exited normally,
    its report is complete and decides the verdict by itself, and the sandbox did not fail
    (an ``ok`` also needs the batch under its output cap). Every other program (and one with
    no code, a broken task, or programs under weak isolation) gets :func:`evaluate_python`
    alone, so the verdicts are those of the single-program path."""
    from elastic.reward.verifiers.programs import default_sandbox

    settings = settings or EvalSettings()
    sandbox = sandbox or default_sandbox(settings.env_allow, settings.allow_weak_isolation)
    results: List[Optional[Result]] = [None] * len(items)
    groups: Dict[tuple, List[_Entry]] = {}
    for k, (task_id, spec, completion) in enumerate(items):
        try:
            p = plan(spec, task_id)
            program = extract_program(completion, spec)
        except Exception:  # a broken task: evaluate_python says so
            continue
        if program is not None:
            lim = run_limits(spec, len(p.names))
            groups.setdefault(_confinement(lim), []).append(_Entry(k, task_id, spec, program, p, lim))
    if sandbox.iso.wrapper == "bwrap":  # the supervisor needs a PID namespace of its own and bwrap's layout
        for group in groups.values():
            for start in range(0, len(group), BATCH_MAX):
                chunk = group[start:start + BATCH_MAX]
                if len(chunk) > 1:
                    _run_batch(chunk, settings, sandbox, results)
    for k, (task_id, spec, completion) in enumerate(items):
        if results[k] is None:
            results[k] = evaluate_python(task_id, spec, completion, settings, sandbox)
    return results  # type: ignore[return-value]


def unsandboxed_argv(settings: EvalSettings) -> List[str]:
    """The same interpreter and flags as in the sandbox, resolved on the sandbox's PATH (bench)."""
    exe = shutil.which(settings.python_executable, path=SANDBOX_PATH) or settings.python_executable
    return [exe, *INTERPRETER_FLAGS, str(HARNESS)]


__all__ = ["PythonTests", "check_tests", "evaluate_python", "evaluate_python_batch", "extract_program", "parse_report",
           "judge", "plan", "harness_input", "batch_input", "unsandboxed_argv"]
