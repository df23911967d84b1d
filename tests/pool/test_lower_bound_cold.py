"""The lower bound on a cold pool: loads on the critical path and in the memory-time bound, and
no plan ever beats it."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from maserve_prefect.engines.catalog import get_gpu
from maserve_prefect.engines.sim.pool.device import Deployment
from maserve_prefect.errors import ConfigError
from maserve_prefect.pool.executor import run_pool
from maserve_prefect.pool.inputs import ExecOptions, RootDag
from maserve_prefect.pool.lower_bound import load_time_s, lower_bound, op_floor_s
from maserve_prefect.pool.state import deployment_info
from maserve_prefect.pool.window import WorkUnit

MODELS = ("Qwen3-0.6B", "Qwen3-1.7B", "Qwen3-4B", "Qwen3-8B", "Qwen3-14B")
PLANS = ("joint", "pool-fcfs", "parrot", "kairos")


def dep(model: str) -> Deployment:
    """The deployment `run_pool` and `lower_bound` build by default (vLLM's 0.9 utilization)."""
    return ExecOptions().deployment(model)


def single(root: str, model: str, n_in: int = 100, n_out: int = 8, at: float = 0.0) -> RootDag:
    return RootDag(root, at, (WorkUnit(f"{root}/a", root, model, n_in, n_out),))


def test_critical_path_waits_for_the_fastest_load_of_the_first_model() -> None:
    wf = single("r", "Qwen3-8B")
    devices = ["V100-32GB:0", "A100-40GB:0"]
    lb = lower_bound([wf], devices)
    first = min(
        load_time_s(dep("Qwen3-8B"), g) + op_floor_s("Qwen3-8B", g, 100, 8)
        for g in ("V100-32GB", "A100-40GB")
    )
    assert lb.critical_path_s == pytest.approx(first)
    assert lb.bound_s >= first > 30.0  # the load, not the op's floor, dominates
    warm = lower_bound([wf], devices, cold=False)
    assert warm.bound_s < 1.0 and warm.critical_path_s < lb.critical_path_s


def test_a_later_model_on_the_path_waits_for_its_own_load_too() -> None:
    a = WorkUnit("r/a", "r", "Qwen3-0.6B", 100, 4, succs=("r/b",))
    b = WorkUnit("r/b", "r", "Qwen3-14B", 100, 4, preds=("r/a",))
    lb = lower_bound([RootDag("r", 0.0, (a, b))], ["A100-40GB:0"])
    assert lb.critical_path_s >= load_time_s(dep("Qwen3-14B"), "A100-40GB")


def test_memory_time_counts_one_load_of_every_deployment() -> None:
    # five tiny roots, one per model, on one A100: no single path is long, but the five loads
    # cannot all hold their footprints at once for their whole load
    wfs = [single(f"r{i}", m, n_out=2) for i, m in enumerate(MODELS)]
    lb = lower_bound(wfs, ["A100-40GB:0"])
    need = 0.0
    for m in MODELS:
        fit = deployment_info(dep(m), ["A100-40GB"]).fit("A100-40GB")
        assert fit is not None
        need += fit.footprint_bytes * load_time_s(dep(m), "A100-40GB")
    capacity = get_gpu("A100-40GB").memory_bytes
    assert lb.memory_time_s >= need / capacity
    assert lb.memory_time_s > lb.critical_path_s
    assert lb.bound_s == lb.memory_time_s


def test_compute_bound_starts_no_earlier_than_the_first_load() -> None:
    wfs = [single(f"r{i}", "Qwen3-0.6B", n_in=2000, n_out=64) for i in range(4)]
    lb = lower_bound(wfs, ["A100-40GB:0"])
    assert lb.capacity_s > load_time_s(dep("Qwen3-0.6B"), "A100-40GB")


@st.composite
def workloads(draw: st.DrawFn) -> tuple[list[RootDag], list[str]]:
    kinds = draw(st.lists(st.sampled_from(["A100-40GB", "V100-32GB"]), min_size=1, max_size=2))
    devices = [f"{g}:{i}" for i, g in enumerate(kinds)]
    wfs = []
    for r in range(draw(st.integers(1, 3))):
        root = f"r{r}"
        n = draw(st.integers(1, 4))
        models = [draw(st.sampled_from(MODELS)) for _ in range(n)]
        edges = {(i, j) for j in range(n) for i in range(j) if draw(st.booleans())}
        units = []
        for k in range(n):
            units.append(
                WorkUnit(
                    f"{root}/u{k}",
                    root,
                    models[k],
                    draw(st.integers(16, 1500)),
                    draw(st.integers(1, 200)),
                    tuple(f"{root}/u{i}" for i, j in sorted(edges) if j == k),
                    tuple(f"{root}/u{j}" for i, j in sorted(edges) if i == k),
                )
            )
        at = draw(st.sampled_from([0.0, 0.0, 5.0, 60.0]))
        wfs.append(RootDag(root, at, tuple(units)))
    return wfs, devices


SIZINGS = {"one-per-gpu": ExecOptions(), "colocated": ExecOptions.colocated()}


@pytest.mark.parametrize("sizing", SIZINGS)
@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(case=workloads())
def test_no_plan_ever_beats_the_bound(sizing: str, case: tuple[list[RootDag], list[str]]) -> None:
    wfs, devices = case
    opts = SIZINGS[sizing]
    models = {u.deployment for wf in wfs for u in wf.units}
    gpus = {d.split(":")[0] for d in devices}
    if sizing == "one-per-gpu" and "Qwen3-14B" in models and gpus == {"V100-32GB"}:
        # 14B does not fit a V100-32GB at 0.9: infeasible for the bound and for every plan
        with pytest.raises(ConfigError, match="Qwen3-14B"):
            lower_bound(wfs, devices, options=opts)
        with pytest.raises(ConfigError, match="Qwen3-14B"):
            run_pool(wfs, devices, "joint", options=opts)
        return
    lb = lower_bound(wfs, devices, options=opts)
    for plan in PLANS:
        res = run_pool(wfs, devices, plan, options=opts)
        assert res.makespan_s >= lb.bound_s - 1e-6, (plan, res.makespan_s, lb)
        for root, finish in lb.per_root_s.items():
            arrival = next(w.arrival_s for w in wfs if w.root_id == root)
            assert res.root_latency_s[root] + arrival >= finish - 1e-6, (plan, root)
