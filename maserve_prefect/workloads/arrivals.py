"""Root arrivals of a replay: when each root of a trace set starts, on the replay's clock.

One idea: an arrival process turns N root *slots* into N start offsets (seconds after the
replay's start), and it is a pure function of its parameters and seed — so two replays of one
scenario put every root at the same instant. Open-loop kinds fix every offset up front:

- `PoissonArrivals(rate_per_s, seed)`: exponential gaps; the first root arrives at 0.
- `BurstArrivals(at_s)`: every root at one instant.
- `ExplicitArrivals(times_s)`: the given offsets (at least one per slot).
- `TraceArrivals()`: the recorded root arrivals, shifted so the earliest is 0.

`ClosedLoopArrivals(users, think_time, seed)` is closed loop: slot i belongs to user
`i % users`; each user's first root arrives at 0 and its next root arrives when the previous one
completed plus a think time. Think times are drawn per *slot* up front (not in completion order),
so they do not depend on how fast an arm ran: two arms see the same think times.

Examples:
    >>> PoissonArrivals(rate_per_s=2.0, seed=1).offsets(3) == PoissonArrivals(2.0, 1).offsets(3)
    True
    >>> BurstArrivals(at_s=1.5).offsets(2)
    [1.5, 1.5]
    >>> ClosedLoopArrivals(users=2, think_time=ThinkTime("constant", 0.5)).think_times(3)
    [0.5, 0.5, 0.5]
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from maserve_prefect.errors import ConfigError


@dataclass(frozen=True, slots=True)
class ThinkTime:
    """A think-time distribution: `constant` (value), `exponential` (mean) or `uniform` (low, high).

    Examples:
        >>> ThinkTime("uniform", 1.0, 3.0).sample(np.random.default_rng(0), 2).round(3).tolist()
        [2.274, 1.54]
    """

    dist: str
    a: float
    b: float = 0.0

    def __post_init__(self) -> None:
        if not (math.isfinite(self.a) and math.isfinite(self.b)) or min(self.a, self.b) < 0:
            raise ConfigError(
                f"think time {self.dist} ({self.a}, {self.b}): values must be finite and >= 0"
            )
        if self.dist == "uniform" and self.a > self.b:
            raise ConfigError(
                f"uniform think time needs low <= high, got low={self.a} > high={self.b}"
            )

    def sample(self, rng: np.random.Generator, n: int) -> np.ndarray:
        """`n` draws from `rng`."""
        if self.dist == "constant":
            return np.full(n, self.a)
        if self.dist == "exponential":
            return rng.exponential(self.a, n)
        if self.dist == "uniform":
            return rng.uniform(self.a, self.b, n)
        raise ConfigError(
            f"unknown think-time distribution {self.dist!r}; use constant, exponential or uniform"
        )


@dataclass(frozen=True, slots=True)
class PoissonArrivals:
    """Poisson process with `rate_per_s` roots per second (seeded)."""

    rate_per_s: float
    seed: int = 0

    def offsets(self, n: int) -> list[float]:
        """Start offsets of `n` roots; the first at 0."""
        if not 0 < self.rate_per_s < math.inf:
            raise ConfigError(
                f"poisson arrivals need a finite rate_per_s > 0, got {self.rate_per_s}"
            )
        gaps = np.random.default_rng(self.seed).exponential(1.0 / self.rate_per_s, n)
        if n:
            gaps[0] = 0.0
        return [float(t) for t in np.cumsum(gaps)]


@dataclass(frozen=True, slots=True)
class BurstArrivals:
    """Every root at `at_s`."""

    at_s: float = 0.0

    def offsets(self, n: int) -> list[float]:
        """`n` copies of `at_s`."""
        return [float(self.at_s)] * n


@dataclass(frozen=True, slots=True)
class ExplicitArrivals:
    """The given offsets, one per slot, in slot order."""

    times_s: tuple[float, ...]

    def offsets(self, n: int) -> list[float]:
        """The first `n` offsets (an error when fewer are given)."""
        if len(self.times_s) < n:
            raise ConfigError(
                f"explicit arrivals list {len(self.times_s)} times but the trace set has {n} "
                "roots; give one time per root"
            )
        return [float(t) for t in self.times_s[:n]]


@dataclass(frozen=True, slots=True)
class SlotArrivals:
    """Fixed global slots: targets first, then the background (module docstring).

    Examples:
        >>> SlotArrivals(2, 0.0, 0.02, 2.0, 2.0).offsets(4)
        [0.0, 0.02, 2.0, 4.0]
    """

    num_targets: int
    target_start_s: float
    target_step_s: float
    background_start_s: float
    background_step_s: float

    def offsets(self, n: int) -> list[float]:
        """One offset per slot, in slot order (targets occupy the first `num_targets`)."""
        k = min(self.num_targets, n)
        tgt = [round(self.target_start_s + i * self.target_step_s, 9) for i in range(k)]
        bg = [round(self.background_start_s + j * self.background_step_s, 9) for j in range(n - k)]
        return tgt + bg


@dataclass(frozen=True, slots=True)
class TraceArrivals:
    """The recorded arrivals (`RootRecord.arrival_s`), shifted so the earliest is 0."""

    def offsets_from(self, recorded_s: Sequence[float]) -> list[float]:
        """Shifted copies of `recorded_s`."""
        t0 = min(recorded_s, default=0.0)
        return [float(t - t0) for t in recorded_s]


@dataclass(frozen=True, slots=True)
class ClosedLoopArrivals:
    """`users` concurrent users, each starting its next root `think_time` after the last ended."""

    users: int
    think_time: ThinkTime
    seed: int = 0

    def think_times(self, n: int) -> list[float]:
        """Think time before slot i's root (used from a user's second root on)."""
        if self.users < 1:
            raise ConfigError(f"closed-loop arrivals need users >= 1, got {self.users}")
        draws = self.think_time.sample(np.random.default_rng(self.seed), n)
        return [max(float(t), 0.0) for t in draws]


ArrivalProcess = (
    PoissonArrivals
    | BurstArrivals
    | ExplicitArrivals
    | SlotArrivals
    | TraceArrivals
    | ClosedLoopArrivals
)
"""Every arrival kind a scenario can name."""


def open_loop_offsets(process: ArrivalProcess, recorded_s: Sequence[float]) -> list[float] | None:
    """Offsets of the slots for an open-loop process; None for closed loop.

    Args:
        process: the arrival process.
        recorded_s: the slots' recorded root arrivals (used by `TraceArrivals`).

    Examples:
        >>> open_loop_offsets(TraceArrivals(), [5.0, 7.5])
        [0.0, 2.5]
    """
    if isinstance(process, ClosedLoopArrivals):
        return None
    if isinstance(process, TraceArrivals):
        return process.offsets_from(recorded_s)
    return process.offsets(len(recorded_s))


def with_seed(process: ArrivalProcess, seed: int) -> ArrivalProcess:
    """The same process with another seed (paired blocks draw fresh samples per block).

    Examples:
        >>> with_seed(PoissonArrivals(1.0, 0), 7)
        PoissonArrivals(rate_per_s=1.0, seed=7)
    """
    if isinstance(process, PoissonArrivals):
        return PoissonArrivals(process.rate_per_s, seed)
    if isinstance(process, ClosedLoopArrivals):
        return ClosedLoopArrivals(process.users, process.think_time, seed)
    return process
