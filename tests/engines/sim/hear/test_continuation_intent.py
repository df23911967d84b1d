"""Session-Aware as the HEAR paper has it: a continuation forecast told as an intent, folded by
the simulated engine into its eviction ranking r = p · e^(−idle / 400 s)."""

from __future__ import annotations

import pytest
from sim_factories import LinearCost, finish, prefixed

from maserve_prefect.clock.kernel import Kernel
from maserve_prefect.engines.sim.hear.side import CONTINUATION_DECAY_S, prompt_block_hashes
from maserve_prefect.engines.sim.replica import SimReplica
from maserve_prefect.errors import RequestError
from maserve_prefect.protocol.intents import ContinuationIntent, Prediction
from maserve_prefect.protocol.subjects import ContextRef


def _survivor(p_a: float, p_b: float, told_b_after_s: float) -> str:
    """Run contexts a and b (4 blocks each) on a 12-block cache, tell their forecasts (b's
    `told_b_after_s` later), then run a 6-block request that needs room; which one stays?"""
    k = Kernel()
    rep = SimReplica(k, LinearCost(per_context_s=1e-5), 12)
    a, b = prefixed("a", 100, 4), prefixed("b", 200, 4)
    finish(k, rep, a)
    rep.inform(ContinuationIntent(ContextRef("a"), Prediction(p_a, "test"),
                                  prompt_block_hashes(a, 16)))  # fmt: skip
    k.call_at(k.now() + told_b_after_s, lambda: None)
    k.run()
    finish(k, rep, b)
    rep.inform(ContinuationIntent(ContextRef("b"), Prediction(p_b, "test"),
                                  prompt_block_hashes(b, 16)))  # fmt: skip
    finish(k, rep, prefixed("c", 300, 6))  # needs 6 + 1 blocks: one context must go
    kept = [name for name, r in (("a", a), ("b", b))
            if all(rep.kv.block_of(h) >= 0 for h in prompt_block_hashes(r, 16))]  # fmt: skip
    assert len(kept) == 1, kept
    return kept[0]


def test_the_likelier_context_is_kept_when_both_are_recent() -> None:
    assert _survivor(0.9, 0.2, told_b_after_s=1.0) == "a"
    assert _survivor(0.2, 0.9, told_b_after_s=1.0) == "b"


def test_recency_outweighs_a_small_edge_in_likelihood() -> None:
    # b was told 400 s later: e^(-400/400) = 0.37, so a needs p_a > p_b / 0.37 to stay
    assert _survivor(0.5, 0.3, told_b_after_s=CONTINUATION_DECAY_S) == "b"
    assert _survivor(0.9, 0.3, told_b_after_s=CONTINUATION_DECAY_S) == "a"


def test_a_forecast_outside_zero_one_is_refused() -> None:
    with pytest.raises(RequestError, match="p_return"):
        ContinuationIntent(ContextRef("x"), Prediction(1.5, "test"))
