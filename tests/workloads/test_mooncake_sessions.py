"""Session inference from Mooncake-format traces, window selection and nested load levels."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from maserve_prefect.errors import ConfigError
from maserve_prefect.workloads.mooncake_sessions import (
    SessionRule,
    infer_sessions,
    load_levels,
    mooncake_load_levels,
    select_window,
)

# (timestamp ms, input_length, output_length, hash_ids) in file order; line numbers are 1-based
ROWS = [
    (0, 700, 5, [1, 2]),  # 1: A starts
    (1000, 800, 5, [10, 11]),  # 2: B starts
    (2000, 1200, 5, [1, 2, 3]),  # 3: A (A's hashes are a proper prefix)
    (3000, 100, 5, [20]),  # 4: C starts
    (4000, 1300, 5, [10, 11, 12]),  # 5: B
    (5000, 1800, 5, [1, 2, 3, 4]),  # 6: A
    (6000, 1900, 5, [30, 31, 32, 33]),  # 7: E starts
    (7000, 600, 5, [30, 99]),  # 8: shares 1 of E's 4 blocks (< 50 %): F starts
    (8000, 2300, 5, [1, 2, 3, 4, 6]),  # 9: A
    (900000, 600, 5, [20, 21]),  # 10: C's tail is 897 s old (> 600 s): D starts at 900 s
]
EXPECTED = {
    "mcs-000001": ["line 1", "line 3", "line 6", "line 9"],
    "mcs-000002": ["line 2", "line 5"],
    "mcs-000004": ["line 4"],
    "mcs-000007": ["line 7"],
    "mcs-000008": ["line 8"],
    "mcs-000010": ["line 10"],
}


def write_trace(path: Path, rows: list[tuple[int, int, int, list[int]]]) -> Path:
    lines = [
        json.dumps({"timestamp": t, "input_length": i, "output_length": o, "hash_ids": h})
        for t, i, o, h in rows
    ]
    path.write_text("\n".join(lines) + "\n")
    return path


@pytest.fixture
def trace(tmp_path: Path) -> Path:
    return write_trace(tmp_path / "t.jsonl", ROWS)


def test_inferred_sessions_on_hand_made_trace(trace: Path) -> None:
    inf = infer_sessions(trace)
    got = {s.session_id: [t.source for t in s.turns] for s in inf.sessions}
    assert got == EXPECTED
    a = inf.session_set.session("mcs-000001")
    assert [t.arrival_s for t in a.turns] == [0.0, 2.0, 5.0, 8.0]
    assert a.turns[2].prefix_block_hashes == (1, 2, 3, 4) and a.turns[2].block_size == 512
    assert inf.session_set.mode == "open"
    assert inf.turns_histogram() == {1: 4, 2: 1, 4: 1}


def test_rule_parameters_change_the_grouping(trace: Path) -> None:
    loose = infer_sessions(trace, SessionRule(max_gap_s=1000.0, min_shared_fraction=0.25))
    got = {s.session_id: len(s.turns) for s in loose.sessions}
    assert got["mcs-000004"] == 2 and got["mcs-000007"] == 2  # D joins C, F joins E
    assert "mcs-000010" not in got and "mcs-000008" not in got


def test_growth_rule_separates_queries_over_one_document(tmp_path: Path) -> None:
    rows = [
        (0, 1500, 50, [1, 2, 3]),
        (1000, 1400, 50, [1, 2, 5]),  # same document, shorter new query
        (2000, 1700, 50, [1, 2, 3, 4]),  # grows past 1500 + 50: the first one's next turn
    ]
    p = write_trace(tmp_path / "g.jsonl", rows)
    plain = infer_sessions(p)
    assert [len(s.turns) for s in plain.sessions] == [3]
    grown = infer_sessions(p, SessionRule(require_growth=True))
    assert {s.session_id: [t.source for t in s.turns] for s in grown.sessions} == {
        "mcs-000001": ["line 1", "line 3"],
        "mcs-000002": ["line 2"],
    }


def test_bad_rows_are_skipped_and_counted(tmp_path: Path) -> None:
    p = tmp_path / "b.jsonl"
    p.write_text(
        '{"timestamp": 0, "input_length": 700, "output_length": 0, "hash_ids": [1, 2]}\n'
        "not json\n"
        '{"timestamp": 5, "input_length": 0, "output_length": 3, "hash_ids": []}\n'
    )
    inf = infer_sessions(p)
    assert (inf.num_rows, inf.num_rejected, inf.num_empty, inf.num_padded_outputs) == (3, 1, 1, 1)
    assert inf.sessions[0].turns[0].num_output_tokens == 1


def test_window_selects_sessions_by_start(trace: Path) -> None:
    sset = infer_sessions(trace).session_set
    win = select_window(sset, 0.0, 900.0)  # D starts at exactly 900 s: outside [0, 900)
    assert [s.session_id for s in win] == sorted(set(EXPECTED) - {"mcs-000010"})
    assert win.meta["window_s"] == 900.0
    late = select_window(sset, 3.0, 900.0)  # C starts at exactly 3 s: inside [3, 903)
    assert [s.session_id for s in late] == ["mcs-000004", "mcs-000007", "mcs-000008", "mcs-000010"]
    with pytest.raises(ConfigError, match="no session starts"):
        select_window(sset, 2000.0)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_load_levels_are_nested_and_deterministic(trace: Path, seed: int) -> None:
    win = select_window(infer_sessions(trace).session_set)
    levels = load_levels(win, seed=seed)
    again = load_levels(win, seed=seed)
    ids = {f: {s.session_id for s in sset} for f, sset in levels.items()}
    assert ids == {f: {s.session_id for s in sset} for f, sset in again.items()}
    assert [len(ids[f]) for f in (0.5, 0.75, 1.0)] == [3, 4, 5]
    assert ids[0.5] < ids[0.75] < ids[1.0] == {s.session_id for s in win}
    assert all(levels[f].content_hash() == again[f].content_hash() for f in levels)
    assert levels[0.5].meta["load_fraction"] == 0.5


def test_load_levels_depend_on_seed(trace: Path) -> None:
    win = infer_sessions(trace).session_set
    halves = {
        frozenset(s.session_id for s in load_levels(win, (0.5,), seed=k)[0.5]) for k in range(8)
    }
    assert len(halves) > 1
    with pytest.raises(ConfigError, match="outside"):
        load_levels(win, (0.0,))


def test_shared_trace_counts(shared_data: Path) -> None:
    path = shared_data / "traces" / "mooncake_synthetic_trace.jsonl"
    inf = infer_sessions(path)
    summary = inf.summary()
    assert (summary["num_sessions"], summary["num_turns"]) == (2226, 3993)
    assert summary["num_multi_turn_sessions"] == 411 and summary["max_turns"] == 24
    hist = inf.turns_histogram()
    assert (hist[1], hist[2], hist[3], hist[24]) == (1815, 79, 69, 2)
    levels = mooncake_load_levels(path, seed=0)
    assert {f: (len(s), s.num_turns) for f, s in levels.items()} == {
        0.5: (1100, 1968),
        0.75: (1650, 2956),
        1.0: (2199, 3954),
    }
    strict = infer_sessions(path, SessionRule(require_growth=True)).summary()
    assert (strict["num_sessions"], strict["num_multi_turn_sessions"]) == (3578, 355)
