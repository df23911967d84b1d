"""`maserve bench serve` offline: suites of any kind on a 5 s interval get scheduled runs that
complete."""

from __future__ import annotations

import asyncio
import importlib.util
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from bench_factories import write_hear_suite, write_suite

SERVE = "from maserve_prefect.cli import main; main()"
REPO = Path(__file__).resolve().parents[2]
MAX_WAIT_S = 150.0


async def _states(deployment: str) -> list[tuple[str, str]]:
    """(state type, auto-scheduled?) of every flow run of `deployment`."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import DeploymentFilter, DeploymentFilterName

    async with get_client() as client:
        runs = await client.read_flow_runs(
            deployment_filter=DeploymentFilter(name=DeploymentFilterName(any_=[deployment]))
        )
        return [(r.state_type.value if r.state_type else "", str(r.auto_scheduled)) for r in runs]


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_a_served_suite_runs_on_its_schedule(tmp_path: Path, prefect_api: None) -> None:
    from prefect.settings import PREFECT_API_URL

    suites = tmp_path / "suites"
    suites.mkdir()
    write_suite(suites, name="served-toy", schedule={"interval_s": 5})
    write_hear_suite(suites, name="served-hear", schedule={"interval_s": 5})
    env = os.environ | {
        "PREFECT_API_URL": str(PREFECT_API_URL.value()),
        "PREFECT_RUNNER_POLL_FREQUENCY": "2",
    }
    log = (tmp_path / "serve.log").open("w")
    proc = subprocess.Popen(
        [sys.executable, "-c", SERVE, "bench", "serve", "--suites", str(suites),
         "--schedule-every-s", "2", "--limit", "1"],
        stdout=log, stderr=subprocess.STDOUT, env=env,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + MAX_WAIT_S
        states: dict[str, list[tuple[str, str]]] = {}
        while time.monotonic() < deadline and proc.poll() is None:
            states = {name: asyncio.run(_states(name)) for name in ("served-toy", "served-hear")}
            if all(("COMPLETED", "True") in s for s in states.values()):
                break
            time.sleep(2.0)
        assert proc.poll() is None, (tmp_path / "serve.log").read_text()[-3000:]
        assert all(("COMPLETED", "True") in s for s in states.values()), (
            states,
            (tmp_path / "serve.log").read_text()[-3000:],
        )
        assert not any(s == "FAILED" for runs in states.values() for s, _ in runs)
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()


def test_the_serve_entry_point_serves_the_shipped_suites(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """`python deployments/serve.py` serves `deployments/suites` (servable: see test_bench_cli)
    and refuses a bad scale before it starts a server."""
    spec = importlib.util.spec_from_file_location(
        "deployments_serve", REPO / "deployments" / "serve.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert module.SUITES == REPO / "deployments" / "suites"
    assert module.main(["huge"]) == 1
    assert "unknown scale 'huge'" in capsys.readouterr().err
