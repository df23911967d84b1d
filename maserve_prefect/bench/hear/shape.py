"""Comparing a measured policy table with a paper's *in shape*: who wins, and which way each
effect goes.

One idea: when the workload differs from the paper's (another trace, another scale), absolute
values say little, but two things still can be compared per load level and metric — the order of
the policies (best first), and the sign of each policy's effect against the baseline. An effect is
the paper's "×" figure: baseline / policy for a lower-is-better metric, policy / baseline for a
higher-is-better one, so > 1 is always an improvement; it counts as a tie when it is within
`TIE_BAND` of 1 (the paper's own tables print effects like ×1.01 that no run-to-run difference
could settle), and two policies within it of each other tie in an order ('='). Order agreement
is Kendall's tau between the two rankings (`scipy.stats`); a
constant column has no order and gives NaN.

Examples:
    >>> effect(10.0, 5.0, lower_is_better=True), sign(2.0), sign(1.01), sign(0.5)
    (2.0, '+', '=', '-')
    >>> order({"a": 3.0, "b": 1.0, "c": 2.0}, lower_is_better=True)
    ['b', 'c', 'a']
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping, Sequence
from typing import Any

from scipy.stats import kendalltau

__all__ = ["TIE_BAND", "effect", "order", "ranking", "shape_rows", "sign"]

TIE_BAND = 0.02
"""An effect within 2 % of ×1.00 is a tie ('=')."""


def effect(baseline: float, value: float, *, lower_is_better: bool) -> float:
    """The paper's "×" effect of `value` against `baseline` (> 1: better); NaN when undefined."""
    num, den = (baseline, value) if lower_is_better else (value, baseline)
    if den <= 0 or not (math.isfinite(num) and math.isfinite(den)):
        return math.nan
    return num / den


def sign(x: float, band: float = TIE_BAND) -> str:
    """'+' better, '-' worse, '=' a tie within `band`, '?' undefined."""
    if not math.isfinite(x):
        return "?"
    if x > 1 + band:
        return "+"
    if x < 1 - band:
        return "-"
    return "="


def order(values: Mapping[str, float], *, lower_is_better: bool) -> list[str]:
    """Policy names best first (ties keep the given order)."""
    return sorted(values, key=lambda k: values[k] if lower_is_better else -values[k])


def ranking(values: Mapping[str, float], *, lower_is_better: bool, band: float = TIE_BAND) -> str:
    """The order best first as text, policies within `band` of the previous one joined by '='
    (a tie) and the rest by '>'.

    Examples:
        >>> ranking({"a": 3.0, "b": 1.0, "c": 1.01}, lower_is_better=True)
        'b = c > a'
    """
    names = order(values, lower_is_better=lower_is_better)
    out = names[:1]
    for prev, name in itertools.pairwise(names):
        a, b = values[prev], values[name]
        tie = math.isclose(a, b, rel_tol=band) or (a == b)
        out += ["=" if tie else ">", name]
    return " ".join(out)


def _tau(a: Sequence[float], b: Sequence[float]) -> float:
    if len(a) < 2 or len(set(a)) < 2 or len(set(b)) < 2:
        return math.nan
    return float(kendalltau(a, b).statistic)


def shape_rows(
    measured: Mapping[str, Mapping[str, float]],
    paper: Mapping[str, Mapping[str, float]],
    metrics: Mapping[str, bool],
    *,
    baseline: str = "fcfs",
) -> list[dict[str, Any]]:
    """One row per metric: both orders, Kendall's tau, and per policy the measured and paper
    effect signs (`metrics`: name -> lower_is_better). Policies missing from either side are
    left out; without the baseline there are no effects (signs '?').

    Examples:
        >>> m = {"fcfs": {"t": 10.0}, "ca": {"t": 5.0}}
        >>> p = {"fcfs": {"t": 60.0}, "ca": {"t": 4.0}}
        >>> r = shape_rows(m, p, {"t": True})[0]
        >>> r["measured_order"], r["paper_order"], r["signs"], r["signs_agree"]
        ('ca > fcfs', 'ca > fcfs', 'ca +/+', '1/1')
    """
    arms = [a for a in measured if a in paper]
    rows: list[dict[str, Any]] = []
    for metric, lower in metrics.items():
        mv = {a: float(measured[a][metric]) for a in arms}
        pv = {a: float(paper[a][metric]) for a in arms}
        signs, agree, total = [], 0, 0
        for a in arms:
            if a == baseline:
                continue
            ms = sign(effect(mv.get(baseline, math.nan), mv[a], lower_is_better=lower))
            ps = sign(effect(pv.get(baseline, math.nan), pv[a], lower_is_better=lower))
            signs.append(f"{a} {ms}/{ps}")
            total += 1
            agree += ms == ps and ms != "?"
        rows.append({
            "metric": metric,
            "measured_order": ranking(mv, lower_is_better=lower),
            "paper_order": ranking(pv, lower_is_better=lower),
            "kendall_tau": _tau([mv[a] for a in arms], [pv[a] for a in arms]),
            "signs": ", ".join(signs),
            "signs_agree": f"{agree}/{total}",
        })  # fmt: skip
    return rows
