"""Baselines: each documented rule orders or places work differently from request-level FCFS."""

from __future__ import annotations

from collections.abc import Iterable

from maserve_prefect.dispatch.plans import get_plan
from maserve_prefect.dispatch.snapshot import Decisions
from maserve_prefect.engines.sim.pool.device import Deployment
from maserve_prefect.pool.fusion import fusible_chains
from maserve_prefect.pool.snapshot import PoolSnapshot
from maserve_prefect.pool.state import (
    ActiveRequest,
    DeviceInfo,
    Lease,
    PoolState,
    ReplicaInfo,
    RooflineCostModel,
    deployment_info,
)
from maserve_prefect.pool.window import UnitStatus, WorkUnit, build_window, units_by_id
from maserve_prefect.protocol.state import Lifecycle

GIB = 1 << 30
COSTS = RooflineCostModel(2 * GIB)
MODELS = ("Qwen3-0.6B", "Qwen3-1.7B", "Qwen3-4B", "Qwen3-8B", "Qwen3-14B")
INFOS = {
    m: deployment_info(Deployment(m, m, kv_cache_bytes=2 * GIB), ["A100-40GB"]) for m in MODELS
}
A100_BYTES = 40960 << 20
R, P, RUN = UnitStatus.READY, UnitStatus.PENDING, UnitStatus.RUNNING


def rep(name: str, model: str, device: str = "A100-40GB:0", **kw: object) -> ReplicaInfo:
    fit = INFOS[model].fit("A100-40GB")
    assert fit is not None
    fields: dict[str, object] = dict(
        name=name,
        deployment=model,
        device=device,
        lifecycle=Lifecycle.READY,
        ready_s=0.0,
        held_bytes=fit.footprint_bytes,
        footprint_bytes=fit.footprint_bytes,
        kv_capacity_tokens=fit.kv_capacity_tokens,
        max_num_seqs=fit.max_num_seqs,
    )
    fields.update(kw)
    return ReplicaInfo(**fields)  # type: ignore[arg-type]


def pool(n_devices: int, *replicas: ReplicaInfo, now: float = 10.0, **kw: object) -> PoolState:
    devs = tuple(DeviceInfo(f"A100-40GB:{i}", "A100-40GB", A100_BYTES) for i in range(n_devices))
    return PoolState(now, devs, tuple(INFOS.values()), replicas, **kw)  # type: ignore[arg-type]


def wu(uid: str, model: str, root: str = "r", preds=(), succs=()) -> WorkUnit:
    return WorkUnit(uid, root, model, 200, 50, tuple(preds), tuple(succs))


def snap(state: PoolState, units: Iterable[WorkUnit], status: dict, ready_s: dict | None = None):
    ud = units_by_id(units)

    def rt(u: WorkUnit) -> float:
        return COSTS.runtime_s(u.deployment, "A100-40GB", 1, u.input_len, u.max_tokens)

    window = build_window(
        ud,
        status,
        state.now_s,
        rt,
        ready_s=ready_s,
        root_arrival_s={u.root_id: 0.0 for u in ud.values()},
    )
    return PoolSnapshot(
        now_s=state.now_s, ready=(), near_ready=(), replicas=(), pool=state, window=window,
        units=ud, costs=COSTS, chains=fusible_chains(ud),
    )  # fmt: skip


def plan(name: str, s: PoolSnapshot) -> Decisions:
    return get_plan(name).plan(s)


def loaded(d: Decisions) -> list[str]:
    return [ld.deployment for ld in d.loads]


# A leased 14B leaves 9.17 GB on the device: room for a 0.6B (5.18 GB) or a 1.7B (7.48 GB),
# not both; each baseline must pick which ready request gets its model loaded.
HELD = rep("held", "Qwen3-14B", active=(ActiveRequest("q", 10, 10, 0.0, 99.0),))


def test_parrot_loads_for_the_critical_path_where_fcfs_loads_for_the_oldest_request() -> None:
    units = [
        wu("x", "Qwen3-0.6B"),  # ready first, nothing after it
        wu("y", "Qwen3-1.7B", succs=["y2"]),  # ready later, a long path after it
        wu("y2", "Qwen3-8B", preds=["y"], succs=["y3"]),
        wu("y3", "Qwen3-8B", preds=["y2"]),
    ]
    s = snap(pool(1, HELD), units, {"x": R, "y": R, "y2": P, "y3": P}, {"x": 1.0, "y": 5.0})
    assert loaded(plan("pool-fcfs", s)) == ["Qwen3-0.6B"]
    assert loaded(plan("parrot", s)) == ["Qwen3-1.7B"]


def test_kairos_serves_the_workflow_with_least_remaining_work_first() -> None:
    units = [
        wu("a", "Qwen3-0.6B", root="big", succs=["a2"]),  # ready first; root has much left
        wu("a2", "Qwen3-8B", root="big", preds=["a"], succs=["a3"]),
        wu("a3", "Qwen3-8B", root="big", preds=["a2"]),
        wu("b", "Qwen3-1.7B", root="small"),
    ]
    s = snap(pool(1, HELD), units, {"a": R, "a2": P, "a3": P, "b": R}, {"a": 1.0, "b": 5.0})
    assert loaded(plan("pool-fcfs", s)) == ["Qwen3-0.6B"]
    assert loaded(plan("kairos", s)) == ["Qwen3-1.7B"]


def test_kairos_places_on_the_device_with_most_free_memory_fcfs_on_the_first_that_fits() -> None:
    s = snap(pool(2, rep("m4", "Qwen3-4B")), [wu("a", "Qwen3-1.7B")], {"a": R})
    assert [ld.device for ld in plan("pool-fcfs", s).loads] == ["A100-40GB:0"]
    assert [ld.device for ld in plan("kairos", s).loads] == ["A100-40GB:1"]
    two = pool(2, rep("c0", "Qwen3-4B"), rep("c1", "Qwen3-4B", "A100-40GB:1"), rep("z", "Qwen3-8B"))
    s = snap(two, [wu("a", "Qwen3-4B")], {"a": R})
    assert [x.replica for x in plan("pool-fcfs", s).submits] == ["c0"]
    assert [x.replica for x in plan("kairos", s).submits] == ["c1"]


def test_fcfs_evicts_the_least_recently_used_idle_replica_and_never_a_leased_one() -> None:
    state = pool(
        1,
        rep("m8", "Qwen3-8B", last_used_s=5.0),
        rep("m4", "Qwen3-4B", last_used_s=1.0),
        rep("m06", "Qwen3-0.6B", last_used_s=0.5),
        leases=(Lease("m06", "chain"),),
    )
    d = plan("pool-fcfs", snap(state, [wu("a", "Qwen3-1.7B")], {"a": R}))
    assert [u.replica for u in d.unloads] == ["m4"]
    assert [(ld.deployment, ld.after) for ld in d.loads] == [("Qwen3-1.7B", ("m4",))]


def test_baselines_neither_fuse_nor_prefetch() -> None:
    running = rep("m8", "Qwen3-8B", active=(ActiveRequest("a", 200, 50, 9.9, 10.1),))
    state = pool(1, running, rep("m4", "Qwen3-4B"))
    units = [
        wu("a", "Qwen3-8B", succs=["b"]),
        wu("b", "Qwen3-1.7B", preds=["a"]),  # near-ready, releases in 0.1 s
        wu("c", "Qwen3-4B", root="r2", succs=["d"]),
        wu("d", "Qwen3-4B", root="r2", preds=["c"]),
    ]
    s = snap(state, units, {"a": RUN, "b": P, "c": R, "d": P})
    assert [w.unit.unit_id for w in s.window.near_ready] == ["b"]
    for name in ("pool-fcfs", "parrot", "kairos"):
        d = plan(name, s)
        assert d.grants == () and d.loads == (), name
        assert [(x.unit_id, x.replica) for x in d.submits] == [("c", "m4")], name
    joint = plan("joint", s)
    assert [g.unit_ids for g in joint.grants] == [("c", "d")]
    assert [ld.prefetch for ld in joint.loads] == [True]
