"""Control-plane overhead accounting: how much host time HEAR's own operations take.

One idea: every control-plane operation (KV-state update, scheduling decision, mode lookup,
outcome report, or any name a caller picks) is timed with `time.perf_counter_ns` — host CPU time,
not the policy clock — and summarized as count / total / p50 / p99 per operation, so end-to-end
reports can show what the protocol itself costs. Percentiles are nearest-rank over every sample
kept (a run keeps one int per operation call).

Examples:
    >>> rec = OverheadRecorder()
    >>> for ns in (100, 200, 300, 400):
    ...     rec.add(Op.MODE_LOOKUP, ns)
    >>> s = rec.summary()[Op.MODE_LOOKUP]
    >>> s.count, s.total_ns, s.p50_ns, s.p99_ns
    (4, 1000, 200, 400)
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from maserve_prefect.errors import ConfigError


class Op:
    """The standard operation names (any string is accepted)."""

    KV_STATE_UPDATE = "kv_state_update"
    SCHEDULING_DECISION = "scheduling_decision"
    MODE_LOOKUP = "mode_lookup"
    OUTCOME_REPORT = "outcome_report"


@dataclass(frozen=True, slots=True)
class OpStats:
    """One operation's aggregate, in nanoseconds."""

    op: str
    count: int
    total_ns: int
    p50_ns: int
    p99_ns: int

    @property
    def mean_ns(self) -> float:
        return self.total_ns / self.count if self.count else 0.0


class OverheadRecorder:
    """Collects per-operation durations.

    Args:
        clock_ns: the nanosecond counter (default `time.perf_counter_ns`; tests pass a fake).
    """

    __slots__ = ("_clock_ns", "_samples")

    def __init__(self, clock_ns: Callable[[], int] = time.perf_counter_ns) -> None:
        self._clock_ns = clock_ns
        self._samples: dict[str, list[int]] = {}

    def add(self, op: str, duration_ns: int) -> None:
        """Record one operation that took `duration_ns`.

        Raises:
            ConfigError: a negative duration.
        """
        if duration_ns < 0:
            raise ConfigError(f"overhead {op!r}: duration must be >= 0 ns, got {duration_ns}")
        self._samples.setdefault(op, []).append(duration_ns)

    @contextmanager
    def measure(self, op: str) -> Iterator[None]:
        """Time the body as one `op` (recorded even when the body raises)."""
        start = self._clock_ns()
        try:
            yield
        finally:
            self.add(op, self._clock_ns() - start)

    def summary(self) -> dict[str, OpStats]:
        """Per-operation stats, by operation name."""
        return {op: _stats(op, xs) for op, xs in sorted(self._samples.items())}

    def rows(self) -> list[dict[str, float | int | str]]:
        """The summary as plain rows (for report tables)."""
        return [
            {
                "op": s.op,
                "count": s.count,
                "total_ms": s.total_ns / 1e6,
                "p50_us": s.p50_ns / 1e3,
                "p99_us": s.p99_ns / 1e3,
            }
            for s in self.summary().values()
        ]


def _stats(op: str, samples: list[int]) -> OpStats:
    xs = sorted(samples)
    return OpStats(op, len(xs), sum(xs), _rank(xs, 0.50), _rank(xs, 0.99))


def _rank(sorted_xs: list[int], q: float) -> int:
    """Nearest-rank percentile: the smallest sample with at least q of the samples at or below."""
    return sorted_xs[max(0, math.ceil(q * len(sorted_xs)) - 1)]
