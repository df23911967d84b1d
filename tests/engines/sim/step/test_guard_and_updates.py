"""Engine-side ordering (HEAR issue: ordering inside the engine): protection, priority updates,
and FCFS when nobody sends a control — on the scheduler step function and through a replica."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st
from sim_factories import LinearCost, make_scheduler, make_sim_request, req

from maserve_prefect.clock.kernel import Kernel
from maserve_prefect.engines.sim.replica import SimReplica
from maserve_prefect.engines.sim.request import RequestStatus, SimRequest
from maserve_prefect.engines.sim.step.scheduler import Policy, SchedulerConfig
from maserve_prefect.protocol.controls import Force, MaxWait, Priority
from maserve_prefect.protocol.outcomes import Acceptance


def _run_steps(
    sched,
    reqs: list[SimRequest],
    protect_after: dict[int, int],
    reprio: dict[int, dict[int, int]],
    num_steps: int,
):  # type: ignore[no-untyped-def]
    """Step `sched`; before step i, protect the requests named in `protect_after[seq] == i` and
    apply `reprio[i]` (seq -> priority). Returns per step (admitted seqs, preempted seqs,
    protected-waiting seqs before the step, running seqs before the step)."""
    by_seq = {r.seq: r for r in reqs}
    for r in reqs:
        sched.add_request(r)
    steps = []
    for i in range(num_steps):
        for seq, at in protect_after.items():
            if at == i:
                sched.protect(by_seq[seq])
        for seq, p in reprio.get(i, {}).items():
            sched.reprioritize(by_seq[seq], priority=p)
        protected_waiting = {r.seq for r in sched.waiting() if r.protected}
        running_before = {r.seq: r.protected for r in sched.running}
        out = sched.schedule()
        admitted = [it.seq for it in out.scheduled if it.request_id in out.admitted]
        preempted = [by_seq[int(rid[1:])].seq for rid in out.preempted]
        steps.append((admitted, preempted, protected_waiting, running_before))
        sched.update_from_output(out)
        sched.check_invariants()
        if not sched.has_work():
            break
    return steps


@st.composite
def guard_cases(draw: st.DrawFn):  # type: ignore[no-untyped-def]
    n = draw(st.integers(2, 9))
    blocks = draw(st.integers(6, 20))
    room = (blocks - 1) * 8  # every request fits alone (a replica refuses one that never can)
    specs = []
    for _ in range(n):
        prompt = draw(st.integers(8, min(96, room - 1)))
        specs.append(
            (prompt, draw(st.integers(1, min(24, room - prompt))), draw(st.integers(-3, 0)))
        )
    protect = {i: draw(st.integers(0, 6)) for i in range(n) if draw(st.booleans())}
    reprio = {
        draw(st.integers(0, 8)): {draw(st.integers(0, n - 1)): draw(st.integers(-4, 0))}
        for _ in range(draw(st.integers(0, 3)))
    }
    policy = draw(st.sampled_from([Policy.FCFS, Policy.PRIORITY]))
    return specs, protect, reprio, policy, blocks


@settings(max_examples=150, deadline=None)
@given(guard_cases())
def test_a_protected_request_is_never_bypassed_nor_preempted(case) -> None:  # type: ignore[no-untyped-def]
    specs, protect, reprio, policy, blocks = case
    sched = make_scheduler(blocks, block_size=8, max_num_batched_tokens=64, max_num_seqs=4,
                           policy=policy)  # fmt: skip
    reqs = [
        make_sim_request(f"r{i}", p, o, seq=i, block_size=8, arrival_s=float(i), priority=pr)
        for i, (p, o, pr) in enumerate(specs)
    ]
    steps = _run_steps(sched, reqs, protect, reprio, 400)
    for admitted, preempted, protected_waiting, running_before in steps:
        # not bypassed: while a protected request waits, nothing unprotected is admitted ahead
        # of it; protected ones are admitted longest wait first
        left = set(protected_waiting)
        for seq in admitted:
            if seq in left:
                assert seq == min(left), (seq, "a protected request jumped an older one")
                left.discard(seq)
            else:
                assert not left, (seq, "bypassed a protected request", sorted(left))
        for n, seq in enumerate(preempted):
            if running_before.get(seq):
                # not preempted: a protected request yields only once every unprotected running
                # request was preempted before it in the same step (nothing else frees blocks)
                unprotected = {s for s, prot in running_before.items() if not prot}
                assert unprotected <= set(preempted[:n]), (seq, "a protected request was preempted")
    assert all(r.status is RequestStatus.FINISHED for r in reqs)
    assert all(r.num_output_tokens == r.max_tokens for r in reqs)


def test_a_priority_update_reorders_the_waiting_queue() -> None:
    sched = make_scheduler(64, policy=Policy.PRIORITY, max_num_seqs=1)
    a, b, c = (make_sim_request(x, 16, 2, seq=i, arrival_s=float(i)) for i, x in enumerate("abc"))
    for r in (a, b, c):
        sched.add_request(r)
    assert [r.request_id for r in sched.waiting()] == ["a", "b", "c"]
    sched.reprioritize(c, priority=-5)  # c becomes hot: first
    assert [r.request_id for r in sched.waiting()] == ["c", "a", "b"]
    sched.reprioritize(a, priority=-5)  # a ties with c: arrival breaks the tie
    assert [r.request_id for r in sched.waiting()] == ["a", "c", "b"]
    out = sched.schedule()
    assert out.admitted == ["a"]


def test_with_no_control_the_engine_runs_first_come_first_served() -> None:
    k = Kernel()
    rep = SimReplica(k, LinearCost(per_context_s=1e-5), 64, SchedulerConfig(max_num_seqs=1))
    tickets = []

    def submit(i: int) -> None:
        tickets.append(rep.submit(req(f"r{i}", 32, 3)))

    for i, t in enumerate([0.0, 0.001, 0.002, 0.003]):
        k.call_at(t, lambda i=i: submit(i))
    k.run()
    finish = [t.outcome.finish_s for t in tickets]  # type: ignore[union-attr]
    assert finish == sorted(finish)
    assert [t.request_id for t in sorted(tickets, key=lambda t: t.outcome.first_scheduled_s)] == [  # type: ignore[union-attr]
        "r0", "r1", "r2", "r3"
    ]  # fmt: skip


def test_a_replica_applies_priority_and_guard_updates_after_submission() -> None:
    k = Kernel()
    cfg = SchedulerConfig(policy=Policy.PRIORITY, max_num_seqs=1)
    rep = SimReplica(k, LinearCost(per_context_s=1e-5), 64, cfg)
    first = rep.submit(req("busy", 32, 40))  # holds the only seat for a while
    late = [rep.submit(req(f"w{i}", 32, 2)) for i in range(3)]
    assert all(t.acceptance is Acceptance.ACCEPTED for t in [first, *late])
    res = rep.update("w2", [Priority(-3)])  # the last one becomes hot
    assert res.honoured == (Priority(-3),)
    guard = rep.update("w0", [MaxWait(0.0, force=Force.REQUIREMENT)])  # protected at once
    assert not guard.unsatisfied
    k.run()
    order = sorted(late, key=lambda t: t.outcome.first_scheduled_s)  # type: ignore[union-attr]
    assert [t.request_id for t in order] == ["w0", "w2", "w1"]
    gone = rep.update("w1", [Priority(0, force=Force.REQUIREMENT)])  # finished: nothing to change
    assert gone.unsatisfied and "not waiting or running" in gone.reason
