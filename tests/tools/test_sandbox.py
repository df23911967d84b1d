"""The sandbox: verdicts from the judge, and every known escape contained and reported as a failure.

Each escape test runs code that tries the escape and test source that passes only if the escape
worked; the run must fail, and the evidence is checked from outside (the host file system, the
listener's accept queue, the host process table), never from what the code printed alone.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import tracemalloc
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from maserve_prefect.tools import call_tool
from maserve_prefect.tools.sandbox import (
    ALLOW_UNSANDBOXED_ENV,
    BWRAP_ENV,
    SandboxPolicy,
    SandboxUnavailableError,
    jail_argv,
    jail_available,
    run_python_tests,
)

ADD = "def add(a, b):\n    return a + b\n"
JAILED = SandboxPolicy(allow_unsandboxed=False)  # never falls back to running unjailed
UNJAILED = SandboxPolicy(bwrap="/nonexistent/bwrap", allow_unsandboxed=True)

needs_jail = pytest.mark.skipif(
    not jail_available(JAILED), reason="no bubblewrap jail here (`make` installs bubblewrap)"
)


@pytest.fixture
def listener() -> Iterator[socket.socket]:
    """A TCP listener on 127.0.0.1 in the test process (non-blocking, so accept() can probe)."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    sock.listen(8)
    sock.setblocking(False)
    yield sock
    sock.close()


def _assert_never_accepted(sock: socket.socket) -> None:
    with pytest.raises(BlockingIOError):
        sock.accept()


def _pids_running(token: str) -> list[int]:
    """Host pids whose command line holds `token` (zombies have none, so they do not count)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if token.encode() in (entry / "cmdline").read_bytes():
                found.append(int(entry.name))
        except OSError:
            continue
    return found


def _connect_code(port: int) -> str:
    # Tries the three usual ways and returns what happened; the tests demand a connection.
    return (
        "import socket\n"
        "def probe():\n"
        "    outcomes = []\n"
        "    for attempt in ('create_connection', 'connect', 'raw'):\n"
        "        try:\n"
        "            if attempt == 'create_connection':\n"
        f"                socket.create_connection(('127.0.0.1', {port}), timeout=2)\n"
        "            elif attempt == 'connect':\n"
        f"                socket.socket().connect(('127.0.0.1', {port}))\n"
        "            else:\n"
        "                import _socket\n"
        f"                _socket.socket().connect(('127.0.0.1', {port}))\n"
        "            outcomes.append(attempt + ': connected')\n"
        "        except OSError as exc:\n"
        "            outcomes.append(f'{attempt}: {type(exc).__name__}')\n"
        "    print(outcomes, flush=True)\n"
        "    return outcomes\n"
    )


CONNECTED = "assert any(o.endswith('connected') for o in probe())\n"


# --- verdicts ------------------------------------------------------------------------------------


def test_correct_solution_passes_and_wrong_one_fails() -> None:
    tests = "assert add(2, 3) == 5\ndef test_negative():\n    assert add(-1, -1) == -2\n"
    good = run_python_tests(ADD, tests)
    assert good.passed and good.num_passed == 2 and good.num_failed == 0, good
    bad = run_python_tests("def add(a, b):\n    return a - b\n", tests)
    assert not bad.passed and not bad.timed_out
    assert "AssertionError" in bad.error


def test_failing_test_function_is_named() -> None:
    tests = (
        "def test_ok():\n    assert add(1, 1) == 2\ndef test_bad():\n    assert add(1, 1) == 3\n"
    )
    run = run_python_tests(ADD, tests)
    assert not run.passed
    assert (run.num_passed, run.num_failed) == (2, 1)
    assert run.failures[0].startswith("test_bad")


def test_values_exceptions_and_handles_cross_as_the_tests_expect() -> None:
    code = (
        "class Empty(ValueError):\n    pass\n"
        "LIMIT = 3\n"
        "def first(xs):\n    if not xs:\n        raise Empty('no items')\n    return xs[0]\n"
        "def pairs(n):\n    return {(i, i + 1): {i} for i in range(n)}\n"
        "def count(n):\n    yield from range(n)\n"
        "class Box:\n    def __init__(self, v):\n        self.v = v\n"
        "    def get(self):\n        return self.v\n"
    )
    tests = (
        "assert LIMIT == 3\n"
        "assert first([b'x', 2.5]) == b'x'\n"
        "assert pairs(2) == {(0, 1): {0}, (1, 2): {1}}\n"
        "assert list(count(4)) == [0, 1, 2, 3]\n"
        "box = Box([1, (2, 3)])\n"
        "assert box.get() == [1, (2, 3)] and box.v == [1, (2, 3)]\n"
        "assert first([box]).get() == [1, (2, 3)]\n"
        "def test_raises_as_value_error():\n"
        "    try:\n        first([])\n    except ValueError as exc:\n"
        "        assert type(exc).__name__ == 'Empty' and 'no items' in str(exc)\n"
        "        return\n"
        "    raise AssertionError('no exception')\n"
    )
    run = run_python_tests(code, tests)
    assert run.passed, (run.error, run.failures)
    assert (run.num_passed, run.num_failed) == (2, 0)


def test_concurrent_runs_from_threads_keep_their_own_verdicts() -> None:
    # Prefect runs tasks on threads: runs started together must not share pipes or verdicts.
    def run(k: int) -> bool:
        tests = f"assert add({k}, 1) == {k + 1}\n" if k % 2 else "assert add(1, 1) == 3\n"
        return run_python_tests(ADD, tests).passed

    with ThreadPoolExecutor(max_workers=4) as pool:
        verdicts = list(pool.map(run, range(6)))
    assert verdicts == [False, True, False, True, False, True]


def test_code_that_fails_to_load_is_a_failure_with_its_error() -> None:
    run = run_python_tests("def add(a, b):\n    return a +\n", "assert add(1, 2) == 3\n")
    assert not run.passed and run.num_failed == 1
    assert "SyntaxError" in run.error


def test_an_object_that_equals_everything_stays_in_the_code_process() -> None:
    code = (
        "class Yes:\n"
        "    def __eq__(self, other):\n        return True\n"
        "    def __bool__(self):\n        return True\n"
        "def add(a, b):\n    return Yes()\n"
    )
    run = run_python_tests(code, "assert add(2, 3) == 5\n")
    assert not run.passed and "AssertionError" in run.error
    # Nor can the code replace the builtins the tests use.
    shadow = "def add(a, b):\n    return 0\ndef sorted(x):\n    return [1, 2]\n"
    run = run_python_tests(shadow, "assert sorted([add(1, 1), 1]) == [1, 2]\n")
    assert not run.passed and "AssertionError" in run.error


def test_exit_before_answering_is_a_failure_even_if_the_tests_swallow_it() -> None:
    code = "import os\ndef add(a, b):\n    os._exit(0)\n"
    tests = "try:\n    add(1, 2)\nexcept BaseException:\n    pass\n"
    run = run_python_tests(code, tests)
    assert not run.passed and run.num_failed >= 1
    assert "exited or stopped answering" in run.error


# --- escapes -------------------------------------------------------------------------------------


@needs_jail
def test_forged_report_and_early_exit_are_a_failure() -> None:
    # The attack that fooled the former runner: find the report channel from inside, print a
    # passing report on every channel it can reach, exit 0 before `assert False` runs.
    code = (
        "import json, os, sys\n"
        "main = sys.modules['__main__']\n"
        "seen = [repr(sorted(vars(main))), open('/proc/self/cmdline').read(), repr(os.environ),\n"
        "        repr(os.listdir('/')), repr(os.listdir('/proc/self/fd'))]\n"
        "print('SEEN', seen, flush=True)\n"
        "fake = json.dumps({'num_passed': 9, 'num_failed': 0, 'failures': [], 'error': ''})\n"
        "print('@@maserve-report-0000@@' + fake, flush=True)\n"
        "for fd in range(0, 256):\n"
        "    try:\n"
        "        os.write(fd, (fake + '\\n').encode())\n"
        "    except OSError:\n"
        "        pass\n"
        "os._exit(0)\n"
    )
    run = run_python_tests(code, "assert False\n", policy=JAILED)
    assert not run.passed and run.num_failed >= 1 and run.returncode == 0
    assert "SEEN" in run.stdout
    seen = run.stdout.split("SEEN", 1)[1].splitlines()[0]
    assert "report" not in seen and "judge" not in seen  # nothing names the verdict channel


@needs_jail
def test_the_code_cannot_read_the_tests() -> None:
    code = "import os\ndef visible():\n    return os.path.exists('/judge/tests.py')\n"
    run = run_python_tests(code, "assert visible()\n", policy=JAILED)
    assert not run.passed and "AssertionError" in run.error


@needs_jail
def test_files_outside_cannot_be_read_or_written(tmp_path: Path) -> None:
    secret = tmp_path / "ledger.db"
    secret.write_text("SECRET-ROWS")
    target = tmp_path / "written.txt"
    code = (
        "import os\n"
        "def attempts():\n"
        "    got = {}\n"
        f"    for name, path in (('passwd', '/etc/passwd'), ('ledger', {str(secret)!r}),\n"
        "                       ('home', os.path.expanduser('~root/.bashrc'))):\n"
        "        try:\n"
        "            got[name] = open(path).read()[:40]\n"
        "        except OSError as exc:\n"
        "            got[name] = type(exc).__name__\n"
        f"    for name, path in (('outside', {str(target)!r}), ('code', '/code/x.py')):\n"
        "        try:\n"
        "            open(path, 'w').write('pwned')\n"
        "            got[name] = 'written'\n"
        "        except OSError as exc:\n"
        "            got[name] = type(exc).__name__\n"
        "    open('scratch.txt', 'w').write('ok')  # its own /tmp is writable\n"
        "    got['scratch'] = open('scratch.txt').read()\n"
        "    print(got, flush=True)\n"
        "    return got\n"
    )
    tests = (
        "got = attempts()\n"
        "assert got['scratch'] == 'ok'\n"
        "assert 'root:' in got['passwd'] or got['ledger'] == 'SECRET-ROWS' "
        "or 'written' in got.values()\n"
    )
    run = run_python_tests(code, tests, policy=JAILED)
    assert not run.passed and "AssertionError" in run.error, run
    assert "'scratch': 'ok'" in run.stdout  # the attempts ran
    assert "SECRET-ROWS" not in run.stdout and "root:" not in run.stdout
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ledger.db"]


@needs_jail
def test_network_is_unreachable(listener: socket.socket) -> None:
    port = listener.getsockname()[1]
    run = run_python_tests(_connect_code(port), CONNECTED, policy=JAILED)
    assert not run.passed and "AssertionError" in run.error
    assert "create_connection: " in run.stdout and ": connected" not in run.stdout
    _assert_never_accepted(listener)


@needs_jail
def test_fork_exec_children_stay_in_the_jail(tmp_path: Path, listener: socket.socket) -> None:
    port = listener.getsockname()[1]
    outside = tmp_path / "pwned"
    shell = (
        f"echo in > /tmp/inside; cat /etc/passwd > {outside}; echo pwned >> {outside}; "
        f"exec 3<>/dev/tcp/127.0.0.1/{port}"
    )
    code = (
        "import _posixsubprocess, os\n"
        "def escape():\n"
        "    r, w = os.pipe()\n"
        f"    argv = [b'/bin/bash', b'-c', {shell.encode()!r}]\n"
        "    pid = _posixsubprocess.fork_exec(argv, [argv[0]], True, (w,), None, None,\n"
        "        -1, -1, -1, -1, -1, -1, r, w, True, True, -1, None, None, None, -1, None, False)\n"
        "    os.close(w)\n"
        "    os.read(r, 100)\n"
        "    os.close(r)\n"
        "    os.waitpid(pid, 0)\n"
        "    inside = os.path.exists('/tmp/inside')\n"
        f"    escaped = os.path.exists({str(outside)!r})\n"
        "    print('inside', inside, 'escaped', escaped, flush=True)\n"
        "    return escaped\n"
    )
    if sys.version_info[:2] != (3, 11):
        pytest.skip("the fork_exec call above is written for Python 3.11's signature")
    run = run_python_tests(code, "assert escape()\n", policy=JAILED)
    assert not run.passed and "AssertionError" in run.error
    assert "inside True" in run.stdout  # the child really ran, in the jail
    assert not outside.exists()
    _assert_never_accepted(listener)


@needs_jail
def test_multiprocessing_children_stay_in_the_jail(tmp_path: Path, listener: socket.socket) -> None:
    port = listener.getsockname()[1]
    outside = tmp_path / "pwned"
    code = (
        "import multiprocessing, os, socket\n"
        "def escape():\n"
        "    ctx = multiprocessing.get_context('spawn')\n"
        f"    write = ctx.Process(target=os.system, args=('echo in > /tmp/inside; "
        f"echo pwned > {outside}',))\n"
        f"    dial = ctx.Process(target=socket.create_connection, args=(('127.0.0.1', {port}),))\n"
        "    codes = []\n"
        "    for p in (write, dial):\n"
        "        p.start()\n"
        "        p.join(20)\n"
        "        codes.append(p.exitcode)\n"
        "    inside = os.path.exists('/tmp/inside')\n"
        f"    escaped = os.path.exists({str(outside)!r})\n"
        "    print('inside', inside, 'codes', codes, flush=True)\n"
        "    return escaped or codes[1] == 0\n"
    )
    run = run_python_tests(code, "assert escape()\n", timeout_s=60, policy=JAILED)
    assert not run.passed and "AssertionError" in run.error, run
    assert "inside True" in run.stdout  # the spawned child really ran, in the jail
    assert not outside.exists()
    _assert_never_accepted(listener)


def _setsid_code(token: str, *, linger: bool) -> str:
    return (
        "import subprocess, sys, time\n"
        "child = subprocess.Popen([sys.executable, '-c', "
        f"'import time; time.sleep(600)  # {token}'],\n"
        "                         start_new_session=True, stdout=sys.stdout, stderr=sys.stderr)\n"
        "print('started', child.pid, flush=True)\n" + ("time.sleep(600)\n" if linger else "")
    )


@needs_jail
@pytest.mark.parametrize("linger", [True, False], ids=["code-sleeps", "code-returns"])
def test_setsid_child_holding_stdout_dies_with_the_jail(linger: bool) -> None:
    token = f"maserve-setsid-{uuid.uuid4().hex}"
    limit_s = 5 if linger else 30  # generous where the code returns: a slow start is no timeout
    run = run_python_tests(
        _setsid_code(token, linger=linger), "assert False\n", limit_s, policy=JAILED
    )
    assert "started" in run.stdout  # the child was started
    assert not run.passed and run.timed_out is linger
    assert _pids_running(token) == []


def test_setsid_child_survives_when_unjailed_control() -> None:
    # Control arm: without the jail the same child outlives the run, so the check above can fail.
    token = f"maserve-setsid-{uuid.uuid4().hex}"
    run = run_python_tests(_setsid_code(token, linger=False), "assert False\n", 30, policy=UNJAILED)
    survivors = _pids_running(token)
    for pid in survivors:  # the child this test started, by its pid
        os.kill(pid, signal.SIGKILL)
    assert "started" in run.stdout and not run.passed
    assert survivors


@needs_jail
def test_killing_the_caller_or_its_processes_is_contained() -> None:
    sentinel = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    try:
        code = (
            "import os, signal\n"
            "def kills():\n"
            "    done = []\n"
            f"    for pid in (os.getppid(), {os.getpid()}, {sentinel.pid}):\n"
            "        try:\n"
            "            os.kill(pid, signal.SIGKILL)\n"
            "            done.append(pid)\n"
            "        except OSError:\n"
            "            pass\n"
            "    print('ppid', os.getppid(), 'killed', done, flush=True)\n"
            "    return done\n"
        )
        tests = f"assert {sentinel.pid} in kills() or {os.getpid()} in kills()\n"
        run = run_python_tests(code, tests, policy=JAILED)
        assert sentinel.poll() is None  # the caller's other process is alive (and so are we)
        assert not run.passed and "AssertionError" in run.error
        assert "killed" in run.stdout
    finally:
        sentinel.kill()
        sentinel.wait()


@needs_jail
def test_output_flood_is_capped_in_the_caller() -> None:
    flood_mib = 64
    code = (
        "import sys\n"
        f"for _ in range({flood_mib}):\n"
        "    sys.stdout.write('x' * (1 << 20))\n"
        "sys.stdout.flush()\n"
    )
    cap = 10_000
    tracemalloc.start()
    try:
        run = run_python_tests(code, "", 30, policy=SandboxPolicy(max_output_chars=cap))
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert run.passed and run.output_truncated, run.error
    assert len(run.stdout) == cap + 1 and run.stdout.endswith("x" * cap)
    assert peak < 8 << 20  # the caller held well under the 64 MiB the code wrote


def test_infinite_loop_is_killed_at_timeout() -> None:
    run = run_python_tests("while True:\n    pass\n", "", timeout_s=1.0)
    assert run.timed_out and not run.passed
    assert run.returncode is not None and run.returncode < 0
    assert "timed out" in run.error


@needs_jail
def test_cpu_limit_stops_a_busy_loop_before_the_wall_limit() -> None:
    policy = SandboxPolicy(max_cpu_s=1, allow_unsandboxed=False)
    run = run_python_tests("while True:\n    pass\n", "", timeout_s=60, policy=policy)
    assert not run.passed and not run.timed_out
    assert run.returncode is not None and run.returncode != 0


def test_memory_limit_stops_a_huge_allocation() -> None:
    policy = SandboxPolicy(max_memory_bytes=256 << 20)
    run = run_python_tests("x = bytearray(1 << 30)\n", "", policy=policy)
    assert not run.passed and "MemoryError" in run.error


@needs_jail
def test_file_size_tmp_size_and_process_limits() -> None:
    policy = SandboxPolicy(
        max_file_bytes=1 << 20, max_tmp_bytes=4 << 20, max_processes=8, allow_unsandboxed=False
    )
    code = (
        "import os, time\n"
        "def big_file():\n"
        "    with open('big', 'wb') as f:\n"
        "        f.write(b'x' * (2 << 20))\n"
        "def many_files():\n"
        "    for i in range(8):\n"
        "        with open(f'part{i}', 'wb') as f:\n"
        "            f.write(b'x' * (1 << 20))\n"
        "def many_processes():\n"
        "    pids = []\n"
        "    try:\n"
        "        for _ in range(64):\n"
        "            pid = os.fork()\n"
        "            if pid == 0:\n"
        "                time.sleep(30)\n"
        "                os._exit(0)\n"
        "            pids.append(pid)\n"
        "    finally:\n"
        "        for pid in pids:\n"
        "            os.kill(pid, 9)\n"
        "            os.waitpid(pid, 0)\n"
        "    return len(pids)\n"
    )
    tests = (
        "def test_big_file():\n    big_file()\n"
        "def test_many_files():\n    many_files()\n"
        "def test_many_processes():\n    assert many_processes() == 64\n"
    )
    run = run_python_tests(code, tests, 30, policy=policy)
    failures = dict(f.split(":", 1) for f in run.failures)
    assert sorted(failures) == ["test_big_file", "test_many_files", "test_many_processes"]
    assert "File too large" in failures["test_big_file"]
    assert "No space left" in failures["test_many_files"]
    assert "BlockingIOError" in failures["test_many_processes"]


# --- no jail: refuse, unless the user opts in ------------------------------------------------------


def test_without_a_jail_untrusted_code_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(ALLOW_UNSANDBOXED_ENV, raising=False)
    monkeypatch.setenv(BWRAP_ENV, "/nonexistent/bwrap")
    with pytest.raises(SandboxUnavailableError) as caught:
        run_python_tests(ADD, "assert add(2, 3) == 5\n")
    message = str(caught.value)
    assert "\n" not in message and ALLOW_UNSANDBOXED_ENV in message and "bubblewrap" in message
    result = call_tool("run_tests", code=ADD, tests="assert add(2, 3) == 5\n")
    assert not result.ok and "refusing to run untrusted code" in result.error


def test_opting_in_runs_unjailed_and_says_so(
    monkeypatch: pytest.MonkeyPatch, listener: socket.socket
) -> None:
    monkeypatch.setenv(BWRAP_ENV, "/nonexistent/bwrap")
    monkeypatch.setenv(ALLOW_UNSANDBOXED_ENV, "1")
    run = run_python_tests(ADD, "assert add(2, 3) == 5\n")
    assert run.passed and run.isolation == "none"
    # Control arm for the network test: unjailed, the same probe does connect.
    port = listener.getsockname()[1]
    probe = run_python_tests(_connect_code(port), CONNECTED, policy=UNJAILED)
    assert probe.passed and "create_connection: connected" in probe.stdout


@needs_jail
def test_code_binding_test_tool_isolates_and_times_out(listener: socket.socket) -> None:
    port = listener.getsockname()[1]
    result = call_tool("run_tests", code=_connect_code(port), tests=CONNECTED, timeout_s=10)
    assert result.ok and not result.output["passed"], result
    assert result.output["isolation"] == "bwrap"
    _assert_never_accepted(listener)
    slow = call_tool("run_tests", code="import time\ntime.sleep(60)\n", tests="", timeout_s=1)
    assert not slow.ok and "timed out" in slow.error
    assert slow.output["timed_out"] is True


def test_jail_argv_binds_no_home_etc_or_network() -> None:
    argv = jail_argv("bwrap", [("/host/task", "/code")], as_root=False, tmp_bytes=1 << 20)
    for flag in ("--unshare-net", "--unshare-pid", "--die-with-parent", "--new-session"):
        assert flag in argv
    assert "--unshare-user" in argv and "--cap-add" not in argv
    sources = [argv[i + 1] for i, a in enumerate(argv) if a in ("--bind", "--ro-bind")]
    assert "/" not in sources and "/etc" not in sources and "/home" not in sources
    assert "--bind" not in argv  # nothing of the host is writable
    assert ["--ro-bind", "/host/task", "/code"] == argv[argv.index("/host/task") - 1 :][:3]
    root = jail_argv("bwrap", [], as_root=True, tmp_bytes=1 << 20)
    assert "--unshare-user" not in root and "CAP_SETUID" in root
