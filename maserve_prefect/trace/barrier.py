"""Barriers: the legal release changes replay may apply to a recorded trace.

The one idea: a legal change may add control edges between ops of one root (a barrier) but must
keep every required edge and stay acyclic. `apply_barrier` adds a barrier's edges to a trace and
refuses a cycle; `check_legal_change` checks any changed trace against its original. Which ops
replay then waits for is the release rule's business (`trace.release`).

A barrier is given in three forms, all expanded to op edges (`BarrierEdge`) before they are
applied: an op edge names two ops of one root; a `StageBarrier` orders two stages in every root;
a `PerRootEdge` names two ops *relative to a root* (`research.child0/0`) and orders them in every
root that realized both, so one edge covers a trace set of any size.

Barrier edges become `Dep(kind=CONTROL, required=False, origin=BARRIER)` on the successor:
`required=False` because they are added release constraints, not recorded necessities, and
`origin=BARRIER` is what tells them apart from recorded deps (the DAG rule drops exactly those).
Which barrier added an edge (e.g. "stage analyst_a -> analyst_b") is not stored on the `Dep`:
`barrier_edges` lists the added edges with their notes, and the replay driver keeps that list in
the replay trace's notes.

Examples:
    >>> from maserve_prefect.trace.model import Manifest, OpKind, OpRecord, Trace
    >>> tr = Trace(manifest=Manifest(trace_id="x"), ops=[
    ...     OpRecord(op_id="r/a", root_id="r", kind=OpKind.MODEL),
    ...     OpRecord(op_id="r/b", root_id="r", kind=OpKind.MODEL)])
    >>> changed = apply_barrier(tr, [BarrierEdge("r/a", "r/b")])
    >>> [(d.op_id, d.kind.value, d.required, d.origin.value) for d in changed.op_index()["r/b"].deps]
    [('r/a', 'control', False, 'barrier')]
    >>> check_legal_change(tr, changed)  # adds a control edge within one root: legal
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import TypeAlias

import networkx as nx

from maserve_prefect.errors import IllegalReleaseError
from maserve_prefect.trace.model import Dep, DepOrigin, EdgeKind, OpRecord, Trace


@dataclass(slots=True, frozen=True)
class BarrierEdge:
    """`src_op` must complete before `dst_op` is released (both ops of one root)."""

    src_op: str
    dst_op: str
    note: str = ""


@dataclass(slots=True, frozen=True)
class StageBarrier:
    """Every op of stage `before` completes before any op of stage `after`, within each root.

    Stages match by `StageRecord.name` (the template-level name, so one barrier applies to every
    root), or by the op's `stage_id` when the trace has no stage record for it. `root_id`
    restricts the barrier to one root.
    """

    before: str
    after: str
    root_id: str | None = None


@dataclass(slots=True, frozen=True)
class PerRootEdge:
    """`src_op` completes before `dst_op` is released, in every root that realized both ops.

    The op ids are relative to a root: an op's id without its `"<root_id>/"` prefix, so
    `research.child0/0` names `r0003/research.child0/0` in root `r0003` (and
    `research/r0003/research.child0/0` in a trace set whose cohorts are prefixed). Ops whose id
    does not start with their root id cannot be named this way; use a `BarrierEdge`.

    A root lacking one of the two ops is skipped: a trace records the *realized* graph, so an op
    missing from a root was not realized there (a refinement loop that accepted its first draft,
    a dynamic spawn with fewer children, a root that failed before reaching it) and the edge has
    nothing to order in that root. An op id realized in no root at all is a misspelling and is
    refused, as is an edge whose two ops no root realized together (`expand_per_root_edge`).
    """

    src_op: str
    dst_op: str


Barrier: TypeAlias = BarrierEdge | StageBarrier | PerRootEdge
"""Any form of barrier `barrier_edges` and `apply_barrier` accept."""


def relative_op_id(op: OpRecord) -> str | None:
    """`op`'s id relative to its root (None when the id does not start with `"<root_id>/"`).

    Examples:
        >>> from maserve_prefect.trace.model import OpKind, OpRecord
        >>> relative_op_id(OpRecord(op_id="r7/research.child0/0", root_id="r7", kind=OpKind.MODEL))
        'research.child0/0'
    """
    prefix = f"{op.root_id}/"
    return op.op_id[len(prefix) :] if op.op_id.startswith(prefix) else None


def expand_per_root_edge(trace: Trace, edge: PerRootEdge) -> list[BarrierEdge]:
    """One op edge per root that realized both ops of `edge`, in root record order.

    Each edge's note is "each root SRC -> DST", so the replay notes say which barrier added it.

    Raises:
        IllegalReleaseError: an op id is realized in no root (the message names it and some
            relative op ids the trace holds), or no root realized both ops.

    Examples:
        >>> from maserve_prefect.trace.model import Manifest, OpKind, OpRecord, Trace
        >>> tr = Trace(manifest=Manifest(trace_id="x"), ops=[
        ...     OpRecord(op_id=f"{r}/{o}", root_id=r, kind=OpKind.MODEL)
        ...     for r, o in [("p", "a"), ("p", "b"), ("q", "a"), ("q", "b"), ("s", "a")]])
        >>> [e.src_op + " -> " + e.dst_op for e in expand_per_root_edge(tr, PerRootEdge("a", "b"))]
        ['p/a -> p/b', 'q/a -> q/b']
    """
    by_root: dict[str, dict[str, str]] = {}
    for op in trace.ops:
        rel = relative_op_id(op)
        if rel is not None:
            by_root.setdefault(op.root_id, {})[rel] = op.op_id
    what = f"per-root barrier edge {edge.src_op} -> {edge.dst_op}"
    realized = {rel for ops in by_root.values() for rel in ops}
    unknown = [o for o in dict.fromkeys((edge.src_op, edge.dst_op)) if o not in realized]
    if unknown:
        some = sorted(realized)
        hint = ", ".join(some[:8]) + (f", ... ({len(some)} in all)" if len(some) > 8 else "")
        raise IllegalReleaseError(
            f"{what}: no root of the trace holds op {' or '.join(map(repr, unknown))}; name ops "
            f"relative to their root (without the root id), e.g. {hint or '(no ops)'}"
        )
    note = f"each root {edge.src_op} -> {edge.dst_op}"
    edges = [
        BarrierEdge(ops[edge.src_op], ops[edge.dst_op], note)
        for ops in by_root.values()
        if edge.src_op in ops and edge.dst_op in ops
    ]
    if not edges:
        raise IllegalReleaseError(
            f"{what}: no root realized both ops (each of the {len(by_root)} roots holds at "
            "most one), so the edge orders nothing; check that the two op ids belong together"
        )
    return edges


def _stage_names(trace: Trace) -> dict[str, str]:
    return {s.stage_id: s.name for s in trace.stages}


def expand_stage_barrier(trace: Trace, barrier: StageBarrier) -> list[BarrierEdge]:
    """All-pairs op edges of a stage barrier, in record order.

    Raises:
        IllegalReleaseError: no root holds ops of both stages (likely a misspelt stage).

    Examples:
        >>> from maserve_prefect.trace.model import Manifest, OpKind, OpRecord, Trace
        >>> tr = Trace(manifest=Manifest(trace_id="x"), ops=[
        ...     OpRecord(op_id="r/a", root_id="r", stage_id="s1", kind=OpKind.MODEL),
        ...     OpRecord(op_id="r/b", root_id="r", stage_id="s2", kind=OpKind.MODEL)])
        >>> expand_stage_barrier(tr, StageBarrier("s1", "s2"))
        [BarrierEdge(src_op='r/a', dst_op='r/b', note='stage s1 -> s2')]
    """
    names = _stage_names(trace)
    before: dict[str, list[str]] = {}
    after: dict[str, list[str]] = {}
    for op in trace.op_index().values():
        if barrier.root_id is not None and op.root_id != barrier.root_id:
            continue
        name = names.get(op.stage_id, op.stage_id)
        if name == barrier.before:
            before.setdefault(op.root_id, []).append(op.op_id)
        if name == barrier.after:
            after.setdefault(op.root_id, []).append(op.op_id)
    note = f"stage {barrier.before} -> {barrier.after}"
    edges = [
        BarrierEdge(src, dst, note)
        for root_id, srcs in before.items()
        for src in srcs
        for dst in after.get(root_id, ())
    ]
    if not edges:
        known = sorted({names.get(op.stage_id, op.stage_id) for op in trace.ops} - {""})
        raise IllegalReleaseError(
            f"stage barrier {barrier.before!r} -> {barrier.after!r} matches no root holding ops "
            f"of both stages; known stages: {', '.join(known) or '(none)'}"
        )
    return edges


def _check_edge(edge: BarrierEdge, index: dict[str, OpRecord]) -> None:
    for op_id in (edge.src_op, edge.dst_op):
        if op_id not in index:
            raise IllegalReleaseError(
                f"barrier edge {edge.src_op} -> {edge.dst_op} names unknown op {op_id!r}; "
                "use op ids of the trace"
            )
    src, dst = index[edge.src_op], index[edge.dst_op]
    if src.root_id != dst.root_id:
        raise IllegalReleaseError(
            f"barrier edge {edge.src_op} -> {edge.dst_op} crosses roots "
            f"({src.root_id!r} -> {dst.root_id!r}); release changes stay within one root"
        )


def _dep_graph(ops: Iterable[OpRecord]) -> nx.DiGraph:
    g = nx.DiGraph()
    for op in ops:
        g.add_node(op.op_id)
        g.add_edges_from((d.op_id, op.op_id) for d in op.deps)
    return g


def _raise_if_cyclic(g: nx.DiGraph, what: str) -> None:
    try:
        cycle = nx.find_cycle(g)
    except nx.NetworkXNoCycle:
        return
    nodes = [u for u, _ in cycle]
    raise IllegalReleaseError(
        f"{what} would create the cycle {' -> '.join([*nodes, nodes[0]])}; drop or reverse one "
        "of its barrier edges"
    )


def _expand(trace: Trace, item: Barrier) -> list[BarrierEdge]:
    if isinstance(item, StageBarrier):
        return expand_stage_barrier(trace, item)
    if isinstance(item, PerRootEdge):
        return expand_per_root_edge(trace, item)
    return [item]


def barrier_edges(trace: Trace, edges: Iterable[Barrier]) -> list[BarrierEdge]:
    """The op edges a barrier really adds to `trace`, each with its note, in the order given.

    Stage barriers and per-root edges are expanded (`expand_stage_barrier`, note "stage a -> b";
    `expand_per_root_edge`, note "each root a -> b"); an edge whose pair is already linked by a
    dep, or listed earlier, adds nothing and is left out. The replay driver writes this list into
    the replay trace's notes, so a bundle says which barrier added each edge (`Dep` itself carries
    only `origin=BARRIER`). Cycles are not checked here (`apply_barrier` does).

    Raises:
        IllegalReleaseError: an edge names an unknown op or crosses roots, a stage barrier
            matches no root, or a per-root edge names an op no root realized.

    Examples:
        >>> from maserve_prefect.trace.model import Manifest, OpKind, OpRecord, Trace
        >>> tr = Trace(manifest=Manifest(trace_id="x"), ops=[
        ...     OpRecord(op_id="r/a", root_id="r", stage_id="s1", kind=OpKind.MODEL),
        ...     OpRecord(op_id="r/b", root_id="r", stage_id="s2", kind=OpKind.MODEL)])
        >>> barrier_edges(tr, [StageBarrier("s1", "s2"), BarrierEdge("r/a", "r/b", "dup")])
        [BarrierEdge(src_op='r/a', dst_op='r/b', note='stage s1 -> s2')]
    """
    index = trace.op_index()
    out: list[BarrierEdge] = []
    seen: set[tuple[str, str]] = set()
    for item in edges:
        for edge in _expand(trace, item):
            _check_edge(edge, index)
            pair = (edge.src_op, edge.dst_op)
            if pair in seen or edge.src_op in {d.op_id for d in index[edge.dst_op].deps}:
                continue
            seen.add(pair)
            out.append(edge)
    return out


def apply_barrier(trace: Trace, edges: Iterable[Barrier]) -> Trace:
    """Return a new trace whose ops gain the barrier's control edges (all existing deps kept).

    An edge whose pair is already linked by a dep adds nothing (`barrier_edges`).

    Args:
        trace: the recorded trace (left unchanged).
        edges: op edges, stage barriers and/or per-root edges.

    Raises:
        IllegalReleaseError: an edge names an unknown op, crosses roots, or the result would be
            cyclic (the message names the cycle's op ids; a per-root edge that reverses a
            recorded dep of any root is refused this way).

    Examples:
        >>> from maserve_prefect.trace.model import Manifest, OpKind, OpRecord, Trace
        >>> tr = Trace(manifest=Manifest(trace_id="x"), ops=[
        ...     OpRecord(op_id="r/a", root_id="r", kind=OpKind.MODEL),
        ...     OpRecord(op_id="r/b", root_id="r", kind=OpKind.MODEL)])
        >>> apply_barrier(tr, [BarrierEdge("r/a", "r/b"), BarrierEdge("r/b", "r/a")])
        Traceback (most recent call last):
        ...
        maserve_prefect.errors.IllegalReleaseError: barrier would create the cycle r/a -> r/b -> r/a; drop or reverse one of its barrier edges
    """
    index = trace.op_index()
    added: dict[str, list[str]] = {}
    for edge in barrier_edges(trace, edges):
        added.setdefault(edge.dst_op, []).append(edge.src_op)
    g = _dep_graph(index.values())
    g.add_edges_from((src, dst) for dst, srcs in added.items() for src in srcs)
    _raise_if_cyclic(g, "barrier")
    new_ops = [
        op.model_copy(
            update={
                "deps": op.deps
                + tuple(
                    Dep(op_id=s, kind=EdgeKind.CONTROL, required=False, origin=DepOrigin.BARRIER)
                    for s in added[op.op_id]
                )
            }
        )
        if op.op_id in added
        else op
        for op in trace.ops
    ]
    return trace.model_copy(update={"ops": new_ops})


def check_legal_change(original: Trace, changed: Trace) -> None:
    """Check that `changed` is a legal release change of `original`.

    Legal: same op ids, every required edge of `original` kept, every added edge a control edge
    within one root, and the result acyclic.

    Raises:
        IllegalReleaseError: the first violation, naming the edge or cycle.
    """
    before, after = original.op_index(), changed.op_index()
    if before.keys() != after.keys():
        diff = sorted(before.keys() ^ after.keys())
        raise IllegalReleaseError(f"release change altered the op set: {', '.join(diff[:5])}")
    for op_id, op in before.items():
        kept = {(d.op_id, d.kind) for d in after[op_id].deps}
        for dep in op.deps:
            if dep.required and (dep.op_id, dep.kind) not in kept:
                raise IllegalReleaseError(
                    f"release change drops required {dep.kind} edge {dep.op_id} -> {op_id}"
                )
        old = {(d.op_id, d.kind, d.required) for d in op.deps}
        for dep in after[op_id].deps:
            if (dep.op_id, dep.kind, dep.required) in old:
                continue
            if dep.kind != EdgeKind.CONTROL or after[dep.op_id].root_id != op.root_id:
                raise IllegalReleaseError(
                    f"release change adds {dep.kind} edge {dep.op_id} -> {op_id}; only control "
                    "edges within one root may be added"
                )
    _raise_if_cyclic(_dep_graph(after.values()), "release change")
