"""Finding 1, legal control at fixed work (seed paper §6.2, App. D.1, Figure 4(b)): paper rows.

One idea: freeze a native realization and vary only a legal release constraint (Barrier orders
independent branches of one fork stage); with the work fixed, what changes is how many model
calls the release rule lets run at once — the *scheduled width* — and, through it, root latency.
Each scenario of `deployments/suites/finding_barrier.yaml` replays one frozen trace set under
arms named `dag` and `barrier`; its cohort's workflow says which paper figures it reproduces
(`FIGURES`): the four-call Full and Selected traces and the GPT-Researcher-sized Full traces.

Figures, per paired block (a block's DAG and Barrier arm runs replay the same roots at the same
arrivals), then the median and range across blocks (`block_figures.put`):

- **mean root latency change** = mean Barrier root latency / mean DAG root latency − 1, in %,
  over the measured roots (a block where a measured root did not complete in either arm has no
  value);
- **scheduled width** (`scheduled_width`) = Σ over the block's measured roots of the antichain
  width of the root's *release graph*: its model calls, ordered by every dependency the arm's
  release rule honours (recorded dependencies; plus the barrier's coordination edges under
  Barrier), paths through non-model ops collapsed. It is the most model calls the release rule
  lets be in flight at once when the roots overlap — 12 four-call roots × 2 analysts = 24 under
  DAG, 12 × 1 = 12 once the analysts are ordered; 3 GPT-Researcher roots × 3 research branches
  = 9, and 3 when the branches are ordered. The paper's Appendix A.3 computes antichain width
  the same way (reachability and bipartite matching on the LLM-only graph);
- **peak in flight** (`peak_in_flight`, a detail row) = the most model calls submitted and not
  yet completed at one instant of the replay (the client in-flight count of App. A.3): what the
  run actually reached, which can stay below the scheduled width when roots do not overlap;
- **model calls** = model ops of the block's measured roots (the paper's 48 per four-call block,
  83 over the three GPT-Researcher captures).

Examples:
    >>> from maserve_prefect.trace.model import Dep, EdgeKind, Manifest, OpKind, OpRecord, Trace
    >>> def op(i, *deps):
    ...     return OpRecord(op_id=f"r/{i}", root_id="r", kind=OpKind.MODEL,
    ...                     deps=tuple(Dep(op_id=f"r/{d}", kind=EdgeKind.DATA) for d in deps))
    >>> tr = Trace(manifest=Manifest(trace_id="x"),
    ...            ops=[op("a"), op("b"), op("s", "a", "b"), op("v", "s")])
    >>> scheduled_width(tr.ops, honour_barrier=False)
    2
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

import networkx as nx

from maserve_prefect.bench.replay import block_figures as bf
from maserve_prefect.bench.replay.block_figures import Row
from maserve_prefect.bench.replay.paper import PAPER_COLUMNS, PaperFigure, paper_row
from maserve_prefect.replay.arms import ArmResult, ScenarioResult
from maserve_prefect.trace.model import DepOrigin, OpKind, OpRecord

FINDING = "F1 legal control at fixed work"

_FOURCALL_SETUP = (
    "Qwen3-8B/910C; frozen four-call {ctx} traces, 12 roots × 3 blocks (48 calls each), DAG vs "
    "Barrier (analyst_a → analyst_b)"
)
_GPTR_SETUP = (
    "Qwen3.5-9B/RTX PRO 5000, BF16, TP1, limit 64, no prefix caching; 3 frozen GPT Researcher "
    "Full captures (83 calls) at 0/0.1/0.2 s, 3 blocks AB/BA/AB, research branches ordered"
)

FOURCALL_FULL_LATENCY = PaperFigure(
    FINDING,
    "four-call Full: mean root latency change, Barrier vs DAG (%)",
    26.0,
    _FOURCALL_SETUP.format(ctx="Full"),
    "§6.2 'Legal control at fixed work', Fig. 4(b)",
)
FOURCALL_FULL_WIDTH_DAG = PaperFigure(
    FINDING,
    "four-call Full: scheduled width, DAG (calls)",
    24.0,
    _FOURCALL_SETUP.format(ctx="Full"),
    "§6.2 'Legal control at fixed work'",
    kind="value",
)
FOURCALL_FULL_WIDTH_BARRIER = PaperFigure(
    FINDING,
    "four-call Full: scheduled width, Barrier (calls)",
    12.0,
    _FOURCALL_SETUP.format(ctx="Full"),
    "§6.2 'Legal control at fixed work'",
    kind="value",
)
FOURCALL_SELECTED_LATENCY = PaperFigure(
    FINDING,
    "four-call Selected: mean root latency change, Barrier vs DAG (%)",
    28.0,
    _FOURCALL_SETUP.format(ctx="Selected"),
    "§6.2 'Legal control at fixed work'; App. D.1, Table D.1",
)
GPTR_LATENCY = PaperFigure(
    FINDING,
    "GPT Researcher Full: mean root latency change, Barrier vs DAG (%; paper 40–54 across "
    "blocks, midpoint)",
    47.0,
    _GPTR_SETUP,
    "§6.2 'Legal control at fixed work', Fig. 4(b); App. D.1",
)
GPTR_WIDTH_DAG = PaperFigure(
    FINDING,
    "GPT Researcher Full: scheduled width, DAG (calls)",
    9.0,
    _GPTR_SETUP,
    "§6.2 'Legal control at fixed work'",
    kind="value",
)
GPTR_WIDTH_BARRIER = PaperFigure(
    FINDING,
    "GPT Researcher Full: scheduled width, Barrier (calls)",
    3.0,
    _GPTR_SETUP,
    "§6.2 'Legal control at fixed work'",
    kind="value",
)
GPTR_CALLS = PaperFigure(
    FINDING,
    "GPT Researcher Full: model calls in the frozen captures",
    83.0,
    _GPTR_SETUP,
    "§6.2; App. D.1 (28 / 30 / 25 calls)",
    kind="value",
)

FIGURES: Mapping[str, tuple[PaperFigure, ...]] = {
    "four_call_full": (FOURCALL_FULL_LATENCY, FOURCALL_FULL_WIDTH_DAG, FOURCALL_FULL_WIDTH_BARRIER),
    "four_call_selected": (FOURCALL_SELECTED_LATENCY,),
    "gpt_researcher_full": (GPTR_LATENCY, GPTR_WIDTH_DAG, GPTR_WIDTH_BARRIER, GPTR_CALLS),
}
"""The target cohort's workflow → the paper figures its scenario reproduces (latency change
first, then the scheduled widths of DAG and Barrier, then the call count where the paper states
one)."""


# -- pure figures ------------------------------------------------------------------------------


def release_graph(ops: Iterable[OpRecord], *, honour_barrier: bool) -> nx.DiGraph:
    """The model calls of `ops` ordered by the dependencies a release rule honours.

    Recorded dependencies always count; barrier (coordination) edges only when `honour_barrier`.
    An edge u → v means v cannot be released before u completed, directly or through non-model
    ops (paths through them are collapsed; the graph is transitively closed).
    """
    ops = list(ops)
    full = nx.DiGraph()
    for op in ops:
        full.add_node(op.op_id)
        for dep in op.deps:
            if dep.origin is DepOrigin.BARRIER and not honour_barrier:
                continue
            full.add_edge(dep.op_id, op.op_id)
    closure = nx.transitive_closure_dag(full)
    model = [op.op_id for op in ops if op.kind is OpKind.MODEL]
    return closure.subgraph(model).copy()


def antichain_width(closed: nx.DiGraph) -> int:
    """The largest set of pairwise unordered nodes of a transitively closed DAG (Dilworth:
    nodes − a maximum matching of its bipartite split).

    Examples:
        >>> g = nx.DiGraph([("a", "s"), ("b", "s"), ("s", "v"), ("a", "v"), ("b", "v")])
        >>> antichain_width(g), antichain_width(nx.DiGraph())
        (2, 0)
    """
    if closed.number_of_nodes() == 0:
        return 0
    split = nx.Graph()
    left = [("out", n) for n in closed.nodes]
    split.add_nodes_from(left, bipartite=0)
    split.add_nodes_from((("in", n) for n in closed.nodes), bipartite=1)
    split.add_edges_from((("out", u), ("in", v)) for u, v in closed.edges)
    matching = nx.bipartite.hopcroft_karp_matching(split, top_nodes=left)
    return closed.number_of_nodes() - len(matching) // 2


def scheduled_width(ops: Iterable[OpRecord], *, honour_barrier: bool) -> int:
    """Σ over roots of the antichain width of each root's release graph (module docstring)."""
    by_root: dict[str, list[OpRecord]] = {}
    for op in ops:
        by_root.setdefault(op.root_id, []).append(op)
    return sum(
        antichain_width(release_graph(root_ops, honour_barrier=honour_barrier))
        for root_ops in by_root.values()
    )


def peak_in_flight(ops: Iterable[OpRecord]) -> int:
    """The most model calls submitted and not yet completed at one instant (a call completing
    at the instant another is submitted no longer counts).

    Examples:
        >>> from maserve_prefect.trace.model import OpTimes
        >>> def op(i, s, e):
        ...     return OpRecord(op_id=i, root_id="r", kind=OpKind.MODEL,
        ...                     times=OpTimes(submitted_s=s, completed_s=e))
        >>> peak_in_flight([op("a", 0, 2), op("b", 1, 3), op("c", 2, 4)])
        2
    """
    events: list[tuple[float, int]] = []
    for op in ops:
        s, e = op.times.submitted_s, op.times.completed_s
        if op.kind is not OpKind.MODEL or s is None:
            continue
        events.append((s, 1))
        if e is not None:
            events.append((e, -1))
    peak = level = 0
    for _, step in sorted(events):  # at one instant, completions (-1) sort before submissions
        level += step
        peak = max(peak, level)
    return peak


def mean_latency_change_pct(
    dag: Mapping[str, float | None], bar: Mapping[str, float | None]
) -> float | None:
    """(mean Barrier latency / mean DAG latency − 1) × 100 over the same roots; None when a root
    did not complete in either arm or the sets of roots differ.

    Examples:
        >>> mean_latency_change_pct({"a": 1.0, "b": 3.0}, {"a": 2.0, "b": 3.0})
        25.0
        >>> mean_latency_change_pct({"a": 1.0}, {"a": None}) is None
        True
    """
    if not dag or set(dag) != set(bar):
        return None
    d = [dag[k] for k in dag]
    b = [bar[k] for k in dag]
    if any(x is None for x in d + b):
        return None
    dm = sum(x for x in d if x is not None) / len(d)
    bm = sum(x for x in b if x is not None) / len(b)
    return (bm / dm - 1.0) * 100.0 if dm > 0 else None


# -- per block ---------------------------------------------------------------------------------


def _measured(result: ScenarioResult, res: ArmResult) -> dict[str, float | None]:
    return {o.root_id: o.latency_s for o in bf.measured_outcomes(result, res.run)}


def _measured_ops(res: ArmResult, roots: Iterable[str], *, replayed: bool) -> list[OpRecord]:
    keep = set(roots)
    trace = res.run.trace if replayed else res.run.source
    return [op for op in trace.ops if op.root_id in keep]


def _workflow(result: ScenarioResult) -> str:
    targets = [c for c in result.scenario.cohorts if c.role == "target"]
    natives = {c.native.workflow for c in targets if c.native is not None}
    return natives.pop() if len(natives) == 1 else ""


def _our_setup(result: ScenarioResult, roots: int) -> str:
    s = result.scenario
    pools = sorted({a.pool.name for a in s.arms if a.pool is not None}) or ["default pool"]
    arrivals: str = s.arrivals.kind
    if s.arrivals.kind == "explicit":
        arrivals = "at " + "/".join(f"{t:g}" for t in s.arrivals.times_s[:roots]) + " s"
    elif s.arrivals.kind == "burst":
        arrivals = f"all at {s.arrivals.at_s:g} s"
    return (
        f"{_workflow(result)} frozen (simulator), {roots} roots × {s.blocks} blocks, arrivals "
        f"{arrivals}; {', '.join(pools)}"
    )


def scenario_rows(result: ScenarioResult) -> list[Row]:
    """Paper rows of one scenario (arms `dag` and `barrier`), then its detail rows."""
    figures = FIGURES.get(_workflow(result))
    if figures is None:
        return []
    by_arm = result.by_arm()
    pairs = list(zip(by_arm["dag"], by_arm["barrier"], strict=True))
    change: list[float | None] = []
    width: dict[str, list[float | None]] = {"dag": [], "barrier": []}
    peak: dict[str, list[float | None]] = {"dag": [], "barrier": []}
    calls: list[float | None] = []
    roots = 0
    for dag, bar in pairs:
        d, b = _measured(result, dag), _measured(result, bar)
        roots = len(d)
        change.append(mean_latency_change_pct(d, b))
        for name, res in (("dag", dag), ("barrier", bar)):
            src = _measured_ops(res, d, replayed=False)
            width[name].append(float(scheduled_width(src, honour_barrier=name == "barrier")))
            peak[name].append(float(peak_in_flight(_measured_ops(res, d, replayed=True))))
        calls.append(
            float(sum(op.kind is OpKind.MODEL for op in _measured_ops(dag, d, replayed=False)))
        )
    ours = _our_setup(result, roots)
    values = {"latency": change, "dag": width["dag"], "barrier": width["barrier"], "calls": calls}
    keys = ("latency", "dag", "barrier", "calls")
    rows = [paper_row(fig, ours, values[key]) for fig, key in zip(figures, keys, strict=False)]
    label = figures[0].figure.split(":")[0]
    for name, arm in (("dag", "DAG"), ("barrier", "Barrier")):
        rows.append(
            detail_row(f"{label}: peak in flight, {arm} (calls)", ours, peak[name], PEAK_SOURCE)
        )
    for name, arm in (("dag", "DAG"), ("barrier", "Barrier")):
        means = [_mean(_measured(result, r)) for r in by_arm[name]]
        rows.append(detail_row(f"{label}: mean root latency, {arm} (s)", ours, means, ""))
    return rows


PEAK_SOURCE = "detail: client in-flight as App. A.3 defines it (not a paper figure here)"


def detail_row(figure: str, our_setup: str, per_block: Sequence[float | None], source: str) -> Row:
    """A row in the paper rows' columns for a figure the paper does not state here (no paper
    value, verdict `detail`), so the suite's table stays one table.

    Examples:
        >>> r = detail_row("x (s)", "ours", [1.0, 3.0, 2.0], "")
        >>> r["paper"], r["measured"], r["measured_range"], r["verdict"]
        (None, 2.0, '1–3', 'detail')
    """
    row: Row = {"finding": FINDING, "figure": figure, "paper": None, "paper_setup": "–"}
    row["our_setup"] = our_setup
    bf.put(row, "measured", per_block)
    row["blocks"] = len(per_block)
    row["verdict"] = "detail"
    row["source"] = source or "detail"
    return {k: row[k] for k in PAPER_COLUMNS}


def _mean(latencies: Mapping[str, float | None]) -> float | None:
    vals = list(latencies.values())
    if not vals or any(v is None for v in vals):
        return None
    return sum(v for v in vals if v is not None) / len(vals)


def barrier_rows(results: Mapping[str, ScenarioResult]) -> list[Row]:
    """The suite's `analysis:` hook: paper rows of every scenario, in suite order.

    Examples:
        >>> barrier_rows({})
        []
    """
    rows: list[Row] = []
    for result in results.values():
        rows += scenario_rows(result)
    return rows
