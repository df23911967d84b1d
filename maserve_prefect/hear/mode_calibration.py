"""Calibrate the role -> mode mapping on a development set, then freeze it.

One idea: a faster mode is only worth using when it is also good enough and dependable. For each
role, every candidate mode runs `stability_runs` times on the development workload (`run_fn`);
`quality_fn` scores each run in [0, 1]. A candidate passes the *quality* check when every run
scores at least `min_quality`, and the *stability* check when its scores vary by at most
`max_quality_spread` and its makespan *relative to the role's first candidate* (its reference,
e.g. the dense mode) varies by at most `max_makespan_cv` (coefficient of variation of the per-run
ratio). Run `i` of every candidate uses the same development set, so the ratio cancels what
differs between development sets (their sizes and lengths) and leaves how dependably the mode
changes the makespan; the reference itself has ratio 1.
Passing candidates are ranked by median development makespan (ties: mode name); the best per
role goes into a frozen, versioned `ModeMap`. Everything is pure except the final write, which is
atomic (`ModeMap.save`).

Examples:
    >>> def run(role, mode, i):
    ...     return DevRun(makespan_s={"default": 10.0, "eager": 8.0}[mode], output=mode)
    >>> cal = calibrate({"critic": ["default", "eager"]}, run, lambda r, m, d: 1.0, 2,
    ...                 version="dev-1")
    >>> cal.mapping.lookup("critic")
    'eager'
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from maserve_prefect.errors import ConfigError
from maserve_prefect.hear.modemap import ModeMap


@dataclass(frozen=True, slots=True)
class DevRun:
    """One development run of a role in a mode: its makespan and whatever `quality_fn` reads."""

    makespan_s: float
    output: object = None


@dataclass(frozen=True, slots=True)
class CandidateReport:
    """Why a candidate was kept or filtered."""

    role: str
    mode: str
    qualities: tuple[float, ...]
    makespans_s: tuple[float, ...]
    passed_quality: bool
    passed_stability: bool

    @property
    def passed(self) -> bool:
        return self.passed_quality and self.passed_stability

    @property
    def median_makespan_s(self) -> float:
        return statistics.median(self.makespans_s)


@dataclass(frozen=True, slots=True)
class Calibration:
    """The frozen mapping and the evidence for it."""

    mapping: ModeMap
    reports: tuple[CandidateReport, ...]
    path: Path | None = None


RunFn = Callable[[str, str, int], DevRun]
QualityFn = Callable[[str, str, DevRun], float]


def calibrate(
    candidates: Mapping[str, Sequence[str]],
    run_fn: RunFn,
    quality_fn: QualityFn,
    stability_runs: int = 3,
    *,
    version: str,
    min_quality: float = 1.0,
    max_quality_spread: float = 0.0,
    max_makespan_cv: float = 0.2,
    default: str | None = None,
    path: Path | str | None = None,
) -> Calibration:
    """Pick each role's fastest mode that passes the quality and stability checks.

    Args:
        candidates: role -> candidate modes.
        run_fn: `run_fn(role, mode, run_index)` runs the development workload once.
        quality_fn: `quality_fn(role, mode, run)` scores a run in [0, 1].
        stability_runs: runs per candidate (>= 2, so stability can be judged).
        version: the mapping's version label.
        min_quality: the lowest acceptable score of any run (default: every check passes).
        max_quality_spread: the largest allowed max - min score over the runs.
        max_makespan_cv: the largest allowed standard deviation / mean of the per-run makespan
            ratio to the role's first candidate (module docstring).
        default: the mapping's mode for roles it does not list.
        path: where to write the frozen mapping (atomically); None writes nothing.

    Raises:
        ConfigError: fewer than 2 runs, a role without candidates, a score outside [0, 1], or
            a role whose every candidate fails (names the role and the reasons).
    """
    if stability_runs < 2:
        raise ConfigError(f"calibrate: stability_runs must be >= 2, got {stability_runs}")
    reports: list[CandidateReport] = []
    chosen: dict[str, str] = {}
    for role in sorted(candidates):
        modes = list(dict.fromkeys(candidates[role]))
        if not modes:
            raise ConfigError(f"calibrate: role {role!r} has no candidate modes")
        runs = {mode: [run_fn(role, mode, i) for i in range(stability_runs)] for mode in modes}
        reference = tuple(float(r.makespan_s) for r in runs[modes[0]])
        role_reports = [
            _evaluate(role, mode, runs[mode], reference, quality_fn, min_quality,
                      max_quality_spread, max_makespan_cv)
            for mode in modes
        ]  # fmt: skip
        reports += role_reports
        passing = sorted(
            (r for r in role_reports if r.passed), key=lambda r: (r.median_makespan_s, r.mode)
        )
        if not passing:
            why = "; ".join(
                f"{r.mode}: quality {'ok' if r.passed_quality else 'failed'}, "
                f"stability {'ok' if r.passed_stability else 'failed'}"
                for r in role_reports
            )
            raise ConfigError(
                f"calibrate: no candidate mode for role {role!r} passes ({why}); add a safe "
                "baseline mode or relax the thresholds"
            )
        chosen[role] = passing[0].mode
    mapping = ModeMap.of(version, chosen, default)
    written = mapping.save(path) if path is not None else None
    return Calibration(mapping, tuple(reports), written)


def _evaluate(
    role: str,
    mode: str,
    runs: Sequence[DevRun],
    reference_s: Sequence[float],
    quality_fn: QualityFn,
    min_quality: float,
    max_quality_spread: float,
    max_makespan_cv: float,
) -> CandidateReport:
    qualities = tuple(float(quality_fn(role, mode, r)) for r in runs)
    for q in qualities:
        if not 0.0 <= q <= 1.0:
            raise ConfigError(f"calibrate: quality_fn gave {q} for {role!r}/{mode!r}; need [0, 1]")
    makespans = tuple(float(r.makespan_s) for r in runs)
    if any(not m > 0 for m in (*makespans, *reference_s)):
        raise ConfigError(
            f"calibrate: {role!r}/{mode!r} or its reference mode ran with a makespan <= 0; "
            "run_fn must return the development run's makespan in seconds"
        )
    ratios = [m / ref for m, ref in zip(makespans, reference_s, strict=True)]
    cv = statistics.pstdev(ratios) / statistics.fmean(ratios)
    return CandidateReport(
        role,
        mode,
        qualities,
        makespans,
        passed_quality=min(qualities) >= min_quality,
        passed_stability=(max(qualities) - min(qualities) <= max_quality_spread)
        and cv <= max_makespan_cv,
    )
