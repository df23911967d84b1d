"""The sandbox: tests pass / fail, timeouts kill the process group, no network either way."""

from __future__ import annotations

import socket
from collections.abc import Iterator

import pytest

from maserve_prefect.tools import call_tool
from maserve_prefect.tools.sandbox import (
    SandboxPolicy,
    network_namespace_available,
    run_python_tests,
)

ADD = "def add(a, b):\n    return a + b\n"


@pytest.fixture
def listener() -> Iterator[socket.socket]:
    """A TCP listener on 127.0.0.1 in the test process (non-blocking, so accept() can probe)."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    sock.listen(8)
    sock.setblocking(False)
    yield sock
    sock.close()


def _connect_code(port: int) -> str:
    # Tries the three usual ways; prints what happened so the test can show it on failure.
    return (
        "import socket\n"
        "outcomes = []\n"
        "for attempt in ('create_connection', 'connect', 'raw'):\n"
        "    try:\n"
        "        if attempt == 'create_connection':\n"
        f"            socket.create_connection(('127.0.0.1', {port}), timeout=2)\n"
        "        elif attempt == 'connect':\n"
        f"            socket.socket().connect(('127.0.0.1', {port}))\n"
        "        else:\n"
        "            import _socket\n"
        f"            _socket.socket().connect(('127.0.0.1', {port}))\n"
        "        outcomes.append(attempt + ': connected')\n"
        "    except OSError as exc:\n"
        "        outcomes.append(f'{attempt}: {type(exc).__name__}')\n"
        "print(outcomes)\n"
        "assert not any(o.endswith('connected') for o in outcomes), outcomes\n"
    )


def _assert_never_accepted(sock: socket.socket) -> None:
    with pytest.raises(BlockingIOError):
        sock.accept()


def test_correct_solution_passes_and_wrong_one_fails() -> None:
    tests = "assert add(2, 3) == 5\ndef test_negative():\n    assert add(-1, -1) == -2\n"
    good = run_python_tests(ADD, tests)
    assert good.passed and good.num_passed == 2 and good.num_failed == 0
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


@pytest.mark.parametrize(
    "policy",
    [
        SandboxPolicy(network_namespace=True, python_guard=True),
        SandboxPolicy(network_namespace=False, python_guard=True),
        pytest.param(
            SandboxPolicy(network_namespace=True, python_guard=False),
            marks=pytest.mark.skipif(
                not network_namespace_available(), reason="unshare -rn unavailable here"
            ),
        ),
    ],
    ids=["both-layers", "guard-only", "netns-only"],
)
def test_code_cannot_reach_a_local_listener(listener: socket.socket, policy: SandboxPolicy) -> None:
    port = listener.getsockname()[1]
    run = run_python_tests(_connect_code(port), "", policy=policy)
    assert run.passed, (run.error, run.stdout, run.stderr)
    assert ": connected" not in run.stdout
    _assert_never_accepted(listener)


def test_without_isolation_the_probe_does_connect(listener: socket.socket) -> None:
    # Control arm: proves the probe above would notice a working connection.
    port = listener.getsockname()[1]
    policy = SandboxPolicy(network_namespace=False, python_guard=False)
    run = run_python_tests(_connect_code(port), "", policy=policy)
    assert not run.passed
    assert "create_connection: connected" in run.stdout


def test_infinite_loop_is_killed_at_timeout() -> None:
    run = run_python_tests("while True:\n    pass\n", "", timeout_s=1.0)
    assert run.timed_out and not run.passed
    assert run.returncode is not None and run.returncode < 0
    assert "timed out" in run.error


def test_code_binding_test_tool_isolates_and_times_out(listener: socket.socket) -> None:
    port = listener.getsockname()[1]
    result = call_tool("run_tests", code=_connect_code(port), tests="", timeout_s=10)
    assert result.ok and result.output["passed"], result
    _assert_never_accepted(listener)
    slow = call_tool("run_tests", code="import time\ntime.sleep(60)\n", tests="", timeout_s=1)
    assert not slow.ok and "timed out" in slow.error
    assert slow.output["timed_out"] is True


def test_subprocesses_are_refused_by_the_guard() -> None:
    code = "import subprocess\nsubprocess.run(['true'])\n"
    run = run_python_tests(code, "", policy=SandboxPolicy(network_namespace=False))
    assert not run.passed and "subprocess.Popen is disabled" in run.error


def test_memory_limit_stops_a_huge_allocation() -> None:
    policy = SandboxPolicy(max_memory_bytes=256 << 20)
    run = run_python_tests("x = bytearray(1 << 30)\n", "", policy=policy)
    assert not run.passed and "MemoryError" in run.error


def test_exit_before_report_is_not_a_pass() -> None:
    run = run_python_tests("import os\nos._exit(0)\n", "assert False\n")
    assert not run.passed and "before reporting" in run.error
