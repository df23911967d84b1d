"""Policy arms: one HEAR policy combination replayed on a fresh simulated pool.

One idea: every arm of a suite replays the *same* recorded `SessionSet` (checked by content hash)
on a fresh pool (`make_pool`), so arms differ only in policy. `parse_arm` builds an `Arm` from a
`+`-joined spec; `run_arm` wires the arm's policies onto the session-replay driver through the
adapters (`PolicyOrder`, `RetentionHook`, `ModeReplica`) with one `OverheadRecorder`, and returns
the replay result with the control-plane accounting (`ArmRun`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from maserve_prefect.bench.hear.adapters import ModeReplica, PolicyOrder, RetentionHook
from maserve_prefect.engines.sim.replica import SimReplica
from maserve_prefect.errors import ConfigError
from maserve_prefect.hear.modemap import ModeRecord
from maserve_prefect.hear.overhead import OverheadRecorder
from maserve_prefect.hear.policies import (
    CacheAware,
    Fcfs,
    GuardW,
    OrderingPolicy,
    RoleModeSelection,
    SessionRetention,
    compose,
)
from maserve_prefect.replay.session_results import SessionReplayResult
from maserve_prefect.replay.sessions import replay_sessions
from maserve_prefect.workloads.sessions import SessionSet

__all__ = ["Arm", "ArmRun", "make_pool", "parse_arm", "run_arm"]


def make_pool(
    gpu: str, model: str, num_devices: int, host_kv_gib: float, scheduler: dict[str, Any]
) -> list[SimReplica]:
    """A fresh kernel and pool of `num_devices` × `gpu`, one `model` replica each, loaded.

    Raises:
        ConfigError: the model does not fit the GPU (the load is rejected).
    """
    from maserve_prefect.clock.kernel import Kernel
    from maserve_prefect.engines.sim.pool.sim_pool import Deployment, SimPool

    kernel = Kernel()
    devices = [f"{gpu}:{i}" for i in range(num_devices)]
    pool = SimPool(kernel, devices, host_kv_bytes=int(host_kv_gib * (1 << 30)))
    dep = Deployment("m", model, scheduler=tuple(sorted(scheduler.items())))
    for d in devices:
        ticket = pool.load(dep, d)
        if ticket.acceptance.value != "accepted":
            raise ConfigError(f"cannot load {model} on {d}: {ticket.reason}")
    kernel.run()
    return sorted((p.engine for p in pool.pool_replicas()), key=lambda r: r.name)


@dataclass(frozen=True, slots=True)
class Arm:
    """One policy arm: an ordering policy, optional retention and role -> mode selection."""

    name: str
    order: OrderingPolicy
    retention: SessionRetention | None = None
    selection: RoleModeSelection | None = None


def parse_arm(name: str, spec: str) -> Arm:
    """An arm from a `+`-joined spec: `fcfs`, `cache_aware`, `guard<W>` (seconds),
    `session_aware` (retention with FCFS order unless another ordering term is given).

    Raises:
        ConfigError: an unknown term.

    Examples:
        >>> parse_arm("x", "cache_aware+guard40").order.name
        'guard_w+cache_aware'
        >>> parse_arm("s", "session_aware").retention is not None
        True
    """
    terms: list[OrderingPolicy] = []
    retention = None
    for term in spec.split("+"):
        term = term.strip()
        if term == "fcfs":
            terms.append(Fcfs())
        elif term == "cache_aware":
            terms.append(CacheAware())
        elif term.startswith("guard") and term[5:].replace(".", "", 1).isdigit():
            terms.append(GuardW(float(term[5:])))
        elif term == "session_aware":
            retention = SessionRetention()
        else:
            raise ConfigError(
                f"arm {name!r}: unknown policy term {term!r} in {spec!r}; use fcfs, "
                "cache_aware, guard<seconds>, session_aware joined by '+'"
            )
    order: OrderingPolicy = compose(*terms) if terms else Fcfs()
    return Arm(name, order, retention)


@dataclass(slots=True)
class ArmRun:
    """What one arm produced: the replay result and the control-plane accounting."""

    arm: Arm
    result: SessionReplayResult
    recorder: OverheadRecorder
    order_hook: PolicyOrder
    retention_hook: RetentionHook | None
    mode_records: list[ModeRecord]
    replicas: list[SimReplica] = field(default_factory=list)

    def host_tier_use(self) -> tuple[int, float, int]:
        """(prompt tokens of completed turns served from the host KV tier, seconds of
        host-to-device transfer charged to steps, number of such transfers), over the pool.

        The per-request split lives on the simulator side (`SimHear.cpu_cached_tokens`, filled
        when a request finishes; `Outcome` has no field for it): reuse from the host tier is
        part of `num_cached_tokens` and is not free — each load lengthens the step that admits
        the request by `bytes / PCIe bandwidth` (`engines.sim.kv.host_tier.HostTierConfig`).
        """
        done = {t.request_id for t in self.result.completed()}
        tokens, seconds, count = 0, 0.0, 0
        for rep in self.replicas:
            hear = rep.hear
            if hear.host is None:
                continue
            tokens += sum(n for rid, n in hear.cpu_cached_tokens.items() if rid in done)
            seconds += sum(t.seconds for t in hear.transfers)
            count += len(hear.transfers)
        return tokens, seconds, count


def run_arm(
    sset: SessionSet,
    arm: Arm,
    replicas: Sequence[SimReplica],
    *,
    max_in_flight: int | None,
    expect_hash: str | None = None,
) -> ArmRun:
    """Replay `sset` on fresh `replicas` under `arm`.

    Raises:
        ConfigError: `sset`'s content hash is not `expect_hash` (a workload must be replayed
            identically for every policy).
    """
    if expect_hash is not None and sset.content_hash() != expect_hash:
        raise ConfigError(
            f"arm {arm.name!r}: workload hash {sset.content_hash()[:12]} differs from the "
            f"recorded {expect_hash[:12]}; every arm must replay the same SessionSet"
        )
    recorder = OverheadRecorder()
    order = PolicyOrder(arm.order, replicas, recorder, max_in_flight)
    retention = (
        RetentionHook(arm.retention, replicas, recorder) if arm.retention is not None else None
    )
    records: list[ModeRecord] = []
    targets: list[Any] = (
        [ModeReplica(r, arm.selection, recorder, records) for r in replicas]
        if arm.selection is not None
        else list(replicas)
    )
    result = replay_sessions(
        sset, targets, deployment="m", order=order, on_complete=retention,
        max_in_flight=max_in_flight,
    )  # fmt: skip
    if result.content_hash != sset.content_hash():
        raise ConfigError(f"arm {arm.name!r}: the replay reports a different workload hash")
    return ArmRun(arm, result, recorder, order, retention, records, list(replicas))
