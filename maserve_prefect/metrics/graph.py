"""Graph metrics of a root's LLM-call graph: depth, level widths, antichain width, peak in-flight.

The one idea: every metric is computed on `trace.graph.llm_graph` — model calls only, non-model
paths collapsed, transitive edges removed — so a tool between two calls never changes them.

- `depth`: model calls on the longest path (the critical path length in calls).
- `level_widths`: calls per longest-path level (level = calls on the longest path ending there,
  minus one); the classic "how parallel is each stage" profile.
- `antichain_width`: the largest set of calls no two of which are ordered — the most calls that
  *could* run at once. Dilworth: it equals the minimum number of chains covering the partial
  order, which is n − (maximum matching in the bipartite "u before v" graph of the transitive
  closure).
- `peak_in_flight`: the most calls the client actually had outstanding at once, from observed
  [submitted, completed) intervals; a completion at t happens before a submission at t.

Examples:
    >>> import networkx as nx
    >>> g = nx.DiGraph([("a1", "s"), ("a2", "s"), ("s", "v")])
    >>> depth(g), level_widths(g), antichain_width(g)
    (3, [2, 1, 1], 2)
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import networkx as nx
import numpy as np
from networkx.algorithms import bipartite

from maserve_prefect.errors import TraceValidationError
from maserve_prefect.trace.graph import llm_graph, op_graph, root_op_graphs
from maserve_prefect.trace.model import OpTimes, Trace


def depth(g: nx.DiGraph) -> int:
    """Number of calls on the longest path of a DAG (0 for an empty graph).

    Examples:
        >>> depth(nx.DiGraph([("a", "b"), ("b", "c")]))
        3
    """
    if g.number_of_nodes() == 0:
        return 0
    return int(nx.dag_longest_path_length(g)) + 1


def _levels(g: nx.DiGraph) -> dict[str, int]:
    level: dict[str, int] = {}
    for node in nx.topological_sort(g):
        level[node] = max((level[p] + 1 for p in g.predecessors(node)), default=0)
    return level


def level_widths(g: nx.DiGraph) -> list[int]:
    """Nodes per longest-path level, level 0 first (sources are level 0).

    Examples:
        >>> level_widths(nx.DiGraph([("a", "c"), ("b", "c"), ("a", "d")]))
        [2, 2]
    """
    levels = _levels(g)
    if not levels:
        return []
    return np.bincount(np.fromiter(levels.values(), dtype=np.int64)).tolist()


def antichain_width(g: nx.DiGraph) -> int:
    """Size of a maximum antichain of a DAG, by Dilworth's theorem via bipartite matching.

    Examples:
        >>> antichain_width(nx.DiGraph([("a", "b"), ("c", "d")]))
        2
    """
    n = g.number_of_nodes()
    if n == 0:
        return 0
    closure = nx.transitive_closure_dag(g)
    b = nx.Graph()
    left = [("L", u) for u in g.nodes]
    b.add_nodes_from(left)
    b.add_nodes_from(("R", v) for v in g.nodes)
    b.add_edges_from((("L", u), ("R", v)) for u, v in closure.edges())
    matching = bipartite.maximum_matching(b, top_nodes=left)
    # The matching dict holds both directions of every matched pair.
    return n - len(matching) // 2


def peak_in_flight(intervals: Iterable[tuple[float, float]]) -> int:
    """Largest number of overlapping half-open [submitted, completed) intervals.

    Raises:
        TraceValidationError: an interval ends before it starts.

    Examples:
        >>> peak_in_flight([(0.0, 2.0), (1.0, 3.0), (2.0, 4.0)])
        2
    """
    events: list[tuple[float, int]] = []
    for start, end in intervals:
        if end < start:
            raise TraceValidationError(
                f"interval [{start}, {end}) completes before it is submitted; fix the op's times"
            )
        if end > start:
            # -1 sorts before +1: a completion at t frees its slot before a submission at t.
            events.append((start, 1))
            events.append((end, -1))
    events.sort()
    peak = current = 0
    for _, delta in events:
        current += delta
        peak = max(peak, current)
    return peak


def _call_intervals(g: nx.DiGraph) -> list[tuple[float, float]] | None:
    """[submitted, completed) of every call, or None when any call lacks those timestamps."""
    intervals = []
    times: OpTimes
    for _, times in g.nodes(data="times"):
        if times is None or times.submitted_s is None or times.completed_s is None:
            return None
        intervals.append((times.submitted_s, times.completed_s))
    return intervals


@dataclass(slots=True, frozen=True)
class GraphStats:
    """Graph metrics of one root.

    Attributes:
        root_id: the root.
        num_ops: ops of the root (all kinds).
        num_calls: model ops (nodes of the LLM graph).
        num_edges: edges of the LLM graph after collapse and transitive reduction.
        depth: calls on the longest path.
        level_widths: calls per longest-path level.
        antichain_width: maximum antichain (most calls that could run concurrently).
        peak_in_flight: most calls outstanding at once; None when some call lacks
            submitted/completed timestamps (e.g. imported traces before replay).
    """

    root_id: str
    num_ops: int
    num_calls: int
    num_edges: int
    depth: int
    level_widths: tuple[int, ...]
    antichain_width: int
    peak_in_flight: int | None


def _stats_of(root_id: str, g: nx.DiGraph) -> GraphStats:
    calls = llm_graph(g)
    intervals = _call_intervals(calls)
    return GraphStats(
        root_id=root_id,
        num_ops=g.number_of_nodes(),
        num_calls=calls.number_of_nodes(),
        num_edges=calls.number_of_edges(),
        depth=depth(calls),
        level_widths=tuple(level_widths(calls)),
        antichain_width=antichain_width(calls),
        peak_in_flight=None if intervals is None else peak_in_flight(intervals),
    )


def root_graph_stats(trace: Trace, root_id: str) -> GraphStats:
    """Graph metrics of one root of a trace.

    Raises:
        TraceValidationError: unknown root, dangling dep or cyclic op graph.

    Examples:
        >>> from maserve_prefect.trace.model import Manifest, OpKind, OpRecord, Trace
        >>> tr = Trace(manifest=Manifest(trace_id="x"),
        ...            ops=[OpRecord(op_id="r/op0", root_id="r", kind=OpKind.MODEL)])
        >>> root_graph_stats(tr, "r").depth
        1
    """
    return _stats_of(root_id, op_graph(trace, root_id))


@dataclass(slots=True, frozen=True)
class Distribution:
    """Mean, median and maximum of a per-root quantity."""

    mean: float
    p50: float
    max: float

    @classmethod
    def of(cls, values: Sequence[float]) -> Distribution:
        """Summarize values (all zeros for an empty sequence)."""
        if not values:
            return cls(0.0, 0.0, 0.0)
        arr = np.asarray(values, dtype=float)
        return cls(float(arr.mean()), float(np.median(arr)), float(arr.max()))


@dataclass(slots=True, frozen=True)
class GraphSummary:
    """Graph metrics over every root of a trace.

    Attributes:
        per_root: stats of each root, in root order.
        depth / antichain_width / num_calls: distributions over roots.
        peak_in_flight: distribution over roots that have call timestamps (None if none do).
    """

    per_root: tuple[GraphStats, ...]
    depth: Distribution
    antichain_width: Distribution
    num_calls: Distribution
    peak_in_flight: Distribution | None

    @property
    def num_roots(self) -> int:
        """Number of roots summarized."""
        return len(self.per_root)


def trace_graph_summary(trace: Trace) -> GraphSummary:
    """Graph metrics of every root and their distribution over roots.

    Examples:
        >>> from maserve_prefect.trace.model import Manifest, OpKind, OpRecord, Trace
        >>> tr = Trace(manifest=Manifest(trace_id="x"),
        ...            ops=[OpRecord(op_id=f"r{i}/op0", root_id=f"r{i}", kind=OpKind.MODEL)
        ...                 for i in range(3)])
        >>> s = trace_graph_summary(tr)
        >>> s.num_roots, s.depth.max
        (3, 1.0)
    """
    per_root = tuple(_stats_of(root_id, g) for root_id, g in root_op_graphs(trace))
    peaks = [s.peak_in_flight for s in per_root if s.peak_in_flight is not None]
    return GraphSummary(
        per_root=per_root,
        depth=Distribution.of([s.depth for s in per_root]),
        antichain_width=Distribution.of([s.antichain_width for s in per_root]),
        num_calls=Distribution.of([s.num_calls for s in per_root]),
        peak_in_flight=Distribution.of(peaks) if peaks else None,
    )
