"""SCBench-sourced context lengths and SCBench's one-context-per-session layout."""

from __future__ import annotations

import pytest

from maserve_prefect.errors import ConfigError
from maserve_prefect.workloads.scbench import SCBENCH_TASKS, generate_scbench


def test_task_table_matches_scbench_totals() -> None:
    assert len(SCBENCH_TASKS) == 12
    assert sum(t.num_sessions for t in SCBENCH_TASKS) == 931  # SCBench's multi-turn sessions
    assert len({t.name for t in SCBENCH_TASKS}) == 12


def test_scbench_lengths_capped_and_one_context_per_session() -> None:
    cap = 125_696
    sset = generate_scbench(40, 3, context_source="scbench", num_contexts=None,
                            max_context_tokens=cap, query_tokens=(8, 8), answer_tokens=(8, 8),
                            mean_turns=2, min_turns=2, max_turns=2)  # fmt: skip
    means = {t.name: t.mean_context_tokens for t in SCBENCH_TASKS}
    tasks, lengths = sset.meta["context_tasks"], sset.meta["context_tokens"]
    assert len(tasks) == len(lengths) == 40
    assert all(n == min(means[t], cap) for t, n in zip(tasks, lengths, strict=True))
    assert max(lengths) == cap and min(lengths) < cap  # long tasks capped, short ones not
    firsts = [s.turns[0].prefix_block_hashes[0] for s in sset]
    assert len(set(firsts)) == 40  # no two sessions share a context
    for s, n in zip(sset, lengths, strict=True):
        assert s.turns[0].num_prompt_tokens == n + 8
        assert s.turns[1].num_prompt_tokens == n + 8 + 8 + 8  # history kept


def test_uniform_default_is_unchanged() -> None:
    # the new options leave the default draws alone (recorded workloads keep their hashes)
    a = generate_scbench(6, 2)
    b = generate_scbench(6, 2, context_source="uniform", max_context_tokens=None)
    assert a.content_hash() == b.content_hash()
    capped = generate_scbench(6, 2, max_context_tokens=9000)
    assert max(capped.meta["context_tokens"]) <= 9000
    assert capped.content_hash() != a.content_hash()


def test_bad_options() -> None:
    with pytest.raises(ConfigError, match="context_source"):
        generate_scbench(2, 0, context_source="longbench")
    with pytest.raises(ConfigError, match="num_contexts"):
        generate_scbench(2, 0, num_contexts=0)
    with pytest.raises(ConfigError, match="max_context_tokens"):
        generate_scbench(2, 0, max_context_tokens=0)
