"""Request-level replay of a Semantic Trace onto a `SimPool` (the Arrival rule).

One idea: every model op becomes one length-locked `Request` (prompt tokens and prefix-block
hashes from the op, `max_tokens = min_tokens =` its recorded output tokens) submitted at its
recorded time — `times.submitted_s`, else `times.ready_s`, else its root's `arrival_s` — shifted
so the earliest op lands at `start_s` (default: the clock's now, e.g. once the replicas are
loaded). Each request is a ready unit of the one `Dispatcher` (`dispatch`) under a route
(`dispatch.routes`): by default `least-outstanding` — at once to the READY replica of the
deployment with the fewest outstanding requests, ties by name; `prefix` — to the replica holding
the longest cached prefix of its prompt within a load bound; `session` — sticky by the op's
session. Request ids are op ids, so the replicas' step records join back to the ops.

The result carries the trace's infinite-cache reuse bound (`replay.reuse_bound`) beside the
measured reuse: no pool, route or eviction can reuse more of the prompt tokens than one server
with an unbounded cache.

This is the Arrival rule, a non-causal reference arm: ops of one root are released at their
observed times whether or not their predecessors have finished here (dependency-aware fixed-work
replay is `replay.driver`, `maserve replay`); the result says how many roots have several model
ops, and the CLI prints that caveat. Non-model ops (tools, transforms, state) are not simulated
and are counted in `num_skipped_ops`. An op recorded with 0 output tokens is replayed with 1 (an
engine always samples one token) and counted in `num_padded_outputs`. A request the replica
refuses is reported `rejected` with the replica's reason.

The kernel is advanced in chunks of simulated time (`run(until=...)`), calling `progress` after
each chunk, so a CLI can draw a progress bar. While it runs, the objects alive at its start (the
trace, the pool) are frozen out of the cyclic garbage collector and young collections are rarer
(`_quiet_gc`): the step loop allocates many short-lived objects, and each collection would
otherwise walk the whole trace again; both settings are restored afterwards.

Examples:
    >>> from maserve_prefect.clock.kernel import Kernel
    >>> from maserve_prefect.engines.sim.pool.sim_pool import Deployment, SimPool
    >>> from maserve_prefect.trace.model import Manifest, OpKind, OpRecord, RootRecord, Trace
    >>> trace = Trace(manifest=Manifest(trace_id="t"), roots=[RootRecord(root_id="r", arrival_s=0)],
    ...               ops=[OpRecord(op_id="r/op0", root_id="r", kind=OpKind.MODEL,
    ...                             num_input_tokens=100, num_output_tokens=8)])
    >>> k = Kernel(); pool = SimPool(k, ["H100:0"]); dep = Deployment("q", "Qwen3-0.6B")
    >>> _ = pool.load(dep, "H100:0"); k.run()
    >>> res = replay_requests(trace, pool, "q")
    >>> [(r.op_id, r.status, r.num_output_tokens) for r in res.requests]
    [('r/op0', 'completed', 8)]
"""

from __future__ import annotations

import gc
import math
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import partial

from maserve_prefect.clock import URGENT
from maserve_prefect.dispatch.dispatcher import Dispatcher
from maserve_prefect.dispatch.plans import get_route
from maserve_prefect.dispatch.routes import DEFAULT_LOAD_BOUND
from maserve_prefect.dispatch.snapshot import Unit
from maserve_prefect.engines.sim.pool.sim_pool import SimPool
from maserve_prefect.engines.sim.stats import Summary, summarize, time_weighted_mean, window_max
from maserve_prefect.engines.sim.step.records import SERIES
from maserve_prefect.errors import ConfigError, SimulationError
from maserve_prefect.protocol.outcomes import Outcome, OutcomeStatus
from maserve_prefect.protocol.requests import Request
from maserve_prefect.replay.reuse_bound import ReuseBound, reuse_bound
from maserve_prefect.trace.model import OpKind, OpRecord, Trace

POLICIES = ("arrival",)
_KV = SERIES[0]


@dataclass(frozen=True, slots=True)
class RequestResult:
    """What happened to one op's request; latency fields are None unless it completed."""

    op_id: str
    root_id: str
    replica: str
    status: str  # completed | rejected | failed
    reason: str
    submit_s: float
    num_prompt_tokens: int
    num_output_tokens: int
    num_cached_tokens: int
    num_preemptions: int
    ttft_s: float | None
    tpot_s: float | None
    e2e_s: float | None


@dataclass(frozen=True, slots=True)
class ReplayProgress:
    """Where a replay stands: simulated seconds since its start, of the arrival span."""

    elapsed_s: float
    span_s: float
    num_done: int
    num_total: int


@dataclass(slots=True)
class ReplayResult:
    """Per-request results and the aggregates the CLI prints.

    Attributes:
        prefix_queries_tokens / prefix_hits_tokens: the deployment's replicas' prefix-cache
            counters over the replay (vLLM `prefix_cache_{queries,hits}_total` deltas).
        kv_usage_mean / kv_usage_max: time-weighted mean over the window (averaged over
            replicas) and the maximum of `vllm:kv_cache_usage_perc`.
        num_events: arrivals plus step records (a fast-forwarded decode run is one record).
        route: the dispatcher's route (`dispatch.routes`).
        bound: the trace's infinite-cache reuse bound (`replay.reuse_bound`), computed when
            first asked for (from `bound_prompts`, the model ops' prompts in arrival order, and
            the replicas' `kv_block_size`), so a replay that never reports it does not pay.
    """

    deployment: str
    start_s: float
    end_s: float
    requests: list[RequestResult]
    num_multi_op_roots: int = 0
    num_skipped_ops: int = 0
    num_padded_outputs: int = 0
    prefix_queries_tokens: int = 0
    prefix_hits_tokens: int = 0
    num_preemptions: int = 0
    kv_usage_mean: float = 0.0
    kv_usage_max: float = 0.0
    num_step_records: int = 0
    num_model_steps: int = 0
    notes: list[str] = field(default_factory=list)
    route: str = "least-outstanding"
    bound_prompts: list[tuple[tuple[int, ...], int, int]] = field(default_factory=list)
    kv_block_size: int = 16
    _bound: ReuseBound | None = field(default=None, repr=False, compare=False)

    @property
    def bound(self) -> ReuseBound:
        if self._bound is None:
            self._bound = reuse_bound(self.bound_prompts, self.kv_block_size)
        return self._bound

    @property
    def span_s(self) -> float:
        return self.end_s - self.start_s

    @property
    def num_events(self) -> int:
        return len(self.requests) + self.num_step_records

    @property
    def prefix_hit_rate(self) -> float:
        q = self.prefix_queries_tokens
        return self.prefix_hits_tokens / q if q else 0.0

    @property
    def prompt_reuse(self) -> float:
        """Fraction of the prompt tokens served from the prefix cache at each request's first
        admission (vLLM's per-request `num_cached_tokens`): the figure `bound` caps."""
        total = sum(r.num_prompt_tokens for r in self.requests)
        return sum(max(r.num_cached_tokens, 0) for r in self.requests) / total if total else 0.0

    def status_counts(self) -> dict[str, int]:
        return dict(Counter(r.status for r in self.requests))

    def ttft(self) -> Summary:
        return summarize([r.ttft_s for r in self.requests if r.ttft_s is not None])

    def tpot(self) -> Summary:
        return summarize([r.tpot_s for r in self.requests if r.tpot_s is not None])

    def e2e(self) -> Summary:
        return summarize([r.e2e_s for r in self.requests if r.e2e_s is not None])


def op_submit_time(op: OpRecord, root_arrival_s: float) -> float:
    """Recorded submission time of `op`: submitted, else ready, else its root's arrival."""
    if op.times.submitted_s is not None:
        return op.times.submitted_s
    if op.times.ready_s is not None:
        return op.times.ready_s
    return root_arrival_s


def op_request(op: OpRecord, deployment: str) -> Request:
    """The length-locked engine request of a model op (request id = op id)."""
    out = max(op.num_output_tokens, 1)
    return Request(
        op.op_id,
        deployment,
        num_prompt_tokens=op.num_input_tokens,
        prefix_block_hashes=tuple(op.prefix_block_hashes) if op.block_size else (),
        prefix_block_size=op.block_size or 0,
        max_tokens=out,
        min_tokens=out,
        priority=op.generation.priority if op.generation else 0,
        tags={"op_id": op.op_id, "root_id": op.root_id},
    )


def replay_requests(
    trace: Trace,
    pool: SimPool,
    deployment: str,
    *,
    policy: str = "arrival",
    route: str = "least-outstanding",
    load_bound: int = DEFAULT_LOAD_BOUND,
    start_s: float | None = None,
    progress: Callable[[ReplayProgress], None] | None = None,
    num_chunks: int = 200,
) -> ReplayResult:
    """Replay every model op of `trace` as a request on `pool`'s replicas of `deployment`.

    Args:
        trace: the trace (imported bundle or Mooncake file).
        pool: a pool whose replicas of `deployment` are (or will be) READY; its clock must be
            idle of other work for the replay to end.
        deployment: deployment name the requests address.
        policy: release rule; only "arrival" (recorded times) exists at request level.
        route: where each request goes (`dispatch.routes.ROUTES`).
        load_bound: the `prefix` / `session` routes' load bound (`dispatch.routes`).
        start_s: where the earliest op lands (default: now).
        progress: called after each chunk of simulated time.
        num_chunks: how many chunks the arrival span is cut into.

    Raises:
        ConfigError: unknown policy or route, or the trace has no model op.
        RequestError: an op cannot form a request (e.g. 0 input tokens); names the op.
        SimulationError: the clock ran dry with requests unfinished.
    """
    if policy not in POLICIES:
        raise ConfigError(f"unknown release policy {policy!r}; request-level replay has {POLICIES}")
    plan = get_route(route, load_bound)
    clock = pool.clock
    replicas = pool.ready_replicas(deployment)
    arrivals = {r.root_id: r.arrival_s for r in trace.roots}
    model_ops = [op for op in trace.ops if op.kind is OpKind.MODEL]
    if not model_ops:
        raise ConfigError(f"trace {trace.manifest.trace_id!r} has no model ops to replay")
    times = [op_submit_time(op, arrivals.get(op.root_id, 0.0)) for op in model_ops]
    order = sorted(range(len(model_ops)), key=lambda i: times[i])
    t0 = times[order[0]]
    start = clock.now() if start_s is None else start_s
    per_root = Counter(op.root_id for op in model_ops)
    prompts = [model_ops[i] for i in order]
    result = ReplayResult(
        deployment,
        start,
        start,
        [],
        num_multi_op_roots=sum(1 for n in per_root.values() if n > 1),
        num_skipped_ops=len(trace.ops) - len(model_ops),
        num_padded_outputs=sum(1 for op in model_ops if op.num_output_tokens < 1),
        route=route,
        bound_prompts=[
            (op.prefix_block_hashes if op.block_size else (), op.block_size or 0,
             op.num_input_tokens)
            for op in prompts
        ],
        kv_block_size=min((r.config.block_size for r in replicas), default=16),
    )  # fmt: skip
    base = _counters(pool, deployment)
    slots: list[RequestResult | None] = [None] * len(model_ops)
    state = {"submitted": 0, "pending": 0, "done": 0}
    dispatcher = Dispatcher(lambda: replicas, clock.now, plan)
    where: dict[int, tuple[float, str]] = {}  # op index -> (submit time, replica)

    def submit(i: int) -> None:
        op = model_ops[i]
        req = op_request(op, deployment)
        state["submitted"] += 1
        state["pending"] += 1
        unit = Unit(op.op_id, op.root_id, deployment, req.num_prompt(), req.max_tokens,
                    priority=req.priority, ready_s=clock.now(),
                    session_id=op.session_id)  # fmt: skip
        dispatcher.on_ready(
            unit,
            req,
            on_done=partial(done, i, req),
            on_submitted=lambda now, replica: where.__setitem__(i, (now, replica)),
        )

    def done(i: int, req: Request, out: Outcome) -> None:
        op = model_ops[i]
        now, replica = where.get(i, (out.finish_s, ""))
        if out.status is OutcomeStatus.REJECTED:
            slots[i] = _rejected(op, req, now, replica, out.error or "")
        else:
            slots[i] = _completed(op, replica, out)
        state["pending"] -= 1
        state["done"] += 1

    for i in order:
        clock.call_at(start + (times[i] - t0), partial(submit, i), URGENT, "replay submit")
    span = times[order[-1]] - t0
    chunk = max(span / max(num_chunks, 1), 1.0)
    total = len(model_ops)
    with _quiet_gc():
        while state["submitted"] < total or state["pending"] > 0:
            if math.isinf(clock.peek()):
                raise SimulationError(
                    f"replay stuck: {state['pending']} requests unfinished and no event pending"
                )
            clock.run(until=clock.now() + chunk)
            if progress is not None:
                progress(ReplayProgress(clock.now() - start, span, state["done"], total))
    result.requests = [r for r in slots if r is not None]
    ends = [r.submit_s + r.e2e_s for r in result.requests if r.e2e_s is not None]
    result.end_s = max([start + span, *ends])
    _aggregate(result, pool, base)
    return result


_GC_GEN0_THRESHOLD = 50_000


@contextmanager
def _quiet_gc() -> Iterator[None]:
    """Freeze what is alive now out of the cyclic GC and raise the young-generation threshold;
    restore both on exit (a freeze the caller made is left alone)."""
    threshold = gc.get_threshold()
    freeze = gc.get_freeze_count() == 0
    if freeze:
        gc.freeze()
    gc.set_threshold(max(threshold[0], _GC_GEN0_THRESHOLD), *threshold[1:])
    try:
        yield
    finally:
        gc.set_threshold(*threshold)
        if freeze:
            gc.unfreeze()


def _rejected(op: OpRecord, req: Request, now: float, replica: str, why: str) -> RequestResult:
    return RequestResult(
        op.op_id, op.root_id, replica, "rejected", why, now, req.num_prompt(), 0, 0, 0,
        None, None, None,
    )  # fmt: skip


def _completed(op: OpRecord, replica: str, out: Outcome) -> RequestResult:
    ok = out.status.value == "completed" and out.first_token_s is not None
    ttft = out.first_token_s - out.arrival_s if ok and out.first_token_s is not None else None
    tpot = None
    if ttft is not None and out.first_token_s is not None and out.num_output_tokens > 1:
        tpot = (out.finish_s - out.first_token_s) / (out.num_output_tokens - 1)
    return RequestResult(
        op.op_id, op.root_id, replica, "completed" if ok else "failed", out.error or "",
        out.arrival_s, out.num_prompt_tokens, out.num_output_tokens, out.num_cached_tokens,
        out.num_preemptions, ttft, tpot, out.finish_s - out.arrival_s if ok else None,
    )  # fmt: skip


def _counters(pool: SimPool, deployment: str) -> dict[str, tuple[int, int, int, int]]:
    """Per replica of `deployment`: (queries, hits, preemptions, step records) now."""
    return {
        p.name: (
            p.engine.kv.num_queried_tokens,
            p.engine.kv.num_hit_tokens,
            p.engine.scheduler.num_preemptions_total,
            len(p.engine.records),
        )
        for p in pool.pool_replicas()
        if p.deployment.name == deployment
    }


def _aggregate(
    result: ReplayResult, pool: SimPool, base: dict[str, tuple[int, int, int, int]]
) -> None:
    means, maxes = [], []
    for p in pool.pool_replicas():
        if p.deployment.name != result.deployment:
            continue
        q0, h0, pre0, n0 = base.get(p.name, (0, 0, 0, 0))
        eng = p.engine
        result.prefix_queries_tokens += eng.kv.num_queried_tokens - q0
        result.prefix_hits_tokens += eng.kv.num_hit_tokens - h0
        result.num_preemptions += eng.scheduler.num_preemptions_total - pre0
        result.num_step_records += len(eng.records) - n0
        result.num_model_steps += sum(r.num_steps for r in eng.records[n0:])
        tl = eng.timeline
        args = (tl.t_s, tl.values[_KV], result.start_s, result.end_s)
        means.append(time_weighted_mean(*args))
        maxes.append(window_max(*args))
    result.kv_usage_mean = sum(means) / len(means) if means else 0.0
    result.kv_usage_max = max(maxes, default=0.0)
    if result.num_multi_op_roots:
        result.notes.append(
            f"{result.num_multi_op_roots} roots have several model ops: replayed request by "
            "request at recorded times (Arrival rule, non-causal); for dependency-aware "
            "fixed-work replay use `maserve replay` (DAG rule)"
        )
