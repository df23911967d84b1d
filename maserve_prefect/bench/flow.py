"""The `maserve-suite` Prefect flow: what `maserve bench run` calls and `maserve bench serve` deploys.

One idea: the flow lives at module level in its own module so a served deployment can load it by
module path (`maserve_prefect.bench.flow.maserve_suite`) in the runner's flow-run subprocess,
from an editable install or a wheel alike; importing it imports Prefect, so the rest of
`bench` imports this module lazily.

Examples:
    >>> maserve_suite.name
    'maserve-suite'
"""

from __future__ import annotations

from typing import Any

from prefect import flow

from maserve_prefect.bench import runner
from maserve_prefect.bench.suite import load_suite
from maserve_prefect.metrics.report import publish_artifacts


@flow(name="maserve-suite", persist_result=False, log_prints=False)
def maserve_suite(path: str, scale: str = "demo", capture: str | None = None) -> dict[str, Any]:
    """Run a benchmark suite: every scenario's arms, the conformance audit, the metric tables,
    the findings; a progress artifact advances after each arm run (`runner.execute_suite`), and
    every table (`SuiteResult.tables`) is published as a table artifact plus one markdown report.

    Args:
        path: the suite YAML file.
        scale: demo or full.
        capture: internal; a key under which an in-process `run_suite` collects the full result.

    Returns:
        The JSON summary (`SuiteResult.to_json`), also published as table artifacts.
    """
    from prefect.runtime import flow_run

    progress = runner.PROGRESS.get(capture) if capture is not None else None
    res = runner.execute_suite(load_suite(path), scale, prefect=True, progress=progress)
    res.flow_run_id = str(flow_run.id)
    publish_artifacts(
        res.tables(),
        f"## suite {res.suite.name} ({scale})\n\n{res.suite.description}",
        prefix=f"maserve-suite-{res.suite.name}",
    )
    if capture is not None:
        runner.CAPTURE[capture] = res
    return res.to_json()
