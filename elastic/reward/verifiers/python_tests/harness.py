"""The trusted test harness of ``python_tests``, run in the sandbox as ``python3 -I -S -B harness.py``.

Self-contained (standard library only, nothing of ``elastic``): elastic/reward/verifiers/python_tests/verifier.py
copies this file into a private directory and exposes it to the sandbox read-only. The
protocol and the threat model are described there; in short:

* stdin holds two length-prefixed marshal records. The first, the program's source, is read
  before the harness forks; the second (the tests and the run's nonce) only after, so the
  process that runs the program never has them in its memory;
* the harness makes itself non-dumpable (so, with no capabilities, the program's process can
  neither read its memory nor open its file descriptors through /proc), then forks. The child
  closes stdin, points its stdout at stderr (so it holds no descriptor of the report channel),
  loads the program and serves calls: ``(name, args, kwargs)`` in, ``("ok", value)`` out,
  where `value` must be plain builtin data (checked, then marshalled);
* the parent, which never runs a line of the program, runs the tests, the program's
  functions replaced by proxies that call into the child, each test under a SIGALRM timer,
  and writes ``@<nonce> ...`` lines on the original stdout: ``S <n>`` (program loaded, n
  tests), ``T <i> <status> <seconds> <detail>`` per test, ``E <n>`` at the end; or
  ``C <status> <detail>`` (the program did not load) or ``H <detail>`` (the task itself is
  broken). It stops at the first failing test.

``--batch`` (bubblewrap only): the supervisor of several programs in one sandbox, one at a
time (:func:`batch`): it must be the PID namespace's init, non-dumpable, with only the working
directory, /tmp and /dev/shm writable, else it runs nothing. Per program it reads the source
only, forks a runner that does exactly the above (:func:`run_one`), waits for it under the
program's wall limit, kills and reaps every other process, empties the writable places and
removes System V IPC objects, and only then reads the key of its own line about the program.
"""

import builtins
import marshal
import os
import sys
import time

try:
    import _signal as signal  # the C module: `signal` would import enum (start-up time)
except ImportError:  # pragma: no cover
    import signal

MAX_MESSAGE = 64 << 20
DETAIL = 300
_SCALARS = frozenset(map(id, (type(None), bool, int, float, complex, str, bytes)))
_CONTAINERS = frozenset(map(id, (list, tuple, set, frozenset, dict)))


class Closed(Exception):
    """End of file on a channel (the other side closed it or is gone)."""


def read_exact(fd, n):
    buf = bytearray()
    while len(buf) < n:
        chunk = os.read(fd, min(n - len(buf), 1 << 20))
        if not chunk:
            raise Closed()
        buf += chunk
    return bytes(buf)


def recv(fd):
    n = int.from_bytes(read_exact(fd, 4), "big")
    if n > MAX_MESSAGE:
        raise ValueError("message too large")
    return marshal.loads(read_exact(fd, n))


def write_all(fd, data):
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


def send_bytes(fd, data):
    write_all(fd, len(data).to_bytes(4, "big") + data)


def send(fd, obj):
    send_bytes(fd, marshal.dumps(obj, 4))


def non_builtin(value):
    """None if `value` is plain builtin data (exact types, recursively), else the offending type.

    Types are compared by identity: ``in`` on a tuple of types would call a metaclass's __eq__."""
    stack, seen = [value], set()
    while stack:
        x = stack.pop()
        t = type(x)
        if id(t) in _SCALARS:
            continue
        if id(t) not in _CONTAINERS:
            return t
        if id(x) in seen:
            continue
        seen.add(id(x))
        if t is dict:
            stack.extend(dict.keys(x))
            stack.extend(dict.values(x))
        else:
            stack.extend(x)
    return None


def short(text, n=DETAIL):
    text = " ".join(str(text).split())
    return text if len(text) <= n else text[: n - 3] + "..."


def type_name(t):
    try:
        name = type.__dict__["__name__"].__get__(t)
    except BaseException:
        return "?"
    return short(name, 80)


def describe(e):
    """`Type: message` of an exception raised by the program (in its own process)."""
    name = type_name(type(e))
    try:
        msg = short(str(e)) if type(e).__module__ == "builtins" else ""
    except BaseException:
        msg = ""
    return f"{name}: {msg}" if msg else name


# -- the program's process -----------------------------------------------------------------
def child(source, req_r, resp_w):
    os.dup2(2, 1)  # the program's prints go to stderr (capped); it holds nothing of the report channel
    os.close(0)
    os.open(os.devnull, os.O_RDONLY)  # fd 0
    ns = {"__name__": "__candidate__", "__builtins__": builtins}
    try:
        code = compile(source, "<program>", "exec")
    except SyntaxError as e:
        send(resp_w, ("load", "syntax_error", short(f"{type(e).__name__}: {e.msg} (line {e.lineno})")))
        os._exit(0)
    except (ValueError, RecursionError) as e:  # null bytes; nesting too deep for the compiler
        send(resp_w, ("load", "syntax_error", short(f"{type(e).__name__}: {e}")))
        os._exit(0)
    except MemoryError:
        send(resp_w, ("load", "memory_limit", "MemoryError while compiling"))
        os._exit(0)
    del source
    try:
        exec(code, ns)
    except MemoryError:
        send(resp_w, ("load", "memory_limit", "MemoryError while loading the program"))
        os._exit(0)
    except SystemExit as e:
        send(resp_w, ("load", "runtime_error", short(f"SystemExit({e.code!r}) while loading the program")))
        os._exit(0)
    except BaseException as e:
        send(resp_w, ("load", "runtime_error", describe(e) + " while loading the program"))
        os._exit(0)
    send(resp_w, ("ready",))
    while True:
        try:
            name, args, kwargs = recv(req_r)
        except BaseException:
            os._exit(0)
        try:
            if name not in ns:
                raise NameError(f"name {name!r} is not defined")
            value = ns[name](*args, **kwargs)
        except MemoryError:
            send(resp_w, ("exc", "MemoryError", ""))
            continue
        except BaseException as e:
            send(resp_w, ("exc", type_name(type(e)), describe(e)))
            continue
        bad = non_builtin(value)
        if bad is not None:
            send(resp_w, ("nonbuiltin", f"returned a non-builtin value ({type_name(bad)})"))
            continue
        try:
            data = marshal.dumps(("ok", value), 4)
        except (ValueError, RecursionError):
            send(resp_w, ("nonbuiltin", "returned a value nested too deeply to check"))
            continue
        if len(data) > MAX_MESSAGE:
            send(resp_w, ("exc", "MemoryError", f"returned a value over {MAX_MESSAGE >> 20} MB"))
            continue
        send_bytes(resp_w, data)


# -- the test process ----------------------------------------------------------------------
class Timeout(BaseException):
    pass


class Died(BaseException):
    """The program's process ended (or closed its channel) during a call."""


class NonBuiltin(BaseException):
    pass


class HarnessError(BaseException):
    """The task is unusable (its setup fails, a test passes something that is not data)."""


class ProgramError(Exception):
    """An exception of the program's that is not a builtin exception type."""


def parent(pid, req_w, resp_r, report_fd):
    spec = recv(0)
    os.close(0)
    os.open(os.devnull, os.O_RDONLY)
    nonce, limit = spec["nonce"], float(spec["time_limit"])
    os.dup2(2, 1)  # tests' prints: stderr; reports go to report_fd only
    ended = []

    def report(*fields):
        line = " ".join(["@" + nonce] + [short(f, 400).replace("\n", " ") for f in fields]) + "\n"
        write_all(report_fd, line.encode("utf-8", "replace"))

    def on_alarm(signum, frame):
        raise Timeout()

    signal.signal(signal.SIGALRM, on_alarm)

    def arm():
        signal.setitimer(signal.ITIMER_REAL, limit)

    def disarm():
        signal.setitimer(signal.ITIMER_REAL, 0)

    def died_detail():
        """Why the program's process is gone (it is killed if it merely closed the channel)."""
        for _ in range(200):
            got, status = os.waitpid(pid, os.WNOHANG)
            if got:
                ended.append(status)
                if os.WIFSIGNALED(status):
                    sig = os.WTERMSIG(status)
                    return f"the program's process was killed by signal {sig}"
                return f"the program's process exited with code {os.WEXITSTATUS(status)}"
            time.sleep(0.001)
        os.kill(pid, 9)
        ended.append(os.waitpid(pid, 0)[1])
        return "the program closed the harness channel"

    def call(name, args, kwargs):
        try:
            data = marshal.dumps((name, args, kwargs), 4)
        except ValueError:
            raise HarnessError(f"a test passes something other than plain data to {name}()")
        try:
            send_bytes(req_w, data)
            reply = recv(resp_r)
        except (Closed, BrokenPipeError, ConnectionResetError):
            raise Died(died_detail())
        except Exception:
            raise Died("the program sent a malformed reply")
        kind = reply[0] if type(reply) is tuple and reply and type(reply[0]) is str else ""
        if kind == "ok":
            value = reply[1]
            if non_builtin(value) is not None:
                raise NonBuiltin("returned a non-builtin value")
            return value
        if kind == "nonbuiltin" and len(reply) == 2 and type(reply[1]) is str:
            raise NonBuiltin(reply[1])
        if kind == "exc" and len(reply) == 3 and type(reply[1]) is str and type(reply[2]) is str:
            cls = getattr(builtins, reply[1], None)
            if isinstance(cls, type) and issubclass(cls, Exception) and cls is not AssertionError:
                try:
                    e = cls(reply[2])
                except BaseException:
                    e = ProgramError(reply[2])
            else:
                e = ProgramError(reply[2])
            e._elastic_program = reply[2] or reply[1]
            e._elastic_memory = reply[1] == "MemoryError"
            raise e
        raise Died("the program sent a malformed reply")

    def proxy(name):
        def program_function(*args, **kwargs):
            return call(name, args, kwargs)
        program_function.__name__ = program_function.__qualname__ = name
        return program_function

    # The program loads in its process meanwhile: wait for it under the time limit.
    try:
        arm()
        try:
            reply = recv(resp_r)
        finally:
            disarm()
    except Timeout:
        report("C", "timeout", f"loading the program took over {limit:g}s")
        return
    except (Closed, BrokenPipeError, ConnectionResetError):
        report("C", "died", died_detail() + " while loading")
        return
    except Exception:
        reply = None
    if type(reply) is tuple and len(reply) == 3 and reply[0] == "load":
        status = reply[1] if reply[1] in ("syntax_error", "runtime_error", "memory_limit") else "runtime_error"
        report("C", status, reply[2])
        return
    if reply != ("ready",):
        report("C", "died", "the program sent a malformed reply while loading")
        return

    ns = {"__name__": "__test__", "__builtins__": builtins}
    try:
        if spec["helpers"]:  # trusted helpers the tests use, from the task's prompt
            pns = {"__name__": "__prompt__", "__builtins__": builtins}
            exec(compile(spec["prompt"], "<prompt>", "exec"), pns)
            for h in spec["helpers"]:
                ns[h] = pns[h]
        if spec["setup"]:
            exec(compile(spec["setup"], "<setup>", "exec"), ns)
        for name in spec["proxies"]:
            ns[name] = proxy(name)
        if spec["form"] == "humaneval":
            exec(compile(spec["test"], "<test>", "exec"), ns)
            check, candidate = ns["check"], proxy(spec["entry"])
            sources = {"<test>": spec["test"].splitlines()}
            tests = [("check", lambda: check(candidate))]
        else:
            sources, tests = {}, []
            for i, src in enumerate(spec["tests"]):
                fname = f"<test_{i}>"
                sources[fname] = src.splitlines()
                tests.append((f"test_{i}", (lambda c: lambda: exec(c, ns))(compile(src, fname, "exec"))))
    except BaseException as e:
        report("H", f"the task's test set-up failed: {type(e).__name__}: {e}")
        return

    def where(e):
        """The test line an exception came through (the last frame in a test's source)."""
        line = ""
        tb = e.__traceback__
        while tb is not None:
            lines = sources.get(tb.tb_frame.f_code.co_filename)
            if lines is not None and 0 < tb.tb_lineno <= len(lines):
                line = lines[tb.tb_lineno - 1].strip()
            tb = tb.tb_next
        return line

    report("S", len(tests))
    for i, (name, fn) in enumerate(tests):
        t0 = time.perf_counter()
        try:
            try:
                arm()
                fn()
            finally:
                disarm()
            status, detail = "ok", ""
        except Timeout:
            status, detail = "timeout", f"over {limit:g}s"
        except Died as e:
            status, detail = "died", str(e)
        except NonBuiltin as e:
            status, detail = "wrong_answer", str(e)
        except HarnessError as e:
            report("H", str(e))
            return
        except MemoryError:
            status, detail = "memory_limit", "MemoryError"
        except BaseException as e:
            at = where(e)
            if hasattr(e, "_elastic_program"):
                status = "memory_limit" if e._elastic_memory else "runtime_error"
                detail = e._elastic_program + (f" (in: {at})" if at else "")
            elif isinstance(e, AssertionError):
                msg = short(str(e), 120)
                status, detail = "wrong_answer", (at or "assertion") + " failed" + (f": {msg}" if msg else "")
            elif isinstance(e, (NameError, ImportError, SyntaxError)):
                report("H", f"{name}: the test itself fails: {type(e).__name__}: {e}")
                return
            else:  # the test could not use what the program returned (len(None), ...)
                status, detail = "wrong_answer", f"{type(e).__name__}: {short(str(e), 120)}" + (
                    f" (in: {at})" if at else "")
        report("T", i, status, f"{time.perf_counter() - t0:.6f}", detail)
        if status != "ok":
            break
    else:
        report("E", len(tests))


def confine():
    """Before any program runs: drop inherited descriptors, refuse POSIX message queues (they
    would outlive a program in the sandbox's IPC namespace and cannot be listed to remove),
    and become non-dumpable (without capabilities, the program then cannot open
    /proc/<harness>/{mem,fd}). True when all of it held."""
    try:
        os.closerange(3, 4096)
    except OSError:
        pass
    ok = True
    try:
        import resource

        resource.setrlimit(resource.RLIMIT_MSGQUEUE, (0, 0))
    except Exception:
        ok = False
    try:  # PR_SET_DUMPABLE, 0
        import ctypes

        ok = ctypes.CDLL(None, use_errno=True).prctl(4, 0, 0, 0, 0) == 0 and ok
    except Exception:
        ok = False
    return ok


def run_one(source):
    """One program's run, once its source is read: fork the program's process, then read the
    tests from stdin, run them and report. Never returns."""
    req_r, req_w = os.pipe()
    resp_r, resp_w = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            os.close(req_w)
            os.close(resp_r)
            child(source, req_r, resp_w)
        finally:
            os._exit(0)
    os.close(req_r)
    os.close(resp_w)
    del source
    report_fd = os.dup(1)
    try:
        parent(pid, req_w, resp_r, report_fd)
    finally:
        try:
            os.kill(pid, 9)
            os.waitpid(pid, 0)
        except OSError:
            pass
        os._exit(0)


def main():
    source = recv(0)
    confine()
    run_one(source)


# -- batch mode: one interpreter, many programs, one at a time ---------------------------------
WIPE_S = 5.0  # longest the supervisor spends killing and wiping after a program, else it stops
# Imported once by the supervisor, so every program forked from it finds them loaded (typing
# alone is ~10 ms of CPU per program that imports it, as most HumanEval prompts do). Only
# modules without per-process state: never random (its seed would be every program's).
WARM_MODULES = ("typing", "string", "heapq", "bisect")
DEV_SHM = "/dev/shm"


def pread_record(off):
    """(object, offset after it) of the length-prefixed marshal record at `off` of stdin,
    read without moving stdin's shared offset."""
    def exact(n, at):
        buf = b""
        while len(buf) < n:
            chunk = os.pread(0, n - len(buf), at + len(buf))
            if not chunk:
                raise Closed()
            buf += chunk
        return buf
    n = int.from_bytes(exact(4, off), "big")
    if n > MAX_MESSAGE:
        raise ValueError("record too large")
    return marshal.loads(exact(n, off + 4)), off + 4 + n


def writable_places(cwd):
    """The tmpfs mounts a program can write (the working directory, /tmp, /dev/shm), or None
    when anything else is writable (/ or /dev not read-only: the host did not ask for
    the layout batch mode relies on)."""
    unescape = lambda p: p.replace("\\040", " ").replace("\\011", "\t").replace("\\134", "\\")
    places = []
    with open("/proc/self/mounts") as f:
        for line in f:
            fields = line.split()
            if len(fields) < 4 or "rw" not in fields[3].split(","):
                continue
            where, kind = unescape(fields[1]), fields[2]
            if kind == "tmpfs" and where in (cwd, "/tmp", DEV_SHM):
                places.append(where)
            elif (kind, where) in (("proc", "/proc"), ("devpts", "/dev/pts")):
                continue  # per-process state and terminals: gone with the processes
            elif where.startswith("/dev/") and not os.path.isdir(where):
                continue  # a device node (null, zero, urandom...)
            else:
                return None
    return places if sorted(places) == sorted({cwd, "/tmp", DEV_SHM}) else None


def kill_all(deadline):
    """SIGKILL every other process of the PID namespace (we are its init, so every one is our
    descendant and kill(-1) spares only us) and reap them all; False if some outlive `deadline`."""
    while time.monotonic() < deadline:
        try:
            os.kill(-1, 9)
        except ProcessLookupError:
            pass
        while True:
            try:
                got, _ = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return True
            if not got:
                break
        time.sleep(0.0002)
    return False


def empty_dir(root, mode, deadline):
    """Remove everything under `root` (made traversable first: a program may chmod its dirs)
    and give `root` its mode back."""
    os.chmod(root, 0o700)
    stack, dirs = [root], []
    while stack:
        if time.monotonic() > deadline:
            raise TimeoutError(root)
        d = stack.pop()
        if d is not root:
            os.chmod(d, 0o700)
        dirs.append(d)
        with os.scandir(d) as it:
            for e in it:
                if e.is_dir(follow_symlinks=False):
                    stack.append(e.path)
                else:
                    os.unlink(e.path)
    for d in reversed(dirs[1:]):
        os.rmdir(d)
    os.chmod(root, mode)


def remove_sysv_ipc():
    """Remove the IPC namespace's System V shared memory, semaphores and message queues."""
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    for kind, rm in (("shm", lambda i: libc.shmctl(i, 0, None)), ("sem", lambda i: libc.semctl(i, 0, 0)),
                     ("msg", lambda i: libc.msgctl(i, 0, None))):  # IPC_RMID = 0
        for _ in range(2):
            with open("/proc/sysvipc/" + kind) as f:
                ids = [int(line.split()[1]) for line in f.readlines()[1:] if line.strip()]
            if not ids:
                break
            for i in ids:
                rm(i)
        else:
            raise OSError("System V " + kind + " objects left")


def wipe(places, modes, link, cwd, deadline):
    """Leave the writable places as the first program found them: empty, but for the
    working directory's link to this harness."""
    for place in places:
        empty_dir(place, modes[place], deadline)
    if link is not None:
        os.symlink(link, os.path.join(cwd, "harness.py"))
    remove_sysv_ipc()
    for place in places:
        if sorted(os.listdir(place)) != (["harness.py"] if place == cwd and link is not None else []):
            raise OSError(place + " is not clean")


def wait_runner(pid, wall):
    """The runner's end ("exit <code>", "signal <n>") or "deadline" (it was killed at `wall`)."""
    import select

    deadline = time.monotonic() + wall
    try:
        pidfd = os.pidfd_open(pid)
    except (AttributeError, OSError):
        pidfd = None
    try:
        while True:
            if pidfd is None:
                got, status = os.waitpid(pid, os.WNOHANG)
                if got:
                    break
                time.sleep(0.0005)
            else:
                left = deadline - time.monotonic()
                if left > 0 and select.select([pidfd], [], [], left)[0]:
                    got, status = os.waitpid(pid, 0)
                    break
            if time.monotonic() >= deadline:
                os.kill(pid, 9)
                os.waitpid(pid, 0)
                return "deadline"
    finally:
        if pidfd is not None:
            os.close(pidfd)
    if os.WIFSIGNALED(status):
        return "signal %d" % os.WTERMSIG(status)
    return "exit %d" % os.WEXITSTATUS(status)


def batch():
    """``--batch``: the supervisor. stdin: a count, then per program three records: the
    program's (source, wall seconds, RLIMIT_CPU soft, hard, length of the next record), its
    tests (today's second record, read by its runner only), and the key of the supervisor's
    line about it, read only once every process of that program is gone. Per program it writes
    ``@<key> R <i> <exit <code> | signal <n> | deadline | unclean> <runner seconds>``."""
    cwd = os.getcwd()
    if os.getpid() != 1 or not confine():
        os.write(2, b"harness: --batch needs to run as its PID namespace's init, non-dumpable\n")
        os._exit(3)
    signal.signal(signal.SIGINT, signal.SIG_DFL)  # as init, no handler: nothing in the sandbox can signal us
    places = writable_places(cwd)
    if places is None:
        os.write(2, b"harness: --batch needs / and /dev read-only (only the working directory, /tmp and "
                    b"/dev/shm writable)\n")
        os._exit(3)
    modes = {p: os.stat(p).st_mode & 0o7777 for p in places}
    try:
        link = os.readlink(os.path.join(cwd, "harness.py"))
    except OSError:
        link = None
    import gc
    import resource

    for name in WARM_MODULES:
        try:
            __import__(name)
        except Exception:
            pass
    gc.freeze()  # the collector then leaves these objects alone: no copied pages in the forks for it
    count, off = pread_record(0)
    for i in range(count):
        (source, wall, cpu_soft, cpu_hard, tests_len), off = pread_record(off)
        os.lseek(0, off, os.SEEK_SET)  # the runner reads the tests from here, after forking the program
        t0 = time.monotonic()
        pid = os.fork()
        if pid == 0:
            try:
                signal.signal(signal.SIGINT, signal.default_int_handler)  # as the single-program harness has it
                resource.setrlimit(resource.RLIMIT_CPU, (cpu_soft, cpu_hard))  # a fresh process: a fresh count
            except BaseException:
                os._exit(5)
            run_one(source)
        del source
        status = wait_runner(pid, wall)
        took = time.monotonic() - t0
        deadline = time.monotonic() + WIPE_S
        clean = kill_all(deadline)
        if clean:
            try:
                wipe(places, modes, link, cwd, deadline)
            except Exception as e:
                clean = False
                os.write(2, ("harness: wipe after program %d failed: %s\n" % (i, short(e))).encode())
        key, off = pread_record(off + 4 + tests_len)
        write_all(1, ("@%s R %d %s %.6f\n" % (key, i, status if clean else "unclean", took)).encode())
        if not clean:
            os._exit(4)  # the next program would not start from a clean sandbox: the host runs the rest alone
    os._exit(0)


if __name__ == "__main__":
    if sys.argv[1:] == ["--batch"]:
        batch()
    else:
        main()
