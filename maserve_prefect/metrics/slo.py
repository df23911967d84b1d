"""SLO attainment, arrival-window task goodput and the sustainable load λ*.

The one idea: a root counts for the load that *offered* it, so every SLO figure selects roots by
**arrival** inside a measurement window `[start_s, end_s)` (warm-up and drain excluded by the
caller's choice of window), and a root that failed or never finished counts as a miss.

- **attainment** of a class = roots of that class arriving in the window that completed with
  latency ≤ the class deadline, divided by all roots of the class arriving in the window.
- **task goodput** = roots (all classes) arriving in the window that met their deadline, per
  second of window length.
- **λ\\***: among tested loads whose completion ratio ≥ `min_completion` and backlog ≤
  `max_backlog` (the guards that reject a load the system only "passed" by not finishing its
  work), the largest whose *minimum* class attainment ≥ α. None when no load qualifies. The
  rule looks at each load on its own, not only at a prefix of passing loads; pass `contiguous=True`
  to require every smaller tested load to qualify as well.

Examples:
    >>> lats = [RootLatency("a", "x", 0.0, RootStatus.COMPLETED, "op", 1.0),
    ...         RootLatency("b", "x", 1.0, RootStatus.COMPLETED, "op", 4.0)]
    >>> attainment(lats, {"x": 2.0})["x"].attainment
    0.5
    >>> lambda_star([LoadResult(1.0, {"x": 1.0}), LoadResult(2.0, {"x": 0.8})], alpha=0.9)
    1.0
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from maserve_prefect.errors import ConfigError
from maserve_prefect.metrics.task import RootLatency, RootStatus


@dataclass(frozen=True, slots=True)
class ClassAttainment:
    """One class's roots in the window and how many met the deadline."""

    workload_class: str
    deadline_s: float
    num_roots: int
    num_met: int

    @property
    def attainment(self) -> float:
        """Share of roots that met the deadline (nan for a class with no roots in the window)."""
        return self.num_met / self.num_roots if self.num_roots else float("nan")


def arrival_window(lats: Sequence[RootLatency]) -> tuple[float, float]:
    """`[first arrival, last arrival]` of `lats` (the default measurement window)."""
    if not lats:
        raise ConfigError("no roots: cannot derive an arrival window; pass window=(start, end)")
    arr = np.array([r.arrival_s for r in lats])
    return float(arr.min()), float(arr.max())


def _in_window(r: RootLatency, window: tuple[float, float] | None) -> bool:
    if window is None:
        return True
    start, end = window
    # A zero-length window (every root arrived together) holds exactly its instant.
    return start <= r.arrival_s < end or (start == end == r.arrival_s)


def _deadline(cls: str, deadlines: Mapping[str, float], default_s: float | None) -> float:
    d = deadlines.get(cls, default_s)
    if d is None:
        raise ConfigError(
            f"no SLO deadline for class {cls!r}; known classes {sorted(deadlines)}: add it to "
            "deadlines or pass default_s"
        )
    if d <= 0:
        raise ConfigError(f"deadline for class {cls!r} is {d}; deadlines must be > 0 s")
    return float(d)


def met_deadline(r: RootLatency, deadline_s: float) -> bool:
    """True when the root completed with latency ≤ `deadline_s`."""
    lat = r.latency_s
    return r.status is RootStatus.COMPLETED and lat is not None and lat <= deadline_s


def attainment(
    lats: Sequence[RootLatency],
    deadlines: Mapping[str, float],
    *,
    window: tuple[float, float] | None = None,
    default_s: float | None = None,
) -> dict[str, ClassAttainment]:
    """Per-class SLO attainment of roots arriving in `window` (all roots when None).

    Args:
        lats: root outcomes (`metrics.task.root_latencies`).
        deadlines: class → deadline in seconds (class = workload_class, else workflow).
        window: `[start_s, end_s)` on arrival time; None takes every root.
        default_s: deadline for classes missing from `deadlines`; None makes that an error.

    Raises:
        ConfigError: a class has no deadline, or a deadline is not positive.

    Examples:
        >>> attainment([], {"x": 1.0})
        {}
    """
    counts: dict[str, list[int]] = {}
    limits: dict[str, float] = {}
    for r in lats:
        if not _in_window(r, window):
            continue
        cls = r.workload_class
        if cls not in limits:
            limits[cls] = _deadline(cls, deadlines, default_s)
            counts[cls] = [0, 0]
        counts[cls][0] += 1
        counts[cls][1] += met_deadline(r, limits[cls])
    return {c: ClassAttainment(c, limits[c], n, m) for c, (n, m) in sorted(counts.items())}


def task_goodput(
    lats: Sequence[RootLatency],
    deadlines: Mapping[str, float],
    *,
    window: tuple[float, float] | None = None,
    default_s: float | None = None,
) -> float:
    """Roots arriving in `window` that met their deadline, per second of window length.

    The window defaults to `arrival_window(lats)`.

    Raises:
        ConfigError: the window has no length (e.g. every root arrived at once: pass a window
            covering the offered load's duration), or a class has no deadline.

    Examples:
        >>> lats = [RootLatency("a", "x", 0.0, RootStatus.COMPLETED, "op", 1.0),
        ...         RootLatency("b", "x", 1.0, RootStatus.FAILED, None, None)]
        >>> task_goodput(lats, {"x": 5.0}, window=(0.0, 2.0))
        0.5
    """
    win = window if window is not None else arrival_window(lats)
    span = win[1] - win[0]
    if span <= 0:
        raise ConfigError(
            f"arrival window {win} has no length; pass window=(start_s, end_s) spanning the "
            "period over which the load was offered"
        )
    per_class = attainment(lats, deadlines, window=win, default_s=default_s)
    return sum(a.num_met for a in per_class.values()) / span


@dataclass(frozen=True, slots=True)
class LoadResult:
    """The outcome of one tested load (arrival rate, users, ...)."""

    load: float
    attainment: Mapping[str, float]
    completion_ratio: float = 1.0
    backlog: float = 0.0
    notes: Mapping[str, float] = field(default_factory=dict)

    @property
    def min_attainment(self) -> float:
        """Smallest attainment over classes (nan classes, i.e. without roots, are skipped)."""
        vals = [v for v in self.attainment.values() if not np.isnan(v)]
        return min(vals) if vals else float("nan")


def passes(
    r: LoadResult, alpha: float, min_completion: float = 0.99, max_backlog: float = float("inf")
) -> bool:
    """True when `r` passes both guards and its minimum class attainment is ≥ `alpha`."""
    m = r.min_attainment
    return (
        r.completion_ratio >= min_completion
        and r.backlog <= max_backlog
        and not np.isnan(m)
        and m >= alpha
    )


def lambda_star(
    results: Sequence[LoadResult],
    alpha: float,
    *,
    min_completion: float = 0.99,
    max_backlog: float = float("inf"),
    contiguous: bool = False,
) -> float | None:
    """The largest tested load that passes the guards with minimum class attainment ≥ `alpha`.

    Args:
        results: one `LoadResult` per tested load (any order; loads must be distinct).
        alpha: attainment target in [0, 1].
        min_completion: completion-ratio guard (completed roots / offered roots).
        max_backlog: backlog guard (e.g. roots still queued at the end of the window).
        contiguous: also require every smaller tested load to pass.

    Raises:
        ConfigError: `alpha` outside [0, 1] or a load tested twice.

    Examples:
        >>> rs = [LoadResult(1.0, {"x": 0.99, "y": 0.95}), LoadResult(2.0, {"x": 1.0, "y": 0.9}),
        ...       LoadResult(3.0, {"x": 1.0, "y": 1.0}, completion_ratio=0.5)]
        >>> lambda_star(rs, alpha=0.9), lambda_star(rs, alpha=0.95)
        (2.0, 1.0)
    """
    if not 0.0 <= alpha <= 1.0:
        raise ConfigError(f"alpha must be in [0, 1], got {alpha}")
    loads = [r.load for r in results]
    if len(set(loads)) != len(loads):
        raise ConfigError(f"each load may be tested once; got loads {sorted(loads)}")
    best: float | None = None
    for r in sorted(results, key=lambda r: r.load):
        if passes(r, alpha, min_completion, max_backlog):
            best = r.load
        elif contiguous:
            break
    return best
