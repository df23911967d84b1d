"""Pool-executor results: the headline summary counts lifecycle actions and sums op waits."""

from __future__ import annotations

from maserve_prefect.pool.control import LifecycleEvent
from maserve_prefect.pool.results import OpResult, PoolRunResult


def make_op(
    unit_id: str, wait_load_s: float, wait_no_load_s: float, reacquire_s: float
) -> OpResult:
    return OpResult(unit_id, "r", "m", "m#0", "A100-40GB:0", 0.0, 1.0, 2.0, 3.0, 10, 5,
                    wait_load_s, wait_no_load_s, 0.5, reacquire_s, "")  # fmt: skip


def test_summary_counts_actions_and_sums_waits() -> None:
    lifecycle = (
        LifecycleEvent("load", "m#0", "m", "A100-40GB:0", 0.0, 1.0),
        LifecycleEvent("load", "m#1", "m", "A100-40GB:1", 1.0, 2.0, prefetch=True),
        LifecycleEvent("unload", "m#1", "m", "A100-40GB:1", 5.0, 5.5),
    )
    res = PoolRunResult(
        plan="joint", start_s=0.0, end_s=10.0, makespan_s=10.0, root_latency_s={"r": 9.0},
        p95_latency_s=9.0, mean_latency_s=9.0,
        ops=(make_op("r/a", 1.0, 0.0, 0.0), make_op("r/b", 2.0, 0.25, 0.75)),
        lifecycle=lifecycle, device_time=(),
        gpu_s_per_session={"generation": 3.0, "total": 4.0}, num_plans=7,
    )  # fmt: skip
    assert res.summary() == {
        "makespan_s": 10.0,
        "p95_latency_s": 9.0,
        "mean_latency_s": 9.0,
        "num_loads": 2.0,
        "num_prefetches": 1.0,
        "num_unloads": 1.0,
        "wait_load_s": 3.0,
        "wait_no_load_s": 0.25,
        "reacquire_s": 0.75,
        "gpu_s_generation": 3.0,
        "gpu_s_total": 4.0,
    }
