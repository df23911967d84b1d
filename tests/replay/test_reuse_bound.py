"""The infinite-cache reuse bound: exact for one unbounded server, never beaten by a replay."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from sim_factories import loaded_sim_pool

from maserve_prefect.clock.kernel import Kernel
from maserve_prefect.dispatch.routes import ROUTES
from maserve_prefect.engines.sim.cost.step_time import make_step_model
from maserve_prefect.engines.sim.replica import SimReplica
from maserve_prefect.protocol.requests import Request
from maserve_prefect.replay.requests import replay_requests
from maserve_prefect.replay.reuse_bound import reuse_bound
from maserve_prefect.trace.mooncake import import_mooncake

Prompt = tuple[tuple[int, ...], int, int]


@st.composite
def prompts(draw: st.DrawFn) -> list[Prompt]:
    pbs = draw(st.sampled_from([16, 40, 512]))
    out = []
    for _ in range(draw(st.integers(1, 8))):
        hashes = tuple(draw(st.lists(st.integers(0, 2), min_size=1, max_size=6)))
        n = draw(st.integers((len(hashes) - 1) * pbs + 1, len(hashes) * pbs))
        out.append((hashes, pbs, n))
    return out


def test_bound_by_hand() -> None:
    # 2nd request: all 64 blocks cached, capped at 1023 tokens -> 63 blocks; 3rd: block 1 differs
    b = reuse_bound([((1, 2), 512, 1024), ((1, 2), 512, 1024), ((1, 3), 512, 700)], 16)
    assert (b.num_prompt_tokens, b.num_reusable_tokens) == (2748, 63 * 16 + 32 * 16)
    # a shorter request caches part of a prefix block; a longer one reuses just that part
    b = reuse_bound([((5,), 512, 100), ((5,), 512, 512)], 16)
    assert b.num_reusable_tokens == 6 * 16
    assert reuse_bound([((), 0, 50), ((), 0, 50)], 16).fraction == 0.0


@settings(max_examples=40, deadline=None)
@given(prompts())
def test_bound_is_what_one_unbounded_server_reuses(ps: list[Prompt]) -> None:
    """One replica far larger than the prompts, requests one at a time: every request reuses
    exactly the bound's share (so the bound is tight, and the walk follows the simulator's
    block identity), and exactly what the replica's prefix probe said beforehand."""
    k = Kernel()
    rep = SimReplica(k, make_step_model("Qwen3-0.6B", "H100"), 4096, name="r")
    cached = 0
    for i, (hashes, pbs, n) in enumerate(ps):
        req = Request(f"q{i}", "", num_prompt_tokens=n, max_tokens=2,
                      prefix_block_hashes=hashes, prefix_block_size=pbs)  # fmt: skip
        probed = rep.cached_prefix_tokens(req)  # the prefix route's question, asked first
        ticket = rep.submit(req)
        k.run()
        assert ticket.outcome is not None
        assert ticket.outcome.num_cached_tokens == probed
        cached += ticket.outcome.num_cached_tokens
    assert cached == reuse_bound(ps, 16).num_reusable_tokens


@pytest.mark.slow
@pytest.mark.parametrize("route", ROUTES)
def test_replayed_reuse_never_exceeds_the_bound_on_the_shared_trace(
    shared_data: Path, route: str
) -> None:
    trace = import_mooncake(shared_data / "traces" / "mooncake_synthetic_trace.jsonl").trace
    # 307 of its prompts exceed Qwen3-8B's 40,960-token window: serve them on a 1M-token one
    # (as benchmarks/sim_speed.py does) so every request counts toward the bound
    pool = loaded_sim_pool(8, "Qwen3-8B", max_model_len=1 << 20)
    res = replay_requests(trace, pool, "q", route=route)
    assert res.status_counts() == {"completed": len(trace.ops)}
    assert res.bound.fraction == pytest.approx(0.651, abs=5e-4)  # the 65.1 %
    assert 0 < res.prompt_reuse <= res.bound.fraction
    assert res.prefix_hit_rate <= res.bound.fraction
    if route == "prefix":  # placing by cached prefix reuses several times more than by load
        assert res.prompt_reuse > 0.25
