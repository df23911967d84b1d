"""SCBench-style generator and the SessionSet file format: determinism, sharing, round trips."""

from __future__ import annotations

from pathlib import Path

import pytest

from maserve_prefect.errors import ConfigError
from maserve_prefect.workloads.scbench import ScbenchConfig, generate_scbench
from maserve_prefect.workloads.sessions import Session, SessionSet, Turn

SMALL = {"context_tokens": (1000, 3000), "num_contexts": 3}


def make_set(n: int = 30, seed: int = 3, **kw: object) -> SessionSet:
    return generate_scbench(n, seed, **{**SMALL, **kw})


def _common(a: tuple[int, ...], b: tuple[int, ...]) -> int:
    i = 0
    while i < min(len(a), len(b)) and a[i] == b[i]:
        i += 1
    return i


def test_same_seed_same_set_other_seed_differs() -> None:
    a, b, c = make_set(seed=3), make_set(seed=3), make_set(seed=4)
    assert a == b and a.content_hash() == b.content_hash() and a.to_jsonl() == b.to_jsonl()
    assert a.content_hash() != c.content_hash()


def test_closed_loop_times() -> None:
    sset = make_set()
    assert sset.mode == "closed"
    starts = [s.turns[0].arrival_s or 0.0 for s in sset]
    assert starts[0] == 0.0 and starts == sorted(starts) and starts[-1] > 0
    for s in sset:
        assert all(t.arrival_s is None and t.think_s is not None for t in s.turns[1:])


def test_shared_contexts_are_shared_across_sessions() -> None:
    sset = make_set()
    ctx_len = sset.meta["context_tokens"]
    by_ctx: dict[str, list[Session]] = {}
    for s in sset:
        by_ctx.setdefault(s.turns[0].source, []).append(s)
    assert len(by_ctx) >= 2 and any(len(v) >= 2 for v in by_ctx.values())
    for src, group in by_ctx.items():
        full = ctx_len[int(src.split()[1])] // 16  # the document's full blocks
        first = group[0].turns[0].prefix_block_hashes
        for other in group[1:]:
            shared = _common(first, other.turns[0].prefix_block_hashes)
            assert full <= shared < len(first)  # whole document shared, queries differ
    heads = {src: g[0].turns[0].prefix_block_hashes[0] for src, g in by_ctx.items()}
    assert len(set(heads.values())) == len(heads)  # different documents share nothing


def test_turn_extends_previous_turn() -> None:
    sset = make_set(mean_turns=4, min_turns=2)
    for s in sset:
        for prev, cur in zip(s.turns, s.turns[1:], strict=False):
            full_prev = prev.num_prompt_tokens // 16
            assert cur.prefix_block_hashes[:full_prev] == prev.prefix_block_hashes[:full_prev]
            assert cur.num_prompt_tokens > prev.num_prompt_tokens + prev.num_output_tokens
            assert len(cur.prefix_block_hashes) == -(-cur.num_prompt_tokens // 16)


def test_multi_request_mode_drops_history() -> None:
    sset = make_set(include_history=False, min_turns=2, mean_turns=3)
    ctx_len = sset.meta["context_tokens"]
    for s in sset:
        ctx = ctx_len[int(s.turns[0].source.split()[1])]
        for t in s.turns:  # every turn is the context plus its own query, no history
            assert 32 <= t.num_prompt_tokens - ctx <= 256
            assert t.prefix_block_hashes[: ctx // 16] == s.turns[0].prefix_block_hashes[: ctx // 16]
        assert s.turns[1].prefix_block_hashes != s.turns[0].prefix_block_hashes


def test_turn_distribution_follows_parameters() -> None:
    sset = generate_scbench(1500, 1, context_tokens=(64, 64), num_contexts=1)
    counts = [len(s.turns) for s in sset]
    assert 4.6 < sum(counts) / len(counts) < 5.3
    assert min(counts) >= 1 and max(counts) <= 10
    thinks = [t.think_s for s in sset for t in s.turns[1:]]
    assert 4.5 < sum(thinks) / len(thinks) < 5.5  # type: ignore[arg-type]


def test_save_load_round_trip_is_byte_identical(tmp_path: Path) -> None:
    sset = make_set()
    p1 = sset.save(tmp_path / "a.jsonl")
    loaded = SessionSet.load(p1)
    assert loaded == sset and loaded.meta == sset.meta
    p2 = loaded.save(tmp_path / "b.jsonl")
    assert p1.read_bytes() == p2.read_bytes()


def test_edited_file_is_refused(tmp_path: Path) -> None:
    p = make_set(n=3).save(tmp_path / "a.jsonl")
    lines = p.read_text().splitlines()
    lines[1] = lines[1].replace('"num_output_tokens":', '"num_output_tokens":1', 1)
    p.write_text("\n".join(lines) + "\n")
    with pytest.raises(ConfigError, match="content hash"):
        SessionSet.load(p)


def test_bad_inputs_are_refused() -> None:
    with pytest.raises(ConfigError, match="parameters are"):
        generate_scbench(2, 0, no_such=1)
    with pytest.raises(ConfigError, match="mean_turns"):
        ScbenchConfig(mean_turns=20)
    with pytest.raises(ConfigError, match="do not cover"):
        Turn(0, 100, 1, (1,), 16, arrival_s=0.0)
    t = Turn(0, 10, 1, arrival_s=0.0)
    with pytest.raises(ConfigError, match="twice"):
        SessionSet((Session("a", (t,)), Session("a", (t,))))
    with pytest.raises(ConfigError, match="think_s"):
        SessionSet((Session("a", (t, Turn(1, 10, 1, arrival_s=1.0))),), mode="closed")
