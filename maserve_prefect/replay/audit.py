"""The replay trace and its audit: realized times written back onto the recorded ops.

One idea: a replay trace is the recorded trace with *only* times (and what the engine realized:
cached tokens, status) replaced, so comparing arms is comparing release times on identical work.
`count_early_releases` reads the realized times alone — independent of the driver's release
logic — and counts ops released before a required predecessor completed (for the Barrier rule the
barrier edges count as required). It must be 0 for DAG and Barrier; for Flat and Arrival it
measures how non-causal the reference arm was.

Examples:
    >>> from maserve_prefect.trace.model import Dep, EdgeKind, Manifest, OpKind, OpRecord, OpTimes
    >>> ops = [OpRecord(op_id="r/a", root_id="r", kind=OpKind.TOOL,
    ...                 times=OpTimes(ready_s=0.0, completed_s=2.0)),
    ...        OpRecord(op_id="r/b", root_id="r", kind=OpKind.TOOL,
    ...                 deps=(Dep(op_id="r/a", kind=EdgeKind.DATA),),
    ...                 times=OpTimes(ready_s=1.0, completed_s=3.0))]
    >>> count_early_releases(Trace(manifest=Manifest(trace_id="t"), ops=ops), "dag")
    1
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from maserve_prefect.trace.model import DepOrigin, OpTimes, Trace
from maserve_prefect.trace.release import ReleaseRule

if TYPE_CHECKING:
    from maserve_prefect.replay.release_driver import Realized


def count_early_releases(trace: Trace, rule: ReleaseRule | str) -> int:
    """Ops whose `ready_s` precedes the completion of a required predecessor.

    Required: recorded deps with `required=True`, plus barrier edges under the Barrier rule.
    """
    rule = ReleaseRule(rule)
    index = trace.op_index()
    early = 0
    for op in index.values():
        ready = op.times.ready_s
        if ready is None:
            continue
        for dep in op.deps:
            counts = dep.required or (
                rule is ReleaseRule.BARRIER and dep.origin is DepOrigin.BARRIER
            )
            pred = index.get(dep.op_id)
            if not counts or pred is None or pred.times.completed_s is None:
                continue
            if ready < pred.times.completed_s:
                early += 1
                break
    return early


def realized_trace(
    source: Trace,
    realized: Mapping[str, Realized],
    arrivals: Mapping[str, float],
    *,
    rule: ReleaseRule,
    name: str,
    lock: str,
    notes: Mapping[str, Any] | None = None,
    engine: str = "sim",
) -> Trace:
    """The replay trace: `source`'s records with realized times, cached tokens and status.

    An op that never completed keeps its recorded token counts but has status INCOMPLETE and no
    completion time; the conformance audit reports such ops instead of comparing their counts.
    """
    ops = []
    for op in source.ops:
        r = realized[op.op_id]
        update: dict[str, Any] = {
            "times": OpTimes(
                ready_s=r.ready_s,
                submitted_s=r.submitted_s,
                first_scheduled_s=r.first_scheduled_s,
                first_token_s=r.first_token_s,
                completed_s=r.completed_s,
            ),
            "num_cached_tokens": r.num_cached_tokens,
            "status": r.status,
            "error": r.error,
        }
        if r.num_input_tokens is not None:
            update["num_input_tokens"] = r.num_input_tokens
        if r.num_output_tokens is not None:
            update["num_output_tokens"] = r.num_output_tokens
        ops.append(op.model_copy(update=update))
    roots = [
        root.model_copy(update={"arrival_s": arrivals.get(root.root_id, root.arrival_s)})
        for root in source.roots
    ]
    m = source.manifest
    manifest = m.model_copy(
        update={
            "trace_id": f"{m.trace_id}-replay-{name}",
            "source": "replay",
            "engine": engine,
            "mode": f"replay:{rule.value}",
            "created_at": None,
            "notes": {
                **m.notes,
                "replay": {
                    "arm": name,
                    "release_rule": rule.value,
                    "non_causal": not rule.is_causal,
                    "input_lock": lock,
                    "replayed_trace_id": m.trace_id,
                    **(dict(notes) if notes else {}),
                },
            },
        }
    )
    return source.model_copy(update={"manifest": manifest, "roots": roots, "ops": ops})
