"""`SimReplica`: one simulated vLLM-v1 deployment — the `Replica` protocol over a step loop.

The engine loop runs a step whenever there is work: `Scheduler.schedule()` at the step start,
duration from the `StepCostModel`, `update_from_output` at the step end, where first tokens and
outcomes are delivered at the end time. Same-instant ordering on the virtual clock: arrivals are
URGENT, step ends NORMAL and step starts LATE, so everything that happens at an instant (arrivals,
callbacks that submit follow-up calls) is in the queue before the next step is scheduled.

Fast-forward (the speed idea): when a step is pure decode for every running request, nothing
waiting could be admitted before a completion (the queue is empty, or blocked on KV, seats or
budget, which a decode run only tightens), and enough free blocks exist for every block crossing,
the next `k` steps are planned as one run ending at one kernel event: `k` stops at the first
completion or the last step the free blocks cover. Events elsewhere (other replicas' steps) do
not touch it; only something addressed to this replica can: an arrival or a `pause` mid-run
truncates the run exactly to the steps that started strictly before it (at least one), so the
next step starts at the same boundary, with the same state, as under single-stepping. Step times
come from `decode_affine` in closed form; block allocations are replayed at the run's end in the
exact per-step order (nothing else touches this replica's KV cache meanwhile), so the KV state
(and eviction order) matches stepping; `state()` mid-run reports the KV usage stepping would
show. One aggregated `StepRecord` with `num_steps=k` stands for the run. Needs a clock with
`peek()` (the kernel); under a `WallClock` every step is taken one by one. The conditions and the
exact replay live in `fast_forward.py`. Consecutive full-budget chunks of one prefill are merged
the same way (exact per-step costs, one timeline sample per step; `prefill_run.py`).

HEAR (`hear_side.py`): controls are resolved by `hear.force.resolve` against
`hear_capabilities()` — every HEAR control is supported (`Priority` only under the priority
policy; cache controls while prefix caching is on; the CPU tier with a host tier). Cache controls
also go through `control(controls)` outside a submission, and `hear_state()` reports residency
per tier. A control sent while a fast-forwarded run is in flight cuts the run (as an arrival does) and
allocates the KV of its steps already started at once, so it is judged and applied on the KV
state stepping would have; a `MaxWait` deadline cuts a run the same way. A `CachePrepare` load runs between
steps and holds the replica for its transfer time; host-tier hits at admission lengthen the step
that schedules the request. Non-dense execution modes (`modes.py`) change a request's decode
context and held blocks; while one is in flight, decode steps are taken one by one.

Event log (optional list): `(t_s, event, request_id, detail)` with events `arrive`, `schedule`
(detail = prefix-hit tokens), `preempt` (detail = preemptions so far), `first_token` and `finish`
(detail = output tokens).

Examples:
    >>> from maserve_prefect.engine.sim.kernel import Kernel
    >>> from maserve_prefect.engine.protocol import Request
    >>> from maserve_prefect.engine.sim.cost import DecodeAffine, StepCost
    >>> class Flat:  # 1 ms per step, whatever it computes
    ...     def step_cost(self, chunks): return StepCost(0.001, 0.0, 0.0, 0.0)
    ...     def decode_affine(self, n): return DecodeAffine(n, 0.001, 0.0, 0.0, 0.0)
    >>> k = Kernel()
    >>> rep = SimReplica(k, Flat(), num_gpu_blocks=64, name="r0")
    >>> t = rep.submit(Request("a", "", num_prompt_tokens=32, max_tokens=4))
    >>> k.run()
    >>> t.outcome.num_output_tokens, round(t.outcome.finish_s, 6)
    (4, 0.004)
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass

from maserve_prefect.clock import LATE, NORMAL, URGENT, Cancellable, Clock
from maserve_prefect.engine.protocol import (
    Acceptance,
    Capabilities,
    Control,
    EngineState,
    ExecutionMode,
    Intent,
    Outcome,
    OutcomeStatus,
    Priority,
    Request,
    Ticket,
)
from maserve_prefect.engine.sim.cost import (
    DecodeAffine,
    ScheduledChunk,
    StepCost,
    StepCostModel,
)
from maserve_prefect.engine.sim.fast_forward import (
    allocate_run,
    blocks_held_after,
    decode_run_length,
    run_cost,
    steps_before,
)
from maserve_prefect.engine.sim.hear_side import ResidencyFeed, SimHear
from maserve_prefect.engine.sim.host_tier import HostTierConfig
from maserve_prefect.engine.sim.kv_cache import KVCacheManager, cdiv
from maserve_prefect.engine.sim.modes import (
    DEFAULT_MODE_PARAMS,
    DEFAULT_MODES,
    ModeBook,
    ModeParams,
)
from maserve_prefect.engine.sim.prefill_run import PrefillRun, plan_prefill_run
from maserve_prefect.engine.sim.records import (
    SERIES,
    ScheduledTokens,
    StepKind,
    StepRecord,
    Timeline,
    step_kind,
)
from maserve_prefect.engine.sim.request import SimRequest
from maserve_prefect.engine.sim.scheduler import (
    Policy,
    Scheduler,
    SchedulerConfig,
    SchedulerOutput,
    StepUpdate,
)
from maserve_prefect.errors import SimulationError
from maserve_prefect.hear.capabilities import HearCapabilities
from maserve_prefect.hear.controls import (
    CachePrepare,
    CacheRelease,
    CacheRetain,
    MaxWait,
    OrderingKey,
)
from maserve_prefect.hear.force import Resolution
from maserve_prefect.hear.intents import IntentMessage
from maserve_prefect.hear.state import StateReport

LogEntry = tuple[float, str, str, int]

__all__ = ["SERIES", "LogEntry", "SimReplica"]


class _Hooks:
    """A replica's HEAR-side state, in one attribute: the replica stays under CPython's 30
    shared instance-dict keys, past which every attribute access on its hot path slows."""

    __slots__ = ("hear", "host_loads", "modal", "modes", "prepares", "run_allocated")

    def __init__(self, modes: ModeBook, host_loads: list[tuple[SimRequest, int]]) -> None:
        self.modes = modes
        self.modal = modes.in_flight  # non-dense requests in flight (tested per step)
        self.host_loads = host_loads  # the KV cache's admissions' host-tier loads (per step)
        self.prepares: list[tuple[int, ...]] = []  # CachePrepare loads for the next gap
        self.run_allocated = False  # the run in flight allocated its KV early (`_materialize`)
        # built on first use (or at once, for a host tier): its KV hooks cost a little on
        # every eviction, which a replica that never uses HEAR should not pay
        self.hear: SimHear | None = None


@dataclass(slots=True)
class _Run:
    """A fast-forwarded decode run in flight: `k` steps from `start_s` (k may shrink)."""

    out: SchedulerOutput
    start_s: float
    k: int
    aff: DecodeAffine
    ctx0: int
    handle: Cancellable | None = None


class SimReplica:
    """A simulated vLLM-v1 replica (one deployment, one KV cache).

    Args:
        clock: the kernel (virtual time, deterministic) or a `WallClock` (paced real time).
        cost_model: step-time model (`engine/sim/cost.py` seam).
        num_gpu_blocks: KV capacity in blocks of `config.block_size` tokens.
        config: scheduler settings (vLLM defaults).
        name: replica name used in records.
        deployment: the deployment it serves; "" accepts any.
        modes: execution modes it can run in (the first is the default); `modes.py` says
            which of them change what the simulator computes.
        log: optional list that receives the event log.
        check_invariants: run the full invariant check after every step (tests).
        host_tier: a host-memory KV tier (`host_tier.py`), or None for the GPU tier only.
        mode_params: parameters of the modeled execution modes.
    """

    def __init__(
        self,
        clock: Clock,
        cost_model: StepCostModel,
        num_gpu_blocks: int,
        config: SchedulerConfig | None = None,
        name: str = "replica-0",
        deployment: str = "",
        modes: tuple[str, ...] = DEFAULT_MODES,
        log: list[LogEntry] | None = None,
        check_invariants: bool = False,
        host_tier: HostTierConfig | None = None,
        mode_params: ModeParams = DEFAULT_MODE_PARAMS,
    ) -> None:
        self.clock = clock
        self.cost_model = cost_model
        self.config = config if config is not None else SchedulerConfig()
        self.name = name
        self.deployment = deployment
        self.modes = modes
        self.log = log
        self.debug_checks = check_invariants
        self.kv = KVCacheManager(
            num_gpu_blocks, self.config.block_size, self.config.enable_prefix_caching
        )
        self.scheduler = Scheduler(self.config, self.kv)
        self.records: list[StepRecord] = []
        self.timeline = Timeline(name)
        self.intents: list[Intent] = []
        self.num_steps = 0
        self.num_finished = 0
        self._seq = itertools.count()
        self._by_id: dict[str, SimRequest] = {}  # accepted and not finished
        self._busy = False
        self._start_pending = False
        self._paused = False
        self._accepting = True
        self._closed_reason = ""
        self.lifecycle_label = ""  # set by a Pool ("loading", "asleep", ...); "" = derived
        self._idle_cbs: list[Callable[[], None]] = []
        # fast-forward needs a virtual clock (one with `peek`) whose handles can be cancelled
        self._ff = self.config.fast_forward and getattr(clock, "peek", None) is not None
        self._affine: dict[int, DecodeAffine] = {}
        self._ff_prefill = self._ff and self.config.fast_forward_prefill
        self._run: _Run | PrefillRun | None = None  # the fast-forwarded run in flight
        self._hx = _Hooks(ModeBook(mode_params), self.kv.host_loads)
        if host_tier is not None:
            self._hx.hear = SimHear(self, host_tier)

    # -- Replica protocol ------------------------------------------------------------------

    def capabilities(self) -> Capabilities:
        prio = self.config.policy is Policy.PRIORITY
        types: tuple[type[Control], ...] = (ExecutionMode, OrderingKey, MaxWait)
        if prio:
            types += (Priority,)
        if self.config.enable_prefix_caching:
            types += (CachePrepare, CacheRetain, CacheRelease)
        return Capabilities(
            control_types=types,
            accepts_token_ids=True,
            length_lock=True,
            priority_scheduling=prio,
            prefix_caching=self.config.enable_prefix_caching,
            kv_events=False,
            sleep_levels=(),
            modes=self.modes,
        )

    def submit(self, request: Request, controls: Sequence[Control] = ()) -> Ticket:
        """Answer at once: ACCEPTED (arrival processed at the current instant), REJECTED or
        UNSUPPORTED; see `Ticket` for the first token and outcome."""
        rid = request.request_id
        reason = self._rejection(request)
        if reason:
            return Ticket(rid, Acceptance.REJECTED, reason)
        plan = None
        if controls:
            self._materialize()  # cache controls are judged on the KV state stepping has now
            plan = self.hear.plan_submit(request, controls)
        if isinstance(plan, str):
            return Ticket(rid, Acceptance.UNSUPPORTED, plan)
        notes = plan.notes if plan is not None else ()
        ticket = Ticket(rid, Acceptance.ACCEPTED, notes=notes)
        sreq = SimRequest(
            request,
            seq=next(self._seq),
            arrival_s=self.clock.now(),
            priority=request.priority if plan is None else plan.priority,
            block_size=self.config.block_size,
            ticket=ticket,
            realized_mode=self.modes[0] if plan is None else plan.mode,
            notes=notes,
        )
        self._by_id[rid] = sreq
        if plan is not None:
            self._apply_plan(sreq, plan.ordering_key, plan.max_wait_s, plan.cache)
        self.clock.call_at(sreq.arrival_s, lambda: self._arrive(sreq), URGENT, f"arrive {rid}")
        return ticket

    def _apply_plan(
        self,
        sreq: SimRequest,
        ordering_key: float,
        max_wait_s: float | None,
        cache: tuple[Control, ...],
    ) -> None:
        sreq.ordering_key = ordering_key
        self._hx.modes.admit(sreq)
        if max_wait_s is not None:
            if max_wait_s == 0:
                sreq.protected = True
            else:
                t = sreq.arrival_s + max_wait_s
                self.clock.call_at(t, lambda: self._protect(sreq), URGENT, f"max_wait {sreq.seq}")
        if cache:
            self.kv_effect(lambda: self._hx.prepares.extend(self.hear.apply_cache(cache)))

    # -- HEAR ------------------------------------------------------------------------------

    @property
    def hear(self) -> SimHear:
        """This replica's HEAR side (built on first use)."""
        if self._hx.hear is None:
            self._hx.hear = SimHear(self, None)
        return self._hx.hear

    def hear_capabilities(self) -> HearCapabilities:
        return self.hear.capabilities

    def control(self, controls: Sequence[Control]) -> Resolution:
        """Cache controls outside a submission (retain / release / prepare after a turn).

        Applied unless a requirement is unsatisfied (then nothing is), at the current instant
        (see the module docstring for runs in flight); the answer says what was honoured,
        dropped and why.

        Examples:
            >>> from maserve_prefect.engine.sim.kernel import Kernel
            >>> from maserve_prefect.engine.protocol import Force
            >>> from maserve_prefect.hear.controls import CacheRetain, Tier
            >>> from maserve_prefect.hear.subjects import ContextRef
            >>> rep = SimReplica(Kernel(), None, num_gpu_blocks=8)  # type: ignore[arg-type]
            >>> keep = CacheRetain(ContextRef("s"), (1,), 0.5, tier=Tier.CPU,
            ...                    force=Force.REQUIREMENT)
            >>> rep.control([keep]).acceptance.value   # no host tier here
            'unsupported'
        """
        self._materialize()  # resolution reads the KV state stepping would have now
        res = self.hear.resolve(controls, request_scoped=False)
        if not res.unsatisfied and res.honoured:
            honoured = res.honoured
            self.kv_effect(lambda: self._hx.prepares.extend(self.hear.apply_cache(honoured)))
        return res

    def hear_state(self, hashes: Collection[int] | None = None) -> StateReport:
        """Residency per tier, capacity, queues and pressure now (a snapshot; reserves
        nothing). Inside a fast-forwarded run, residency is as of the run's start (the blocks
        its steps take are allocated at its end); counts and usage are as `state()` gives.
        With `hashes`, residency covers only those block hashes (a query)."""
        return self.hear.state_report(hashes)

    def subscribe_residency(self) -> ResidencyFeed:
        """A feed of this replica's KV residency changes from now on, starting with what is
        resident now (`hear_side.ResidencyFeed`): the simulator's KV events."""
        return self.hear.subscribe_residency()

    def kv_effect(self, fn: Callable[[], None]) -> None:
        """Run `fn` (a change to pins or the load queue) now, on the KV state stepping would
        have now (`_materialize`)."""
        self._materialize()
        fn()
        self._kick()

    def _materialize(self) -> None:
        """Bring a fast-forwarded run in flight to the state stepping has now: cut it to the
        steps started before now and allocate their KV at once (at its end it would allocate
        the same blocks, nothing else touching this KV cache meanwhile), so KV checks and
        changes made now see and act on exactly what they would under stepping."""
        run = self._run
        if run is None:
            return
        self._truncate_run()
        if not self._hx.run_allocated:
            if isinstance(run, PrefillRun):
                run.allocate(self.scheduler)
            else:
                allocate_run(self.scheduler, run.k)
            self._hx.run_allocated = True

    def _protect(self, sreq: SimRequest) -> None:
        if sreq.status.is_finished:
            return
        if self._run is not None:
            self._truncate_run()
        self.scheduler.protect(sreq)
        self._kick()

    def inform(self, intent: Intent | IntentMessage) -> None:
        """Record an intent (seam `Intent`s in `intents`, typed HEAR intents in
        `hear.intents`); it never changes what the replica does."""
        if isinstance(intent, Intent):
            self.intents.append(intent)
        else:
            self.hear.intents.inform(intent)

    def state(self) -> EngineState:
        lifecycle = "paused" if self._paused else ("running" if self._accepting else "draining")
        lifecycle = self.lifecycle_label or lifecycle
        num_free, num_steps = self.kv.num_free_blocks, self.num_steps
        run = self._run
        if isinstance(run, PrefillRun):  # what stepping would show now, inside the run
            j = run.steps_before(self.clock.now())
            if not self._hx.run_allocated:
                num_free -= run.blocks_after(j)
            num_steps += j - 1
        elif run is not None:
            j = steps_before(
                self.clock.now(), run.start_s, run.aff, run.ctx0, run.aff.num_seqs, run.k
            )
            if not self._hx.run_allocated:
                num_free -= blocks_held_after(self.scheduler, j)
            num_steps += j - 1
        values = self._sample_values()
        usage = 1.0 - num_free / self.kv.num_blocks
        return EngineState(
            name=self.name,
            deployment=self.deployment,
            lifecycle=lifecycle,
            num_running=len(self.scheduler.running),
            num_waiting=self.scheduler.num_waiting,
            kv_usage=usage,
            num_free_blocks=num_free,
            num_total_blocks=self.kv.num_blocks,
            block_size=self.kv.block_size,
            counters=dict(zip(SERIES, (usage, *values[1:]), strict=True))
            | {"num_steps": float(num_steps), "num_finished": float(self.num_finished)},
        )

    # -- lifecycle hooks for a Pool --------------------------------------------------------

    def pause(self) -> None:
        """Start no new step (a step in flight still finishes; a fast-forwarded run is cut to the
        steps already started)."""
        self._paused = True
        if self._run is not None:
            self._truncate_run()

    def resume(self) -> None:
        self._paused = False
        self._kick()

    def set_accepting(self, accepting: bool, reason: str = "") -> None:
        """Drain (False): new submissions are REJECTED while queued work runs to completion.

        `reason` replaces the default "draining" in rejections (a Pool says "loading", ...).
        """
        self._accepting = accepting
        self._closed_reason = reason

    @property
    def accepting(self) -> bool:
        """Whether `submit` currently accepts work (False while draining or not ready)."""
        return self._accepting

    @property
    def num_outstanding(self) -> int:
        """Accepted requests not yet finished (what least-outstanding routing compares)."""
        return len(self._by_id)

    def reset_prefix_cache(self) -> None:
        """Forget every cached prefix block (vLLM `reset_prefix_cache`); only when idle.

        Raises:
            SimulationError: the replica still has work (its blocks are in use).
        """
        if not self.is_idle:
            raise SimulationError(
                f"{self.name}: reset_prefix_cache with {len(self._by_id)} requests in flight; "
                "wait for on_idle first"
            )
        self.kv.reset_prefix_cache()
        self._hx.prepares = []
        if self._hx.hear is not None:
            self._hx.hear.reset()

    @property
    def is_idle(self) -> bool:
        """No step in flight or pending and no accepted request unfinished."""
        return not self._busy and not self._start_pending and not self._by_id

    def on_idle(self, cb: Callable[[], None]) -> None:
        """Call `cb()` once the replica has no work (at once if it has none now)."""
        if self.is_idle:
            cb()
        else:
            self._idle_cbs.append(cb)

    # -- admission checks ------------------------------------------------------------------

    def _rejection(self, request: Request) -> str:
        rid = request.request_id
        if not self._accepting:
            return self._closed_reason or f"replica {self.name} is draining"
        if self.deployment and request.deployment != self.deployment:
            return f"replica {self.name} serves {self.deployment!r}, not {request.deployment!r}"
        if rid in self._by_id:
            return f"request id {rid!r} is already in flight on {self.name}"
        total = request.num_prompt() + request.max_tokens
        if total > self.config.max_model_len:
            return (
                f"prompt + max_tokens = {total} exceeds max_model_len "
                f"{self.config.max_model_len}; shorten the prompt or lower max_tokens"
            )
        need = cdiv(total - 1, self.config.block_size)
        if need > self.kv.num_blocks:
            return (
                f"needs {need} KV blocks but {self.name} has {self.kv.num_blocks}; "
                "it could never run here"
            )
        return ""

    # -- the engine loop -------------------------------------------------------------------

    def _arrive(self, sreq: SimRequest) -> None:
        if self._run is not None:
            self._truncate_run()
        self._log(self.clock.now(), "arrive", sreq.request_id, 0)
        self.scheduler.add_request(sreq)
        self._kick()

    def _kick(self) -> None:
        if self._busy or self._paused or self._start_pending:
            return
        if not (self.scheduler.has_work() or self._hx.prepares):
            return
        self._start_pending = True
        self.clock.call_at(self.clock.now(), self._start_step, LATE, f"{self.name} step")

    def _start_step(self) -> None:
        self._start_pending = False
        if self._busy or self._paused:
            return
        if self._hx.prepares:  # a CachePrepare load holds the replica before the next step
            self._start_transfer()
            return
        if not self.scheduler.has_work():
            return
        now = self.clock.now()
        out = self.scheduler.schedule()
        for rid in out.preempted:
            self._log(now, "preempt", rid, self._req(rid).num_preemptions)
        for rid in out.admitted:
            sreq = self._req(rid)
            if sreq.first_scheduled_s is None:
                sreq.first_scheduled_s = now
            self._log(now, "schedule", rid, sreq.num_computed_tokens)
        if not out.scheduled:
            if not out.preempted:
                if self.kv.num_hard_pinned_free:
                    return  # the free blocks are pinned by requirement: wait for a release
                raise SimulationError(
                    f"{self.name}: nothing schedulable with {len(self.scheduler.running)} "
                    f"running and {self.scheduler.num_waiting} waiting; scheduler is stuck"
                )
            self._kick()
            return
        self._busy = True
        self._plan_run(out, now)

    def _plan_run(self, out: SchedulerOutput, now: float) -> None:
        """Schedule the end of one step, or of a fast-forwarded run of `k` decode or chunked
        prefill steps."""
        hx = self._hx
        if hx.host_loads:  # admissions loaded host-tier blocks: this step takes longer
            self._plan_step(out, now, self.hear.admission_loads())
            return
        if self._ff_prefill:
            prun = plan_prefill_run(self.scheduler, out, now, self.cost_model)
            if prun is not None:
                prun.base_values = self._sample_values()[1:]  # constant inside the run
                prun.handle = self.clock.call_at(
                    prun.ends[-1], lambda: self._end_prefill_run(prun), NORMAL, self.name
                )
                self._run = prun
                return
        if self._ff and not hx.modal:
            n = len(out.scheduled)
            aff = self._affine.get(n)
            if aff is None:
                aff = self._affine[n] = self.cost_model.decode_affine(n)
            k = decode_run_length(self.scheduler, out, now)
            if k > 1:
                ctx0 = sum(it.num_computed_before for it in out.scheduled)
                run = _Run(out, now, k, aff, ctx0)
                end_s = now + aff.base_s * k + run_cost(aff, ctx0, k).attention_s
                run.handle = self.clock.call_at(
                    end_s, lambda: self._end_run(run), NORMAL, self.name
                )
                self._run = run
                return
        if hx.modal:
            self._plan_step(out, now, 0.0)
            return
        chunks = [ScheduledChunk(it.num_new_tokens, it.num_computed_before) for it in out.scheduled]
        cost = self.cost_model.step_cost(chunks)
        end_s = now + cost.total_s
        self.clock.call_at(
            end_s, lambda: self._end_step(out, now, end_s, 1, cost), NORMAL, self.name
        )

    def _plan_step(self, out: SchedulerOutput, now: float, extra_s: float) -> None:
        """One step on its own, with non-dense modes' contexts and `extra_s` (host-tier loads,
        charged as overhead)."""
        if self._hx.modal:
            by_seq = self.scheduler.by_seq
            items = [
                (by_seq[it.seq], it.num_new_tokens, it.num_computed_before) for it in out.scheduled
            ]
            chunks = self._hx.modes.chunks(items)
        else:
            chunks = [
                ScheduledChunk(it.num_new_tokens, it.num_computed_before) for it in out.scheduled
            ]
        cost = self.cost_model.step_cost(chunks)
        if extra_s:
            cost = StepCost(
                cost.linear_s, cost.attention_s, cost.lm_head_s, cost.overhead_s + extra_s
            )
        end_s = now + cost.total_s
        self.clock.call_at(
            end_s, lambda: self._end_step(out, now, end_s, 1, cost), NORMAL, self.name
        )

    def _truncate_run(self) -> None:
        """Cut the run in flight to the steps that started strictly before now (at least 1)."""
        run = self._run
        if run is None:
            return
        if isinstance(run, PrefillRun):
            j = run.steps_before(self.clock.now())
            if j < run.k:
                run.k = j
                assert run.handle is not None
                run.handle.cancel()
                run.handle = self.clock.call_at(
                    run.ends[j - 1], lambda: self._end_prefill_run(run), NORMAL, self.name
                )
            return
        aff = run.aff
        n = aff.num_seqs
        j = steps_before(self.clock.now(), run.start_s, aff, run.ctx0, n, run.k)
        if j >= run.k:
            return
        run.k = j
        assert run.handle is not None
        run.handle.cancel()
        end_s = run.start_s + aff.base_s * j + run_cost(aff, run.ctx0, j).attention_s
        run.handle = self.clock.call_at(end_s, lambda: self._end_run(run), NORMAL, self.name)

    def _start_transfer(self) -> None:
        batches, self._hx.prepares = self._hx.prepares, []
        seconds = self.hear.load_prepared(batches)
        if seconds <= 0.0:
            self._kick()
            return
        self._busy = True
        self.clock.call_at(
            self.clock.now() + seconds, self._end_transfer, NORMAL, f"{self.name} prepare"
        )

    def _end_transfer(self) -> None:
        self._busy = False
        self._kick()
        self._notify_idle()

    def _end_run(self, run: _Run) -> None:
        self._run = None
        if self._hx.run_allocated:
            self._hx.run_allocated = False
        else:
            allocate_run(self.scheduler, run.k)
        cost = run_cost(run.aff, run.ctx0, run.k)
        self._end_step(run.out, run.start_s, self.clock.now(), run.k, cost, StepKind.DECODE)

    def _end_prefill_run(self, run: PrefillRun) -> None:
        self._run = None
        k = run.k
        if self._hx.run_allocated:
            self._hx.run_allocated = False
        else:
            run.allocate(self.scheduler)
        run.req.num_computed_tokens += (k - 1) * run.chunk  # `_end_step` adds the last chunk
        if k > 1:  # steps 0..k-2 end with only KV usage moved (see `prefill_run.py`)
            base = run.base_values
            nb = self.kv.num_blocks
            sample = self.timeline.sample
            for i in range(k - 1):
                sample(run.ends[i], (run.usage_after(i + 1, nb), *base))
        self._end_step(
            run.out, run.starts[0], run.ends[k - 1], k, run.total_cost(), StepKind.PREFILL
        )

    def _end_step(
        self,
        out: SchedulerOutput,
        start_s: float,
        end_s: float,
        num_steps: int,
        cost: StepCost,
        run_kind: StepKind | None = None,
    ) -> None:
        """End one step, or a run (`run_kind`: DECODE or PREFILL) whose steps before the last
        were applied already, except decode runs' (`advance_decode`)."""
        by_seq = self.scheduler.by_seq
        if run_kind is None:
            num_tokens_of = {it.request_id: by_seq[it.seq].num_tokens for it in out.scheduled}
        upd = self.scheduler.update_from_output(out)
        if self._hx.modal:
            self._compress(out)
        if run_kind is StepKind.DECODE and num_steps > 1:
            finished_first = self.scheduler.advance_decode(num_steps - 1)
            upd = StepUpdate(upd.first_token + finished_first.first_token, finished_first.finished)
        self._busy = False
        self.num_steps += num_steps
        scheduled = tuple(
            ScheduledTokens(it.request_id, it.num_computed_before, it.num_new_tokens * num_steps)
            for it in out.scheduled
        )
        kind = step_kind(scheduled, num_tokens_of) if run_kind is None else run_kind
        self.records.append(
            StepRecord(
                self.name,
                len(self.records),
                start_s,
                end_s,
                num_steps,
                kind,
                scheduled,
                out.num_scheduled_tokens,
                cost.linear_s,
                cost.attention_s,
                cost.lm_head_s,
                cost.overhead_s,
                tuple(out.preempted),
            )
        )
        self.timeline.sample(end_s, self._sample_values())
        if self.debug_checks:
            self.scheduler.check_invariants()
            if self._hx.hear is not None:
                self._hx.hear.check_invariants()
        for req in upd.first_token:
            req.first_token_s = end_s
            self._log(end_s, "first_token", req.request_id, req.num_output_tokens)
            req.ticket.resolve_first_token(end_s)
        for req in upd.finished:
            self._finish(req, end_s)
        self._kick()
        if self._idle_cbs and self.is_idle:
            self._notify_idle()

    def _notify_idle(self) -> None:
        if self._idle_cbs and self.is_idle:
            cbs, self._idle_cbs = self._idle_cbs, []
            for cb in cbs:
                cb()

    def _compress(self, out: SchedulerOutput) -> None:
        """`kv_budget` requests whose prompt this step completed drop to their KV budget."""
        by_seq = self.scheduler.by_seq
        reqs = [by_seq[it.seq] for it in out.scheduled if it.seq in by_seq]
        bs = self.kv.block_size
        for req, keep in self._hx.modes.to_compress(reqs):
            if self.kv.is_compressed(req):
                continue
            keep_blocks = cdiv(keep, bs)
            freed = self.kv.compress(req, keep_blocks)
            req.notes = (
                *req.notes,
                f"kv_budget: KV held to {keep} tokens ({keep_blocks} blocks) after prefill; "
                f"{freed} blocks freed",
            )

    def _finish(self, req: SimRequest, end_s: float) -> None:
        req.finish_s = end_s
        self.num_finished += 1
        del self._by_id[req.request_id]
        if self._hx.modal:
            self._hx.modes.done(req)
        if self._hx.hear is not None:
            self._hx.hear.finished(req)
        self._log(end_s, "finish", req.request_id, req.num_output_tokens)
        req.ticket.resolve(
            Outcome(
                request_id=req.request_id,
                status=OutcomeStatus.COMPLETED,
                num_prompt_tokens=req.num_prompt_tokens,
                num_output_tokens=req.num_output_tokens,
                num_cached_tokens=max(req.num_cached_tokens, 0),
                num_preemptions=req.num_preemptions,
                realized_mode=req.realized_mode,
                arrival_s=req.arrival_s,
                first_scheduled_s=req.first_scheduled_s,
                first_token_s=req.first_token_s,
                finish_s=end_s,
                notes=req.notes,
                num_cached_host_tokens=req.num_cached_cpu_tokens,
            )
        )

    # -- helpers ---------------------------------------------------------------------------

    def _sample_values(self) -> tuple[float, ...]:
        return (
            self.kv.usage,
            float(len(self.scheduler.running)),
            float(self.scheduler.num_waiting),
            float(self.scheduler.num_preemptions_total),
            float(self.kv.num_queried_tokens),
            float(self.kv.num_hit_tokens),
        )

    def _req(self, rid: str) -> SimRequest:
        return self._by_id[rid]

    def _req_by_seq(self, seq: int) -> SimRequest:
        return self.scheduler.by_seq[seq]

    def _log(self, t: float, event: str, rid: str, detail: int) -> None:
        if self.log is not None:
            self.log.append((t, event, rid, detail))
