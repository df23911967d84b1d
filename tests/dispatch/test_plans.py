"""dispatch.plans: the FCFS plan's least-loaded placement (alone and through the dispatcher over
several replicas), deterministic ties, and the plan registry's errors."""

from __future__ import annotations

import itertools

import pytest
from dispatch_factories import (
    make_plain_snapshot,
    make_ready_units,
    make_request,
    make_sim_replicas,
    make_unit,
    make_view,
)

from maserve_prefect.clock.kernel import Kernel
from maserve_prefect.dispatch.dispatcher import Dispatcher
from maserve_prefect.dispatch.fcfs import FcfsPlan
from maserve_prefect.dispatch.plans import get_plan, plan_names, register_plan
from maserve_prefect.dispatch.snapshot import Snapshot
from maserve_prefect.errors import ConfigError
from maserve_prefect.protocol.outcomes import Outcome
from maserve_prefect.protocol.state import Lifecycle


def placements(snap: Snapshot) -> list[tuple[str, str]]:
    return [(s.unit_id, s.replica) for s in FcfsPlan().plan(snap).submits]


def test_fcfs_places_on_the_least_loaded_replica_counting_its_own_assignments() -> None:
    replicas = (make_view("x", 2), make_view("y", 0), make_view("z", 1))
    snap = make_plain_snapshot(make_ready_units("a", "b", "c", "d"), replicas)
    # y is least loaded; then y and z tie at 1 (name order); then z; then all tie at 2.
    assert placements(snap) == [("a", "y"), ("b", "y"), ("c", "z"), ("d", "x")]


def test_fcfs_ties_break_by_name_whatever_the_replica_order() -> None:
    replicas = [make_view("r2", 0), make_view("r0", 0), make_view("r1", 0)]
    expected = [("a", "r0"), ("b", "r1"), ("c", "r2"), ("d", "r0")]
    for order in itertools.permutations(replicas):
        snap = make_plain_snapshot(make_ready_units("a", "b", "c", "d"), order)
        assert placements(snap) == expected


def test_fcfs_skips_replicas_not_accepting_or_of_another_deployment() -> None:
    replicas = (
        make_view("a-idle", 5),
        make_view("b-loading", 0, lifecycle=Lifecycle.LOADING),
        make_view("c-other", 0, deployment="other"),
    )
    units = make_ready_units("u1") + make_ready_units("u2", deployment="nobody")
    # u2's deployment has no replica: it is left ready for a later event, not misplaced.
    assert placements(make_plain_snapshot(units, replicas)) == [("u1", "a-idle")]


def test_dispatcher_sends_each_ready_unit_to_the_least_loaded_replica() -> None:
    k = Kernel()
    reps = make_sim_replicas(k, ["r2", "r0", "r1"])
    d = Dispatcher(lambda: reps, k.now)
    placed: dict[str, str] = {}
    done: list[Outcome] = []

    def ready(uid: str, max_tokens: int) -> None:
        def submitted(_t: float, replica: str) -> None:
            placed[uid] = replica

        unit = make_unit(uid, root="root", deployment="small", num_prompt_tokens=16,
                         max_tokens=max_tokens)  # fmt: skip
        d.on_ready(unit, make_request(unit), on_done=done.append, on_submitted=submitted)

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
