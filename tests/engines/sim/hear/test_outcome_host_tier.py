"""HEAR outcomes carry host-tier reuse: a prefix evicted to the simulator's host tier and loaded
back is reported as CPU-cached tokens, and the same run without a host tier reports none."""

from __future__ import annotations

from sim_factories import LinearCost, host_tier, make_replica, prefixed

from maserve_prefect.protocol.messages import Completed, outcome_of, require_completed
from maserve_prefect.protocol.outcomes import Ticket

BLOCK = 16  # tokens per KV block (`prefixed` and the scheduler default)
FLAT = LinearCost(per_token_s=0.0, overhead_s=0.001)
"""1 ms per step, whatever it computes: only the cache accounting matters here."""


def run_turns(host_blocks: int | None, num_gpu_blocks: int = 8) -> list[Completed]:
    """Turns a, b, a2 one after another; on an 8-block GPU b evicts all of a's blocks, and a2
    repeats a's prompt. Returns each turn's HEAR outcome."""
    k, rep = make_replica(num_gpu_blocks, cost=FLAT, host_tier=host_tier(host_blocks, 0.001))
    turns = [prefixed("a", 1, 4), prefixed("b", 100, 8), prefixed("a2", 1, 4)]
    tickets: list[Ticket] = []

    def submit(i: int) -> None:
        t = rep.submit(turns[i])
        assert t.accepted, t.reason
        tickets.append(t)
        if i + 1 < len(turns):
            t.on_done(lambda _o: submit(i + 1))

    k.call_at(0.0, lambda: submit(0))
    k.run()
    return [require_completed(outcome_of(t)) for t in tickets]


def test_a_prefix_loaded_back_from_the_host_tier_is_reported_as_cpu_cached() -> None:
    a, b, a2 = run_turns(host_blocks=16)
    assert (a.cache.num_cached_cpu_tokens, b.cache.num_cached_cpu_tokens) == (0, 0)
    # the lookup hits at most prompt - 1 tokens: 3 of a's 4 blocks, all reloaded from the host
    assert a2.cache.num_prompt_tokens == 4 * BLOCK
    assert a2.cache.num_cached_tokens == a2.cache.num_cached_cpu_tokens == 3 * BLOCK


def test_a_partly_kept_prefix_reports_only_what_the_host_tier_held() -> None:
    # a host tier of 2 blocks keeps a's first two blocks (freed tail first, evicted last)
    *_, a2 = run_turns(host_blocks=2)
    assert a2.cache.num_cached_tokens == a2.cache.num_cached_cpu_tokens == 2 * BLOCK


def test_without_a_host_tier_nothing_is_cpu_cached() -> None:
    *_, a2 = run_turns(host_blocks=None)
    assert (a2.cache.num_cached_tokens, a2.cache.num_cached_cpu_tokens) == (0, 0)


def test_gpu_hits_are_not_counted_as_cpu_cached() -> None:
    # a GPU large enough for both prompts keeps a's blocks: a2 hits them there, not in the host
    *_, a2 = run_turns(host_blocks=16, num_gpu_blocks=64)
    assert (a2.cache.num_cached_tokens, a2.cache.num_cached_cpu_tokens) == (3 * BLOCK, 0)
