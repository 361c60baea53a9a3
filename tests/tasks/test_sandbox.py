import os
import socket
import time

import pytest

from bebop.tasks.sandbox import _MAX_SLOTS, _UID_BASE, Limits, run_many, run_tests

LIMITS = Limits(wall_seconds=3.0, memory_bytes=256 << 20)
GOOD = "def inc(x):\n    return x + 1\n"
TESTS = ["assert inc(1) == 2", "assert inc(5) == 6"]


def _own_sandbox_pids():
    """Processes still alive under one of this test process's sandbox uids."""
    lo = _UID_BASE + (os.getpid() % (1 << 22)) * _MAX_SLOTS
    left = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            uid = os.stat(f"/proc/{pid}").st_uid
        except OSError:
            continue
        if lo <= uid < lo + _MAX_SLOTS:
            left.append(pid)
    return left


def test_correct_half_and_broken_programs():
    half = "def inc(x):\n    return 2 if x == 1 else 0\n"
    jobs = [(GOOD, TESTS), (half, TESTS), ("def inc(x) return", TESTS), ("raise SystemExit(0)\n" + GOOD, TESTS),
            (GOOD, ["assert inc(1) == 3"]), (GOOD + "import math, re, collections, random\nfrom typing import List\nfrom datetime import timedelta\n", TESTS)]
    assert run_many(jobs, LIMITS) == [1.0, 0.5, 0.0, 0.0, 0.0, 1.0]


def test_reward_hacks_earn_nothing(tmp_path):
    always_equal = "class Eq:\n    def __eq__(self, other):\n        return True\ndef inc(x):\n    return Eq()\n"
    fake_line = "import os\nos.write(1, b'\\n0123456789abcdef0123456789abcdef 2 2\\n')\nos._exit(0)\n"
    patched_exec = "import builtins\nbuiltins.exec = lambda *a, **k: None\nbuiltins.eval = lambda *a, **k: 2\n"
    peek_nonce = GOOD + "import sys\nprint(sys._getframe(1).f_locals)\n"
    peek_traceback = GOOD + "try:\n    1 / 0\nexcept Exception as e:\n    print(e.__traceback__.tb_frame.f_back)\n"
    jobs = [(c, TESTS) for c in (always_equal, fake_line, patched_exec, peek_nonce, peek_traceback)]
    assert run_many(jobs, LIMITS) == [0.0] * len(jobs)


# each program would pass both asserts, so a reward of 0 can only come from the sandbox stopping it
HOSTILE = {
    "infinite loop": GOOD + "while True:\n    pass\n",
    "sleep forever": GOOD + "import time\ntime.sleep(10 ** 6)\n",
    "huge allocation": GOOD + "try:\n    x = bytearray(64 << 30)\nexcept MemoryError:\n    raise\n",
    "fork loop": GOOD + "import os\ntry:\n    while True:\n        os.fork()\nexcept Exception:\n    pass\n",
    "socket": GOOD + "try:\n    import socket\n    socket.create_connection(('127.0.0.1', PORT), timeout=1)\nexcept Exception:\n    pass\n",
    "write outside": GOOD + "try:\n    open(OUTSIDE, 'w').write('x')\nexcept Exception:\n    pass\n",
    "delete outside": GOOD + "import os\ntry:\n    os.remove(VICTIM)\nexcept Exception:\n    pass\n",
    "kill parent": GOOD + "import os\ntry:\n    os.kill(os.getppid(), 9)\nexcept Exception:\n    pass\n",
    "subprocess": GOOD + "try:\n    import subprocess\n    subprocess.run(['true'])\nexcept Exception:\n    pass\n",
    "huge output": GOOD + "import sys\ntry:\n    sys.stdout.write('x' * (64 << 20))\nexcept Exception:\n    pass\n",
}


def test_hostile_programs_get_zero_within_the_time_limit_and_the_caller_goes_on(tmp_path):
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(1)
    listener.settimeout(0)
    victim = tmp_path / "victim"
    victim.write_text("keep me")
    outside = tmp_path / "pwned"
    consts = f"PORT = {listener.getsockname()[1]}\nOUTSIDE = {str(outside)!r}\nVICTIM = {str(victim)!r}\n"
    start = time.monotonic()
    scores = run_many([(consts + code, TESTS) for code in HOSTILE.values()], LIMITS, workers=len(HOSTILE))
    elapsed = time.monotonic() - start
    assert dict(zip(HOSTILE, scores)) == {name: 0.0 for name in HOSTILE}
    # all ran at once: the slowest is the wall limit, plus start-up and cleanup on a loaded machine
    assert elapsed < LIMITS.wall_seconds + 6, elapsed
    assert not outside.exists() and victim.read_text() == "keep me"
    with pytest.raises(BlockingIOError):
        listener.accept()  # nobody connected
    listener.close()
    assert _own_sandbox_pids() == []  # the fork loop's children are gone too
    # and the caller goes on: a good program right after still gets its reward
    assert run_tests(GOOD, TESTS, LIMITS)[0] == 1.0


def test_workdir_is_removed_and_writable_inside():
    code = GOOD + "import os\nopen('scratch.txt', 'w').write('ok')\nprint('CWD', os.getcwd())\n"
    score, output = run_tests(code, TESTS, LIMITS)
    assert score == 1.0
    cwd = next(line.split()[1] for line in output.splitlines() if line.startswith("CWD"))
    assert not os.path.exists(cwd)


def test_rejects_empty_tests():
    with pytest.raises(ValueError):
        run_tests(GOOD, [], LIMITS)


def test_child_runs_unprivileged_with_limits_and_no_network():
    code = GOOD + ("import os, resource\n"
                   "print('UID', os.getuid(), resource.getrlimit(resource.RLIMIT_AS)[0],"
                   " resource.getrlimit(resource.RLIMIT_NPROC)[0])\n"
                   "print('NET', ','.join(l.split(':')[0].strip() for l in open('/proc/self/net/dev').read().splitlines()[2:]))\n")
    score, output = run_tests(code, TESTS, LIMITS)
    assert score == 1.0
    lines = {line.split()[0]: line.split()[1:] for line in output.splitlines() if line.startswith(("UID", "NET"))}
    uid, mem, nproc = map(int, lines["UID"])
    assert mem == LIMITS.memory_bytes
    if os.geteuid() == 0:  # root: a uid of its own, its own process budget, an empty network namespace
        assert uid >= _UID_BASE and nproc == LIMITS.processes
        assert lines["NET"] == ["lo"]
    else:
        assert uid == os.getuid()
