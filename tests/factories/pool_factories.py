"""Factories for pool-plan tests: deployments, replicas, pool states, work units, snapshots.

One catalog for every pool test: five Qwen3 deployments (2 GiB of KV each) that fit an A100-40GB
and a V100-32GB, replicas with their deployment's real footprint on the device, and
`PoolSnapshot`s whose window comes from `build_window` with each unit's best predicted runtime.
`fork_join` builds whole workflows for pool runs; `pool_scenarios()` draws random but
memory-consistent pool snapshots (with a plan name) for property tests of the pool plans.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterable, Mapping

from hypothesis import strategies as st

from maserve_prefect.dispatch.snapshot import Unit
from maserve_prefect.engines.sim.pool.device import Deployment
from maserve_prefect.pool.fusion import fusible_chains
from maserve_prefect.pool.inputs import RootDag
from maserve_prefect.pool.snapshot import PlanOptions, PoolSnapshot
from maserve_prefect.pool.state import (
    ActiveRequest,
    CostModel,
    DeploymentInfo,
    DeviceInfo,
    Lease,
    PoolState,
    ReplicaInfo,
    RooflineCostModel,
    deployment_info,
)
from maserve_prefect.pool.window import UnitStatus, WorkUnit, build_window, units_by_id
from maserve_prefect.protocol.state import Lifecycle

GIB = 1 << 30
COSTS = RooflineCostModel(2 * GIB)
GPUS = ("A100-40GB", "V100-32GB")
MODELS = ("Qwen3-0.6B", "Qwen3-1.7B", "Qwen3-4B", "Qwen3-8B", "Qwen3-14B")
INFOS: dict[str, DeploymentInfo] = {
    m: deployment_info(Deployment(m, m, kv_cache_bytes=2 * GIB), GPUS) for m in MODELS
}
CAPACITY = {"A100-40GB": 40960 << 20, "V100-32GB": 32768 << 20}
POOL_PLANS = ("joint", "pool-fcfs", "parrot", "kairos")
R, RUN, P, D = UnitStatus.READY, UnitStatus.RUNNING, UnitStatus.PENDING, UnitStatus.DONE


def make_device(name: str) -> DeviceInfo:
    """A device named `GPU:index` (its GPU's full memory)."""
    gpu = name.split(":")[0]
    return DeviceInfo(name, gpu, CAPACITY[gpu])


def footprint(model: str, gpu: str = "A100-40GB") -> int:
    fit = INFOS[model].fit(gpu)
    assert fit is not None
    return fit.footprint_bytes


def make_replica(
    name: str,
    model: str,
    device: str = "A100-40GB:0",
    phase: Lifecycle = Lifecycle.READY,
    **kw: object,
) -> ReplicaInfo:
    """A replica of `model` on `device`, holding its footprint, ready at 0 (fields in `kw`
    override)."""
    fit = INFOS[model].fit(device.split(":")[0])
    assert fit is not None
    fields: dict[str, object] = dict(
        name=name,
        deployment=model,
        device=device,
        lifecycle=phase,
        ready_s=0.0,
        held_bytes=fit.footprint_bytes,
        footprint_bytes=fit.footprint_bytes,
        kv_capacity_tokens=fit.kv_capacity_tokens,
        max_num_seqs=fit.max_num_seqs,
    )
    fields.update(kw)
    return ReplicaInfo(**fields)  # type: ignore[arg-type]


def make_pool(
    devices: Iterable[str] | int, *replicas: ReplicaInfo, now: float = 0.0, **kw: object
) -> PoolState:
    """A pool state over `devices` (names, or a count of A100s) with every deployment known."""
    names = [f"A100-40GB:{i}" for i in range(devices)] if isinstance(devices, int) else devices
    devs = tuple(make_device(d) for d in names)
    return PoolState(now, devs, tuple(INFOS.values()), replicas, **kw)  # type: ignore[arg-type]


def make_unit(
    uid: str,
    model: str,
    root: str = "r",
    preds: Iterable[str] = (),
    succs: Iterable[str] = (),
    n_in: int = 200,
    n_out: int = 50,
    prio: int = 0,
) -> WorkUnit:
    return WorkUnit(uid, root, model, n_in, n_out, tuple(preds), tuple(succs), prio)


def best_runtime(u: WorkUnit, costs: CostModel = COSTS) -> float:
    """The unit's runtime alone on the faster of the two GPUs."""
    return min(costs.runtime_s(u.deployment, g, 1, u.input_len, u.max_tokens) for g in GPUS)


def make_pool_snapshot(
    state: PoolState,
    units: Iterable[WorkUnit],
    status: Mapping[str, UnitStatus],
    *,
    started: dict[str, float] | None = None,
    ready_s: dict[str, float] | None = None,
    options: PlanOptions | None = None,
    costs: CostModel = COSTS,
    runtime: Callable[[WorkUnit], float] | None = None,
) -> PoolSnapshot:
    """The snapshot a pool plan sees: the window of `units` in `status` at the state's time.

    Every root arrived at 0; `ready_s` / `started` give ready and start times where known.
    """
    ud = units_by_id(units)
    options = options or PlanOptions()
    window = build_window(
        ud,
        dict(status),
        state.now_s,
        runtime or (lambda u: best_runtime(u, costs)),
        started_s=started,
        ready_s=ready_s,
        root_arrival_s={u.root_id: 0.0 for u in ud.values()},
    )

    def unit(w) -> Unit:  # type: ignore[no-untyped-def]
        u = w.unit
        return Unit(u.unit_id, u.root_id, u.deployment, u.input_len, u.max_tokens, u.priority)

    return PoolSnapshot(
        now_s=state.now_s,
        ready=tuple(unit(w) for w in window.ready),
        near_ready=tuple(unit(w) for w in window.near_ready),
        replicas=(),
        pool=state,
        window=window,
        units=ud,
        costs=costs,
        chains=fusible_chains(ud, options.fusion),
        options=options,
    )


def fork_join(root: str, arrival: float, models: tuple[str, str, str], seed: int) -> RootDag:
    """a -> b (same model, a fused chain) -> {c, d} -> e, with seeded sizes."""
    rng = random.Random(seed)
    m1, m2, m3 = models
    shape = [
        ("a", m1, (), ("b",)),
        ("b", m1, ("a",), ("c", "d")),
        ("c", m2, ("b",), ("e",)),
        ("d", m3, ("b",), ("e",)),
        ("e", m1, ("c", "d"), ()),
    ]
    units = tuple(
        WorkUnit(
            f"{root}/{n}",
            root,
            m,
            rng.randint(100, 800),
            rng.randint(20, 200),
            tuple(f"{root}/{p}" for p in ps),
            tuple(f"{root}/{s}" for s in ss),
        )
        for n, m, ps, ss in shape
    )
    return RootDag(root, arrival, units, "fork-join")


THREE_FORK_JOINS = (
    fork_join("r0", 0.0, ("Qwen3-8B", "Qwen3-4B", "Qwen3-1.7B"), 1),
    fork_join("r1", 5.0, ("Qwen3-8B", "Qwen3-0.6B", "Qwen3-4B"), 2),
    fork_join("r2", 10.0, ("Qwen3-14B", "Qwen3-8B", "Qwen3-1.7B"), 3),
)
"""Three fork-join roots arriving 5 s apart over all five models."""


@st.composite
def pool_scenarios(draw: st.DrawFn) -> tuple[PoolSnapshot, str]:
    """A random pool snapshot that fits its devices' memory, and a pool plan's name.

    1-3 devices with 0-4 replicas each in any phase (resident ones maybe busy or leased); 1-6
    units, each ready, the ready head of a same-model chain, or pending behind a running unit.
    """
    names = draw(st.lists(st.sampled_from(GPUS), min_size=1, max_size=3))
    devices = [f"{g}:{i}" for i, g in enumerate(names)]
    now = draw(st.floats(0.0, 100.0))
    replicas: list[ReplicaInfo] = []
    leases: list[Lease] = []
    for d in devices:
        used, cap = 0, CAPACITY[d.split(":")[0]]
        for j in range(draw(st.integers(0, 4))):
            model = draw(st.sampled_from(MODELS))
            fit = INFOS[model].fit(d.split(":")[0])
            assert fit is not None
            phase = draw(
                st.sampled_from(
                    [Lifecycle.READY, Lifecycle.LOADING, Lifecycle.ASLEEP, Lifecycle.UNLOADING]
                )
            )
            held = GIB if phase is Lifecycle.ASLEEP else fit.footprint_bytes
            if used + held > cap:
                continue
            used += held
            active: tuple[ActiveRequest, ...] = ()
            if phase is Lifecycle.READY and draw(st.booleans()):
                active = (ActiveRequest(f"busy{d}{j}", 100, 100, now - 1.0, now + 5.0),)
            name = f"{model}@{d}#{j}"
            ready = now + draw(st.floats(0.0, 40.0)) if phase.in_transition else now
            replicas.append(
                make_replica(
                    name,
                    model,
                    d,
                    phase,
                    held_bytes=held,
                    active=active,
                    ready_s=ready,
                    last_used_s=draw(st.floats(0.0, now)),
                )
            )
            if phase is Lifecycle.READY and draw(st.integers(0, 3)) == 0:
                leases.append(Lease(name, f"chain{name}"))
    units: list[WorkUnit] = []
    status: dict[str, UnitStatus] = {}
    started: dict[str, float] = {}
    for i in range(draw(st.integers(1, 6))):
        model = draw(st.sampled_from(MODELS))
        root = f"r{draw(st.integers(0, 2))}"
        n_in, n_out = draw(st.integers(1, 3000)), draw(st.integers(1, 500))
        prio = draw(st.integers(0, 2))
        kind = draw(st.sampled_from(["ready", "chain", "near"]))
        uid = f"u{i}"
        if kind == "ready":
            units.append(make_unit(uid, model, root, n_in=n_in, n_out=n_out, prio=prio))
            status[uid] = R
        elif kind == "chain":
            units.append(make_unit(uid, model, root, succs=[uid + "b"], n_in=n_in, n_out=n_out))
            units.append(make_unit(uid + "b", model, root, preds=[uid], n_in=n_in, n_out=n_out))
            status[uid], status[uid + "b"] = R, P
        else:
            other = draw(st.sampled_from(MODELS))
            units.append(make_unit(uid, other, root, succs=[uid + "n"], n_in=n_in, n_out=n_out))
            units.append(make_unit(uid + "n", model, root, preds=[uid], n_in=n_in, n_out=n_out))
            status[uid], status[uid + "n"] = RUN, P
            started[uid] = now - draw(st.floats(0.0, 60.0))
    state = make_pool(devices, *replicas, now=now, leases=tuple(leases))
    options = PlanOptions(fusion=draw(st.booleans()), prefetch=draw(st.booleans()))
    costs = draw(st.sampled_from([COSTS, RooflineCostModel(None)]))
    snap = make_pool_snapshot(state, units, status, started=started, options=options, costs=costs)
    return snap, draw(st.sampled_from(POOL_PLANS))
