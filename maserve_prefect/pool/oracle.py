"""The Oracle: an offline search over whole-run schedules, each checked on the simulator.

One idea: the Oracle sees the whole trace — every call's exact input and output length, every
root's arrival, the DAGs — and searches *schedules* (`pool.oracle_script.Script`: per device,
the order of residencies and which calls each serves), minimising the makespan (ties: the mean
session latency). It never predicts a time: every candidate is executed by `ScriptedPlan` on
the simulator (`pool.executor.run_pool`), so the makespan it reports is one the simulator really
achieves — an *upper* bound on the optimum, with `pool.lower_bound` below it. The optimum lies
in [lower bound, Oracle]; a plan's distance to the Oracle is a distance to an achievable
schedule, and Oracle / lower bound bounds how far the Oracle itself may be from optimal.

Method: a seeded local search (large-neighbourhood moves on the schedule, hill climbing that
also accepts equal objectives, a fixed random seed, so results are deterministic). Seeds are the
schedules the online plans realised (`script_of` of each plan's run; each plan's own run is also
kept as a candidate, so no plan beats the Oracle by construction). Moves:

- merge two campaigns of one deployment (one load fewer),
- move one root's calls of a campaign to another campaign of that deployment, or to a new one
  on a device it fits (placement, scale-out),
- swap two adjacent campaigns of a device (load order),
- move a campaign to another position or device (placement + order).

A candidate that could never finish (`deadlocks`) is discarded unrun; one the simulator rejects
is discarded. Budget: `max_evaluations` simulator runs (about 0.3 s each at demo scale).

Why not a time-indexed MILP (`scipy.optimize.milp`)? Demo scale is 98 calls on 2 GPUs over
~400 s: at 1 s resolution that is ~80 000 start binaries before loads, and the simulator's
continuous batching (a call's speed depends on what else runs) and processor sharing are not
linear. The search keeps the simulator's physics exact and abstracts only the *policy space*:
one replica per device at a time (the default one-per-GPU sizing; with co-location the Oracle
is weaker than it could be), every call submitted as soon as it is ready and its residency
serves, and a residency's load started as soon as the previous one on its device is over.

Size limits: `fits_oracle` — at most `ORACLE_MAX_UNITS` calls and `ORACLE_MAX_DEVICES`
devices (demo scale: 98 calls, 2 devices); the suite skips larger scales with a note.

Examples:
    >>> fits_oracle(98, 2), fits_oracle(1500, 12)
    (True, False)
"""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from maserve_prefect.engines.sim.pool.device import Deployment, DeviceSlot
from maserve_prefect.errors import ConfigError, SimulationError
from maserve_prefect.pool.executor import run_pool
from maserve_prefect.pool.inputs import ExecOptions, RootDag
from maserve_prefect.pool.oracle_script import Campaign, Script, ScriptedPlan, deadlocks, script_of
from maserve_prefect.pool.results import PoolRunResult
from maserve_prefect.pool.state import CostModel, deployment_info
from maserve_prefect.pool.window import WorkUnit

ORACLE_MAX_UNITS = 150
"""Most calls the Oracle searches (each evaluation is a full simulator run)."""

ORACLE_MAX_DEVICES = 4
"""Most devices the Oracle searches (the neighbourhood grows with devices x campaigns)."""

DEFAULT_EVALUATIONS = 120
"""Simulator runs per search beyond the seeds (about 40 s at demo scale)."""

SEED_PLANS = ("joint", "pool-fcfs", "parrot", "kairos")
"""The plans whose schedules seed the search when no seeds are given."""

Lanes = list[tuple[str, list[Campaign]]]


def fits_oracle(num_units: int, num_devices: int) -> bool:
    """Whether the Oracle runs at this size (`ORACLE_MAX_UNITS`, `ORACLE_MAX_DEVICES`)."""
    return num_units <= ORACLE_MAX_UNITS and num_devices <= ORACLE_MAX_DEVICES


@dataclass(frozen=True, slots=True)
class OracleResult:
    """The best schedule found and how it was found.

    Attributes:
        result: its run on the simulator (makespan, latencies, lifecycle, ...).
        script: its schedule (None when the best is a seed plan's own run).
        source: "search", "<plan> (script)" or "<plan> (as run)".
        num_evaluated: simulator runs (seeds included).
        num_improvements: strict improvements the search found over its starting schedule.
        seed_makespans_s: each seed plan's makespan as it ran.
    """

    result: PoolRunResult
    script: Script | None
    source: str
    num_evaluated: int
    num_improvements: int
    seed_makespans_s: Mapping[str, float] = field(default_factory=dict)

    @property
    def makespan_s(self) -> float:
        return self.result.makespan_s


def _objective(res: PoolRunResult) -> tuple[float, float]:
    return (round(res.makespan_s, 9), round(res.mean_latency_s, 9))


class _Search:
    """One search: the workload, the feasibility facts, the incumbent and the moves."""

    def __init__(
        self,
        workflows: Sequence[RootDag],
        devices: Sequence[str],
        options: ExecOptions,
        deployments: Mapping[str, Deployment],
        costs: CostModel | None,
        rng_seed: int,
    ) -> None:
        self.workflows, self.devices, self.options = list(workflows), list(devices), options
        self.deployments, self.costs = deployments, costs
        self.units: dict[str, WorkUnit] = {u.unit_id: u for wf in workflows for u in wf.units}
        gpus = {d: DeviceSlot.parse(d).gpu.name for d in devices}
        self.fits: dict[str, list[str]] = {}
        for dep in sorted({u.deployment for u in self.units.values()}):
            info = deployment_info(deployments.get(dep) or options.deployment(dep), gpus.values())
            self.fits[dep] = [d for d in devices if info.fit(gpus[d]) is not None]
        self.rng = random.Random(rng_seed)
        self.seen: set[tuple[object, ...]] = set()
        self.num_evaluated = 0

    def run(self, script: Script) -> PoolRunResult | None:
        """`script` on the simulator; None if it could never finish or a rule refuses it."""
        key = script.key()
        if key in self.seen or deadlocks(script, self.units):
            return None
        self.seen.add(key)
        self.num_evaluated += 1
        try:
            return run_pool(
                self.workflows, self.devices, ScriptedPlan(script),
                deployments=self.deployments, costs=self.costs, options=self.options,
            )  # fmt: skip
        except SimulationError:
            return None

    # -- moves -----------------------------------------------------------------------------

    def neighbour(self, script: Script) -> Script:
        lanes: Lanes = [(d, list(cs)) for d, cs in script.lanes]
        move = self.rng.choice((self._merge, self._move_root, self._swap, self._relocate))
        move(lanes)
        return _normalise(lanes)

    def _pick(self, lanes: Lanes) -> tuple[int, int] | None:
        spots = [(i, j) for i, (_, cs) in enumerate(lanes) for j in range(len(cs))]
        return self.rng.choice(spots) if spots else None

    def _merge(self, lanes: Lanes) -> None:
        at = self._pick(lanes)
        if at is None:
            return
        i, j = at
        c = lanes[i][1][j]
        others = [(k, m) for k, (_, cs) in enumerate(lanes) for m, o in enumerate(cs)
                  if o.deployment == c.deployment and (k, m) != (i, j)]  # fmt: skip
        if not others:
            return
        k, m = self.rng.choice(others)
        o = lanes[k][1][m]
        lanes[i][1][j] = Campaign(c.deployment, c.units + o.units)
        lanes[k][1][m] = Campaign(o.deployment, ())

    def _move_root(self, lanes: Lanes) -> None:
        at = self._pick(lanes)
        if at is None:
            return
        i, j = at
        c = lanes[i][1][j]
        roots = sorted({self.units[u].root_id for u in c.units})
        root = self.rng.choice(roots)
        moved = tuple(u for u in c.units if self.units[u].root_id == root)
        lanes[i][1][j] = Campaign(c.deployment, tuple(u for u in c.units if u not in moved))
        targets = [(k, m) for k, (_, cs) in enumerate(lanes) for m, o in enumerate(cs)
                   if o.deployment == c.deployment and (k, m) != (i, j)]  # fmt: skip
        if targets and self.rng.random() < 0.5:
            k, m = self.rng.choice(targets)
            o = lanes[k][1][m]
            lanes[k][1][m] = Campaign(o.deployment, o.units + moved)
            return
        self._insert(lanes, Campaign(c.deployment, moved))

    def _insert(self, lanes: Lanes, c: Campaign) -> None:
        dev = self.rng.choice(self.fits[c.deployment])
        cs = next(cs for d, cs in lanes if d == dev)
        cs.insert(self.rng.randint(0, len(cs)), c)

    def _swap(self, lanes: Lanes) -> None:
        at = self._pick(lanes)
        if at is None:
            return
        i, j = at
        cs = lanes[i][1]
        if j + 1 < len(cs):
            cs[j], cs[j + 1] = cs[j + 1], cs[j]

    def _relocate(self, lanes: Lanes) -> None:
        at = self._pick(lanes)
        if at is None:
            return
        i, j = at
        c = lanes[i][1].pop(j)
        self._insert(lanes, c)


def _normalise(lanes: Lanes) -> Script:
    """Drop empty campaigns and join consecutive ones of one deployment on a device (one
    residency serves both)."""
    out = []
    for dev, cs in lanes:
        joined: list[Campaign] = []
        for c in cs:
            if not c.units:
                continue
            if joined and joined[-1].deployment == c.deployment:
                joined[-1] = Campaign(c.deployment, joined[-1].units + c.units)
            else:
                joined.append(c)
        out.append((dev, tuple(joined)))
    return Script(tuple(out))


@dataclass(frozen=True, slots=True)
class _Cand:
    obj: tuple[float, float]
    source: str
    result: PoolRunResult
    script: Script | None


def _climb(search: _Search, start: _Cand, max_evaluations: int) -> tuple[_Cand, int]:
    """Hill climbing from `start` (equal objectives accepted, so plateaus are crossed; the
    search never runs one schedule twice): the best found and the strict improvements."""
    assert start.script is not None
    best, script = start, start.script
    improvements, budget = 0, search.num_evaluated + max_evaluations
    for _ in range(20 * (max_evaluations + 1)):  # most neighbours are duplicates or deadlock
        if search.num_evaluated >= budget:
            break
        cand = search.neighbour(script)
        res = search.run(cand)
        if res is None:
            continue
        obj = _objective(res)
        if obj <= best.obj:
            improvements += obj < best.obj
            best, script = _Cand(obj, "search", res, cand), cand
    return best, improvements


def oracle(
    workflows: Sequence[RootDag],
    devices: Sequence[str],
    *,
    seeds: Mapping[str, PoolRunResult] | None = None,
    options: ExecOptions | None = None,
    deployments: Mapping[str, Deployment] | None = None,
    costs: CostModel | None = None,
    max_evaluations: int = DEFAULT_EVALUATIONS,
    rng_seed: int = 0,
) -> OracleResult:
    """The best schedule the search finds for `workflows` on a cold pool of `devices`.

    Args:
        seeds: plan name -> that plan's run of the same work (default: `SEED_PLANS`, run here).
        options / deployments / costs: as `run_pool` takes them (the same for every candidate).
        max_evaluations: simulator runs of the search beyond the seeds' scripts.
        rng_seed: the moves' random seed (same inputs, same result).

    Raises:
        ConfigError: a warm start (the Oracle schedules from a cold pool) or no seed.
    """
    opts = options or ExecOptions()
    if opts.warm:
        raise ConfigError("the Oracle schedules a cold pool; drop ExecOptions.warm")
    deps = deployments or {}
    if seeds is None:
        seeds = {
            p: run_pool(workflows, devices, p, deployments=deps, costs=costs, options=opts)
            for p in SEED_PLANS
        }
    if not seeds:
        raise ConfigError("the Oracle needs at least one seed plan's run")
    search = _Search(workflows, devices, opts, deps, costs, rng_seed)
    cands: list[_Cand] = []
    for name in sorted(seeds):
        cands.append(_Cand(_objective(seeds[name]), f"{name} (as run)", seeds[name], None))
        script = script_of(seeds[name], devices)
        res = search.run(script)
        if res is not None:
            cands.append(_Cand(_objective(res), f"{name} (script)", res, script))
    scripted = [c for c in cands if c.script is not None]
    improvements = 0
    if scripted:
        found, improvements = _climb(search, min(scripted, key=lambda c: c.obj), max_evaluations)
        cands.append(found)
    # a tie with a seed is reported as that seed (the search found nothing better)
    best = min(cands, key=lambda c: (c.obj, c.source == "search"))
    return OracleResult(
        best.result,
        best.script,
        best.source,
        search.num_evaluated,
        improvements,
        {n: r.makespan_s for n, r in sorted(seeds.items())},
    )
