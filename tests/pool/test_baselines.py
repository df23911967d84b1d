"""Baselines: each documented rule orders or places work differently from request-level FCFS."""

from __future__ import annotations

from pool_factories import RUN, P, R, make_pool, make_pool_snapshot, make_replica, make_unit

from maserve_prefect.dispatch.plans import get_plan
from maserve_prefect.dispatch.snapshot import Decisions
from maserve_prefect.pool.snapshot import PoolSnapshot
from maserve_prefect.pool.state import ActiveRequest, Lease

NOW = 10.0


def plan(name: str, s: PoolSnapshot) -> Decisions:
    return get_plan(name).plan(s)


def loaded(d: Decisions) -> list[str]:
    return [ld.deployment for ld in d.loads]


# A leased 14B leaves 9.17 GB on the device: room for a 0.6B (5.18 GB) or a 1.7B (7.48 GB),
# not both; each baseline must pick which ready request gets its model loaded.
HELD = make_replica("held", "Qwen3-14B", active=(ActiveRequest("q", 10, 10, 0.0, 99.0),))


def test_parrot_loads_for_the_critical_path_where_fcfs_loads_for_the_oldest_request() -> None:
    units = [
        make_unit("x", "Qwen3-0.6B"),  # ready first, nothing after it
        make_unit("y", "Qwen3-1.7B", succs=["y2"]),  # ready later, a long path after it
        make_unit("y2", "Qwen3-8B", preds=["y"], succs=["y3"]),
        make_unit("y3", "Qwen3-8B", preds=["y2"]),
    ]
    s = make_pool_snapshot(
        make_pool(1, HELD, now=NOW),
        units,
        {"x": R, "y": R, "y2": P, "y3": P},
        ready_s={"x": 1.0, "y": 5.0},
    )
    assert loaded(plan("pool-fcfs", s)) == ["Qwen3-0.6B"]
    assert loaded(plan("parrot", s)) == ["Qwen3-1.7B"]


def test_kairos_serves_the_workflow_with_least_remaining_work_first() -> None:
    units = [
        make_unit("a", "Qwen3-0.6B", root="big", succs=["a2"]),  # ready first; root has much left
        make_unit("a2", "Qwen3-8B", root="big", preds=["a"], succs=["a3"]),
        make_unit("a3", "Qwen3-8B", root="big", preds=["a2"]),
        make_unit("b", "Qwen3-1.7B", root="small"),
    ]
    s = make_pool_snapshot(
        make_pool(1, HELD, now=NOW),
        units,
        {"a": R, "a2": P, "a3": P, "b": R},
        ready_s={"a": 1.0, "b": 5.0},
    )
    assert loaded(plan("pool-fcfs", s)) == ["Qwen3-0.6B"]
    assert loaded(plan("kairos", s)) == ["Qwen3-1.7B"]


def test_kairos_places_on_the_device_with_most_free_memory_fcfs_on_the_first_that_fits() -> None:
    s = make_pool_snapshot(
        make_pool(2, make_replica("m4", "Qwen3-4B"), now=NOW),
        [make_unit("a", "Qwen3-1.7B")],
        {"a": R},
    )
    assert [ld.device for ld in plan("pool-fcfs", s).loads] == ["A100-40GB:0"]
    assert [ld.device for ld in plan("kairos", s).loads] == ["A100-40GB:1"]
    c0, z = make_replica("c0", "Qwen3-4B"), make_replica("z", "Qwen3-8B")
    two = make_pool(2, c0, make_replica("c1", "Qwen3-4B", "A100-40GB:1"), z, now=NOW)
    s = make_pool_snapshot(two, [make_unit("a", "Qwen3-4B")], {"a": R})
    assert [x.replica for x in plan("pool-fcfs", s).submits] == ["c0"]
    assert [x.replica for x in plan("kairos", s).submits] == ["c1"]


def test_fcfs_evicts_the_least_recently_used_idle_replica_and_never_a_leased_one() -> None:
    state = make_pool(
        1,
        make_replica("m8", "Qwen3-8B", last_used_s=5.0),
        make_replica("m4", "Qwen3-4B", last_used_s=1.0),
        make_replica("m06", "Qwen3-0.6B", last_used_s=0.5),
        leases=(Lease("m06", "chain"),),
        now=NOW,
    )
    d = plan("pool-fcfs", make_pool_snapshot(state, [make_unit("a", "Qwen3-1.7B")], {"a": R}))
    assert [u.replica for u in d.unloads] == ["m4"]
    assert [(ld.deployment, ld.after) for ld in d.loads] == [("Qwen3-1.7B", ("m4",))]


def test_baselines_neither_fuse_nor_prefetch() -> None:
    running = make_replica("m8", "Qwen3-8B", active=(ActiveRequest("a", 200, 50, 9.9, 10.1),))
    state = make_pool(1, running, make_replica("m4", "Qwen3-4B"), now=NOW)
    units = [
        make_unit("a", "Qwen3-8B", succs=["b"]),
        make_unit("b", "Qwen3-1.7B", preds=["a"]),  # near-ready, releases in 0.1 s
        make_unit("c", "Qwen3-4B", root="r2", succs=["d"]),
        make_unit("d", "Qwen3-4B", root="r2", preds=["c"]),
    ]
    s = make_pool_snapshot(state, units, {"a": RUN, "b": P, "c": R, "d": P})
    assert [w.unit.unit_id for w in s.window.near_ready] == ["b"]
    for name in ("pool-fcfs", "parrot", "kairos"):
        d = plan(name, s)
        assert d.grants == () and d.loads == (), name
        assert [(x.unit_id, x.replica) for x in d.submits] == [("c", "m4")], name
    joint = plan("joint", s)
    assert [g.unit_ids for g in joint.grants] == [("c", "d")]
    assert [ld.prefetch for ld in joint.loads] == [True]
