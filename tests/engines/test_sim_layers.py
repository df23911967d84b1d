"""The simulator's layered hot-path classes: their instances stay small
(their doctests run in `test_engine_doctests`).

`KVCacheManager` is three layers (`kv_block_pool.BlockPool`, `kv_prefix_cache.PrefixCache`,
`kv_cache.KVCacheManager`) and `SimReplica` two (`replica_loop.ReplicaLoop`, `replica.SimReplica`),
each setting its own attributes. CPython shares (and fast-paths) an instance dict's keys only up
to 29 of them, so the layers together must stay under 30 on every instance, HEAR in use or not.
"""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from maserve_prefect.clock.kernel import Kernel
from maserve_prefect.engines.sim.cost.step_cost import DecodeAffine, ScheduledChunk, StepCost
from maserve_prefect.engines.sim.kv.block_pool import BlockPool
from maserve_prefect.engines.sim.kv.host_tier import HostTierConfig
from maserve_prefect.engines.sim.kv.manager import KVCacheManager
from maserve_prefect.engines.sim.kv.prefix_cache import PrefixCache
from maserve_prefect.engines.sim.replica import SimReplica
from maserve_prefect.engines.sim.step.loop import ReplicaLoop
from maserve_prefect.protocol.requests import Request

MAX_SHARED_KEYS = 29


class _Flat:
    """1 ms per step, whatever it computes."""

    def step_cost(self, chunks: Sequence[ScheduledChunk]) -> StepCost:
        return StepCost(0.001, 0.0, 0.0, 0.0)

    def decode_affine(self, num_seqs: int) -> DecodeAffine:
        return DecodeAffine(num_seqs, 0.001, 0.0, 0.0, 0.0)


def test_the_layers_stack_in_order() -> None:
    assert KVCacheManager.__mro__[1:4] == (PrefixCache, BlockPool, object)
    assert SimReplica.__mro__[1:3] == (ReplicaLoop, object)


@pytest.mark.parametrize("host_blocks", [None, 8])
def test_instances_stay_within_cpythons_shared_keys(host_blocks: int | None) -> None:
    host = (
        None
        if host_blocks is None
        else HostTierConfig(capacity_blocks=host_blocks, block_bytes=1 << 20, link_bytes_s=1e10)
    )
    k = Kernel()
    rep = SimReplica(k, _Flat(), num_gpu_blocks=16, host_tier=host)
    rep.hear_state()  # builds the HEAR side when no host tier did
    rep.submit(Request("a", "", num_prompt_tokens=40, max_tokens=4))
    k.run()
    assert rep.num_finished == 1
    assert len(vars(rep)) <= MAX_SHARED_KEYS, sorted(vars(rep))
    assert len(vars(rep.kv)) <= MAX_SHARED_KEYS, sorted(vars(rep.kv))
