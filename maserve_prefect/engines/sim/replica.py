"""`SimReplica`: one simulated vLLM-v1 deployment — the `Replica` protocol over a step loop.

The step loop, fast-forwarded runs and the event log live in `loop.py` (`ReplicaLoop`,
this class's base); here is what the outside sees: submission and admission checks, `state()`,
the HEAR side and the lifecycle hooks a Pool drives.

HEAR (`hear/resolve.py`, `hear/side.py`): controls are resolved by `protocol.force.resolve` against
`hear_capabilities()` — every HEAR control is supported (`Priority` only under the priority
policy; cache controls while prefix caching is on; the CPU tier with a host tier). Cache controls
also go through `control(controls)` outside a submission, and `hear_state()` reports residency
per tier. A control sent while a fast-forwarded run is in flight cuts the run (as an arrival does) and
allocates the KV of its steps already started at once, so it is judged and applied on the KV
state stepping would have; a `MaxWait` deadline cuts a run the same way.

Examples:
    >>> from maserve_prefect.clock.kernel import Kernel
    >>> from maserve_prefect.protocol.requests import Request
    >>> from maserve_prefect.engines.sim.cost.step_cost import DecodeAffine, StepCost
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

from maserve_prefect.clock import URGENT, Clock
from maserve_prefect.engines.sim.context import context_length_error
from maserve_prefect.engines.sim.cost.step_cost import StepCostModel
from maserve_prefect.engines.sim.hear.side import ResidencyFeed, SimHear
from maserve_prefect.engines.sim.kv.host_tier import HostTierConfig
from maserve_prefect.engines.sim.kv.manager import cdiv
from maserve_prefect.engines.sim.kv.probe import ProbeMemo
from maserve_prefect.engines.sim.loop import LogEntry, ReplicaLoop
from maserve_prefect.engines.sim.request import RequestStatus, SimRequest
from maserve_prefect.engines.sim.step.device_share import DeviceShare
from maserve_prefect.engines.sim.step.fast_forward import blocks_held_after, steps_before
from maserve_prefect.engines.sim.step.modes import DEFAULT_MODE_PARAMS, DEFAULT_MODES, ModeParams
from maserve_prefect.engines.sim.step.prefill_run import PrefillRun
from maserve_prefect.engines.sim.step.records import SERIES
from maserve_prefect.engines.sim.step.scheduler import Policy, SchedulerConfig
from maserve_prefect.errors import SimulationError
from maserve_prefect.protocol.capabilities import Capabilities, HearCapabilities
from maserve_prefect.protocol.controls import (
    CachePrepare,
    CacheRelease,
    CacheRetain,
    Control,
    ExecutionMode,
    Force,
    MaxWait,
    OrderingKey,
    Priority,
)
from maserve_prefect.protocol.force import Dropped, Resolution, Unsatisfied
from maserve_prefect.protocol.intents import Intent, IntentMessage
from maserve_prefect.protocol.outcomes import Acceptance, Ticket
from maserve_prefect.protocol.requests import Request
from maserve_prefect.protocol.state import EngineState, Lifecycle, StateReport

__all__ = ["SERIES", "LogEntry", "SimReplica"]


class SimReplica(ReplicaLoop):
    """A simulated vLLM-v1 replica (one deployment, one KV cache).

    Args:
        clock: the kernel (virtual time, deterministic) or a `WallClock` (paced real time).
        cost_model: step-time model (`engines/sim/cost/step_cost.py` seam).
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
        probe_memo: the probe requests' memo (`kv/probe.py`), shared by a pool's replicas so a
            router's prefix question hashes each prompt once (default: this replica's own).
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
        probe_memo: ProbeMemo | None = None,
    ) -> None:
        super().__init__(
            clock, cost_model, num_gpu_blocks, config, name, log, check_invariants, mode_params
        )
        self.deployment = deployment
        self.modes = modes
        self.intents: list[Intent] = []
        self._seq = itertools.count()
        self._accepting = True
        self._closed_reason = ""
        self.pool_lifecycle: Lifecycle | None = None  # set by a Pool while not READY
        self.probe_memo = probe_memo if probe_memo is not None else ProbeMemo()
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
            max_model_len=self.config.max_model_len,
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
                self._protect_at(sreq, sreq.arrival_s + max_wait_s)
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
            >>> from maserve_prefect.clock.kernel import Kernel
            >>> from maserve_prefect.protocol.controls import Force
            >>> from maserve_prefect.protocol.controls import CacheRetain, Tier
            >>> from maserve_prefect.protocol.subjects import ContextRef
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

    def cached_prefix_tokens(self, request: Request) -> int:
        """Prompt tokens of `request` this replica's GPU prefix cache holds now (what its
        admission would hit if it came now, no other request intervening): the prefix-aware
        router's question, answered without changing anything.

        A fast-forwarded run in flight is brought to the state stepping has now first
        (`_materialize`) when the answer could depend on it — its decode blocks may have
        evicted cached blocks — so routing on the answer is the same with fast-forward on or
        off. A zero needs no such care (a run only ever evicts)."""
        probe = self.probe_memo.get(request, self.config.block_size)
        tokens = self.kv.probe_prefix(probe)
        if tokens and self._run is not None:
            self._materialize()
            tokens = self.kv.probe_prefix(probe)
        return tokens

    def subscribe_residency(self) -> ResidencyFeed:
        """A feed of this replica's KV residency changes from now on, starting with what is
        resident now (`hear.side.ResidencyFeed`): the simulator's KV events."""
        return self.hear.subscribe_residency()

    def kv_effect(self, fn: Callable[[], None]) -> None:
        """Run `fn` (a change to pins or the load queue) now, on the KV state stepping would
        have now (`_materialize`)."""
        self._materialize()
        fn()
        self._kick()

    def update(self, request_id: str, controls: Sequence[Control]) -> Resolution:
        """Request-scoped controls for a request already accepted — HEAR's subsequent updates
        (a harness refreshing priorities from residency, a Guard sent after submission).

        Resolved by the force rules as a submission's are; nothing is applied if a requirement
        is unsatisfied. A new `Priority` / `OrderingKey` re-queues the request if it still
        waits (its arrival keeps breaking ties); a `MaxWait` protects it once it has waited that
        long since its arrival (at once if it already has). A request that is not waiting or
        running here (unknown, finished) leaves every control unsatisfied or dropped, naming it.

        Examples:
            >>> from maserve_prefect.clock.kernel import Kernel
            >>> from maserve_prefect.engines.sim.step.scheduler import Policy, SchedulerConfig
            >>> from maserve_prefect.protocol.controls import Priority
            >>> rep = SimReplica(Kernel(), None, num_gpu_blocks=8,  # type: ignore[arg-type]
            ...                  config=SchedulerConfig(policy=Policy.PRIORITY))
            >>> rep.update("nope", [Priority(1)]).dropped[0].reason
            "request 'nope' is not waiting or running on replica-0"
        """
        sreq = self._by_id.get(request_id)
        if sreq is None or sreq.status.is_finished:
            why = f"request {request_id!r} is not waiting or running on {self.name}"
            return Resolution(
                (),
                dropped=tuple(Dropped(c, why) for c in controls if c.force is Force.PREFERENCE),
                unsatisfied=tuple(
                    Unsatisfied(c, why) for c in controls if c.force is not Force.PREFERENCE
                ),
            )
        self._materialize()  # the new order applies from now on, as under stepping
        res = self.hear.resolve(controls, request_scoped=True)
        if sreq.status is RequestStatus.RUNNING:
            res = _without_order(res, f"request {request_id!r} already runs on {self.name}")
        if res.unsatisfied:
            return res
        prio = res.honoured_of(Priority)
        keys = res.honoured_of(OrderingKey)
        if sreq.seq not in self.scheduler.by_seq:  # accepted, arriving this instant
            if prio:
                sreq.priority = prio[-1].value
            if keys:
                sreq.ordering_key = keys[-1].key
        elif prio or keys:
            self.scheduler.reprioritize(
                sreq, prio[-1].value if prio else None, keys[-1].key if keys else None
            )
        waits = res.honoured_of(MaxWait)
        if waits:
            self._protect_at(sreq, sreq.arrival_s + waits[-1].max_wait_s)
        self._kick()
        return res

    def _protect_at(self, sreq: SimRequest, t: float) -> None:
        """Protect `sreq` at `t` (now, if `t` has passed; at its arrival if it has not
        arrived yet, as a `MaxWait` of 0 sent with the submission is)."""
        if t <= self.clock.now():
            if sreq.seq not in self.scheduler.by_seq:
                sreq.protected = True
                return
            self._protect(sreq)
            return
        self.clock.call_at(t, lambda: self._protect(sreq), URGENT, f"max_wait {sreq.seq}")

    def _protect(self, sreq: SimRequest) -> None:
        if sreq.status.is_finished:
            return
        if self._run is not None:
            self._truncate_run()
        self.scheduler.protect(sreq)
        self._kick()

    def inform(self, intent: Intent | IntentMessage) -> None:
        """Record an intent (seam `Intent`s in `intents`, typed HEAR intents on the HEAR side).
        An intent never commands: the only one the replica reads, a `ContinuationIntent`,
        informs which blocks it evicts first when it must evict (`hear.side.SimHear.inform`)."""
        if isinstance(intent, Intent):
            self.intents.append(intent)
        else:
            self.hear.inform(intent)

    def state(self) -> EngineState:
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
            lifecycle=self.lifecycle,
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

    def share_devices(self, share: DeviceShare, devices: tuple[str, ...]) -> None:
        """Run this replica's steps on `devices`, sharing their compute with the other replicas
        there (`step/device_share.py`: processor sharing; a replica alone is unchanged)."""
        self._hx.lane = share.lane(self.name, devices, self._truncate_run)

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
    def lifecycle(self) -> Lifecycle:
        """The pool's lifecycle while it holds the replica out of service (loading, asleep,
        unloading), else PAUSED, READY or DRAINING from the replica's own state."""
        if self.pool_lifecycle is not None:
            return self.pool_lifecycle
        if self._paused:
            return Lifecycle.PAUSED
        return Lifecycle.READY if self._accepting else Lifecycle.DRAINING

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
            return context_length_error(
                self.config.max_model_len, request.num_prompt(), request.max_tokens
            )
        need = cdiv(total - 1, self.config.block_size)
        if need > self.kv.num_blocks:
            return (
                f"needs {need} KV blocks but {self.name} has {self.kv.num_blocks}; "
                "it could never run here"
            )
        return ""


def _without_order(res: Resolution, why: str) -> Resolution:
    """`res` with its `Priority` / `OrderingKey` controls taken out (dropped if preferred,
    unsatisfied if required): a running request's place in the waiting order is moot."""
    moot = [c for c in res.honoured if isinstance(c, Priority | OrderingKey)]
    if not moot:
        return res
    return Resolution(
        tuple(c for c in res.honoured if not isinstance(c, Priority | OrderingKey)),
        res.fallbacks,
        res.dropped + tuple(Dropped(c, why) for c in moot if c.force is Force.PREFERENCE),
        res.unsatisfied
        + tuple(Unsatisfied(c, why) for c in moot if c.force is not Force.PREFERENCE),
    )
