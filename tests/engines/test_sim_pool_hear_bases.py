"""The read and judge halves of `SimPool` and `SimHear`: declarations hold.

`SimPool` (`pool.py`) reads through its base `PoolViews` (`pool_views.py`) and `SimHear`
(`hear_side.py`) judges controls through its base `HearResolver` (`hear_resolve.py`). The bases
declare the attributes they read and the subclass constructors set them; mypy trusts the
declarations, so these tests check that every declared attribute is really set.
"""

from __future__ import annotations

import pytest
from sim_factories import LinearCost

from maserve_prefect.clock.kernel import Kernel
from maserve_prefect.engines.sim.hear.resolve import HearResolver
from maserve_prefect.engines.sim.hear.side import SimHear
from maserve_prefect.engines.sim.kv.host_tier import HostTierConfig
from maserve_prefect.engines.sim.pool.sim_pool import SimPool
from maserve_prefect.engines.sim.pool.views import PoolViews
from maserve_prefect.engines.sim.replica import SimReplica


def test_the_halves_stack_in_order() -> None:
    assert SimHear.__mro__[1:] == (HearResolver, object)
    assert SimPool.__mro__[1:] == (PoolViews, object)


@pytest.mark.parametrize("host_blocks", [None, 8])
def test_sim_hear_sets_what_its_resolver_reads(host_blocks: int | None) -> None:
    host = (
        None
        if host_blocks is None
        else HostTierConfig(capacity_blocks=host_blocks, block_bytes=1 << 20, link_bytes_s=1e10)
    )
    rep = SimReplica(Kernel(), LinearCost(), num_gpu_blocks=16, host_tier=host)
    declared = HearResolver.__annotations__
    assert set(declared) == {"rep", "kv", "host", "retention", "capabilities"}
    missing = [a for a in declared if a not in vars(rep.hear)]
    assert missing == []
    assert rep.hear.rep is rep and rep.hear.kv is rep.kv
    assert (rep.hear.host is None) == (host is None)


def test_sim_pool_sets_what_its_views_read() -> None:
    pool = SimPool(Kernel(), ["H100:0", "H100:1"])
    declared = PoolViews.__annotations__
    assert set(declared) == {"clock", "_slots", "_deployments", "_replicas", "_mem"}
    missing = [a for a in declared if a not in vars(pool)]
    assert missing == []
    assert pool.devices() == ["H100:0", "H100:1"]
    assert [m.used_bytes for m in map(pool.memory, pool.devices())] == [0, 0]
