"""Pool sizing rule: the smallest pool meeting the SLO, the printed sweep, host-tier accounting."""

from __future__ import annotations

import doctest

import pytest

from maserve_prefect.bench.hear import pool_sizing
from maserve_prefect.bench.hear.arms import parse_arm, run_arm
from maserve_prefect.bench.hear.mooncake_suite import mooncake_pool_size
from maserve_prefect.bench.hear.pool_sizing import SizingRule, size_pool
from maserve_prefect.bench.hear.residency_mirror import merged_residency
from maserve_prefect.bench.hear.suite_file import HearPool
from maserve_prefect.bench.hear.tables import arm_row
from maserve_prefect.clock.kernel import Kernel
from maserve_prefect.engines.catalog import get_gpu, get_model
from maserve_prefect.engines.sim.cost.step_time import make_step_model
from maserve_prefect.engines.sim.kv.host_tier import HostTierConfig
from maserve_prefect.engines.sim.replica import SimReplica
from maserve_prefect.errors import ConfigError
from maserve_prefect.workloads.scbench import generate_scbench
from maserve_prefect.workloads.sessions import SessionSet

POOL = {"gpu": "RTX-PRO-6000", "model": "Qwen3-0.6B", "host_kv_gib": 1.0}


def burst() -> SessionSet:
    """Sessions arriving at once: with one request in flight per replica, a queue forms that
    more replicas shorten."""
    return generate_scbench(12, 5, arrival_rate_per_s=100.0, num_contexts=12,
                            context_tokens=(8192, 8192), mean_turns=1, min_turns=1, max_turns=1,
                            think_mean_s=0.0)  # fmt: skip


def test_doctests() -> None:
    assert doctest.testmod(pool_sizing).failed == 0


def test_sizing_rule_rejects_bad_configs() -> None:
    with pytest.raises(ConfigError, match="lacks"):
        SizingRule.from_config({"load": 0.5, "ttft_quantile": 90})
    with pytest.raises(ConfigError, match="unknown keys"):
        SizingRule.from_config({"load": 0.5, "ttft_quantile": 90, "ttft_slo_s": 1, "x": 1})
    with pytest.raises(ConfigError, match="load"):
        SizingRule(1.5, 90, 10)
    with pytest.raises(ConfigError, match="ttft_slo_s"):
        SizingRule(0.5, 90, 0)


def test_size_pool_finds_the_smallest_pool_meeting_the_slo() -> None:
    sset = burst()
    loose = SizingRule(1.0, 90, 1e9, max_devices=4)
    n1, steps1 = size_pool(sset, loose, **POOL)
    assert n1 == 1 and len(steps1) == 1 and steps1[0].meets_slo
    q1 = steps1[0].ttft_quantile_s
    # an SLO just under one device's p90: one device fails, and the answer is the first that meets
    tight = SizingRule(1.0, 90, 0.9 * q1, max_devices=4)
    n, steps = size_pool(sset, tight, **POOL)
    assert n >= 2 and [s.num_devices for s in steps] == list(range(1, n + 1))
    assert [s.meets_slo for s in steps] == [False] * (n - 1) + [True]
    assert steps[0].ttft_quantile_s == pytest.approx(q1)
    assert steps[-1].ttft_quantile_s <= 0.9 * q1


def test_size_pool_says_when_no_size_meets_it() -> None:
    with pytest.raises(ConfigError, match=r"no pool of 1\.\.2") as exc:
        size_pool(burst(), SizingRule(1.0, 90, 1e-6, max_devices=2), **POOL)
    assert "1: " in str(exc.value) and "2: " in str(exc.value)  # the sweep is in the message


def test_mooncake_pool_size_pinned_or_by_rule() -> None:
    sset = burst()
    pinned = HearPool.model_validate({**POOL, "num_devices": 3})
    assert mooncake_pool_size(pinned, {1.0: sset}) == (3, "pinned by pool.num_devices", [])
    rule = {"load": 1.0, "ttft_quantile": 90, "ttft_slo_s": 1e9}
    ruled = HearPool.model_validate({**POOL, "sizing": rule})
    n, how, steps = mooncake_pool_size(ruled, {1.0: sset})
    assert n == 1 and "p90 TTFT <= 1e+09 s at 100% load" in how and len(steps) == 1
    half = HearPool.model_validate({**POOL, "sizing": rule | {"load": 0.5}})
    with pytest.raises(ConfigError, match="not a workload fraction"):
        mooncake_pool_size(half, {1.0: sset})
    with pytest.raises(ConfigError, match="sizing"):
        mooncake_pool_size(HearPool.model_validate(POOL), {1.0: sset})


def test_host_tier_reuse_is_counted_and_charged() -> None:
    # a GPU that holds one 4k-token context, two contexts alternating: the second turn of each
    # session finds its context evicted to the host tier and loads it back over PCIe
    model, gpu = get_model("Qwen3-0.6B"), get_gpu("H100")
    host = HostTierConfig.of(1 << 30, model, gpu, 16)
    rep = SimReplica(Kernel(), make_step_model("Qwen3-0.6B", "H100"), num_gpu_blocks=300,
                     host_tier=host)  # fmt: skip
    sset = generate_scbench(4, 1, arrival_rate_per_s=100.0, num_contexts=None,
                            context_tokens=(4096, 4096), mean_turns=2, min_turns=2, max_turns=2,
                            think_mean_s=30.0)  # fmt: skip
    run = run_arm(sset, parse_arm("fcfs", "fcfs"), [rep])
    tokens, seconds, count = run.host_tier_use()
    assert tokens > 0 and count > 0
    assert seconds == pytest.approx(sum(t.seconds for t in rep.hear.transfers)) and seconds > 0
    row = arm_row(run)
    assert 0 < row["reuse_host"] <= row["reuse"]
    assert row["host_load_s"] == pytest.approx(seconds)
    # without a host tier nothing comes back from it
    bare = SimReplica(Kernel(), make_step_model("Qwen3-0.6B", "H100"), num_gpu_blocks=300)
    none = arm_row(run_arm(sset, parse_arm("fcfs", "fcfs"), [bare]))
    assert none["reuse_host"] == 0.0 and none["host_load_s"] == 0.0
    assert none["reuse"] < row["reuse"]


def test_merged_residency_restricted_to_needed_hashes() -> None:
    rep = SimReplica(Kernel(), make_step_model("Qwen3-0.6B", "H100"), num_gpu_blocks=300,
                     host_tier=HostTierConfig.of(1 << 30, get_model("Qwen3-0.6B"),
                                                 get_gpu("H100"), 16))  # fmt: skip
    sset = generate_scbench(4, 1, arrival_rate_per_s=100.0, num_contexts=None,
                            context_tokens=(4096, 4096), mean_turns=1, min_turns=1, max_turns=1,
                            think_mean_s=0.0)  # fmt: skip
    run_arm(sset, parse_arm("fcfs", "fcfs"), [rep])
    full = merged_residency([rep])
    assert {t.name for t in full.tiers.values()} == {"GPU", "CPU"}  # both tiers hold blocks
    needed = set(list(full.tiers)[::3]) | {12345}
    part = merged_residency([rep], needed)
    assert dict(part.tiers) == {h: t for h, t in full.tiers.items() if h in needed}
