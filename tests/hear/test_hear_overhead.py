"""Control-plane overhead recorder: counting and aggregation (never real durations)."""

from __future__ import annotations

import pytest

from maserve_prefect.errors import ConfigError
from maserve_prefect.hear.overhead import Op, OverheadRecorder


class FakeNs:
    """A nanosecond counter that advances by the given steps, one per read."""

    def __init__(self, *steps: int) -> None:
        self.t = 0
        self.steps = list(steps)

    def __call__(self) -> int:
        self.t += self.steps.pop(0)
        return self.t


def test_measure_counts_every_call_and_sums_fake_durations() -> None:
    rec = OverheadRecorder(clock_ns=FakeNs(0, 5, 0, 7, 0, 11))
    for _ in range(2):
        with rec.measure(Op.SCHEDULING_DECISION):
            pass
    with pytest.raises(ValueError), rec.measure(Op.OUTCOME_REPORT):
        raise ValueError("the body failed")
    s = rec.summary()
    assert (s[Op.SCHEDULING_DECISION].count, s[Op.SCHEDULING_DECISION].total_ns) == (2, 12)
    assert (s[Op.OUTCOME_REPORT].count, s[Op.OUTCOME_REPORT].total_ns) == (1, 11)


def test_percentiles_are_nearest_rank_per_operation() -> None:
    rec = OverheadRecorder()
    for ns in range(100, 0, -1):  # 1..100, any order
        rec.add(Op.KV_STATE_UPDATE, ns)
    rec.add(Op.MODE_LOOKUP, 9)
    s = rec.summary()
    kv = s[Op.KV_STATE_UPDATE]
    assert (kv.count, kv.total_ns, kv.p50_ns, kv.p99_ns) == (100, 5050, 50, 99)
    assert kv.mean_ns == pytest.approx(50.5)
    assert (s[Op.MODE_LOOKUP].p50_ns, s[Op.MODE_LOOKUP].p99_ns) == (9, 9)
    rows = rec.rows()
    assert [r["op"] for r in rows] == [Op.KV_STATE_UPDATE, Op.MODE_LOOKUP]
    assert rows[0]["count"] == 100


def test_negative_duration_is_refused() -> None:
    with pytest.raises(ConfigError, match="mode_lookup"):
        OverheadRecorder().add(Op.MODE_LOOKUP, -1)
