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
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from dataclasses import replace

from maserve_prefect.clock import WallClock
from maserve_prefect.engine.openai.engine import OpenAIEngine
from maserve_prefect.engine.protocol import (
    Capabilities,
    Control,
    EngineState,
    Intent,
    Replica,
    Request,
    Ticket,
)
from maserve_prefect.engine.target import EngineTarget

Deliver = Callable[[Callable[[], None]], None]


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

    def submit(self, request: Request, controls: Sequence[Control] = ()) -> Ticket:
        return self.engine.submit(replace(request, deployment=self.engine.deployment), controls)

    def inform(self, intent: Intent) -> None:
        self.engine.inform(intent)

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
        **kwargs,  # type: ignore[arg-type]
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
