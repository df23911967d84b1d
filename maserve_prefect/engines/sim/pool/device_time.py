"""Where a device's time went: generation, loading, idle-resident, other — exact, from intervals.

One idea: the four classes are nested unions with a priority, so each is a difference of union
measures over the window `W`:

- generation = |G| (≥ 1 replica on the device executing a step),
- loading = |G ∪ L| - |G| (a lifecycle transition in progress, and not generating),
- idle_resident = |G ∪ L ∪ R| - |G ∪ L| (weights resident, no step, no transition),
- other = |W| - |G ∪ L ∪ R| (nothing resident),

so the four always sum to the window. Intervals come from the replicas' step records and the
pool's lifecycle log, not from sampling. Union measure is a sort and a running maximum (numpy).

Examples:
    >>> row = split_device_time("H100:0", (0.0, 10.0), [(1.0, 2.0)], [(0.0, 1.5)], [(1.5, 8.0)])
    >>> row.generation_s, row.loading_s, row.idle_resident_s, row.other_s
    (1.0, 1.0, 6.0, 2.0)
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass

import numpy as np

from maserve_prefect.errors import ConfigError

Interval = tuple[float, float]


@dataclass(frozen=True, slots=True)
class DeviceTimeRow:
    """One device's time split over `[start_s, end_s]` (seconds; the four parts sum to it)."""

    device: str
    start_s: float
    end_s: float
    generation_s: float
    idle_resident_s: float
    loading_s: float
    other_s: float

    def to_dict(self) -> dict[str, float | str]:
        return asdict(self)


def union_measure(intervals: Sequence[Interval], window: Interval) -> float:
    """Total length of the union of `intervals` clipped to `window`.

    Examples:
        >>> union_measure([(0, 2), (1, 3), (5, 6)], (0, 10))
        4.0
    """
    if not intervals:
        return 0.0
    arr = np.asarray(intervals, dtype=float).reshape(-1, 2)
    s = np.maximum(arr[:, 0], window[0])
    e = np.minimum(arr[:, 1], window[1])
    keep = e > s
    s, e = s[keep], e[keep]
    if s.size == 0:
        return 0.0
    order = np.argsort(s, kind="stable")
    s, e = s[order], e[order]
    reach = np.maximum.accumulate(e)
    starts_group = np.empty(s.size, dtype=bool)
    starts_group[0] = True
    starts_group[1:] = s[1:] > reach[:-1]
    first = np.flatnonzero(starts_group)
    last = np.append(first[1:] - 1, s.size - 1)
    return float(np.sum(reach[last] - s[first]))


def split_device_time(
    device: str,
    window: Interval,
    generation: Sequence[Interval],
    loading: Sequence[Interval],
    resident: Sequence[Interval],
) -> DeviceTimeRow:
    """Classify `window` for one device (rules in the module docstring).

    Raises:
        ConfigError: the window ends before it starts.
    """
    w0, w1 = window
    if w1 < w0:
        raise ConfigError(f"device-time window ({w0}, {w1}) ends before it starts")
    g = union_measure(generation, window)
    gl = union_measure([*generation, *loading], window)
    glr = union_measure([*generation, *loading, *resident], window)
    return DeviceTimeRow(device, w0, w1, g, glr - gl, gl - g, (w1 - w0) - glr)
