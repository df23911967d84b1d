"""A fleet: several OpenAI-compatible endpoints per deployment, each a replica, kept by health.

The one idea: every endpoint a pool file lists under a deployment's `replicas:` is its own
`Replica` (`Endpoint`, named `DEPLOYMENT@HOST:PORT`) over its own `OpenAIEngine`, so the one
dispatcher places on a fleet with the same plans as on the simulator (least-outstanding, prefix,
session). Capability discovery runs per endpoint, in parallel, when the fleet opens; an endpoint
that does not answer then is a one-line error naming the pool file, deployment and URL.

`fleet_open.open_fleet` builds it (discovery per endpoint).

Health, at the edge (a `fleet-health` thread; the dispatcher only reads `lifecycle`):

- **dead**: an op that ends on an endpoint with a connection error or a timeout (the engine's
  `Attempt.kind`), or `max_missed_heartbeats` heartbeats in a row unanswered (`GET /v1/models`
  every `heartbeat_s` on a live endpoint), marks it dead: its lifecycle reads UNREACHABLE (plans
  skip it), its engine is closed so every op still in flight or queued there ends at once, and
  the fleet — the dispatcher's `Failover` — tells the dispatcher to place each such op again on
  a live endpoint (at most `max_reroutes` times per op). The attempt made on the dead endpoint
  is recorded as a failed attempt; the op's next attempt is recorded as attempt + 1.
- **probed back in**: a dead endpoint is probed (`GET /v1/models`) after 0.5, 1, 2, 4 and
  8 s and then every 8 s (`FleetOptions.probe_delay_s`: doubling from `probe_first_s`, capped at
  `probe_max_s`) until it answers; then discovery runs again on a new engine (a restarted
  server may differ) and the endpoint is live; the dispatcher hears a lifecycle event and plans.
- A deployment whose endpoints are all dead fails its ready ops with one line naming the pool
  file, the deployment and each endpoint's reason (`no_live_reason`).

Examples:
    >>> [FleetOptions().probe_delay_s(n) for n in range(7)]
    [0.5, 1.0, 2.0, 4.0, 8.0, 8.0, 8.0]
    >>> endpoint_name("main", "http://10.0.0.5:8000")
    'main@10.0.0.5:8000'
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from urllib.parse import urlsplit

import httpx

from maserve_prefect.engines.openai.engine import OpenAIEngine
from maserve_prefect.engines.openai.retry import RetryPolicy
from maserve_prefect.engines.target import EngineTarget
from maserve_prefect.errors import ConfigError, MaserveError
from maserve_prefect.protocol.capabilities import Capabilities
from maserve_prefect.protocol.controls import Control
from maserve_prefect.protocol.engine import Replica
from maserve_prefect.protocol.intents import Intent
from maserve_prefect.protocol.outcomes import Acceptance, Outcome, Ticket
from maserve_prefect.protocol.requests import Request
from maserve_prefect.protocol.state import EngineState, Lifecycle

__all__ = ["Endpoint", "Fleet", "FleetOptions", "endpoint_name"]

log = logging.getLogger(__name__)

Deliver = Callable[[Callable[[], None]], None]

LOST_KINDS = ("connection", "timeout")
"""Failed-attempt kinds that mean the endpoint stopped answering (`retry.ERROR_KINDS`)."""

FLEET_RETRY = RetryPolicy(retry_on=("5xx",))
"""A fleet endpoint's own retries: 5xx only. A lost connection is retried on another endpoint."""


@dataclass(frozen=True, slots=True)
class FleetOptions:
    """How a fleet watches its endpoints (module docstring).

    Args:
        probe_first_s: the first probe of a dead endpoint, seconds after it died.
        probe_max_s: the longest wait between probes (the back-off doubles up to it).
        probe_timeout_s: limit on one probe.
        heartbeat_s: seconds between heartbeats of a live endpoint (None: no heartbeat; only a
            failed op marks an endpoint dead).
        heartbeat_timeout_s: limit on one heartbeat.
        max_missed_heartbeats: heartbeats unanswered in a row that mark an endpoint dead.
        max_reroutes: the most times one op is placed again after losing its endpoint.
        discovery_timeout_s: each endpoint's discovery budget.

    Raises:
        ConfigError: a bound out of range.
    """

    probe_first_s: float = 0.5
    probe_max_s: float = 8.0
    probe_timeout_s: float = 2.0
    heartbeat_s: float | None = 5.0
    heartbeat_timeout_s: float = 5.0
    max_missed_heartbeats: int = 2
    max_reroutes: int = 3
    discovery_timeout_s: float = 60.0

    def __post_init__(self) -> None:
        positive = (self.probe_first_s, self.probe_timeout_s, self.heartbeat_timeout_s)
        if (
            min(positive) <= 0
            or self.probe_max_s < self.probe_first_s
            or (self.heartbeat_s is not None and self.heartbeat_s <= 0)
            or self.max_missed_heartbeats < 1
            or self.max_reroutes < 0
            or self.discovery_timeout_s <= 0
        ):
            raise ConfigError(f"{self!r}: bounds out of range (see FleetOptions)")

    def probe_delay_s(self, num_probes: int) -> float:
        """Seconds before probe number `num_probes` (0: the first, after the endpoint died)."""
        return min(self.probe_first_s * 2.0**num_probes, self.probe_max_s)


def endpoint_name(deployment: str, base_url: str) -> str:
    """The replica name of `deployment`'s endpoint at `base_url` (no user info: it is cut)."""
    parts = urlsplit(base_url)
    return f"{deployment}@{parts.netloc.rpartition('@')[2]}{parts.path}"


def first_line(text: str, limit: int = 160) -> str:
    line = text.strip().splitlines()[0] if text.strip() else ""
    return line if len(line) <= limit else line[: limit - 1] + "…"


class Endpoint:
    """One endpoint of a deployment: a `Replica` whose engine is replaced when it comes back.

    The dispatcher thread reads `lifecycle` and calls `submit`; the fleet's health thread swaps
    `engine` and flips `live` under the fleet's lock.
    """

    def __init__(self, deployment: str, target: EngineTarget, url: str, engine: OpenAIEngine):
        self.deployment = deployment
        self.target = target
        self.url = url  # as the pool file shows it (redacted)
        self.name = endpoint_name(deployment, target.base_url)
        self.engine = engine
        self.live = True
        self.closed = False
        self.dead_reason = ""
        self.num_deaths = 0
        self.num_probes = 0
        self.num_missed = 0
        self.next_check_s = 0.0  # monotonic
        self.close_pending = False  # dead, its engine not closed yet (the health thread does it)

    def capabilities(self) -> Capabilities:
        return self.engine.capabilities()

    def submit(self, request: Request, controls: Sequence[Control] = ()) -> Ticket:
        if not self.live:
            return Ticket(request.request_id, Acceptance.REJECTED, f"{self.name} is dead")
        return self.engine.submit(request, controls)

    def inform(self, intent: Intent) -> None:
        self.engine.inform(intent)

    @property
    def lifecycle(self) -> Lifecycle:
        if self.closed:
            return Lifecycle.STOPPED
        return Lifecycle.READY if self.live else Lifecycle.UNREACHABLE

    def state(self) -> EngineState:
        return replace(self.engine.state(), name=self.name, lifecycle=self.lifecycle)


class Fleet:
    """The endpoints of a run and their health; the dispatcher's `Failover` (module docstring).

    Build it with `fleet_open.open_fleet`. `replicas()` is what the dispatcher places on; `watch(fn)` has
    `fn(replica_name)` called (through `deliver`) when an endpoint is probed back in; `close()`
    stops the health thread and every engine.
    """

    def __init__(
        self,
        endpoints: Sequence[Endpoint],
        source: str,
        options: FleetOptions,
        make_engine: Callable[[Endpoint], OpenAIEngine],
        deliver: Deliver | None,
    ) -> None:
        self.endpoints = tuple(endpoints)
        self.source = source
        self.options = options
        self._by_name = {e.name: e for e in self.endpoints}
        self._make_engine = make_engine
        self._deliver = deliver
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._on_change: Callable[[str], None] | None = None
        self._thread: threading.Thread | None = None
        self.log: list[tuple[str, str, str]] = []
        """(replica, "dead" | "live", reason): what the health watch decided, in order."""
        now = time.monotonic()
        for ep in self.endpoints:
            ep.next_check_s = now + (options.heartbeat_s or 0.0)

    def replicas(self) -> list[Replica]:
        return list(self.endpoints)

    def watch(self, on_change: Callable[[str], None]) -> None:
        """Call `on_change(name)` when an endpoint comes back, and start the health thread."""
        self._on_change = on_change
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="fleet-health", daemon=True)
            self._thread.start()

    # -- the dispatcher's Failover ---------------------------------------------------------

    def reroute(self, replica: str, outcome: Outcome, num_reroutes: int) -> bool:
        """Place the op again when its endpoint stopped answering (or is dead already)."""
        ep = self._by_name.get(replica)
        if ep is None or self._stop.is_set():
            return False
        last = outcome.attempts[-1] if outcome.attempts else None
        if last is not None and last.kind in LOST_KINDS:
            self.mark_dead(ep, last.error or last.kind or "connection lost")
        return not ep.live and num_reroutes < self.options.max_reroutes

    def no_live_reason(self, deployment: str) -> str | None:
        eps = [e for e in self.endpoints if e.deployment == deployment]
        if not eps or any(e.live for e in eps):
            return None
        why = "; ".join(f"{e.url} dead: {first_line(e.dead_reason, 100)}" for e in eps)
        return (
            f"pool file {self.source}: deployment {deployment}: no live endpoint ({why}); "
            f"each is probed every {self.options.probe_max_s:g} s at most — restart one"
        )

    # -- health ----------------------------------------------------------------------------

    def mark_dead(self, ep: Endpoint, reason: str) -> None:
        """Mark `ep` dead (once) and have the health thread close its engine and probe it."""
        with self._lock:
            if not ep.live or ep.closed:
                return
            ep.live = False
            ep.dead_reason = reason
            ep.num_deaths += 1
            ep.num_probes = 0
            ep.close_pending = True
            ep.next_check_s = time.monotonic() + self.options.probe_delay_s(0)
            self.log.append((ep.name, "dead", first_line(reason)))
        log.warning("fleet: %s marked dead: %s", ep.name, first_line(reason))
        self._wake.set()

    def _run(self) -> None:
        while not self._stop.is_set():
            with self._lock:
                pending = [e for e in self.endpoints if e.close_pending]
                for e in pending:
                    e.close_pending = False
                due = min((e.next_check_s for e in self.endpoints), default=None)
            for e in pending:  # ops in flight there end now (ABORTED) and are re-placed
                self.close_engine(e.engine)
            now = time.monotonic()
            if due is not None and due <= now:
                for e in self.endpoints:
                    if e.next_check_s <= now and not self._stop.is_set():
                        self._check(e)
                continue
            wait = None if due is None or due == float("inf") else due - now
            self._wake.wait(wait)
            self._wake.clear()

    def _check(self, ep: Endpoint) -> None:
        opts = self.options
        if ep.live:
            if opts.heartbeat_s is None:
                ep.next_check_s = float("inf")
                return
            ok, why = self._answers(ep, opts.heartbeat_timeout_s)
            with self._lock:
                if not ep.live:  # marked dead meanwhile: its probe schedule stands
                    return
                ep.num_missed = 0 if ok else ep.num_missed + 1
                ep.next_check_s = time.monotonic() + opts.heartbeat_s
            if ep.num_missed >= opts.max_missed_heartbeats:
                self.mark_dead(ep, f"{ep.num_missed} heartbeats unanswered ({why})")
            return
        ok, why = self._answers(ep, opts.probe_timeout_s)
        engine: OpenAIEngine | None = None
        if ok:
            try:
                engine = self._make_engine(ep).start()  # discovery again: it may have changed
            except MaserveError as exc:
                why = first_line(str(exc))
        if engine is not None and self._stop.is_set():  # the fleet closed meanwhile
            self.close_engine(engine)
            return
        with self._lock:
            if engine is None:
                ep.num_probes += 1
                ep.next_check_s = time.monotonic() + opts.probe_delay_s(ep.num_probes)
                return
            ep.engine, ep.live, ep.num_missed = engine, True, 0
            ep.next_check_s = time.monotonic() + (opts.heartbeat_s or float("inf"))
            self.log.append((ep.name, "live", f"after {ep.num_probes + 1} probe(s)"))
        log.warning("fleet: %s is back after %d probe(s)", ep.name, ep.num_probes + 1)
        callback = self._on_change
        if callback is not None:
            name = ep.name
            if self._deliver is None:
                callback(name)
            else:
                self._deliver(lambda: callback(name))

    def _answers(self, ep: Endpoint, timeout_s: float) -> tuple[bool, str]:
        auth = ep.target.client_auth()
        headers = {"Authorization": f"Bearer {auth['api_key']}"} | auth["headers"]
        try:
            resp = httpx.get(f"{ep.target.base_url}/v1/models", headers=headers, timeout=timeout_s)
        except httpx.HTTPError as exc:
            return False, f"{type(exc).__name__}: {exc}"
        return resp.status_code == 200, f"HTTP {resp.status_code}"

    @staticmethod
    def close_engine(engine: OpenAIEngine) -> None:
        """Close `engine`; an error it reports (a ticket callback's) is logged, not raised."""
        try:
            engine.close()
        except MaserveError as exc:  # a callback's error surfaced at close: keep watching
            log.warning("fleet: closing %s: %s", engine.name, exc)

    def close(self) -> None:
        """Stop the health watch and close every endpoint's engine (in-flight ops end ABORTED)."""
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(30)
        with self._lock:
            for ep in self.endpoints:
                ep.closed = True
        for ep in self.endpoints:
            self.close_engine(ep.engine)
