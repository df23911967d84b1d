"""The Prefect arm: workflows run natively through Prefect and MAServeTaskRunner under the joint
plan on a cold heterogeneous simulated pool make the same decisions as the replay arm
(`run_pool` over the recorded trace).

Both arms get the same information: the runner reports a model op (deployment, output limit,
model predecessors) once its predecessors have been released and its real request when it is
ready; the replay arm uses `ExecOptions(reveal="released")` — the same rule — and the trace's
token-locked requests (so prefix caching sees what the native run saw). Remaining difference:
`run_pool` has no non-model ops, so a tool's recorded duration collapses into a zero-time edge;
with tools in the workflow the decisions still match but later times shift (code_repair below).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from maserve_prefect.flows import native
from maserve_prefect.flows.workflows import Workflow as FlowWorkflow
from maserve_prefect.flows.workflows import get_workflow

from maserve_prefect.clock.kernel import Kernel
from maserve_prefect.dispatch.dispatcher import Dispatcher
from maserve_prefect.engines.poolfile import Placement, PoolFile, default_pool_file
from maserve_prefect.engines.sim.pool.sim_pool import SimPool
from maserve_prefect.pool.control import PoolController
from maserve_prefect.pool.dispatch import sim_pool_dispatcher
from maserve_prefect.pool.executor import run_pool
from maserve_prefect.pool.inputs import ExecOptions, RootDag
from maserve_prefect.pool.results import PoolRunResult
from maserve_prefect.pool.state import RooflineCostModel
from maserve_prefect.pool.window import WorkUnit
from maserve_prefect.replay.work import InputLock, model_request
from maserve_prefect.trace.model import EdgeKind, OpKind, OpRecord, Trace

pytestmark = pytest.mark.usefixtures("prefect_api")

NativeArm = Callable[[FlowWorkflow, tuple[str, ...]], tuple[native.NativeRun, PoolController]]


@pytest.fixture
def native_arm(monkeypatch: pytest.MonkeyPatch) -> Iterator[NativeArm]:
    """`run_native` on a cold pool under the joint plan.

    Stands in for the native-run option `run_native(..., plan="joint", pool_start="cold")`
    (flows/native.py builds the pool with `sim_pool_dispatcher` when a pool plan is asked for).
    """
    made: dict[str, Dispatcher] = {}

    def build(pool_file: PoolFile, kernel: Kernel) -> SimPool:
        pool, made["d"] = sim_pool_dispatcher(pool_file, kernel, "joint", start="cold")
        return pool

    monkeypatch.setattr(native, "build_sim_pool", build)
    monkeypatch.setattr(native, "Dispatcher", lambda *a, **k: made["d"])

    def run(wf: FlowWorkflow, devices: tuple[str, ...]) -> tuple[native.NativeRun, PoolController]:
        base = default_pool_file()
        pf = PoolFile(
            devices=devices,
            deployments=base.deployments,
            placements=(Placement(deployment="tiny", device=devices[0]),),  # unused: cold start
            default="main",
        )
        out = native.run_native(wf, users=3, seed=0, pool=pf)
        assert [r.error for r in out.roots] == [None] * 3
        pool = made["d"].books
        assert isinstance(pool, PoolController)
        return out, pool

    yield run


def model_workflows(trace: Trace) -> list[RootDag]:
    """The trace's model ops as pool units; edges through non-model ops collapse into
    model-to-model edges (state edges, added while ops ran, are not runner edges)."""
    ops = {o.op_id: o for o in trace.ops}

    def model_preds(op: OpRecord) -> tuple[str, ...]:
        found: set[str] = set()
        stack = [d.op_id for d in op.deps if d.kind is not EdgeKind.STATE]
        seen: set[str] = set()
        while stack:
            p = stack.pop()
            if p not in seen:
                seen.add(p)
                if ops[p].kind is OpKind.MODEL:
                    found.add(p)
                else:
                    stack.extend(d.op_id for d in ops[p].deps if d.kind is not EdgeKind.STATE)
        return tuple(sorted(found))

    model = [o for o in trace.ops if o.kind is OpKind.MODEL]
    preds = {o.op_id: model_preds(o) for o in model}
    succs = {o.op_id: tuple(sorted(u for u, ps in preds.items() if o.op_id in ps)) for o in model}
    return [
        RootDag(
            r.root_id,
            r.arrival_s,
            tuple(
                WorkUnit(
                    o.op_id,
                    o.root_id,
                    o.generation.deployment if o.generation else "",
                    o.num_input_tokens,
                    o.num_output_tokens,
                    preds[o.op_id],
                    succs[o.op_id],
                )
                for o in model
                if o.root_id == r.root_id
            ),
        )
        for r in trace.roots
    ]


def replay_arm(run: native.NativeRun, devices: tuple[str, ...]) -> PoolRunResult:
    model = [o for o in run.trace.ops if o.kind is OpKind.MODEL]
    requests = {
        o.op_id: model_request(o, o.generation.deployment, InputLock.TOKEN, run.harness.store)
        for o in model
        if o.generation is not None
    }
    return run_pool(
        model_workflows(run.trace),
        list(devices),
        "joint",
        deployments={d.name: d.to_deployment() for d in default_pool_file().deployments},
        costs=RooflineCostModel(),  # what sim_pool_dispatcher gives the native arm
        options=ExecOptions(reveal="released", requests=requests),
    )


def decisions(events: Any) -> list[tuple[object, ...]]:
    return [(e.action, e.replica, e.deployment, e.device, e.prefetch, e.units) for e in events]


def times(events: Any) -> list[float]:
    return [t for e in events for t in (e.start_s, e.end_s)]


def native_lifecycle(pool: PoolController) -> list[Any]:
    return sorted(pool.events, key=lambda e: (e.start_s, e.end_s, e.replica))


def with_workers(name: str, workers: tuple[str, ...]) -> FlowWorkflow:
    """`name` with its fork-join workers on other deployments."""
    wf = get_workflow(name)
    solve = wf.spec.stages[0]
    control = solve.control.model_copy(update={"worker_deployments": workers})
    stages = (solve.model_copy(update={"control": control}), *wf.spec.stages[1:])
    return dataclasses.replace(wf, spec=wf.spec.model_copy(update={"stages": stages}))


def test_math_ensemble_on_two_gpus_matches_the_replay_arm(native_arm: NativeArm) -> None:
    devices = ("A100-80GB:0", "L40S:0")
    run, pool = native_arm(get_workflow("math_ensemble"), devices)
    replay = replay_arm(run, devices)
    nat = native_lifecycle(pool)
    assert decisions(nat) == decisions(replay.lifecycle)
    assert any(e.action == "unload" for e in nat), "two GPUs cannot hold four deployments"
    assert pool.replica_of == {o.unit_id: o.replica for o in replay.ops}
    # no tools in this workflow: the very same run, to the virtual microsecond
    assert times(nat) == pytest.approx(times(replay.lifecycle), abs=1e-9)
    submitted = {o.op_id: o.times.submitted_s for o in run.trace.ops if o.kind is OpKind.MODEL}
    assert submitted == pytest.approx({o.unit_id: o.submitted_s for o in replay.ops}, abs=1e-9)


def test_the_runner_reports_a_writer_behind_a_vote_early_enough_to_prefetch(
    native_arm: NativeArm,
) -> None:
    """Workers on main / small / tiny, the writer alone on large: the runner reports each
    writer (through the vote transform) while the workers run, and the joint plan prefetches
    large onto the free GPU — in both arms alike."""
    devices = ("A100-40GB:0", "A100-40GB:1", "L40S:0")
    wf = with_workers("math_ensemble", ("main", "main", "main", "small", "tiny"))
    run, pool = native_arm(wf, devices)
    replay = replay_arm(run, devices)
    nat = native_lifecycle(pool)
    assert decisions(nat) == decisions(replay.lifecycle)
    assert pool.replica_of == {o.unit_id: o.replica for o in replay.ops}
    prefetch = [e for e in nat if e.prefetch]
    writers = {o.op_id for o in run.trace.ops if o.op_id.endswith("refine.writer/0")}
    assert len(prefetch) == 1 and prefetch[0].deployment == "large"
    assert set(prefetch[0].units) == writers
    ready = {o.op_id: o.times.ready_s for o in run.trace.ops}
    assert all(prefetch[0].start_s < ready[w] for w in writers)  # loading before any is ready
    for w in writers:  # known with the five workers as its model predecessors
        assert len(pool.units[w].preds) == 5


def test_with_a_tool_in_between_the_replay_sees_successors_earlier(native_arm: NativeArm) -> None:
    """code_repair runs tests (a tool with a recorded duration) between model calls. The replay
    arm folds the tool into an edge, so it reveals a diagnoser as soon as its coder is released,
    and the joint plan sees it near-ready in the very round its coder is submitted
    (`window.near_ready_after`) and prefetches its deployment; the native runner reports it
    only once the tool is released. The first decision is the same; then the replay
    prefetches what the native run loads on demand."""
    devices = ("H100:0", "A100-40GB:0")
    run, pool = native_arm(get_workflow("code_repair"), devices)
    replay = replay_arm(run, devices)
    nat = native_lifecycle(pool)
    assert decisions(nat)[:1] == decisions(replay.lifecycle)[:1]
    pre = [e for e in replay.lifecycle if e.prefetch]
    assert pre and all(u.endswith("diagnoser/0") for u in pre[0].units)
    assert not any(e.prefetch for e in nat)
