"""`SimPool`'s read side (`engines/sim/pool/views.py`): every read answers on a fresh pool, on one
serving a request, and after an unload, and agrees with what the pool did.

(Replaces a check that the `PoolViews` base's declared attributes were set by `SimPool`: reading
through every view on a real pool is what those declarations promise.)
"""

from __future__ import annotations

import pytest

from maserve_prefect.clock.kernel import Kernel
from maserve_prefect.engines.sim.pool.sim_pool import Deployment, SimPool
from maserve_prefect.errors import ConfigError
from maserve_prefect.protocol.requests import Request
from maserve_prefect.protocol.state import Lifecycle

DEVICES = ["H100:0", "H100:1"]


def test_a_fresh_pool_reads_empty() -> None:
    pool = SimPool(Kernel(), DEVICES)
    assert pool.devices() == DEVICES
    assert [pool.slot(d).name for d in DEVICES] == DEVICES
    assert pool.slot("H100:1").gpu.memory_bytes > 0
    assert pool.replicas() == [] and pool.pool_replicas() == [] and pool.timelines() == {}
    for d in DEVICES:
        mem = pool.memory(d)
        assert (mem.used_bytes, mem.residents) == (0, ())
        assert mem.total_bytes == pool.slot(d).gpu.memory_bytes
        assert pool.memory_timeline(d) == [(0.0, 0)]
    assert pool.step_rows() == []
    rows = pool.device_time()
    assert [r.device for r in rows] == DEVICES and all(r.end_s == 0.0 for r in rows)


def test_reads_follow_a_load_a_served_request_and_an_unload() -> None:
    k = Kernel()
    pool = SimPool(k, DEVICES)
    ticket = pool.load(Deployment("qwen", "Qwen3-0.6B"), "H100:1")
    k.run()
    name, loaded_s = ticket.replica, k.now()
    rep = pool.replica(name)
    assert pool.status(name) is Lifecycle.READY and pool.deployment("qwen").model == "Qwen3-0.6B"
    assert pool.replicas() == [rep] and [p.name for p in pool.pool_replicas()] == [name]
    assert rep.lifecycle is Lifecycle.READY and rep.deployment == "qwen"
    used = pool.memory("H100:1").used_bytes
    assert used > 0 and pool.memory("H100:1").residents == (name,)
    assert pool.memory("H100:0").used_bytes == 0
    assert pool.memory_timeline("H100:1")[-1] == (pytest.approx(loaded_s), used)

    done = []
    rep.submit(Request("q1", "qwen", num_prompt_tokens=40, max_tokens=3)).on_done(done.append)
    k.run()
    assert done and done[0].num_output_tokens == 3
    rows = pool.step_rows()
    assert {r["request_id"] for r in rows} == {"q1"} and {r["replica"] for r in rows} == {name}
    assert sum(int(r["num_new_tokens"]) for r in rows) == 40 + 3 - 1  # prompt, then 2 decodes
    assert set(pool.timelines()) == {name}
    split = {r.device: r for r in pool.device_time()}
    busy = split["H100:1"]
    total = busy.generation_s + busy.idle_resident_s + busy.loading_s + busy.other_s
    assert busy.generation_s > 0 and total == pytest.approx(busy.end_s - busy.start_s)
    assert split["H100:0"].generation_s == 0.0

    pool.unload(name)
    k.run()
    assert pool.status(name) is Lifecycle.UNLOADED
    assert pool.replicas() == [] and [p.name for p in pool.pool_replicas()] == [name]
    assert rep.lifecycle is Lifecycle.UNLOADED and pool.memory("H100:1").used_bytes == 0
    assert pool.memory_timeline("H100:1")[-1][1] == 0


def test_reads_of_unknown_names_say_what_the_pool_has() -> None:
    pool = SimPool(Kernel(), DEVICES)
    with pytest.raises(ConfigError, match=r"no device 'A100:0' in this pool; have \['H100:0'"):
        pool.memory("A100:0")
    with pytest.raises(ConfigError, match="no deployment 'qwen'"):
        pool.deployment("qwen")
    with pytest.raises(ConfigError, match="no replica 'r9'"):
        pool.status("r9")
