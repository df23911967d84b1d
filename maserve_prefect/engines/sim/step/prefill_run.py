"""Fast-forward of chunked prefill: consecutive full-budget chunks of one prompt as one run.

When a step schedules a single request whose chunk takes the whole token budget, the next steps
are the same: the budget is spent before anyone else gets a token and before admission looks at
the queue (no lookup, no counter moves), so only this request advances, by the same chunk, until
its prompt is done. Such a run of `k` steps is planned as one kernel event: each step's cost comes
from the cost model exactly as stepping asks for it (`step_cost` on the same chunk, start = the
previous end, the same float additions), so the step boundaries are bit-identical. `k` stops at
the step that completes the prompt (it may be the last step: it samples the first token at the
run's end, as stepping does) or at the last step the free blocks cover (stepping would preempt
there). An arrival or `pause` mid-run cuts it to the steps that started strictly before it, just
as for decode runs.

KV blocks are allocated at the run's end. Nothing else touches this replica's KV cache during the
run, so allocating steps 1..k-1 one by one reproduces stepping exactly; when none of the prompt's
upcoming block hashes is cached anywhere, one allocation up to the last step's tokens pops the
same blocks in the same order and caches the same hashes (no duplicate can arise), so that single
call is used then. The timeline gets one sample per step (KV usage after each step's allocation;
the other series cannot move inside the run), so time-weighted means match stepping; the step
record aggregates the run (`num_steps = k`, one chunk per step: `num_scheduled_tokens` is the
per-step M, `scheduled` carries the run's total tokens).
"""

from __future__ import annotations

from bisect import bisect_left
from dataclasses import dataclass

from maserve_prefect.clock import Cancellable
from maserve_prefect.engines.sim.cost.step_cost import ScheduledChunk, StepCost, StepCostModel
from maserve_prefect.engines.sim.kv.prefix_cache import BlockRange
from maserve_prefect.engines.sim.request import SimRequest
from maserve_prefect.engines.sim.step.scheduler import Scheduler, SchedulerOutput
from maserve_prefect.errors import SimulationError


@dataclass(slots=True)
class PrefillRun:
    """A fast-forwarded run of `k` full-budget chunks of `req` starting at `starts[0]`.

    `k` may shrink (a cut); `starts`, `ends` and `costs` keep the planned steps.
    """

    out: SchedulerOutput
    req: SimRequest
    chunk: int
    ctx0: int  # tokens computed before step 0
    held0: int  # blocks `req` holds once step 0 is allocated
    free0: int  # free blocks once step 0 is allocated
    block_size: int
    starts: list[float]
    ends: list[float]
    costs: list[StepCost]
    k: int
    batched: bool  # allocate steps 1..k-1 in one call (no upcoming hash is cached anywhere)
    handle: Cancellable | None = None
    base_values: tuple[float, ...] = ()  # the timeline series but KV usage, fixed in the run

    def steps_before(self, t_s: float) -> int:
        """Steps of the run (at least 1) that start strictly before `t_s`."""
        return max(1, bisect_left(self.starts, t_s, 0, self.k))

    def blocks_after(self, num_steps: int) -> int:
        """Blocks taken from the free queue beyond step 0's once `num_steps` steps started."""
        need = -(-(self.ctx0 + num_steps * self.chunk) // self.block_size) - self.held0
        return need if need > 0 else 0

    def usage_after(self, num_steps: int, num_blocks: int) -> float:
        """KV usage stepping shows at the end of step `num_steps - 1` (as `kv.usage` computes it)."""
        return 1.0 - (self.free0 - self.blocks_after(num_steps)) / num_blocks

    def total_cost(self) -> StepCost:
        """The run's cost summed by operator group."""
        costs = self.costs[: self.k]
        return StepCost(
            sum(c.linear_s for c in costs),
            sum(c.attention_s for c in costs),
            sum(c.lm_head_s for c in costs),
            sum(c.overhead_s for c in costs),
        )

    def allocate(self, scheduler: Scheduler) -> None:
        """Allocate (and hash) steps 1..k-1's slots as stepping would.

        Raises:
            SimulationError: the blocks ran out (the plan's bound was wrong).
        """
        kv, req, c0, c = scheduler.kv, self.req, self.ctx0, self.chunk
        totals = [c0 + self.k * c] if self.batched else [c0 + j * c for j in range(2, self.k + 1)]
        for total in totals:
            if kv.ensure(req, total, uncached=self.batched) is None:
                raise SimulationError("prefill fast-forward ran out of KV blocks (bound was wrong)")


def plan_prefill_run(
    scheduler: Scheduler, out: SchedulerOutput, now: float, cost_model: StepCostModel
) -> PrefillRun | None:
    """A run of >= 2 full-budget chunk steps starting with `out` (already allocated), or None
    when `out` is not such a step (then it is taken on its own)."""
    if len(out.scheduled) != 1 or out.preempted:
        return None
    item = out.scheduled[0]
    c = item.num_new_tokens
    if c != scheduler.config.max_num_batched_tokens or c < 2:
        return None
    req = scheduler.by_seq[item.seq]
    kv = scheduler.kv
    bs = kv.block_size
    c0 = item.num_computed_before
    held = len(kv.req_blocks[req.seq])
    free = kv.num_free_blocks
    # steps j = 0..k-1 each get c tokens while the prompt has >= c left and the blocks fit
    k = min((req.num_tokens - c0) // c, ((held + free) * bs - c0) // c)
    if k < 2:
        return None
    batched = True
    if kv.enable_prefix_caching:
        first = kv.num_cached_blocks.get(req.seq, 0)
        last = (c0 + k * c) // bs
        if not req.num_preemptions:  # later hashes are the request's own, cached nowhere yet
            last = min(last, req.num_shareable_blocks)
        if last > first:
            batched = not kv.any_cached(BlockRange(req, first, last))
    starts: list[float] = []
    ends: list[float] = []
    costs: list[StepCost] = []
    start = now
    for j in range(k):
        cost = cost_model.step_cost([ScheduledChunk(c, c0 + j * c)])
        end = start + cost.total_s
        starts.append(start)
        ends.append(end)
        costs.append(cost)
        start = end
    return PrefillRun(out, req, c, c0, held, free, bs, starts, ends, costs, k, batched)
