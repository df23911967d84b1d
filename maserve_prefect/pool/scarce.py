"""Scarce devices: what occupying the only feasible device of pending demand costs that demand.

One idea: a deployment that fits only some GPU kinds (Qwen3-14B at 0.9 fits an A100-40GB, not
a V100-32GB) can run nowhere else, so a flexible deployment placed on such a device delays it
while it is there — "placing a flexible activation on the only high-capacity GPU blocks a
constrained successor; resource ordering preserves that device" (§2). The joint plan uses this
delay (`scarce_delay_s`) to place: a deployment's first copy goes only where it delays
constrained demand least, and a scale-out copy only where no option delays it less; across
deployments, Eq. 12's ready-work coverage then decides. (Ranking every option by it first made
the only A100 load Qwen3-14B for 4 ready calls at t = 0 while 8 ready Qwen3-8B calls waited,
and load 14B again later: one load more than the Oracle's schedule, on the demo pool.)

The delay of putting `deployment` on `device` until `busy_until_s`, for every other deployment
`c` with pending units that is *constrained* relative to it (the GPU kinds `c` fits are a strict subset of those `deployment`
fits, and include `device`'s):

- nothing, if `c` keeps a copy (resident or loading, not reclaimed this round, or planned /
  decided this round), or another device of a kind `c` fits is free of committed work;
- else each of its pending units waits for `device` to be free again and reload `c`, instead
  of for a load of `c` started now: `sum max(0, back - max(release, now + load_c))` with
  `back = busy_until_s + unload + load_c` (unit-seconds, like the plan's gains).

The joint plan charges the window's pending units (ready, near-ready, and near-ready through
this round's submits): releases of known future units further out are predicted as if every
model upstream of them were resident, far too early to charge — on the demo pool charging
them kept the only A100 holding Qwen3-14B idle while the V100 served every other model in turn.

Examples:
    >>> from maserve_prefect.pool.state import DeviceInfo
    >>> s = PoolState(0.0, (DeviceInfo("A100-40GB:0", "A100-40GB", 40 << 30),), ())
    >>> scarce_delay_s(s, "m", "A100-40GB:0", 10.0, {}, None)  # type: ignore[arg-type]
    0.0
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

from maserve_prefect.pool.state import CostModel, PoolState
from maserve_prefect.protocol.state import Lifecycle


def kinds_of(state: PoolState, deployment: str) -> frozenset[str]:
    """The GPU kinds of the pool `deployment` fits."""
    info = state.deployment(deployment)
    have = {d.gpu for d in state.devices}
    return frozenset(f.gpu for f in info.fits if f.gpu in have)


def has_copy(
    state: PoolState, deployment: str, gone: Iterable[str], decided: Iterable[str]
) -> bool:
    """A replica of `deployment` stays (not in `gone`, not unloading), is planned, or was
    decided this round (`decided`: deployments)."""
    skip = set(gone)
    if deployment in set(decided):
        return True
    if any(p.deployment == deployment for p in state.planned):
        return True
    return any(
        r.deployment == deployment and r.name not in skip and r.lifecycle is not Lifecycle.UNLOADING
        for r in state.replicas
    )


def _other_free_device(
    state: PoolState, device: str, kinds: frozenset[str], taken: set[str]
) -> bool:
    for d in state.devices:
        if d.name == device or d.name in taken or d.gpu not in kinds:
            continue
        if not any(state.leased(r.name) for r in state.replicas_on(d.name)):
            return True
    return False


def scarce_delay_s(
    state: PoolState,
    deployment: str,
    device: str,
    busy_until_s: float,
    pending: Mapping[str, Sequence[float]],
    costs: CostModel,
    *,
    gone: Iterable[str] = (),
    decided: Iterable[str] = (),
    taken_devices: Iterable[str] = (),
) -> float:
    """Unit-seconds of delay that holding `device` with `deployment` until `busy_until_s` puts
    on constrained pending demand (module docstring).

    Args:
        pending: deployment -> predicted releases of its units that have not started.
        gone: replicas reclaimed (by this option or earlier this round).
        decided: deployments a copy of which this round already decided to load.
        taken_devices: devices this round already committed a load to.
    """
    if not any(pending.values()):
        return 0.0
    now = state.now_s
    gpu = state.device(device).gpu
    mine = kinds_of(state, deployment)
    gone_set, decided_set, taken = set(gone), set(decided), set(taken_devices)
    total = 0.0
    for other, releases in pending.items():
        if other == deployment or not releases:
            continue
        kinds = kinds_of(state, other)
        if gpu not in kinds or not kinds < mine:
            continue
        if has_copy(state, other, gone_set, decided_set):
            continue
        if _other_free_device(state, device, kinds, taken):
            continue
        load = costs.load_s(state.deployment(other).model, gpu)
        fit = state.fit(deployment, device)
        unload = fit.unload_s if fit else 1.0
        back = busy_until_s + unload + load
        total += sum(max(back - max(t, now + load), 0.0) for t in releases)
    return total
