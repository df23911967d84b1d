"""The Oracle's schedules: per device, an ordered list of residencies and the calls each serves.

One idea: with one replica per GPU (the default sizing), a whole-run schedule is, per device, a
sequence of *campaigns* — load a deployment, serve the given calls on it as they become ready,
and once every one of them has completed, reclaim it for the next campaign (a campaign of the
same deployment as the previous one keeps its replica). Placement (which device serves a call),
lifecycle (which loads, on which device, in which order) and replica binding are all in the
`Script`; timing is not: `ScriptedPlan` executes a script on the one dispatcher through the pool
plan interface, so the simulator decides every start and end — a script's makespan is one the
simulator really achieves. A call is submitted the moment it is ready and its campaign's
replica serves; a campaign's load starts the moment the previous campaign on its device is over
(ahead of its own calls, the Oracle knows what comes).

`script_of` reads a run's script off its result (the residencies it loaded, in order, and the
calls each served), so any plan's schedule can seed the Oracle's search. A script whose
campaign order contradicts the DAG (a campaign waits for a call that a later campaign on a
device it blocks would serve) would never finish: `deadlocks` finds such a cycle of
precedences (or a call left out) before a run.

Examples:
    >>> s = Script((("A100-40GB:0", (Campaign("m", ("r/a", "r/b")),)),))
    >>> s.num_campaigns, s.device_of()["r/b"]
    (1, 'A100-40GB:0')
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from maserve_prefect.dag import topological_order
from maserve_prefect.dispatch.snapshot import Decisions, Snapshot
from maserve_prefect.pool.constructor import lifecycle_option
from maserve_prefect.pool.fusion import WorkItem
from maserve_prefect.pool.plan_round import Round
from maserve_prefect.pool.results import PoolRunResult
from maserve_prefect.pool.snapshot import pool_snapshot
from maserve_prefect.pool.window import WorkUnit
from maserve_prefect.protocol.state import Lifecycle


@dataclass(frozen=True, slots=True)
class Campaign:
    """One residency of `deployment` on a device and the calls (unit ids) it serves."""

    deployment: str
    units: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class Script:
    """Per device (pool order), its campaigns in order."""

    lanes: tuple[tuple[str, tuple[Campaign, ...]], ...]

    @property
    def num_campaigns(self) -> int:
        return sum(len(cs) for _, cs in self.lanes)

    def device_of(self) -> dict[str, str]:
        """Unit id -> the device whose campaign serves it."""
        return {u: dev for dev, cs in self.lanes for c in cs for u in c.units}

    def key(self) -> tuple[object, ...]:
        """A canonical value (the search never evaluates one schedule twice)."""
        return tuple((d, tuple((c.deployment, tuple(sorted(c.units))) for c in cs))
                     for d, cs in self.lanes)  # fmt: skip


def script_of(result: PoolRunResult, devices: Sequence[str]) -> Script:
    """The schedule a run realised: per device, its loads in start order, each with the calls
    that ran on that replica (loads that served nothing are left out)."""
    served: dict[str, list[str]] = {}
    for op in sorted(result.ops, key=lambda o: (o.submitted_s, o.unit_id)):
        served.setdefault(op.replica, []).append(op.unit_id)
    lanes = []
    for dev in devices:
        loads = [e for e in result.lifecycle if e.action == "load" and e.device == dev]
        loads.sort(key=lambda e: (e.start_s, e.replica))
        cs = tuple(
            Campaign(e.deployment, tuple(served[e.replica])) for e in loads if served.get(e.replica)
        )
        lanes.append((dev, cs))
    return Script(tuple(lanes))


def deadlocks(script: Script, units: Mapping[str, WorkUnit]) -> bool:
    """Whether `script` can never finish: a call waits for its DAG predecessors and for its
    campaign's start, a campaign starts once every call of the previous campaign on its device
    has completed, and these precedences form a cycle (or a call has no campaign, or two)."""
    nodes: list[str] = list(units)
    edges: list[tuple[str, str]] = [(p, uid) for uid, u in units.items() for p in u.preds]
    seen: set[str] = set()
    for dev, cs in script.lanes:
        for j, c in enumerate(cs):
            start = f"start {dev} {j}"
            nodes.append(start)
            for u in c.units:
                if u not in units or u in seen:
                    return True
                seen.add(u)
                edges.append((start, u))
                if j + 1 < len(cs):
                    edges.append((u, f"start {dev} {j + 1}"))
    if len(seen) != len(units):
        return True
    try:
        topological_order(nodes, edges)
    except ValueError:
        return True
    return False


class ScriptedPlan:
    """Executes a `Script` on the pool plan interface (module docstring). One instance per run:
    it remembers which calls it has submitted, so that a call no replica runs any more is done.
    """

    name = "oracle"

    def __init__(self, script: Script) -> None:
        self.script = script
        self.lanes = {dev: cs for dev, cs in script.lanes}
        self.cursor = dict.fromkeys(self.lanes, 0)
        self.submitted: set[str] = set()

    def plan(self, snapshot: Snapshot) -> Decisions:
        snap = pool_snapshot(snapshot, self.name)
        rd = Round(snap)
        running = {a.unit_id for r in snap.pool.replicas for a in r.active}
        ready = {w.unit.unit_id: w for w in snap.window.ready}
        for dev, campaigns in self.lanes.items():
            k = self.cursor[dev]
            while k < len(campaigns) and all(
                u in self.submitted and u not in running for u in campaigns[k].units
            ):
                k += 1
            self.cursor[dev] = k
            if k == len(campaigns):
                continue
            c = campaigns[k]
            mine = [
                r
                for r in snap.pool.replicas_on(dev)
                if r.deployment == c.deployment and r.lifecycle is not Lifecycle.UNLOADING
            ]
            if mine:
                r = mine[0]
                if not r.serving:
                    continue  # still loading
                for uid in c.units:
                    w = ready.get(uid)
                    if w is None:
                        continue
                    item = WorkItem((w.unit,), w.release_s)
                    if rd.can_accept(r, item):
                        rd.submit(item, r, grant=False)
                        self.submitted.add(uid)
                continue
            if any(p.device == dev and p.deployment == c.deployment for p in snap.pool.planned):
                continue  # its load waits for unloads under way
            victims = [r for r in snap.pool.replicas_on(dev) if snap.pool.reclaimable(r.name)]
            opt = lifecycle_option(
                snap.pool, rd.ledger, c.deployment, dev, rd.costs, snap.window.next_use_s,
                exclude=rd.exclude, victims=victims, await_unloads=True,
            )  # fmt: skip
            if opt is not None:
                rd.take(opt, c.units)
        return rd.decisions()
