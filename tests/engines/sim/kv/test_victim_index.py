"""The incremental host-tier victim order equals a full scan by the retention rule."""

from __future__ import annotations

import doctest
from collections import OrderedDict

from hypothesis import given, settings
from hypothesis import strategies as st

from maserve_prefect.engines.sim.kv import victim_index
from maserve_prefect.engines.sim.kv.retention import HARD, NONE, SOFT
from maserve_prefect.engines.sim.kv.victim_index import VictimIndex


def test_doctests() -> None:
    assert doctest.testmod(victim_index).failed == 0


def scan(lru: OrderedDict[int, None], levels: dict[int, tuple[int, float]], n: int) -> list[int]:
    """The rule by a full scan: unpinned oldest first, then soft by (priority, age)."""
    loose = [h for h in lru if levels.get(h, (NONE, 0.0))[0] == NONE]
    soft = [
        (levels[h][1], i, h) for i, h in enumerate(lru) if levels.get(h, (NONE, 0.0))[0] == SOFT
    ]
    return (loose + [h for _, _, h in sorted(soft)])[:n]


op = st.one_of(
    st.tuples(st.just("store"), st.lists(st.integers(0, 30), min_size=1, max_size=6)),
    st.tuples(st.just("remove"), st.lists(st.integers(0, 30), min_size=1, max_size=4)),
    st.tuples(st.just("pin"), st.lists(st.tuples(st.integers(0, 30), st.sampled_from(
        [NONE, SOFT, SOFT, HARD]), st.sampled_from([0.1, 0.5, 0.9])), min_size=1, max_size=6)),
    st.tuples(st.just("victims"), st.integers(1, 8)),
)  # fmt: skip


@settings(max_examples=300, deadline=None)
@given(st.lists(op, max_size=60))
def test_index_matches_the_scan_after_any_changes(ops: list) -> None:  # type: ignore[type-arg]
    levels: dict[int, tuple[int, float]] = {}
    lru: OrderedDict[int, None] = OrderedDict()
    idx = VictimIndex(lambda h: levels.get(h, (NONE, 0.0)))
    idx.build(lru)
    for kind, arg in ops:
        if kind == "store":
            for h in arg:
                lru[h] = None
                lru.move_to_end(h)
            idx.stored(arg)
        elif kind == "remove":
            gone = [h for h in dict.fromkeys(arg) if h in lru]
            for h in gone:
                del lru[h]
            idx.removed(gone)
        elif kind == "pin":
            for h, level, prio in arg:
                levels[h] = (level, prio)
            idx.repinned([h for h, _, _ in arg])
        else:
            want = scan(lru, levels, arg)
            assert idx.evict(arg) == want
            for h in want:  # evicted: out of the index, the caller drops them
                del lru[h]
            assert len(idx) == len(lru)
    assert idx.evict(len(lru) + 1) == scan(lru, levels, len(lru) + 1)
