"""Provisioning by predicted work (`pool.provision`): second copies for known future work, into
free memory, never on the only device kind of constrained work that would gain more there."""

from __future__ import annotations

from pool_factories import (
    GPUS,
    MODELS,
    R,
    make_device,
    make_pool,
    make_pool_snapshot,
    make_replica,
    make_unit,
)

from maserve_prefect.dispatch.plans import get_plan
from maserve_prefect.pool.executor import run_pool
from maserve_prefect.pool.inputs import ExecOptions, RootDag
from maserve_prefect.pool.provision import fluid_end_s
from maserve_prefect.pool.snapshot import PlanOptions
from maserve_prefect.pool.state import ActiveRequest, PoolState, ReplicaInfo, deployment_info
from maserve_prefect.pool.window import UnitStatus, WorkUnit

JOINT = get_plan("joint")


def _prev(ids: list[str], k: int) -> tuple[str, ...]:
    return (ids[k - 1],) if k else ()


def _next(ids: list[str], k: int) -> tuple[str, ...]:
    return (ids[k + 1],) if k + 1 < len(ids) else ()


def _chains(n: int, model: str = "Qwen3-4B", length: int = 3) -> list[RootDag]:
    """`n` roots arriving together, each a chain of `length` calls of `model`."""
    out = []
    for i in range(n):
        root = f"r{i}"
        ids = [f"{root}/{k}" for k in range(length)]
        units = tuple(
            WorkUnit(ids[k], root, model, 600, 300, _prev(ids, k), _next(ids, k))
            for k in range(length)
        )
        out.append(RootDag(root, 0.0, units, "chain"))
    return out


def test_a_second_copy_for_known_future_work_shortens_a_cold_burst() -> None:
    """120 three-call Qwen3-4B chains on two free A100s. Every first call fits one replica's
    batch slots, so the ready-work rule loads one copy and the other GPU stays idle the whole
    run, with every call at batch 120; counting the known future calls, a second copy halves
    the batch and the run ends sooner."""
    wfs = _chains(120)
    devices = ["A100-40GB:0", "A100-40GB:1"]
    old = run_pool(wfs, devices, "joint")
    new = run_pool(wfs, devices, "joint", options=ExecOptions(provision=True))
    assert old.summary()["num_loads"] == 1
    loads = [e for e in new.lifecycle if e.action == "load"]
    assert sorted(e.device for e in loads) == devices and all(e.start_s == 0.0 for e in loads)
    assert new.makespan_s < 0.9 * old.makespan_s
    assert new.p95_latency_s < old.p95_latency_s


def _sized(name: str, model: str, device: str, seqs: int) -> ReplicaInfo:
    """A replica sized at vLLM's 0.9 (where 14B fits only an A100), running `seqs` requests,
    its batch limit."""
    fit = deployment_info(ExecOptions().deployment(model), GPUS).fit(device.split(":")[0])
    assert fit is not None
    return make_replica(
        name, model, device, held_bytes=fit.footprint_bytes, footprint_bytes=fit.footprint_bytes,
        kv_capacity_tokens=fit.kv_capacity_tokens, max_num_seqs=seqs,
        active=tuple(ActiveRequest(f"{name}-{i}", 600, 300, 0.0, 30.0) for i in range(seqs)),
    )  # fmt: skip


def test_flexible_work_takes_the_device_constrained_work_cannot_use() -> None:
    """80 ready 4B calls queue on a V100 copy running 16 at a time; 60 ready 14B calls on an A100
    copy running 4 at a time; one A100 and one V100 are free. Ranked by ready units covered and
    with 14B holding a copy, the old rule gives the A100 (the faster GPU) to 4B and 14B has
    nowhere to go; 14B's work gains more from that A100 than 4B's does, and 14B fits nowhere
    else, so 4B goes to the V100 and 14B to the A100."""
    infos = tuple(deployment_info(ExecOptions().deployment(m), GPUS) for m in MODELS)
    devices = ("A100-40GB:0", "V100-32GB:0", "A100-40GB:1", "V100-32GB:1")
    replicas = (
        _sized("m4", "Qwen3-4B", "V100-32GB:0", 16),
        _sized("m14", "Qwen3-14B", "A100-40GB:0", 4),
    )
    state = PoolState(1.0, tuple(make_device(d) for d in devices), infos, replicas)
    units = [make_unit(f"f{i}", "Qwen3-4B", f"f{i}", n_in=600, n_out=300) for i in range(80)]
    units += [make_unit(f"c{i}", "Qwen3-14B", f"c{i}", n_in=600, n_out=300) for i in range(60)]
    status = {u.unit_id: R for u in units}
    on = PlanOptions(provision=True)
    d = JOINT.plan(make_pool_snapshot(state, units, status, options=on))
    assert sorted((x.deployment, x.device) for x in d.loads) == [
        ("Qwen3-14B", "A100-40GB:1"),
        ("Qwen3-4B", "V100-32GB:1"),
    ]
    off = JOINT.plan(make_pool_snapshot(state, units, status))
    assert ("Qwen3-4B", "A100-40GB:1") in [(x.deployment, x.device) for x in off.loads]
    assert "Qwen3-14B" not in [x.deployment for x in off.loads]


def test_no_copy_when_the_existing_ones_drain_the_work_before_a_load_ends() -> None:
    """A few ready calls on an idle resident copy: another copy would be ready only after they
    are done, so nothing is loaded although a GPU is free."""
    state = make_pool(["A100-40GB:0", "A100-40GB:1"], make_replica("m4", "Qwen3-4B"), now=5.0)
    units = [make_unit(f"u{i}", "Qwen3-4B", f"r{i}") for i in range(6)]
    status = {u.unit_id: UnitStatus.READY for u in units}
    on = PlanOptions(provision=True)
    d = JOINT.plan(make_pool_snapshot(state, units, status, options=on))
    assert d.loads == () and len(d.submits) == 6


def test_fluid_end_counts_releases_and_late_copies() -> None:
    assert fluid_end_s([(0.0, 2.0)], [0.0] * 4) == 2.0
    # released late: the end is bounded by the last release
    assert fluid_end_s([(0.0, 2.0)], [0.0, 10.0]) == 10.5
    # a copy ready after the work is done adds nothing
    assert fluid_end_s([(0.0, 1.0), (50.0, 5.0)], [0.0] * 4) == 4.0
    assert fluid_end_s([], [0.0]) == float("inf")
    assert fluid_end_s([(0.0, 1.0)], []) == 0.0
