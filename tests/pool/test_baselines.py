"""Baselines: each documented rule orders or places work differently from request-level FCFS:
Parrot's order and dependent-request chaining, Kairos's order and KV best-fit dispatch, and the
reactive scale-out rule both share."""

from __future__ import annotations

import pytest
from pool_factories import (
    COSTS,
    INFOS,
    RUN,
    P,
    R,
    make_pool,
    make_pool_snapshot,
    make_replica,
    make_unit,
)

from maserve_prefect.dispatch.plans import get_plan
from maserve_prefect.dispatch.snapshot import Decisions
from maserve_prefect.pool.executor import run_pool
from maserve_prefect.pool.fusion import WorkItem
from maserve_prefect.pool.inputs import ExecOptions, RootDag
from maserve_prefect.pool.plan_round import Round
from maserve_prefect.pool.scale_out import backlog_s
from maserve_prefect.pool.snapshot import PoolSnapshot
from maserve_prefect.pool.state import ActiveRequest, Lease, ReplicaInfo
from maserve_prefect.pool.window import WorkUnit
from maserve_prefect.protocol.state import Lifecycle

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


def test_kairos_loads_where_most_memory_is_free_fcfs_on_the_first_device_that_fits() -> None:
    s = make_pool_snapshot(
        make_pool(2, make_replica("m4", "Qwen3-4B"), now=NOW),
        [make_unit("a", "Qwen3-1.7B")],
        {"a": R},
    )
    assert [ld.device for ld in plan("pool-fcfs", s).loads] == ["A100-40GB:0"]
    assert [ld.device for ld in plan("kairos", s).loads] == ["A100-40GB:1"]


CAP: int = INFOS["Qwen3-4B"].fit("A100-40GB").kv_capacity_tokens


def _kv_user(name: str, device: str, context: int) -> ReplicaInfo:
    """A 4B replica whose requests in flight hold `context` KV tokens (one long-running one)."""
    active = (ActiveRequest(f"q{name}", context - 10, 10, NOW, NOW + 60.0),) if context else ()
    return make_replica(name, "Qwen3-4B", device, active=active)


def test_kairos_dispatches_to_the_tightest_sufficient_kv_headroom() -> None:
    """Demand 3000 KV tokens: `tight` has 1000 free (too little), `fit` 4000 (the tightest that
    holds it), `roomy` is empty. Kairos picks `fit`; FCFS the one with fewest in flight."""
    pool = make_pool(
        3,
        _kv_user("tight", "A100-40GB:0", CAP - 1000),
        _kv_user("fit", "A100-40GB:1", CAP - 4000),
        _kv_user("roomy", "A100-40GB:2", 0),
        now=NOW,
    )
    s = make_pool_snapshot(pool, [make_unit("a", "Qwen3-4B", n_in=2500, n_out=500)], {"a": R})
    assert [x.replica for x in plan("kairos", s).submits] == ["fit"]
    assert [x.replica for x in plan("pool-fcfs", s).submits] == ["roomy"]


def test_kairos_holds_a_request_no_replica_has_kv_room_for() -> None:
    pool = make_pool(1, _kv_user("full", "A100-40GB:0", CAP - 1000), now=NOW)
    s = make_pool_snapshot(pool, [make_unit("a", "Qwen3-4B", n_in=2500, n_out=500)], {"a": R})
    assert plan("kairos", s).submits == ()
    # every plan's admission now reads the engine's KV blocks (`pool.admission`): FCFS holds too
    assert plan("pool-fcfs", s).submits == ()
    roomy = make_pool(1, _kv_user("roomy", "A100-40GB:0", CAP - 4000), now=NOW)
    s2 = make_pool_snapshot(roomy, [make_unit("a", "Qwen3-4B", n_in=2500, n_out=500)], {"a": R})
    assert [x.replica for x in plan("kairos", s2).submits] == ["roomy"]


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


def test_baselines_never_prefetch_and_only_parrot_chains() -> None:
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
        assert d.loads == (), name
        assert [(x.unit_id, x.replica) for x in d.submits] == [("c", "m4")], name
        # c's output is d's only input: Parrot keeps d on c's engine (its dependent chaining)
        chained = [("c", "d")] if name == "parrot" else []
        assert [g.unit_ids for g in d.grants] == chained, name
    joint = plan("joint", s)
    assert [g.unit_ids for g in joint.grants] == [("c", "d")]
    assert [ld.prefetch for ld in joint.loads] == [True]


# -- the shared reactive scale-out rule -------------------------------------------------------


def _busy_8b(n_out: int) -> PoolSnapshot:
    """An 8B replica on A100:0 running one request of `n_out` tokens, a new 8B request ready,
    and an empty A100:1."""
    busy = make_replica("m8", "Qwen3-8B", active=(ActiveRequest("q", 200, n_out, NOW, NOW),))
    return make_pool_snapshot(make_pool(2, busy, now=NOW), [make_unit("a", "Qwen3-8B")], {"a": R})


@pytest.mark.parametrize("name", ["parrot", "kairos"])
def test_scale_out_adds_a_copy_once_the_queue_outlasts_a_load(name: str) -> None:
    load_s = COSTS.load_s("Qwen3-8B", "A100-40GB")
    long, short = _busy_8b(5000), _busy_8b(50)
    d = plan(name, long)
    assert [x.replica for x in d.submits] == ["m8"]  # the ready request still goes there now
    rd = Round(long)
    rd.submit(_item(long), long.pool.replica("m8"), grant=False)
    assert backlog_s(rd, "Qwen3-8B") > load_s  # the rule's premise, measured as it measures
    assert [(ld.deployment, ld.device) for ld in d.loads] == [("Qwen3-8B", "A100-40GB:1")]
    assert plan(name, short).loads == ()  # a queue shorter than a load: no second copy
    assert plan("pool-fcfs", long).loads == ()  # the plain reference keeps one copy


def test_scale_out_waits_while_a_copy_is_already_loading() -> None:
    busy = make_replica("m8", "Qwen3-8B", active=(ActiveRequest("q", 200, 5000, NOW, NOW),))
    coming = make_replica("m8b", "Qwen3-8B", "A100-40GB:1", Lifecycle.LOADING, ready_s=NOW + 30)
    s = make_pool_snapshot(
        make_pool(3, busy, coming, now=NOW), [make_unit("a", "Qwen3-8B")], {"a": R}
    )
    assert plan("parrot", s).loads == ()


def _item(s: PoolSnapshot) -> WorkItem:
    w = s.window.ready[0]
    return WorkItem((w.unit,), w.release_s)


# -- Parrot's dependent-request chaining ------------------------------------------------------


def test_parrot_chains_a_dependent_request_to_its_producers_engine() -> None:
    units = [
        make_unit("a", "Qwen3-4B", succs=["b", "x"]),
        make_unit("b", "Qwen3-4B", preds=["a"]),  # a's output is b's only input: chained
        make_unit("x", "Qwen3-8B", preds=["a"]),  # another deployment: not chained
    ]
    pool = make_pool(2, make_replica("m4", "Qwen3-4B"), now=NOW)
    s = make_pool_snapshot(pool, units, {"a": R, "b": P, "x": P})
    d = plan("parrot", s)
    assert [(g.replica, g.unit_ids) for g in d.grants] == [("m4", ("a", "b"))]
    assert plan("pool-fcfs", s).grants == ()


def test_a_chained_request_runs_on_its_producers_engine_where_fcfs_balances_it_away() -> None:
    """Two warm 0.6B copies; q/a -> q/b is a dependent pair. FCFS sends p/s (short) to copy 0,
    q/a to copy 1, r/l (long) to copy 0 and s/l (long) to copy 1; when q/a ends copy 0 has one
    request in flight (p/s is done) and copy 1 one, so q/b goes to copy 0. Parrot keeps q/b on
    q/a's copy."""
    m = "Qwen3-0.6B"

    def root(r: str, n_out: int, chained: bool = False) -> RootDag:
        if not chained:
            return RootDag(r, 0.0, (WorkUnit(f"{r}/x", r, m, 100, n_out),))
        a = WorkUnit(f"{r}/a", r, m, 100, n_out, succs=(f"{r}/b",))
        return RootDag(r, 0.0, (a, WorkUnit(f"{r}/b", r, m, 100, 4, preds=(f"{r}/a",))))

    wfs = [root("p", 2), root("q", 200, chained=True), root("r", 800), root("s", 800)]
    opts = ExecOptions(warm=((m, "A100-40GB:0"), (m, "A100-40GB:1")))
    devices = ["A100-40GB:0", "A100-40GB:1"]
    for name, same in (("parrot", True), ("pool-fcfs", False)):
        ops = {o.unit_id: o for o in run_pool(wfs, devices, name, options=opts).ops}
        assert (ops["q/b"].replica == ops["q/a"].replica) is same, name
