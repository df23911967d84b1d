"""The Prefect UI as a user meets it, in headless Chromium (issue 20, part 4).

A small native run (`maserve run fork_join`, 2 roots; it starts the managed Prefect server, UI
on by default, and announces it) and a replay of it (`maserve replay`, two arms) on that server; then the UI, driven by
Playwright with the system's Chromium (`make browser-deps` installs Debian's `chromium`):

- a root's flow-run page loads under its readable name (`fork_join/r0000 · …`) with its tags
  and its parent run (the run's `maserve-run` flow run);
- its task graph has the op DAG's edges: the graph is drawn on a canvas, so the edges are read
  from the graph data the page itself fetched (`/api/flow_runs/{id}/graph-v2`) and compared
  with the ledger's data and control edges of that root;
- the replay's table, markdown and plot artifacts render (an HTML table with numbers rounded as
  the terminal prints them, the markdown report's tables, the plot as a decoded image).

Screenshots go to `out/ui/`. Skipped only when no browser (or Playwright) is installed.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from maserve_prefect import prefect_server
from maserve_prefect.trace.bundle import import_bundle
from maserve_prefect.trace.model import EdgeKind

pytestmark = [pytest.mark.slow, pytest.mark.prefect]

REPO = Path(__file__).resolve().parents[2]
SHOTS = REPO / "out" / "ui"
BROWSERS = ("chromium", "chromium-browser", "google-chrome")


def _chromium() -> str:
    path = os.environ.get("MASERVE_CHROMIUM") or next(
        (p for p in map(shutil.which, BROWSERS) if p), None
    )
    if path is None:
        pytest.skip("no Chromium installed (`make browser-deps` installs Debian's `chromium`)")
    pytest.importorskip("playwright.sync_api", reason="Playwright is not installed")
    return path


@pytest.fixture
def env(tmp_path: Path) -> Iterator[dict[str, str]]:
    """A fresh MASERVE_HOME whose managed server (UI on) runs for the test, then stops."""
    home = tmp_path / "home"
    clean = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_")}
    clean.update(MASERVE_HOME=str(home), PREFECT_HOME=str(tmp_path / "client-prefect"))
    clean.pop(prefect_server.ENV_PREFECT_UI, None)
    try:
        yield clean
    finally:
        prefect_server.stop(home / "prefect", timeout_s=10)


def _maserve(env: dict[str, str], *args: str) -> str:
    proc = subprocess.run(
        [sys.executable, "-c", "from maserve_prefect.cli import main; main()", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc.stdout + proc.stderr


def _flow_runs(api: str, **flt: Any) -> list[dict[str, Any]]:
    body = {"limit": 200, **({"flow_runs": flt} if flt else {})}
    runs: list[dict[str, Any]] = httpx.post(f"{api}/flow_runs/filter", json=body).json()
    return runs


def _artifacts(api: str, flow_run_id: str) -> dict[str, dict[str, Any]]:
    body = {"artifacts": {"flow_run_id": {"any_": [flow_run_id]}}, "limit": 200}
    return {a["key"]: a for a in httpx.post(f"{api}/artifacts/filter", json=body).json()}


def test_the_ui_shows_named_roots_their_op_graph_and_the_replay_artifacts(
    env: dict[str, str], tmp_path: Path
) -> None:
    from playwright.sync_api import sync_playwright

    chromium = _chromium()
    bundle = tmp_path / "fj"
    # no server yet: `maserve run` starts the managed one (UI on) and says so in one line
    out = _maserve(env, "run", "fork_join", "--users", "2", "--seed", "0", "--out", str(bundle))
    info = prefect_server.status(Path(env["MASERVE_HOME"]) / "prefect")
    assert info.running and info.ui and info.ui_url is not None and info.url is not None
    api, ui = info.url, info.ui_url
    assert f"started a Prefect server: UI {ui} (API {api}), database sqlite:///" in out
    assert "stop it with `maserve server stop`" in out
    assert f"Prefect UI: {ui}/runs/flow-run/" in out  # the parent run's page
    scenario = {
        "name": "ui-check",
        "cohorts": [{"name": "fj", "bundle": str(bundle)}],
        "arrivals": {"kind": "poisson", "rate_per_s": 0.5, "seed": 1},
        "arms": [{"name": "dag", "release": "dag"}, {"name": "flat", "release": "flat"}],
    }
    (tmp_path / "sc.yaml").write_text(yaml.safe_dump(scenario))
    _maserve(env, "replay", str(tmp_path / "sc.yaml"))

    trace = import_bundle(bundle).trace
    tid = trace.manifest.trace_id
    runs = {r["name"]: r for r in _flow_runs(api)}
    root = next(r for name, r in runs.items() if name.startswith("fork_join/r0000 · "))
    assert f"trace:{tid}" in root["tags"] and "workflow:fork_join" in root["tags"]
    # The op DAG of root r0000 as the ledger recorded it (data and control edges, by op id).
    ops = {op.op_id: op for op in trace.ops if op.root_id == "r0000"}
    dag = {
        (d.op_id, op.op_id)
        for op in ops.values()
        for d in op.deps
        if d.kind is not EdgeKind.STATE and d.op_id in ops
    }
    assert dag
    replay = runs["ui-check"]
    arts = _artifacts(api, replay["id"])
    table, report = arts["maserve-replay-ui-check-arms"], arts["maserve-replay-ui-check-report"]
    plot = arts["maserve-replay-ui-check-plot-latency-cdf"]
    arm = runs["ui-check-dag-b0"]
    assert "maserve-replay-ui-check-dag-b0" in _artifacts(api, arm["id"])

    SHOTS.mkdir(parents=True, exist_ok=True)
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=chromium, args=["--no-sandbox"])
        try:
            page = browser.new_page(viewport={"width": 1280, "height": 800})
            with page.expect_response(lambda r: "/graph-v2" in r.url, timeout=60_000) as got:
                page.goto(f"{ui}/runs/flow-run/{root['id']}")
            page.get_by_text(root["name"]).first.wait_for(timeout=30_000)
            page.get_by_text(f"trace:{tid}").first.wait_for(timeout=10_000)
            page.get_by_text(tid, exact=True).first.wait_for(timeout=10_000)  # the parent run
            graph = got.value.json()
            page.wait_for_timeout(1000)  # the canvas draws after the data arrives
            page.screenshot(path=str(SHOTS / "root.png"))

            nodes = {node_id: node for node_id, node in graph["nodes"]}
            label = {node_id: node["label"] for node_id, node in nodes.items()}
            edges = {
                (label[p["id"]], node["label"])
                for node in nodes.values()
                for p in node["parents"]
                if p["id"] in label
            }
            assert sorted(label.values()) == sorted(ops)
            assert edges == dag

            page.goto(f"{ui}/artifacts/artifact/{table['id']}")
            page.locator("table").first.wait_for(timeout=30_000)
            cells = page.locator("table td").all_inner_texts()
            numbers = [c for c in cells if re.fullmatch(r"-?\d+\.\d+", c.strip())]
            # rounded as printed: at most 4 significant digits (18.186142426918536 -> 18.19)
            assert numbers and all(len(c.replace(".", "").lstrip("-0")) <= 4 for c in numbers)
            page.screenshot(path=str(SHOTS / "replay-table.png"))

            page.goto(f"{ui}/artifacts/artifact/{report['id']}")
            page.get_by_text("replay ui-check").first.wait_for(timeout=30_000)
            assert page.locator("table").count() >= 3
            page.screenshot(path=str(SHOTS / "replay-report.png"), full_page=True)

            page.goto(f"{ui}/artifacts/artifact/{plot['id']}")
            img = page.locator("img[src^='data:image/png']").first
            img.wait_for(timeout=30_000)
            page.wait_for_function(
                "i => i.complete && i.naturalWidth > 0", arg=img.element_handle()
            )
            page.screenshot(path=str(SHOTS / "replay-plot.png"))
        finally:
            browser.close()
