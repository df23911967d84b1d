"""The Scheduler of §3 in the joint plan: same-round near-ready, KV admission, scarce devices,
fusion reservations."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st
from pool_factories import (
    GPUS,
    MODELS,
    RUN,
    P,
    R,
    make_device,
    make_pool,
    make_pool_snapshot,
    make_replica,
    make_unit,
)

from maserve_prefect.dispatch.plans import get_plan
from maserve_prefect.pool.admission import admit_limit_blocks, blocks_for, committed_blocks
from maserve_prefect.pool.inputs import ExecOptions
from maserve_prefect.pool.state import ActiveRequest, PoolState, ReplicaInfo, deployment_info

JOINT = get_plan("joint")


def test_a_successor_is_near_ready_in_the_round_its_predecessor_is_submitted() -> None:
    """a (8B, resident) -> b (4B, nowhere): submitting a makes b near-ready at once, so the
    same plan prefetches 4B for it instead of waiting for the next event."""
    units = [
        make_unit("a", "Qwen3-8B", succs=["b"]),
        make_unit("b", "Qwen3-4B", preds=["a"]),
    ]
    state = make_pool(["A100-40GB:0", "A100-40GB:1"], make_replica("m8", "Qwen3-8B"))
    d = JOINT.plan(make_pool_snapshot(state, units, {"a": R, "b": P}))
    assert [(s.unit_id, s.replica) for s in d.submits] == [("a", "m8")]
    assert [(x.deployment, x.prefetch, x.units) for x in d.loads] == [("Qwen3-4B", True, ("b",))]


def _small_kv_replica(kv_tokens: int, **kw: object) -> ReplicaInfo:
    return make_replica("m4", "Qwen3-4B", kv_capacity_tokens=kv_tokens, **kw)


@settings(max_examples=40, deadline=None)
@given(
    sizes=st.lists(st.tuples(st.integers(1, 3000), st.integers(1, 2000)), min_size=1, max_size=12),
    kv_blocks=st.integers(50, 600),
    busy=st.integers(0, 400),
)
def test_committed_work_never_exceeds_the_engine_kv_limit(
    sizes: list[tuple[int, int]], kv_blocks: int, busy: int
) -> None:
    units = [make_unit(f"u{i}", "Qwen3-4B", n_in=a, n_out=b) for i, (a, b) in enumerate(sizes)]
    active = (ActiveRequest("z", busy * 16 // 2, busy * 16 // 2, 0.0, 50.0),) if busy else ()
    r = _small_kv_replica(kv_blocks * 16, active=active)
    snap = make_pool_snapshot(make_pool(1, r), units, {u.unit_id: R for u in units})
    d = JOINT.plan(snap)
    sizes_by = {u.unit_id: u.context_tokens for u in units}
    sent = [blocks_for(sizes_by[s.unit_id], 16) for s in d.submits]
    held = blocks_for(busy * 16, 16) if busy else 0
    if held == 0 and len(sent) == 1:
        assert sent[0] <= kv_blocks  # an idle replica takes one request its whole pool holds
    elif sent:
        assert held + sum(sent) <= admit_limit_blocks(kv_blocks, 0)


def _sized_pool(*replicas: ReplicaInfo) -> PoolState:
    """One A100-40GB and one V100-32GB with replicas sized at vLLM's 0.9 (14B fits only the
    A100)."""
    infos = tuple(deployment_info(ExecOptions().deployment(m), GPUS) for m in MODELS)
    devices = (make_device("A100-40GB:0"), make_device("V100-32GB:0"))
    return PoolState(0.0, devices, infos, replicas)


def test_flexible_work_leaves_the_only_device_of_pending_constrained_demand() -> None:
    """Eight ready 4B units and one ready 14B unit, both GPUs free. Without the scarce-device
    term the 4B load (more units covered, faster on the A100) takes the A100 and 14B has
    nowhere to go; with it, 4B goes to the V100 and 14B to the A100."""
    units = [make_unit(f"s{i}", "Qwen3-4B", f"r{i}", n_in=2000, n_out=1500) for i in range(8)]
    units.append(make_unit("big", "Qwen3-14B", root="rb"))
    d = JOINT.plan(make_pool_snapshot(_sized_pool(), units, {u.unit_id: R for u in units}))
    assert sorted((x.deployment, x.device) for x in d.loads) == [
        ("Qwen3-14B", "A100-40GB:0"),
        ("Qwen3-4B", "V100-32GB:0"),
    ]


def test_coverage_decides_which_deployment_takes_a_scarce_device_first() -> None:
    """The V100 is busy; the A100 is the only place for both eight ready 8B units and one ready
    14B unit. The scarce-device term places copies; across deployments Eq. 12's coverage
    decides: the 8B copy (8 units) takes the A100 first, 14B follows when it frees."""
    busy = make_replica("v4", "Qwen3-4B", "V100-32GB:0",
                        active=(ActiveRequest("q", 2000, 500, 0.0, 300.0),))  # fmt: skip
    units = [make_unit(f"e{i}", "Qwen3-8B", f"r{i}") for i in range(8)]
    units.append(make_unit("big", "Qwen3-14B", root="rb"))
    d = JOINT.plan(make_pool_snapshot(_sized_pool(busy), units, {u.unit_id: R for u in units}))
    assert [(x.deployment, x.device) for x in d.loads] == [("Qwen3-8B", "A100-40GB:0")]


def test_a_granted_chain_keeps_its_kv_reservation_between_members() -> None:
    """Chain a -> b runs under one grant on m4; a is done, b not yet ready. The replica's pool
    holds b's context plus one more request: of two ready units only one is admitted, so b
    still fits when it becomes ready."""
    a = make_unit("a", "Qwen3-4B", root="c", succs=["b"], n_in=800, n_out=800)
    b = make_unit("b", "Qwen3-4B", root="c", preds=["a"], n_in=1600, n_out=800)
    x = make_unit("x", "Qwen3-4B", root="rx", n_in=800, n_out=800)
    y = make_unit("y", "Qwen3-4B", root="ry", n_in=800, n_out=800)
    kv_blocks = 150 + 100 + 4 + 50  # b (2400 tokens) + x (1600) + ε_M, and less than y
    r = _small_kv_replica(kv_blocks * 16)
    state = make_pool(1, r, grants=(("m4", ("b",)),))
    snap = make_pool_snapshot(state, [a, b, x, y], {"a": RUN, "b": P, "x": R, "y": R})
    assert committed_blocks([], [("b",)], snap.units, 16) == blocks_for(2400, 16)
    d = JOINT.plan(snap)
    assert [s.unit_id for s in d.submits] == ["x"]
