"""The one topological order: Kahn's algorithm with the smallest key first among ready nodes.

One idea: every place that walks a DAG in dependency order — a workload's stages
(`spec.workload`), a trace bundle's ops (`trace.bundle`), a pool plan's units (`pool.window`) —
needs an order that is deterministic, so it takes the ready node with the smallest key each time
(ties by the order the nodes were given). `topological_order` is that order, written once;
networkx's `lexicographical_topological_sort` gives the same order, at the cost of building a
graph, which the pool plans would pay at every plan.

Examples:
    >>> topological_order(["c", "b", "a"], [("a", "c"), ("b", "c")])
    ['a', 'b', 'c']
    >>> topological_order([1, 2], [(1, 2), (2, 1)])
    Traceback (most recent call last):
    ...
    ValueError: the graph has a cycle through [1, 2]
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Hashable, Iterable
from typing import Any, TypeVar

N = TypeVar("N", bound=Hashable)


def topological_order(
    nodes: Iterable[N],
    edges: Iterable[tuple[N, N]],
    key: Callable[[N], Any] | None = None,
) -> list[N]:
    """`nodes` so that every edge `(u, v)` has `u` before `v`; among nodes whose predecessors are
    all placed, the smallest `key(node)` goes first (default: the node itself), ties by the order
    `nodes` were given.

    Raises:
        ValueError: an edge names a node not in `nodes`, or the graph has a cycle (the message
            lists the first nodes on it); callers turn it into their own error.
    """
    index = {n: i for i, n in enumerate(nodes)}
    succs: dict[N, list[N]] = {n: [] for n in index}
    indeg = dict.fromkeys(index, 0)
    for u, v in edges:
        if u not in index or v not in index:
            raise ValueError(f"edge {u!r} -> {v!r} names a node that is not in the graph")
        succs[u].append(v)
        indeg[v] += 1
    k = key if key is not None else (lambda n: n)
    heap = [(k(n), index[n], n) for n, d in indeg.items() if d == 0]
    heapq.heapify(heap)
    order: list[N] = []
    while heap:
        _, _, n = heapq.heappop(heap)
        order.append(n)
        for s in succs[n]:
            indeg[s] -= 1
            if indeg[s] == 0:
                heapq.heappush(heap, (k(s), index[s], s))
    if len(order) != len(index):
        stuck = sorted((n for n, d in indeg.items() if d > 0), key=index.__getitem__)[:5]
        raise ValueError(f"the graph has a cycle through {stuck}")
    return order
