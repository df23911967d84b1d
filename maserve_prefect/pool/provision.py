"""Provisioning by predicted work: how many copies a deployment's known work calls for.

One idea: a deployment's *work* is every unit of the active roots that needs it and has not
started — ready, near-ready and known future units — and its *supply* is the copies it has
(serving, loading, planned, decided this round), each draining that work at its saturated
throughput from when it is free. The fluid drain end (`drain_end_s`) of the work on the supply
is when the last unit would be done; a new copy is worth loading where it brings that end
forward (`copy_gain_s`). This is §3's "provisioning by predicted work per model over ready,
near-ready and known future units, including second replicas": the ready-work list schedule of
`plan_round.Round.drain` sees a copy's batch slots, not how fast a batch of that size runs, so
a second copy whose slots the ready work already fits looks worthless there, and it never sees
the work still to come. (On the full pool, burst, the joint plan loaded six copies at t = 0 —
one Qwen3-8B replica served 300 calls — and left six V100s idle while work queued.)

Model, per deployment `d` and GPU kind `g`:

- batch `b(d, g)`: the batch a saturated replica runs — its batch limit, or as many of `d`'s
  units (mean admission context) as its KV admission limit holds;
- per-unit time `tau(d, g) = runtime(b, mean input, mean timed output) / b` (continuous
  batching: a replica completes `b` units per batch runtime);
- a copy is free at its ready time (now for a serving one) plus the per-unit time of the work
  already committed to it (its batch);
- `drain_end_s`: units in release order; the end is the latest, over release quantiles, of
  "start at that release with the copies free by then, drain the units released since at the
  copies' summed throughput" (a release-aware fluid bound, evaluated on `_QUANTILES` points).

Examples:
    >>> fluid_end_s([(0.0, 1.0)], [0.0] * 10)
    10.0
    >>> fluid_end_s([(0.0, 1.0), (0.0, 1.0)], [0.0] * 10)
    5.0
    >>> fluid_end_s([(0.0, 1.0), (8.0, 1.0)], [0.0] * 10)
    9.0
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from statistics import fmean

from maserve_prefect.pool.admission import blocks_for
from maserve_prefect.pool.plan_round import Round
from maserve_prefect.pool.state import ReplicaInfo
from maserve_prefect.pool.window import UnitStatus, WorkUnit
from maserve_prefect.protocol.state import Lifecycle

_QUANTILES = 16
"""Release points `drain_end_s` evaluates (cost bound, not a tuned constant: more points only
refine the same bound)."""


@dataclass(frozen=True, slots=True)
class Work:
    """A deployment's known work not yet started: release times (sorted) and the units."""

    deployment: str
    releases_s: tuple[float, ...]
    units: tuple[WorkUnit, ...]


def known_work(rd: Round) -> dict[str, Work]:
    """Per deployment, the units of the active roots that have not started and were not
    submitted this round (ready, near-ready and known future), with predicted releases."""
    status = rd.snap.window.status
    by_dep: dict[str, list[WorkUnit]] = {}
    for uid, u in rd.snap.units.items():
        st = status.get(uid, UnitStatus.PENDING)
        if st in (UnitStatus.READY, UnitStatus.PENDING) and uid not in rd.unit_ends:
            by_dep.setdefault(u.deployment, []).append(u)
    out: dict[str, Work] = {}
    for d, units in sorted(by_dep.items()):
        rel = sorted(rd.snap.window.releases_s.get(d, ()))
        extra = len(rel) - len(units)  # this round's submits were counted as released now
        rel = rel[extra:] if extra > 0 else rel
        rel = [rd.now] * (len(units) - len(rel)) + rel
        out[d] = Work(d, tuple(max(t, rd.now) for t in rel), tuple(units))
    return out


def unit_time_s(rd: Round, work: Work, device: str, replica: ReplicaInfo | None = None) -> float:
    """Per-unit time of `work` on a saturated replica on `device` (module docstring): a new
    one, or `replica` with its own batch limit and KV pool; 0.0 when the deployment does not
    fit."""
    fit = rd.state.fit(work.deployment, device)
    if fit is None or not work.units:
        return 0.0
    max_seqs, kv_tokens = fit.max_num_seqs, fit.kv_capacity_tokens
    if replica is not None:
        max_seqs, kv_tokens = replica.max_num_seqs, replica.kv_capacity_tokens
    n_in = round(fmean(u.input_len for u in work.units))
    n_out = max(round(fmean(u.timing_output for u in work.units)), 1)
    ctx = round(fmean(u.context_tokens for u in work.units))
    limit = rd.kv_limit(work.deployment, kv_tokens // max(fit.block_size, 1))
    b = min(max_seqs, max(limit // max(blocks_for(ctx, fit.block_size), 1), 1))
    b = max(min(b, len(work.units)), 1)
    model = rd.model(work.deployment)
    return rd.costs.runtime_s(model, rd.gpu(device), b, n_in, n_out) / b


def fluid_end_s(copies: Sequence[tuple[float, float]], releases: Sequence[float]) -> float:
    """Fluid drain end of units released at `releases` (sorted) on copies given as
    (free from, units per second): the latest, over release quantiles, of the time the units
    released from that point on take on the copies free by then."""
    if not releases:
        return 0.0
    if not copies:
        return float("inf")
    n = len(releases)
    step = max(n // _QUANTILES, 1)
    best = 0.0
    for k in range(0, n, step):
        t0, left = releases[k], float(n - k)
        # copies in order of when they are free; drain `left` units from t0
        cs = sorted((max(a, t0), mu) for a, mu in copies)
        rate, t = 0.0, t0
        end = float("inf")
        for i, (a, mu) in enumerate(cs):
            if rate > 0.0 and left <= rate * (a - t):
                end = t + left / rate
                break
            left -= rate * (a - t)
            t, rate = a, rate + mu
            if i == len(cs) - 1:
                end = t + left / rate
        best = max(best, end)
    return best


def supply(rd: Round, work: Work) -> list[tuple[float, float]]:
    """(free from, units per second) of every copy of `work`'s deployment: serving ones after
    their committed batch, loading / planned / decided ones from their ready time."""
    d = work.deployment
    out: list[tuple[float, float]] = []
    for r in rd.state.replicas_of(d):
        if r.name in rd.leaving or r.lifecycle is Lifecycle.UNLOADING:
            continue
        if not (r.serving or r.lifecycle.becoming_ready):
            continue
        tau = unit_time_s(rd, work, r.device, r)
        if tau <= 0.0:
            continue
        start = rd.now if r.serving else max(r.ready_s, rd.now)
        out.append((start + rd.batch[r.name][0] * tau, 1.0 / tau))
    for p in rd.state.planned:
        if p.deployment == d:
            tau = unit_time_s(rd, work, p.device)
            if tau > 0.0:
                out.append((max(p.ready_s, rd.now), 1.0 / tau))
    for dev, ready in rd.new_copies.get(d, ()):
        tau = unit_time_s(rd, work, dev)
        if tau > 0.0:
            out.append((max(ready, rd.now), 1.0 / tau))
    return out


def copy_gain_s(rd: Round, work: Work, device: str, ready_s: float) -> float:
    """How much sooner `work` drains with one more copy on `device` ready at `ready_s`."""
    tau = unit_time_s(rd, work, device)
    if tau <= 0.0:
        return 0.0
    have = supply(rd, work)
    before = fluid_end_s(have, work.releases_s)
    after = fluid_end_s([*have, (ready_s, 1.0 / tau)], work.releases_s)
    return before - after if before != float("inf") else float("inf")


def constrained_gain_s(rd: Round, work: Mapping[str, Work], deployment: str, device: str) -> float:
    """What a copy on `device` is worth to *constrained* work: the most any other deployment
    that fits only a strict subset of the GPU kinds `deployment` fits, `device`'s kind among
    them, would gain from a copy there (`copy_gain_s`, loaded from now; INF when it has work
    and no copy) — the cost of occupying the only feasible device of pending demand (Eq. 12)."""
    from maserve_prefect.pool.scarce import kinds_of

    g = rd.gpu(device)
    mine = kinds_of(rd.state, deployment)
    best = 0.0
    for c, w in work.items():
        if c == deployment:
            continue
        kinds = kinds_of(rd.state, c)
        if g in kinds and kinds < mine:
            ready = rd.now + rd.costs.load_s(rd.model(c), g)
            best = max(best, copy_gain_s(rd, w, device, ready))
    return best


def provision_by_work(
    rd: Round, work: Mapping[str, Work], serves: Mapping[str, Sequence[str]]
) -> None:
    """Add copies of deployments that have one into free memory while their known work
    drains sooner on them (module docstring), bottleneck first.

    Each pass takes the deployments in order of predicted drain end, latest first; the first
    with a copy on a device with free memory that brings its end forward by more than `tie_s`
    net of what that device is worth to constrained work (`constrained_gain_s`) loads it, and
    the pass repeats. Free memory only: nothing is reclaimed and no load waits for an unload.
    Committed through `Round.take` (the load names `serves[d]`: the deployment's unplaced
    ready and near-ready units), so the memory ledger, the supply and the scarce-device term of
    later steps see it.
    """
    from maserve_prefect.pool.constructor import lifecycle_option

    tie_s = rd.snap.options.tie_s
    ready = {w.unit.deployment for w in rd.snap.window.ready}
    while True:
        ends = {}
        for d, w in work.items():
            have = supply(rd, w)
            if have:  # first copies are the ready step's and the prefetch's
                ends[d] = fluid_end_s(have, w.releases_s)
        taken = False
        for d in sorted(ends, key=lambda x: (-ends[x], x)):
            best: tuple[float, int, str] | None = None
            for dev in rd.state.device_names():
                opt = lifecycle_option(
                    rd.state, rd.ledger, d, dev, rd.costs, rd.snap.window.next_use_s,
                    prefetch=d not in ready, exclude=rd.exclude, allow_reclaim=False,
                )  # fmt: skip
                if opt is None or opt.victims or opt.after:
                    continue
                gain = copy_gain_s(rd, work[d], dev, opt.ready_s)
                net = gain - constrained_gain_s(rd, work, d, dev)
                if net > tie_s:
                    key = (-net, rd.leftover_bytes(opt), dev)
                    if best is None or key < best:
                        best = key
            if best is not None:
                opt = lifecycle_option(
                    rd.state, rd.ledger, d, best[2], rd.costs, rd.snap.window.next_use_s,
                    prefetch=d not in ready, exclude=rd.exclude, allow_reclaim=False,
                )  # fmt: skip
                assert opt is not None
                rd.take(opt, tuple(serves.get(d, ())))
                taken = True
                break
        if not taken:
            return
