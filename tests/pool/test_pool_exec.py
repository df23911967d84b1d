"""The pool executor: every plan runs to completion, deterministically, above the lower bound."""

from __future__ import annotations

import random
from dataclasses import replace

import pytest
from pool_factories import POOL_PLANS, THREE_FORK_JOINS

from maserve_prefect.dispatch.snapshot import Decisions, Snapshot, Unload
from maserve_prefect.errors import ConfigError, SimulationError
from maserve_prefect.pool.executor import run_pool
from maserve_prefect.pool.inputs import ExecOptions, RootDag
from maserve_prefect.pool.joint_plan import JointPlan
from maserve_prefect.pool.lower_bound import lower_bound, op_floor_s
from maserve_prefect.pool.results import PoolRunResult
from maserve_prefect.pool.state import RooflineCostModel
from maserve_prefect.pool.window import WorkUnit

GIB = 1 << 30
PLANS = POOL_PLANS
TWO = ["V100-32GB:0", "A100-40GB:0"]


THREE = list(THREE_FORK_JOINS)


def check_complete(res: PoolRunResult, workflows: list[RootDag]) -> None:
    units = {u.unit_id: u for wf in workflows for u in wf.units}
    ops = {o.unit_id: o for o in res.ops}
    assert set(ops) == set(units)
    for uid, u in units.items():
        o = ops[uid]
        assert o.num_output_tokens == u.max_tokens
        assert o.ready_s <= o.submitted_s <= o.first_token_s <= o.completed_s
        for p in u.preds:
            assert o.ready_s >= ops[p].completed_s
        waited = o.wait_load_s + o.wait_no_load_s + o.wait_other_s
        assert waited == pytest.approx(o.submitted_s - o.ready_s, abs=1e-9)
    assert set(res.root_latency_s) == {wf.root_id for wf in workflows}


@pytest.mark.parametrize("plan", PLANS)
def test_each_plan_runs_three_workflows_on_two_devices_identically_twice(plan: str) -> None:
    first = run_pool(THREE, TWO, plan)
    check_complete(first, THREE)
    assert first == run_pool(THREE, TWO, plan)
    assert first.makespan_s >= max(first.root_latency_s.values())
    assert any(e.action == "unload" for e in first.lifecycle), "the pool is too small to keep all"


def test_fused_ops_keep_their_own_completion_and_output_count() -> None:
    res = run_pool(THREE, TWO, "joint")
    ops = {o.unit_id: o for o in res.ops}
    for root in ("r0", "r1", "r2"):
        a, b = ops[f"{root}/a"], ops[f"{root}/b"]
        assert a.chain == b.chain == f"{root}/a"
        assert a.replica == b.replica
        assert a.completed_s < b.completed_s
        assert b.submitted_s == a.completed_s and b.reacquire_s == 0.0
        assert (a.num_output_tokens, b.num_output_tokens) == (
            THREE[int(root[1])].units[0].max_tokens,
            THREE[int(root[1])].units[1].max_tokens,
        )
    unfused = run_pool(THREE, TWO, "joint", options=ExecOptions(fusion=False))
    assert all(o.chain in ("", o.unit_id) for o in unfused.ops)


def random_workflows(seed: int) -> list[RootDag]:
    rng = random.Random(seed)
    models = ("Qwen3-0.6B", "Qwen3-1.7B", "Qwen3-4B", "Qwen3-8B")
    out = []
    for r in range(rng.randint(1, 3)):
        root = f"w{r}"
        n = rng.randint(2, 5)
        edges = [(a, b) for a in range(n) for b in range(a + 1, n) if rng.random() < 0.4]
        units = tuple(
            WorkUnit(
                f"{root}/{i}",
                root,
                rng.choice(models),
                rng.randint(50, 1500),
                rng.randint(1, 300),
                tuple(f"{root}/{a}" for a, b in edges if b == i),
                tuple(f"{root}/{b}" for a, b in edges if a == i),
            )
            for i in range(n)
        )
        out.append(RootDag(root, rng.uniform(0.0, 20.0), units))
    return out


@pytest.mark.parametrize("seed", range(4))
def test_lower_bound_is_below_every_plans_makespan(seed: int) -> None:
    wfs = random_workflows(seed)
    devices = random.Random(seed).choice([TWO, ["A100-40GB:0"], ["V100-32GB:0"]])
    bound = lower_bound(wfs, devices)
    assert bound.bound_s >= max(wf.arrival_s for wf in wfs)
    for plan in PLANS:
        res = run_pool(wfs, devices, plan)
        check_complete(res, wfs)
        assert bound.bound_s <= res.makespan_s, plan
        for root, lat in res.root_latency_s.items():
            arrival = next(wf.arrival_s for wf in wfs if wf.root_id == root)
            assert bound.per_root_s[root] - arrival <= lat + 1e-9


def test_op_floor_is_below_the_simulated_runtime_of_a_lone_request() -> None:
    costs = RooflineCostModel(2 * GIB)  # exact for a lone request (tests/pool/test_pool_state)
    for gpu in ("A100-40GB", "V100-32GB"):
        for shape in ((1, 1), (4000, 1), (100, 300)):
            assert op_floor_s("Qwen3-8B", gpu, *shape) < costs.runtime_s("Qwen3-8B", gpu, 1, *shape)


def test_per_workflow_lifecycle_weighs_each_root_alone_but_shares_loaded_replicas() -> None:
    """The paper's per-workflow ablation: a replica loaded for one root serves another's calls
    (one load, one replica), while lifecycle choices are weighed per root — on three fork-joins
    over two GPUs they come out differently."""
    wfs = [RootDag(r, 0.0, (WorkUnit(f"{r}/a", r, "Qwen3-0.6B", 100, 10),)) for r in ("r1", "r2")]
    per = run_pool(wfs, ["A100-40GB:0"], "joint", options=ExecOptions(coalesce=False))
    assert per.summary()["num_loads"] == 1
    assert len({o.replica for o in per.ops}) == 1
    pooled = run_pool(THREE, TWO, "joint")
    alone = run_pool(THREE, TWO, "joint", options=ExecOptions(coalesce=False))
    check_complete(alone, THREE)
    assert [(e.action, e.replica) for e in alone.lifecycle] != [
        (e.action, e.replica) for e in pooled.lifecycle
    ]


def test_prefetch_can_be_switched_off() -> None:
    on = run_pool(THREE, TWO, "joint")
    off = run_pool(THREE, TWO, "joint", options=ExecOptions(prefetch=False))
    assert on.summary()["num_prefetches"] >= 1
    assert off.summary()["num_prefetches"] == 0
    check_complete(off, THREE)


def test_availability_delay_is_split_into_no_load_and_ongoing_load() -> None:
    big = RootDag("big", 0.0, (WorkUnit("big/a", "big", "Qwen3-14B", 100, 400),))
    small = RootDag("small", 1.0, (WorkUnit("small/a", "small", "Qwen3-8B", 100, 10),))
    res = run_pool([big, small], ["A100-40GB:0"], "joint")
    ops = {o.unit_id: o for o in res.ops}
    costs = RooflineCostModel(2 * GIB)
    assert ops["big/a"].wait_load_s == pytest.approx(costs.load_s("Qwen3-14B", "A100-40GB"))
    s = ops["small/a"]
    # the 14B holds the device until big/a ends: the 8B load cannot start before that
    assert s.wait_no_load_s == pytest.approx(ops["big/a"].completed_s - 1.0)
    # then the reclaim (1 s unload) and the load itself
    assert s.wait_load_s == pytest.approx(1.0 + costs.load_s("Qwen3-8B", "A100-40GB"))
    assert [e.action for e in res.lifecycle] == ["load", "unload", "load"]


def test_gpu_seconds_per_session_split_the_whole_device_time() -> None:
    res = run_pool(THREE, TWO, "joint")
    per = res.gpu_s_per_session
    parts = per["generation"] + per["idle_resident"] + per["loading"] + per["other"]
    assert parts == pytest.approx(per["total"])
    assert per["total"] * 3 == pytest.approx(len(TWO) * res.makespan_s)
    assert per["loading"] > per["generation"] > 0


@pytest.mark.parametrize("factor", [0.2, 5.0])
def test_mispredicted_runtimes_keep_granted_chains_on_their_replica(factor: float) -> None:
    class Biased(RooflineCostModel):
        def runtime_s(self, model: str, device: str, batch: int, i: int, o: int) -> float:
            return factor * super().runtime_s(model, device, batch, i, o)

    res = run_pool(THREE, TWO, "joint", costs=Biased(2 * GIB))
    check_complete(res, THREE)
    by_chain: dict[str, set[str]] = {}
    for o in res.ops:
        by_chain.setdefault(o.chain, set()).add(o.replica)
    assert all(len(reps) == 1 for chain, reps in by_chain.items() if chain)


def test_a_plan_that_reclaims_a_leased_replica_stops_the_run() -> None:
    class Greedy(JointPlan):
        name = "greedy-reclaimer"

        def plan(self, snapshot: Snapshot) -> Decisions:
            d = super().plan(snapshot)
            busy = [r.name for r in snapshot.pool.replicas if r.active]  # type: ignore[attr-defined]
            return replace(d, unloads=tuple(Unload(n) for n in busy))

    with pytest.raises(SimulationError, match="holds a lease"):
        run_pool(THREE, TWO, Greedy())


def test_bad_inputs_are_config_errors() -> None:
    huge = RootDag("r", 0.0, (WorkUnit("r/a", "r", "Qwen3-32B", 10, 10),))
    with pytest.raises(ConfigError, match="fits no device"):
        run_pool([huge], ["V100-32GB:0"])
    dup = RootDag("r", 0.0, (WorkUnit("r/a", "r", "Qwen3-0.6B", 10, 10),) * 2)
    with pytest.raises(ConfigError, match="unique"):
        run_pool([dup], ["V100-32GB:0"])


def test_a_warm_pool_serves_at_once_and_counts_time_from_the_warm_start() -> None:
    wf = RootDag("r", 0.0, (WorkUnit("r/a", "r", "Qwen3-0.6B", 100, 10),))
    warm = ExecOptions(warm=(("Qwen3-0.6B", "A100-40GB:0"),))
    res = run_pool([wf], ["A100-40GB:0"], "joint", options=warm)
    assert res.lifecycle == () and res.ops[0].submitted_s == res.start_s > 0
    assert res.ops[0].wait_load_s == res.ops[0].wait_no_load_s == 0.0
    assert res.gpu_s_per_session["loading"] == 0.0
    # per-workflow lifecycle shares loaded replicas, so a warm pool serves it at once too
    per = run_pool([wf], ["A100-40GB:0"], options=replace(warm, coalesce=False))
    assert per.lifecycle == () and per.ops[0].submitted_s == per.start_s
