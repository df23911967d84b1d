"""Barriers: the legal release changes replay may apply to a recorded trace.

The one idea: a barrier may only *serialize independent operations of one stage* (the seed paper,
§2.1, §4.2 and Appendix C.2) — it keeps every recorded dependency, adds a control edge, and must
not change what any op consumed. An added edge `src -> dst` is legal only when:

1. both ops exist and belong to one root;
2. the ops are **independent**: neither reaches the other through recorded deps (no data,
   artifact, state or control flow between them, directly or transitively) — a barrier between
   dependent ops is refused, never silently dropped;
3. it causes **no shared-state version conflict**: with every barrier edge added, no state
   operation is ordered after a state operation that the recorded run applied later, when one of
   the two is a write. A `state_write -> state_read` edge whose reader recorded an older version
   (it read before that write was applied) is the typical case: forcing the order would make the
   reader see another version. Traces do not record a state op's namespace, so the rule is
   conservative: it holds for any two state ops of the root, one of them a write;
4. both ops are in **one stage** (`StageOf`): by default the same stage instance (`stage_id`;
   ops without a stage share their root's unnamed stage). Replay widens it with the workflow's
   composition (`replay.coordination`: sibling branches of one Γ `parallel` node, which the
   paper writes as one fork stage);
5. the result is acyclic.

The added dependency is a *coordination edge*: `Dep(kind=CONTROL, required=False,
origin=BARRIER, stage=<stage>)` on the successor — `required=False` because it is an added release
constraint, not a recorded necessity, `origin=BARRIER` tells it apart from recorded deps (the DAG
rule drops exactly those) and `stage` names the stage it coordinates within. `check_legal_change`
checks any changed trace against its original. Which ops replay then waits for is the release
rule's business (`trace.release`).

A barrier is given in three forms, all expanded to op edges (`BarrierEdge`) before they are
checked and applied: an op edge names two ops of one root; a `StageBarrier` orders two stages in
every root; a `PerRootEdge` names two ops *relative to a root* (`research.child0/0`) and orders
them in every root that realized both, so one edge covers a trace set of any size. Which barrier
added an edge (e.g. "stage analyst_a -> analyst_b") is not stored on the `Dep`: `barrier_edges`
lists the added edges with their notes, and the replay driver keeps that list in the replay
trace's notes.

Examples:
    >>> from maserve_prefect.trace.model import Manifest, OpKind, OpRecord, Trace
    >>> tr = Trace(manifest=Manifest(trace_id="x"), ops=[
    ...     OpRecord(op_id="r/a", root_id="r", kind=OpKind.MODEL),
    ...     OpRecord(op_id="r/b", root_id="r", kind=OpKind.MODEL)])
    >>> changed = apply_barrier(tr, [BarrierEdge("r/a", "r/b")])
    >>> [(d.op_id, d.kind.value, d.required, d.origin.value, d.stage)
    ...  for d in changed.op_index()["r/b"].deps]
    [('r/a', 'control', False, 'barrier', 'r')]
    >>> check_legal_change(tr, changed)  # adds a control edge within one root: legal
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace
from typing import TypeAlias

import networkx as nx

from maserve_prefect.errors import IllegalReleaseError
from maserve_prefect.trace.model import Dep, DepOrigin, EdgeKind, OpKind, OpRecord, Trace


@dataclass(slots=True, frozen=True)
class BarrierEdge:
    """`src_op` must complete before `dst_op` is released (both ops of one root).

    `stage` is the stage the edge coordinates within, set by `barrier_edges` once the edge
    passed the legality checks (empty before).
    """

    src_op: str
    dst_op: str
    note: str = ""
    stage: str = ""


StageOf: TypeAlias = Callable[[OpRecord, OpRecord], str | None]
"""The stage two ops of one root share (a label recorded on the coordination edge), or None when
they are in different stages."""


def same_stage_instance(a: OpRecord, b: OpRecord) -> str | None:
    """The default `StageOf`: the ops' common stage instance (`stage_id`); ops without one share
    their root's unnamed stage, labelled by the root id.

    Examples:
        >>> from maserve_prefect.trace.model import OpKind, OpRecord
        >>> a = OpRecord(op_id="r/a", root_id="r", stage_id="r/fj", kind=OpKind.MODEL)
        >>> b = OpRecord(op_id="r/b", root_id="r", stage_id="r/out", kind=OpKind.MODEL)
        >>> same_stage_instance(a, a), same_stage_instance(a, b)
        ('r/fj', None)
    """
    if a.root_id != b.root_id or a.stage_id != b.stage_id:
        return None
    return a.stage_id or a.root_id


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
        [BarrierEdge(src_op='r/a', dst_op='r/b', note='stage s1 -> s2', stage='')]
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


def _edge_text(edge: BarrierEdge) -> str:
    return f"barrier edge {edge.src_op} -> {edge.dst_op}"


def _check_independent(edge: BarrierEdge, recorded: nx.DiGraph) -> None:
    """Refuse an edge between ops one of which reaches the other through recorded deps."""
    for a, b in ((edge.src_op, edge.dst_op), (edge.dst_op, edge.src_op)):
        if nx.has_path(recorded, a, b):
            path = " -> ".join(nx.shortest_path(recorded, a, b))
            raise IllegalReleaseError(
                f"{_edge_text(edge)}: the ops are not independent ({path} through recorded "
                "deps); a barrier may only order ops with no data, artifact or state flow "
                "between them"
            )


def _check_stage(edge: BarrierEdge, index: dict[str, OpRecord], stage_of: StageOf) -> str:
    src, dst = index[edge.src_op], index[edge.dst_op]
    stage = stage_of(src, dst)
    if stage is None:
        raise IllegalReleaseError(
            f"{_edge_text(edge)} crosses stages ({src.stage_id or '(none)'} -> "
            f"{dst.stage_id or '(none)'}); a barrier orders ops of one stage only"
        )
    return stage


_STATE_OPS = (OpKind.STATE_READ, OpKind.STATE_WRITE)


def _applied_at(op: OpRecord) -> tuple[float, str] | None:
    """When the recorded run applied a state op (completion; ties in op-id order, as the task
    runner applies them), None when it did not complete."""
    t = op.times.completed_s
    return None if t is None else (t, op.op_id)


def _check_state_versions(
    edges: list[BarrierEdge], index: dict[str, OpRecord], recorded: nx.DiGraph
) -> None:
    """Refuse barrier edges that order a state op after one the recorded run applied later,
    when one of the two is a write (module docstring, rule 3)."""
    by_root: dict[str, list[BarrierEdge]] = {}
    for e in edges:
        by_root.setdefault(index[e.src_op].root_id, []).append(e)
    for root_edges in by_root.values():
        root = index[root_edges[0].src_op].root_id
        state = [op for op in index.values() if op.root_id == root and op.kind in _STATE_OPS]
        if not any(op.kind is OpKind.STATE_WRITE for op in state):
            continue
        g = recorded.copy()
        for e in root_edges:
            before = nx.ancestors(g, e.src_op) | {e.src_op}
            after = nx.descendants(g, e.dst_op) | {e.dst_op}
            for a in state:
                if a.op_id not in before:
                    continue
                for b in state:
                    if b.op_id not in after or a is b or nx.has_path(g, a.op_id, b.op_id):
                        continue
                    if OpKind.STATE_WRITE not in (a.kind, b.kind):
                        continue
                    ta, tb = _applied_at(a), _applied_at(b)
                    if ta is not None and tb is not None and ta < tb:
                        continue  # the recorded run applied them in this order already
                    what = (
                        f"{b.kind.value} {b.op_id} recorded an older version than "
                        f"{a.kind.value} {a.op_id} would leave"
                        if ta is not None and tb is not None
                        else f"the recorded order of {a.op_id} and {b.op_id} is unknown"
                    )
                    raise IllegalReleaseError(
                        f"{_edge_text(e)}: shared-state version conflict: it orders "
                        f"{a.kind.value} {a.op_id} before {b.kind.value} {b.op_id}, but {what}; "
                        "a barrier may not reorder state operations"
                    )
            g.add_edge(e.src_op, e.dst_op)


def barrier_edges(
    trace: Trace, edges: Iterable[Barrier], stage_of: StageOf = same_stage_instance
) -> list[BarrierEdge]:
    """The legal op edges a barrier adds to `trace`, each with its note and stage, in order.

    Stage barriers and per-root edges are expanded (`expand_stage_barrier`, note "stage a -> b";
    `expand_per_root_edge`, note "each root a -> b"); an edge listed earlier is left out. Every
    edge is checked against the module docstring's rules 1–4 (cycles are checked by
    `apply_barrier`) and returned with `stage` set to `stage_of(src, dst)`. The replay driver
    writes this list into the replay trace's notes, so a bundle says which barrier added each
    edge.

    Raises:
        IllegalReleaseError: an edge names an unknown op, crosses roots, orders dependent ops,
            crosses stages or reorders state operations; a stage barrier matches no root, or a
            per-root edge names an op no root realized. The message names both ops.

    Examples:
        >>> from maserve_prefect.trace.model import Manifest, OpKind, OpRecord, Trace
        >>> tr = Trace(manifest=Manifest(trace_id="x"), ops=[
        ...     OpRecord(op_id="r/a", root_id="r", stage_id="r/s", kind=OpKind.MODEL),
        ...     OpRecord(op_id="r/b", root_id="r", stage_id="r/s", kind=OpKind.MODEL)])
        >>> barrier_edges(tr, [BarrierEdge("r/a", "r/b", "scenario"), BarrierEdge("r/a", "r/b")])
        [BarrierEdge(src_op='r/a', dst_op='r/b', note='scenario', stage='r/s')]
    """
    index = trace.op_index()
    recorded = _dep_graph(index.values())
    out: list[BarrierEdge] = []
    seen: set[tuple[str, str]] = set()
    for item in edges:
        for edge in _expand(trace, item):
            _check_edge(edge, index)
            pair = (edge.src_op, edge.dst_op)
            if pair in seen:
                continue
            if edge.src_op == edge.dst_op:
                raise IllegalReleaseError(
                    f"{_edge_text(edge)} orders an op after itself; name two different ops"
                )
            _check_independent(edge, recorded)
            stage = _check_stage(edge, index, stage_of)
            seen.add(pair)
            out.append(replace(edge, stage=stage))
    _check_state_versions(out, index, recorded)
    return out


def apply_barrier(
    trace: Trace, edges: Iterable[Barrier], stage_of: StageOf = same_stage_instance
) -> Trace:
    """Return a new trace whose ops gain the barrier's coordination edges (all deps kept).

    Args:
        trace: the recorded trace (left unchanged).
        edges: op edges, stage barriers and/or per-root edges.
        stage_of: which ops share a stage (`barrier_edges`).

    Raises:
        IllegalReleaseError: an edge is illegal (`barrier_edges`), or the result would be cyclic
            (the message names the cycle's op ids).

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
    added: dict[str, list[BarrierEdge]] = {}
    for edge in barrier_edges(trace, edges, stage_of):
        added.setdefault(edge.dst_op, []).append(edge)
    g = _dep_graph(index.values())
    g.add_edges_from((e.src_op, dst) for dst, es in added.items() for e in es)
    _raise_if_cyclic(g, "barrier")
    new_ops = [
        op.model_copy(
            update={
                "deps": op.deps
                + tuple(
                    Dep(
                        op_id=e.src_op,
                        kind=EdgeKind.CONTROL,
                        required=False,
                        origin=DepOrigin.BARRIER,
                        stage=e.stage,
                    )
                    for e in added[op.op_id]
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
    within one root, and the result acyclic. (Which control edges a barrier may add — independent
    ops of one stage, no state version conflict — is `barrier_edges`' check.)

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
