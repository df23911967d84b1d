"""The Cache-Aware adapter's residency mirror (KV events) equals a full photograph at every
refresh, and decides exactly what the photograph would."""

from __future__ import annotations

import doctest
from typing import ClassVar

from maserve_prefect.bench.hear import residency_mirror
from maserve_prefect.bench.hear.adapters import EngineOrdering
from maserve_prefect.bench.hear.arms import parse_arm
from maserve_prefect.bench.hear.residency_mirror import merged_residency
from maserve_prefect.clock.kernel import Kernel
from maserve_prefect.engines.catalog import get_gpu, get_model
from maserve_prefect.engines.sim.cost.step_time import make_step_model
from maserve_prefect.engines.sim.kv.host_tier import HostTierConfig
from maserve_prefect.engines.sim.replica import SimReplica
from maserve_prefect.engines.sim.step.scheduler import Policy, SchedulerConfig
from maserve_prefect.protocol.controls import Tier
from maserve_prefect.protocol.state import ResidencyView
from maserve_prefect.replay.sessions import replay_sessions
from maserve_prefect.workloads.scbench import generate_scbench
from maserve_prefect.workloads.sessions import SessionSet


def test_doctests() -> None:
    assert doctest.testmod(residency_mirror).failed == 0


def pool(kernel: Kernel, n: int) -> list[SimReplica]:
    """Replicas whose GPU and host tiers are both too small for the workload: blocks move to the
    host tier, drop out of it and come back, so every kind of change happens. They run the
    priority policy (Cache-Aware arms)."""
    host = HostTierConfig.of(24 << 20, get_model("Qwen3-0.6B"), get_gpu("H100"), 16)
    return [
        SimReplica(
            kernel,
            make_step_model("Qwen3-0.6B", "H100"),
            num_gpu_blocks=400,
            host_tier=host,
            config=SchedulerConfig(policy=Policy.PRIORITY),
            name=f"r{i}",
        )
        for i in range(n)
    ]


class CheckedOrdering(EngineOrdering):
    """The adapter under test, comparing its mirror with a photograph of the pool each time."""

    checked: ClassVar[int] = 0
    tiers_seen: ClassVar[set[Tier]] = set()

    def residency(self) -> ResidencyView:
        view = super().residency()
        photo = merged_residency(list(self.replicas.values()))
        assert dict(view.tiers) == dict(photo.tiers)
        CheckedOrdering.checked += 1
        CheckedOrdering.tiers_seen |= set(view.tiers.values())
        return view


def replay(ordering: EngineOrdering, reps: list[SimReplica], sset: SessionSet) -> list[str]:
    result = replay_sessions(sset, reps, deployment="m", controls=ordering.controls,
                             on_submit=ordering.on_submit, on_complete=ordering.on_complete)  # fmt: skip
    return [
        t.request_id for t in sorted(result.turns, key=lambda t: (t.first_token_s, t.request_id))
    ]


def test_mirror_equals_the_photograph_at_every_refresh_and_orders_the_same() -> None:
    sset = generate_scbench(12, 3, arrival_rate_per_s=50.0, num_contexts=4,
                            context_tokens=(2048, 3072), mean_turns=3, min_turns=2, max_turns=4,
                            think_mean_s=0.5)  # fmt: skip
    arm = parse_arm("ca", "cache_aware+guard5")
    orders = []
    for cls in (CheckedOrdering, EngineOrdering):
        kernel = Kernel()
        reps = pool(kernel, 2)
        ordering = cls(arm.cache_aware, arm.guard, reps, refresh_s=0.5)
        orders.append(replay(ordering, reps, sset))
        if cls is CheckedOrdering:
            assert ordering.mirror.num_changes > 0 and ordering.num_updates > 0
            evicted = sum(r.hear.num_evictions for r in reps)
            dropped = sum(r.hear.host.num_dropped for r in reps if r.hear.host is not None)
            assert evicted > 0 and dropped > 0  # GPU evictions and host-tier drops both happened
    assert CheckedOrdering.checked > 10 and CheckedOrdering.tiers_seen == {Tier.GPU, Tier.CPU}
    assert orders[0] == orders[1]


def test_a_reset_empties_the_mirror() -> None:
    kernel = Kernel()
    (rep,) = pool(kernel, 1)
    sset = generate_scbench(2, 1, arrival_rate_per_s=50.0, num_contexts=None,
                            context_tokens=(2048, 2048), mean_turns=1, min_turns=1, max_turns=1,
                            think_mean_s=0.0)  # fmt: skip
    ordering = EngineOrdering(parse_arm("ca", "cache_aware").cache_aware, None, [rep])
    replay(ordering, [rep], sset)
    assert ordering.residency().tiers  # blocks resident after the run
    rep.reset_prefix_cache()
    assert dict(ordering.residency().tiers) == dict(merged_residency([rep]).tiers) == {}
