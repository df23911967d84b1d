"""Semantic Trace invariants, checked on a whole `Trace` and reported by op id and line.

The one idea: `find_problems` collects *every* broken invariant as a `Problem` (pure, no
raising); `validate_trace` raises one `TraceValidationError` listing the first few and counting
the rest. When the trace came from a file, pass `source` (the file) and `op_lines`
(`(op_id, attempt) → line`) and each message starts `file:line:` so an editor can jump to it.

Invariants (DESIGN.md, Semantic Trace v1):

- ids are unique: roots, stages, sessions, and `(op_id, attempt)`;
- every stage, session and op names a recorded root;
- every dependency names an op of the trace, and the op graph is acyclic (a cycle is reported
  with the ops on it, from `networkx.find_cycle`);
- every data edge into a completed op has a predecessor with an output payload (its latest
  attempt's `output_ref`; a failed or skipped op may have consumed nothing), and,
  when a store is given, every digest an op references is in the store.

A retried op contributes every attempt's dependencies to the graph; data edges resolve to the
predecessor's latest attempt, the one whose output was consumed.

Examples:
    >>> from maserve_prefect.trace.model import Dep, EdgeKind, Manifest, OpKind, OpRecord, RootRecord, Trace
    >>> a = OpRecord(op_id="a", root_id="r", kind=OpKind.TOOL, deps=(Dep(op_id="b", kind=EdgeKind.CONTROL),))
    >>> b = OpRecord(op_id="b", root_id="r", kind=OpKind.TOOL, deps=(Dep(op_id="a", kind=EdgeKind.CONTROL),))
    >>> t = Trace(manifest=Manifest(trace_id="t"), roots=[RootRecord(root_id="r")], ops=[a, b])
    >>> [p.message for p in find_problems(t)]
    ["the op graph has a cycle: 'a' -> 'b' -> 'a'; remove one of these dependencies"]
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass

import networkx as nx

from maserve_prefect.errors import TraceValidationError
from maserve_prefect.trace.cas import BlobStore
from maserve_prefect.trace.model import EdgeKind, OpRecord, OpStatus, Trace

MAX_LISTED_PROBLEMS = 10


@dataclass(frozen=True, slots=True)
class Problem:
    """One broken invariant: what, and where (op id / attempt / file line when known)."""

    message: str
    op_id: str | None = None
    attempt: int | None = None
    line: int | None = None

    def render(self, source: str | None = None) -> str:
        """`source:line: op 'x': message`, leaving out the parts that are unknown."""
        where = []
        if source is not None:
            where.append(f"{source}:{self.line}" if self.line is not None else source)
        elif self.line is not None:
            where.append(f"line {self.line}")
        if self.op_id is not None:
            suffix = f" attempt {self.attempt}" if self.attempt not in (None, 1) else ""
            where.append(f"op {self.op_id!r}{suffix}")
        return ": ".join([*where, self.message])


def find_problems(
    trace: Trace,
    store: BlobStore | None = None,
    *,
    op_lines: Mapping[tuple[str, int], int] | None = None,
) -> list[Problem]:
    """Every broken invariant of `trace`, in a stable order (ids, roots, deps, cycle, payloads).

    Args:
        trace: the trace to check.
        store: when given, every referenced digest must be in it.
        op_lines: `(op_id, attempt) → line` of each op in its source file.

    Examples:
        >>> from maserve_prefect.trace.model import Manifest, Trace
        >>> find_problems(Trace(manifest=Manifest(trace_id="t")))
        []
    """
    lines = op_lines or {}

    def at(op: OpRecord, message: str) -> Problem:
        return Problem(message, op.op_id, op.attempt, lines.get((op.op_id, op.attempt)))

    problems: list[Problem] = []
    for kind, ids in (
        ("root", [r.root_id for r in trace.roots]),
        ("stage", [s.stage_id for s in trace.stages]),
        ("session", [s.session_id for s in trace.sessions]),
    ):
        for dup, n in sorted(Counter(ids).items()):
            if n > 1:
                problems.append(Problem(f"{kind} id {dup!r} is used {n} times; ids must be unique"))
    seen: set[tuple[str, int]] = set()
    for op in trace.ops:
        key = (op.op_id, op.attempt)
        if key in seen:
            problems.append(at(op, "duplicate (op_id, attempt); record a retry as a new attempt"))
        seen.add(key)

    root_ids = {r.root_id for r in trace.roots}
    for kind, id_root in (
        ("stage", [(s.stage_id, s.root_id) for s in trace.stages]),
        ("session", [(s.session_id, s.root_id) for s in trace.sessions]),
    ):
        for rec_id, root_id in id_root:
            if root_id not in root_ids:
                problems.append(Problem(f"{kind} {rec_id!r} names unknown root {root_id!r}"))
    for op in trace.ops:
        if op.root_id not in root_ids:
            problems.append(at(op, f"names root {op.root_id!r}, which has no root record"))

    latest = trace.op_index()
    graph: nx.DiGraph[str] = nx.DiGraph()
    graph.add_nodes_from(latest)
    for op in trace.ops:
        for dep in op.deps:
            if dep.op_id not in latest:
                problems.append(
                    at(op, f"depends on {dep.op_id!r}, which is not an op of the trace")
                )
                continue
            graph.add_edge(dep.op_id, op.op_id)
            if (
                dep.kind is EdgeKind.DATA
                and op.status is OpStatus.COMPLETED  # a failed or skipped op may lack inputs
                and latest[dep.op_id].output_ref is None
            ):
                problems.append(
                    at(op, f"has a data dependency on {dep.op_id!r}, which has no output payload")
                )
    problems.extend(_cycle_problem(graph, latest, lines))

    if store is not None:
        for op in trace.ops:
            refs = [*op.input_refs, op.output_ref, op.output_token_ids_ref]
            for digest in dict.fromkeys(d for d in refs if d is not None):
                if not store.has(digest):
                    problems.append(at(op, f"references blob {digest}, which is not in the store"))
    return problems


def validate_trace(
    trace: Trace,
    store: BlobStore | None = None,
    *,
    source: str | None = None,
    op_lines: Mapping[tuple[str, int], int] | None = None,
) -> None:
    """Raise `TraceValidationError` if `trace` breaks any invariant (see the module docstring).

    The message lists up to `MAX_LISTED_PROBLEMS` problems, one per line, each naming its op id
    (and `source:line` when known), and says how many more there are.

    Examples:
        >>> from maserve_prefect.trace.model import Manifest, OpKind, OpRecord, Trace
        >>> t = Trace(manifest=Manifest(trace_id="t"), ops=[OpRecord(op_id="x", root_id="r", kind=OpKind.TOOL)])
        >>> validate_trace(t)
        Traceback (most recent call last):
        ...
        maserve_prefect.errors.TraceValidationError: trace 't' is invalid (1 problem):
          op 'x': names root 'r', which has no root record
    """
    problems = find_problems(trace, store, op_lines=op_lines)
    if not problems:
        return
    n = len(problems)
    listed = [f"  {p.render(source)}" for p in problems[:MAX_LISTED_PROBLEMS]]
    if n > MAX_LISTED_PROBLEMS:
        listed.append(f"  ... and {n - MAX_LISTED_PROBLEMS} more")
    head = f"trace {trace.manifest.trace_id!r} is invalid ({n} problem{'s' if n > 1 else ''}):"
    raise TraceValidationError("\n".join([head, *listed]))


def _cycle_problem(
    graph: nx.DiGraph[str], ops: Mapping[str, OpRecord], lines: Mapping[tuple[str, int], int]
) -> list[Problem]:
    try:
        cycle = nx.find_cycle(graph)
    except nx.NetworkXNoCycle:
        return []
    path = [u for u, _v in cycle] + [cycle[0][0]]
    first = ops[path[0]]
    return [
        Problem(
            "the op graph has a cycle: "
            + " -> ".join(repr(p) for p in path)
            + "; remove one of these dependencies",
            line=lines.get((first.op_id, first.attempt)),
        )
    ]
