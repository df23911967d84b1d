"""SLO attainment, task goodput, the drain-inclusive timely rate and the sustainable load λ*.

The contracts are the seed paper's (Appendix C.1–C.3), stated once here:

- **Measurement window** `[0, T)`: a *declared* period, fixed before the run from the offered
  load, never derived from the realized arrivals. The paper uses `T = max(600, 8 / λ_min)` s for a
  rate sweep whose cells share one window (C.2, `sweep_window_s`) and `T = max(180, 24 / λ)` s per
  rate when each load has its own window (C.3, `rate_window_s`). Roots *arriving* in `[0, T)` are
  the attempted roots; the cohort keeps running through the drain after `T`.
- **attainment** of a class = roots of the class arriving in the window that eventually completed
  with latency ≤ the class deadline (a completion during the drain after `T` counts), divided by
  all roots of the class arriving in the window. Failed and incomplete roots count as attempts.
- **task goodput** (arrival-window goodput) = the same timely-root count over all classes,
  divided by `T`. A finite Poisson cohort may hold more than `λT` roots, so goodput may exceed
  the nominal offered rate.
- **drain-inclusive timely rate** = the same timely-root count divided by `max(T, T_cohort)`,
  `T_cohort` being the window start → the last completion of the cohort (the drain kept in the
  denominator; output TPS uses the same period, `observation_period_s`).
- **λ\\*** = the largest tested load in `Λ_adm` whose `A(λ) ≥ α`, `α = 0.95` by default, where
  `A(λ)` is the *minimum* attainment across every required block and every active class at that
  load, and `Λ_adm` holds the loads passing the completion and backlog guards in *every* block:
  every root completed, at most `MAX_END_BACKLOG` (4) roots remaining at the end of the arrival
  window, and nonpositive backlog growth over the window's second half (`backlog_guards`).

Examples:
    >>> lats = [RootLatency("a", "x", 0.0, RootStatus.COMPLETED, "op", 1.0),
    ...         RootLatency("b", "x", 1.0, RootStatus.COMPLETED, "op", 4.0)]
    >>> attainment(lats, {"x": 2.0}, window=(0.0, 2.0))["x"].attainment
    0.5
    >>> sweep_window_s([0.5, 0.01]), rate_window_s(0.5)
    (800.0, 180.0)
    >>> lambda_star([LoadResult(1.0, {"x": 1.0}), LoadResult(2.0, {"x": 0.9})])
    1.0
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from maserve_prefect.errors import ConfigError
from maserve_prefect.metrics.task import RootLatency, RootStatus

ALPHA = 0.95
"""The paper's attainment target for λ* (C.3: every class in every block attains 0.95)."""

MAX_END_BACKLOG = 4
"""Backlog guard: at most this many roots may remain at the end of the arrival window."""

SWEEP_FLOOR_S, SWEEP_ARRIVALS = 600.0, 8.0
"""`T = max(600, 8 / λ_min)`: the shared window of a rate sweep (paper C.2)."""

RATE_FLOOR_S, RATE_ARRIVALS = 180.0, 24.0
"""`T = max(180, 24 / λ)`: one load's own window (paper C.3)."""

Window = tuple[float, float]


def sweep_window_s(rates: Sequence[float]) -> float:
    """The declared window of a rate sweep whose cells share one `T`: `max(600, 8 / λ_min)`.

    Raises:
        ConfigError: no rate, or a rate that is not positive.

    Examples:
        >>> round(sweep_window_s([0.00677316, 0.01625559, 0.02709266, 0.04334825]), 6)
        1181.132588
    """
    if not rates or min(rates) <= 0:
        raise ConfigError(f"a rate sweep needs positive arrival rates, got {list(rates)}")
    return max(SWEEP_FLOOR_S, SWEEP_ARRIVALS / min(rates))


def rate_window_s(rate: float) -> float:
    """The declared window of one arrival rate: `max(180, 24 / λ)` seconds.

    Examples:
        >>> rate_window_s(1.2), rate_window_s(0.04)
        (180.0, 600.0)
    """
    if rate <= 0:
        raise ConfigError(f"arrival rate must be > 0 roots/s, got {rate}")
    return max(RATE_FLOOR_S, RATE_ARRIVALS / rate)


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


def _check_window(window: Window) -> float:
    start, end = window
    if not end > start:
        raise ConfigError(
            f"measurement window {window} has no length; declare [0, T) with T > 0 "
            "(sweep_window_s / rate_window_s, or the scenario's window.end_s)"
        )
    return end - start


def in_window(r: RootLatency, window: Window | None) -> bool:
    """True when `r` arrived in `[start, end)` (every root when `window` is None)."""
    return window is None or window[0] <= r.arrival_s < window[1]


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
    """True when the root completed (at any time, drain included) with latency ≤ `deadline_s`."""
    lat = r.latency_s
    return r.status is RootStatus.COMPLETED and lat is not None and lat <= deadline_s


def attainment(
    lats: Sequence[RootLatency],
    deadlines: Mapping[str, float],
    *,
    window: Window | None = None,
    default_s: float | None = None,
) -> dict[str, ClassAttainment]:
    """Per-class SLO attainment of the roots arriving in `window` (all roots when None).

    A root arriving in the window that completes during the drain, after the window's end, still
    counts when its latency is within the deadline.

    Args:
        lats: root outcomes (`metrics.task.root_latencies`).
        deadlines: class → deadline in seconds (class = workload_class, else workflow).
        window: the declared `[start_s, end_s)` on arrival time; None takes every root.
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
        if not in_window(r, window):
            continue
        cls = r.workload_class
        if cls not in limits:
            limits[cls] = _deadline(cls, deadlines, default_s)
            counts[cls] = [0, 0]
        counts[cls][0] += 1
        counts[cls][1] += met_deadline(r, limits[cls])
    return {c: ClassAttainment(c, limits[c], n, m) for c, (n, m) in sorted(counts.items())}


def timely_roots(
    lats: Sequence[RootLatency],
    deadlines: Mapping[str, float],
    window: Window,
    default_s: float | None = None,
) -> int:
    """Roots arriving in `window` that eventually met their class deadline (drain included)."""
    per_class = attainment(lats, deadlines, window=window, default_s=default_s)
    return sum(a.num_met for a in per_class.values())


def task_goodput(
    lats: Sequence[RootLatency],
    deadlines: Mapping[str, float],
    *,
    window: Window,
    default_s: float | None = None,
) -> float:
    """Arrival-window goodput: timely roots arriving in `window`, per second of `T`.

    Raises:
        ConfigError: the window has no length, or a class has no deadline.

    Examples:
        >>> lats = [RootLatency("a", "x", 0.0, RootStatus.COMPLETED, "op", 1.0),
        ...         RootLatency("b", "x", 1.0, RootStatus.FAILED, None, None),
        ...         RootLatency("c", "x", 1.5, RootStatus.COMPLETED, "op", 6.0)]
        >>> task_goodput(lats, {"x": 5.0}, window=(0.0, 2.0))  # c finishes in the drain
        1.0
    """
    span = _check_window(window)
    return timely_roots(lats, deadlines, window, default_s) / span


def cohort_end_s(lats: Sequence[RootLatency]) -> float | None:
    """The last completion among `lats` (None when none completed)."""
    done = [r.completed_s for r in lats if r.completed_s is not None]
    return max(done) if done else None


def observation_period_s(window: Window, last_completion_s: float | None) -> float:
    """`max(T, T_cohort)`: the window's length, or window start → the cohort's last completion
    when the drain runs past the window (the period of output TPS and the timely rate).

    Examples:
        >>> observation_period_s((0.0, 10.0), 14.0), observation_period_s((0.0, 10.0), 3.0)
        (14.0, 10.0)
    """
    span = _check_window(window)
    if last_completion_s is None:
        return span
    return max(span, last_completion_s - window[0])


def timely_rate(
    lats: Sequence[RootLatency],
    deadlines: Mapping[str, float],
    *,
    window: Window,
    last_completion_s: float | None = None,
    default_s: float | None = None,
) -> float:
    """Drain-inclusive timely-root rate: timely roots arriving in `window` per second of
    `max(T, T_cohort)`.

    Args:
        last_completion_s: the cohort's last completion (every root of the run, background
            included); None takes `cohort_end_s(lats)`.

    Examples:
        >>> lats = [RootLatency("a", "x", 0.0, RootStatus.COMPLETED, "op", 1.0),
        ...         RootLatency("c", "x", 1.5, RootStatus.COMPLETED, "op", 6.0)]
        >>> timely_rate(lats, {"x": 5.0}, window=(0.0, 2.0))  # 2 timely roots over 6 s
        0.3333333333333333
    """
    end = cohort_end_s(lats) if last_completion_s is None else last_completion_s
    period = observation_period_s(window, end)
    return timely_roots(lats, deadlines, window, default_s) / period


# -- backlog guards and λ* ---------------------------------------------------------------------


def backlog(lats: Sequence[RootLatency], at_s: float, since_s: float = float("-inf")) -> int:
    """Roots that arrived in `[since_s, at_s)` and had not completed by `at_s`.

    Examples:
        >>> lats = [RootLatency("a", "x", 0.0, RootStatus.COMPLETED, "op", 3.0),
        ...         RootLatency("b", "x", 1.0, RootStatus.INCOMPLETE, None, None)]
        >>> backlog(lats, 2.0), backlog(lats, 4.0)
        (2, 1)
    """
    return sum(
        1
        for r in lats
        if since_s <= r.arrival_s < at_s and (r.completed_s is None or r.completed_s > at_s)
    )


@dataclass(frozen=True, slots=True)
class BacklogGuards:
    """Backlog at the end of the arrival window and its growth over the window's second half."""

    end_backlog: int
    growth: int


def backlog_guards(lats: Sequence[RootLatency], window: Window) -> BacklogGuards:
    """The backlog guard figures of the roots arriving in `window = [start, start + T)`.

    `end_backlog` = roots remaining at `start + T`; `growth` = that minus the backlog at
    `start + T/2` (the paper's guards: end backlog ≤ 4, growth ≤ 0).

    Examples:
        >>> lats = [RootLatency("a", "x", 1.0, RootStatus.COMPLETED, "op", 7.0),
        ...         RootLatency("b", "x", 6.0, RootStatus.COMPLETED, "op", 11.0),
        ...         RootLatency("c", "x", 9.0, RootStatus.COMPLETED, "op", 12.0)]
        >>> backlog_guards(lats, (0.0, 10.0))  # at 5 s: a; at 10 s: b, c
        BacklogGuards(end_backlog=2, growth=1)
    """
    span = _check_window(window)
    start, end = window
    at_end = backlog(lats, end, since_s=start)
    at_mid = backlog(lats, start + span / 2.0, since_s=start)
    return BacklogGuards(at_end, at_end - at_mid)


@dataclass(frozen=True, slots=True)
class LoadResult:
    """The outcome of one tested load (arrival rate, users, ...) in one block.

    Attributes:
        load: the tested load.
        attainment: class → attainment (nan for a class without roots in the window).
        completion_ratio: completed roots / roots arriving in the window.
        backlog: roots remaining at the end of the arrival window.
        backlog_growth: backlog at the window's end minus backlog at its midpoint.
    """

    load: float
    attainment: Mapping[str, float]
    completion_ratio: float = 1.0
    backlog: float = 0.0
    backlog_growth: float = 0.0
    notes: Mapping[str, float] = field(default_factory=dict)

    @property
    def min_attainment(self) -> float:
        """Smallest attainment over classes (nan classes, i.e. without roots, are skipped)."""
        vals = [v for v in self.attainment.values() if not np.isnan(v)]
        return min(vals) if vals else float("nan")


def combine_blocks(blocks: Sequence[LoadResult]) -> LoadResult:
    """One load's blocks as one result: each class's *minimum* attainment across blocks, the
    lowest completion ratio, the largest backlog and backlog growth (so every guard and the
    attainment target must hold in every block).

    Raises:
        ConfigError: no blocks, or blocks of different loads.

    Examples:
        >>> combine_blocks([LoadResult(1.0, {"x": 1.0, "y": 0.97}, backlog=1),
        ...                 LoadResult(1.0, {"x": 0.96, "y": float("nan")}, backlog=3)])
        LoadResult(load=1.0, attainment={'x': 0.96, 'y': 0.97}, completion_ratio=1.0, backlog=3, backlog_growth=0.0, notes={})
    """
    if not blocks or len({b.load for b in blocks}) != 1:
        raise ConfigError(
            f"combine_blocks needs blocks of one load, got {[b.load for b in blocks]}"
        )
    classes = sorted({c for b in blocks for c in b.attainment})
    att: dict[str, float] = {}
    for c in classes:
        vals = [b.attainment[c] for b in blocks if c in b.attainment]
        known = [v for v in vals if not np.isnan(v)]
        att[c] = min(known) if known else float("nan")
    return LoadResult(
        blocks[0].load,
        att,
        completion_ratio=min(b.completion_ratio for b in blocks),
        backlog=max(b.backlog for b in blocks),
        backlog_growth=max(b.backlog_growth for b in blocks),
    )


def admissible(
    r: LoadResult,
    min_completion: float = 1.0,
    max_backlog: float = MAX_END_BACKLOG,
    max_backlog_growth: float = 0.0,
) -> bool:
    """True when `r` passes the completion and backlog guards (`r` in `Λ_adm`)."""
    return (
        r.completion_ratio >= min_completion
        and r.backlog <= max_backlog
        and r.backlog_growth <= max_backlog_growth
    )


def passes(
    r: LoadResult,
    alpha: float = ALPHA,
    min_completion: float = 1.0,
    max_backlog: float = MAX_END_BACKLOG,
    max_backlog_growth: float = 0.0,
) -> bool:
    """True when `r` is admissible and its minimum class attainment is ≥ `alpha`."""
    m = r.min_attainment
    return (
        admissible(r, min_completion, max_backlog, max_backlog_growth)
        and not np.isnan(m)
        and m >= alpha
    )


def lambda_star(
    results: Sequence[LoadResult],
    alpha: float = ALPHA,
    *,
    min_completion: float = 1.0,
    max_backlog: float = MAX_END_BACKLOG,
    max_backlog_growth: float = 0.0,
    contiguous: bool = False,
) -> float | None:
    """λ* = max{λ ∈ Λ_adm | A(λ) ≥ α}: the paper's SLO-constrained capacity (C.1).

    Args:
        results: `LoadResult`s in any order; several for one load are its blocks, combined by
            `combine_blocks` (minimum attainment across blocks and classes, every guard in every
            block).
        alpha: attainment target in [0, 1] (0.95).
        min_completion: completion guard (1.0: every root arriving in the window completed).
        max_backlog: roots allowed to remain at the end of the arrival window (4).
        max_backlog_growth: allowed backlog growth over the window's second half (0).
        contiguous: also require every smaller tested load to pass.

    Returns:
        The largest passing load, None when no load passes.

    Raises:
        ConfigError: `alpha` outside [0, 1].

    Examples:
        >>> rs = [LoadResult(1.0, {"x": 0.99}), LoadResult(1.0, {"x": 0.96}),
        ...       LoadResult(2.0, {"x": 1.0}), LoadResult(2.0, {"x": 0.94}),
        ...       LoadResult(3.0, {"x": 1.0}, backlog=5)]
        >>> lambda_star(rs), lambda_star(rs, alpha=0.9)
        (1.0, 2.0)
    """
    if not 0.0 <= alpha <= 1.0:
        raise ConfigError(f"alpha must be in [0, 1], got {alpha}")
    by_load: dict[float, list[LoadResult]] = {}
    for r in results:
        by_load.setdefault(r.load, []).append(r)
    best: float | None = None
    for load in sorted(by_load):
        r = combine_blocks(by_load[load])
        if passes(r, alpha, min_completion, max_backlog, max_backlog_growth):
            best = load
        elif contiguous:
            break
    return best
