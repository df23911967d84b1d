"""The baselines' reactive scale-out rule: another replica once a model's queue outlasts a load.

One idea: a new replica can serve nothing until its load ends, and the baselines never move a
request once submitted, so a second (third, ...) copy of a deployment pays off only for work
that would still be queued on the existing copies when the new one is ready. The rule therefore
compares the deployment's *queued work* with the *time to a new copy*, the break-even point of a
cold start (a reactive autoscaler that scales on queueing delay against cold-start latency):

- **queued work** `backlog_s(d)`: for every serving copy of `d`, when it has finished every
  request queued on it — each in-flight request from its start, each request submitted this
  round from now, all at the copy's batch size after this round (`CostModel.runtime_s` with
  that batch: continuous batching, not a serial sum) — and the earliest of those, minus now:
  how long until the least-loaded existing copy is free.
- **threshold**: the predicted time from now until a new copy on the chosen device is ready
  (victims' unloads, if the load must reclaim, plus `CostModel.load_s`; the on-demand rule of
  `pool.baselines` chooses the device and victims, never a device that already holds a copy:
  a copy beside its twin shares that GPU's compute and adds no speed).

Scale out `d` iff this round has ready work of `d` (the rule reacts to demand), `d` has a
serving copy and none loading or planned (one scale-out at a time: the next is judged once it
has landed), and `backlog_s(d)` exceeds the threshold. Both workflow-aware baselines (`parrot`,
`kairos`) use this same rule; request-level FCFS keeps one copy per model as the plain
reference. No constant is tuned: the threshold is the cost model's own load prediction.

Examples:
    >>> SCALE_OUT_RULE.startswith("backlog")
    True
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable

from maserve_prefect.pool.constructor import LifecycleOption
from maserve_prefect.pool.plan_round import Round
from maserve_prefect.pool.state import INF, ReplicaInfo

SCALE_OUT_RULE = "backlog on the least-loaded copy > time until a new copy is ready"
"""The rule in one line (reports quote it)."""

PlaceFn = Callable[[Round, str, Collection[str]], LifecycleOption | None]
"""Chooses where (device, victims) a new copy of a deployment would load, never on the given
devices; None if nowhere."""


def drain_end_s(rd: Round, r: ReplicaInfo) -> float:
    """When serving copy `r` has finished every request queued on it (module docstring)."""
    n, _, _ = rd.batch[r.name]
    if n == 0:
        return rd.now
    model, gpu = rd.model(r.deployment), rd.gpu(r.device)
    ends = [
        a.start_s + rd.costs.runtime_s(model, gpu, n, a.input_len, a.max_tokens) for a in r.active
    ]
    for uid in _submitted_here(rd, r.name):
        u = rd.snap.units[uid]
        ends.append(rd.now + rd.costs.runtime_s(model, gpu, n, u.input_len, u.max_tokens))
    return max([rd.now, *ends])


def _submitted_here(rd: Round, replica: str) -> list[str]:
    return [s.unit_id for s in rd.submits if s.replica == replica and s.unit_id in rd.snap.units]


def backlog_s(rd: Round, deployment: str) -> float:
    """Seconds until the least-loaded serving copy of `deployment` is free (INF: no copy)."""
    ends = [
        drain_end_s(rd, r)
        for r in rd.state.replicas_of(deployment)
        if r.serving and r.name not in rd.leaving
    ]
    return min(ends, default=INF) - rd.now


def scale_out(rd: Round, demanded: Iterable[str], place: PlaceFn) -> list[LifecycleOption]:
    """Commit (`Round.take`) one new copy of each deployment in `demanded` that the rule calls
    for (module docstring), in the given order; returns the options taken."""
    taken: list[LifecycleOption] = []
    for dep in dict.fromkeys(demanded):
        if rd.supply(dep):  # a copy is loading or planned: judge again once it has landed
            continue
        backlog = backlog_s(rd, dep)
        if backlog == INF:  # no serving copy: the on-demand rule, not scale-out
            continue
        twins = {r.device for r in rd.state.replicas_of(dep)}
        opt = place(rd, dep, twins)
        if opt is None or backlog <= opt.ready_s - rd.now:
            continue
        rd.take(opt, ())
        taken.append(opt)
    return taken
