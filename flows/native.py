"""Native runs: realize N roots of a workflow on an engine, record the trace, return results.

`run_native(...)` builds the harness (virtual clock + lockstep gate + simulated pool + dispatcher
+ ledger + the binding's content model), then, inside one parent flow run for the whole run
(`maserve-run`, named by the trace id), starts one Prefect flow run per root — `maserve-root`
with `MAServeTaskRunner` — each on its own thread counted by the gate. Each root's flow run is a
subflow of the parent, linked the way Prefect links subflows (a tracking task run in the parent,
the root's `parent_task_run_id`), named `WORKFLOW/ROOT · INSTANCE` (e.g. `fork_join/r0003 ·
q17`) and tagged `workflow:…`, `binding:…`, `engine:…`, `trace:…` (plus `suite:…` when a
benchmark suite's flow runs it): what the Prefect UI lists and filters by. Roots arrive at the start
(after the pool has loaded) unless an inter-arrival rate is given. Every root's final artifact is
evaluated by the binding; on the simulator answers are synthetic text, so quality is reported but
flagged as not meaningful.

Cancelling (`cancel=` event, set by `maserve run`'s Ctrl-C handler): the main thread polls it
while the roots run; once set, no further root arrives, the harness is cancelled (no further op
starts), the engine is closed (in-flight calls end) and the roots get `CANCEL_GRACE_S` to unwind
before the run returns what was recorded. Root threads are daemons, so one stuck in a tool does
not hold the process.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping, Sequence
from contextvars import copy_context
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
from maserve_prefect.flows.compose import run_workload
from maserve_prefect.flows.env import RootEnv, resolve
from maserve_prefect.flows.workflows import Workflow, get_workflow
from prefect import Task, flow, tags
from prefect.context import FlowRunContext, SyncClientContext, TagsContext
from prefect.exceptions import CancelledRun
from prefect.settings import PREFECT_FLOWS_HEARTBEAT_FREQUENCY, temporary_settings

from maserve_prefect.clock.kernel import Kernel
from maserve_prefect.dispatch.dispatcher import Dispatcher
from maserve_prefect.engines.poolfile import PoolFile, build_sim_pool, default_pool_file
from maserve_prefect.engines.sim.pool.sim_pool import SimPool
from maserve_prefect.engines.target import EngineTarget, parse_engine
from maserve_prefect.errors import ConfigError, MaserveError, UnsupportedError
from maserve_prefect.pool.dispatch import needs_pool, sim_pool_dispatcher
from maserve_prefect.protocol.engine import Replica
from maserve_prefect.spec.binding import Quality, TaskBinding
from maserve_prefect.spec.io import spec_to_data
from maserve_prefect.taskrunner.harness import Harness, activate, get_harness
from maserve_prefect.taskrunner.lockstep import Gate, VirtualGate
from maserve_prefect.taskrunner.native import NativeRun, RootResult, raised_at
from maserve_prefect.taskrunner.oprun import scope
from maserve_prefect.taskrunner.runner import MAServeTaskRunner, mark_participant
from maserve_prefect.taskrunner.wallgate import WallGate
from maserve_prefect.trace.ledger import Ledger
from maserve_prefect.trace.model import Manifest, OpRecord, Trace

if TYPE_CHECKING:
    from maserve_prefect.engines.openai.fleet import FleetOptions


@dataclass(slots=True)
class _RunConfig:
    workflow: Workflow
    binding: TaskBinding
    deployments: Mapping[str, str]


_CONFIGS: dict[str, _RunConfig] = {}
_LAUNCHES: dict[str, Callable[[], None]] = {}
"""The body of each run's parent flow (`maserve_run`), by harness key: the flow's parameters
reach the API, so what it runs is looked up here rather than passed."""

# Seconds a cancelled run waits for its roots to end (an op in a tool cannot be interrupted).
CANCEL_GRACE_S = 2.0
# Seconds between checks of the cancel event while the roots run.
JOIN_POLL_S = 0.1

NativeReplicaFactory = Callable[
    [Callable[[], float], Callable[[Callable[[], None]], None], Sequence[str]],
    tuple[Sequence[Replica], Callable[[], None]],
]
"""Builds a real engine's replicas for a native run: given the run's clock (`now`), a `deliver`
that runs engine callbacks under the gate's lock, and the deployment names; returns the replicas
and a function that closes them."""


def _fleet_dispatcher(
    wall: WallGate,
    pool_file: PoolFile,
    deployments: Sequence[str],
    plan: str,
    options: FleetOptions | None,
) -> tuple[Dispatcher, Callable[[], None]]:
    """A dispatcher over the pool file's endpoints, the fleet its failover; and the closer."""
    from maserve_prefect.engines.openai.fleet_open import open_fleet

    def deliver(fn: Callable[[], None]) -> None:
        wall.defer(None, fn)

    fleet = open_fleet(pool_file, deployments, now=wall.now, deliver=deliver, options=options)
    dispatcher = Dispatcher(fleet.replicas, wall.now, plan, failover=fleet)
    fleet.watch(dispatcher.on_lifecycle_done)  # called through `deliver`, under the gate lock
    return dispatcher, fleet.close


def _openai_factory(target: EngineTarget) -> NativeReplicaFactory:
    from maserve_prefect.engines.openai.wall import open_openai_replicas

    def factory(
        now: Callable[[], float],
        deliver: Callable[[Callable[[], None]], None],
        deployments: Sequence[str],
    ) -> tuple[Sequence[Replica], Callable[[], None]]:
        return open_openai_replicas(target, deployments, now=now, deliver=deliver)

    return factory


@flow(
    name="maserve-root",
    task_runner=MAServeTaskRunner(max_workers=8),  # type: ignore[arg-type]
    persist_result=False,
    log_prints=False,
    validate_parameters=False,
)
def root_flow(root_id: str, instance_id: str, run_key: str) -> dict[str, Any]:
    """Realize one root: run the workflow's composition for one binding instance."""
    cfg = _CONFIGS.get(run_key)
    if cfg is None:  # the run ended (cancelled) before this root's flow started
        raise CancelledRun(f"root {root_id}: the run {run_key} was cancelled before it started")
    ctx = FlowRunContext.get()
    if ctx is not None and ctx.flow_run is not None:
        get_harness(run_key).add_flow_run(str(ctx.flow_run.id))
    instance = cfg.binding.instance(instance_id)
    with scope(root_id=root_id, workflow=cfg.workflow.name, stage_id="main"):
        env = RootEnv(
            root_id=root_id,
            workflow=cfg.workflow.name,
            spec=cfg.workflow.spec,
            binding=cfg.binding,
            instance=instance,
            deployments=cfg.deployments,
        )
        for name, value in instance.inputs.items():
            env.artifacts.setdefault(name, _input_artifact(name, value))
        run_workload(env)
        final = env.artifacts[cfg.workflow.final_artifact()]
        answer = resolve(final)
        if answer.producer:  # the answer's op ends the root's latency; stragglers may run on
            get_harness(run_key).mark_final(root_id, answer.producer)
    quality = cfg.binding.evaluate(instance, answer.text)
    return {"root_id": root_id, "answer": answer.digest, "quality": quality}


# The task run a parent flow run holds for each root subflow (Prefect's own subflow tracking).
_ROOT_TRACKER: Task[..., Any] = Task(name="maserve-root", fn=root_flow.fn)
_ROOT_TRACKER._is_subflow_tracking_task = True  # type: ignore[attr-defined]


@flow(
    name="maserve-run",
    flow_run_name="{name}",
    persist_result=False,
    log_prints=False,
    validate_parameters=False,
)
def maserve_run(
    name: str, workflow: str, binding: str, engine: str, users: int, seed: int, run_key: str
) -> None:
    """The parent flow run of one native run: its roots' flow runs are its subflows."""
    _LAUNCHES[run_key]()


def root_run_name(workflow: str, root_id: str, instance_id: str) -> str:
    """A root's flow-run name in Prefect: workflow, root and binding instance.

    Examples:
        >>> root_run_name("fork_join", "r0003", "q17")
        'fork_join/r0003 · q17'
    """
    return f"{workflow}/{root_id} · {instance_id}"


def run_tags(manifest: Manifest, workflow: str, engine_kind: str) -> tuple[str, ...]:
    """The Prefect tags of a native run's flow runs: workflow, binding, engine kind (not its
    URL) and trace id.

    Examples:
        >>> m = Manifest(trace_id="t1", binding_ids=("research",), mode="native")
        >>> run_tags(m, "fork_join", "sim")
        ('workflow:fork_join', 'binding:research', 'engine:sim', 'trace:t1')
    """
    found = [f"workflow:{workflow}", *(f"binding:{b}" for b in manifest.binding_ids)]
    return (*found, f"engine:{engine_kind}", f"trace:{manifest.trace_id}")


def _start_root(root_id: str, instance_id: str, run_key: str) -> dict[str, Any]:
    """Run one root's flow as a named subflow of the run's parent flow run.

    Prefect links a subflow to its parent through a tracking task run in the parent; its own
    subflow call numbers those task runs from a counter in the parent's context that root
    threads would share unguarded (two roots could get one tracking task run, and the second
    would reuse the first's flow run), so the tracking task run is created here with the root id
    as its key, then the root's flow run, and the flow is run on it.
    """
    from prefect.flow_engine import run_flow
    from prefect.states import Pending

    cfg = _CONFIGS.get(run_key)
    workflow = cfg.workflow.name if cfg is not None else "maserve"
    name = root_run_name(workflow, root_id, instance_id)
    params = {"root_id": root_id, "instance_id": instance_id, "run_key": run_key}
    parent = FlowRunContext.get()
    current = TagsContext.get().current_tags
    with SyncClientContext.get_or_create() as client_ctx:
        client = client_ctx.client
        tracker_id = None
        if parent is not None and parent.flow_run is not None:
            tracker = client.create_task_run(
                task=_ROOT_TRACKER,
                flow_run_id=parent.flow_run.id,
                dynamic_key=root_id,
                name=name,
                extra_tags=current,
                state=Pending(),
                task_inputs={},
            )
            tracker_id = tracker.id
        flow_run = client.create_flow_run(
            flow=root_flow,
            name=name,
            parameters=params,
            tags=current,
            parent_task_run_id=tracker_id,
            state=Pending(),
        )
        out: dict[str, Any] = run_flow(  # type: ignore[assignment]
            root_flow, flow_run=flow_run, parameters=params, return_type="result"
        )
    return out


def _input_artifact(name: str, value: Any) -> Any:
    from maserve_prefect.tasks import Artifact

    if isinstance(value, Mapping):
        text = "\n".join(
            f"{k}: {v}" for k, v in sorted(value.items()) if isinstance(v, str | int | float)
        )
        fields = {k: v for k, v in value.items() if isinstance(v, str | int | float | bool)}
        # A list of texts (a document's chunks) becomes fields `chunks_1`, `chunks_2`, ...: a
        # stage selects one with `delivery: selected`; the artifact's text leaves them out.
        for k, v in value.items():
            if isinstance(v, list | tuple) and all(isinstance(x, str) for x in v):
                fields.update({f"{k}_{i}": x for i, x in enumerate(v, 1)})
        return Artifact(name, text, fields)
    return Artifact(name, str(value))


def run_native(
    workflow: str | Workflow,
    binding: str | TaskBinding | None = None,
    *,
    users: int = 1,
    seed: int = 0,
    pool: PoolFile | None = None,
    ledger: Ledger | None = None,
    arrival_rate: float | None = None,
    trace_id: str | None = None,
    engine: str | EngineTarget = "sim",
    content_source: str = "binding",
    replicas_factory: NativeReplicaFactory | None = None,
    plan: str = "fcfs",
    pool_start: str = "warm",
    cancel: threading.Event | None = None,
    cancel_grace_s: float = CANCEL_GRACE_S,
    fleet_options: FleetOptions | None = None,
) -> NativeRun:
    """Realize `users` roots of `workflow` on an engine (see the module docstring).

    Args:
        engine: "sim" (virtual time, the default) or a real engine (`openai:URL`, wall time), or
            "fleet": the endpoints `pool` lists per deployment (`replicas:`), placed by `plan`
            (e.g. "least-outstanding", "prefix", "session"); an endpoint that stops answering
            is marked dead, its ops are placed again elsewhere and it is probed back in
            (`engines.openai.fleet`).
        content_source: on a real engine, "binding" locks output lengths and template decisions
            to the binding's seeded draws (reproducible work, text from the model); "engine"
            generates freely.
        replicas_factory: builds a real engine's replicas: `(now, deliver, deployments) ->
            (replicas, close)` (default: OpenAI-compatible replicas on the target server).
        plan: the dispatcher's plan. A pool plan ("joint", "pool-fcfs", "parrot", "kairos")
            also decides the simulated pool's lifecycle (loads, reclaims, leases) from the
            near-ready and ready ops the task runner reports (`pool.control`).
        pool_start: "warm" (the pool file's placements are loaded before roots arrive) or
            "cold" (no replica; a pool plan loads what the work needs).
        cancel: set (e.g. by a Ctrl-C handler) to cancel the run: no further root or op
            starts (each op is recorded skipped), the engine is closed so in-flight calls end,
            and the run returns with `cancelled=True` once its roots have ended or
            `cancel_grace_s` has passed, whichever is first (roots still running then are left
            to the caller, who exits the process).
        fleet_options: how a fleet probes and heartbeats its endpoints (default
            `FleetOptions()`).

    Raises:
        ConfigError: a cold start under a plain plan (nothing would ever load).
        UnsupportedError: a pool plan or cold start on a real engine (not wired yet).
    """
    from maserve_prefect.bindings import content_model_for, get_binding

    wf = get_workflow(workflow) if isinstance(workflow, str) else workflow
    b = (
        get_binding(binding or wf.default_binding)
        if not isinstance(binding, TaskBinding)
        else binding
    )
    pool_file = pool or default_pool_file()
    target = parse_engine(engine)
    names = [p.deployment for s in wf.spec.stages for p in s.participants]
    names += [d for s in wf.spec.stages for d in getattr(s.control, "worker_deployments", ())]
    deployments = {name: pool_file.resolve(name) for name in names}
    sim_pool: SimPool | None = None
    close_engine: Callable[[], None] = lambda: None  # noqa: E731
    gate: Gate
    pool_plan = needs_pool(plan)
    if pool_start == "cold" and not pool_plan:
        raise ConfigError(
            f"pool_start='cold' under plan {plan!r}: a plain plan never loads a replica; use a "
            "pool plan (joint, pool-fcfs, parrot, kairos) or a warm start"
        )
    if target.is_sim and replicas_factory is None:
        kernel = Kernel()
        if pool_plan:
            names = sorted(set(deployments.values()))
            sim_pool, dispatcher = sim_pool_dispatcher(
                pool_file, kernel, plan, start=pool_start, deployments=names
            )
        else:
            sim_pool = build_sim_pool(pool_file, kernel)
            dispatcher = Dispatcher(sim_pool.replicas, kernel.now, plan)
        gate = VirtualGate(kernel)
    elif pool_plan or pool_start != "warm":
        raise UnsupportedError(
            f"plan {plan!r} / pool_start {pool_start!r} on {target}: pool plans drive the "
            "simulator's pool only for now; run real engines with plan='fcfs' and a warm pool"
        )
    elif target.is_fleet and replicas_factory is None:
        wall = WallGate()
        gate = wall
        dispatcher, close_engine = _fleet_dispatcher(
            wall, pool_file, sorted(set(deployments.values())), plan, fleet_options
        )
    else:
        wall = WallGate()
        gate = wall
        factory = replicas_factory or _openai_factory(target)
        replicas, close_engine = factory(
            wall.now, lambda fn: wall.defer(None, fn), sorted(set(deployments.values()))
        )
        dispatcher = Dispatcher(lambda: replicas, wall.now, plan)
    start_s = gate.now()
    manifest = Manifest(
        trace_id=trace_id or f"{wf.name}-{b.binding_id}-s{seed}-u{users}",
        workload_spec=spec_to_data(wf.spec),
        binding_ids=(b.binding_id,),
        engine=str(target),
        mode="native",
        seeds={"seed": seed},
        notes={
            "pool": pool_file.model_dump(mode="json", exclude={"source"}),
            **({"plan": plan, "pool_start": pool_start} if pool_plan else {}),
            "content_source": "binding" if target.is_sim else content_source,
        },
    )
    harness = Harness(
        gate,
        manifest,
        dispatcher=dispatcher,
        ledger=ledger,
        content=content_model_for(b, seed),
        engine_kind="sim" if target.is_sim else target.kind,
        content_source=content_source,
        output_budgets={
            d.name: d.max_tokens for d in pool_file.deployments if d.max_tokens is not None
        },
    )
    key = harness.key
    _CONFIGS[key] = _RunConfig(wf, b, deployments)
    ids = list(b.info.instance_ids)
    rng = np.random.default_rng(seed)
    order = [ids[i] for i in rng.permutation(len(ids))]
    gaps = rng.exponential(1.0 / arrival_rate, users) if arrival_rate else np.zeros(users)
    arrivals = start_s + np.cumsum(gaps) - (gaps[0] if users else 0.0)
    results: list[RootResult | None] = [None] * users
    lock = threading.Lock()
    # Short root flows: no heartbeat thread (it adds up to a second per flow run at exit).
    quiet = temporary_settings(updates={PREFECT_FLOWS_HEARTBEAT_FREQUENCY: None})
    threads: list[threading.Thread] = []
    stop = cancel if cancel is not None else threading.Event()

    def launch() -> None:
        parent = FlowRunContext.get()
        if parent is not None and parent.flow_run is not None:
            harness.parent_flow_run_id = str(parent.flow_run.id)
        with gate, activate(harness):
            gate.admit()
            for i in range(users):
                root_id = f"r{i:04d}"
                instance_id = order[i % len(order)]
                delay = float(arrivals[i]) - gate.now()
                if delay > 0:
                    gate.sleep(delay, what=f"arrival of {root_id}")
                if stop.is_set():
                    break
                gate.admit()
                th = threading.Thread(
                    target=copy_context().run,
                    args=(_root_body, harness, key, root_id, instance_id, results, i, lock),
                    name=f"maserve-root-{root_id}",
                    daemon=True,  # a cancelled run does not wait for a root stuck in a tool
                )
                threads.append(th)
                th.start()
            gate.leave()
            _join_roots(threads, stop, harness, close_engine, cancel_grace_s)

    _LAUNCHES[key] = launch
    try:
        with quiet, tags(*run_tags(manifest, wf.name, harness.engine_kind)):
            maserve_run(manifest.trace_id, wf.name, b.binding_id, str(target), users, seed, key)
    finally:
        _CONFIGS.pop(key, None)
        _LAUNCHES.pop(key, None)
        close_engine()
    trace = Trace(
        manifest=manifest,
        # Records arrive in thread order; sort them so the same seed gives the same trace.
        roots=sorted(harness.book.roots.values(), key=lambda r: r.root_id),
        stages=sorted(harness.book.stages.values(), key=lambda s: (s.root_id, s.stage_id)),
        sessions=sorted(harness.book.sessions.values(), key=lambda s: (s.root_id, s.session_id)),
        ops=sorted(harness.book.ops, key=_op_key),
    )
    return NativeRun(
        trace=trace,
        roots=[r for r in results if r is not None],
        pool=sim_pool,
        harness=harness,
        flow_run_ids=list(harness.flow_run_ids),
        cancelled=harness.cancelled,
        parent_flow_run_id=harness.parent_flow_run_id,
    )


def _join_roots(
    threads: Sequence[threading.Thread],
    stop: threading.Event,
    harness: Harness,
    close_engine: Callable[[], None],
    grace_s: float,
) -> None:
    """Wait for every root; once `stop` is set, cancel the run and wait at most `grace_s`."""
    for th in threads:
        while th.is_alive() and not stop.is_set():
            th.join(JOIN_POLL_S)
    if not stop.is_set():
        return
    harness.cancel()
    try:
        close_engine()  # in-flight engine calls end now (their ops are recorded incomplete)
    except MaserveError:
        pass  # a callback's earlier error; the run is being cancelled anyway
    deadline = time.monotonic() + grace_s
    for th in threads:
        th.join(max(0.0, deadline - time.monotonic()))


def _op_key(op: OpRecord) -> tuple[str, str, int]:
    return (op.root_id, op.op_id, op.attempt)


def _root_body(
    harness: Harness,
    key: str,
    root_id: str,
    instance_id: str,
    results: list[RootResult | None],
    i: int,
    lock: threading.Lock,
) -> None:
    mark_participant(True)
    arrival = harness.gate.now()
    quality: Quality | None = None
    error: str | None = None
    where: str | None = None
    try:
        out = _start_root(root_id, instance_id, key)
        quality = out["quality"]
    except Exception as exc:  # a failed root is reported, the run goes on
        error = f"{type(exc).__name__}: {exc}"
        where = raised_at(exc)
    finally:
        finish = harness.gate.now()
        with lock:
            results[i] = RootResult(
                root_id, instance_id, arrival, finish, quality, error, raised_at=where
            )
        mark_participant(False)
        harness.gate.leave()
