"""Modeled execution modes: kv_budget holds fewer blocks and decodes faster, sparse_attention
decodes faster with the same blocks, prefill is unchanged, realized modes are recorded."""

from __future__ import annotations

import pytest
from sim_factories import LinearCost

from maserve_prefect.clock.kernel import Kernel
from maserve_prefect.engines.sim.replica import SimReplica
from maserve_prefect.engines.sim.step.modes import (
    DEFAULT_MODE_PARAMS,
    ModeKind,
    ModeParams,
    decode_context,
    kv_keep_tokens,
    mode_kind,
)
from maserve_prefect.engines.sim.step.scheduler import SchedulerConfig
from maserve_prefect.errors import ConfigError
from maserve_prefect.protocol.controls import ExecutionMode, Force
from maserve_prefect.protocol.outcomes import Outcome
from maserve_prefect.protocol.requests import Request

PARAMS = ModeParams(kv_budget_tokens=64, recent_window_tokens=16, attention_fraction=0.25)
PROMPT, OUT = 512, 64


def run_one(mode: str | None) -> tuple[Outcome, int]:
    """One request in `mode` on an idle replica; its outcome and the free blocks mid-decode."""
    k = Kernel()
    cost = LinearCost(per_token_s=0.0005, per_context_s=2e-5, overhead_s=0.002)
    rep = SimReplica(k, cost, 64, SchedulerConfig(), check_invariants=True, mode_params=PARAMS)
    request = Request("r", "", num_prompt_tokens=PROMPT, max_tokens=OUT)
    controls = [] if mode is None else [ExecutionMode(mode, force=Force.REQUIREMENT)]
    ticket = rep.submit(request, controls)
    assert ticket.accepted, ticket.reason
    free: list[int] = []

    def probe(t: float) -> None:  # 30 ms into decode
        k.call_at(t + 0.03, lambda: free.append(rep.state().num_free_blocks))

    ticket.on_first_token(probe)
    k.run()
    assert ticket.outcome is not None and len(free) == 1
    return ticket.outcome, free[0]


def tpot(out: Outcome) -> float:
    assert out.first_token_s is not None
    return (out.finish_s - out.first_token_s) / (out.num_output_tokens - 1)


def test_kv_budget_holds_fewer_blocks_and_decodes_faster_than_dense() -> None:
    dense, dense_free = run_one(None)
    budget, budget_free = run_one("kv_budget")
    held_dense, held_budget = 64 - dense_free, 64 - budget_free
    assert held_budget == -(-kv_keep_tokens(PROMPT, OUT, PARAMS) // 16) == 5
    assert held_dense >= PROMPT // 16
    assert tpot(budget) < tpot(dense)
    assert budget.first_token_s == dense.first_token_s  # prefill unchanged
    assert budget.realized_mode == "kv_budget" and dense.realized_mode == "default"
    assert any("kv_budget" in n for n in budget.notes)


def test_sparse_attention_decodes_faster_and_holds_the_same_blocks() -> None:
    dense, dense_free = run_one(None)
    sparse, sparse_free = run_one("sparse_attention")
    assert sparse_free == dense_free
    assert tpot(sparse) < tpot(dense)
    assert sparse.first_token_s == dense.first_token_s
    assert sparse.realized_mode == "sparse_attention"


def test_dense_mode_runs_exactly_as_the_default() -> None:
    dense, _ = run_one("dense")
    default, _ = run_one(None)
    assert (dense.first_token_s, dense.finish_s) == (default.first_token_s, default.finish_s)
    assert dense.realized_mode == "dense"


def test_an_unknown_mode_falls_back_as_allowed_and_says_so() -> None:
    rep = SimReplica(Kernel(), LinearCost(), 64)
    req = Request("a", "", num_prompt_tokens=8, max_tokens=1)
    turbo = ExecutionMode("turbo", force=Force.REQUIREMENT, fallback=("kv_budget",))
    ticket = rep.submit(req, [turbo])
    assert ticket.accepted and "fell back to 'kv_budget'" in ticket.notes[0]
    assert not rep.submit(
        Request("b", "", num_prompt_tokens=8, max_tokens=1),
        [ExecutionMode("turbo", force=Force.REQUIREMENT)],
    ).accepted


def test_budget_request_preempted_is_compressed_again() -> None:
    k = Kernel()
    rep = SimReplica(
        k, LinearCost(), 40, SchedulerConfig(), check_invariants=True, mode_params=PARAMS
    )
    # a dense request grows until the budget request (admitted second) is preempted
    big = rep.submit(Request("big", "", num_prompt_tokens=400, max_tokens=230))
    small = rep.submit(
        Request("small", "", num_prompt_tokens=200, max_tokens=300), [ExecutionMode("kv_budget")]
    )
    k.run()
    assert big.outcome is not None and small.outcome is not None
    assert small.outcome.num_preemptions >= 1
    compressions = [n for n in small.outcome.notes if n.startswith("kv_budget")]
    assert len(compressions) == small.outcome.num_preemptions + 1


def test_mode_formulas_and_parameters() -> None:
    assert mode_kind("default") is ModeKind.DENSE and mode_kind("kv_budget") is ModeKind.KV_BUDGET
    p = DEFAULT_MODE_PARAMS
    assert kv_keep_tokens(100, 8, p) == 108
    assert decode_context(ModeKind.KV_BUDGET, 5000, 4000, p) == 1024 + 32
    assert decode_context(ModeKind.SPARSE, 1001, 900, p) == 251
    assert decode_context(ModeKind.DENSE, 1001, 900, p) == 1001
    with pytest.raises(ConfigError):
        ModeParams(attention_fraction=0.0)
    with pytest.raises(ConfigError):
        ModeParams(kv_budget_tokens=0)
