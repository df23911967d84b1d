"""Factories for simulator tests: a tiny hand-computable step-cost model, replica, pool and
scheduler builders, and requests.

`LinearCost`: a step costs `per_token_s * M + per_context_s * Σ(new_i * ctx_i) + overhead_s`
(M = scheduled tokens). On an all-decode step of n sequences this is
`per_token_s * n + overhead_s + per_context_s * Σ ctx_i`, which `decode_affine` returns exactly.
Defaults (1 ms per token, 10 ms overhead, no context term) make times easy to compute by hand.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import pytest

from maserve_prefect.clock.kernel import Kernel
from maserve_prefect.engines.sim.cost.step_cost import DecodeAffine, ScheduledChunk, StepCost
from maserve_prefect.engines.sim.kv.host_tier import HostTierConfig
from maserve_prefect.engines.sim.kv.manager import KVCacheManager
from maserve_prefect.engines.sim.loop import LogEntry
from maserve_prefect.engines.sim.pool.sim_pool import Deployment, SimPool
from maserve_prefect.engines.sim.replica import SimReplica
from maserve_prefect.engines.sim.request import SimRequest
from maserve_prefect.engines.sim.step.scheduler import Scheduler, SchedulerConfig
from maserve_prefect.protocol.outcomes import Acceptance, Ticket
from maserve_prefect.protocol.requests import Request


@dataclass(frozen=True, slots=True)
class LinearCost:
    per_token_s: float = 0.001
    per_context_s: float = 0.0
    overhead_s: float = 0.010

    def step_cost(self, chunks: Sequence[ScheduledChunk]) -> StepCost:
        m = sum(c.num_new_tokens for c in chunks)
        att = self.per_context_s * sum(c.num_new_tokens * c.num_context_tokens for c in chunks)
        return StepCost(self.per_token_s * m, att, 0.0, self.overhead_s)

    def decode_affine(self, num_seqs: int) -> DecodeAffine:
        return DecodeAffine(
            num_seqs, self.per_token_s * num_seqs, 0.0, self.overhead_s, self.per_context_s
        )


def make_replica(
    num_blocks: int = 64,
    *,
    cost: LinearCost | None = None,
    kernel: Kernel | None = None,
    log: list[LogEntry] | None = None,
    check: bool = True,
    host_tier: HostTierConfig | None = None,
    **config: object,
) -> tuple[Kernel, SimReplica]:
    """A kernel and one replica "r0" with small explicit KV capacity (block_size 16 unless
    given), checking its invariants after every step unless `check=False`."""
    k = kernel if kernel is not None else Kernel()
    cfg = SchedulerConfig(**config)  # type: ignore[arg-type]
    rep = SimReplica(
        k,
        cost or LinearCost(),
        num_blocks,
        cfg,
        name="r0",
        log=log,
        check_invariants=check,
        host_tier=host_tier,
    )
    return k, rep


def loaded_sim_pool(
    num_devices: int = 1,
    model: str = "Qwen3-0.6B",
    deployment: str = "q",
    gpu: str = "H100",
    max_model_len: int | None = None,
) -> SimPool:
    """A pool of `num_devices` GPUs, each with a loaded replica of `deployment` (`model`), on a
    kernel run until the loads are done (`pool.clock`); `max_model_len` overrides the model's
    context window (vLLM's `--max-model-len`)."""
    k = Kernel()
    pool = SimPool(k, [f"{gpu}:{i}" for i in range(num_devices)])
    scheduler = () if max_model_len is None else (("max_model_len", max_model_len),)
    for device in pool.devices():
        pool.load(Deployment(deployment, model, scheduler=scheduler), device)
    k.run()
    return pool


def host_tier(num_blocks: int | None, block_load_s: float) -> HostTierConfig | None:
    """A host KV tier of `num_blocks` 1000-byte blocks that loads one block in `block_load_s`
    (None for no host tier)."""
    return None if num_blocks is None else HostTierConfig(num_blocks, 1000, 1000 / block_load_s)


def make_scheduler(num_blocks: int = 64, **config: object) -> Scheduler:
    """A bare scheduler over a KV cache of `num_blocks` blocks (config as `SchedulerConfig`)."""
    cfg = SchedulerConfig(**config)  # type: ignore[arg-type]
    return Scheduler(cfg, KVCacheManager(num_blocks, cfg.block_size, cfg.enable_prefix_caching))


def make_sim_request(
    rid: str,
    prompt: int = 0,
    out: int = 1,
    *,
    seq: int,
    block_size: int = 16,
    arrival_s: float = 0.0,
    priority: int = 0,
    token_ids: Iterable[int] | None = None,
) -> SimRequest:
    """A request as the scheduler holds it: `prompt` tokens (or the given token ids, which
    prefix caching can match), `out` outputs, admission sequence `seq`."""
    if token_ids is not None:
        request = Request(rid, "", prompt_token_ids=tuple(token_ids), max_tokens=out)
    else:
        request = Request(rid, "", num_prompt_tokens=prompt, max_tokens=out)
    ticket = Ticket(rid, Acceptance.ACCEPTED)
    return SimRequest(request, seq, arrival_s, priority, block_size, ticket)


def req(rid: str, prompt: int, out: int, **kw: object) -> Request:
    """A length-only request."""
    return Request(rid, "", num_prompt_tokens=prompt, max_tokens=out, **kw)  # type: ignore[arg-type]


def prefixed(
    rid: str, first: int, num_blocks: int, out: int = 1, extra: int = 0, block_size: int = 16
) -> Request:
    """A request whose prompt is `num_blocks` full blocks with prefix hash ids first, first+1,
    ... (plus `extra` unhashed tokens)."""
    return Request(
        rid,
        "",
        num_prompt_tokens=block_size * num_blocks + extra,
        max_tokens=out,
        prefix_block_hashes=tuple(range(first, first + num_blocks)),
        prefix_block_size=block_size,
    )


def finish(k: Kernel, rep: SimReplica, request: Request, controls: tuple = ()) -> Ticket:
    """Submit `request` (it must be accepted) and run the kernel until it is idle."""
    t = rep.submit(request, controls)
    assert t.accepted, t.reason
    k.run()
    return t


def submit_at(k: Kernel, rep: SimReplica, t: float, request: Request) -> None:
    """Submit `request` at virtual time `t`."""
    k.call_at(t, lambda: rep.submit(request))


def assert_log(log: list[LogEntry], expected: list[LogEntry]) -> None:
    """Events, ids and details exactly; times to 1e-12."""
    assert [e[1:] for e in log] == [e[1:] for e in expected]
    assert [e[0] for e in log] == pytest.approx([e[0] for e in expected], abs=1e-12)
