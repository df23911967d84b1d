"""Jailed execution of untrusted Python code against trusted unit tests.

`run_python_tests(code, tests)` runs the code under test and the tests in two separate processes,
each in its own bubblewrap (`bwrap`) jail, and takes the verdict from the one the code cannot
reach:

- **code process** (`server`): executes `code`, announces its top-level names (plain data by
  value, everything else as a handle) and then only answers requests — call a function, read an
  attribute, iterate — with plain data (None, bool, int, float, str, bytes, list, tuple, dict,
  set) or handles. Its stdout / stderr are what the result shows as output.
- **judge process**: executes `tests` with proxies for the code's names, so `add(2, 3)` becomes a
  request to the code process and the comparison `== 5` happens in the judge on plain data (an
  object whose `__eq__` always says yes never leaves the code process). The judge writes its
  report to a pipe only it and the caller hold; the code process has no path to that pipe, to
  the judge's memory, files or PID namespace. Printing a fake report, exiting 0 early or killing
  things changes nothing: the run passes only when the judge saw every check pass.

Each jail (`bwrap`) has: a read-only view of /usr, the interpreter's prefix and its own task
files only (no /etc beyond `ld.so.cache`, no home, no ledger, no MASERVE_HOME; the tests are not
visible to the code), a private size-limited writable /tmp (the working directory), no network
(`--unshare-net`: only a loopback that is down), its own PID / IPC / UTS namespaces with
`--die-with-parent` and `--new-session` (it cannot see or signal the caller, and when the jail's
first process dies the kernel kills everything it started), and, set by a trusted prologue before
any untrusted line runs (soft = hard, so they cannot be raised): RLIMIT_CPU, RLIMIT_AS,
RLIMIT_FSIZE, RLIMIT_NPROC, RLIMIT_NOFILE and no core files. Run as root, the jail keeps no user
namespace and the prologue drops to a fresh unprivileged uid per process (root is exempt from
RLIMIT_NPROC, and two jails of one run never share a uid); run as a user, bwrap's user namespace
does that job.

The caller reads every pipe with a deadline: output is capped (the last `max_output_chars` are
kept, the rest is drained and discarded, so a flood cannot grow the caller), and at the wall-time
limit both jails are SIGKILLed, which tears down their PID namespaces, so a `setsid` child that
keeps stdout open cannot stretch the limit.

Where the jail cannot be set up (no `bwrap`, or the kernel refuses its namespaces) the run is
refused with `SandboxUnavailableError` unless the user opts in with `MASERVE_ALLOW_UNSANDBOXED=1`
(or `SandboxPolicy(allow_unsandboxed=True)`): the same two processes then run without any
isolation (`isolation="none"`). `MASERVE_BWRAP` names another bwrap binary.

The tests see the code's top-level names except those that would shadow builtins (`len`,
`sorted`...). Limits of the protocol: values cross between the processes as plain data, so tests may pass
plain data (and handles the code returned) to the code, not their own functions or objects, and
an argument the code mutates in place is not seen by the test.

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
import selectors
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

ALLOW_UNSANDBOXED_ENV = "MASERVE_ALLOW_UNSANDBOXED"
BWRAP_ENV = "MASERVE_BWRAP"

_REPORT_CAP = 1 << 20  # the judge's report; larger is a broken judge
_GRACE_S = 1.0  # the code process's time to exit once the judge has reported
_DRAIN_S = 2.0  # reading what is left after a kill
_UID_RANGE = (200_000, 1_000_000_000)

# Shared by both processes: the trusted prologue (limits, uid) and the plain-data codec.
_COMMON = r"""
import json, os, resource, sys

def _setup():
    cfg = json.loads(sys.argv[1])
    del sys.argv[1:]
    limits = [("CPU", cfg["cpu_s"]), ("AS", cfg["memory"]), ("FSIZE", cfg["fsize"]),
              ("NOFILE", 256), ("CORE", 0)]
    if cfg["nproc"] is not None:
        limits.append(("NPROC", cfg["nproc"]))
    for name, value in limits:
        resource.setrlimit(getattr(resource, "RLIMIT_" + name), (value, value))
    uid = cfg["uid"]
    if uid is not None:
        os.setgroups([])
        os.setresgid(uid, uid, uid)
        os.setresuid(uid, uid, uid)
    return cfg

_PLAIN = (type(None), bool, int, float, str)
_SEQ = {tuple: "$t", set: "$s", frozenset: "$z"}

def _enc(value, handle, depth=0):
    if depth > 100:
        raise ValueError("value nested more than 100 levels deep")
    kind = type(value)
    if kind in _PLAIN:
        return value
    if kind is list:
        return [_enc(x, handle, depth + 1) for x in value]
    if kind in _SEQ:
        return {_SEQ[kind]: [_enc(x, handle, depth + 1) for x in value]}
    if kind is dict:
        return {"$d": [[_enc(k, handle, depth + 1), _enc(v, handle, depth + 1)]
                       for k, v in value.items()]}
    if kind is bytes:
        return {"$b": value.hex()}
    if kind is complex:
        return {"$c": [value.real, value.imag]}
    return handle(value)

def _dec(value, resolve):
    if isinstance(value, list):
        return [_dec(x, resolve) for x in value]
    if not isinstance(value, dict):
        return value
    if len(value) != 1:
        raise ValueError("malformed value")
    ((tag, body),) = value.items()
    if tag == "$h":
        return resolve(body)
    if tag == "$b":
        return bytes.fromhex(body)
    if tag == "$c":
        return complex(*body)
    items = [_dec(x, resolve) for x in body]
    if tag == "$t":
        return tuple(items)
    if tag == "$s":
        return set(items)
    if tag == "$z":
        return frozenset(items)
    if tag == "$d":
        return {k: v for k, v in items}
    raise ValueError("malformed value")

def _write_all(fd, data):
    while data:
        data = data[os.write(fd, data):]
"""

_SERVER = (
    _COMMON
    + r"""
import traceback, types

def _main():
    cfg = _setup()
    rx = os.fdopen(cfg["rx"], "r", encoding="utf-8", newline="\n")
    tx = cfg["tx"]
    objects = {}

    def handle(obj):
        objects[id(obj)] = obj
        try:
            text = repr(obj)[:200]
        except BaseException:
            text = "<object>"
        return {"$h": [id(obj), text]}

    def send(msg):
        _write_all(tx, (json.dumps(msg) + "\n").encode("utf-8"))

    def failure(exc):
        names = [c.__name__ for c in type(exc).__mro__]
        tail = "".join(traceback.format_exception(exc)[-3:]).strip()[-800:]
        return {"e": names, "m": str(exc)[:2000], "tb": tail}

    ns = {"__name__": "__main__"}
    try:
        with open(cfg["code"], encoding="utf-8") as f:
            source = f.read()
        exec(compile(source, "solution.py", "exec"), ns)
    except BaseException as exc:
        sys.stdout.flush()
        send({"load": failure(exc)})
        os._exit(1)
    names = {}
    for name, value in list(ns.items()):
        if name.startswith("__"):
            continue
        if isinstance(value, types.ModuleType):
            names[name] = {"$m": value.__name__}
            continue
        try:
            names[name] = _enc(value, handle)
        except (ValueError, RecursionError):
            names[name] = handle(value)
    sys.stdout.flush()
    send({"names": names})
    for line in rx:
        try:
            req = json.loads(line)
            target = objects[req["h"]]
            op = req["op"]
            if op == "call":
                args = _dec(req["a"], lambda b: objects[b[0]])
                kwargs = _dec(req["k"], lambda b: objects[b[0]])
                result = target(*args, **kwargs)
            elif op == "getattr":
                result = getattr(target, req["n"])
            elif op == "iter":
                result = list(target)
            else:
                raise ValueError(f"unknown request {op!r}")
            reply = {"v": _enc(result, handle)}
        except BaseException as exc:
            reply = failure(exc)
        sys.stdout.flush()
        send(reply)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)

if __name__ == "__main__":
    _main()
"""
)

_JUDGE = (
    _COMMON
    + r'''
import builtins, importlib, traceback

class _Broken(BaseException):
    """The code process died or broke the protocol; not catchable by `except Exception`."""

class RemoteError(Exception):
    """An exception of the code under test with no builtin counterpart."""

def _main():
    cfg = _setup()
    rx = os.fdopen(cfg["rx"], "r", encoding="utf-8", newline="\n")
    tx = cfg["tx"]
    state = {"broken": ""}
    classes = {}

    def broken(why):
        state["broken"] = state["broken"] or why
        return _Broken(state["broken"])

    def recv():
        if state["broken"]:
            raise _Broken(state["broken"])
        line = rx.readline(cfg["line_cap"])
        if not line:
            raise broken("the code under test exited or stopped answering")
        if not line.endswith("\n"):
            raise broken("the code under test sent an oversized reply")
        try:
            msg = json.loads(line)
        except (ValueError, RecursionError):
            raise broken("the code under test sent a malformed reply") from None
        if not isinstance(msg, dict):
            raise broken("the code under test sent a malformed reply")
        return msg

    def remote_exception(msg):
        names, text = msg.get("e"), str(msg.get("m", ""))
        if not isinstance(names, list) or not names or not all(isinstance(n, str) for n in names):
            return broken("the code under test sent a malformed reply")
        base = RemoteError
        for name in names:
            cls = getattr(builtins, name, None)
            if isinstance(cls, type) and issubclass(cls, Exception):
                base = cls
                break
        key = (names[0], base)
        if key not in classes:
            classes[key] = base if names[0] == base.__name__ else type(names[0], (base,), {})
        try:
            return classes[key](text)
        except Exception:  # a builtin with a special constructor (UnicodeDecodeError...)
            return RemoteError(f"{names[0]}: {text}")

    def outgoing(obj):
        if isinstance(obj, Remote):
            return {"$h": [object.__getattribute__(obj, "_h"), ""]}
        raise TypeError(f"cannot pass {type(obj).__name__} to the code under test "
                        "(plain data and values it returned only)")

    def request(**req):
        if state["broken"]:
            raise _Broken(state["broken"])
        try:
            _write_all(tx, (json.dumps(req) + "\n").encode("utf-8"))
        except OSError:
            raise broken("the code under test exited or stopped answering") from None
        msg = recv()
        if "v" in msg:
            try:
                return _dec(msg["v"], proxy)
            except (ValueError, TypeError, KeyError, RecursionError):
                raise broken("the code under test sent a malformed reply") from None
        if "e" in msg:
            raise remote_exception(msg)
        raise broken("the code under test sent a malformed reply")

    class Remote:
        """A value that stays in the code process; compares by identity only."""

        __slots__ = ("_h", "_r")

        def __call__(self, *args, **kwargs):
            return request(op="call", h=self._h, a=_enc(list(args), outgoing),
                           k=_enc(dict(kwargs), outgoing))

        def __getattr__(self, name):
            return request(op="getattr", h=object.__getattribute__(self, "_h"), n=name)

        def __iter__(self):
            return iter(request(op="iter", h=self._h))

        def __repr__(self):
            return self._r

    def proxy(body):
        if not (isinstance(body, list) and len(body) == 2 and isinstance(body[0], int)):
            raise ValueError("malformed handle")
        obj = Remote()
        object.__setattr__(obj, "_h", body[0])
        object.__setattr__(obj, "_r", str(body[1]))
        return obj

    report = {"num_passed": 0, "num_failed": 0, "failures": [], "error": ""}

    def short(exc):
        return "".join(traceback.format_exception(exc)[-3:]).strip()[-800:]

    try:
        hello = recv()
        if "load" in hello:
            load = hello["load"] if isinstance(hello["load"], dict) else {}
            report["num_failed"] = 1
            report["error"] = str(load.get("tb") or load.get("m") or "the code failed to load")
        else:
            ns = {"__name__": "__main__"}
            names = hello.get("names")
            if not isinstance(names, dict):
                raise broken("the code under test sent a malformed reply")
            for name, value in names.items():
                if hasattr(builtins, name):  # the tests always see the real builtins
                    continue
                if isinstance(value, dict) and set(value) == {"$m"}:
                    try:
                        ns[name] = importlib.import_module(str(value["$m"]))
                    except Exception:
                        pass
                    continue
                try:
                    ns[name] = _dec(value, proxy)
                except (ValueError, TypeError, RecursionError):
                    raise broken("the code under test sent a malformed reply") from None
            with open(cfg["tests"], encoding="utf-8") as f:
                tests = f.read()
            try:
                exec(compile(tests, "tests.py", "exec"), ns)
                report["num_passed"] += 1
                for name, fn in list(ns.items()):
                    if name.startswith("test_") and callable(fn) and not isinstance(fn, Remote):
                        try:
                            fn()
                            report["num_passed"] += 1
                        except Exception as exc:
                            report["num_failed"] += 1
                            report["failures"].append(f"{name}: {short(exc)}")
            except _Broken:
                raise
            except BaseException as exc:
                report["num_failed"] += 1
                report["error"] = short(exc)
    except _Broken:
        pass
    if state["broken"]:
        report["num_failed"] = max(report["num_failed"], 1)
        report["error"] = report["error"] or state["broken"]
    try:
        os.close(tx)
    except OSError:
        pass
    _write_all(cfg["report"], json.dumps(report).encode("utf-8"))
    os._exit(0)

if __name__ == "__main__":
    _main()
'''
)


class SandboxUnavailableError(ConfigError):
    """The jail cannot be set up and running without one was not allowed."""


@dataclass(frozen=True, slots=True)
class SandboxPolicy:
    """Limits for one sandboxed run.

    Attributes:
        timeout_s: wall-clock limit; both jails are killed at it.
        max_cpu_s: CPU-seconds limit per process (RLIMIT_CPU); None = ceil(timeout_s) + 1.
        max_memory_bytes: address-space limit of the code process (RLIMIT_AS).
        max_file_bytes: largest file the code may write (RLIMIT_FSIZE).
        max_tmp_bytes: size of the jail's writable /tmp (tmpfs).
        max_processes: processes the code may have at once (RLIMIT_NPROC, jailed runs only).
        max_output_chars: stdout / stderr kept in the result (the tail; the rest is discarded).
        bwrap: the bubblewrap binary; None = `$MASERVE_BWRAP`, else `bwrap` on PATH.
        allow_unsandboxed: run without a jail when none can be set up; None =
            `MASERVE_ALLOW_UNSANDBOXED=1` in the environment.
    """

    timeout_s: float = 10.0
    max_cpu_s: int | None = None
    max_memory_bytes: int = 1 << 30
    max_file_bytes: int = 16 << 20
    max_tmp_bytes: int = 64 << 20
    max_processes: int = 32
    max_output_chars: int = 20_000
    bwrap: str | None = None
    allow_unsandboxed: bool | None = None

    def __post_init__(self) -> None:
        if not self.timeout_s > 0:
            raise ConfigError(f"sandbox timeout_s must be > 0, got {self.timeout_s}")
        if self.max_memory_bytes < 64 << 20:
            raise ConfigError(
                f"sandbox max_memory_bytes={self.max_memory_bytes} is below 64 MiB; "
                "the Python interpreter itself needs more"
            )
        if self.max_processes < 1 or self.max_output_chars < 1 or self.max_tmp_bytes < 1 << 20:
            raise ConfigError(
                "sandbox max_processes and max_output_chars must be >= 1 and max_tmp_bytes "
                f">= 1 MiB, got {self.max_processes}, {self.max_output_chars}, "
                f"{self.max_tmp_bytes}"
            )


@dataclass(frozen=True, slots=True)
class SandboxRun:
    """The outcome of one sandboxed run.

    Attributes:
        passed: the judge saw the code load and every check pass.
        num_passed / num_failed: checks (the test source counts as one, plus each `test_*`).
        timed_out: killed at the wall-time limit before the judge reported.
        returncode: the code process's exit status (negative = signal), None if unknown.
        failures: one line per failed `test_*` function.
        error: the exception that stopped the code or test source, or a sandbox message.
        stdout / stderr: the tails of the code process's output.
        isolation: "bwrap" (jailed) or "none" (unsandboxed, opted in).
        duration_s: measured wall duration.
        output_truncated: stdout or stderr was longer than the cap and cut to its tail.
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
    output_truncated: bool = False

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
            "output_truncated": self.output_truncated,
        }


def _interpreter() -> str:
    """The base interpreter (outside any virtualenv): the jail holds its prefix only."""
    return os.path.realpath(getattr(sys, "_base_executable", None) or sys.executable)


def _ro_tree(path: str, covered: list[str]) -> list[str]:
    """bwrap arguments binding `path` read-only, its parents created world-traversable."""
    if path == "/" or any(path == c or path.startswith(c.rstrip("/") + "/") for c in covered):
        return []
    args: list[str] = []
    parts = Path(path).parts[1:-1]
    for i in range(len(parts)):
        parent = "/" + "/".join(parts[: i + 1])
        if parent not in covered:
            args += ["--perms", "0755", "--dir", parent]
            covered.append(parent)
    covered.append(path)
    return [*args, "--ro-bind", path, path]


def jail_argv(
    bwrap: str, binds: list[tuple[str, str]], *, as_root: bool, tmp_bytes: int
) -> list[str]:
    """The bwrap command prefix for one jail (pure: reads only which top-level dirs are links).

    Args:
        bwrap: the bubblewrap binary.
        binds: (host path, jail path) pairs bound read-only (the task's files).
        as_root: the caller is root: no user namespace; the prologue may drop to a fresh uid.
        tmp_bytes: size of the writable /tmp.

    Returns:
        argv up to (not including) the interpreter.
    """
    argv = [bwrap, "--die-with-parent", "--new-session", "--unshare-ipc", "--unshare-pid"]
    argv += ["--unshare-net", "--unshare-uts", "--unshare-cgroup-try"]
    if as_root:
        argv += ["--cap-add", "CAP_SETUID", "--cap-add", "CAP_SETGID"]
    else:
        argv += ["--unshare-user", "--disable-userns"]
    argv += ["--perms", "1777", "--size", str(tmp_bytes), "--tmpfs", "/tmp"]
    argv += ["--ro-bind", "/usr", "/usr"]
    for name in ("bin", "sbin", "lib", "lib32", "lib64", "libx32"):
        top = Path("/" + name)
        if top.is_symlink():
            argv += ["--symlink", os.readlink(top), str(top)]
        elif top.is_dir():
            argv += ["--ro-bind", str(top), str(top)]
    if Path("/etc/ld.so.cache").is_file():
        argv += ["--ro-bind", "/etc/ld.so.cache", "/etc/ld.so.cache"]
    covered = ["/usr", "/etc"]
    exe = _interpreter()
    for root in (os.path.realpath(sys.base_prefix), os.path.dirname(os.path.dirname(exe))):
        argv += _ro_tree(root, covered)
    for src, dest in binds:
        argv += ["--ro-bind", src, dest]
    argv += ["--proc", "/proc", "--dev", "/dev", "--chdir", "/tmp", "--clearenv"]
    argv += ["--setenv", "PATH", "/usr/bin:/bin", "--setenv", "HOME", "/tmp"]
    argv += ["--setenv", "LANG", "C.UTF-8"]
    return argv


@functools.lru_cache(maxsize=8)
def jail_problem(bwrap: str | None) -> str | None:
    """Why a bwrap jail cannot run here (None when it can); probed once per binary.

    Args:
        bwrap: the bubblewrap binary (None = not found).
    """
    if bwrap is None:
        return "bwrap not found on PATH"
    if not os.access(bwrap, os.X_OK):
        return f"{bwrap} is not an executable file"
    as_root = os.geteuid() == 0
    argv = jail_argv(bwrap, [], as_root=as_root, tmp_bytes=1 << 20)
    uid = _UID_RANGE[0]
    probe = "import json, resource"
    if as_root:  # as the runs do: drop to an unprivileged uid, then read the stdlib
        probe = f"import os; os.setgroups([]); os.setresgid(*[{uid}] * 3); "
        probe += f"os.setresuid(*[{uid}] * 3); import json, resource"
    try:
        proc = subprocess.run(
            [*argv, _interpreter(), "-I", "-c", probe],
            capture_output=True,
            timeout=20,
            stdin=subprocess.DEVNULL,
        )
    except (OSError, subprocess.SubprocessError) as exc:
        return f"{bwrap} failed to start: {exc}"
    if proc.returncode != 0:
        lines = proc.stderr.decode("utf-8", "replace").strip().splitlines()
        return lines[-1] if lines else f"{bwrap} exited with status {proc.returncode}"
    return None


def _bwrap_path(policy: SandboxPolicy) -> str | None:
    chosen = policy.bwrap or os.environ.get(BWRAP_ENV)
    return chosen if chosen else shutil.which("bwrap")


def jail_available(policy: SandboxPolicy | None = None) -> bool:
    """Whether runs under `policy` (default limits) get a bwrap jail here."""
    return jail_problem(_bwrap_path(policy or SandboxPolicy())) is None


def network_namespace_available() -> bool:
    """Kept for callers of the former API: the jail (which has no network) is available."""
    return jail_available()


def _allowed_unsandboxed(policy: SandboxPolicy) -> bool:
    if policy.allow_unsandboxed is not None:
        return policy.allow_unsandboxed
    return os.environ.get(ALLOW_UNSANDBOXED_ENV, "").strip() == "1"


class _Tail:
    """The last `cap` bytes of a stream; memory stays under 2 * cap + one read."""

    def __init__(self, cap: int) -> None:
        self.cap = cap
        self.data = bytearray()
        self.seen = 0

    def add(self, chunk: bytes) -> None:
        self.seen += len(chunk)
        self.data += chunk
        if len(self.data) > 2 * self.cap:
            del self.data[: len(self.data) - self.cap]

    def text(self) -> tuple[str, bool]:
        raw = bytes(self.data[-self.cap :])
        text = raw.decode("utf-8", "replace")
        cut = self.seen > len(raw)
        if len(text) > self.cap:
            text, cut = text[-self.cap :], True
        return ("…" + text if cut else text), cut


def _exited(proc: subprocess.Popen[bytes]) -> bool:
    """Whether `proc` has exited, without reaping it (its pid and group id stay reserved)."""
    try:
        info = os.waitid(os.P_PID, proc.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
    except ChildProcessError:
        return True
    return info is not None and info.si_pid == proc.pid


def _kill(proc: subprocess.Popen[bytes]) -> None:
    # The process leads its own session (start_new_session); killing the group kills the
    # outer bwrap, whose death SIGKILLs the jail's init and with it the whole PID namespace.
    # Only called before the process is reaped, so its group id cannot belong to anyone else.
    if proc.returncode is not None:
        return
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


@dataclass(slots=True)
class _Outcome:
    report: bytes
    report_complete: bool
    timed_out: bool
    stdout: _Tail
    stderr: _Tail
    judge_stderr: _Tail


def _supervise(
    code_proc: subprocess.Popen[bytes],
    judge_proc: subprocess.Popen[bytes],
    report_fd: int,
    deadline: float,
    cap: int,
) -> _Outcome:
    """Read every pipe until both processes are done, the judge reported, or the deadline."""
    assert code_proc.stdout and code_proc.stderr and judge_proc.stderr
    tails = {"out": _Tail(cap), "err": _Tail(cap), "jerr": _Tail(4096)}
    report = bytearray()
    report_done = False
    fds = {
        code_proc.stdout.fileno(): "out",
        code_proc.stderr.fileno(): "err",
        judge_proc.stderr.fileno(): "jerr",
        report_fd: "report",
    }
    sel = selectors.DefaultSelector()
    for fd, name in fds.items():
        os.set_blocking(fd, False)
        sel.register(fd, selectors.EVENT_READ, name)
    kill_at, stop_at = deadline, math.inf
    killed = timed_out = False
    try:
        while sel.get_map():
            now = time.monotonic()
            if report_done and not killed and _exited(judge_proc):
                kill_at = min(kill_at, now + _GRACE_S)
            if now >= kill_at and not killed:
                killed, timed_out = True, not report_done
                _kill(code_proc)
                _kill(judge_proc)
                stop_at = now + _DRAIN_S
            if now >= stop_at:
                break
            wait = min(kill_at if not killed else stop_at, now + 0.2) - now
            for key, _ in sel.select(timeout=max(wait, 0.0)):
                try:
                    chunk = os.read(key.fd, 1 << 16)
                except BlockingIOError:
                    continue
                except OSError:
                    chunk = b""
                name = key.data
                if not chunk:
                    sel.unregister(key.fd)
                    report_done = report_done or name == "report"
                elif name == "report":
                    report += chunk
                    if len(report) > _REPORT_CAP:
                        report_done = True  # an oversized report is discarded below
                        sel.unregister(key.fd)
                else:
                    tails[name].add(chunk)
    finally:
        sel.close()
        for proc in (code_proc, judge_proc):  # leftovers in their groups too, then reap
            _kill(proc)
        for proc in (code_proc, judge_proc):
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                pass
    complete = report_done and len(report) <= _REPORT_CAP
    return _Outcome(bytes(report), complete, timed_out, tails["out"], tails["err"], tails["jerr"])


def _parse_report(raw: bytes) -> dict[str, Any] | None:
    try:
        report = json.loads(raw.decode("utf-8"))
    except (ValueError, UnicodeDecodeError):
        return None
    return report if isinstance(report, dict) else None


def run_python_tests(
    code: str,
    tests: str = "",
    timeout_s: float | None = None,
    *,
    policy: SandboxPolicy | None = None,
) -> SandboxRun:
    """Run `code` in a jail and judge it with the assert-based `tests` from another jail.

    Args:
        code: Python source under test (e.g. a model's solution); untrusted.
        tests: test source (top-level asserts, `test_*` functions) over the code's names.
        timeout_s: wall-clock limit; overrides `policy.timeout_s` when given.
        policy: limits and jail settings (defaults: `SandboxPolicy()`).

    Returns:
        A `SandboxRun`; a timeout is a result (`timed_out=True`, `passed=False`), not an error.

    Raises:
        SandboxUnavailableError: no jail can be set up and running without one is not allowed.

    Examples:
        >>> run_python_tests("x = 1", "assert x == 2").passed
        False
    """
    policy = policy or SandboxPolicy()
    limit_s = policy.timeout_s if timeout_s is None else timeout_s
    if not limit_s > 0:
        raise ConfigError(f"sandbox timeout_s must be > 0, got {limit_s}")
    bwrap = _bwrap_path(policy)
    problem = jail_problem(bwrap)
    if problem is not None and not _allowed_unsandboxed(policy):
        raise SandboxUnavailableError(
            f"refusing to run untrusted code: no bubblewrap jail ({problem}); install the "
            f"'bubblewrap' package (make does) or set {ALLOW_UNSANDBOXED_ENV}=1 to run it "
            "without any isolation"
        )
    jailed = problem is None
    as_root = os.geteuid() == 0
    cpu_s = policy.max_cpu_s or math.ceil(limit_s) + 1
    with tempfile.TemporaryDirectory(prefix="maserve-sandbox-") as tmp:
        root = Path(tmp)
        for part, files in (
            ("code", {"solution.py": code, "server.py": _SERVER}),
            ("judge", {"tests.py": tests, "judge.py": _JUDGE}),
            ("work", {}),
        ):
            (root / part).mkdir(mode=0o755)
            for name, text in files.items():
                (root / part / name).write_text(text, encoding="utf-8")
                (root / part / name).chmod(0o644)

        def where(part: str) -> str:
            return f"/{part}" if jailed else str(root / part)

        def command(part: str, script: str, cfg: dict[str, Any]) -> list[str]:
            prefix = (
                jail_argv(
                    bwrap or "bwrap",
                    [(str(root / part), f"/{part}")],
                    as_root=as_root,
                    tmp_bytes=policy.max_tmp_bytes,
                )
                if jailed
                else []
            )
            return [*prefix, _interpreter(), "-I", f"{where(part)}/{script}", json.dumps(cfg)]

        uids = [secrets.randbelow(_UID_RANGE[1] - _UID_RANGE[0]) + _UID_RANGE[0] for _ in "cj"]
        limits: dict[str, Any] = {"cpu_s": cpu_s, "fsize": policy.max_file_bytes}
        req_r, req_w = os.pipe()
        resp_r, resp_w = os.pipe()
        rep_r, rep_w = os.pipe()
        code_cfg = {
            **limits,
            "memory": policy.max_memory_bytes,
            "nproc": policy.max_processes if jailed else None,
            "uid": uids[0] if jailed and as_root else None,
            "rx": req_r,
            "tx": resp_w,
            "code": f"{where('code')}/solution.py",
        }
        judge_cfg = {
            **limits,
            "memory": max(policy.max_memory_bytes, 1 << 30),
            "nproc": 8 if jailed else None,
            "uid": uids[1] if jailed and as_root else None,
            "rx": resp_r,
            "tx": req_w,
            "report": rep_w,
            "tests": f"{where('judge')}/tests.py",
            "line_cap": 8 << 20,
        }
        env = {"PATH": "/usr/bin:/bin", "HOME": str(root / "work"), "LANG": "C.UTF-8"}
        start = time.monotonic()
        procs: list[subprocess.Popen[bytes]] = []
        try:
            for part, script, cfg, fds, out in (
                ("code", "server.py", code_cfg, (req_r, resp_w), subprocess.PIPE),
                ("judge", "judge.py", judge_cfg, (resp_r, req_w, rep_w), subprocess.DEVNULL),
            ):
                procs.append(
                    subprocess.Popen(
                        command(part, script, cfg),
                        cwd=root / "work",
                        env=env,
                        stdin=subprocess.DEVNULL,
                        stdout=out,
                        stderr=subprocess.PIPE,
                        pass_fds=fds,
                        start_new_session=True,
                    )
                )
        except BaseException:
            for proc in procs:
                _kill(proc)
                proc.wait()
            os.close(rep_r)
            raise
        finally:
            for fd in (req_r, req_w, resp_r, resp_w, rep_w):
                os.close(fd)
        code_proc, judge_proc = procs
        try:
            outcome = _supervise(
                code_proc, judge_proc, rep_r, start + limit_s, policy.max_output_chars
            )
        finally:
            os.close(rep_r)
            for proc in procs:
                for stream in (proc.stdout, proc.stderr):
                    if stream is not None:
                        stream.close()
        duration_s = time.monotonic() - start
    report = _parse_report(outcome.report) if outcome.report_complete else None
    if outcome.timed_out:
        error = f"timed out after {limit_s:g} s; the sandbox was killed"
    elif report is None:
        detail = outcome.judge_stderr.text()[0].strip().splitlines()
        error = f"the test judge gave no verdict (exit status {judge_proc.returncode})" + (
            f": {detail[-1]}" if detail else ""
        )
    else:
        error = str(report.get("error", ""))
    counted = report if report is not None and not outcome.timed_out else {}
    num_passed = int(counted.get("num_passed", 0))
    num_failed = int(counted.get("num_failed", 0))
    failures = tuple(str(f) for f in counted.get("failures", ()))
    passed = (
        not outcome.timed_out
        and report is not None
        and judge_proc.returncode == 0
        and num_failed == 0
        and num_passed > 0
    )
    stdout, cut_out = outcome.stdout.text()
    stderr, cut_err = outcome.stderr.text()
    return SandboxRun(
        passed=passed,
        num_passed=num_passed,
        num_failed=num_failed,
        timed_out=outcome.timed_out,
        returncode=code_proc.returncode,
        failures=failures,
        error=error,
        stdout=stdout,
        stderr=stderr,
        isolation="bwrap" if jailed else "none",
        duration_s=duration_s,
        output_truncated=cut_out or cut_err,
    )
