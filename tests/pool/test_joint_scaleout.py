"""The joint plan's scale-out and reclaim rule: a new copy only where it beats the existing
replica's queue drain by more than the delay it puts on its victims' own work."""

from __future__ import annotations

from pool_factories import (
    RUN,
    P,
    R,
    best_runtime,
    make_pool,
    make_pool_snapshot,
    make_replica,
    make_unit,
)

from maserve_prefect.dispatch.plans import get_plan
from maserve_prefect.pool.state import ActiveRequest
from maserve_prefect.protocol.state import Lifecycle

JOINT = get_plan("joint")


def test_no_second_copy_while_the_first_drains_this_rounds_queue_sooner() -> None:
    # one resident 14B runs two requests at a time; four 14B units are ready. Two go to it now;
    # the other two run there once those end (seconds), long before a second copy could load
    # (~46 s) on the free A100.
    r14 = make_replica("r14", "Qwen3-14B", "V100-32GB:0", max_num_seqs=2)
    state = make_pool(["V100-32GB:0", "A100-40GB:0"], r14, now=10.0)
    units = [make_unit(f"r{i}/a", "Qwen3-14B", f"r{i}") for i in range(4)]
    d = JOINT.plan(make_pool_snapshot(state, units, {u.unit_id: R for u in units}))
    assert sorted(s.unit_id for s in d.submits) == ["r0/a", "r1/a"]
    assert all(s.replica == "r14" for s in d.submits)
    assert d.loads == () and d.unloads == ()


def test_a_second_copy_when_the_queue_drains_later_than_a_load() -> None:
    # the same, but the resident copy's two slots are busy for another 200 s: a copy on the free
    # A100 serves the waiting units sooner, so it is loaded.
    busy = tuple(ActiveRequest(f"z{i}", 200, 50, 0.0, 210.0) for i in range(2))
    r14 = make_replica("r14", "Qwen3-14B", "V100-32GB:0", max_num_seqs=2, active=busy)
    state = make_pool(["V100-32GB:0", "A100-40GB:0"], r14, now=10.0)
    units = [make_unit(f"r{i}/a", "Qwen3-14B", f"r{i}") for i in range(2)]
    d = JOINT.plan(make_pool_snapshot(state, units, {u.unit_id: R for u in units}))
    assert [(ld.deployment, ld.device) for ld in d.loads] == [("Qwen3-14B", "A100-40GB:0")]


def _reclaim_case(with_pending_14b: bool):
    # "m8" (V100) runs one request at a time and is busy for 60 s; unit "b" (8B) waits for it.
    # The A100 holds only an idle 14B ("m14"): a second 8B copy needs it reclaimed. A 0.6B unit
    # "p" running beside m8 releases the 14B unit "q" in about a second.
    now = 10.0
    a = ActiveRequest("a", 200, 50, now, now + 60.0)
    p_rt = best_runtime(make_unit("p", "Qwen3-0.6B"))
    p_run = ActiveRequest("p", 200, 50, now, now + p_rt)
    state = make_pool(
        ["V100-32GB:0", "A100-40GB:0"],
        make_replica("m8", "Qwen3-8B", "V100-32GB:0", max_num_seqs=1, active=(a,)),
        make_replica("m06", "Qwen3-0.6B", "V100-32GB:0", active=(p_run,)),
        make_replica("m14", "Qwen3-14B", "A100-40GB:0", last_used_s=0.0),
        now=now,
    )
    units = [make_unit("a", "Qwen3-8B", "r1"), make_unit("b", "Qwen3-8B", "r2")]
    status = {"a": RUN, "b": R}
    started = {"a": now}
    if with_pending_14b:
        units += [
            make_unit("p", "Qwen3-0.6B", "r3", succs=["q"]),
            make_unit("q", "Qwen3-14B", "r3", preds=["p"]),
        ]
        status.update({"p": RUN, "q": P})
        started["p"] = now
    return JOINT.plan(make_pool_snapshot(state, units, status, started=started))


def test_reclaim_is_refused_when_the_victims_own_work_would_wait_longer_than_it_gains() -> None:
    # the gain (b done ~20 s sooner on a new A100 copy) is less than the delay of reloading the
    # 14B for q (~47 s after q's release): keep m14, b waits for m8.
    d = _reclaim_case(with_pending_14b=True)
    assert d.unloads == () and d.loads == ()


def test_reclaim_is_taken_when_the_victim_has_no_work_coming() -> None:
    d = _reclaim_case(with_pending_14b=False)
    assert [u.replica for u in d.unloads] == ["m14"]
    assert [(ld.deployment, ld.device, ld.after) for ld in d.loads] == [
        ("Qwen3-8B", "A100-40GB:0", ("m14",))
    ]


def test_a_load_waits_for_an_unload_under_way_instead_of_reclaiming() -> None:
    # the A100's 14B is unloading (ends in 0.5 s); the V100's idle 14B has work coming (q, once
    # p, running on a small model beside it, ends). A 4B unit is ready: reclaim nothing and wait
    # for the unload's end (an event, so a replan), which then loads the 4B on the A100.
    now = 20.0
    p_run = ActiveRequest("p", 200, 50, now, now + 1.0)
    v14 = make_replica("v14", "Qwen3-14B", "V100-32GB:0", last_used_s=19.0)
    a06 = make_replica("a06", "Qwen3-0.6B", "A100-40GB:0", active=(p_run,))
    a14 = make_replica("a14", "Qwen3-14B", "A100-40GB:0", Lifecycle.UNLOADING, ready_s=now + 0.5)
    units = [
        make_unit("x", "Qwen3-4B", "r1"),
        make_unit("p", "Qwen3-0.6B", "r2", succs=["q"]),
        make_unit("q", "Qwen3-14B", "r2", preds=["p"]),
    ]
    status = {"x": R, "p": RUN, "q": P}
    state = make_pool(["V100-32GB:0", "A100-40GB:0"], v14, a06, a14, now=now)
    d = JOINT.plan(make_pool_snapshot(state, units, status, started={"p": now}))
    assert d.unloads == () and d.loads == ()
    later = make_pool(["V100-32GB:0", "A100-40GB:0"], v14, a06, now=now + 0.5)
    d = JOINT.plan(make_pool_snapshot(later, units, status, started={"p": now}))
    assert d.unloads == ()
    assert [(ld.deployment, ld.device) for ld in d.loads] == [("Qwen3-4B", "A100-40GB:0")]
