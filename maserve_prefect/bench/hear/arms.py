"""Policy arms: one HEAR policy combination replayed on a fresh simulated pool.

One idea: every arm of a suite replays the *same* recorded `SessionSet` (checked by content hash)
on a fresh pool (`make_pool`), so arms differ only in policy. `parse_arm` builds an `Arm` from a
`+`-joined spec; `run_arm` wires the arm's policies onto the session replay through the adapters
(`EngineOrdering`, `ContinuationHook`, `ModeReplica`) with one `OverheadRecorder`: every turn is
submitted when it arrives, with what the policies attach, and the engine — FCFS, or its priority
policy for Cache-Aware arms — decides what runs. It returns the replay result with the
control-plane accounting (`ArmRun`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from maserve_prefect.bench.hear.adapters import ContinuationHook, EngineOrdering, ModeReplica
from maserve_prefect.engines.sim.replica import SimReplica
from maserve_prefect.errors import ConfigError
from maserve_prefect.hear.modemap import ModeRecord
from maserve_prefect.hear.overhead import OverheadRecorder
from maserve_prefect.hear.policies import CacheAware, GuardW, RoleModeSelection, SessionAware
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
    """One policy arm: what the harness sends the engine, and how the engine schedules.

    Attributes:
        cache_aware: send Cache-Aware priorities (the engine then runs its priority policy).
        guard: send a Guard-W waiting requirement with every submission.
        session_aware: tell continuation forecasts after every completed turn.
        selection: role -> execution-mode selection (the role -> mode suite).
        harness_cap: an ablation, named separately: the harness holds turns back so that a
            replica never has more than this many of them (None: every turn goes to the
            engine as it arrives — every arm of the paper's experiments).
    """

    name: str
    cache_aware: CacheAware | None = None
    guard: GuardW | None = None
    session_aware: SessionAware | None = None
    selection: RoleModeSelection | None = None
    harness_cap: int | None = None

    @property
    def engine_policy(self) -> str:
        """The engine's scheduling policy: `priority` to honour Cache-Aware preferences, else
        the default `fcfs` (the paper: "FCFS uses the default engine scheduler")."""
        return "priority" if self.cache_aware is not None else "fcfs"


def parse_arm(name: str, spec: str) -> Arm:
    """An arm from a `+`-joined spec: `fcfs`, `cache_aware`, `guard<W>` (seconds),
    `session_aware`, and the ablation `cap<N>` (a harness cap of N turns per replica).

    Raises:
        ConfigError: an unknown or repeated term.

    Examples:
        >>> a = parse_arm("x", "cache_aware+guard40")
        >>> a.guard.wait_s, a.engine_policy
        (40.0, 'priority')
        >>> parse_arm("s", "session_aware").session_aware is not None
        True
    """
    fields: dict[str, Any] = {}

    def put(key: str, value: Any, term: str) -> None:
        if key in fields:
            raise ConfigError(f"arm {name!r}: {term!r} repeats a {key} term in {spec!r}")
        fields[key] = value

    for term in spec.split("+"):
        term = term.strip()
        if term == "fcfs":
            continue
        if term == "cache_aware":
            put("cache_aware", CacheAware(), term)
        elif term.startswith("guard") and term[5:].replace(".", "", 1).isdigit():
            put("guard", GuardW(float(term[5:])), term)
        elif term == "session_aware":
            put("session_aware", SessionAware(), term)
        elif term.startswith("cap") and term[3:].isdigit():
            put("harness_cap", int(term[3:]), term)
        else:
            raise ConfigError(
                f"arm {name!r}: unknown policy term {term!r} in {spec!r}; use fcfs, "
                "cache_aware, guard<seconds>, session_aware (or the ablation cap<N>) joined by '+'"
            )
    return Arm(name, **fields)


@dataclass(slots=True)
class ArmRun:
    """What one arm produced: the replay result and the control-plane accounting."""

    arm: Arm
    result: SessionReplayResult
    recorder: OverheadRecorder
    ordering: EngineOrdering
    continuation: ContinuationHook | None
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
    refresh_s: float = 1.0,
    expect_hash: str | None = None,
) -> ArmRun:
    """Replay `sset` on fresh `replicas` (built with `arm.engine_policy`) under `arm`.

    Raises:
        ConfigError: `sset`'s content hash is not `expect_hash` (a workload must be replayed
            identically for every policy), or the replicas do not run the arm's policy.
    """
    if expect_hash is not None and sset.content_hash() != expect_hash:
        raise ConfigError(
            f"arm {arm.name!r}: workload hash {sset.content_hash()[:12]} differs from the "
            f"recorded {expect_hash[:12]}; every arm must replay the same SessionSet"
        )
    wrong = [r.name for r in replicas if r.config.policy.value != arm.engine_policy]
    if wrong:
        raise ConfigError(
            f"arm {arm.name!r} needs engines scheduling by {arm.engine_policy!r}; {wrong} do not "
            "(build them with make_pool(..., scheduler={'policy': arm.engine_policy}))"
        )
    recorder = OverheadRecorder()
    ordering = EngineOrdering(arm.cache_aware, arm.guard, replicas, recorder, refresh_s)
    continuation = (
        ContinuationHook(arm.session_aware, replicas, recorder, then=ordering.on_complete)
        if arm.session_aware is not None
        else None
    )
    records: list[ModeRecord] = []
    targets: list[Any] = (
        [ModeReplica(r, arm.selection, recorder, records) for r in replicas]
        if arm.selection is not None
        else list(replicas)
    )
    result = replay_sessions(
        sset, targets, deployment="m",
        controls=ordering.controls if ordering.controls_at_submit else None,
        on_submit=ordering.on_submit,
        on_complete=continuation if continuation is not None else ordering.on_complete,
        max_in_flight=arm.harness_cap,
    )  # fmt: skip
    if result.content_hash != sset.content_hash():
        raise ConfigError(f"arm {arm.name!r}: the replay reports a different workload hash")
    return ArmRun(arm, result, recorder, ordering, continuation, records, list(replicas))


def arm_unit(
    sset: SessionSet,
    name: str,
    spec: str,
    pool: tuple[str, str, int, float, dict[str, Any]],
    refresh_s: float,
    expect_hash: str,
) -> ArmRun:
    """One arm of a HEAR suite on a fresh pool (a `bench.fanout` unit): `pool` is (gpu, model,
    devices, host KV GiB, scheduler settings); the arm's engine policy is set here."""
    arm = parse_arm(name, spec)
    gpu, model, num_devices, host_kv_gib, scheduler = pool
    replicas = make_pool(gpu, model, num_devices, host_kv_gib,
                         {**scheduler, "policy": arm.engine_policy})  # fmt: skip
    return run_arm(sset, arm, replicas, refresh_s=refresh_s, expect_hash=expect_hash)
