"""dispatch.plans: the FCFS plan's least-loaded placement (alone and through the dispatcher over
several replicas), deterministic ties, and the plan registry's errors."""

from __future__ import annotations

import itertools

import pytest

from maserve_prefect.clock.kernel import Kernel
from maserve_prefect.dispatch.dispatcher import Dispatcher
from maserve_prefect.dispatch.fcfs import FcfsPlan
from maserve_prefect.dispatch.plans import get_plan, plan_names, register_plan
from maserve_prefect.dispatch.snapshot import ReplicaView, Snapshot, Unit
from maserve_prefect.engines.sim.cost.step_time import make_step_model
from maserve_prefect.engines.sim.replica import SimReplica
from maserve_prefect.errors import ConfigError
from maserve_prefect.protocol.outcomes import Outcome
from maserve_prefect.protocol.requests import Request
from maserve_prefect.protocol.state import Lifecycle


def view(
    name: str, outstanding: int, *, deployment: str = "m", lifecycle: Lifecycle = Lifecycle.READY
) -> ReplicaView:
    return ReplicaView(name, deployment, lifecycle, outstanding)


def ready_units(*ids: str, deployment: str = "m") -> tuple[Unit, ...]:
    return tuple(Unit(u, "r", deployment, 10, 1, ready_s=float(i)) for i, u in enumerate(ids))


def placements(snap: Snapshot) -> list[tuple[str, str]]:
    return [(s.unit_id, s.replica) for s in FcfsPlan().plan(snap).submits]


def test_fcfs_places_on_the_least_loaded_replica_counting_its_own_assignments() -> None:
    replicas = (view("x", 2), view("y", 0), view("z", 1))
    snap = Snapshot(0.0, ready_units("a", "b", "c", "d"), (), replicas)
    # y is least loaded; then y and z tie at 1 (name order); then z; then all tie at 2.
    assert placements(snap) == [("a", "y"), ("b", "y"), ("c", "z"), ("d", "x")]


def test_fcfs_ties_break_by_name_whatever_the_replica_order() -> None:
    replicas = [view("r2", 0), view("r0", 0), view("r1", 0)]
    expected = [("a", "r0"), ("b", "r1"), ("c", "r2"), ("d", "r0")]
    for order in itertools.permutations(replicas):
        snap = Snapshot(0.0, ready_units("a", "b", "c", "d"), (), tuple(order))
        assert placements(snap) == expected


def test_fcfs_skips_replicas_not_accepting_or_of_another_deployment() -> None:
    replicas = (
        view("a-idle", 5),
        view("b-loading", 0, lifecycle=Lifecycle.LOADING),
        view("c-other", 0, deployment="other"),
    )
    units = ready_units("u1") + ready_units("u2", deployment="nobody")
    # u2's deployment has no replica: it is left ready for a later event, not misplaced.
    assert placements(Snapshot(0.0, units, (), replicas)) == [("u1", "a-idle")]


def test_dispatcher_sends_each_ready_unit_to_the_least_loaded_replica() -> None:
    k = Kernel()
    step = make_step_model("Qwen3-0.6B", "A100-40GB")
    reps = [SimReplica(k, step, 1000, name=f"r{i}", deployment="small") for i in (2, 0, 1)]
    d = Dispatcher(lambda: reps, k.now)
    placed: dict[str, str] = {}
    done: list[Outcome] = []

    def ready(uid: str, max_tokens: int) -> None:
        def submitted(_t: float, replica: str) -> None:
            placed[uid] = replica

        req = Request(uid, "small", num_prompt_tokens=16, max_tokens=max_tokens)
        d.on_ready(Unit(uid, "root", "small", 16, max_tokens), req, on_done=done.append,
                   on_submitted=submitted)  # fmt: skip

    for uid, n in (("long0", 200), ("short", 1), ("long1", 200)):
        ready(uid, n)
    # All idle: ties by name, whatever order the pool lists its replicas in.
    assert placed == {"long0": "r0", "short": "r1", "long1": "r2"}
    while not done:
        k.step()
    assert [o.request_id for o in done] == ["short"]
    ready("next", 1)
    # r1 finished its call; r0 and r2 still have one outstanding each.
    assert placed["next"] == "r1"
    k.run()
    assert sorted(o.request_id for o in done) == ["long0", "long1", "next", "short"]


def test_unknown_plan_names_the_known_ones() -> None:
    with pytest.raises(ConfigError, match=r"unknown plan 'no-such-plan'; known plans: .*fcfs"):
        get_plan("no-such-plan")
    assert "fcfs" in plan_names()


def test_registering_a_name_twice_is_refused_and_keeps_the_first() -> None:
    with pytest.raises(
        ConfigError,
        match=r"plan named 'fcfs' is already registered \(FcfsPlan\); register yours under another name",
    ):
        register_plan("fcfs", FcfsPlan)
    assert isinstance(get_plan("fcfs"), FcfsPlan)


def test_get_plan_returns_a_fresh_instance() -> None:
    assert get_plan("fcfs") is not get_plan("fcfs")
