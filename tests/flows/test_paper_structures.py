"""The paper's structures, counted against the paper's numbers (issue 16, point 2).

- Spawn (§6.3, Figure 5: "Spawn has four children"): plan -> 4 children -> resume, 6 calls.
- W-DFR, `spawn_fork_join_refinement` (Appendix C.2: "Each W-DFR root executes 13 operations,
  including 11 LLM calls"; "four independent LLM analyses read the same immutable context";
  "the reducer requires all four original branches"): 5 spawn calls, 4 analyses, a reducer
  transform, 2 refinement calls per round and the review transform; 11 calls / 13 ops when the
  critic accepts in round 1.
- The research -> review -> writing Sequence (Appendix G.3: "six operations on their observed
  completion path; their sixteen logical operations overlap across branches"; Figure D.4:
  sixteen model calls): 16 calls, completion path 6.
"""

from __future__ import annotations

from collections import Counter

import pytest
from maserve_prefect.flows.native import run_native

from maserve_prefect.metrics.graph import root_graph_stats
from maserve_prefect.metrics.path import path_ledger
from maserve_prefect.trace.model import EdgeKind, OpKind, OpRecord

pytestmark = pytest.mark.usefixtures("prefect_api")


def _per_root(ops: list[OpRecord]) -> dict[str, list[OpRecord]]:
    roots: dict[str, list[OpRecord]] = {}
    for op in ops:
        roots.setdefault(op.root_id, []).append(op)
    return roots


def test_spawn_has_four_children() -> None:
    run = run_native("spawn", users=3, seed=2)
    assert [r.error for r in run.roots] == [None] * 3
    for root_id, ops in _per_root(run.trace.ops).items():
        calls = [op for op in ops if op.kind is OpKind.MODEL]
        children = [op for op in calls if op.role == "researcher"]
        assert len(calls) == 6 and len(children) == 4, root_id
        stats = root_graph_stats(run.trace, root_id)
        assert (stats.depth, stats.antichain_width) == (3, 4)


def test_w_dfr_has_four_analyses_and_the_papers_eleven_calls() -> None:
    run = run_native("spawn_fork_join_refinement", users=8, seed=0)
    assert [r.error for r in run.roots] == [None] * 8
    round_one = 0
    for root_id, ops in _per_root(run.trace.ops).items():
        kinds = Counter(op.kind for op in ops)
        analysts = [op for op in ops if op.role == "analyst"]
        assert len(analysts) == 4, root_id
        # the four analyses read the same context (the spawn's output) and nothing else
        sources = {tuple(sorted(d.op_id for d in a.deps)) for a in analysts}
        assert len(sources) == 1
        reducer = next(o for o in ops if o.kind is OpKind.TRANSFORM and "analyze" in o.stage_id)
        assert {d.op_id for d in reducer.deps} == {a.op_id for a in analysts}
        assert all(d.kind is EdgeKind.DATA for d in reducer.deps)
        rounds = max(op.round for op in ops if op.role == "writer")
        assert kinds[OpKind.MODEL] == 9 + 2 * rounds, root_id
        assert len(ops) == kinds[OpKind.MODEL] + 2  # reducer + review transform
        if rounds == 1:
            assert (kinds[OpKind.MODEL], len(ops)) == (11, 13)
            round_one += 1
    assert round_one > 0  # the paper's realization occurs


def test_research_review_writing_is_the_papers_sixteen_op_sequence() -> None:
    run = run_native("research_review_writing", users=3, seed=1)
    assert [r.error for r in run.roots] == [None] * 3
    paths = {p.root_id: p for p in path_ledger(run.trace)}
    for root_id, ops in _per_root(run.trace.ops).items():
        assert len(ops) == 16 and all(op.kind is OpKind.MODEL for op in ops), root_id
        stats = root_graph_stats(run.trace, root_id)
        assert stats.depth == 6 and stats.antichain_width == 4
        assert len(paths[root_id].segments) == 6  # the observed completion path
        # branches overlap: a section's review waits only for its own research
        by_stage = {op.stage_id.split("/", 1)[1]: op for op in ops}
        for b in "abcd":
            deps = {d.op_id for d in by_stage[f"review_{b}"].deps}
            assert deps == {by_stage[f"research_{b}"].op_id}
