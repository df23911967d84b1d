"""Serving benchmark suites as scheduled Prefect deployments (`maserve bench serve`).

One idea: every suite file with a `schedule`, of any kind (replay, pool, hear), becomes one
deployment of the `maserve-suite` flow (`bench.flow`), named after the suite, with parameters
`{path, scale}` and its cron or interval schedule, and one Prefect `Runner` serves them all from
this process — Prefect's `serve`, with
one addition: the runner also *creates* the scheduled runs. The local server `maserve` manages
runs without Prefect's scheduler service (and the test harness's ephemeral server has none), so
a served deployment would otherwise never get a run; every `schedule_every_s` the runner asks the
API to schedule each served deployment's upcoming runs (`POST /deployments/{id}/schedule`, the
same call the scheduler service makes; it is idempotent, so on a server whose scheduler is on
nothing is scheduled twice). Runs execute in the runner's subprocesses, which load the flow by
module path, so serving works from a wheel as from a checkout, entirely offline.

Stop with Ctrl-C or SIGTERM; schedules are paused on shutdown (Prefect's default for `serve`).

Every suite file in the folder is loaded (and must be valid); the scale must be one every served
suite has (replay suites: demo / full; pool and HEAR suites name theirs). `serving_line` is the
line `maserve bench serve` prints once the deployments are built: every suite served, its kind
and when it runs, and the suites left out for having no `schedule`.

Examples:
    >>> scheduled_suites("/nonexistent")
    Traceback (most recent call last):
    ...
    maserve_prefect.errors.ConfigError: suites folder /nonexistent does not exist; pass --suites DIR
"""

from __future__ import annotations

import asyncio
import datetime as dt
import re
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast
from uuid import UUID

from maserve_prefect.bench.fanout import Fanout
from maserve_prefect.bench.suite import Suite, find_suites, load_suite
from maserve_prefect.bench.suite_base import Schedule
from maserve_prefect.errors import ConfigError

if TYPE_CHECKING:
    from prefect.deployments.runner import RunnerDeployment

SCHEDULE_EVERY_S = 10.0


def scheduled_suites(folder: str | Path) -> list[tuple[Path, Suite]]:
    """The suites in `folder` that have a schedule, as (resolved path, suite), sorted by path.

    Raises:
        ConfigError: the folder is missing, or a suite file is invalid (file and field named).
    """
    out = []
    for path in find_suites(folder):
        suite = load_suite(path)
        if suite.schedule is not None:
            out.append((path.resolve(), suite))
    return out


def describe_schedule(schedule: Schedule) -> str:
    """When a schedule runs, in words (cron times are UTC, Prefect's default).

    Examples:
        >>> describe_schedule(Schedule(cron="10 3 * * *"))
        'daily 03:10 UTC'
        >>> describe_schedule(Schedule(cron="0 */6 * * 1"))
        'cron "0 */6 * * 1" UTC'
        >>> describe_schedule(Schedule(interval_s=90))
        'every 90 s'
    """
    if schedule.interval_s is not None:
        return f"every {schedule.interval_s:g} s"
    cron = str(schedule.cron).strip()
    daily = re.fullmatch(r"(\d{1,2})\s+(\d{1,2})\s+\*\s+\*\s+\*", cron)
    if daily is not None:
        return f"daily {int(daily[2]):02d}:{int(daily[1]):02d} UTC"
    return f'cron "{cron}" UTC'


def serving_line(folder: str | Path, scale: str = "demo") -> str:
    """One line: each suite `maserve bench serve` registers (name, kind, when it runs) and the
    suites in `folder` it leaves out (no `schedule`).

    Raises:
        ConfigError: the folder is missing or a suite file is invalid.
    """
    served, unscheduled = [], []
    for path in find_suites(folder):
        suite = load_suite(path)
        if suite.schedule is None:
            unscheduled.append(suite.name)
        else:
            served.append(f"{suite.name} ({suite.kind}, {describe_schedule(suite.schedule)})")
    line = f"serving {len(served)} suite(s) at scale {scale}: " + "; ".join(served)
    if unscheduled:
        line += f" — not served (no `schedule`): {', '.join(unscheduled)}"
    return line


def check_servable(folder: str | Path, scale: str = "demo") -> list[tuple[Path, Suite]]:
    """`scheduled_suites(folder)`, refusing an empty result or a scale a served suite lacks.

    Raises:
        ConfigError: no suite in `folder` has a schedule, a suite file is invalid, or a
            scheduled suite has no scale `scale`.
    """
    suites = scheduled_suites(folder)
    if not suites:
        raise ConfigError(
            f"no suite in {folder} has a `schedule`; add `schedule: {{interval_s: N}}` or "
            "`schedule: {cron: ...}` to a suite file"
        )
    for _, suite in suites:
        suite.check_scale(scale)
    return suites


def suite_deployment(
    path: Path,
    suite: Suite,
    scale: str = "demo",
    *,
    workers: int = 1,
    dask_address: str | None = None,
) -> RunnerDeployment:
    """The deployment of one scheduled suite of any kind (name = suite name); `workers` /
    `dask_address` are its runs' Dask fan-out (`bench.fanout`; parameters a run may override).

    Raises:
        ConfigError: a scale the suite does not have.
    """
    from prefect.types.entrypoint import EntrypointType

    from maserve_prefect.bench.flow import maserve_suite

    suite.check_scale(scale)
    assert suite.schedule is not None
    sched = suite.schedule
    deployment = maserve_suite.to_deployment(
        name=suite.name,
        description=suite.description or None,
        parameters={"path": str(path), "scale": scale} | fanout_parameters(workers, dask_address),
        cron=sched.cron,
        interval=dt.timedelta(seconds=sched.interval_s) if sched.interval_s is not None else None,
        tags=["maserve-bench"],
        entrypoint_type=EntrypointType.MODULE_PATH,
    )
    # `to_deployment` dispatches on context: called from sync code it returns the deployment.
    return cast("RunnerDeployment", deployment)


def fanout_parameters(workers: int = 1, dask_address: str | None = None) -> dict[str, Any]:
    """The `maserve-suite` flow parameters for a fan-out (none for the default: in process).

    Examples:
        >>> fanout_parameters(), fanout_parameters(2)
        ({}, {'workers': 2})
        >>> fanout_parameters(dask_address="tcp://h:8786")
        {'dask_address': 'tcp://h:8786'}
    """
    out: dict[str, Any] = {}
    if workers != 1:
        out["workers"] = workers
    if dask_address is not None:
        out["dask_address"] = dask_address
    return out


async def _keep_scheduled(ids: Sequence[UUID], every_s: float) -> None:
    from prefect.client.orchestration import get_client

    async with get_client() as client:
        while True:
            for dep_id in ids:
                resp = await client._client.post(f"/deployments/{dep_id}/schedule", json={})
                resp.raise_for_status()
            await asyncio.sleep(every_s)


async def serve_async(
    deployments: Sequence[RunnerDeployment],
    *,
    limit: int | None = None,
    schedule_every_s: float = SCHEDULE_EVERY_S,
) -> None:
    """Register `deployments`, keep their runs scheduled and execute them until stopped."""
    from prefect.runner import Runner

    runner: Any = Runner(pause_on_shutdown=True, limit=limit)
    ids = [await runner.aadd_deployment(d) for d in deployments]
    scheduler = asyncio.create_task(_keep_scheduled(ids, schedule_every_s))
    try:
        await runner.start()
    finally:
        scheduler.cancel()
        await asyncio.gather(scheduler, return_exceptions=True)


def serve_suites(
    folder: str | Path,
    scale: str = "demo",
    *,
    limit: int | None = None,
    schedule_every_s: float = SCHEDULE_EVERY_S,
    workers: int = 1,
    dask_address: str | None = None,
) -> list[str]:
    """Serve every scheduled suite in `folder` (blocks until Ctrl-C / SIGTERM).

    Call it with a Prefect API configured (`prefect_server.ensure_server` + `connected`).

    Args:
        folder: the suites folder (e.g. `deployments/suites`).
        scale: the scale every served suite runs at.
        limit: most flow runs at once (None: Prefect's default).
        schedule_every_s: how often upcoming runs are scheduled (see the module docstring).
        workers: each run's local Dask workers for its units (1: in the run's process).
        dask_address: each run's units on this existing Dask scheduler instead.

    Returns:
        The names of the suites that were served.

    Raises:
        ConfigError: no suite in `folder` has a schedule, a suite file is invalid, or a served
            suite has no scale `scale`.

    Examples:
        >>> serve_suites("deployments/suites")  # doctest: +SKIP
    """
    suites = check_servable(folder, scale)
    Fanout(workers, dask_address)  # a bad count or address fails before serving
    deployments = [
        suite_deployment(p, s, scale, workers=workers, dask_address=dask_address) for p, s in suites
    ]
    try:
        asyncio.run(serve_async(deployments, limit=limit, schedule_every_s=schedule_every_s))
    except KeyboardInterrupt:
        pass
    return [s.name for _, s in suites]
