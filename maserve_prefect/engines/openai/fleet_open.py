"""Opening a fleet: discovery per endpoint, in parallel, with one-line errors (`fleet`).

`open_fleet` builds one `OpenAIEngine` per endpoint the pool file lists for the run's
deployments, starts them all at once (each runs capability discovery) and returns the `Fleet`;
`check_endpoints` is the cheap check a command runs before it starts anything (`GET /v1/models`
only). Either refuses an endpoint that does not answer with one line naming the pool file, the
deployment and the URL, and leaves nothing running.

Examples:
    >>> from maserve_prefect.engines.poolfile import PoolFile
    >>> pf = PoolFile.model_validate({"deployments": [{"name": "main", "model": "Qwen3-8B",
    ...     "replicas": ["http://127.0.0.1:9"]}], "source": "fleet.yaml"})
    >>> check_endpoints(pf, timeout_s=0.5)
    Traceback (most recent call last):
    ...
    maserve_prefect.errors.ConfigError: pool file fleet.yaml: deployment main: endpoint http://127.0.0.1:9 did not answer discovery: ...
"""

from __future__ import annotations

import concurrent.futures
from collections.abc import Callable, Mapping, Sequence

from maserve_prefect.engines.openai.discovery import discover
from maserve_prefect.engines.openai.engine import OpenAIEngine
from maserve_prefect.engines.openai.fleet import (
    FLEET_RETRY,
    Deliver,
    Endpoint,
    Fleet,
    FleetOptions,
    endpoint_name,
    first_line,
)
from maserve_prefect.engines.poolfile import PoolFile
from maserve_prefect.engines.target import EngineTarget
from maserve_prefect.errors import ConfigError, MaserveError

__all__ = ["check_endpoints", "open_fleet"]


def open_fleet(
    pool_file: PoolFile,
    deployments: Sequence[str],
    *,
    now: Callable[[], float],
    deliver: Deliver | None,
    options: FleetOptions | None = None,
    engine_kwargs: Mapping[str, object] | None = None,
) -> Fleet:
    """Discover every endpoint of `deployments` (in parallel) and return the fleet.

    Raises:
        ConfigError: a deployment lists no endpoint, or one does not answer discovery (one line:
            pool file, deployment, URL, why); nothing is left running.
    """
    opts = options or FleetOptions()
    source = pool_file.source or "(inline)"
    entries = {d.name: d for d in pool_file.deployments}
    planned: list[tuple[str, EngineTarget, str]] = []
    for name in deployments:
        entry = entries.get(name)
        if entry is None or not entry.replicas:
            raise ConfigError(
                f"pool file {source}: deployment {name}: no endpoints; list them under "
                "`replicas: [http://HOST:PORT, ...]` to run it with --engine fleet"
            )
        planned += [(name, t, u) for t, u in zip(entry.endpoints(), entry.replicas, strict=True)]
    kwargs = dict(engine_kwargs or {})

    def make(dep: str, target: EngineTarget) -> OpenAIEngine:
        return OpenAIEngine(
            target.base_url,
            model=target.model,
            name=endpoint_name(dep, target.base_url),
            deployment=dep,
            now=now,
            deliver=deliver,
            retry=FLEET_RETRY,
            discovery_timeout_s=opts.discovery_timeout_s,
            **(target.client_auth() | kwargs),  # type: ignore[arg-type]
        )

    engines = [make(dep, t) for dep, t, _ in planned]
    with concurrent.futures.ThreadPoolExecutor(max(1, min(8, len(engines)))) as pool:
        results = list(pool.map(_started, engines))
    if any(err is not None for err in results):
        for eng in engines:
            Fleet.close_engine(eng)
        _refuse_failed(source, planned, results)
    endpoints = [Endpoint(d, t, u, e) for (d, t, u), e in zip(planned, engines, strict=True)]
    return Fleet(
        endpoints, source, opts, lambda ep: make(ep.deployment, ep.target), deliver=deliver
    )


def check_endpoints(pool_file: PoolFile, timeout_s: float = 10.0) -> None:
    """Fail fast, before a run starts anything: every endpoint the pool file lists answers
    `GET /v1/models` with the model it names (no probe completions; `open_fleet` runs the full
    discovery).

    Raises:
        ConfigError: one line naming the pool file, the deployment and the endpoint's URL.
    """
    planned = [
        (d.name, t, u)
        for d in pool_file.deployments
        for t, u in zip(d.endpoints(), d.replicas, strict=True)
    ]

    def check(target: EngineTarget) -> str | None:
        try:
            discover(target.base_url, model=target.model, probe=False, timeout_s=timeout_s,
                     **target.client_auth())  # fmt: skip
        except MaserveError as exc:
            return str(exc)
        return None

    with concurrent.futures.ThreadPoolExecutor(max(1, min(8, len(planned)))) as pool:
        results = list(pool.map(check, [t for _, t, _ in planned]))
    _refuse_failed(pool_file.source or "(inline)", planned, results)


def _refuse_failed(
    source: str, planned: Sequence[tuple[str, EngineTarget, str]], results: Sequence[str | None]
) -> None:
    failed = [(p, err) for p, err in zip(planned, results, strict=True) if err is not None]
    if failed:
        (dep, _, url), err = failed[0]
        more = f" (and {len(failed) - 1} more)" if len(failed) > 1 else ""
        raise ConfigError(
            f"pool file {source}: deployment {dep}: endpoint {url} did not answer discovery"
            f"{more}: {first_line(err, 240)}"
        )


def _started(engine: OpenAIEngine) -> str | None:
    try:
        engine.start()
    except MaserveError as exc:
        return str(exc)
    return None
