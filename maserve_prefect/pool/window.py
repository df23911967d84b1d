"""The planning window: ready and near-ready units of a workflow DAG, with predicted release times.

One idea: every not-yet-finished unit gets a predicted release and completion by one forward
pass in topological order — a running unit completes at `max(start + predicted runtime, now)`
(a late unit is predicted to finish now, never in the past), a pending unit is released at the
latest predicted completion of its predecessors and completes a predicted runtime later. *Ready*
units have every predecessor done; *near-ready* units have every predecessor done or running and at
least one running. Static per-unit DAG facts (critical path to a sink, downstream work) come from
one backward pass (`dag_stats`), so baselines that rank by them stay cheap.

Everything here is a pure function of a `WorkUnit` DAG, unit statuses and a runtime predictor.

Examples:
    >>> a = WorkUnit("a", "r", "m", 10, 5, succs=("b",))
    >>> b = WorkUnit("b", "r", "m", 10, 5, preds=("a",))
    >>> w = build_window({"a": a, "b": b}, {"a": UnitStatus.RUNNING, "b": UnitStatus.PENDING},
    ...                  now_s=1.0, runtime_s=lambda u: 2.0, started_s={"a": 0.0})
    >>> [u.unit.unit_id for u in w.near_ready], w.near_ready[0].release_s
    (['b'], 2.0)
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from enum import Enum

from maserve_prefect.dag import topological_order
from maserve_prefect.errors import ConfigError

INF = float("inf")


@dataclass(frozen=True, slots=True)
class WorkUnit:
    """One model call of a workflow DAG.

    Attributes:
        deployment: the deployment (model + version + serving config) that must serve it.
        input_len / max_tokens: prompt tokens and output tokens (length-locked).
        preds / succs: unit ids it waits for / that wait for it (same root).
        priority: lower runs first (vLLM convention).
        workflow: the workflow (template) name, for reports.
        timing_tokens: output tokens the joint plan times the call on (`pool.outputs`: the p90
            of its node's recent completions); 0 = its limit `max_tokens`. Admission always
            uses the limit.
    """

    unit_id: str
    root_id: str
    deployment: str
    input_len: int
    max_tokens: int
    preds: tuple[str, ...] = ()
    succs: tuple[str, ...] = ()
    priority: int = 0
    workflow: str = ""
    timing_tokens: int = 0

    @property
    def context_tokens(self) -> int:
        return self.input_len + self.max_tokens

    @property
    def timing_output(self) -> int:
        """Output tokens to time the call on (`timing_tokens`, else the limit)."""
        return self.timing_tokens or self.max_tokens


class UnitStatus(Enum):
    """Ordered progress of a unit."""

    PENDING = 0
    READY = 1
    RUNNING = 2
    DONE = 3


@dataclass(frozen=True, slots=True)
class WindowUnit:
    """A ready or near-ready unit with its predictions.

    Attributes:
        release_s: when it became ready (ready units) or is predicted to (near-ready).
        completion_s: predicted completion if it started at its release.
        critical_path_s: predicted runtime of the longest path from it to a sink (itself included).
        downstream_work_s: predicted runtime of it and every unit after it.
        num_descendants: units after it in its DAG.
    """

    unit: WorkUnit
    release_s: float
    completion_s: float
    critical_path_s: float
    downstream_work_s: float
    num_descendants: int


@dataclass(frozen=True, slots=True)
class Window:
    """Ready and near-ready units, plus what plans need to know about the rest.

    Attributes:
        ready / near_ready: in (release time, unit id) order.
        next_use_s: per deployment, the earliest predicted release of a unit that has not
            started (ready units count as now); deployments with no such unit are absent.
        root_remaining_s: per active root, predicted runtime of its unfinished units.
        root_arrival_s: per active root, its arrival time.
        releases_s: per deployment, the predicted releases of every unit that has not started
            (ready units count as now), in time order: the work a reclaim of its last copy
            would delay.
        status: every unit's status the window was built from (missing = PENDING).
        completion_s: predicted completion of every unfinished unit.
    """

    now_s: float
    ready: tuple[WindowUnit, ...] = ()
    near_ready: tuple[WindowUnit, ...] = ()
    next_use_s: Mapping[str, float] = field(default_factory=dict)
    root_remaining_s: Mapping[str, float] = field(default_factory=dict)
    root_arrival_s: Mapping[str, float] = field(default_factory=dict)
    releases_s: Mapping[str, tuple[float, ...]] = field(default_factory=dict)
    status: Mapping[str, UnitStatus] = field(default_factory=dict)
    completion_s: Mapping[str, float] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class DagStats:
    """Static facts of one unit in its DAG (see `WindowUnit`)."""

    critical_path_s: float
    downstream_work_s: float
    num_descendants: int


def topo_order(units: Mapping[str, WorkUnit]) -> list[str]:
    """Unit ids in the topological order (`dag.topological_order`: ties by id).

    Raises:
        ConfigError: an edge names a unit not in `units`, preds and succs disagree, or a cycle.
    """
    indeg: dict[str, int] = {}
    for uid, u in units.items():
        indeg[uid] = len(u.preds)
        for p in u.preds:
            pu = units.get(p)
            if pu is None or uid not in pu.succs:
                raise ConfigError(
                    f"workflow DAG: unit {uid!r} waits for {p!r}, which is missing or does not "
                    "list it as a successor; give every edge on both ends"
                )
        for s in u.succs:
            su = units.get(s)
            if su is None or uid not in su.preds:
                raise ConfigError(
                    f"workflow DAG: unit {uid!r} lists successor {s!r}, which is missing or does "
                    "not list it as a predecessor"
                )
    try:
        return topological_order(units, ((uid, s) for uid, u in units.items() for s in u.succs))
    except ValueError as exc:
        raise ConfigError(f"workflow DAG: {exc}; DAGs must be acyclic") from None


def dag_stats(
    units: Mapping[str, WorkUnit], runtime_s: Callable[[WorkUnit], float]
) -> dict[str, DagStats]:
    """Critical path, downstream work and descendant count of every unit (one backward pass).

    Examples:
        >>> a = WorkUnit("a", "r", "m", 1, 1, succs=("b", "c"))
        >>> b = WorkUnit("b", "r", "m", 1, 1, preds=("a",))
        >>> c = WorkUnit("c", "r", "m", 1, 1, preds=("a",))
        >>> s = dag_stats({"a": a, "b": b, "c": c}, lambda u: 1.0)
        >>> s["a"].critical_path_s, s["a"].downstream_work_s, s["a"].num_descendants
        (2.0, 3.0, 2)
    """
    order = topo_order(units)
    desc: dict[str, frozenset[str]] = {}
    cp: dict[str, float] = {}
    rt = {uid: runtime_s(units[uid]) for uid in order}
    for uid in reversed(order):
        u = units[uid]
        d: set[str] = set()
        for s in u.succs:
            d.add(s)
            d |= desc[s]
        desc[uid] = frozenset(d)
        cp[uid] = rt[uid] + max((cp[s] for s in u.succs), default=0.0)
    return {
        uid: DagStats(cp[uid], rt[uid] + sum(rt[x] for x in desc[uid]), len(desc[uid]))
        for uid in order
    }


def predict_times(
    units: Mapping[str, WorkUnit],
    status: Mapping[str, UnitStatus],
    now_s: float,
    runtime_s: Callable[[WorkUnit], float],
    *,
    started_s: Mapping[str, float] | None = None,
    ready_s: Mapping[str, float] | None = None,
    done_s: Mapping[str, float] | None = None,
) -> dict[str, tuple[float, float]]:
    """Predicted `(release_s, completion_s)` of every unit (rules in the module docstring).

    Done units keep their recorded completion (`done_s`, default now); running units their start
    (`started_s`, default now); ready units their ready time (`ready_s`, default now).
    """
    started = started_s or {}
    readies = ready_s or {}
    dones = done_s or {}
    out: dict[str, tuple[float, float]] = {}
    for uid in topo_order(units):
        u = units[uid]
        st = status.get(uid, UnitStatus.PENDING)
        if st is UnitStatus.DONE:
            t = dones.get(uid, now_s)
            out[uid] = (t, t)
            continue
        if st is UnitStatus.RUNNING:
            start = started.get(uid, now_s)
            out[uid] = (start, max(start + runtime_s(u), now_s))
            continue
        if st is UnitStatus.READY:
            release = readies.get(uid, now_s)
            out[uid] = (release, max(release, now_s) + runtime_s(u))
            continue
        release = max((out[p][1] for p in u.preds), default=now_s)
        release = max(release, now_s)
        out[uid] = (release, release + runtime_s(u))
    return out


def build_window(
    units: Mapping[str, WorkUnit],
    status: Mapping[str, UnitStatus],
    now_s: float,
    runtime_s: Callable[[WorkUnit], float],
    *,
    started_s: Mapping[str, float] | None = None,
    ready_s: Mapping[str, float] | None = None,
    done_s: Mapping[str, float] | None = None,
    stats: Mapping[str, DagStats] | None = None,
    root_arrival_s: Mapping[str, float] | None = None,
) -> Window:
    """The window over `units` (the active roots' DAGs) at `now_s`.

    Args:
        units: the DAG; every edge must have both ends in it.
        status: each unit's status (missing = PENDING).
        runtime_s: predicted runtime of a unit (e.g. on the fastest device it fits).
        started_s / ready_s / done_s: recorded start, ready and completion times.
        stats: precomputed `dag_stats` (computed here when missing).
        root_arrival_s: arrival time of each root (for workflow-aware baselines).

    Raises:
        ConfigError: the DAG is malformed (dangling or one-sided edge, cycle).
    """
    times = predict_times(
        units, status, now_s, runtime_s, started_s=started_s, ready_s=ready_s, done_s=done_s
    )
    facts = stats if stats is not None else dag_stats(units, runtime_s)
    ready: list[WindowUnit] = []
    near: list[WindowUnit] = []
    next_use: dict[str, float] = {}
    uses: dict[str, list[float]] = {}
    remaining: dict[str, float] = {}
    for uid, u in units.items():
        st = status.get(uid, UnitStatus.PENDING)
        if st is UnitStatus.DONE:
            continue
        release, completion = times[uid]
        left = completion - (now_s if st is UnitStatus.RUNNING else max(release, now_s))
        remaining[u.root_id] = remaining.get(u.root_id, 0.0) + left
        if st is UnitStatus.RUNNING:
            continue
        use = now_s if st is UnitStatus.READY else release
        next_use[u.deployment] = min(next_use.get(u.deployment, INF), use)
        uses.setdefault(u.deployment, []).append(use)
        f = facts[uid]
        wu = WindowUnit(
            u, release, completion, f.critical_path_s, f.downstream_work_s, f.num_descendants
        )
        if st is UnitStatus.READY:
            ready.append(wu)
            continue
        pst = [status.get(p, UnitStatus.PENDING) for p in u.preds]
        if pst and all(s in (UnitStatus.DONE, UnitStatus.RUNNING) for s in pst):
            if any(s is UnitStatus.RUNNING for s in pst):
                near.append(wu)
    arrivals = dict(root_arrival_s or {})
    return Window(
        now_s,
        tuple(sorted(ready, key=_by_release)),
        tuple(sorted(near, key=_by_release)),
        next_use,
        remaining,
        {r: arrivals.get(r, 0.0) for r in remaining},
        {d: tuple(sorted(ts)) for d, ts in uses.items()},
        dict(status),
        {uid: times[uid][1] for uid in units if status.get(uid) is not UnitStatus.DONE},
    )


def near_ready_after(
    window: Window, units: Mapping[str, WorkUnit], submitted_end_s: Mapping[str, float]
) -> list[tuple[WorkUnit, float]]:
    """Units that turn near-ready once `submitted_end_s`'s units (submitted this round, unit
    id -> predicted completion) run, with their predicted release: every predecessor done,
    running or just submitted, at least one of them not done, and the unit not already ready,
    near-ready or running. A plan thus sees the successors of what it just committed in the
    same round, not at the next event.

    Examples:
        >>> a = WorkUnit("a", "r", "m", 10, 5, succs=("b",))
        >>> b = WorkUnit("b", "r", "m", 10, 5, preds=("a",))
        >>> w = build_window({"a": a, "b": b}, {"a": UnitStatus.READY}, now_s=0.0,
        ...                  runtime_s=lambda u: 2.0)
        >>> [(u.unit_id, t) for u, t in near_ready_after(w, {"a": a, "b": b}, {"a": 3.0})]
        [('b', 3.0)]
    """
    seen = {w.unit.unit_id for w in (*window.ready, *window.near_ready)}
    out: list[tuple[WorkUnit, float]] = []
    for uid in sorted({s for x in submitted_end_s for s in units[x].succs if s in units}):
        u = units[uid]
        if uid in seen or window.status.get(uid, UnitStatus.PENDING) is not UnitStatus.PENDING:
            continue
        ends: list[float] = []
        for p in u.preds:
            st = window.status.get(p, UnitStatus.PENDING)
            if p in submitted_end_s:
                ends.append(submitted_end_s[p])
            elif st is UnitStatus.RUNNING:
                ends.append(window.completion_s.get(p, window.now_s))
            elif st is not UnitStatus.DONE:
                break
        else:
            out.append((u, max([window.now_s, *ends])))
    return out


def _by_release(w: WindowUnit) -> tuple[float, str]:
    return (w.release_s, w.unit.unit_id)


def units_by_id(units: Iterable[WorkUnit]) -> dict[str, WorkUnit]:
    """Index units by id.

    Raises:
        ConfigError: a unit id repeats.
    """
    out: dict[str, WorkUnit] = {}
    for u in units:
        if u.unit_id in out:
            raise ConfigError(f"unit id {u.unit_id!r} appears twice; unit ids must be unique")
        out[u.unit_id] = u
    return out
