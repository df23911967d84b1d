"""Request-level replay under each route: prefix routing is the same with fast-forward on or off,
and the CLI prints the reuse bound beside the measured reuse."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from maserve_prefect.cli import _mount, app
from maserve_prefect.clock.kernel import Kernel
from maserve_prefect.engines.sim.pool.sim_pool import Deployment, SimPool
from maserve_prefect.errors import ConfigError
from maserve_prefect.replay.requests import ReplayResult, replay_requests
from maserve_prefect.trace.mooncake import import_mooncake

runner = CliRunner()
_mount()


def _slice(shared_data: Path, tmp_path: Path, n: int) -> Path:
    src = shared_data / "traces" / "mooncake_synthetic_trace.jsonl"
    dst = tmp_path / "slice.jsonl"
    dst.write_text("\n".join(src.read_text().splitlines()[:n]) + "\n")
    return dst


def _replay(path: Path, route: str, fast_forward: bool) -> ReplayResult:
    k = Kernel()
    pool = SimPool(k, ["H100:0", "H100:1", "H100:2"])
    dep = Deployment("q", "Qwen3-8B", scheduler=(("fast_forward", fast_forward),))
    for d in pool.devices():
        pool.load(dep, d)
    k.run()
    return replay_requests(import_mooncake(path).trace, pool, "q", route=route)


def test_prefix_routing_is_the_same_with_fast_forward_on_or_off(
    shared_data: Path, tmp_path: Path
) -> None:
    path = _slice(shared_data, tmp_path, 300)
    on, off = _replay(path, "prefix", True), _replay(path, "prefix", False)
    # same placements and hits; latencies agree up to float summation order, as without routing
    assert [(r.replica, r.num_cached_tokens, r.num_preemptions) for r in on.requests] == [
        (r.replica, r.num_cached_tokens, r.num_preemptions) for r in off.requests
    ]
    assert [r.e2e_s for r in on.requests] == pytest.approx([r.e2e_s for r in off.requests])
    base = _replay(path, "least-outstanding", True)
    assert [r.replica for r in on.requests] != [r.replica for r in base.requests]
    assert on.prompt_reuse > base.prompt_reuse


def test_unknown_route_is_a_config_error(shared_data: Path, tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="unknown route 'rr'"):
        _replay(_slice(shared_data, tmp_path, 5), "rr", True)


def test_cli_prints_the_bound_beside_the_measured_reuse(shared_data: Path, tmp_path: Path) -> None:
    path, out = _slice(shared_data, tmp_path, 200), tmp_path / "out"
    result = runner.invoke(
        app, ["sim", "replay", str(path), "--replicas", "2", "--route", "prefix",
              "--out", str(out)],
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    assert "route prefix" in result.output
    assert "an infinite cache on one server would reuse" in result.output
    summary = json.loads((out / "summary.json").read_text())
    assert summary["route"] == "prefix"
    assert 0 < summary["prompt_reuse"] <= summary["reuse_bound"] < 1
    bad = runner.invoke(app, ["sim", "replay", str(path), "--route", "rr"])
    assert bad.exit_code == 1 and "unknown route 'rr'" in bad.output
