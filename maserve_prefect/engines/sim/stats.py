"""Percentile summaries and time-weighted means for simulator results (numpy, no loops).

One idea: a latency metric is summarized by count, mean and the p50 / p90 / p99 / max of its
samples (numpy's default linear interpolation); a step-function series (a Prometheus gauge sampled
at changes) is summarized by its time-weighted mean and maximum over a window, holding its value
before the first sample at `initial`.

Examples:
    >>> s = summarize([1.0, 2.0, 3.0, 4.0])
    >>> s.count, s.p50, s.max
    (4, 2.5, 4.0)
    >>> time_weighted_mean([1.0, 3.0], [0.5, 1.0], 0.0, 5.0)
    0.6
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass

import numpy as np

from maserve_prefect.errors import ConfigError


@dataclass(frozen=True, slots=True)
class Summary:
    """Distribution summary of one metric; NaN fields when `count == 0`."""

    count: int
    mean: float
    p50: float
    p90: float
    p99: float
    max: float

    def to_dict(self) -> dict[str, float]:
        return asdict(self)


def summarize(values: Sequence[float]) -> Summary:
    """Count, mean, p50 / p90 / p99 and max of `values` (NaN-free input)."""
    arr = np.asarray(values, dtype=float)
    if arr.size == 0:
        nan = float("nan")
        return Summary(0, nan, nan, nan, nan, nan)
    p50, p90, p99 = (float(x) for x in np.percentile(arr, [50, 90, 99]))
    return Summary(int(arr.size), float(arr.mean()), p50, p90, p99, float(arr.max()))


def _clip(
    t_s: Sequence[float], values: Sequence[float], start_s: float, end_s: float, initial: float
) -> tuple[np.ndarray, np.ndarray]:
    if end_s < start_s:
        raise ConfigError(f"window ({start_s}, {end_s}) ends before it starts")
    t = np.asarray(t_s, dtype=float)
    v = np.asarray(values, dtype=float)
    if t.shape != v.shape:
        raise ConfigError(f"{t.size} sample times but {v.size} values")
    # value in force at start_s: the last sample at or before it, else `initial`
    k = int(np.searchsorted(t, start_s, side="right"))
    v0 = v[k - 1] if k > 0 else initial
    inside = (t > start_s) & (t < end_s)
    return np.concatenate(([start_s], t[inside], [end_s])), np.concatenate(([v0], v[inside]))


def time_weighted_mean(
    t_s: Sequence[float],
    values: Sequence[float],
    start_s: float,
    end_s: float,
    initial: float = 0.0,
) -> float:
    """Mean over `[start_s, end_s]` of a series that holds each sample until the next."""
    edges, held = _clip(t_s, values, start_s, end_s, initial)
    span = end_s - start_s
    if span <= 0:
        return float(held[-1])
    return float(np.sum(held * np.diff(edges)) / span)


def window_max(
    t_s: Sequence[float],
    values: Sequence[float],
    start_s: float,
    end_s: float,
    initial: float = 0.0,
) -> float:
    """Largest value the series holds at any time in `[start_s, end_s]`."""
    _, held = _clip(t_s, values, start_s, end_s, initial)
    return float(held.max())
