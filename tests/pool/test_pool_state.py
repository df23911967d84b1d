"""Pool state: the roofline cost model against the simulator, deployment fits, leases."""

from __future__ import annotations

import pytest
from pool_factories import make_pool, make_replica

from maserve_prefect.clock.kernel import Kernel
from maserve_prefect.engines.sim.pool.device import Deployment
from maserve_prefect.engines.sim.pool.sim_pool import SimPool
from maserve_prefect.errors import ConfigError
from maserve_prefect.pool.state import (
    ActiveRequest,
    Lease,
    PoolState,
    RooflineCostModel,
    deployment_info,
)
from maserve_prefect.protocol.requests import Request
from maserve_prefect.protocol.state import Lifecycle

GIB = 1 << 30
GPUS = ("A100-40GB", "V100-32GB")


@pytest.mark.parametrize("gpu", GPUS)
@pytest.mark.parametrize("shape", [(500, 200), (2000, 1), (64, 33)])
def test_roofline_runtime_matches_a_lone_request_on_the_simulator(
    gpu: str, shape: tuple[int, int]
) -> None:
    k = Kernel()
    pool = SimPool(k, [f"{gpu}:0"])
    ticket = pool.load(Deployment("m", "Qwen3-8B", kv_cache_bytes=2 * GIB), f"{gpu}:0")
    k.run()
    start = k.now()
    done = []
    req = Request("r", "m", num_prompt_tokens=shape[0], max_tokens=shape[1], min_tokens=shape[1])
    pool.replica(ticket.replica).submit(req).on_done(done.append)
    k.run()
    measured = done[0].finish_s - start
    predicted = RooflineCostModel(2 * GIB).runtime_s("Qwen3-8B", gpu, 1, *shape)
    assert predicted == pytest.approx(measured, rel=1e-6)


def test_load_time_and_peak_memory_match_the_simulator_pool() -> None:
    k = Kernel()
    pool = SimPool(k, ["V100-32GB:0"])
    dep = Deployment("m", "Qwen3-4B", kv_cache_bytes=2 * GIB)
    ticket = pool.load(dep, "V100-32GB:0")
    k.run()
    costs = RooflineCostModel(2 * GIB)
    assert ticket.done_s == pytest.approx(costs.load_s("Qwen3-4B", "V100-32GB"))
    fit = deployment_info(dep, ["V100-32GB"]).fit("V100-32GB")
    assert fit is not None
    assert pool.memory("V100-32GB:0").used_bytes == fit.footprint_bytes
    assert costs.peak_mem_bytes("Qwen3-4B", "V100-32GB", 8, 1000, 100) == fit.footprint_bytes


def test_dynamic_kv_peak_memory_grows_with_the_batch() -> None:
    costs = RooflineCostModel(None)
    one = costs.peak_mem_bytes("Qwen3-8B", "A100-40GB", 1, 1000, 100)
    four = costs.peak_mem_bytes("Qwen3-8B", "A100-40GB", 4, 1000, 100)
    assert four - one == 3 * 1100 * 147456


def test_deployment_info_skips_devices_the_model_cannot_fit() -> None:
    big = deployment_info(Deployment("big", "Qwen3-32B", kv_cache_bytes=GIB), GPUS)
    assert big.fits == ()
    fourteen = deployment_info(Deployment("m", "Qwen3-14B", kv_cache_bytes=2 * GIB), GPUS)
    assert [f.gpu for f in fourteen.fits] == ["A100-40GB", "V100-32GB"]


def test_only_idle_lease_free_resident_or_sleeping_replicas_are_reclaimable() -> None:
    busy = ActiveRequest("u", 10, 10, 0.0, 1.0)
    state = make_pool(
        1,
        make_replica("idle", "Qwen3-0.6B", phase=Lifecycle.READY),
        make_replica("asleep", "Qwen3-0.6B", phase=Lifecycle.ASLEEP, held_bytes=GIB),
        make_replica("busy", "Qwen3-0.6B", phase=Lifecycle.READY, active=(busy,)),
        make_replica("leased", "Qwen3-0.6B", phase=Lifecycle.READY),
        make_replica("loading", "Qwen3-0.6B", phase=Lifecycle.LOADING, ready_s=30.0),
        make_replica("leaving", "Qwen3-0.6B", phase=Lifecycle.UNLOADING, ready_s=1.0),
        leases=(Lease("leased", "chain-a", ("a", "b")),),
    )
    reclaimable = [r.name for r in state.replicas if state.reclaimable(r.name)]
    assert reclaimable == ["idle", "asleep"]
    assert state.leased("busy") and state.leased("leased") and not state.leased("idle")
    assert state.queues()["busy"] == ("u",)


def test_used_bytes_sums_what_replicas_hold_now() -> None:
    a = make_replica("a", "Qwen3-0.6B", phase=Lifecycle.READY)
    b = make_replica("b", "Qwen3-0.6B", phase=Lifecycle.ASLEEP, held_bytes=GIB)
    state = make_pool(1, a, b)
    assert state.used_bytes("A100-40GB:0") == a.held_bytes + GIB


def test_unknown_names_raise_config_errors() -> None:
    state = make_pool(1)
    with pytest.raises(ConfigError, match="no device"):
        state.device("H100:0")
    with pytest.raises(ConfigError, match="no deployment"):
        state.deployment("nope")
    with pytest.raises(ConfigError, match="unknown device"):
        PoolState(0.0, (), (), (make_replica("x", "Qwen3-0.6B", phase=Lifecycle.READY),))
