"""Read an engine timeline over a time window: how much a counter grew, a gauge's time average.

The one idea: a timeline (`EngineSample`s: a scrape's `MetricsScraper.samples()`, a trace's
samples) is read as a step function: a sample's value holds from its `t_s` until the next sample
of the same source and name. `counter_delta` adds up a counter's increases (a
decrease is a server restart, as in Prometheus' `increase()`); `gauge_time_average` weights each
value by how long it held.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable

from maserve_prefect.errors import ConfigError
from maserve_prefect.trace.model import EngineSample


def _series_by_source(
    samples: Iterable[EngineSample], name: str, source: str | None
) -> dict[str, list[tuple[float, float]]]:
    by_source: dict[str, list[tuple[float, float]]] = defaultdict(list)
    for s in samples:
        if s.name == name and (source is None or s.source == source):
            by_source[s.source].append((s.t_s, s.value))
    for points in by_source.values():
        points.sort(key=lambda p: p[0])  # stable: equal times keep recording order
    return by_source


def _check_window(fn: str, start_s: float, end_s: float) -> None:
    if end_s < start_s:
        raise ConfigError(f"{fn}: end_s ({end_s}) is before start_s ({start_s}); swap them")


def counter_delta(
    samples: Iterable[EngineSample],
    name: str,
    start_s: float,
    end_s: float,
    *,
    source: str | None = None,
) -> float:
    """How much a counter grew over `[start_s, end_s]`, summed over sources.

    The counter's value at `start_s` is the last sample at or before it (or, if there is none,
    the first sample inside the window: growth before the first observation is unknown). Every
    later sample up to `end_s` adds its increase; a decrease is a counter reset (the server
    restarted), which adds the new value, as Prometheus' `increase()` does.

    Args:
        samples: a timeline (e.g. `MetricsScraper.samples()` or a trace's samples).
        name: the counter, e.g. `vllm:prefix_cache_hits_total`.
        start_s / end_s: the window, on the samples' clock.
        source: only this source (None sums every source's own delta).

    Raises:
        ConfigError: `end_s < start_s`.

    Examples:
        >>> tl = [EngineSample(source="r", t_s=t, name="c", value=v)
        ...       for t, v in [(0, 10), (1, 15), (2, 3), (3, 8)]]
        >>> counter_delta(tl, "c", 0.5, 3.0)   # 10 → 15 (+5), reset to 3 (+3), → 8 (+5)
        13.0
    """
    _check_window("counter_delta", start_s, end_s)
    total = 0.0
    for points in _series_by_source(samples, name, source).values():
        prev: float | None = None
        for t, v in points:
            if t <= start_s:
                prev = v
                continue
            if t > end_s:
                break
            if prev is not None:
                total += v - prev if v >= prev else v
            prev = v
    return total


def gauge_time_average(
    samples: Iterable[EngineSample],
    name: str,
    start_s: float,
    end_s: float,
    *,
    source: str | None = None,
) -> float:
    """Time-weighted mean of a gauge over `[start_s, end_s]`, each sample holding until the next.

    Time before the first sample (when no sample is at or before `start_s`) is left out of the
    average. An empty window (`start_s == end_s`) gives the value holding at `start_s`.

    Args:
        samples: a timeline.
        name: the gauge, e.g. `vllm:kv_cache_usage_perc`.
        start_s / end_s: the window, on the samples' clock.
        source: the source to read; required when the samples hold several sources of `name`.

    Returns:
        The mean, or NaN when no sample covers any part of the window.

    Raises:
        ConfigError: `end_s < start_s`, or several sources and no `source` given.

    Examples:
        >>> tl = [EngineSample(source="r", t_s=t, name="g", value=v)
        ...       for t, v in [(0, 1.0), (1, 3.0)]]
        >>> gauge_time_average(tl, "g", 0.0, 2.0)
        2.0
    """
    _check_window("gauge_time_average", start_s, end_s)
    by_source = _series_by_source(samples, name, source)
    if len(by_source) > 1:
        raise ConfigError(
            f"gauge_time_average({name!r}): samples come from several sources "
            f"{sorted(by_source)}; pass source=... to pick one"
        )
    if not by_source:
        return math.nan
    points = next(iter(by_source.values()))
    area = 0.0
    covered = 0.0
    for i, (t, v) in enumerate(points):
        t_next = points[i + 1][0] if i + 1 < len(points) else math.inf
        lo, hi = max(t, start_s), min(t_next, end_s)
        if start_s == end_s and t <= start_s < t_next:
            return v
        if hi > lo:
            area += v * (hi - lo)
            covered += hi - lo
    return area / covered if covered > 0 else math.nan
