"""Properties of the one dispatcher and its plans, on random inputs (hypothesis).

- Nothing is released twice: whatever the plan picks at each event, every unit made ready reaches
  an engine at most once, its `on_submitted` fires at most once, and its `on_done` exactly once
  (completed, rejected by the engine, or failed because its deployment's replicas are dead).
- A fixed-work DAG replay on the simulator never submits an op before its required predecessors
  completed (read from the realized times of random small DAG traces).
- Plans are pure functions of the snapshot: planning twice gives equal `Decisions`, planning does
  not change the snapshot, and an equal snapshot gives equal decisions (the FCFS plan on plain
  snapshots; the pool plans `joint`, `pool-fcfs`, `parrot`, `kairos` on pool snapshots).
"""

from __future__ import annotations

import copy
import pickle
import random
from collections import Counter
from typing import NamedTuple

from dispatch_factories import (
    CountingReplica,
    make_plain_snapshot,
    make_request,
    make_sim_replicas,
    make_unit,
    make_view,
    stopped,
)
from hypothesis import given, settings
from hypothesis import strategies as st
from pool_factories import pool_scenarios
from replay_factories import OpSpec, make_dag_trace

from maserve_prefect.clock.kernel import Kernel
from maserve_prefect.dispatch.dispatcher import Dispatcher
from maserve_prefect.dispatch.fcfs import FcfsPlan
from maserve_prefect.dispatch.plans import get_plan
from maserve_prefect.dispatch.snapshot import Decisions, Snapshot, Submit, Unit
from maserve_prefect.pool.snapshot import PoolSnapshot
from maserve_prefect.protocol.outcomes import Outcome, OutcomeStatus
from maserve_prefect.protocol.state import Lifecycle
from maserve_prefect.replay.driver import replay_trace
from maserve_prefect.trace.model import EdgeKind, OpKind

# -- nothing is released twice -----------------------------------------------------------------

LIVE = ("small", "big")
GONE = "gone"  # a deployment whose only replica is stopped


class RandomSubsetPlan:
    """A test double that submits a random subset of the ready units to random accepting replicas
    of their deployment, always including the oldest unit that has one (so every event makes
    progress): the dispatcher's books must hold whatever a plan picks."""

    name = "random-subset"

    def __init__(self, seed: int) -> None:
        self.rng = random.Random(seed)

    def plan(self, snapshot: Snapshot) -> Decisions:
        accepting: dict[str, list[str]] = {}
        for view in snapshot.replicas:
            if view.accepting:
                accepting.setdefault(view.deployment, []).append(view.name)
        submits, first = [], True
        for unit in snapshot.ready:
            names = accepting.get(unit.deployment)
            if names and (first or self.rng.random() < 0.5):
                submits.append(Submit(unit.unit_id, self.rng.choice(names)))
                first = False
        return Decisions(submits=tuple(submits))


class UnitCase(NamedTuple):
    deployment: str
    num_prompt_tokens: int
    max_tokens: int
    ready_s: float  # when it is made ready, unless it follows another unit
    after: int | None  # made ready when this earlier unit is done (near-ready once it is sent)
    near_ready_first: bool  # announced near-ready shortly before it is ready


class DispatchCase(NamedTuple):
    units: list[UnitCase]
    num_live: dict[str, int]
    rejected: frozenset[str]
    plan_seed: int | None  # None: the FCFS plan


@st.composite
def dispatch_cases(draw: st.DrawFn) -> DispatchCase:
    n = draw(st.integers(1, 10))
    units = []
    for i in range(n):
        after = draw(st.one_of(st.none(), st.integers(0, i - 1))) if i else None
        units.append(
            UnitCase(
                draw(st.sampled_from([*LIVE, GONE])),
                draw(st.integers(1, 200)),
                draw(st.integers(1, 12)),
                draw(st.floats(0.0, 2.0)),
                after,
                draw(st.booleans()),
            )
        )
    rejected = draw(st.sets(st.sampled_from([f"u{i}" for i in range(n)]), max_size=2))
    num_live = {"small": draw(st.integers(1, 3)), "big": draw(st.integers(1, 2))}
    seed = draw(st.one_of(st.none(), st.integers(0, 2**16)))
    return DispatchCase(units, num_live, frozenset(rejected), seed)


@settings(max_examples=100, deadline=None)
@given(dispatch_cases())
def test_every_unit_is_submitted_at_most_once_and_done_exactly_once(case: DispatchCase) -> None:
    k = Kernel()
    replicas = [
        CountingReplica(r, case.rejected)
        for dep in LIVE
        for r in make_sim_replicas(k, [f"{dep}-{j}" for j in range(case.num_live[dep])], dep)
    ]
    replicas += [CountingReplica(stopped(r)) for r in make_sim_replicas(k, [f"{GONE}-0"], GONE)]
    plan = FcfsPlan() if case.plan_seed is None else RandomSubsetPlan(case.plan_seed)
    d = Dispatcher(lambda: replicas, k.now, plan)
    units = {f"u{i}": u for i, u in enumerate(case.units)}
    followers: dict[str, list[str]] = {uid: [] for uid in units}
    for i, u in enumerate(case.units):
        if u.after is not None:
            followers[f"u{u.after}"].append(f"u{i}")
    done: dict[str, list[Outcome]] = {uid: [] for uid in units}
    sent: dict[str, list[str]] = {uid: [] for uid in units}

    def unit_of(uid: str, ready_s: float) -> Unit:
        u = units[uid]
        return make_unit(
            uid,
            deployment=u.deployment,
            num_prompt_tokens=u.num_prompt_tokens,
            max_tokens=u.max_tokens,
            ready_s=ready_s,
        )

    def submitted(uid: str, replica: str) -> None:
        sent[uid].append(replica)
        for f in followers[uid]:
            d.on_near_ready(unit_of(f, k.now()), (uid,))

    def finished(uid: str, outcome: Outcome) -> None:
        done[uid].append(outcome)
        for f in followers[uid]:
            release(f)

    def release(uid: str) -> None:
        unit = unit_of(uid, k.now())
        d.on_ready(
            unit,
            make_request(unit),
            on_done=lambda o: finished(uid, o),
            on_submitted=lambda _t, name: submitted(uid, name),
        )

    k.call_at(0.0, lambda: d.on_arrival("r"))
    for uid, u in units.items():
        if u.after is not None:
            continue
        if u.near_ready_first:
            k.call_at(u.ready_s / 2, lambda uid=uid: d.on_near_ready(unit_of(uid, 0.0)))
        k.call_at(u.ready_s, lambda uid=uid: release(uid))
    k.run()

    handed = Counter(rid for r in replicas for rid in r.submitted)
    assert max(handed.values(), default=0) <= 1, handed
    for uid, u in units.items():
        assert len(done[uid]) == 1, (uid, done[uid])
        (outcome,) = done[uid]
        if u.deployment == GONE:
            assert handed[uid] == 0 and sent[uid] == []
            assert outcome.status is OutcomeStatus.FAILED and "no live replica" in outcome.error
            continue
        assert handed[uid] == 1 and len(sent[uid]) == 1
        (where,) = [r for r in replicas if uid in r.submitted]
        assert sent[uid] == [where.name] and where.deployment == u.deployment
        if uid in case.rejected:
            assert (
                outcome.status is OutcomeStatus.REJECTED and "the test rejects it" in outcome.error
            )
        else:
            assert outcome.status is OutcomeStatus.COMPLETED
            assert outcome.num_output_tokens == u.max_tokens
    accepted = [uid for uid in units if handed[uid] and uid not in case.rejected]
    never_ran = (OutcomeStatus.FAILED, OutcomeStatus.REJECTED)
    failed = [uid for uid in units if done[uid][0].status in never_ran]
    assert (d.stats.num_submitted, d.stats.num_rejected) == (len(accepted), len(failed))
    snap = d.snapshot()
    assert snap.ready == () and snap.near_ready == ()


# -- a DAG replay never submits an op before its required predecessors completed ----------------


@st.composite
def dag_roots(draw: st.DrawFn) -> dict[str, list[OpSpec]]:
    roots: dict[str, list[OpSpec]] = {}
    for r in range(draw(st.integers(1, 3))):
        specs: list[OpSpec] = []
        for i in range(draw(st.integers(1, 5))):
            preds = draw(st.lists(st.integers(0, i - 1), unique=True, max_size=3)) if i else []
            deps = tuple(
                (f"o{p}", draw(st.sampled_from(list(EdgeKind))), draw(st.booleans())) for p in preds
            )
            if draw(st.booleans()):
                deployment = draw(st.sampled_from(["main", "small", "tiny"]))
                tokens = (draw(st.integers(1, 400)), draw(st.integers(1, 16)))
                specs.append(OpSpec(f"o{i}", deps, deployment, tokens))
            else:
                specs.append(OpSpec(f"o{i}", deps, tool_s=draw(st.floats(0.0, 2.0))))
        roots[f"r{r}"] = specs
    return roots


@settings(max_examples=30, deadline=None)
@given(dag_roots())
def test_a_dag_replay_submits_no_op_before_its_required_predecessors_completed(
    roots: dict[str, list[OpSpec]],
) -> None:
    trace = make_dag_trace(roots)
    run = replay_trace(trace, None, rule="dag", lock="length")
    assert not run.non_causal and run.num_early_releases == 0
    ops = run.trace.op_index()
    assert ops.keys() == trace.op_index().keys()
    for op_id, recorded in trace.op_index().items():
        op, t = ops[op_id], ops[op_id].times
        assert t.ready_s is not None and t.completed_s is not None, op_id
        if op.kind is OpKind.MODEL:
            assert t.submitted_s is not None and t.first_token_s is not None
            assert t.ready_s <= t.submitted_s <= t.first_token_s <= t.completed_s
            assert op.num_output_tokens == recorded.num_output_tokens
            released = t.submitted_s
        else:
            assert t.ready_s <= t.completed_s
            released = t.ready_s
        for dep in recorded.deps:
            pred = ops[dep.op_id].times.completed_s
            if dep.required:
                assert pred is not None and pred <= released, (op_id, dep.op_id)


# -- plans are pure functions of the snapshot --------------------------------------------------

LIFECYCLES = list(Lifecycle)


@st.composite
def plain_snapshots(draw: st.DrawFn) -> Snapshot:
    deployments = ["m", "n", "o"]
    views = [
        make_view(
            f"x{i}",
            draw(st.integers(0, 5)),
            deployment=draw(st.sampled_from(deployments)),
            lifecycle=draw(st.sampled_from(LIFECYCLES)),
        )
        for i in range(draw(st.integers(0, 5)))
    ]
    units = sorted(
        (
            make_unit(
                f"u{i}",
                deployment=draw(st.sampled_from(deployments)),
                ready_s=draw(st.floats(0.0, 5.0)),
                priority=draw(st.integers(0, 2)),
            )
            for i in range(draw(st.integers(0, 8)))
        ),
        key=lambda u: (u.ready_s, u.unit_id),
    )
    near = [make_unit(f"n{i}", deployment="m") for i in range(draw(st.integers(0, 2)))]
    return make_plain_snapshot(units, views, near_ready=near, now_s=draw(st.floats(0.0, 5.0)))


def check_pure(name: str, snap: Snapshot) -> Decisions:
    """The plan `name` gives equal decisions twice, leaves the snapshot as it was, and decides
    the same on an equal copy with a fresh plan instance."""
    before = pickle.dumps(snap)
    twin = copy.deepcopy(snap)
    plan = get_plan(name)
    first = plan.plan(snap)
    assert plan.plan(snap) == first
    assert pickle.dumps(snap) == before
    assert get_plan(name).plan(twin) == first
    return first


@settings(max_examples=200, deadline=None)
@given(plain_snapshots())
def test_the_fcfs_plan_is_a_pure_function_of_a_plain_snapshot(snap: Snapshot) -> None:
    d = check_pure("fcfs", snap)
    ready = {u.unit_id: u for u in snap.ready}
    views = {v.name: v for v in snap.replicas}
    placed = [s.unit_id for s in d.submits]
    assert len(placed) == len(set(placed)) and set(placed) <= ready.keys()
    for s in d.submits:
        assert views[s.replica].accepting
        assert views[s.replica].deployment == ready[s.unit_id].deployment


@settings(max_examples=100, deadline=None)
@given(pool_scenarios())
def test_pool_plans_are_pure_functions_of_a_pool_snapshot(case: tuple[PoolSnapshot, str]) -> None:
    snap, name = case
    check_pure(name, snap)
