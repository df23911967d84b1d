"""The bindings' natural lengths against the paper's stated demand population (issue 16).

- App. G.5: the fixed 64-root population (62 Loop roots over the target bindings, one Spawn,
  one Fork–Join) generates 2,622 output and 689 input tokens per call ("three blocks of 134
  calls with input/output totals 92,409/352,227, ..."). A reduced realization (three Loop roots
  per binding, each standing for its share of the 62) must come within ±25 % of both.
- The serving limit: no call's input + output exceeds the max model length (8,192 on the 910C
  pool); an output that would is capped there (vLLM's "length" finish), never refused — on a
  pool with a short model length too.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from maserve_prefect.flows.native import run_native

from maserve_prefect.bench.replay import demand_population as dp
from maserve_prefect.engines.poolfile import PoolFile, load_pool_file
from maserve_prefect.trace.model import OpKind

pytestmark = pytest.mark.usefixtures("prefect_api")

POOL = Path(__file__).resolve().parents[2] / "deployments/suites/scenarios/pool_910c_qwen3_8b.yaml"
TOLERANCE = 0.25
"""Realized per-call means within ±25 % of the paper's (a 11-root realization of 64 roots)."""


def _calls(pool: PoolFile, cohort: dp.Cohort) -> list[list[dp.Call]]:
    run = run_native(cohort.workflow, cohort.binding, users=cohort.users, seed=0, pool=pool)
    assert [r.error for r in run.roots] == [None] * cohort.users
    roots: dict[str, list[dp.Call]] = {}
    for op in run.trace.ops:
        if op.kind is OpKind.MODEL:
            roots.setdefault(op.root_id, []).append((op.num_input_tokens, op.num_output_tokens))
    return list(roots.values())


def _every_deployment(pool: PoolFile, **update: object) -> PoolFile:
    """`pool` with `update` applied to each of its deployments."""
    deployments = tuple(d.model_copy(update=update) for d in pool.deployments)
    return pool.model_copy(update={"deployments": deployments})


def test_g5_population_matches_the_papers_tokens_per_call() -> None:
    pool = load_pool_file(POOL)
    realized = {c: _calls(pool, c) for c in dp.g5_cohorts(3)}
    stats = dp.weighted_stats(realized)
    assert abs(stats.output_mean / dp.PAPER_G5_OUTPUT_PER_CALL - 1) <= TOLERANCE, stats
    assert abs(stats.input_mean / dp.PAPER_G5_INPUT_PER_CALL - 1) <= TOLERANCE, stats
    # outputs are several times inputs (the paper's 3.8x): thinking is generated, not delivered
    assert stats.output_mean > 2.5 * stats.input_mean
    assert stats.max_context <= dp.PAPER_MAX_MODEL_LEN


def test_an_overlong_output_is_capped_at_the_context_left_not_refused() -> None:
    short = 3072
    pool = _every_deployment(load_pool_file(POOL), max_model_len=short)
    calls = [c for r in _calls(pool, dp.Cohort("refinement_loop", "research", 3, 3)) for c in r]
    assert all(i + o <= short for i, o in calls)
    assert any(i + o == short for i, o in calls)  # the research writer's drafts hit the cap


def test_a_deployments_output_budget_caps_every_call() -> None:
    # The pool file's `max_tokens` is the budget a harness sets (GPT Researcher's 2,048 tokens):
    # drawn lengths above it are cut to it, shorter ones are left as drawn.
    base = load_pool_file(POOL)
    budget = 1024
    pool = _every_deployment(base, max_tokens=budget)
    unbudgeted = [
        o for r in _calls(base, dp.Cohort("refinement_loop", "research", 3, 3)) for _, o in r
    ]
    outs = [o for r in _calls(pool, dp.Cohort("refinement_loop", "research", 3, 3)) for _, o in r]
    assert max(unbudgeted) > budget  # the binding draws longer outputs than the budget
    assert max(outs) == budget and all(o <= budget for o in outs)
    assert min(outs) < budget  # not every call is cut: a shorter draw stays as drawn
