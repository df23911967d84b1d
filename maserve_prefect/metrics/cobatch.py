"""Who shares the engine with the target roots: co-batching shares and batch size over a window.

The one idea (seed paper §6.5, App. G.1, Fig. 10a): a replay's scheduler intervals are the
simulator's step records, each from its start to its end, and a target root's exposure to the
background is the *time* its requests spend in intervals that also hold background requests. The
denominator is the time of intervals holding at least one target request (several targets in one
interval count once); a background class's share is the time of those intervals also holding at
least one request of that class, and `all` the time holding every listed class at once. Every
interval is clipped to a window first (the paper's common arrival span, 2–110 s). The
**pure-decode batch** is the number of requests in an interval where every request decodes,
weighted by the interval's duration within a window (the paper weights over the targets'
lifetime). A fast-forwarded record (`num_steps > 1`) has one shape for its whole span, so
weighting it by its duration is exact.

Request ids join records to the trace (request id = op id); `request_groups` maps each to
`TARGET` or its root's class (`metrics.task.root_class`).

Examples:
    >>> from maserve_prefect.engines.sim.step.records import ScheduledTokens as S
    >>> def rec(t0, t1, *rids):
    ...     sched = tuple(S(r, 5, 1) for r in rids)
    ...     return StepRecord("r", 0, t0, t1, 1, StepKind.DECODE, sched, len(rids), 0, 0, 0, 0, ())
    >>> recs = [rec(0.0, 1.0, "t", "a", "b"), rec(1.0, 3.0, "t", "a"), rec(3.0, 4.0, "a")]
    >>> groups = {"t": "target", "a": "loop", "b": "spawn"}
    >>> target_cobatching(recs, groups, classes=("loop", "spawn"))
    {'loop': 1.0, 'spawn': 0.3333333333333333, 'all': 0.3333333333333333}
    >>> pure_decode_batch(recs, window=(0.0, 3.0))
    2.3333333333333335
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

import numpy as np

from maserve_prefect.engines.sim.step.records import StepKind, StepRecord
from maserve_prefect.metrics.task import root_class
from maserve_prefect.trace.model import OpKind, Trace

TARGET = "target"
"""The group of every target request (`request_groups`)."""

BACKGROUND_CLASSES = ("fork_join", "refinement_loop", "spawn")
"""The three background workflows of the paper's App. G.1, in lexicographic order."""


def _clipped(rec: StepRecord, window: tuple[float, float] | None) -> float:
    if window is None:
        return rec.duration_s
    return max(0.0, min(rec.end_s, window[1]) - max(rec.start_s, window[0]))


def target_cobatching(
    records: Iterable[StepRecord],
    group_of: Mapping[str, str],
    *,
    classes: Sequence[str] = BACKGROUND_CLASSES,
    window: tuple[float, float] | None = None,
) -> dict[str, float]:
    """Share of target-holding scheduled time also holding each class, and `all` of them.

    Args:
        records: scheduler intervals (step records).
        group_of: request id → `TARGET` or its background class (`request_groups`).
        classes: the background classes reported; `all` needs every one in the interval.
        window: (start, end) on the records' clock; intervals are clipped to it.

    Returns:
        Class → share in [0, 1] (plus `all`); empty when no target was scheduled in the window.
    """
    total = 0.0
    held = dict.fromkeys((*classes, "all"), 0.0)
    for rec in records:
        groups = {group_of.get(s.request_id) for s in rec.scheduled}
        if TARGET not in groups:
            continue
        dur = _clipped(rec, window)
        if dur <= 0:
            continue
        total += dur
        for cls in classes:
            if cls in groups:
                held[cls] += dur
        if all(cls in groups for cls in classes):
            held["all"] += dur
    if total <= 0:
        return {}
    return {cls: v / total for cls, v in held.items()}


def pure_decode_batch(
    records: Iterable[StepRecord], *, window: tuple[float, float] | None = None
) -> float | None:
    """Requests per pure decode interval, weighted by its duration within `window` (None when
    no pure decode interval falls in it)."""
    pairs = [(len(r.scheduled), _clipped(r, window)) for r in records if r.kind is StepKind.DECODE]
    arr = np.array([p for p in pairs if p[1] > 0], dtype=np.float64).reshape(-1, 2)
    total = arr[:, 1].sum()
    return float(np.dot(arr[:, 0], arr[:, 1]) / total) if total > 0 else None


def request_groups(trace: Trace, role_of: Mapping[str, str]) -> dict[str, str]:
    """Request (op) id → `TARGET` for a target root's op, else its root's class."""
    group = {
        r.root_id: TARGET if role_of.get(r.root_id) == TARGET else root_class(r)
        for r in trace.roots
    }
    return {op.op_id: group.get(op.root_id, "") for op in trace.ops}


def model_tokens(trace: Trace, roots: set[str]) -> tuple[int, int]:
    """(input, output) tokens of the model ops of `roots` in `trace`."""
    ops = [o for o in trace.ops if o.root_id in roots and o.kind is OpKind.MODEL]
    return sum(o.num_input_tokens for o in ops), sum(o.num_output_tokens for o in ops)
