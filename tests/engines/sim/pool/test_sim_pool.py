"""SimPool: lifecycle on the clock with exact event logs, memory admission, placement, device time.

Step times use `LinearCost` (1 ms per scheduled token + 10 ms per step); lifecycle times come from
the same `catalog.lifecycle` functions the pool executes.
"""

from __future__ import annotations

import pytest
from sim_factories import LinearCost, assert_log

from maserve_prefect.clock.kernel import Kernel
from maserve_prefect.dispatch.dispatcher import Dispatcher
from maserve_prefect.dispatch.snapshot import Unit
from maserve_prefect.engines.catalog import lifecycle as lc
from maserve_prefect.engines.sim.loop import LogEntry
from maserve_prefect.engines.sim.pool.sim_pool import Deployment, DeviceSlot, SimPool
from maserve_prefect.errors import ConfigError
from maserve_prefect.protocol.engine import LifecycleAction
from maserve_prefect.protocol.outcomes import Acceptance
from maserve_prefect.protocol.requests import Request
from maserve_prefect.protocol.state import Lifecycle

KV_64_BLOCKS = 64 * 16 * 28 * 2 * 8 * 128 * 2  # Qwen3-0.6B: 28 layers, 8 KV heads x 128, bf16


def small_dep(name: str = "tiny", **kw: object) -> Deployment:
    return Deployment(name, "Qwen3-0.6B", kv_cache_bytes=KV_64_BLOCKS, **kw)  # type: ignore[arg-type]


def linear_pool(devices: list[str], log: list[LogEntry] | None = None) -> tuple[Kernel, SimPool]:
    k = Kernel()
    pool = SimPool(k, devices, cost_model=lambda d, s: LinearCost(), log=log, check_invariants=True)
    return k, pool


def plans(dep: Deployment, gpu_name: str = "H100") -> dict[str, lc.LifecyclePlan]:
    gpu = DeviceSlot.parse(f"{gpu_name}:0").gpu
    spec, kv, p = dep.spec, dep.kv_bytes(gpu), dep.params()
    return {
        "load": lc.load_plan(spec, gpu, kv, "disk", 1, p),
        "sleep1": lc.sleep_plan(spec, gpu, kv, 1, 1, p),
        "wake1": lc.wake_plan(spec, gpu, kv, 1, "disk", 1, p),
        "unload": lc.unload_plan(spec, kv, 1, p),
    }


def test_kv_budget_gives_64_blocks() -> None:
    assert small_dep().num_gpu_blocks(DeviceSlot.parse("H100:0").gpu) == 64


def test_load_serve_sleep_wake_serve_unload_exact_log() -> None:
    log: list[LogEntry] = []
    k, pool = linear_pool(["H100:0"], log)
    dep = small_dep()
    pl = plans(dep)
    name = "tiny@H100:0"
    a = Request("a", "tiny", num_prompt_tokens=32, prefix_block_hashes=(1, 2),
                prefix_block_size=16, max_tokens=3)  # fmt: skip
    b = Request("b", "tiny", num_prompt_tokens=16, max_tokens=2)
    c = Request("c", "tiny", num_prompt_tokens=32, prefix_block_hashes=(1, 2),
                prefix_block_size=16, max_tokens=2)  # fmt: skip

    def after_wake(_: object) -> None:
        rep = pool.replica(name)
        assert rep.submit(c).accepted
        rep.on_idle(lambda: pool.unload(name))

    def after_load(_: object) -> None:
        rep = pool.replica(name)
        assert rep.submit(a).accepted and rep.submit(b).accepted
        rep.on_idle(lambda: pool.sleep(name, 1, on_done=lambda _t: pool.wake(name,
                                                                            on_done=after_wake)))  # fmt: skip

    ticket = pool.load(dep, "H100:0", on_done=after_load)
    assert ticket.acceptance is Acceptance.ACCEPTED and ticket.done_s is None
    k.run()
    t_load = pl["load"].total_s
    t_sleep = t_load + 0.081
    t_wake = t_sleep + pl["sleep1"].total_s
    t_c = t_wake + pl["wake1"].total_s
    t_unload = t_c + 0.053  # c: prefill 32 tokens (no hit: sleep cleared the cache) + 1 decode
    assert_log(log, [
        (0.0, "load", name, 0), (t_load, "ready", name, 0),
        (t_load, "arrive", "a", 0), (t_load, "arrive", "b", 0),
        (t_load, "schedule", "a", 0), (t_load, "schedule", "b", 0),
        (t_load + 0.058, "first_token", "a", 1), (t_load + 0.058, "first_token", "b", 1),
        (t_load + 0.070, "finish", "b", 2), (t_load + 0.081, "finish", "a", 3),
        (t_sleep, "sleep", name, 1), (t_wake, "asleep", name, 1),
        (t_wake, "wake", name, 1), (t_c, "awake", name, 1),
        (t_c, "arrive", "c", 0), (t_c, "schedule", "c", 0),
        (t_c + 0.042, "first_token", "c", 1), (t_c + 0.053, "finish", "c", 2),
        (t_unload, "unload", name, 0), (t_unload + pl["unload"].total_s, "unloaded", name, 0),
    ])  # fmt: skip
    assert ticket.done_s == pytest.approx(t_load)
    recs = pool.lifecycle_log
    assert [r.action for r in recs] == [LifecycleAction.LOAD, LifecycleAction.SLEEP,
                                        LifecycleAction.WAKE, LifecycleAction.UNLOAD]  # fmt: skip
    assert [p.name for p in recs[0].phases] == [p.name for p in pl["load"].phases]
    gpu = DeviceSlot.parse("H100:0").gpu
    w, kv, proc = dep.spec.weight_bytes_per_rank(1), dep.kv_bytes(gpu), dep.process_bytes(gpu)
    assert [(r.memory_before_bytes, r.memory_after_bytes) for r in recs] == [
        (0, w + kv + proc), (w + kv + proc, proc), (proc, w + kv + proc), (w + kv + proc, 0)
    ]  # fmt: skip
    assert pool.status(name) is Lifecycle.UNLOADED and pool.replicas() == []
    mem = pool.memory_timeline("H100:0")
    assert mem[-1] == (pytest.approx(t_unload + pl["unload"].total_s), 0)
    assert max(used for _, used in mem) == w + kv + proc


def test_submit_to_loading_replica_is_rejected_not_queued() -> None:
    k, pool = linear_pool(["H100:0"])
    t = pool.load(small_dep(), "H100:0")
    k.run(until=1.0)
    ticket = pool.replica(t.replica).submit(Request("x", "tiny", num_prompt_tokens=8))
    assert ticket.acceptance is Acceptance.REJECTED
    assert "is loading; retry after its load ticket completes" in ticket.reason
    assert pool.replica(t.replica).state().lifecycle is Lifecycle.LOADING
    assert not pool.replica(t.replica).lifecycle.accepting


def test_sleep_of_a_busy_replica_is_rejected_with_drain_hint() -> None:
    k, pool = linear_pool(["H100:0"])
    t = pool.load(small_dep(), "H100:0")
    k.run()
    pool.replica(t.replica).submit(Request("x", "tiny", num_prompt_tokens=8, max_tokens=4))
    ticket = pool.sleep(t.replica, 1)
    assert ticket.acceptance is Acceptance.REJECTED and "drain first" in ticket.reason
    wake = pool.wake(t.replica)
    assert wake.acceptance is Acceptance.REJECTED and "is ready" in wake.reason


def test_load_that_does_not_fit_is_rejected_with_numbers() -> None:
    _, pool = linear_pool(["A100-40GB:0"])
    first = pool.load(Deployment("a", "Qwen3-8B", gpu_memory_utilization=0.6), "A100-40GB:0")
    assert first.acceptance is Acceptance.ACCEPTED
    second = pool.load(Deployment("b", "Qwen3-8B", gpu_memory_utilization=0.6), "A100-40GB:0")
    assert second.acceptance is Acceptance.REJECTED
    mem = pool.memory("A100-40GB:0")
    assert f"{mem.total_bytes / 1e9:.2f} GB" in second.reason
    assert "GB held or committed by ['a@A100-40GB:0']" in second.reason
    too_big = pool.load(Deployment("big", "Qwen3-32B"), "A100-40GB:0")
    assert too_big.acceptance is Acceptance.REJECTED and "Use a larger GPU" in too_big.reason


def test_two_replicas_share_a_device_when_memory_allows() -> None:
    k, pool = linear_pool(["H100:0"])
    dep = Deployment("half", "Qwen3-8B", gpu_memory_utilization=0.45)
    t1, t2 = pool.load(dep, "H100:0"), pool.load(dep, "H100:0")
    assert (t1.acceptance, t2.acceptance) == (Acceptance.ACCEPTED, Acceptance.ACCEPTED)
    assert (t1.replica, t2.replica) == ("half@H100:0", "half@H100:0#2")
    k.run()
    mem = pool.memory("H100:0")
    assert mem.residents == ("half@H100:0", "half@H100:0#2")
    assert mem.used_bytes <= mem.total_bytes
    gpu = DeviceSlot.parse("H100:0").gpu
    each = dep.spec.weight_bytes_per_rank(1) + dep.kv_bytes(gpu) + dep.process_bytes(gpu)
    assert mem.used_bytes == 2 * each
    placed: list[str] = []
    d = Dispatcher(pool.replicas, k.now)  # least-loaded placement spreads them
    for i in range(2):
        req = Request(f"x{i}", "half", num_prompt_tokens=8, max_tokens=4)
        unit = Unit(f"x{i}", f"x{i}", "half", 8, 4)
        d.on_ready(unit, req, on_done=lambda o: None, on_submitted=lambda t, r: placed.append(r))
    assert placed == ["half@H100:0", "half@H100:0#2"]


def test_heterogeneous_devices_time_the_same_request_differently() -> None:
    k = Kernel()
    pool = SimPool(k, ["V100-32GB:0", "A100-40GB:0"])
    dep = Deployment("q", "Qwen3-0.6B")
    v100 = pool.load(dep, "V100-32GB:0")
    a100 = pool.load(dep, "A100-40GB:0")
    k.run()
    done = {}
    for t in (v100, a100):
        ticket = pool.replica(t.replica).submit(Request(f"r-{t.replica}", "q",
                                                        num_prompt_tokens=2000, max_tokens=16))  # fmt: skip
        start = k.now()
        ticket.on_done(lambda out, n=t.replica, s=start: done.__setitem__(n, out.finish_s - s))
    k.run()
    assert v100.done_s is not None and a100.done_s is not None
    assert v100.done_s == a100.done_s  # both read weights at the 2 GB/s disk, below PCIe
    assert done[v100.replica] > done[a100.replica] > 0


def test_device_time_split_sums_to_window_and_matches_the_lifecycle() -> None:
    k, pool = linear_pool(["H100:0", "H100:1"])
    dep = small_dep()
    pl = plans(dep)
    t = pool.load(dep, "H100:0")
    k.run()
    rep = pool.replica(t.replica)
    rep.submit(Request("x", "tiny", num_prompt_tokens=64, max_tokens=5))
    rep.on_idle(lambda: pool.sleep(t.replica, 1))
    k.run()
    end = k.now() + 10.0
    rows = {r.device: r for r in pool.device_time(0.0, end)}
    for r in rows.values():
        total = r.generation_s + r.idle_resident_s + r.loading_s + r.other_s
        assert total == pytest.approx(end)
    busy = rows["H100:0"]
    assert busy.generation_s == pytest.approx(sum(r.duration_s for r in rep.records))
    assert busy.loading_s == pytest.approx(pl["load"].total_s + pl["sleep1"].total_s)
    assert busy.idle_resident_s == pytest.approx(0.0, abs=1e-9)  # asleep right after serving
    assert busy.other_s == pytest.approx(10.0)
    assert rows["H100:1"].other_s == pytest.approx(end)


def test_bad_device_names_and_duplicate_deployment_names() -> None:
    with pytest.raises(ConfigError, match="name devices 'GPU:index'"):
        SimPool(Kernel(), ["H100"])
    with pytest.raises(ConfigError, match="listed twice"):
        SimPool(Kernel(), ["H100:0", "H100:0"])
    pool = SimPool(Kernel(), ["H100:0"])
    pool.register(small_dep())
    with pytest.raises(ConfigError, match="another configuration"):
        pool.register(small_dep(enforce_eager=True))


def _run_once() -> tuple[list[LogEntry], list[tuple[float, int]]]:
    log: list[LogEntry] = []
    k, pool = linear_pool(["H100:0", "H100:1"], log)
    dep = small_dep()
    for d in pool.devices():
        pool.load(dep, d)
    k.run()
    d = Dispatcher(pool.replicas, k.now)
    for i in range(6):

        def go(i: int = i) -> None:
            req = Request(f"r{i}", "tiny", num_prompt_tokens=20 + 7 * i, max_tokens=3 + i)
            d.on_ready(
                Unit(f"r{i}", f"r{i}", "tiny", 20 + 7 * i, 3 + i), req, on_done=lambda o: None
            )

        k.call_at(k.now() + 0.005 * i, go)
    k.run()
    return log, pool.memory_timeline("H100:1")


def test_same_inputs_give_identical_runs() -> None:
    assert _run_once() == _run_once()
