"""Run untrusted Python (a model's completion) against hidden assert lines, in a throwaway subprocess.

The reward is the fraction of asserts that pass. Anything hostile or broken -- an infinite loop, a huge
allocation, a fork loop, a socket, a write outside its directory, a signal to its parent -- costs that sample
its reward (0.0) and nothing else. Layers, outermost first:
  parent  a wall-time limit, after which the child's session is killed, then every process of its uid;
          output goes to a parent-owned temporary file; a throwaway working directory, removed afterwards.
  child   before any untrusted code runs: its own network namespace (unshare(CLONE_NEWNET), where permitted);
          rlimits on address space (memory), CPU seconds, processes, file size, no core dumps; as root, a uid of
          its own (no other process shares it, so the process limit counts only this sandbox and the cleanup
          can kill everything that uid owns) and no groups.
  hook    a PEP 578 audit hook ends the program at once (status VIOLATION) when it opens a socket, forks,
          spawns, sends a signal, imports a network/process/native-code module, or writes, renames or deletes
          outside its directory.
The result line carries a per-run random nonce, so printing a fake score earns nothing, and each assert
"f(x) == want" is compared in the harness on built-in values, so an always-equal object earns nothing either.
"""

import ast
import marshal
import os
import queue
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

VIOLATION = 86  # the child's exit status when the audit hook stops it


@dataclass(frozen=True)
class Limits:
    wall_seconds: float = 5.0
    memory_bytes: int = 512 << 20  # address space; CPython itself needs ~30 MB
    processes: int = 16  # RLIMIT_NPROC for the sandbox's own uid (as root); fork is also refused by the hook
    file_bytes: int = 4 << 20  # the largest file it may write, its captured output included


# Runs in the child before the untrusted code. Stdlib only; reads its job, a marshalled dict, on stdin.
_BOOTSTRAP = r'''
import marshal, os, resource, sys
job = marshal.loads(sys.stdin.buffer.read())  # from the parent: trusted
sys.stdin.close()
try:  # a network namespace of its own has no interfaces: no network even if the hook below were bypassed
    import ctypes
    ctypes.CDLL(None, use_errno=True).unshare(0x40000000)  # CLONE_NEWNET; needs CAP_SYS_ADMIN, else a no-op
    del ctypes
    sys.modules.pop("ctypes", None)
except Exception:
    pass
# the modules a solution may use, imported now: once the uid is dropped the interpreter's own directory
# may not be readable (e.g. a pyenv under /root), and anything else stays out of reach
for name in job["preload"]:
    try:
        __import__(name)
    except ImportError:
        pass
for res, value in [(resource.RLIMIT_AS, job["memory_bytes"]), (resource.RLIMIT_CPU, job["cpu_seconds"]),
                   (resource.RLIMIT_FSIZE, job["file_bytes"]), (resource.RLIMIT_CORE, 0),
                   (resource.RLIMIT_NPROC, job["processes"])]:
    resource.setrlimit(res, (value, value))
if job["uid"] is not None:  # running as root: become a uid nobody else uses, with no groups
    os.setgroups([])
    os.setgid(job["uid"])
    os.setuid(job["uid"])

def _hook(root, fspath, abspath, write_flags, exit_now, blocked, path_events, denied_imports):
    def inside(path):
        if isinstance(path, int):
            return True  # an already-open descriptor
        try:
            path = abspath(fspath(path))
        except Exception:
            return False
        return path == root or path.startswith(root + "/")

    def hook(event, args):
        if (event in blocked or event.startswith(("socket.", "ctypes.", "_posixsubprocess"))
                or (event == "import" and isinstance(args[0], str) and args[0].partition(".")[0] in denied_imports)
                or (event == "open" and len(args) > 2 and isinstance(args[2], int) and args[2] & write_flags
                    and not inside(args[0]))
                or (event in path_events and not all(inside(a) for a in args[:path_events[event]]))):
            exit_now(f"sandbox: refused {event}")
    return hook

def _exit_now(message):
    try:
        os.write(2, (message + "\n").encode())
    finally:
        os._exit(86)

sys.addaudithook(_hook(
    os.getcwd(), os.fspath, os.path.abspath,
    os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_APPEND | os.O_TRUNC, _exit_now,
    frozenset({"os.fork", "os.forkpty", "os.system", "os.exec", "os.posix_spawn", "os.spawn", "subprocess.Popen",
               "os.kill", "os.killpg", "signal.pthread_kill", "os.symlink", "os.link", "resource.setrlimit",
               "resource.prlimit", "os.setuid", "sys.remote_exec", "os.chroot",
               # frames hold the result nonce; these are the ways to reach one
               "sys._getframe", "sys._current_frames", "object.__getattr__", "gc.get_objects",
               "gc.get_referrers", "gc.get_referents"}),
    {"os.remove": 1, "os.rmdir": 1, "os.mkdir": 1, "os.rename": 2, "os.replace": 2, "os.chmod": 1,
     "os.chown": 1, "os.truncate": 1, "os.utime": 1, "shutil.rmtree": 1, "shutil.copyfile": 2,
     "shutil.move": 2, "os.chflags": 1, "os.mkfifo": 1, "os.mknod": 1, "os.setxattr": 1, "os.removexattr": 1},
    # asking for the network, processes or native code is enough, whether or not the module would load
    frozenset({"socket", "_socket", "ssl", "_ssl", "select", "selectors", "asyncio", "http", "urllib", "ftplib",
               "smtplib", "ctypes", "_ctypes", "subprocess", "_posixsubprocess", "multiprocessing",
               "_multiprocessing", "pty", "signal", "_signal", "mmap"})))

def _main(job, nonce, exec=exec, eval=eval, compile=compile, type=type, len=len, all=all, list=list,
          tuple=tuple, set=set, frozenset=frozenset, dict=dict, BaseException=BaseException, write=os.write,
          exit=os._exit, getpid=os.getpid):
    # builtins are bound as defaults above: the untrusted code may rebind builtins.exec & co. but not these
    plain_types = (int, float, bool, str, bytes, complex, type(None))

    def plain(x, depth=0):  # built-in values only: an object whose __eq__ always says True passes nothing
        t = type(x)
        if t in plain_types:
            return True
        if depth < 20 and t in (list, tuple, set, frozenset):
            return all(plain(v, depth + 1) for v in x)
        if depth < 20 and t is dict:
            return all(plain(k, depth + 1) and plain(v, depth + 1) for k, v in x.items())
        return False

    # compiled before the untrusted code runs; an "assert got == want" arrives split in two (see _split_assert)
    checks = [(compile(got, "<test>", "eval"), compile(want, "<test>", "eval")) if want is not None
              else (compile(got, "<test>", "exec"), None) for got, want in job["tests"]]
    main_pid = getpid()
    scope = {"__name__": "__main__"}
    passed = 0
    try:
        exec(compile(job["code"], "<completion>", "exec"), scope)
        ok = True
    except BaseException:
        ok = False  # a program that fails while defining its function passes nothing
    for got_code, want_code in checks if ok else []:
        try:
            if want_code is None:
                exec(got_code, scope)
                passed += 1
            else:
                got, want = eval(got_code, scope), eval(want_code, {})
                if plain(got) and got == want:
                    passed += 1
        except BaseException:
            pass
    if getpid() == main_pid:  # not a forked copy
        try:  # the program's own prints, ahead of the result line
            sys.stdout.flush()
            sys.stderr.flush()
        except BaseException:
            pass
        write(1, f"\n{nonce} {passed} {len(checks)}\n".encode())
        exit(0)
    exit(1)

_main(job, job.pop("nonce"))
'''

# what a solution to a small function-writing task may import; other modules may be unreadable once the uid
# drops (the interpreter's own directory, e.g. a pyenv under /root)
PRELOAD = ("math", "re", "string", "collections", "itertools", "functools", "operator", "heapq", "bisect", "copy",
           "typing", "datetime", "random")  # each costs start-up time in every sandbox: the common ones only

_UID_BASE = 1 << 30  # far above any real account's uid
_MAX_SLOTS = 64
_slots = queue.Queue()
for _i in range(_MAX_SLOTS):
    _slots.put(_i)


def _sandbox_uid(slot: int) -> int | None:
    # unique per (process, slot): two sandboxes never share a uid, so one's fork bomb can't use up another's
    # process limit and the cleanup kills only its own processes
    if os.geteuid() != 0:
        return None
    return _UID_BASE + (os.getpid() % (1 << 22)) * _MAX_SLOTS + slot


def _kill_uid(uid: int) -> None:
    # kill(-1) from a process of that uid reaches every process it owns, including ones that left the session
    try:
        subprocess.run(["kill", "-KILL", "-1"], user=uid, group=uid, extra_groups=[], stdout=subprocess.DEVNULL,
                       stderr=subprocess.DEVNULL, timeout=10, env={"PATH": "/usr/bin:/bin"})
    except (OSError, subprocess.SubprocessError):
        pass


def run_tests(code: str, tests: list[str], limits: Limits = Limits()) -> tuple[float, str]:
    """(fraction of `tests` -- single-line Python statements, usually asserts -- that pass after running
    `code`, the child's output). 0.0 when the program breaks a limit or a rule."""
    if not tests:
        raise ValueError("no tests to run")
    slot = _slots.get()
    workdir = tempfile.mkdtemp(prefix="bebop-sandbox-")
    uid = _sandbox_uid(slot)
    try:
        if uid is not None:
            os.chown(workdir, uid, uid)
        nonce = secrets.token_hex(16)
        job = {"code": code, "tests": [_split_assert(t) for t in tests], "nonce": nonce, "uid": uid, "preload": PRELOAD,
               "memory_bytes": limits.memory_bytes, "file_bytes": limits.file_bytes,
               "cpu_seconds": max(1, int(limits.wall_seconds) + 1),
               # without a uid of its own the limit counts every process of the user: leave room for those
               "processes": limits.processes if uid is not None else _user_tasks() + limits.processes}
        with tempfile.TemporaryFile() as out:  # parent-owned and outside workdir: the child can't swap it
            proc = subprocess.Popen([sys.executable, "-I", "-S", "-B", "-c", _BOOTSTRAP], stdin=subprocess.PIPE,
                                    stdout=out, stderr=out, cwd=workdir, start_new_session=True,
                                    env={"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8"})
            try:
                proc.stdin.write(marshal.dumps(job))
                proc.stdin.close()
            except OSError:
                pass  # it died before reading: no result line, reward 0
            try:
                rc = proc.wait(timeout=limits.wall_seconds)
            except subprocess.TimeoutExpired:
                rc = None
            finally:
                try:
                    os.killpg(proc.pid, signal.SIGKILL)
                except OSError:
                    pass
                if uid is not None:
                    _kill_uid(uid)
                proc.wait()
            out.seek(0)
            text = out.read(limits.file_bytes).decode("utf-8", errors="replace")
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
        _slots.put(slot)
    if rc != 0:
        return 0.0, text
    for line in reversed(text.splitlines()):
        parts = line.split()
        if len(parts) == 3 and parts[0] == nonce:
            return int(parts[1]) / int(parts[2]), text
    return 0.0, text


def _split_assert(line: str) -> tuple[str, str | None]:
    """("got", "want") source for "assert got == want", so the sandbox compares the two itself, on built-in
    values (`want` is evaluated without the program's names: a literal); (line, None) for any other statement."""
    node = ast.parse(line).body[0]
    if (isinstance(node, ast.Assert) and isinstance(node.test, ast.Compare) and len(node.test.ops) == 1
            and isinstance(node.test.ops[0], ast.Eq)):
        return ast.unparse(node.test.left), ast.unparse(node.test.comparators[0])
    return line, None


def run_many(jobs: list[tuple[str, list[str]]], limits: Limits = Limits(), workers: int | None = None) -> list[float]:
    """run_tests for each (code, tests), several at a time (each sandbox is a process of its own)."""
    workers = min(_MAX_SLOTS, workers or len(os.sched_getaffinity(0)), max(1, len(jobs)))
    with ThreadPoolExecutor(workers) as pool:
        return [score for score, _ in pool.map(lambda job: run_tests(*job, limits=limits), jobs)]


def _user_tasks() -> int:
    """Tasks (threads) of this real uid now: what RLIMIT_NPROC counts."""
    uid, n = os.getuid(), 0
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/status") as f:
                fields = dict(line.split(":", 1) for line in f if ":" in line)
            if int(fields["Uid"].split()[0]) == uid:
                n += int(fields["Threads"])
        except (OSError, KeyError, ValueError):
            pass
    return n
