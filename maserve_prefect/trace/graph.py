"""The op graph of a trace as networkx digraphs: all ops, and the collapsed LLM-call graph.

The one idea: graph metrics talk about *model calls*, so `llm_graph` keeps only model ops and
connects two of them iff the second (transitively) waits for the first through non-model ops only
— a tool, transform or state op between two calls becomes a direct call→call edge — and then drops
edges implied by others (transitive reduction). The metrics themselves live in
`maserve_prefect.metrics.graph`; this module only builds graphs.

Node attributes: `kind` (`OpKind`), `role`, `stage_id`, `times` (`OpTimes`), `record` (the
`OpRecord`, last attempt when an op was retried). Edge attributes on `op_graph`: `kind` (the
strongest `EdgeKind` between the pair: data > state > control), `kinds` (all of them) and
`required` (any dep between the pair is required). Edges point from predecessor to successor.

Examples:
    >>> from maserve_prefect.trace.model import Dep, EdgeKind, Manifest, OpKind, OpRecord, Trace
    >>> a = OpRecord(op_id="r/a", root_id="r", kind=OpKind.MODEL)
    >>> t = OpRecord(op_id="r/t", root_id="r", kind=OpKind.TOOL,
    ...              deps=(Dep(op_id="r/a", kind=EdgeKind.DATA),))
    >>> b = OpRecord(op_id="r/b", root_id="r", kind=OpKind.MODEL,
    ...              deps=(Dep(op_id="r/t", kind=EdgeKind.DATA),))
    >>> tr = Trace(manifest=Manifest(trace_id="x"), ops=[a, t, b])
    >>> sorted(llm_graph(op_graph(tr)).edges())
    [('r/a', 'r/b')]
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Iterator

import networkx as nx

from maserve_prefect.errors import TraceValidationError
from maserve_prefect.trace.model import EdgeKind, OpKind, OpRecord, Trace

# Which edge kind names a pair when several deps link the same two ops.
_EDGE_STRENGTH = {EdgeKind.DATA: 2, EdgeKind.STATE: 1, EdgeKind.CONTROL: 0}


def _last_attempts(ops: Iterable[OpRecord]) -> dict[str, OpRecord]:
    """Op id → record, the last attempt winning (record order is attempt order)."""
    return {op.op_id: op for op in ops}


def _build(
    records: dict[str, OpRecord], where: str, elsewhere: frozenset[str] = frozenset()
) -> nx.DiGraph:
    g = nx.DiGraph()
    for op in records.values():
        g.add_node(
            op.op_id,
            kind=op.kind,
            role=op.role,
            stage_id=op.stage_id,
            times=op.times,
            record=op,
        )
    for op in records.values():
        for dep in op.deps:
            if dep.op_id in elsewhere:
                continue  # a cross-root dep (persistent memory): not part of this root's graph
            if dep.op_id not in records:
                raise TraceValidationError(
                    f"op {op.op_id!r} depends on {dep.op_id!r}, which is not an op of {where}; "
                    "fix the dep or include the missing op in the trace"
                )
            if g.has_edge(dep.op_id, op.op_id):
                data = g.edges[dep.op_id, op.op_id]
                data["kinds"] = tuple(sorted({*data["kinds"], dep.kind}))
                data["kind"] = max(data["kinds"], key=_EDGE_STRENGTH.__getitem__)
                data["required"] = data["required"] or dep.required
            else:
                g.add_edge(
                    dep.op_id, op.op_id, kind=dep.kind, kinds=(dep.kind,), required=dep.required
                )
    return g


def op_graph(trace: Trace, root_id: str | None = None) -> nx.DiGraph:
    """The op graph of a whole trace, or of one root.

    Args:
        trace: the trace.
        root_id: restrict to this root's ops; `None` takes every op.

    Returns:
        A `DiGraph` with one node per op id (attributes above) and one edge per predecessor pair.

    Raises:
        TraceValidationError: a dep names an op that is not in the trace, or `root_id` is unknown.
            A root's graph leaves out deps on other roots' ops (persistent-memory state edges).

    Examples:
        >>> from maserve_prefect.trace.model import Manifest, OpKind, OpRecord, Trace
        >>> tr = Trace(manifest=Manifest(trace_id="x"),
        ...            ops=[OpRecord(op_id="r/op0", root_id="r", kind=OpKind.MODEL)])
        >>> list(op_graph(tr, "r").nodes)
        ['r/op0']
    """
    if root_id is None:
        return _build(_last_attempts(trace.ops), "the trace")
    records = _last_attempts(op for op in trace.ops if op.root_id == root_id)
    if not records and root_id not in {r.root_id for r in trace.roots}:
        raise TraceValidationError(
            f"root {root_id!r} is not in trace {trace.manifest.trace_id!r}; "
            "pick one of its roots (see `maserve trace stats`)"
        )
    others = frozenset(op.op_id for op in trace.ops if op.root_id != root_id)
    return _build(records, f"root {root_id!r}", others)


def root_op_graphs(trace: Trace) -> Iterator[tuple[str, nx.DiGraph]]:
    """Yield `(root_id, op_graph)` for every root in root order, grouping ops in one pass.

    Roots listed in `trace.roots` without ops yield an empty graph; roots that only appear on ops
    follow in first-seen order.

    Examples:
        >>> from maserve_prefect.trace.model import Manifest, OpKind, OpRecord, Trace
        >>> tr = Trace(manifest=Manifest(trace_id="x"),
        ...            ops=[OpRecord(op_id="r/op0", root_id="r", kind=OpKind.MODEL)])
        >>> [(r, g.number_of_nodes()) for r, g in root_op_graphs(tr)]
        [('r', 1)]
    """
    by_root: dict[str, list[OpRecord]] = defaultdict(list)
    for op in trace.ops:
        by_root[op.root_id].append(op)
    order = list(dict.fromkeys([*(r.root_id for r in trace.roots), *by_root]))
    all_ids = frozenset(op.op_id for op in trace.ops)
    for root_id in order:
        records = _last_attempts(by_root.get(root_id, ()))
        yield root_id, _build(records, f"root {root_id!r}", all_ids - records.keys())


def _model_successors(g: nx.DiGraph, start: str) -> set[str]:
    """Model ops reachable from `start` through non-model ops only (first model op per path)."""
    found: set[str] = set()
    seen: set[str] = set()
    stack = list(g.successors(start))
    while stack:
        node = stack.pop()
        if node in seen:
            continue
        seen.add(node)
        if g.nodes[node]["kind"] == OpKind.MODEL:
            found.add(node)
        else:
            stack.extend(g.successors(node))
    return found


def llm_graph(g: nx.DiGraph) -> nx.DiGraph:
    """Collapse non-model ops out of an op graph and remove transitive edges.

    An edge u→v between model ops exists iff a path u→…→v exists whose inner nodes are all
    non-model ops, and it is not implied by a longer chain of model calls. Edge attribute
    `collapsed` is True when no direct dep links the pair (the path ran through non-model ops).

    Args:
        g: an op graph from `op_graph` (must be acyclic).

    Returns:
        A new `DiGraph` of model ops with the node attributes of `g`.

    Raises:
        TraceValidationError: `g` has a cycle (named by op ids).

    Examples:
        >>> g = nx.DiGraph([("a", "b"), ("b", "c"), ("a", "c")])
        >>> nx.set_node_attributes(g, OpKind.MODEL, "kind")
        >>> sorted(llm_graph(g).edges())
        [('a', 'b'), ('b', 'c')]
    """
    if not nx.is_directed_acyclic_graph(g):
        cycle = [u for u, _ in nx.find_cycle(g)]
        raise TraceValidationError(
            f"op graph has a cycle {' -> '.join([*cycle, cycle[0]])}; a trace must be acyclic"
        )
    models = [n for n, kind in g.nodes(data="kind") if kind == OpKind.MODEL]
    collapsed = nx.DiGraph()
    collapsed.add_nodes_from((n, g.nodes[n]) for n in models)
    for u in models:
        for v in _model_successors(g, u):
            collapsed.add_edge(u, v, collapsed=not g.has_edge(u, v))
    reduced = nx.transitive_reduction(collapsed)
    reduced.add_nodes_from(collapsed.nodes(data=True))
    reduced.add_edges_from((u, v, collapsed.edges[u, v]) for u, v in reduced.edges())
    return reduced
