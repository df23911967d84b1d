"""vLLM v1's scheduling step as a step function: `schedule() -> SchedulerOutput`, then
`update_from_output(output)`.

One step: first the running requests in order, each given `num_tokens - num_computed_tokens`
tokens (capped by `long_prefill_token_threshold` and the remaining token budget); a request whose
slots cannot be allocated preempts a victim (FCFS: the last running; priority: max
`(priority, arrival)`) by recomputation until it fits or is itself the victim. Then, only if no
one was preempted this step, waiting requests are admitted in queue order (FCFS deque, or a heap
on `(priority, arrival, seq)`) while the budget lasts and fewer than `max_num_seqs` run; a prefix
lookup precedes the first allocation, and the first request that cannot allocate blocks everyone
behind it (head-of-line blocking). The output is a plain record of decisions and never aliases
live state; `update_from_output` advances computed tokens, samples tokens and finishes requests.

HEAR's request-scoped controls (`hear/resolve.py`) change only the waiting order, and leave it as
above while no request uses them: a *protected* request (its `MaxWait` ran out) waits ahead of
every unprotected one, protected ones by arrival (longest wait first); among the unprotected, a
lower `ordering_key` goes first (after priority under the priority policy; the heap key becomes
`(protected?, priority, ordering_key, arrival, seq)`). Under FCFS a request with a key is
inserted behind every waiting request whose key is not larger, so keys all 0 keep arrival
order; preempted requests still go to the front of the unprotected ones (vLLM). The priority
policy's preemption victim is the max of `(priority, ordering_key, arrival, seq)`.

Protection is HEAR's Guard-W requirement: a protected request is neither bypassed (it waits
ahead of every unprotected one) nor preempted — the victim is chosen among the unprotected
running requests (FCFS: the last of them; priority: the max key). Only when every running request
is protected does the one asking for blocks yield. A waiting request's priority and ordering key
can be changed after submission (`reprioritize`, HEAR's subsequent updates): it is re-queued
under its new key, keeping its arrival for ties.
"""

from __future__ import annotations

import heapq
from collections import deque
from dataclasses import dataclass, field
from enum import Enum
from typing import NamedTuple

from maserve_prefect.engines.sim.kv.manager import KVCacheManager
from maserve_prefect.engines.sim.request import RequestStatus, SimRequest
from maserve_prefect.errors import ConfigError, SimulationError

GIB_BYTES = 1 << 30


class Policy(Enum):
    FCFS = "fcfs"
    PRIORITY = "priority"


def default_batch_limits(device_memory_bytes: int, device_name: str = "") -> tuple[int, int]:
    """vLLM's OpenAI-server defaults `(max_num_batched_tokens, max_num_seqs)` for a device.

    Mirrors `EngineArgs.get_batch_defaults` in vllm/engine/arg_utils.py: devices with >= 70 GiB
    that are not an A100 (H100, H200, MI300x) get 8192 / 1024 for `UsageContext.OPENAI_API_SERVER`;
    everything else gets 2048 / 256 (the A100 is excluded because a larger budget lowered its
    throughput, vLLM PR #17885).

    Examples:
        >>> default_batch_limits(80 * GIB_BYTES, "NVIDIA H100 80GB HBM3")
        (8192, 1024)
        >>> default_batch_limits(80 * GIB_BYTES, "NVIDIA A100-SXM4-80GB")
        (2048, 256)
    """
    if device_memory_bytes >= 70 * GIB_BYTES and "a100" not in device_name.lower():
        return 8192, 1024
    return 2048, 256


@dataclass(frozen=True, slots=True)
class SchedulerConfig:
    """Per-replica scheduler settings; defaults are vLLM v1's for a < 70 GiB GPU.

    Use `SchedulerConfig.for_device(memory_bytes, name)` to get the device-class batch limits.
    """

    block_size: int = 16
    max_num_batched_tokens: int = 2048
    max_num_seqs: int = 256
    max_model_len: int = 1 << 20
    long_prefill_token_threshold: int = 0
    enable_prefix_caching: bool = True
    policy: Policy = Policy.FCFS
    fast_forward: bool = True
    fast_forward_prefill: bool = True  # also merge full-budget chunk steps (needs fast_forward)

    def __post_init__(self) -> None:
        if not isinstance(self.policy, Policy):  # a config file names it: "fcfs" / "priority"
            try:
                object.__setattr__(self, "policy", Policy(self.policy))
            except ValueError:
                raise ConfigError(
                    f"SchedulerConfig.policy {self.policy!r}: use one of "
                    f"{[p.value for p in Policy]}"
                ) from None
        for name in ("block_size", "max_num_batched_tokens", "max_num_seqs", "max_model_len"):
            if getattr(self, name) < 1:
                raise ConfigError(f"SchedulerConfig.{name} must be >= 1, got {getattr(self, name)}")
        if self.long_prefill_token_threshold < 0:
            raise ConfigError("SchedulerConfig.long_prefill_token_threshold must be >= 0 (0 = off)")

    @classmethod
    def for_device(
        cls, device_memory_bytes: int, device_name: str = "", **kw: object
    ) -> SchedulerConfig:
        """Config with vLLM's batch limits for this device class (other fields from `kw`)."""
        tokens, seqs = default_batch_limits(device_memory_bytes, device_name)
        kw.setdefault("max_num_batched_tokens", tokens)
        kw.setdefault("max_num_seqs", seqs)
        return cls(**kw)  # type: ignore[arg-type]


def _heap_entry(req: SimRequest) -> tuple[int, int, float, float, int, SimRequest]:
    """Priority-policy heap key: protected first (by arrival), then priority, ordering key,
    arrival, admission sequence."""
    if req.protected:
        return (0, 0, 0.0, req.arrival_s, req.seq, req)
    return (1, req.priority, req.ordering_key, req.arrival_s, req.seq, req)


class AdmitStop(Enum):
    """Why waiting admission stopped (decides whether a decode run may be fast-forwarded)."""

    EMPTY = "empty"
    MAX_SEQS = "max_num_seqs"
    BUDGET = "budget"
    KV = "kv"
    PREEMPTED = "preempted"


class ScheduledItem(NamedTuple):
    """One request's decision in a step (a named tuple: built per scheduled request per step)."""

    request_id: str
    seq: int
    num_computed_before: int
    num_new_tokens: int


@dataclass(slots=True)
class SchedulerOutput:
    """Decisions of one step (copies, never live objects)."""

    scheduled: list[ScheduledItem] = field(default_factory=list)
    admitted: list[str] = field(default_factory=list)
    preempted: list[str] = field(default_factory=list)
    admit_stop: AdmitStop = AdmitStop.EMPTY

    @property
    def num_scheduled_tokens(self) -> int:
        return sum(item.num_new_tokens for item in self.scheduled)


@dataclass(slots=True)
class StepUpdate:
    """What a step produced: first tokens and finished requests, in running order."""

    first_token: list[SimRequest] = field(default_factory=list)
    finished: list[SimRequest] = field(default_factory=list)


class Scheduler:
    """Waiting queue, running list and KV cache of one replica."""

    def __init__(self, config: SchedulerConfig, kv: KVCacheManager) -> None:
        self.config = config
        self.kv = kv
        self._by_priority = config.policy is Policy.PRIORITY  # the config is frozen
        self.running: list[SimRequest] = []
        self._fcfs: deque[SimRequest] = deque()
        self._heap: list[tuple[int, int, float, float, int, SimRequest]] = []
        self.by_seq: dict[int, SimRequest] = {}
        self.num_preemptions_total = 0
        self._just_admitted: set[int] = set()
        self._ordered = False  # FCFS: some request carried an ordering key or protection
        self.num_protected = 0  # protected requests waiting

    # -- queue -----------------------------------------------------------------------------

    @property
    def num_waiting(self) -> int:
        return len(self._heap) if self._by_priority else len(self._fcfs)

    def waiting(self) -> list[SimRequest]:
        """Waiting requests in admission order (a copy)."""
        if self._by_priority:
            return [entry[5] for entry in sorted(self._heap, key=lambda e: e[:5])]
        return list(self._fcfs)

    def add_request(self, req: SimRequest) -> None:
        self.by_seq[req.seq] = req
        if req.ordering_key or req.protected:
            self._ordered = True
        self._push_waiting(req, front=False)

    def _push_waiting(self, req: SimRequest, front: bool) -> None:
        if self._by_priority:
            heapq.heappush(self._heap, _heap_entry(req))
        elif self._ordered:
            self._insert_ordered(req, front)
        elif front:
            self._fcfs.appendleft(req)  # vLLM `prepend_request` for preempted requests
        else:
            self._fcfs.append(req)
        if req.protected:
            self.num_protected += 1

    def _insert_ordered(self, req: SimRequest, front: bool) -> None:
        """FCFS with ordering keys / protection (module docstring)."""
        q = self._fcfs
        n_prot = self.num_protected
        if req.protected:
            i = 0
            while i < n_prot and (q[i].arrival_s, q[i].seq) < (req.arrival_s, req.seq):
                i += 1
        elif front:
            i = n_prot
        else:
            i = len(q)
            while i > n_prot and q[i - 1].ordering_key > req.ordering_key:
                i -= 1
        q.insert(i, req)

    def reprioritize(
        self, req: SimRequest, priority: int | None = None, ordering_key: float | None = None
    ) -> None:
        """A new priority and / or ordering key for `req` (a request already submitted): a
        waiting one is re-queued under its new key; a running one keeps running (the key then
        matters for victim choice and for where it waits if preempted)."""
        if req.status.is_finished:
            return
        waiting = req.status is not RequestStatus.RUNNING
        if waiting:
            self._remove_waiting(req)
        if priority is not None:
            req.priority = priority
        if ordering_key is not None:
            req.ordering_key = ordering_key
            if ordering_key:
                self._ordered = True
        if waiting:
            self._push_waiting(req, front=False)

    def _remove_waiting(self, req: SimRequest) -> None:
        if self._by_priority:
            self._heap = [e for e in self._heap if e[5] is not req]
            heapq.heapify(self._heap)
        else:
            self._fcfs.remove(req)
        if req.protected:
            self.num_protected -= 1

    def protect(self, req: SimRequest) -> None:
        """`req`'s `MaxWait` ran out: it waits ahead of every unprotected request from now on
        (moved now if it is waiting; sticky if it is running and later preempted)."""
        if req.protected or req.status.is_finished:
            return
        waiting = req.status is not RequestStatus.RUNNING
        if waiting:
            self._remove_waiting(req)  # not protected yet: the count is unchanged
        self._ordered = True
        req.protected = True
        if waiting:
            self._push_waiting(req, front=False)

    def _peek_waiting(self) -> SimRequest:
        return self._heap[0][5] if self._by_priority else self._fcfs[0]

    def _pop_waiting(self) -> None:
        if self._by_priority:
            req = heapq.heappop(self._heap)[5]
        else:
            req = self._fcfs.popleft()
        if req.protected:
            self.num_protected -= 1

    def has_work(self) -> bool:
        return bool(self.running) or self.num_waiting > 0

    # -- the step --------------------------------------------------------------------------

    def schedule(self) -> SchedulerOutput:
        """Decide one step (allocating KV slots); see the module docstring for the order."""
        out = SchedulerOutput()
        self._just_admitted = set()
        budget = self.config.max_num_batched_tokens
        scheduled: dict[int, ScheduledItem] = {}
        i = 0
        while i < len(self.running) and budget > 0:
            req = self.running[i]
            num_new = self._cap(req.num_tokens - req.num_computed_tokens, budget)
            while self.kv.allocate(req, num_new) is None:
                victim = self._pick_victim(req)
                if self.running.index(victim) < i:
                    i -= 1
                undone = scheduled.pop(victim.seq, None)
                if undone is not None:
                    budget += undone.num_new_tokens
                self._preempt(victim)
                out.preempted.append(victim.request_id)
                if victim is req:
                    break
            else:
                scheduled[req.seq] = ScheduledItem(
                    req.request_id, req.seq, req.num_computed_tokens, num_new
                )
                budget -= num_new
                i += 1
                continue
            break  # the request preempted itself: nothing more runs this step
        out.admit_stop = (
            self._admit(budget, scheduled) if not out.preempted else AdmitStop.PREEMPTED
        )
        order = {r.seq: n for n, r in enumerate(self.running)}
        out.scheduled = sorted(scheduled.values(), key=lambda it: order[it.seq])
        out.admitted = [it.request_id for it in out.scheduled if it.seq in self._just_admitted]
        assert sum(it.num_new_tokens for it in out.scheduled) <= self.config.max_num_batched_tokens
        return out

    def _cap(self, num_new: int, budget: int) -> int:
        threshold = self.config.long_prefill_token_threshold
        if 0 < threshold < num_new:
            num_new = threshold
        num_new = min(num_new, budget)
        assert num_new > 0, "a scheduled request must compute at least one token"
        return num_new

    def _pick_victim(self, asking: SimRequest) -> SimRequest:
        """The running request to preempt for `asking`'s blocks: never a protected one, unless
        every running request is protected (then `asking` yields)."""
        if self.num_protected_running:
            running = [r for r in self.running if not r.protected]
            if not running:
                return asking
        else:
            running = self.running
        if self._by_priority:
            return max(running, key=lambda r: (r.priority, r.ordering_key, r.arrival_s, r.seq))
        return running[-1]

    @property
    def num_protected_running(self) -> int:
        """Protected requests in the running list (0 without Guard: the usual fast path)."""
        if not self._ordered:
            return 0
        return sum(r.protected for r in self.running)

    def _preempt(self, victim: SimRequest) -> None:
        self.running.remove(victim)
        self.kv.free(victim)
        victim.status = RequestStatus.PREEMPTED
        victim.num_computed_tokens = 0
        victim.num_preemptions += 1
        self.num_preemptions_total += 1
        self._push_waiting(victim, front=True)

    def _admit(self, budget: int, scheduled: dict[int, ScheduledItem]) -> AdmitStop:
        while True:
            if self.num_waiting == 0:
                return AdmitStop.EMPTY
            if budget <= 0:
                return AdmitStop.BUDGET
            if len(self.running) >= self.config.max_num_seqs:
                return AdmitStop.MAX_SEQS
            req = self._peek_waiting()
            hits, num_hit = self.kv.lookup_prefix(req)
            num_new = self._cap(req.num_tokens - num_hit, budget)
            if self.kv.allocate(req, num_new, hits, num_hit) is None:
                return AdmitStop.KV  # head-of-line blocking
            self._pop_waiting()
            if self.config.enable_prefix_caching:
                self.kv.record_lookup(req.num_tokens, num_hit)
            req.num_computed_tokens = num_hit
            if req.num_cached_tokens < 0:
                req.num_cached_tokens = num_hit
            req.status = RequestStatus.RUNNING
            self.running.append(req)
            self._just_admitted.add(req.seq)
            scheduled[req.seq] = ScheduledItem(req.request_id, req.seq, num_hit, num_new)
            budget -= num_new

    def update_from_output(self, out: SchedulerOutput) -> StepUpdate:
        """Advance every scheduled request by its tokens; sample and finish as vLLM does."""
        upd = StepUpdate()
        for item in out.scheduled:
            req = self.by_seq[item.seq]
            req.num_computed_tokens += item.num_new_tokens
            assert req.num_computed_tokens <= req.num_tokens
            if req.num_computed_tokens == req.num_tokens:
                self._sample(req, upd)
        return upd

    def advance_decode(self, num_steps: int) -> StepUpdate:
        """Apply `num_steps` pure-decode steps of every running request at once (fast-forward)."""
        upd = StepUpdate()
        for req in list(self.running):
            req.num_computed_tokens += num_steps
            req.num_output_tokens += num_steps - 1
            assert req.num_computed_tokens == req.num_tokens
            self._sample(req, upd)
        return upd

    def _sample(self, req: SimRequest, upd: StepUpdate) -> None:
        req.num_output_tokens += 1
        if req.num_output_tokens == 1:
            upd.first_token.append(req)
        if req.num_output_tokens >= req.max_tokens:
            self.running.remove(req)
            self.kv.free(req)
            req.status = RequestStatus.FINISHED
            del self.by_seq[req.seq]
            upd.finished.append(req)

    def abort(self, req: SimRequest) -> None:
        """Drop a request wherever it is, freeing its blocks."""
        if req in self.running:
            self.running.remove(req)
        else:
            self._remove_waiting(req)
        self.kv.free(req)
        self.by_seq.pop(req.seq, None)
        req.status = RequestStatus.ABORTED

    # -- checks ----------------------------------------------------------------------------

    def check_invariants(self) -> None:
        """No request both running and waiting; queue states agree; KV blocks conserved."""
        running = {r.seq for r in self.running}
        waiting = [r.seq for r in self.waiting()]
        if len(running) != len(self.running) or len(set(waiting)) != len(waiting):
            raise SimulationError("a request appears twice in the running list or waiting queue")
        if running & set(waiting):
            raise SimulationError("a request is both running and waiting")
        if len(self.running) > self.config.max_num_seqs:
            raise SimulationError("more running requests than max_num_seqs")
        if any(r.status is not RequestStatus.RUNNING for r in self.running):
            raise SimulationError("a request in the running list is not RUNNING")
        if any(self.kv.blocks_of(r) for r in self.waiting()):
            raise SimulationError("a waiting request still holds KV blocks")
        if sum(r.protected for r in self.waiting()) != self.num_protected:
            raise SimulationError("the count of protected waiting requests is off")
        self.kv.check_invariants()
