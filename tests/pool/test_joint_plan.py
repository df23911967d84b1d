"""The joint plan: reuse, coalescing, grants, reclaim, prefetch, committed work, memory safety."""

from __future__ import annotations

import pytest
from dispatch_factories import make_plain_snapshot
from hypothesis import given, settings
from pool_factories import (
    POOL_PLANS,
    RUN,
    D,
    P,
    R,
    best_runtime,
    make_pool,
    make_pool_snapshot,
    make_replica,
    make_unit,
    pool_scenarios,
)

from maserve_prefect.dispatch.plans import get_plan
from maserve_prefect.dispatch.snapshot import Decisions
from maserve_prefect.errors import ConfigError
from maserve_prefect.pool.snapshot import PlanOptions, PoolSnapshot
from maserve_prefect.pool.state import ActiveRequest, Lease, ReplicaInfo
from maserve_prefect.pool.window import WorkUnit
from maserve_prefect.protocol.state import Lifecycle

JOINT = get_plan("joint")


def test_joint_is_registered_and_refuses_a_plain_snapshot() -> None:
    with pytest.raises(ConfigError, match="PoolSnapshot"):
        JOINT.plan(make_plain_snapshot((), ()))


def test_reuses_a_resident_replica_before_loading_on_a_faster_free_device() -> None:
    state = make_pool(
        ["V100-32GB:0", "A100-40GB:0"], make_replica("slow8", "Qwen3-8B", "V100-32GB:0")
    )
    d = JOINT.plan(make_pool_snapshot(state, [make_unit("a", "Qwen3-8B")], {"a": R}))
    assert [(s.unit_id, s.replica) for s in d.submits] == [("a", "slow8")]
    assert d.loads == () and d.unloads == ()


def test_two_roots_needing_one_model_get_one_load_then_two_grants() -> None:
    units = [make_unit("r1/a", "Qwen3-8B", "r1"), make_unit("r2/a", "Qwen3-8B", "r2")]
    status = {"r1/a": R, "r2/a": R}
    d = JOINT.plan(make_pool_snapshot(make_pool(["A100-40GB:0"]), units, status))
    assert len(d.loads) == 1 and d.submits == ()
    assert d.loads[0].deployment == "Qwen3-8B" and set(d.loads[0].units) == {"r1/a", "r2/a"}
    loading = make_replica("m8", "Qwen3-8B", "A100-40GB:0", Lifecycle.LOADING, ready_s=39.0)
    d = JOINT.plan(make_pool_snapshot(make_pool(["A100-40GB:0"], loading, now=1.0), units, status))
    assert d == Decisions(), "demand covered by the load in flight"
    resident = make_replica("m8", "Qwen3-8B", "A100-40GB:0")
    d = JOINT.plan(
        make_pool_snapshot(make_pool(["A100-40GB:0"], resident, now=39.0), units, status)
    )
    assert sorted((s.unit_id, s.replica) for s in d.submits) == [("r1/a", "m8"), ("r2/a", "m8")]
    assert sorted(g.unit_ids for g in d.grants) == [("r1/a",), ("r2/a",)]


def test_a_fused_chain_is_granted_whole_and_fusion_can_be_switched_off() -> None:
    units = [make_unit("a", "Qwen3-4B", succs=["b"]), make_unit("b", "Qwen3-4B", preds=["a"])]
    state = make_pool(["A100-40GB:0"], make_replica("m4", "Qwen3-4B", "A100-40GB:0"))
    d = JOINT.plan(make_pool_snapshot(state, units, {"a": R, "b": P}))
    assert [(g.replica, g.unit_ids) for g in d.grants] == [("m4", ("a", "b"))]
    d = JOINT.plan(
        make_pool_snapshot(state, units, {"a": R, "b": P}, options=PlanOptions(fusion=False))
    )
    assert [g.unit_ids for g in d.grants] == [("a",)]


def test_reclaim_takes_a_redundant_copy_before_the_least_recently_used_unique_one() -> None:
    busy = ActiveRequest("z", 10, 10, 0.0, 100.0)
    state = make_pool(
        ["A100-40GB:0", "V100-32GB:0"],
        make_replica("x8", "Qwen3-8B", "A100-40GB:0", last_used_s=5.0),
        make_replica("x4", "Qwen3-4B", "A100-40GB:0", last_used_s=3.0),
        make_replica("x06", "Qwen3-0.6B", "A100-40GB:0", last_used_s=0.0),
        make_replica("y4", "Qwen3-4B", "V100-32GB:0", active=(busy,)),
        make_replica("y8", "Qwen3-8B", "V100-32GB:0", active=(busy,)),
        now=10.0,
    )
    d = JOINT.plan(make_pool_snapshot(state, [make_unit("a", "Qwen3-1.7B")], {"a": R}))
    assert [u.replica for u in d.unloads] == ["x4"]
    assert [(ld.deployment, ld.device, ld.after) for ld in d.loads] == [
        ("Qwen3-1.7B", "A100-40GB:0", ("x4",))
    ]


def test_no_lease_holding_replica_is_ever_reclaimed() -> None:
    state = make_pool(
        ["A100-40GB:0"],
        make_replica("held", "Qwen3-14B", "A100-40GB:0"),
        leases=(Lease("held", "c", ("q",)),),
        grants=(("held", ("q",)),),
    )
    for name in POOL_PLANS:
        d = get_plan(name).plan(make_pool_snapshot(state, [make_unit("a", "Qwen3-8B")], {"a": R}))
        assert d.unloads == () and d.loads == (), name


def test_replanning_after_an_early_completion_keeps_the_granted_chain() -> None:
    # a finished early; b (its fused successor) is ready and bound to "g" by a standing grant;
    # "other" is an idle copy with a shorter queue, and c needs memory "g" holds.
    state = make_pool(
        ["A100-40GB:0", "V100-32GB:0"],
        make_replica("g", "Qwen3-14B", "A100-40GB:0"),
        make_replica("other", "Qwen3-14B", "V100-32GB:0"),
        leases=(Lease("g", "a", ("b",)),),
        grants=(("g", ("b",)),),
        now=3.0,
    )
    units = [
        make_unit("a", "Qwen3-14B", succs=["b"]),
        make_unit("b", "Qwen3-14B", preds=["a"]),
        make_unit("c", "Qwen3-8B", root="r2"),
    ]
    d = JOINT.plan(make_pool_snapshot(state, units, {"a": D, "b": R, "c": R}))
    assert ("b", "g") in [(s.unit_id, s.replica) for s in d.submits]
    assert "g" not in [u.replica for u in d.unloads]


def test_replanning_after_a_late_completion_keeps_the_running_work() -> None:
    late = ActiveRequest("a", 200, 50, 0.0, 1.0)  # predicted to end at 1.0; now is 20.0
    state = make_pool(
        ["A100-40GB:0"],
        make_replica("g", "Qwen3-14B", "A100-40GB:0", active=(late,)),
        leases=(Lease("g", "a", ("a", "b")),),
        grants=(("g", ("a", "b")),),
        now=20.0,
    )
    units = [
        make_unit("a", "Qwen3-14B", succs=["b"]),
        make_unit("b", "Qwen3-14B", preds=["a"]),
        make_unit("c", "Qwen3-8B", root="r2"),
    ]
    d = JOINT.plan(make_pool_snapshot(state, units, {"a": RUN, "b": P, "c": R}, started={"a": 0.0}))
    assert d.unloads == () and d.submits == ()
    assert d.loads == ()  # c cannot get memory while the chain holds g


def _prefetch_case(started_a: float, options: PlanOptions | None = None, extra=()):
    state = make_pool(
        ["A100-40GB:0", "V100-32GB:0"],
        make_replica(
            "m8", "Qwen3-8B", "V100-32GB:0", active=(ActiveRequest("a", 200, 4000, 0.0, 90.0),)
        ),
        now=80.0,
    )
    units = [
        make_unit("a", "Qwen3-8B", n_out=4000, succs=["b"]),
        make_unit("b", "Qwen3-4B", preds=["a"]),
    ]
    status = {"a": RUN, "b": P}
    for u in extra:
        units.append(u)
        status[u.unit_id] = R
    return JOINT.plan(
        make_pool_snapshot(state, units, status, started={"a": started_a}, options=options)
    )


def test_prefetches_a_near_ready_deployment_only_when_its_release_nears_load_time() -> None:
    rt = best_runtime(make_unit("a", "Qwen3-8B", n_out=4000))
    soon = _prefetch_case(started_a=80.0 - rt + 10.0)  # releases in 10 s, a load takes ~35 s
    assert [(ld.deployment, ld.prefetch, ld.units) for ld in soon.loads] == [
        ("Qwen3-4B", True, ("b",))
    ]
    late = _prefetch_case(started_a=80.0 - rt + 60.0)  # releases in 60 s
    assert late.loads == ()
    off = _prefetch_case(started_a=80.0 - rt + 10.0, options=PlanOptions(prefetch=False))
    assert off.loads == ()


def test_no_prefetch_while_ready_work_is_blocked() -> None:
    rt = best_runtime(make_unit("a", "Qwen3-8B", n_out=4000))
    # a ready 14B unit can get memory nowhere: A100 would hold it, but it is a ready action
    d = _prefetch_case(80.0 - rt + 10.0, extra=[make_unit("c", "Qwen3-14B", root="r2")])
    assert all(not ld.prefetch for ld in d.loads)


def _second_copy_case(v100_holds_idle_14b: bool) -> Decisions:
    """a (8B) runs on m8 and releases in 10 s; thirty 8B successors need more KV than m8 has.
    The A100 has no room for a second 8B copy (m8 and an idle 4B copy fill it)."""
    a = make_unit("a", "Qwen3-8B", n_out=4000, succs=[f"b{i}" for i in range(30)])
    bs = [make_unit(f"b{i}", "Qwen3-8B", preds=["a"], n_in=3000, n_out=1000) for i in range(30)]
    running = ActiveRequest("a", 200, 4000, 0.0, 90.0)
    reps = [
        make_replica("m8", "Qwen3-8B", "A100-40GB:0", active=(running,)),
        make_replica("x4", "Qwen3-4B", "A100-40GB:0"),
    ]
    if v100_holds_idle_14b:  # idle, and no work in the window needs it
        reps.append(make_replica("x14", "Qwen3-14B", "V100-32GB:0"))
    state = make_pool(["A100-40GB:0", "V100-32GB:0"], *reps, now=80.0)
    status = {"a": RUN, **{b.unit_id: P for b in bs}}
    started = {"a": 80.0 - best_runtime(a) + 10.0}
    return JOINT.plan(make_pool_snapshot(state, [a, *bs], status, started=started))


def test_a_second_copy_is_prefetched_only_into_free_memory() -> None:
    free = _second_copy_case(v100_holds_idle_14b=False)
    assert [(ld.deployment, ld.device, ld.prefetch, ld.after) for ld in free.loads] == [
        ("Qwen3-8B", "V100-32GB:0", True, ())
    ]
    assert len(free.loads[0].units) == 30
    # the same demand, but the only room is an idle replica of another model: a speculative
    # second copy never reclaims (under Poisson that swapped copies back and forth)
    held = _second_copy_case(v100_holds_idle_14b=True)
    assert held.loads == () and held.unloads == ()


# -- property: memory at every predicted transition, leases, batch limits ----------------------


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
@given(pool_scenarios())
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
