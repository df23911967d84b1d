"""The step loop under `SimReplica` (`replica.py`): steps on a clock, fast-forwarded runs and
the event log.

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

A `CachePrepare` load runs between steps and holds the replica for its transfer time; host-tier
hits at admission lengthen the step that schedules the request. Non-dense execution modes
(`modes.py`) change a request's decode context and held blocks; while one is in flight, decode
steps are taken one by one. HEAR controls judged mid-run first bring the run in flight to the KV
state stepping has now (`_materialize`; `replica.py`).

Event log (optional list): `(t_s, event, request_id, detail)` with events `arrive`, `schedule`
(detail = prefix-hit tokens), `preempt` (detail = preemptions so far), `first_token` and `finish`
(detail = output tokens).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from maserve_prefect.clock import LATE, NORMAL, Cancellable, Clock
from maserve_prefect.engines.sim.cost.step_cost import (
    DecodeAffine,
    ScheduledChunk,
    StepCost,
    StepCostModel,
)
from maserve_prefect.engines.sim.hear.side import SimHear
from maserve_prefect.engines.sim.kv.manager import KVCacheManager, cdiv
from maserve_prefect.engines.sim.request import SimRequest
from maserve_prefect.engines.sim.step.device_share import Lane
from maserve_prefect.engines.sim.step.fast_forward import (
    allocate_run,
    decode_run_length,
    run_cost,
    steps_before,
)
from maserve_prefect.engines.sim.step.modes import DEFAULT_MODE_PARAMS, ModeBook, ModeParams
from maserve_prefect.engines.sim.step.prefill_run import PrefillRun, plan_prefill_run
from maserve_prefect.engines.sim.step.records import (
    ScheduledTokens,
    StepKind,
    StepRecord,
    Timeline,
    step_kind,
)
from maserve_prefect.engines.sim.step.scheduler import (
    Scheduler,
    SchedulerConfig,
    SchedulerOutput,
    StepUpdate,
)
from maserve_prefect.errors import SimulationError
from maserve_prefect.protocol.outcomes import Outcome, OutcomeStatus

LogEntry = tuple[float, str, str, int]


class _Hooks:
    """A replica's HEAR-side state, in one attribute: the replica stays under CPython's 30
    shared instance-dict keys, past which every attribute access on its hot path slows."""

    __slots__ = ("hear", "host_loads", "lane", "modal", "modes", "prepares", "run_allocated")

    def __init__(self, modes: ModeBook, host_loads: list[tuple[SimRequest, int]]) -> None:
        self.modes = modes
        self.modal = modes.in_flight  # non-dense requests in flight (tested per step)
        self.host_loads = host_loads  # the KV cache's admissions' host-tier loads (per step)
        self.prepares: list[tuple[int, ...]] = []  # CachePrepare loads for the next gap
        self.run_allocated = False  # the run in flight allocated its KV early (`_materialize`)
        # built on first use (or at once, for a host tier): its KV hooks cost a little on
        # every eviction, which a replica that never uses HEAR should not pay
        self.hear: SimHear | None = None
        self.lane: Lane | None = None  # the device share of a pool's replica (`device_share.py`)


@dataclass(slots=True)
class _Run:
    """A fast-forwarded decode run in flight: `k` steps from `start_s` (k may shrink)."""

    out: SchedulerOutput
    start_s: float
    k: int
    aff: DecodeAffine
    ctx0: int
    handle: Cancellable | None = None


class ReplicaLoop:
    """The engine loop of one replica: its scheduler and KV cache on a clock, and the steps (or
    fast-forwarded runs) it takes on them.

    The base of `SimReplica`, which adds the `Replica` protocol, admission checks, the HEAR side
    and the lifecycle hooks; whatever adds work calls `_kick()`.

    Args:
        clock: the kernel (virtual time, deterministic) or a `WallClock` (paced real time).
        cost_model: step-time model (`engines/sim/cost/step_cost.py` seam).
        num_gpu_blocks: KV capacity in blocks of `config.block_size` tokens.
        config: scheduler settings (vLLM defaults).
        name: replica name used in records.
        log: optional list that receives the event log.
        check_invariants: run the full invariant check after every step (tests).
        mode_params: parameters of the modeled execution modes.
    """

    def __init__(
        self,
        clock: Clock,
        cost_model: StepCostModel,
        num_gpu_blocks: int,
        config: SchedulerConfig | None = None,
        name: str = "replica-0",
        log: list[LogEntry] | None = None,
        check_invariants: bool = False,
        mode_params: ModeParams = DEFAULT_MODE_PARAMS,
    ) -> None:
        self.clock = clock
        self.cost_model = cost_model
        self.config = config if config is not None else SchedulerConfig()
        self.name = name
        self.log = log
        self.debug_checks = check_invariants
        self.kv = KVCacheManager(
            num_gpu_blocks, self.config.block_size, self.config.enable_prefix_caching
        )
        self.scheduler = Scheduler(self.config, self.kv)
        self.records: list[StepRecord] = []
        self.timeline = Timeline(name)
        self.num_steps = 0
        self.num_finished = 0
        self._by_id: dict[str, SimRequest] = {}  # accepted and not finished
        self._busy = False
        self._start_pending = False
        self._paused = False
        self._idle_cbs: list[Callable[[], None]] = []
        # fast-forward needs a virtual clock (one with `peek`) whose handles can be cancelled
        self._ff = self.config.fast_forward and getattr(clock, "peek", None) is not None
        self._affine: dict[int, DecodeAffine] = {}
        self._ff_prefill = self._ff and self.config.fast_forward_prefill
        self._run: _Run | PrefillRun | None = None  # the fast-forwarded run in flight
        self._hx = _Hooks(ModeBook(mode_params), self.kv.host_loads)

    # -- idle ------------------------------------------------------------------------------

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
            assert hx.hear is not None  # only its host tier loads blocks
            self._plan_step(out, now, hx.hear.admission_loads())
            return
        lane = hx.lane
        alone = lane is None or lane.alone()  # runs only while no replica beside is busy
        if self._ff_prefill and alone:
            prun = plan_prefill_run(self.scheduler, out, now, self.cost_model)
            if prun is not None:
                prun.base_values = self._sample_values()[1:]  # constant inside the run
                prun.handle = self._at_end(now, prun.ends[-1], lambda: self._end_prefill_run(prun))
                self._run = prun
                return
        if self._ff and not hx.modal and alone:
            n = len(out.scheduled)
            aff = self._affine.get(n)
            if aff is None:
                aff = self._affine[n] = self.cost_model.decode_affine(n)
            k = decode_run_length(self.scheduler, out, now)
            if k > 1:
                ctx0 = sum(it.num_computed_before for it in out.scheduled)
                run = _Run(out, now, k, aff, ctx0)
                end_s = now + aff.base_s * k + run_cost(aff, ctx0, k).attention_s
                run.handle = self._at_end(now, end_s, lambda: self._end_run(run))
                self._run = run
                return
        if hx.modal:
            self._plan_step(out, now, 0.0)
            return
        chunks = [ScheduledChunk(it.num_new_tokens, it.num_computed_before) for it in out.scheduled]
        cost = self.cost_model.step_cost(chunks)
        self._at_end(now, now + cost.total_s, lambda: self._end_step(out, now, 1, cost))

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
        self._at_end(now, now + cost.total_s, lambda: self._end_step(out, now, 1, cost))

    def _at_end(self, now: float, end_s: float, fire: Callable[[], None]) -> Cancellable | None:
        """Run `fire()` when the step (or run) started `now` ends: at `end_s` unshared, stretched
        while its device is shared (a pool's replica: `device_share.py`)."""
        lane = self._hx.lane
        if lane is None:
            return self.clock.call_at(end_s, fire, NORMAL, self.name)
        lane.start(now, end_s, fire)
        return None

    def _move_end(self, run: _Run | PrefillRun, end_s: float, fire: Callable[[], None]) -> None:
        """A cut run now ends at `end_s`."""
        lane = self._hx.lane
        if lane is not None:
            lane.move_end(end_s)
            return
        assert run.handle is not None
        run.handle.cancel()
        run.handle = self.clock.call_at(end_s, fire, NORMAL, self.name)

    def _truncate_run(self) -> None:
        """Cut the run in flight to the steps that started strictly before now (at least 1)."""
        run = self._run
        if run is None:
            return
        if isinstance(run, PrefillRun):
            j = run.steps_before(self.clock.now())
            if j < run.k:
                run.k = j
                self._move_end(run, run.ends[j - 1], lambda: self._end_prefill_run(run))
            return
        aff = run.aff
        n = aff.num_seqs
        j = steps_before(self.clock.now(), run.start_s, aff, run.ctx0, n, run.k)
        if j >= run.k:
            return
        run.k = j
        end_s = run.start_s + aff.base_s * j + run_cost(aff, run.ctx0, j).attention_s
        self._move_end(run, end_s, lambda: self._end_run(run))

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

    def _start_transfer(self) -> None:
        batches, self._hx.prepares = self._hx.prepares, []
        assert self._hx.hear is not None  # prepares come from `hear.apply_cache`
        seconds = self._hx.hear.load_prepared(batches)
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
        self._end_step(run.out, run.start_s, run.k, cost, StepKind.DECODE)

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
        self._end_step(run.out, run.starts[0], k, run.total_cost(), StepKind.PREFILL)

    def _end_step(
        self,
        out: SchedulerOutput,
        start_s: float,
        num_steps: int,
        cost: StepCost,
        run_kind: StepKind | None = None,
    ) -> None:
        """End one step, or a run (`run_kind`: DECODE or PREFILL) whose steps before the last
        were applied already, except decode runs' (`advance_decode`), now: at the end time it
        was scheduled for (the cost model's, or stretched by a shared device)."""
        end_s = self.clock.now()
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

    def _log(self, t: float, event: str, rid: str, detail: int) -> None:
        if self.log is not None:
            self.log.append((t, event, rid, detail))
