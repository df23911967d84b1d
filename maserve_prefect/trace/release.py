"""The named release rules replay consumes, and the release plan of a trace under one.

The one idea: replay keeps the recorded work fixed and varies only *when* ops may be released.
Four named rules say which ops must complete before an op is released:

- `DAG`: the recorded deps (barrier edges added later are left out).
- `BARRIER`: the recorded deps plus barrier edges (`trace.barrier.apply_barrier`).
- `FLAT`: nothing — every op of a root is released at the root's arrival.
- `ARRIVAL`: nothing — every op is released at its observed submission time.

Flat and Arrival ignore data dependencies, so they are *non-causal reference* arms: exempt from
the required-edge rule, and every `ReleasePlan` built from them carries `non_causal=True` so that
reports flag them. Which control edges a barrier may add (the legal release changes) is
`trace.barrier`; the DAG rule tells them apart by their `origin=BARRIER`.

Examples:
    >>> from maserve_prefect.trace.barrier import BarrierEdge, apply_barrier
    >>> from maserve_prefect.trace.model import Manifest, OpKind, OpRecord, Trace
    >>> tr = Trace(manifest=Manifest(trace_id="x"), ops=[
    ...     OpRecord(op_id="r/a", root_id="r", kind=OpKind.MODEL),
    ...     OpRecord(op_id="r/b", root_id="r", kind=OpKind.MODEL)])
    >>> changed = apply_barrier(tr, [BarrierEdge("r/a", "r/b")])
    >>> release_predecessors(changed, ReleaseRule.BARRIER)["r/b"]
    ('r/a',)
    >>> release_predecessors(changed, ReleaseRule.DAG)["r/b"]
    ()
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from maserve_prefect.errors import TraceValidationError
from maserve_prefect.trace.model import DepOrigin, Trace


class ReleaseRule(StrEnum):
    """When replay may release an op (see the module docstring)."""

    DAG = "dag"
    BARRIER = "barrier"
    FLAT = "flat"
    ARRIVAL = "arrival"

    @property
    def is_causal(self) -> bool:
        """True when the rule respects every recorded required edge (DAG, Barrier)."""
        return self in (ReleaseRule.DAG, ReleaseRule.BARRIER)


@dataclass(slots=True, frozen=True)
class ReleasePlan:
    """What the replay driver needs to release ops under one rule.

    Attributes:
        rule: the release rule.
        predecessors: op id → ops that must complete before it is released.
        release_at_s: op id → earliest release time (root arrival for DAG/Barrier/Flat, the
            observed submission time for Arrival).
        non_causal: True for Flat and Arrival (reference arms; reports must flag them).
    """

    rule: ReleaseRule
    predecessors: dict[str, tuple[str, ...]]
    release_at_s: dict[str, float]
    non_causal: bool


def release_predecessors(trace: Trace, rule: ReleaseRule) -> dict[str, tuple[str, ...]]:
    """Per op, which ops must complete before it is released under `rule`.

    Examples:
        >>> from maserve_prefect.trace.model import Dep, EdgeKind, Manifest, OpKind, OpRecord
        >>> tr = Trace(manifest=Manifest(trace_id="x"), ops=[
        ...     OpRecord(op_id="r/a", root_id="r", kind=OpKind.MODEL),
        ...     OpRecord(op_id="r/b", root_id="r", kind=OpKind.MODEL,
        ...              deps=(Dep(op_id="r/a", kind=EdgeKind.DATA),))])
        >>> release_predecessors(tr, ReleaseRule.DAG)["r/b"], release_predecessors(tr, "flat")["r/b"]
        (('r/a',), ())
    """
    rule = ReleaseRule(rule)
    index = trace.op_index()
    if not rule.is_causal:
        return dict.fromkeys(index, ())
    skip_barrier = rule is ReleaseRule.DAG
    return {
        op_id: tuple(
            dict.fromkeys(
                d.op_id for d in op.deps if not (skip_barrier and d.origin is DepOrigin.BARRIER)
            )
        )
        for op_id, op in index.items()
    }


def release_plan(trace: Trace, rule: ReleaseRule | str) -> ReleasePlan:
    """Build the `ReleasePlan` of a trace under a rule.

    Raises:
        TraceValidationError: Arrival on an op without an observed submission time.

    Examples:
        >>> from maserve_prefect.trace.model import Manifest, OpKind, OpRecord, RootRecord, Trace
        >>> tr = Trace(manifest=Manifest(trace_id="x"), roots=[RootRecord(root_id="r", arrival_s=2.0)],
        ...            ops=[OpRecord(op_id="r/a", root_id="r", kind=OpKind.MODEL)])
        >>> p = release_plan(tr, "flat")
        >>> p.non_causal, p.release_at_s
        (True, {'r/a': 2.0})
    """
    rule = ReleaseRule(rule)
    index = trace.op_index()
    arrivals = {r.root_id: r.arrival_s for r in trace.roots}
    release_at: dict[str, float] = {}
    for op_id, op in index.items():
        if rule is ReleaseRule.ARRIVAL:
            if op.times.submitted_s is None:
                raise TraceValidationError(
                    f"op {op_id!r} has no submitted_s; the Arrival rule replays observed "
                    "submission times, so use DAG/Barrier/Flat for this trace"
                )
            release_at[op_id] = op.times.submitted_s
        else:
            release_at[op_id] = arrivals.get(op.root_id, 0.0)
    return ReleasePlan(
        rule=rule,
        predecessors=release_predecessors(trace, rule),
        release_at_s=release_at,
        non_causal=not rule.is_causal,
    )
