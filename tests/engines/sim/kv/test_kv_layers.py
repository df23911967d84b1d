"""The KV cache's three layers each do their job, seen through `KVCacheManager`'s public API:
the block pool (LRU free queue, requirement pins that take a free block out of the room), the
prefix cache (full blocks hashed and found again; nothing at all when caching is off), and the
manager (a request's block table, freed tail first).

(Replaces checks of the class stack's `__mro__` and of instance-dict sizes: the layering is only
worth having if each layer's behaviour reaches the user of the whole; the dict-size limit was a
speed concern, which `benchmarks/sim_speed.py` measures.)
"""

from __future__ import annotations

import itertools

from sim_factories import make_sim_request

from maserve_prefect.engines.sim.kv.manager import KVCacheManager
from maserve_prefect.engines.sim.kv.retention import HARD
from maserve_prefect.engines.sim.request import SimRequest

BLOCK = 4
_seq = itertools.count()


def ids(rid: str, tokens: range) -> SimRequest:
    return make_sim_request(rid, token_ids=tokens, seq=next(_seq), block_size=BLOCK)


def test_manager_tables_pool_queue_and_prefix_cache_agree_on_one_request() -> None:
    kv = KVCacheManager(num_blocks=4, block_size=BLOCK)
    a = ids("a", range(9))  # two full blocks and one token
    assert kv.allocate_slots(a, 9) == [0, 1, 2] and kv.blocks_of(a) == [0, 1, 2]
    assert (kv.num_free_blocks, kv.usage, kv.free_queue) == (1, 0.75, [3])
    assert set(kv.block_hash) == {0, 1}  # only full blocks are hashed
    kv.free(a)
    assert kv.blocks_of(a) == [] and kv.free_queue == [3, 2, 1, 0]  # tail first
    assert set(kv.cached.values()) == {0, 1}  # freed, still cached until evicted
    assert kv.get_computed_blocks(ids("again", range(9))) == ([0, 1], 8)
    kv.check_invariants()


def test_a_requirement_pin_keeps_its_free_block_out_of_the_room() -> None:
    kv = KVCacheManager(num_blocks=4, block_size=BLOCK)
    a = ids("a", range(9))
    kv.allocate_slots(a, 9)
    kv.free(a)
    kv.set_pin(1, HARD)
    assert (kv.num_free_blocks, kv.num_hard_pinned_free, kv.usage) == (3, 1, 0.25)
    b = ids("b", range(100, 112))  # three blocks: every free block but the pinned one
    assert kv.allocate_slots(b, 12) == [3, 2, 0]
    assert kv.free_queue == [1] and kv.block_of(kv.block_hash[1]) == 1
    assert kv.allocate_slots(ids("c", range(200, 204)), 4) is None  # pinned: not allocatable
    kv.check_invariants()


def test_without_prefix_caching_nothing_is_hashed_or_found() -> None:
    kv = KVCacheManager(num_blocks=4, block_size=BLOCK, enable_prefix_caching=False)
    a = ids("a", range(9))
    kv.allocate_slots(a, 9)
    kv.free(a)
    assert kv.cached == {} and kv.get_computed_blocks(ids("again", range(9))) == ([], 0)
    kv.check_invariants()
