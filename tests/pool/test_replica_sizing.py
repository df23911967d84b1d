"""Replica sizing on the pool runtime: one vLLM replica per GPU at 0.9 by default, so a model
that does not fit a GPU at that share is infeasible there for every plan; co-location (a fixed
KV per replica) is the explicit alternative."""

from __future__ import annotations

import math

import pytest

from maserve_prefect.errors import ConfigError
from maserve_prefect.pool.executor import run_pool
from maserve_prefect.pool.inputs import ExecOptions, RootDag
from maserve_prefect.pool.results import PoolRunResult
from maserve_prefect.pool.window import WorkUnit

PLANS = ("joint", "pool-fcfs", "parrot", "kairos")
TWO = ["V100-32GB:0", "A100-40GB:0"]


def fork(root: str, model: str, n: int = 3) -> RootDag:
    units = tuple(WorkUnit(f"{root}/u{i}", root, model, 200, 16) for i in range(n))
    return RootDag(root, 0.0, units)


@pytest.mark.parametrize("plan", PLANS)
def test_14b_runs_only_where_it_fits_at_0_9(plan: str) -> None:
    wfs = [fork("big", "Qwen3-14B"), fork("small", "Qwen3-0.6B")]
    res = run_pool(wfs, TWO, plan)
    devices = {o.device for o in res.ops if o.deployment == "Qwen3-14B"}
    assert devices == {"A100-40GB:0"}
    loads = {(e.deployment, e.device) for e in res.lifecycle if e.action == "load"}
    assert ("Qwen3-14B", "V100-32GB:0") not in loads


def test_14b_on_a_v100_only_pool_is_a_config_error_at_0_9_but_fits_colocated() -> None:
    wfs = [fork("big", "Qwen3-14B")]
    with pytest.raises(ConfigError, match=r"Qwen3-14B.*fits no device"):
        run_pool(wfs, ["V100-32GB:0"], "joint")
    res = run_pool(wfs, ["V100-32GB:0"], "joint", options=ExecOptions.colocated())
    assert {o.device for o in res.ops} == {"V100-32GB:0"}


def test_one_replica_per_gpu_at_0_9() -> None:
    """Two deployments on one GPU at 0.9 never hold it at once; colocated, they may."""
    wfs = [fork("a", "Qwen3-0.6B", 2), fork("b", "Qwen3-1.7B", 2)]
    res = run_pool(wfs, ["A100-40GB:0"], "joint")
    (_, a_gone), (b_load, _) = _held(res)
    assert a_gone <= b_load  # the second loads only after the first is unloaded
    colocated = run_pool(wfs, ["A100-40GB:0"], "joint", options=ExecOptions.colocated())
    (_, a_gone), (b_load, _) = _held(colocated)
    assert b_load < a_gone  # side by side


def _held(res: PoolRunResult) -> list[tuple[float, float]]:
    """(load start, unload end or inf) per replica, by load start."""
    spans: dict[str, list[float]] = {}
    for e in res.lifecycle:
        if e.action == "load":
            spans[e.replica] = [e.start_s, math.inf]
        elif e.action == "unload":
            spans[e.replica][1] = e.end_s
    return sorted((a, b) for a, b in spans.values())
