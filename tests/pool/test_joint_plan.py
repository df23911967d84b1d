"""The joint plan: reuse, coalescing, grants, reclaim, prefetch, committed work, memory safety."""

from __future__ import annotations

from collections.abc import Iterable

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from maserve_prefect.dispatch.plans import get_plan
from maserve_prefect.dispatch.snapshot import Decisions, Snapshot, Unit
from maserve_prefect.engines.sim.pool.device import Deployment
from maserve_prefect.errors import ConfigError
from maserve_prefect.pool.fusion import fusible_chains
from maserve_prefect.pool.snapshot import PlanOptions, PoolSnapshot
from maserve_prefect.pool.state import (
    ActiveRequest,
    CostModel,
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
GPUS = ("A100-40GB", "V100-32GB")
MODELS = ("Qwen3-0.6B", "Qwen3-1.7B", "Qwen3-4B", "Qwen3-8B", "Qwen3-14B")
INFOS = {m: deployment_info(Deployment(m, m, kv_cache_bytes=2 * GIB), GPUS) for m in MODELS}
CAPACITY = {"A100-40GB": 40960 << 20, "V100-32GB": 32768 << 20}
DEFAULT = PlanOptions()
PLANS = ("joint", "pool-fcfs", "parrot", "kairos")


def dev(name: str) -> DeviceInfo:
    return DeviceInfo(name, name.split(":")[0], CAPACITY[name.split(":")[0]])


def rep(name: str, model: str, device: str, phase=Lifecycle.READY, **kw: object):
    fit = INFOS[model].fit(device.split(":")[0])
    assert fit is not None
    fields: dict[str, object] = dict(
        name=name,
        deployment=model,
        device=device,
        lifecycle=phase,
        ready_s=0.0,
        held_bytes=fit.footprint_bytes,
        footprint_bytes=fit.footprint_bytes,
        kv_capacity_tokens=fit.kv_capacity_tokens,
        max_num_seqs=fit.max_num_seqs,
    )
    fields.update(kw)
    return ReplicaInfo(**fields)  # type: ignore[arg-type]


def pool(devices: Iterable[str], *replicas: ReplicaInfo, now: float = 0.0, **kw: object):
    devs = tuple(dev(d) for d in devices)
    return PoolState(now, devs, tuple(INFOS.values()), replicas, **kw)  # type: ignore[arg-type]


def best_runtime(u: WorkUnit, costs: CostModel = COSTS) -> float:
    return min(costs.runtime_s(u.deployment, g, 1, u.input_len, u.max_tokens) for g in GPUS)


def snap(
    state: PoolState,
    units: Iterable[WorkUnit],
    status: dict[str, UnitStatus],
    *,
    started: dict[str, float] | None = None,
    options: PlanOptions = DEFAULT,
    costs: CostModel = COSTS,
) -> PoolSnapshot:
    ud = units_by_id(units)
    window = build_window(
        ud, status, state.now_s, lambda u: best_runtime(u, costs), started_s=started
    )

    def unit(w) -> Unit:
        u = w.unit
        return Unit(u.unit_id, u.root_id, u.deployment, u.input_len, u.max_tokens, u.priority)

    return PoolSnapshot(
        now_s=state.now_s,
        ready=tuple(unit(w) for w in window.ready),
        near_ready=tuple(unit(w) for w in window.near_ready),
        replicas=(),
        pool=state,
        window=window,
        units=ud,
        costs=costs,
        chains=fusible_chains(ud, options.fusion),
        options=options,
    )


def wu(uid: str, model: str, root: str = "r", preds=(), succs=(), n_in=200, n_out=50, prio=0):
    return WorkUnit(uid, root, model, n_in, n_out, tuple(preds), tuple(succs), prio)


R, RUN, P, D = UnitStatus.READY, UnitStatus.RUNNING, UnitStatus.PENDING, UnitStatus.DONE
JOINT = get_plan("joint")


def test_joint_is_registered_and_refuses_a_plain_snapshot() -> None:
    with pytest.raises(ConfigError, match="PoolSnapshot"):
        JOINT.plan(Snapshot(0.0, (), (), ()))


def test_reuses_a_resident_replica_before_loading_on_a_faster_free_device() -> None:
    state = pool(["V100-32GB:0", "A100-40GB:0"], rep("slow8", "Qwen3-8B", "V100-32GB:0"))
    d = JOINT.plan(snap(state, [wu("a", "Qwen3-8B")], {"a": R}))
    assert [(s.unit_id, s.replica) for s in d.submits] == [("a", "slow8")]
    assert d.loads == () and d.unloads == ()


def test_two_roots_needing_one_model_get_one_load_then_two_grants() -> None:
    units = [wu("r1/a", "Qwen3-8B", "r1"), wu("r2/a", "Qwen3-8B", "r2")]
    status = {"r1/a": R, "r2/a": R}
    d = JOINT.plan(snap(pool(["A100-40GB:0"]), units, status))
    assert len(d.loads) == 1 and d.submits == ()
    assert d.loads[0].deployment == "Qwen3-8B" and set(d.loads[0].units) == {"r1/a", "r2/a"}
    loading = rep("m8", "Qwen3-8B", "A100-40GB:0", Lifecycle.LOADING, ready_s=39.0)
    d = JOINT.plan(snap(pool(["A100-40GB:0"], loading, now=1.0), units, status))
    assert d == Decisions(), "demand covered by the load in flight"
    resident = rep("m8", "Qwen3-8B", "A100-40GB:0")
    d = JOINT.plan(snap(pool(["A100-40GB:0"], resident, now=39.0), units, status))
    assert sorted((s.unit_id, s.replica) for s in d.submits) == [("r1/a", "m8"), ("r2/a", "m8")]
    assert sorted(g.unit_ids for g in d.grants) == [("r1/a",), ("r2/a",)]


def test_a_fused_chain_is_granted_whole_and_fusion_can_be_switched_off() -> None:
    units = [wu("a", "Qwen3-4B", succs=["b"]), wu("b", "Qwen3-4B", preds=["a"])]
    state = pool(["A100-40GB:0"], rep("m4", "Qwen3-4B", "A100-40GB:0"))
    d = JOINT.plan(snap(state, units, {"a": R, "b": P}))
    assert [(g.replica, g.unit_ids) for g in d.grants] == [("m4", ("a", "b"))]
    d = JOINT.plan(snap(state, units, {"a": R, "b": P}, options=PlanOptions(fusion=False)))
    assert [g.unit_ids for g in d.grants] == [("a",)]


def test_reclaim_takes_a_redundant_copy_before_the_least_recently_used_unique_one() -> None:
    busy = ActiveRequest("z", 10, 10, 0.0, 100.0)
    state = pool(
        ["A100-40GB:0", "V100-32GB:0"],
        rep("x8", "Qwen3-8B", "A100-40GB:0", last_used_s=5.0),
        rep("x4", "Qwen3-4B", "A100-40GB:0", last_used_s=3.0),
        rep("x06", "Qwen3-0.6B", "A100-40GB:0", last_used_s=0.0),
        rep("y4", "Qwen3-4B", "V100-32GB:0", active=(busy,)),
        rep("y8", "Qwen3-8B", "V100-32GB:0", active=(busy,)),
        now=10.0,
    )
    d = JOINT.plan(snap(state, [wu("a", "Qwen3-1.7B")], {"a": R}))
    assert [u.replica for u in d.unloads] == ["x4"]
    assert [(ld.deployment, ld.device, ld.after) for ld in d.loads] == [
        ("Qwen3-1.7B", "A100-40GB:0", ("x4",))
    ]


def test_no_lease_holding_replica_is_ever_reclaimed() -> None:
    state = pool(
        ["A100-40GB:0"],
        rep("held", "Qwen3-14B", "A100-40GB:0"),
        leases=(Lease("held", "c", ("q",)),),
        grants=(("held", ("q",)),),
    )
    for name in PLANS:
        d = get_plan(name).plan(snap(state, [wu("a", "Qwen3-8B")], {"a": R}))
        assert d.unloads == () and d.loads == (), name


def test_replanning_after_an_early_completion_keeps_the_granted_chain() -> None:
    # a finished early; b (its fused successor) is ready and bound to "g" by a standing grant;
    # "other" is an idle copy with a shorter queue, and c needs memory "g" holds.
    state = pool(
        ["A100-40GB:0", "V100-32GB:0"],
        rep("g", "Qwen3-14B", "A100-40GB:0"),
        rep("other", "Qwen3-14B", "V100-32GB:0"),
        leases=(Lease("g", "a", ("b",)),),
        grants=(("g", ("b",)),),
        now=3.0,
    )
    units = [
        wu("a", "Qwen3-14B", succs=["b"]),
        wu("b", "Qwen3-14B", preds=["a"]),
        wu("c", "Qwen3-8B", root="r2"),
    ]
    d = JOINT.plan(snap(state, units, {"a": D, "b": R, "c": R}))
    assert ("b", "g") in [(s.unit_id, s.replica) for s in d.submits]
    assert "g" not in [u.replica for u in d.unloads]


def test_replanning_after_a_late_completion_keeps_the_running_work() -> None:
    late = ActiveRequest("a", 200, 50, 0.0, 1.0)  # predicted to end at 1.0; now is 20.0
    state = pool(
        ["A100-40GB:0"],
        rep("g", "Qwen3-14B", "A100-40GB:0", active=(late,)),
        leases=(Lease("g", "a", ("a", "b")),),
        grants=(("g", ("a", "b")),),
        now=20.0,
    )
    units = [
        wu("a", "Qwen3-14B", succs=["b"]),
        wu("b", "Qwen3-14B", preds=["a"]),
        wu("c", "Qwen3-8B", root="r2"),
    ]
    d = JOINT.plan(snap(state, units, {"a": RUN, "b": P, "c": R}, started={"a": 0.0}))
    assert d.unloads == () and d.submits == ()
    assert d.loads == ()  # c cannot get memory while the chain holds g


def _prefetch_case(started_a: float, options: PlanOptions = DEFAULT, extra=()):
    state = pool(
        ["A100-40GB:0", "V100-32GB:0"],
        rep("m8", "Qwen3-8B", "V100-32GB:0", active=(ActiveRequest("a", 200, 4000, 0.0, 90.0),)),
        now=80.0,
    )
    units = [wu("a", "Qwen3-8B", n_out=4000, succs=["b"]), wu("b", "Qwen3-4B", preds=["a"])]
    status = {"a": RUN, "b": P}
    for u in extra:
        units.append(u)
        status[u.unit_id] = R
    return JOINT.plan(snap(state, units, status, started={"a": started_a}, options=options))


def test_prefetches_a_near_ready_deployment_only_when_its_release_nears_load_time() -> None:
    rt = best_runtime(wu("a", "Qwen3-8B", n_out=4000))
    soon = _prefetch_case(started_a=80.0 - rt + 10.0)  # releases in 10 s, a load takes ~35 s
    assert [(ld.deployment, ld.prefetch, ld.units) for ld in soon.loads] == [
        ("Qwen3-4B", True, ("b",))
    ]
    late = _prefetch_case(started_a=80.0 - rt + 60.0)  # releases in 60 s
    assert late.loads == ()
    off = _prefetch_case(started_a=80.0 - rt + 10.0, options=PlanOptions(prefetch=False))
    assert off.loads == ()


def test_no_prefetch_while_ready_work_is_blocked() -> None:
    rt = best_runtime(wu("a", "Qwen3-8B", n_out=4000))
    # a ready 14B unit can get memory nowhere: A100 would hold it, but it is a ready action
    d = _prefetch_case(80.0 - rt + 10.0, extra=[wu("c", "Qwen3-14B", root="r2")])
    assert all(not ld.prefetch for ld in d.loads)


# -- property: memory at every predicted transition, leases, batch limits ----------------------


@st.composite
def scenarios(draw: st.DrawFn) -> tuple[PoolSnapshot, str]:
    names = draw(st.lists(st.sampled_from(GPUS), min_size=1, max_size=3))
    devices = [f"{g}:{i}" for i, g in enumerate(names)]
    now = draw(st.floats(0.0, 100.0))
    replicas: list[ReplicaInfo] = []
    leases: list[Lease] = []
    for d in devices:
        used, cap = 0, CAPACITY[d.split(":")[0]]
        for j in range(draw(st.integers(0, 4))):
            model = draw(st.sampled_from(MODELS))
            fit = INFOS[model].fit(d.split(":")[0])
            assert fit is not None
            phase = draw(
                st.sampled_from(
                    [Lifecycle.READY, Lifecycle.LOADING, Lifecycle.ASLEEP, Lifecycle.UNLOADING]
                )
            )
            held = GIB if phase is Lifecycle.ASLEEP else fit.footprint_bytes
            if used + held > cap:
                continue
            used += held
            active: tuple[ActiveRequest, ...] = ()
            if phase is Lifecycle.READY and draw(st.booleans()):
                active = (ActiveRequest(f"busy{d}{j}", 100, 100, now - 1.0, now + 5.0),)
            name = f"{model}@{d}#{j}"
            ready = now + draw(st.floats(0.0, 40.0)) if phase.in_transition else now
            replicas.append(
                rep(
                    name,
                    model,
                    d,
                    phase,
                    held_bytes=held,
                    active=active,
                    ready_s=ready,
                    last_used_s=draw(st.floats(0.0, now)),
                )
            )
            if phase is Lifecycle.READY and draw(st.integers(0, 3)) == 0:
                leases.append(Lease(name, f"chain{name}"))
    units: list[WorkUnit] = []
    status: dict[str, UnitStatus] = {}
    started: dict[str, float] = {}
    for i in range(draw(st.integers(1, 6))):
        model = draw(st.sampled_from(MODELS))
        root = f"r{draw(st.integers(0, 2))}"
        n_in, n_out = draw(st.integers(1, 3000)), draw(st.integers(1, 500))
        prio = draw(st.integers(0, 2))
        kind = draw(st.sampled_from(["ready", "chain", "near"]))
        uid = f"u{i}"
        if kind == "ready":
            units.append(wu(uid, model, root, n_in=n_in, n_out=n_out, prio=prio))
            status[uid] = R
        elif kind == "chain":
            units.append(wu(uid, model, root, succs=[uid + "b"], n_in=n_in, n_out=n_out))
            units.append(wu(uid + "b", model, root, preds=[uid], n_in=n_in, n_out=n_out))
            status[uid], status[uid + "b"] = R, P
        else:
            other = draw(st.sampled_from(MODELS))
            units.append(wu(uid, other, root, succs=[uid + "n"], n_in=n_in, n_out=n_out))
            units.append(wu(uid + "n", model, root, preds=[uid], n_in=n_in, n_out=n_out))
            status[uid], status[uid + "n"] = RUN, P
            started[uid] = now - draw(st.floats(0.0, 60.0))
    state = pool(devices, *replicas, now=now, leases=tuple(leases))
    options = PlanOptions(fusion=draw(st.booleans()), prefetch=draw(st.booleans()))
    costs = draw(st.sampled_from([COSTS, RooflineCostModel(None)]))
    return snap(state, units, status, started=started, options=options, costs=costs), draw(
        st.sampled_from(PLANS)
    )


def held_after_submits(s: PoolSnapshot, r: ReplicaInfo, units: list[WorkUnit]) -> int:
    if not units:
        return r.held_bytes
    ins = [a.input_len for a in r.active] + [u.input_len for u in units]
    outs = [a.max_tokens for a in r.active] + [u.max_tokens for u in units]
    n = len(r.active) + len(units)
    model = s.pool.deployment(r.deployment).model
    gpu = s.pool.device(r.device).gpu
    return max(r.held_bytes, s.costs.peak_mem_bytes(model, gpu, n, max(ins), max(outs)))


def check_memory(s: PoolSnapshot, d: Decisions) -> None:
    """Walk each device through every predicted transition of the decisions."""
    state, now = s.pool, s.pool.now_s
    by_name = {r.name: r for r in state.replicas}
    unload_end = {u.replica: now + by_name[u.replica].unload_s for u in d.unloads}
    for device in state.device_names():
        cap = state.device(device).capacity_bytes
        sub: dict[str, list[WorkUnit]] = {}
        for x in d.submits:
            sub.setdefault(x.replica, []).append(s.units[x.unit_id])
        base = 0
        releases: list[tuple[float, int, str]] = []
        for r in state.replicas_on(device):
            base += held_after_submits(s, r, sub.get(r.name, []))
            if r.lifecycle is Lifecycle.UNLOADING:
                releases.append((max(r.ready_s, now), r.held_bytes, r.name))
            if r.name in unload_end:
                releases.append((unload_end[r.name], r.held_bytes, r.name))
        adds = [
            (max(p.start_s, now), p.footprint_bytes, ())
            for p in state.planned
            if p.device == device
        ]
        for ld in d.loads:
            if ld.device == device:
                fit = state.fit(ld.deployment, device)
                assert fit is not None, f"{ld.deployment} does not fit {device}"
                start = max([now] + [unload_end[v] for v in ld.after])
                adds.append((start, fit.footprint_bytes, ld.after))
        assert base <= cap, f"{device}: {base} > {cap} right now"
        for t, _, _ in adds:
            # Worst state at instant t: every load starting at t has started, each after its own
            # victims' unloads ended; other releases due at t may still be pending.
            victims = {n for at, _, after in adds if at == t for n in after}
            held = base + sum(b for at, b, _ in adds if at <= t)
            freed = sum(b for at, b, n in releases if at < t or (at == t and n in victims))
            assert held - freed <= cap, f"{device} over capacity at t={t}"


@settings(max_examples=300, deadline=None)
@given(scenarios())
def test_no_plan_exceeds_device_memory_or_touches_committed_work(case) -> None:
    s, name = case
    d = get_plan(name).plan(s)
    check_memory(s, d)
    state = s.pool
    unloaded = {u.replica for u in d.unloads}
    leased = {lease.replica for lease in state.leases}
    for u in d.unloads:
        r = state.replica(u.replica)
        assert r.lifecycle in (Lifecycle.READY, Lifecycle.ASLEEP), f"{name}: {r.name}"
        assert not r.active and r.name not in leased, f"{name} reclaimed committed {r.name}"
    for ld in d.loads:
        assert set(ld.after) <= unloaded
    ready = {w.unit.unit_id for w in s.window.ready}
    submitted = [x.unit_id for x in d.submits]
    assert len(submitted) == len(set(submitted)) and set(submitted) <= ready
    per: dict[str, int] = {}
    for x in d.submits:
        r = state.replica(x.replica)
        u = s.units[x.unit_id]
        assert r.serving and r.deployment == u.deployment and r.name not in unloaded
        assert u.context_tokens <= r.kv_capacity_tokens
        per[r.name] = per.get(r.name, 0) + 1
        assert len(r.active) + per[r.name] <= r.max_num_seqs
    heads = {(x.unit_id, x.replica) for x in d.submits}
    for g in d.grants:
        assert (g.unit_ids[0], g.replica) in heads
