"""The persistent local Prefect server the CLI records runs on: start, find, stop.

The one idea: **one detached `prefect server start` per `MASERVE_HOME`, described by a state
file, under a lock.** `start()` launches the server in its own process group with `PREFECT_HOME` under the
project data directory (`$MASERVE_HOME/prefect`), analytics off, the UI on (at the server's
root URL, its API URL set to the server's own; `ui=False`, `--no-ui` or `MASERVE_PREFECT_UI=0`
switch it off), logs to `<home>/server.log`, and writes its pid, port, URL and whether the UI is
served to `<home>/server.json`; it returns only once `GET /api/health` answers. Later commands read that file (`status()`), reuse the server
(`ensure_server()`), or end it (`stop()`: SIGTERM to the group, bounded wait, then SIGKILL). `start()` and `stop()` hold an
exclusive lock on `<home>/server.lock` (`maserve_prefect.locks`) from the first look at the state
file to the last write, so two commands that start at once on a fresh home get one server (the
second waits, then finds it running) and `stop` never misses one being started.

Why not Prefect's ephemeral mode: it starts a server subprocess per process and lost most task
runs of a process that exited right after its flows (measured, Prefect 3.9.1; see DESIGN.md). A
server that outlives the command keeps every run, and `maserve run` additionally waits until the
API holds every task run the ledger recorded.

`ensure_server()` prefers an API the caller already configured (`PREFECT_API_URL` in the
environment or the active Prefect settings, e.g. a test server or a shared one); only when none
is set does it start or reuse the managed local server.

Examples:
    >>> info = status()  # doctest: +SKIP
    >>> info.running, info.url  # doctest: +SKIP
    (True, 'http://127.0.0.1:4242/api')
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx

from maserve_prefect.errors import ConfigError, PrefectServerError
from maserve_prefect.locks import exclusive, pid_alive
from maserve_prefect.settings import private_dir, private_file

__all__ = [
    "ENV_PREFECT_PORT",
    "ENV_PREFECT_UI",
    "ServerInfo",
    "announcement",
    "api_healthy",
    "configured_api_url",
    "connected",
    "database_url",
    "ensure_server",
    "recording_api",
    "server_home",
    "start",
    "status",
    "stop",
    "ui_default",
]

ENV_PREFECT_PORT = "MASERVE_PREFECT_PORT"
ENV_PREFECT_UI = "MASERVE_PREFECT_UI"
STATE_FILE = "server.json"
LOCK_FILE = "server.lock"
# Seconds a start or stop waits, beyond its own timeout, for another one in the same home.
LOCK_MARGIN_S = 30.0
LOG_FILE = "server.log"
HOST = "127.0.0.1"
# Lines of the server log quoted when it fails to start.
LOG_TAIL_LINES = 20
DB_URL_ENV = "PREFECT_API_DATABASE_CONNECTION_URL"
POSTGRES_POOL = {
    "PREFECT_SERVER_DATABASE_SQLALCHEMY_POOL_SIZE": "20",
    "PREFECT_SERVER_DATABASE_SQLALCHEMY_MAX_OVERFLOW": "40",
    "PREFECT_SERVER_DATABASE_SQLALCHEMY_POOL_TIMEOUT": "600",
}
"""The managed server's connection pool on PostgreSQL, unless the environment sets its own."""


@dataclass(frozen=True, slots=True)
class ServerInfo:
    """Where the managed server is and whether it answers.

    Attributes:
        home: its `PREFECT_HOME` (database, state file, log).
        running: the process is alive and `/api/health` answers.
        url: API URL (`http://127.0.0.1:PORT/api`), or None if no server was recorded.
        pid: process (and process-group) id, or None.
        port: TCP port, or None.
        started_at: ISO UTC start time, or None.
        managed: True for the server in `home`; False for an API configured elsewhere.
        ui: the server serves the Prefect UI at its root URL.
        started_now: this call started it (an implicit start is announced, see `announcement`).
    """

    home: Path
    running: bool
    url: str | None = None
    pid: int | None = None
    port: int | None = None
    started_at: str | None = None
    managed: bool = True
    ui: bool = False
    started_now: bool = False

    @property
    def ui_url(self) -> str | None:
        """The UI's root URL (`http://127.0.0.1:PORT`), when the server serves the UI."""
        if not self.ui or self.url is None:
            return None
        return self.url.removesuffix("/").removesuffix("/api")

    @property
    def uptime_s(self) -> float | None:
        """Seconds since start, when running."""
        if not self.running or self.started_at is None:
            return None
        return (datetime.now(UTC) - datetime.fromisoformat(self.started_at)).total_seconds()

    @property
    def log_path(self) -> Path:
        """The server's log file."""
        return self.home / LOG_FILE

    def as_dict(self) -> dict[str, object]:
        """JSON-ready fields plus uptime (for `maserve server status --json`)."""
        data = {k: str(v) if isinstance(v, Path) else v for k, v in asdict(self).items()}
        return {**data, "uptime_s": self.uptime_s}


def server_home(home: Path | None = None) -> Path:
    """The managed server's `PREFECT_HOME`: `home`, else `$MASERVE_HOME/prefect`.

    Examples:
        >>> server_home(Path("/data/ps")).as_posix()
        '/data/ps'
    """
    if home is not None:
        return Path(home).expanduser().resolve()
    from maserve_prefect.settings import get_settings

    return get_settings().home / "prefect"


def api_healthy(url: str, *, timeout_s: float = 2.0) -> bool:
    """Whether the Prefect API at `url` (ending in `/api`) answers its health check."""
    try:
        return httpx.get(f"{url.rstrip('/')}/health", timeout=timeout_s).status_code == 200
    except httpx.HTTPError:
        return False


def status(home: Path | None = None) -> ServerInfo:
    """The managed server recorded in `home` (see `server_home`): alive and healthy or not."""
    home = server_home(home)
    state = _read_state(home)
    if state is None:
        return ServerInfo(home=home, running=False)
    pid, url = int(state["pid"]), str(state["url"])
    running = _alive(pid) and api_healthy(url)
    return ServerInfo(
        home=home,
        running=running,
        url=url,
        pid=pid,
        port=int(state["port"]),
        started_at=str(state["started_at"]),
        ui=bool(state.get("ui", False)),
    )


def ui_default(env: dict[str, str] | None = None) -> bool:
    """Whether the managed server serves the UI: `$MASERVE_PREFECT_UI` (1/0, true/false,
    on/off, yes/no), default on.

    Raises:
        ConfigError: the variable holds anything else.

    Examples:
        >>> ui_default({}), ui_default({"MASERVE_PREFECT_UI": "off"})
        (True, False)
    """
    raw = (os.environ if env is None else env).get(ENV_PREFECT_UI, "").strip().lower()
    if raw in ("", "1", "true", "on", "yes"):
        return True
    if raw in ("0", "false", "off", "no"):
        return False
    raise ConfigError(f"{ENV_PREFECT_UI}={raw!r}: use 1 (serve the Prefect UI) or 0 (API only)")


def database_url(env: dict[str, str] | None = None, home: Path | None = None) -> str:
    """The managed server's database, password hidden: `$PREFECT_API_DATABASE_CONNECTION_URL`,
    else Prefect's SQLite file in the server's home.

    Examples:
        >>> database_url({}, Path("/data/ps"))
        'sqlite:////data/ps/prefect.db'
        >>> database_url({DB_URL_ENV: "postgresql+asyncpg://me:secret@db/p"}, Path("/x"))
        'postgresql+asyncpg://me:***@db/p'
    """
    raw = (os.environ if env is None else env).get(DB_URL_ENV, "")
    if not raw:
        return f"sqlite:///{server_home(home) / 'prefect.db'}"
    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import ArgumentError

    try:
        return make_url(raw).render_as_string(hide_password=True)
    except ArgumentError:
        return "(unparsable URL in " + DB_URL_ENV + ")"


def announcement(info: ServerInfo) -> str:
    """The one line that says a command started the managed server: where it answers (the UI
    or the API), its database and how to stop it.

    Examples:
        >>> info = ServerInfo(Path("/h"), True, "http://127.0.0.1:4242/api", ui=True)
        >>> print(announcement(info))  # doctest: +NORMALIZE_WHITESPACE
        started a Prefect server: UI http://127.0.0.1:4242 (API http://127.0.0.1:4242/api),
        database sqlite:////h/prefect.db; it keeps running: stop it with
        `maserve server stop --home /h`
    """
    where = f"UI {info.ui_url} (API {info.url})" if info.ui else f"API {info.url} (no UI)"
    stop_cmd = "maserve server stop"
    if info.home != server_home():
        stop_cmd += f" --home {info.home}"
    return (
        f"started a Prefect server: {where}, database {database_url(home=info.home)}; "
        f"it keeps running: stop it with `{stop_cmd}`"
    )


def start(
    home: Path | None = None,
    port: int | None = None,
    *,
    timeout_s: float = 90.0,
    ui: bool | None = None,
) -> ServerInfo:
    """Start the managed server (or return the one already running in `home`).

    Args:
        home: its `PREFECT_HOME` (default `$MASERVE_HOME/prefect`).
        port: TCP port on 127.0.0.1; default `$MASERVE_PREFECT_PORT`, else a free port.
        timeout_s: how long to wait for `/api/health` before giving up.
        ui: serve the Prefect UI (default `ui_default()`: on unless `$MASERVE_PREFECT_UI=0`).
            A running server is returned as it is, whatever it serves.

    Raises:
        ConfigError: the port is not a number or is in use by another process.
        PrefectServerError: the server exited or did not answer in time (quotes its log).
    """
    home = server_home(home)
    _port_number(port)  # a bad port is refused before anything is created
    with_ui = ui_default() if ui is None else ui
    with _locked(home, timeout_s, "starting the Prefect server"):
        return _start_locked(home, port, timeout_s, with_ui)


def _start_locked(home: Path, port: int | None, timeout_s: float, ui: bool) -> ServerInfo:
    current = status(home)
    if current.running:
        return current
    if current.pid is not None and _alive(current.pid) and _looks_like_prefect(current.pid):
        _terminate(current.pid, grace_s=5.0)  # recorded but not answering: replace it
    port = _choose_port(port)
    private_dir(home)  # its database holds every run's parameters and results: owner only
    (home / STATE_FILE).unlink(missing_ok=True)
    url = f"http://{HOST}:{port}/api"
    cmd = [sys.executable, "-m", "prefect", "server", "start", "--host", HOST, "--port", str(port)]
    cmd += ["--ui" if ui else "--no-ui", "--analytics-off", "--no-scheduler", "--no-late-runs"]
    with private_file(home / LOG_FILE).open("ab") as log:
        proc = subprocess.Popen(
            cmd,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            env=_server_env(home, url, ui),
            start_new_session=True,  # its own process group: `stop` signals the whole tree
            umask=0o077,  # its database, log and state files: readable by the owner only
        )
    started_at = datetime.now(UTC).isoformat()
    deadline = time.monotonic() + timeout_s
    while not api_healthy(url, timeout_s=1.0):
        if proc.poll() is not None or time.monotonic() > deadline:
            why = (
                f"exited with code {proc.returncode}"
                if proc.poll() is not None
                else f"did not answer {url}/health within {timeout_s:.0f} s"
            )
            _terminate(proc.pid, grace_s=5.0)
            raise PrefectServerError(
                f"Prefect server in {home} {why}; last lines of {home / LOG_FILE}:\n"
                f"{_log_tail(home / LOG_FILE)}\n"
                f"fix the cause above, or point PREFECT_API_URL at a running server"
            )
        time.sleep(0.25)
    state = {"pid": proc.pid, "port": port, "url": url, "started_at": started_at, "ui": ui}
    _write_state(home, state)
    return ServerInfo(
        home=home,
        running=True,
        url=url,
        pid=proc.pid,
        port=port,
        started_at=started_at,
        ui=ui,
        started_now=True,
    )


def stop(home: Path | None = None, *, timeout_s: float = 20.0) -> bool:
    """Stop the managed server in `home`; return whether one was running.

    SIGTERM goes to the server's process group; after `timeout_s` the group is killed.
    """
    home = server_home(home)
    with _locked(home, timeout_s, "stopping the Prefect server"):
        state = _read_state(home)
        if state is None:
            return False
        pid = int(state["pid"])
        was_running = _alive(pid) and _looks_like_prefect(pid)
        if was_running:
            _terminate(pid, grace_s=timeout_s)
        (home / STATE_FILE).unlink(missing_ok=True)
        return was_running


def configured_api_url() -> str | None:
    """The Prefect API URL set by the environment or the active Prefect settings, if any."""
    from prefect.settings import get_current_settings

    url = os.environ.get("PREFECT_API_URL") or get_current_settings().api.url
    return str(url) if url else None


def ensure_server(
    home: Path | None = None,
    *,
    timeout_s: float = 90.0,
    announce: Callable[[str], None] | None = None,
) -> ServerInfo:
    """An API to record runs on: the configured one, else the managed server (started if needed).

    Args:
        announce: told `announcement(info)` when this call started the server (default: the
            line goes to stderr; a command that would rather not say it passes a no-op).

    Raises:
        PrefectServerError: the configured API does not answer, or the server cannot start.
    """
    url = configured_api_url()
    if url is not None:
        if not api_healthy(url, timeout_s=5.0):
            raise PrefectServerError(
                f"PREFECT_API_URL={url} does not answer {url.rstrip('/')}/health; start that "
                f"server, or unset PREFECT_API_URL to let maserve manage a local one"
            )
        return ServerInfo(home=server_home(home), running=True, url=url, managed=False)
    info = start(home, timeout_s=timeout_s)
    if info.started_now:
        (announce or _stderr_line)(announcement(info))
    return info


def _stderr_line(line: str) -> None:
    sys.stderr.write(line + "\n")
    sys.stderr.flush()


@contextlib.contextmanager
def connected(info: ServerInfo) -> Iterator[ServerInfo]:
    """Point this process's Prefect client at `info.url` for the duration of the block.

    Prefect reads its settings at import, so the environment variable alone is not enough;
    `temporary_settings` switches the active settings too.
    The UI URL (`PREFECT_UI_URL`, which the "View at …" links Prefect prints are built from)
    is set to the server's root too.
    """
    from prefect.settings import PREFECT_API_URL, PREFECT_UI_URL, temporary_settings

    if info.url is None:
        raise PrefectServerError(f"no Prefect API URL recorded for server in {info.home}")
    ui_url = info.url.removesuffix("/").removesuffix("/api")
    values = {"PREFECT_API_URL": info.url, "PREFECT_UI_URL": ui_url}
    old = {name: os.environ.get(name) for name in values}
    os.environ.update(values)
    try:
        with temporary_settings(updates={PREFECT_API_URL: info.url, PREFECT_UI_URL: ui_url}):
            yield info
    finally:
        for name, value in old.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


@contextlib.contextmanager
def recording_api() -> Iterator[None]:
    """An API to record native runs on for the duration of the block: the configured one (a
    test harness, `PREFECT_API_URL`), else the managed local server (`ensure_server`), with the
    Prefect client's patience raised for the block: at least `RECORDING_MAX_RETRIES` retries and
    a `RECORDING_REQUEST_TIMEOUT_S` request timeout.

    Without the managed server, a library caller with no API configured gets Prefect's ephemeral
    servers: one `replay.arms.run_scenario` call on native cohorts was seen holding 85 of them
    (11.7 GB). Without the retries, a native run that creates a burst of root flow runs (64–216
    at once) got `503 Service Unavailable` from the local SQLite-backed server for some of them
    after the client's default 5 retries (2 + 4 + … + 32 s of back-off). Without the longer
    timeout, 14 of 1,000 roots released at once (`benchmarks/load_held.py roots --users 1000
    --postgres`) failed with `ReadTimeout` after every retry: a request the busy server had
    queued for more than Prefect's default 60 s was abandoned and sent again, adding to the very
    queue that delayed it.
    """
    with contextlib.ExitStack() as stack:
        stack.enter_context(_client_patience(RECORDING_MAX_RETRIES, RECORDING_REQUEST_TIMEOUT_S))
        if configured_api_url() is None:
            stack.enter_context(connected(ensure_server()))
        yield


RECORDING_MAX_RETRIES = 8
"""Prefect client retries while recording native runs (exponential back-off 2^n s: up to ~8.5
min for one request), against bursts of flow-run creations on the local server."""

RECORDING_REQUEST_TIMEOUT_S = 300.0
"""Prefect client request timeout while recording native runs (Prefect's default: 60 s)."""


@contextlib.contextmanager
def _client_patience(retries: int, timeout_s: float) -> Iterator[None]:
    """`PREFECT_CLIENT_MAX_RETRIES` at least `retries` and `PREFECT_API_REQUEST_TIMEOUT` at least
    `timeout_s` for the block (environment and active settings, as `connected` does for the URL,
    so root threads started inside see them too)."""
    from prefect.settings import (
        PREFECT_API_REQUEST_TIMEOUT,
        PREFECT_CLIENT_MAX_RETRIES,
        temporary_settings,
    )

    values: dict[Any, Any] = {
        PREFECT_CLIENT_MAX_RETRIES: max(retries, int(PREFECT_CLIENT_MAX_RETRIES.value())),
        PREFECT_API_REQUEST_TIMEOUT: max(timeout_s, float(PREFECT_API_REQUEST_TIMEOUT.value())),
    }
    old = {setting.name: os.environ.get(setting.name) for setting in values}
    os.environ.update({setting.name: str(value) for setting, value in values.items()})
    try:
        with temporary_settings(updates=values):
            yield
    finally:
        for name, value in old.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


# ---- helpers ------------------------------------------------------------------------------


def _locked(home: Path, timeout_s: float, what: str) -> contextlib.AbstractContextManager[None]:
    """The home's server lock, waited for up to `timeout_s` plus a margin."""
    return exclusive(home / LOCK_FILE, wait_s=timeout_s + LOCK_MARGIN_S, what=what)


def _server_env(home: Path, url: str, ui: bool) -> dict[str, str]:
    drop = ("PREFECT_API_URL", "PREFECT_UI_URL", "PREFECT_UI_API_URL", "PREFECT_SERVER_UI_API_URL")
    env = {k: v for k, v in os.environ.items() if k not in drop}
    env.update(
        PREFECT_HOME=str(home),
        PREFECT_SERVER_ANALYTICS_ENABLED="false",
        PREFECT_SERVER_UI_ENABLED="true" if ui else "false",
        # The UI in the browser calls this API: the server's own URL, not a caller's setting.
        PREFECT_UI_API_URL=url,
        PREFECT_UI_URL=url.removesuffix("/api"),
        PREFECT_LOGGING_TO_API_ENABLED="false",
    )
    if env.get(DB_URL_ENV, "").startswith("postgresql"):
        # A burst of root flow runs (e.g. 1,000 roots released at once) exhausted Prefect's
        # default pool (5 + 10 overflow, 30 s wait) and every request past it got HTTP 500,
        # which the client does not retry (measured: 877 of 1,000 roots lost). Requests now wait
        # for a connection instead; 20 + 40 stays under PostgreSQL's default 100 connections.
        for name, value in POSTGRES_POOL.items():
            env.setdefault(name, value)
    return env


def _port_number(port: int | None) -> int | None:
    """`port`, else `$MASERVE_PREFECT_PORT`, checked; None: any free port.

    Raises:
        ConfigError: not a number, or not 1-65535.
    """
    raw = port if port is not None else os.environ.get(ENV_PREFECT_PORT)
    if raw is None or raw == "":
        return None
    try:
        chosen = int(raw)
    except ValueError:
        raise ConfigError(f"{ENV_PREFECT_PORT}={raw!r} is not a port number") from None
    if not 1 <= chosen <= 65535:
        raise ConfigError(f"port {chosen}: a TCP port is 1-65535 (--port / {ENV_PREFECT_PORT})")
    return chosen


def _choose_port(port: int | None) -> int:
    chosen = _port_number(port)
    if chosen is None:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.bind((HOST, 0))
            return int(s.getsockname()[1])
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind((HOST, chosen))
        except OSError as exc:
            raise ConfigError(
                f"port {chosen} on {HOST} is in use ({exc.strerror}); choose another with "
                f"--port / {ENV_PREFECT_PORT}, or leave it unset for a free port"
            ) from None
    return chosen


def _read_state(home: Path) -> dict[str, Any] | None:
    path = home / STATE_FILE
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        raise PrefectServerError(
            f"{path} is unreadable ({exc}); stop the server by hand if one runs, then delete it"
        ) from exc
    if (
        not isinstance(data, dict)
        or not isinstance(data.get("pid"), int)
        or not isinstance(data.get("port"), int)
        or not isinstance(data.get("url"), str)
        or not isinstance(data.get("started_at"), str)
    ):
        raise PrefectServerError(
            f"{path} lacks an int pid/port or a url/started_at string; delete it and retry"
        )
    return data


def _write_state(home: Path, state: dict[str, object]) -> None:
    tmp = home / f".{STATE_FILE}.tmp"
    tmp.write_text(json.dumps(state, indent=1) + "\n")
    tmp.replace(home / STATE_FILE)


def _alive(pid: int) -> bool:
    with contextlib.suppress(ChildProcessError):
        if os.waitpid(pid, os.WNOHANG)[0] == pid:  # our own child that has exited: reap it
            return False
    return pid_alive(pid)


def _looks_like_prefect(pid: int) -> bool:
    """Guard against a recycled pid: on Linux, check the command line names prefect."""
    cmdline = Path(f"/proc/{pid}/cmdline")
    if not cmdline.exists():
        return True  # no procfs: trust the state file
    with contextlib.suppress(OSError):
        return b"prefect" in cmdline.read_bytes()
    return False


def _terminate(pid: int, *, grace_s: float) -> None:
    """SIGTERM the process group led by `pid`, wait up to `grace_s`, then SIGKILL it."""
    for sig, wait_s in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 5.0)):
        try:
            os.killpg(pid, sig)
        except ProcessLookupError:
            return
        deadline = time.monotonic() + wait_s
        while time.monotonic() < deadline:
            if not _alive(pid):
                return
            time.sleep(0.1)


def _log_tail(path: Path) -> str:
    try:
        lines = path.read_text(errors="replace").splitlines()
    except OSError:
        return "(no log)"
    return "\n".join(lines[-LOG_TAIL_LINES:]) or "(empty log)"
