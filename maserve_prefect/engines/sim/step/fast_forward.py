"""Fast-forward of pure-decode runs: `k` decode steps at once, with the result of stepping.

When every running request decodes one token per step, the step time is affine in the total
context (`DecodeAffine`), so `k` steps cost `k*base + a*(k*ctx0 + n*k*(k-1)/2)` in closed form.
A run may stand for `k` steps only if nothing that stepping would see happens inside it: every
running request was scheduled, none preempted, the waiting queue is empty or blocked on KV /
seats / budget (which a decode run only tightens), no request finishes before the last step, and
the free blocks cover every block crossing. Events addressed to the replica mid-run (an arrival,
a pause) cut the run to the steps started strictly before them (`steps_before`).
The crossings are then allocated in the exact order stepping would use (step, then running
order), so KV state and eviction order match step-by-step stepping exactly.
"""

from __future__ import annotations

import math

from maserve_prefect.engines.sim.cost.step_cost import DecodeAffine, StepCost
from maserve_prefect.engines.sim.step.scheduler import AdmitStop, Scheduler, SchedulerOutput
from maserve_prefect.errors import SimulationError

_OK_STOPS = (AdmitStop.EMPTY, AdmitStop.KV, AdmitStop.MAX_SEQS, AdmitStop.BUDGET)


def decode_run_length(scheduler: Scheduler, out: SchedulerOutput, now: float) -> int:
    """How many steps (>= 1) starting with `out` can be taken at once; 1 means step normally.

    Only this replica's state bounds the run (completions, free blocks); an arrival or pause
    mid-run truncates it (`steps_before`).
    """
    running = scheduler.running
    if out.preempted or out.admit_stop not in _OK_STOPS or len(out.scheduled) != len(running):
        return 1
    k = 1 << 62
    for req in running:
        n_out = req.num_output_tokens
        if n_out < 1 or req.num_computed_tokens != req.num_prompt_tokens + n_out - 1:
            return 1
        rem = req.request.max_tokens - n_out
        if rem < k:
            k = rem
    return blocks_allow(scheduler, k) if k > 1 else 1


def steps_before(
    t_next: float, now: float, aff: DecodeAffine, ctx0: int, n: int, k_max: int
) -> int:
    """How many of decode steps 0..k_max-1 start strictly before `t_next` (bisection on the
    closed-form start time `now + j*base + a*(j*ctx0 + n*j*(j-1)/2)`)."""
    if t_next <= now:
        return 1
    if math.isinf(t_next):
        return k_max

    def start(j: int) -> float:
        ctx = j * ctx0 + n * j * (j - 1) // 2
        return now + aff.base_s * j + aff.attention_per_context_token_s * ctx

    lo, hi = 1, k_max  # start(0) = now < t_next
    while lo < hi:
        mid = (lo + hi + 1) // 2
        lo, hi = (mid, hi) if start(mid - 1) < t_next else (lo, mid - 1)
    return lo


def _extra_blocks(scheduler: Scheduler, num_steps: int) -> int:
    """Blocks steps 1..num_steps-1 of a decode run add to what the running requests hold."""
    kv = scheduler.kv
    bs = kv.block_size
    req_blocks = kv.req_blocks
    extra = 0
    for r in scheduler.running:
        need = -(-(r.num_computed_tokens + num_steps) // bs) - len(req_blocks.get(r.seq, ()))
        if need > 0:
            extra += need
    return extra


def blocks_held_after(scheduler: Scheduler, num_steps: int) -> int:
    """Blocks a decode run starting now takes from the free queue once `num_steps` steps have
    started (step 0 is allocated already); the KV view inside a fast-forwarded run."""
    return _extra_blocks(scheduler, num_steps) if num_steps > 1 else 0


def blocks_allow(scheduler: Scheduler, k_max: int) -> int:
    """Largest k <= k_max whose block crossings fit the free blocks (step 0 is allocated)."""
    free = scheduler.kv.num_free_blocks
    if _extra_blocks(scheduler, k_max) <= free:
        return k_max
    lo, hi = 1, k_max
    while lo < hi:
        mid = (lo + hi + 1) // 2
        lo, hi = (mid, hi) if _extra_blocks(scheduler, mid) <= free else (lo, mid - 1)
    return lo


def allocate_run(scheduler: Scheduler, k: int) -> None:
    """Allocate (and hash) steps 1..k-1's slots as stepping would: by step, then running order.

    Block crossings take free blocks in that order in one pop. Blocks a decode run fills hold
    output tokens, so their hashes are the request's own and cannot collide with any cached
    block: hashing them all at the end gives the state stepping gives. After a preemption a
    request recomputes blocks it had cached, so then every crossing is replayed one by one.
    """
    kv = scheduler.kv
    bs = kv.block_size
    running = scheduler.running
    if any(req.num_preemptions for req in running):
        _allocate_run_stepwise(scheduler, k)
        return
    req_blocks = kv.req_blocks
    events: list[tuple[int, int]] = []
    for idx, req in enumerate(running):
        # the m-th extra block is needed from step (held + m - 1) * bs - c on
        c = req.num_computed_tokens
        events.extend((j, idx) for j in range(len(req_blocks[req.seq]) * bs - c, k, bs))
    if events:
        events.sort()
        kv.append_blocks([running[idx] for _, idx in events])
    for req in running:
        kv.hash_full_blocks(req, req.num_computed_tokens + k)


def _allocate_run_stepwise(scheduler: Scheduler, k: int) -> None:
    kv = scheduler.kv
    bs = kv.block_size
    running = scheduler.running
    events: list[tuple[int, int]] = []
    for idx, req in enumerate(running):
        c = req.num_computed_tokens
        # step j writes token c+j: it needs a new block when c+j is a multiple of bs, and the
        # block fills (gets hashed) when c+j+1 is; other steps change nothing in the KV cache.
        for first in sorted({(-c) % bs, (-c - 1) % bs}):
            events.extend((j, idx) for j in range(first or bs, k, bs))
    events.sort()
    for j, idx in events:
        req = running[idx]
        if kv.ensure(req, req.num_computed_tokens + j + 1) is None:
            raise SimulationError("fast-forward ran out of KV blocks (blocks_allow was wrong)")


def run_cost(aff: DecodeAffine, ctx0: int, k: int) -> StepCost:
    """Summed cost of k decode steps of `aff.num_seqs` sequences starting at context `ctx0`."""
    ctx_sum = k * ctx0 + aff.num_seqs * k * (k - 1) // 2
    attention_s = aff.attention_per_context_token_s * ctx_sum
    return StepCost(aff.linear_s * k, attention_s, aff.lm_head_s * k, aff.overhead_s * k)
