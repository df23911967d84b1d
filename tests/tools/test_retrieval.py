"""Frozen-document retrieval: a deterministic corpus, BM25 ranking, digests in results."""

from __future__ import annotations

import pytest

from maserve_prefect.errors import ConfigError
from maserve_prefect.tools import call_tool
from maserve_prefect.tools.retrieval import (
    DocIndex,
    Document,
    build_stdlib_corpus,
    retrieve,
    stdlib_index,
)


def make_index() -> DocIndex:
    return DocIndex(
        [
            Document("a", "apples and pears grow on trees"),
            Document("b", "pears pears pears everywhere"),
            Document("c", "a long document about trees forests and the many trees of a forest"),
            Document("d", "nothing relevant"),
        ]
    )


def test_bm25_ranks_by_term_weight_and_breaks_ties_by_order() -> None:
    index = make_index()
    assert [h.doc_id for h in index.search("pears", k=4)] == ["b", "a"]
    assert index.search("zebra") == []
    tied = DocIndex([Document("x", "same text"), Document("y", "same text")])
    assert [h.doc_id for h in tied.search("same", k=2)] == ["x", "y"]


def test_digest_changes_with_content() -> None:
    base = make_index().corpus_digest
    assert DocIndex(make_index().documents).corpus_digest == base
    changed = [*make_index().documents[:3], Document("d", "something else")]
    assert DocIndex(changed).corpus_digest != base


def test_bad_inputs_raise_config_error() -> None:
    with pytest.raises(ConfigError, match="empty corpus"):
        DocIndex([])
    with pytest.raises(ConfigError, match="unique"):
        DocIndex([Document("a", "x"), Document("a", "y")])
    with pytest.raises(ConfigError, match="k must be"):
        make_index().search("pears", k=0)


def test_stdlib_corpus_is_deterministic_and_found() -> None:
    first = build_stdlib_corpus()
    assert first == build_stdlib_corpus()
    assert len(first) > 1000
    result = retrieve("greatest common divisor of integers", k=3)
    assert result.hits[0].doc_id == "math.gcd"
    assert result.corpus_digest == stdlib_index().corpus_digest


def test_doc_search_tool_records_digest_and_duration() -> None:
    result = call_tool("doc_search", query="unified diff of two sequences of lines", k=5)
    assert result.ok and result.duration_s >= 0
    assert result.output["corpus_digest"] == stdlib_index().corpus_digest
    assert "difflib.unified_diff" in [h["doc_id"] for h in result.output["hits"]]
