"""GPU-seconds per completed session by scenario, shared lifecycle time attributed as the paper
does (§4.3): "by their share of each model's generation time".

One idea: a pool's GPU time splits four ways per device (`engines.sim.pool.device_time`:
generation, loading, idle-resident, other), and per replica the first three are its own. Every
replica serves one model (deployment), so per model the generation, loading and idle-resident
seconds are the sums over its replicas. A scenario (workflow) then gets, of each model's three
parts, its share of that model's generation seconds — the step seconds its requests took, a
step shared among its requests by the tokens each computed (`ReplicaTimeRow.request_s`). Time
with nothing resident ("other") belongs to no model; it is attributed by each scenario's share
of all generation seconds. Divided by the scenario's completed sessions, the parts are the
paper's Figure 6 bars.

With one replica per GPU (the default sizing) the per-replica parts add up to the devices'
parts exactly; with co-location two replicas resident at once each count their residency, so
the attributed idle-resident time can exceed the devices' (stated, not corrected).

Examples:
    >>> from maserve_prefect.engines.sim.pool.export import ReplicaTimeRow
    >>> reps = [ReplicaTimeRow("r0", "8B", ("A100:0",), 10.0, 4.0, 6.0, {"a/1": 6.0, "b/1": 4.0})]
    >>> out = gpu_seconds_by_scenario(reps, 2.0, {"a/1": "a", "b/1": "b"}, {"a": 1, "b": 2})
    >>> [round(x, 9) for x in (out["a"]["loading"], out["b"]["idle_resident"], out["a"]["other"])]
    [2.4, 1.2, 1.2]
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from maserve_prefect.engines.sim.pool.export import ReplicaTimeRow

__all__ = ["PARTS", "gpu_seconds_by_scenario"]

PARTS = ("generation", "idle_resident", "loading", "other")
"""The paper's four parts of GPU time (Figure 6), in its order."""


def gpu_seconds_by_scenario(
    replicas: Sequence[ReplicaTimeRow],
    other_s: float,
    scenario_of: Mapping[str, str],
    sessions: Mapping[str, int],
) -> dict[str, dict[str, float]]:
    """Per scenario, GPU-seconds per completed session by part (`PARTS`) and `total`.

    Args:
        replicas: every replica's time split and step seconds per request.
        other_s: the devices' summed time with nothing resident.
        scenario_of: request id → scenario; requests it does not name are left out of shares.
        sessions: completed sessions per scenario (a scenario with none is left out).
    """
    by_model: dict[str, dict[str, float]] = {}
    gen_by: dict[tuple[str, str], float] = {}
    for r in replicas:
        m = by_model.setdefault(r.deployment, {"generation": 0.0, "loading": 0.0,
                                               "idle_resident": 0.0})  # fmt: skip
        m["generation"] += r.generation_s
        m["loading"] += r.loading_s
        m["idle_resident"] += r.idle_resident_s
        for rid, sec in r.request_s.items():
            sc = scenario_of.get(rid)
            if sc is not None:
                gen_by[(sc, r.deployment)] = gen_by.get((sc, r.deployment), 0.0) + sec
    model_gen = {d: sum(v for (_, dd), v in gen_by.items() if dd == d) for d in by_model}
    all_gen = sum(model_gen.values())
    out: dict[str, dict[str, float]] = {}
    for sc, n in sessions.items():
        if n <= 0:
            continue
        parts = dict.fromkeys(PARTS, 0.0)
        for d, m in by_model.items():
            share = gen_by.get((sc, d), 0.0) / model_gen[d] if model_gen[d] > 0 else 0.0
            for k, v in m.items():
                parts[k] += share * v
        mine = sum(v for (s, _), v in gen_by.items() if s == sc)
        parts["other"] = other_s * (mine / all_gen if all_gen > 0 else 0.0)
        row = {k: v / n for k, v in parts.items()}
        row["total"] = sum(row.values())
        out[sc] = row
    return out
