"""C source of the in-sandbox runner: one bubblewrap instance per evaluation.

Why it exists: a bubblewrap instance costs ~3-4 ms of set-up and tear-down (mount namespace,
binds, /proc, /dev) and a cgroup's creation, attach and removal take the kernel's global
cgroup lock, the attach for an RCU grace period (~10 ms here); two evaluators running at
once then wait on each other (bench/reward_throughput.py). An evaluation compiles once and
runs its binary 5-11 times (tests, warm-up, timed runs): with a fresh sandbox per process,
the sandboxes cost more than the runs. The runner is started once per evaluation as the
sandbox's PID 1 (``bwrap --as-pid-1``) and runs each job (the compile, then every run) as
its own child with its own rlimits, CPU pin, working directory, stdin, output caps and wall
clock; nothing a job started survives it.

Why one sandbox can serve the compile and every run of the *same* program:
* the runner is PID 1 of the PID namespace: the kernel does not deliver signals (SIGKILL
  included) from processes of the namespace to its init unless it installed a handler, and
  it installs none; it is not dumpable, so a run cannot ptrace it or read /proc/1/fd, /mem;
* after each job (exit, timeout or output limit) it SIGKILLs every other process of the
  namespace (``kill(-1)``) and reaps them all before answering, so a daemonized child of a
  test cannot see the next test;
* nothing a job writes reaches the next job: after each job the runner empties the writable
  mounts (``/sandbox``, ``/tmp``, ``/build``; ``/dev`` is read-only) and removes the IPC
  namespace's System V objects (POSIX message queues are refused by ``RLIMIT_MSGQUEUE`` 0),
  or dies, which the parent reports as a sandbox error. Without this a test run could read
  the benchmark input (exposed to the session), compute its answer and leave it for the
  timed run;
* the compiled binary is copied into a sealed memfd before ``/build`` is emptied, and every
  run execs that memfd: no run can change what a later run executes.

Protocol (the parent is elastic/sandbox/session.py), on the runner's stdin and stdout:
* ready: the runner writes ``+`` once it is up;
* job, one line: ``<C|J> <wall_ms> <stdout_cap> <stderr_keep> <stderr_max> <cpu|-1> <n>
  <res>:<soft>:<hard> ... <stdin_path> <argc> <argv...>`` (no token contains whitespace);
  ``C`` compiles in ``/build`` (``/build/prog`` is the binary), ``J`` runs the binary in a
  fresh ``/sandbox/run<i>``;
* answer, one line then the bytes: ``R <exit> <signal> <wall_ns> <cpu_us> <maxrss_kb>
  <timed_out> <output_limit> <exec_errno> <binary_ok> <stdout_len> <stderr_len>\n`` +
  stdout + stderr.
EOF on stdin ends the runner. ``argv[1]`` is the binary to run, or ``-`` (a ``C`` job's).
"""

SOURCE = r"""
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <sched.h>
#include <sys/mman.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ipc.h>
#include <sys/msg.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/sem.h>
#include <sys/shm.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define MAX_LINE 65536
#define MAX_ARGS 256
#define MAX_RL 16

static long long now_ns(void) {
    struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t);
    return (long long)t.tv_sec * 1000000000LL + t.tv_nsec;
}

static void die(const char *what) {
    dprintf(2, "runner: %s: %s\n", what, strerror(errno));
    _exit(125);
}

static int write_all(int fd, const char *p, size_t n) {
    while (n) {
        ssize_t w = write(fd, p, n);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) return -1;
        p += w; n -= (size_t)w;
    }
    return 0;
}

/* Kill every other process of the namespace and reap them all (we are its init). */
static void kill_and_reap_all(void) {
    for (int round = 0; round < 5000; round++) {
        kill(-1, SIGKILL);
        for (;;) {
            pid_t p = waitpid(-1, NULL, WNOHANG);
            if (p > 0) continue;
            if (p < 0 && errno == EINTR) continue;
            if (p < 0 && errno == ECHILD) return;
            break;  /* 0: children left that have not died yet */
        }
        struct timespec t = {0, 200000};
        nanosleep(&t, NULL);
    }
}

static int open_up(const char *path, const struct stat *sb, int flag, struct FTW *ftw) {
    (void)ftw;
    if (flag == FTW_D || flag == FTW_DNR) chmod(path, (sb->st_mode & 07777) | 0700);
    return 0;
}

static int rm_entry(const char *path, const struct stat *sb, int flag, struct FTW *ftw) {
    (void)sb; (void)flag;
    if (ftw->level > 0) remove(path);
    return 0;
}

static int is_empty(const char *dir) {
    DIR *d = opendir(dir);
    if (!d) return 0;
    struct dirent *e; int n = 0;
    while ((e = readdir(d))) if (strcmp(e->d_name, ".") && strcmp(e->d_name, "..")) n++;
    closedir(d);
    return n == 0;
}

/* Everything a run could leave for the next run of the session goes: the files of the
   writable tmpfs mounts (directories made traversable first: their owner may chmod them)
   and the namespace's System V IPC objects. Dies if something is left (the parent then
   reports a sandbox error: state must never carry over). */
static void wipe_state(void) {
    const char *roots[] = {"/sandbox", "/tmp", "/build"};
    for (int i = 0; i < 3; i++) {
        struct stat st;
        if (stat(roots[i], &st) != 0) continue;
        chmod(roots[i], i == 2 ? 0700 : 0755);  /* the mount roots: whatever mode a run left */
        nftw(roots[i], open_up, 16, FTW_PHYS);
        nftw(roots[i], rm_entry, 16, FTW_DEPTH | FTW_PHYS);
        if (!is_empty(roots[i])) { errno = ENOTEMPTY; die(roots[i]); }
    }
    struct shm_info si; struct shmid_ds sd;
    int max = shmctl(0, SHM_INFO, (struct shmid_ds *)&si);
    for (int i = 0; i <= max; i++) { int id = shmctl(i, SHM_STAT, &sd); if (id >= 0) shmctl(id, IPC_RMID, NULL); }
    union semun { int val; struct semid_ds *buf; unsigned short *array; struct seminfo *info; } arg;
    struct seminfo mi; struct semid_ds md; arg.info = &mi;
    max = semctl(0, 0, SEM_INFO, arg);
    for (int i = 0; i <= max; i++) { arg.buf = &md; int id = semctl(i, 0, SEM_STAT, arg); if (id >= 0) semctl(id, 0, IPC_RMID); }
    struct msginfo qi; struct msqid_ds qd;
    max = msgctl(0, MSG_INFO, (struct msqid_ds *)&qi);
    for (int i = 0; i <= max; i++) { int id = msgctl(i, MSG_STAT, &qd); if (id >= 0) msgctl(id, IPC_RMID, NULL); }
    if (shmctl(0, SHM_INFO, (struct shmid_ds *)&si) >= 0 && si.used_ids) { errno = ENOTEMPTY; die("shm"); }
}

static char *line_buf;
static size_t line_len;

/* Next line from stdin (without the newline); NULL at EOF. */
static char *read_line(void) {
    static size_t start = 0;
    if (start) {
        memmove(line_buf, line_buf + start, line_len - start);
        line_len -= start; start = 0;
    }
    for (;;) {
        char *nl = memchr(line_buf, '\n', line_len);
        if (nl) { *nl = 0; start = (size_t)(nl - line_buf) + 1; return line_buf; }
        if (line_len == MAX_LINE) { errno = E2BIG; die("job line"); }
        ssize_t r = read(0, line_buf + line_len, MAX_LINE - line_len);
        if (r < 0 && errno == EINTR) continue;
        if (r < 0) die("read job");
        if (r == 0) return NULL;
        line_len += (size_t)r;
    }
}

struct buf { char *p; size_t len, cap, total; };

static void keep(struct buf *b, const char *src, size_t n, size_t limit) {
    b->total += n;
    if (b->len < limit) {
        size_t take = n < limit - b->len ? n : limit - b->len;
        if (b->len + take > b->cap) {
            size_t cap = b->cap ? b->cap : 65536;
            while (cap < b->len + take) cap *= 2;
            char *q = realloc(b->p, cap);
            if (!q) die("realloc");
            b->p = q; b->cap = cap;
        }
        memcpy(b->p + b->len, src, take);
        b->len += take;
    }
}

/* The compiled binary, copied into a sealed memfd: no run can change what later runs exec. */
static int load_binary(const char *path) {
    int src = open(path, O_RDONLY | O_CLOEXEC);
    if (src < 0) return -1;
    int fd = (int)syscall(SYS_memfd_create, "prog", MFD_CLOEXEC | MFD_ALLOW_SEALING);
    if (fd < 0) die("memfd_create");
    char b[65536]; ssize_t r;
    while ((r = read(src, b, sizeof b)) > 0) if (write_all(fd, b, (size_t)r)) die("memfd write");
    if (r < 0) die("read binary");
    close(src);
    if (fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_WRITE | F_SEAL_SEAL) != 0) die("seal");
    return fd;
}

int main(int argc, char **argv) {
    if (argc != 2) { errno = EINVAL; die("usage: runner <binary | - (compiled by a C job)>"); }
    const char *binary = strcmp(argv[1], "-") ? argv[1] : NULL;
    int bin_fd = -1;
    prctl(PR_SET_DUMPABLE, 0, 0, 0, 0);
    signal(SIGPIPE, SIG_IGN);
    for (int fd = 3; fd < 1024; fd++) close(fd);
    line_buf = malloc(MAX_LINE);
    if (!line_buf) die("malloc");
    if (write_all(1, "+", 1) != 0) die("ready");
    char dir[64] = "";
    for (int job = 0;; job++) {
        char *line = read_line();
        if (!line) break;
        char *tok[MAX_ARGS + 32]; int nt = 0;
        for (char *s = strtok(line, " "); s && nt < MAX_ARGS + 31; s = strtok(NULL, " ")) tok[nt++] = s;
        tok[nt] = NULL;
        if (nt < 9 || (strcmp(tok[0], "J") && strcmp(tok[0], "C"))) { errno = EINVAL; die("bad job"); }
        int compile = tok[0][0] == 'C';
        long long wall_ms = atoll(tok[1]);
        size_t out_cap = (size_t)atoll(tok[2]), err_keep = (size_t)atoll(tok[3]), err_max = (size_t)atoll(tok[4]);
        int cpu = atoi(tok[5]);
        int nrl = atoi(tok[6]);
        if (nrl < 0 || nrl > MAX_RL || 7 + nrl + 2 > nt) { errno = EINVAL; die("bad rlimits"); }
        int rres[MAX_RL]; unsigned long long rsoft[MAX_RL], rhard[MAX_RL];
        for (int i = 0; i < nrl; i++)
            if (sscanf(tok[7 + i], "%d:%llu:%llu", &rres[i], &rsoft[i], &rhard[i]) != 3) { errno = EINVAL; die("rlimit"); }
        const char *stdin_path = tok[7 + nrl];
        int pargc = atoi(tok[8 + nrl]);
        if (pargc < 1 || 9 + nrl + pargc > nt) { errno = EINVAL; die("bad argv"); }
        char **pargv = &tok[9 + nrl];
        pargv[pargc] = NULL;
        if (!compile && !binary && bin_fd < 0) { errno = ENOENT; die("run before a successful compile"); }

        /* compile: in /build; run: a fresh working directory holding ./prog */
        if (compile) {
            snprintf(dir, sizeof dir, "/build");
        } else {
            snprintf(dir, sizeof dir, "/sandbox/run%d", job);
            if (mkdir(dir, 0700) != 0) die("mkdir");
            char link[96]; snprintf(link, sizeof link, "%s/prog", dir);
            /* the run execs the sealed memfd (or `binary`); ./prog is there for programs that look */
            if (symlink(binary ? binary : "/proc/self/exe", link) != 0) die("symlink");
        }
        int po[2], pe[2], px[2];
        if (pipe2(po, O_CLOEXEC) || pipe2(pe, O_CLOEXEC) || pipe2(px, O_CLOEXEC)) die("pipe");
        long long t0 = now_ns();
        pid_t pid = fork();
        if (pid < 0) die("fork");
        if (pid == 0) {
            int err = 0;
            for (int i = 0; i < nrl && !err; i++) {
                struct rlimit rl = { (rlim_t)rsoft[i], (rlim_t)rhard[i] };
                if (setrlimit(rres[i], &rl) != 0) {
                    struct rlimit cur;
                    if (getrlimit(rres[i], &cur) != 0) { err = errno; break; }
                    rl.rlim_max = cur.rlim_max;
                    rl.rlim_cur = (rlim_t)rsoft[i] < cur.rlim_max ? (rlim_t)rsoft[i] : cur.rlim_max;
                    if (setrlimit(rres[i], &rl) != 0) err = errno;
                }
            }
            if (!err && cpu >= 0) {
                cpu_set_t set; CPU_ZERO(&set); CPU_SET(cpu, &set);
                if (sched_setaffinity(0, sizeof set, &set) != 0) err = errno;
            }
            int in = err ? -1 : open(stdin_path, O_RDONLY);
            if (!err && in < 0) err = errno;
            if (!err && (dup2(in, 0) < 0 || dup2(po[1], 1) < 0 || dup2(pe[1], 2) < 0)) err = errno;
            if (!err && chdir(dir) != 0) err = errno;
            if (!err) {
                signal(SIGPIPE, SIG_DFL);
                if (!compile && bin_fd >= 0) {
                    extern char **environ;
                    syscall(SYS_execveat, bin_fd, "", pargv, environ, AT_EMPTY_PATH);
                } else {
                    execvp(pargv[0], pargv);
                }
                err = errno;
            }
            ssize_t w = write(px[1], &err, sizeof err); (void)w;
            _exit(127);
        }
        close(po[1]); close(pe[1]); close(px[1]);
        int exec_errno = 0;
        { ssize_t r; do r = read(px[0], &exec_errno, sizeof exec_errno); while (r < 0 && errno == EINTR);
          if (r != (ssize_t)sizeof exec_errno) exec_errno = 0; }
        close(px[0]);
        int pfd = (int)syscall(SYS_pidfd_open, pid, 0);
        struct buf out = {0}, err = {0};
        int timed_out = 0, out_limit = 0, exited = 0, status = 0;
        struct rusage ru; memset(&ru, 0, sizeof ru);
        long long wall = 0, deadline = t0 + wall_ms * 1000000LL, exited_at = 0;
        int open_o = 1, open_e = 1;
        char chunk[65536];
        while (open_o || open_e || !exited) {
            long long now = now_ns();
            if (!exited && now >= deadline) { timed_out = 1; break; }
            if (exited && now > exited_at + 1000000000LL) break;  /* a descendant holds the pipes */
            struct pollfd fds[3]; int n = 0, io = -1, ie = -1, ip = -1;
            if (open_o) { io = n; fds[n].fd = po[0]; fds[n++].events = POLLIN; }
            if (open_e) { ie = n; fds[n].fd = pe[0]; fds[n++].events = POLLIN; }
            if (!exited && pfd >= 0) { ip = n; fds[n].fd = pfd; fds[n++].events = POLLIN; }
            long long left = (exited ? exited_at + 1000000000LL : deadline) - now;
            int ms = (int)(left / 1000000LL) + 1;
            if (!exited && pfd < 0 && ms > 2) ms = 2;
            int r = poll(fds, (nfds_t)n, ms);
            if (r < 0 && errno == EINTR) continue;
            if (r < 0) die("poll");
            if (!exited && (pfd < 0 || (ip >= 0 && (fds[ip].revents & POLLIN)))) {
                pid_t w = wait4(pid, &status, WNOHANG, &ru);
                if (w == pid) {
                    exited = 1; exited_at = now_ns(); wall = exited_at - t0;
                    kill_and_reap_all();  /* nothing the run started outlives it */
                }
            }
            if (io >= 0 && (fds[io].revents & (POLLIN | POLLHUP | POLLERR))) {
                ssize_t k = read(po[0], chunk, sizeof chunk);
                if (k > 0) { keep(&out, chunk, (size_t)k, out_cap + 1); if (out.total > out_cap) { out_limit = 1; break; } }
                else if (k == 0 || errno != EINTR) open_o = 0;
            }
            if (ie >= 0 && (fds[ie].revents & (POLLIN | POLLHUP | POLLERR))) {
                ssize_t k = read(pe[0], chunk, sizeof chunk);
                if (k > 0) { keep(&err, chunk, (size_t)k, err_keep); if (err.total > err_max) { out_limit = 1; break; } }
                else if (k == 0 || errno != EINTR) open_e = 0;
            }
        }
        if (!exited) {
            wall = now_ns() - t0;
            kill(pid, SIGKILL);
            wait4(pid, &status, 0, &ru);
            kill_and_reap_all();
        }
        if (pfd >= 0) close(pfd);
        close(po[0]); close(pe[0]);
        int binary_ok = 0;
        if (compile && !timed_out && !out_limit && !exec_errno && WIFEXITED(status) && WEXITSTATUS(status) == 0) {
            if (bin_fd >= 0) close(bin_fd);
            bin_fd = load_binary("/build/prog");
            binary_ok = bin_fd >= 0;
        }
        wipe_state();
        int code = -1, sig = 0;
        if (WIFSIGNALED(status)) sig = WTERMSIG(status); else code = WEXITSTATUS(status);
        long long cpu_us = (long long)ru.ru_utime.tv_sec * 1000000LL + ru.ru_utime.tv_usec
                         + (long long)ru.ru_stime.tv_sec * 1000000LL + ru.ru_stime.tv_usec;
        size_t olen = out.len > out_cap ? out_cap : out.len;
        char head[256];
        int hn = snprintf(head, sizeof head, "R %d %d %lld %lld %ld %d %d %d %d %zu %zu\n", code, sig, wall, cpu_us,
                          (long)ru.ru_maxrss, timed_out, out_limit, exec_errno, binary_ok, olen, err.len);
        if (write_all(1, head, (size_t)hn) || write_all(1, out.p ? out.p : "", olen)
            || write_all(1, err.p ? err.p : "", err.len)) die("answer");
        free(out.p); free(err.p);
    }
    kill_and_reap_all();
    return 0;
}
"""
