"""Real-engine replicas for runs and replays: one OpenAI-compatible server, one replica per name.

One idea: a workflow addresses deployments by name ("main", "small", ...) and the dispatcher
places a unit only on a replica whose `deployment` matches. A single server can serve them all,
so `open_openai_replicas` starts one `OpenAIEngine` for the server and gives each deployment name
an `EngineAlias` — a Replica with that deployment that forwards to the shared engine (one HTTP
client, one event loop thread, one concurrency bound).

`openai_replicas_factory(target)` is the replay driver's factory: it builds those replicas on
the replay's wall clock with the engine *attached* to the driver's own event loop
(`OpenAIEngine.attach`), so the driver, the dispatcher and the HTTP streams all run on one thread
and a completion reaches the driver without crossing threads.

`drain_server(base_url)` brings a shared server to the drained state a fair comparison starts
from, before each arm of a scenario: it waits until the server's own gauges
(`vllm:num_requests_running`, `vllm:num_requests_waiting` on `/metrics`) read zero — the last
arm's cut-off requests may still be aborting — and then empties the prefix cache with
`POST /reset_prefix_cache`, retrying while the server answers `{"success": false}` (blocks still
held). vLLM serves that endpoint only when started with `VLLM_SERVER_DEV_MODE=1`; a server
without it (404) cannot be reset, and the `DrainReport` says so instead of pretending:
"prefix cache not reset: unsupported by the server".

Examples:
    >>> DrainReport(idle=True, prefix_cache_reset=None, waited_s=0.0).describe()
    'idle; prefix cache not reset: unsupported by the server'
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, replace

import httpx

from maserve_prefect.clock import WallClock
from maserve_prefect.engines.openai.engine import OpenAIEngine
from maserve_prefect.engines.openai.metrics_parse import (
    NUM_REQUESTS_RUNNING,
    NUM_REQUESTS_WAITING,
    parse_vllm_metrics,
)
from maserve_prefect.engines.target import EngineTarget
from maserve_prefect.errors import EngineError
from maserve_prefect.protocol.capabilities import Capabilities
from maserve_prefect.protocol.controls import Control
from maserve_prefect.protocol.engine import Replica
from maserve_prefect.protocol.intents import Intent
from maserve_prefect.protocol.outcomes import Ticket
from maserve_prefect.protocol.requests import Request
from maserve_prefect.protocol.state import EngineState, Lifecycle

Deliver = Callable[[Callable[[], None]], None]

DRAIN_TIMEOUT_S = 120.0
"""How long `drain_server` waits, in all, for the server to go idle and for the cache reset."""
_MIN_REQUEST_S = 0.05  # the shortest HTTP timeout a drain request gets near its deadline


class EngineAlias:
    """A Replica named for one deployment, served by a shared `OpenAIEngine`.

    Requests are forwarded with their deployment rewritten to the engine's own.
    """

    def __init__(self, engine: OpenAIEngine, deployment: str) -> None:
        self.engine = engine
        self.deployment = deployment
        self.name = f"{engine.name}:{deployment}"

    def capabilities(self) -> Capabilities:
        return self.engine.capabilities()

    async def warmed(self) -> None:
        """Wait for the shared engine's warm-up (`OpenAIEngine.warmed`)."""
        await self.engine.warmed()

    def submit(self, request: Request, controls: Sequence[Control] = ()) -> Ticket:
        return self.engine.submit(replace(request, deployment=self.engine.deployment), controls)

    def inform(self, intent: Intent) -> None:
        self.engine.inform(intent)

    @property
    def lifecycle(self) -> Lifecycle:
        return self.engine.lifecycle

    def state(self) -> EngineState:
        st = self.engine.state()
        return replace(st, name=self.name, deployment=self.deployment)


def open_openai_replicas(
    target: EngineTarget,
    deployments: Sequence[str],
    *,
    now: Callable[[], float],
    deliver: Deliver | None,
    **engine_kwargs: object,
) -> tuple[list[Replica], Callable[[], None]]:
    """Start one engine for `target` and return a replica per deployment name, and a closer.

    Raises:
        EngineError: the server is unreachable (discovery names the URL).
        ConfigError: the server has several models and the target names none.
    """
    engine = _engine(target, now, deliver, engine_kwargs)
    engine.start()
    replicas: list[Replica] = [EngineAlias(engine, d) for d in deployments]
    return replicas, engine.close


def _engine(
    target: EngineTarget,
    now: Callable[[], float],
    deliver: Deliver | None,
    kwargs: dict[str, object],
) -> OpenAIEngine:
    return OpenAIEngine(
        target.base_url,
        model=target.model,
        name="openai",
        now=now,
        deliver=deliver,
        **(target.client_auth() | kwargs),  # type: ignore[arg-type]
    )


def openai_replicas_factory(
    target: EngineTarget, **engine_kwargs: object
) -> Callable[[WallClock, Sequence[str]], tuple[Sequence[Replica], Callable[[], Awaitable[None]]]]:
    """The replay driver's factory for `target` (see the module docstring)."""

    def factory(
        clock: WallClock, deployments: Sequence[str]
    ) -> tuple[Sequence[Replica], Callable[[], Awaitable[None]]]:
        # On the driver's own loop: completions reach the driver without a thread hop.
        engine = _engine(target, clock.now, None, engine_kwargs).attach()
        replicas: list[Replica] = [EngineAlias(engine, d) for d in deployments]
        return replicas, engine.aclose

    return factory


# -- drained state between arms -----------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class DrainReport:
    """What `drain_server` found and did.

    Attributes:
        idle: True when the server's gauges read no running and no waiting request; False when
            they did not within the timeout; None when the server exposes no such gauges.
        prefix_cache_reset: True when the prefix cache was emptied; False when every attempt
            answered `success: false` or an error; None when the server has no reset endpoint.
        waited_s: wall seconds the drain took.
        detail: why a step fell short (empty when the server was drained).
    """

    idle: bool | None
    prefix_cache_reset: bool | None
    waited_s: float
    detail: str = ""

    @property
    def drained(self) -> bool:
        """True when the server was idle and its prefix cache was emptied."""
        return self.idle is True and self.prefix_cache_reset is True

    def describe(self) -> str:
        """One line for arm results, e.g. "idle; prefix cache reset"."""
        idle = {True: "idle", False: "still busy", None: "idleness unknown"}[self.idle]
        reset = {
            True: "prefix cache reset",
            False: "prefix cache not reset",
            None: "prefix cache not reset: unsupported by the server",
        }[self.prefix_cache_reset]
        return f"{idle}; {reset}" + (f" ({self.detail})" if self.detail else "")


def _left(deadline: float) -> float:
    """The HTTP timeout of a request that must end by `deadline`."""
    return max(_MIN_REQUEST_S, deadline - time.monotonic())


def _busy(client: httpx.Client, deadline: float) -> tuple[float, float] | None:
    """(running, waiting) from the server's `/metrics`, or None when it shows no such gauges."""
    try:
        resp = client.get("/metrics", timeout=_left(deadline))
    except httpx.HTTPError:
        return None
    if resp.status_code != 200:
        return None
    try:
        values = parse_vllm_metrics(resp.text, (NUM_REQUESTS_RUNNING, NUM_REQUESTS_WAITING))
    except EngineError:
        return None
    if not values:
        return None
    return values.get(NUM_REQUESTS_RUNNING, 0.0), values.get(NUM_REQUESTS_WAITING, 0.0)


def _wait_idle(client: httpx.Client, deadline: float, poll_s: float) -> tuple[bool | None, str]:
    while True:
        busy = _busy(client, deadline)
        if busy is None and time.monotonic() >= deadline:
            return None, "GET /metrics did not answer before the drain's deadline"
        if busy is None:
            return None, "the server exposes no vllm:num_requests_* gauges"
        if busy == (0.0, 0.0):
            return True, ""
        if time.monotonic() >= deadline:
            return False, f"{busy[0]:g} running and {busy[1]:g} waiting requests at the timeout"
        time.sleep(poll_s)


def _reset_prefix_cache(
    client: httpx.Client, deadline: float, poll_s: float
) -> tuple[bool | None, str]:
    while True:
        try:
            resp = client.post("/reset_prefix_cache", timeout=_left(deadline))
        except httpx.HTTPError as exc:
            return False, f"POST /reset_prefix_cache: {type(exc).__name__}: {exc}"
        if resp.status_code in (404, 405):
            return None, ""
        if resp.status_code != 200:
            return False, f"POST /reset_prefix_cache answered {resp.status_code}"
        try:
            ok = bool(resp.json().get("success", True))
        except (ValueError, AttributeError):
            ok = True  # older vLLM answers 200 with an empty body once the cache is reset
        if ok:
            return True, ""
        if time.monotonic() >= deadline:
            return False, "the server kept answering success=false (cache blocks still held)"
        time.sleep(poll_s)


def drain_server(
    base_url: str,
    *,
    timeout_s: float = DRAIN_TIMEOUT_S,
    poll_s: float = 0.05,
    api_key: str = "EMPTY",
    headers: Mapping[str, str] | None = None,
) -> DrainReport:
    """Wait until the server at `base_url` is idle, then empty its prefix cache (module doc).

    Never raises for a server that cannot be drained: the report says what fell short, and the
    caller records it with the run.

    Args:
        base_url: the server root (`EngineTarget.base_url`).
        timeout_s: the longest the whole drain takes: the wait for idleness, the reset and
            every HTTP request in them share this one deadline (a server that accepts
            connections but never answers holds the drain `timeout_s`, not more).
        poll_s: seconds between polls.
        api_key: bearer token (vLLM ignores it unless started with `--api-key`).
        headers: extra request headers (`EngineTarget.auth_headers`).

    Examples:
        >>> r = drain_server("http://127.0.0.1:9", timeout_s=0.1)  # nothing listens there
        >>> r.idle, r.prefix_cache_reset, r.drained
        (None, False, False)
    """
    start = time.monotonic()
    sent = {"Authorization": f"Bearer {api_key}"} | dict(headers or {})
    deadline = start + timeout_s
    with httpx.Client(base_url=base_url, headers=sent, timeout=_left(deadline)) as client:
        idle, why_busy = _wait_idle(client, deadline, poll_s)
        reset, why_reset = _reset_prefix_cache(client, deadline, poll_s)
    detail = "; ".join(d for d in (why_busy, why_reset) if d)
    return DrainReport(idle, reset, time.monotonic() - start, detail)
