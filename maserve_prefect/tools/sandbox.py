"""Sandboxed execution of Python code and its unit tests: a subprocess, a timeout, no network.

`run_python_tests(code, tests)` writes the code and an assert-based test source into a fresh
temporary directory and runs them in a child `python -I` (isolated mode: no user site, no
`PYTHON*` variables, no current directory on `sys.path`) with a minimal environment. Layers,
each of which holds on its own:

1. **Network namespace.** Where `unshare -rn` works (checked once per process, cached), the child
   runs in a fresh user + network namespace: no interfaces except a loopback that is down, so not
   even 127.0.0.1 is reachable.
2. **Python guard.** Before user code runs, a runner shim installs an audit hook (`sys.addaudithook`
   cannot be removed) that refuses socket connect / bind / sendto / name lookups and starting
   processes (`subprocess`, `os.system`, `os.exec*`, `os.fork`, `os.posix_spawn`), and replaces
   `socket.socket.connect` and `socket.create_connection` to raise. This holds where `unshare`
   is unavailable (containers without user namespaces). It stops honest-but-buggy code, not a
   determined attacker with `ctypes`; layer 1 is the real barrier where it exists.
3. **Resource limits.** The shim lowers RLIMIT_CPU, RLIMIT_AS and RLIMIT_FSIZE (soft = hard, so
   user code cannot raise them). This is done in the child rather than in a `preexec_fn`, because
   `preexec_fn` is unsafe in a process with threads (Prefect runs tasks on threads).
4. **Timeout.** The child leads its own session (`start_new_session=True`); at the timeout the whole
   process group gets SIGKILL (`os.killpg`), and the run is reported as timed out.

Tests: the test source runs after the code in the same namespace; top-level `assert`s must hold,
and every top-level `test_*` callable is then called. The run passes iff the code and the test
source executed without error and every `test_*` function passed. The runner reports its counts
on stdout behind a per-run random marker, and the parent also requires exit status 0.

Examples:
    >>> run = run_python_tests("def add(a, b):\\n    return a + b\\n", "assert add(2, 3) == 5\\n")
    >>> (run.passed, run.timed_out)
    (True, False)
"""

from __future__ import annotations

import functools
import json
import math
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from maserve_prefect.errors import ConfigError

_RUNNER = r"""
import json, resource, sys, traceback
cfg = json.loads(sys.argv[1])
marker = cfg["marker"]
del sys.argv[1:]
for kind, value in ((resource.RLIMIT_CPU, cfg["max_cpu_s"]), (resource.RLIMIT_AS, cfg["max_memory_bytes"]),
                    (resource.RLIMIT_FSIZE, cfg["max_file_bytes"])):
    resource.setrlimit(kind, (value, value))
with open("solution.py", encoding="utf-8") as f:
    code = f.read()
with open("tests.py", encoding="utf-8") as f:
    tests = f.read()
if cfg["python_guard"]:
    import socket
    BLOCKED = frozenset({
        "socket.connect", "socket.bind", "socket.sendto", "socket.sendmsg", "socket.getaddrinfo",
        "socket.gethostbyname", "socket.gethostbyaddr", "subprocess.Popen", "os.system", "os.exec",
        "os.posix_spawn", "os.spawn", "os.fork", "os.forkpty", "pty.spawn", "ctypes.dlopen",
    })
    def _refuse(*args, **kwargs):
        raise PermissionError("network access is disabled in the maserve sandbox")
    def _hook(event, args):
        if event in BLOCKED:
            raise PermissionError(f"{event} is disabled in the maserve sandbox")
    socket.socket.connect = _refuse
    socket.socket.connect_ex = _refuse
    socket.create_connection = _refuse
    sys.addaudithook(_hook)
report = {"num_passed": 0, "num_failed": 0, "failures": [], "error": ""}
def _short(exc):
    lines = traceback.format_exception(exc)
    return "".join(lines[-3:]).strip()[-800:]
try:
    ns = {"__name__": "__main__"}
    exec(compile(code, "solution.py", "exec"), ns)
    exec(compile(tests, "tests.py", "exec"), ns)
    report["num_passed"] += 1
    for name, fn in list(ns.items()):
        if name.startswith("test_") and callable(fn):
            try:
                fn()
                report["num_passed"] += 1
            except Exception as exc:
                report["num_failed"] += 1
                report["failures"].append(f"{name}: {_short(exc)}")
except BaseException as exc:
    report["num_failed"] += 1
    report["error"] = _short(exc)
sys.stdout.flush()
print("\n" + marker + json.dumps(report), flush=True)
sys.exit(0 if report["num_failed"] == 0 else 1)
"""


@dataclass(frozen=True, slots=True)
class SandboxPolicy:
    """Limits for one sandboxed run.

    Attributes:
        timeout_s: wall-clock limit; the process group is killed at it.
        max_cpu_s: CPU-seconds limit (RLIMIT_CPU); None = ceil(timeout_s) + 1.
        max_memory_bytes: address-space limit (RLIMIT_AS).
        max_file_bytes: largest file the code may write (RLIMIT_FSIZE).
        max_output_chars: stdout / stderr kept in the result (tail).
        network_namespace: run under `unshare -rn` when available.
        python_guard: install the in-process socket / process guard.
    """

    timeout_s: float = 10.0
    max_cpu_s: int | None = None
    max_memory_bytes: int = 1 << 30
    max_file_bytes: int = 16 << 20
    max_output_chars: int = 20_000
    network_namespace: bool = True
    python_guard: bool = True

    def __post_init__(self) -> None:
        if not self.timeout_s > 0:
            raise ConfigError(f"sandbox timeout_s must be > 0, got {self.timeout_s}")
        if self.max_memory_bytes < 64 << 20:
            raise ConfigError(
                f"sandbox max_memory_bytes={self.max_memory_bytes} is below 64 MiB; "
                "the Python interpreter itself needs more"
            )


@dataclass(frozen=True, slots=True)
class SandboxRun:
    """The outcome of one sandboxed run.

    Attributes:
        passed: code and tests ran, every check passed, exit status 0.
        num_passed / num_failed: checks (the test source counts as one, plus each `test_*`).
        timed_out: killed at the timeout.
        returncode: the child's exit status (negative = signal), None if unknown.
        failures: one line per failed `test_*` function.
        error: the exception that stopped the code or test source, or a sandbox message.
        stdout / stderr: the tails of the child's output (runner report removed).
        isolation: the network layers used, e.g. "netns+guard", "guard", "none".
        duration_s: measured wall duration.
    """

    passed: bool
    num_passed: int
    num_failed: int
    timed_out: bool
    returncode: int | None
    failures: tuple[str, ...]
    error: str
    stdout: str
    stderr: str
    isolation: str
    duration_s: float

    def to_dict(self) -> dict[str, object]:
        """JSON-serializable fields (for tool outputs and trace payloads)."""
        return {
            "passed": self.passed,
            "num_passed": self.num_passed,
            "num_failed": self.num_failed,
            "timed_out": self.timed_out,
            "returncode": self.returncode,
            "failures": list(self.failures),
            "error": self.error,
            "stdout": self.stdout,
            "stderr": self.stderr,
            "isolation": self.isolation,
        }


@functools.cache
def network_namespace_available() -> bool:
    """Whether `unshare -rn` can start this interpreter in a fresh network namespace (probed once).

    The probe also checks that the namespace really has no usable network: binding 127.0.0.1
    must fail there because its loopback is down.
    """
    unshare = shutil.which("unshare")
    if unshare is None:
        return False
    probe = (
        "import socket\n"
        "s = socket.socket()\n"
        "try:\n    s.connect(('127.0.0.1', 9))\nexcept OSError as e:\n"
        "    raise SystemExit(0 if e.errno == 101 else 3)\n"
        "raise SystemExit(4)\n"
    )
    try:
        proc = subprocess.run(
            [unshare, "--map-root-user", "--net", sys.executable, "-I", "-c", probe],
            capture_output=True,
            timeout=10,
        )
    except (OSError, subprocess.SubprocessError):
        return False
    return proc.returncode == 0


def _tail(text: str, limit: int) -> str:
    return text if len(text) <= limit else "…" + text[-limit:]


def _split_report(stdout: str, marker: str) -> tuple[str, dict[str, Any] | None]:
    head, sep, rest = stdout.rpartition(marker)
    if not sep:
        return stdout, None
    try:
        report = json.loads(rest.strip().splitlines()[0])
    except (ValueError, IndexError):
        return stdout, None
    return head.rstrip("\n"), report if isinstance(report, dict) else None


def _kill_group(pid: int) -> None:
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def run_python_tests(
    code: str,
    tests: str = "",
    timeout_s: float | None = None,
    *,
    policy: SandboxPolicy | None = None,
) -> SandboxRun:
    """Run `code` then the assert-based `tests` in a sandboxed subprocess.

    Args:
        code: Python source under test (e.g. a model's solution).
        tests: test source run after `code` in the same namespace (asserts, `test_*` functions).
        timeout_s: wall-clock limit; overrides `policy.timeout_s` when given.
        policy: limits and isolation layers (defaults: `SandboxPolicy()`).

    Returns:
        A `SandboxRun`; a timeout is a result (`timed_out=True`, `passed=False`), not an error.

    Examples:
        >>> run_python_tests("x = 1", "assert x == 2").passed
        False
    """
    policy = policy or SandboxPolicy()
    limit_s = policy.timeout_s if timeout_s is None else timeout_s
    if not limit_s > 0:
        raise ConfigError(f"sandbox timeout_s must be > 0, got {limit_s}")
    marker = f"@@maserve-report-{secrets.token_hex(8)}@@"
    cfg = {
        "marker": marker,
        "max_cpu_s": policy.max_cpu_s or math.ceil(limit_s) + 1,
        "max_memory_bytes": policy.max_memory_bytes,
        "max_file_bytes": policy.max_file_bytes,
        "python_guard": policy.python_guard,
    }
    use_netns = policy.network_namespace and network_namespace_available()
    layers = [name for name, on in (("netns", use_netns), ("guard", policy.python_guard)) if on]
    isolation = "+".join(layers) or "none"
    with tempfile.TemporaryDirectory(prefix="maserve-sandbox-") as tmp:
        work = Path(tmp)
        (work / "solution.py").write_text(code, encoding="utf-8")
        (work / "tests.py").write_text(tests, encoding="utf-8")
        (work / "_runner.py").write_text(_RUNNER, encoding="utf-8")
        argv = [sys.executable, "-I", "_runner.py", json.dumps(cfg)]
        if use_netns:
            argv = [shutil.which("unshare") or "unshare", "--map-root-user", "--net", *argv]
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": tmp, "LANG": "C.UTF-8"}
        start = time.perf_counter()
        proc = subprocess.Popen(
            argv,
            cwd=work,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=True,
        )
        timed_out = False
        try:
            out_b, err_b = proc.communicate(timeout=limit_s)
        except subprocess.TimeoutExpired:
            timed_out = True
            _kill_group(proc.pid)
            out_b, err_b = proc.communicate()
        duration_s = time.perf_counter() - start
        _kill_group(proc.pid)  # leftovers the code may have started in its group
    stdout, report = _split_report(out_b.decode("utf-8", "replace"), marker)
    stderr = err_b.decode("utf-8", "replace")
    if timed_out:
        error = f"timed out after {limit_s:g} s; process group killed"
    elif report is None:
        error = f"sandboxed process exited with status {proc.returncode} before reporting"
    else:
        error = str(report.get("error", ""))
    counted = report if report is not None and not timed_out else {}
    num_passed = int(counted.get("num_passed", 0))
    num_failed = int(counted.get("num_failed", 0))
    failures = tuple(str(f) for f in counted.get("failures", ()))
    passed = not timed_out and report is not None and num_failed == 0 and proc.returncode == 0
    return SandboxRun(
        passed=passed,
        num_passed=num_passed,
        num_failed=num_failed,
        timed_out=timed_out,
        returncode=proc.returncode,
        failures=failures,
        error=error,
        stdout=_tail(stdout, policy.max_output_chars),
        stderr=_tail(stderr, policy.max_output_chars),
        isolation=isolation,
        duration_s=duration_s,
    )
