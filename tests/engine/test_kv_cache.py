"""Paged KV cache with prefix caching (vLLM v1 BlockPool semantics)."""

from __future__ import annotations

from maserve_prefect.engine.protocol import Acceptance, Request, Ticket
from maserve_prefect.engine.sim.kv_cache import KVCacheManager
from maserve_prefect.engine.sim.request import SimRequest

_seq = iter(range(10_000))


def sreq(request: Request, bs: int = 4) -> SimRequest:
    t = Ticket(request.request_id, Acceptance.ACCEPTED)
    return SimRequest(request, seq=next(_seq), arrival_s=0.0, priority=0, block_size=bs, ticket=t)


def ids(rid: str, tokens: list[int], **kw: object) -> SimRequest:
    return sreq(Request(rid, "", prompt_token_ids=tuple(tokens), **kw))  # type: ignore[arg-type]


def test_allocate_free_reverse_order_and_usage() -> None:
    kv = KVCacheManager(num_blocks=8, block_size=4)
    a = ids("a", list(range(10)))
    assert kv.allocate_slots(a, 10) == [0, 1, 2]
    assert kv.usage == 3 / 8 and kv.num_free_blocks == 5
    kv.free(a)
    # freed tail first: block 2 is evicted before 1 before 0
    assert list(kv.free_queue) == [3, 4, 5, 6, 7, 2, 1, 0]
    kv.check_invariants()


def test_does_not_fit_is_a_value_and_changes_nothing() -> None:
    kv = KVCacheManager(num_blocks=2, block_size=4)
    a = ids("a", list(range(12)))
    assert kv.allocate_slots(a, 12) is None
    assert kv.num_free_blocks == 2 and kv.blocks_of(a) == []
    kv.check_invariants()


def test_prefix_hit_is_capped_below_num_tokens_and_counted() -> None:
    kv = KVCacheManager(num_blocks=8, block_size=4)
    a = ids("a", list(range(8)))
    kv.allocate_slots(a, 8)  # two full blocks, both hashed
    kv.free(a)
    b = ids("b", list(range(8)))  # identical 8-token prompt: at most 7 tokens may hit
    hits, num_hit = kv.get_computed_blocks(b)
    assert num_hit == 4 and hits == [0]
    c = ids("c", [*range(8), 99])
    hits, num_hit = kv.get_computed_blocks(c)
    assert num_hit == 8 and hits == [0, 1]
    assert (kv.num_queried_tokens, kv.num_hit_tokens) == (0, 0)  # counted on admission only


def test_touching_a_free_cached_block_takes_it_off_the_lru_queue() -> None:
    kv = KVCacheManager(num_blocks=4, block_size=4)
    a = ids("a", list(range(8)))
    kv.allocate_slots(a, 8)
    kv.free(a)
    b = ids("b", [*range(4), 50, 51, 52, 53, 54])
    hits, num_hit = kv.get_computed_blocks(b)
    assert hits == [0]
    new = kv.allocate_slots(b, 9 - num_hit, hits, num_hit)
    assert kv.blocks_of(b)[0] == 0 and 0 not in kv.free_queue
    # new blocks come from the LRU front (2, 3); a's hashed block 1 is still cached
    assert new == [2, 3] and 1 in kv.free_queue and kv.block_hash[1] is not None
    kv.check_invariants()


def test_allocation_evicts_the_hash_of_a_reused_free_block() -> None:
    kv = KVCacheManager(num_blocks=2, block_size=4)
    a = ids("a", list(range(8)))
    kv.allocate_slots(a, 8)
    kv.free(a)  # queue: [1, 0]
    b = ids("b", [9, 9, 9, 9, 9])
    kv.allocate_slots(b, 5)  # takes both blocks: a's hashes are gone
    kv.free(b)
    _, num_hit = kv.get_computed_blocks(ids("c", list(range(8))))
    assert num_hit == 0 and kv.cached.keys() == {kv.block_hash[b_] for b_ in kv.cached.values()}


def test_shared_blocks_are_reference_counted() -> None:
    kv = KVCacheManager(num_blocks=8, block_size=4)
    a = ids("a", list(range(9)))
    kv.allocate_slots(a, 9)
    b = ids("b", list(range(9)))
    hits, n = kv.get_computed_blocks(b)
    kv.allocate_slots(b, 9 - n, hits, n)
    assert kv.ref_cnt[0] == 2 and kv.ref_cnt[1] == 2
    kv.free(a)
    assert 0 not in kv.free_queue
    kv.free(b)
    assert kv.num_free_blocks == 8
    kv.check_invariants()


def test_cache_salt_isolates_reuse() -> None:
    kv = KVCacheManager(num_blocks=8, block_size=4)
    a = ids("a", list(range(9)), cache_salt="tenant-1")
    kv.allocate_slots(a, 9)
    assert kv.get_computed_blocks(ids("b", list(range(9)), cache_salt="tenant-2"))[1] == 0
    assert kv.get_computed_blocks(ids("c", list(range(9)), cache_salt="tenant-1"))[1] == 8


def test_prefix_block_hashes_map_onto_engine_blocks() -> None:
    kv = KVCacheManager(num_blocks=16, block_size=4)

    def hashed(rid: str, n: int, hashes: tuple[int, ...]) -> SimRequest:
        return sreq(
            Request(rid, "", num_prompt_tokens=n, prefix_block_hashes=hashes, prefix_block_size=8)
        )

    a = hashed("a", 20, (7, 9))  # 16 hashed tokens = engine blocks 0..3; block 4 is a's own
    kv.allocate_slots(a, 20)
    assert kv.get_computed_blocks(hashed("b", 20, (7, 11)))[1] == 8  # shares prefix block 7
    assert kv.get_computed_blocks(hashed("c", 30, (7, 9, 5)))[1] == 16  # tail of a is unique
    assert kv.get_computed_blocks(hashed("d", 20, (8, 9)))[1] == 0  # chained: 9 after 8 differs
    plain = sreq(Request("e", "", num_prompt_tokens=20))
    assert kv.get_computed_blocks(plain)[1] == 0  # no identity -> no reuse


def test_hashes_are_stable_across_processes() -> None:
    import subprocess
    import sys

    code = (
        "from maserve_prefect.engine.protocol import *;"
        "from maserve_prefect.engine.sim.request import SimRequest;"
        "r=Request('x','',prompt_token_ids=(1,2,3,4),cache_salt='s');"
        "print(SimRequest(r,0,0.0,0,4,Ticket('x',Acceptance.ACCEPTED)).block_hash(0))"
    )
    outs = {
        subprocess.run(
            [sys.executable, "-c", code], capture_output=True, text=True, check=True,
            env={"PYTHONHASHSEED": seed},
        ).stdout
        for seed in ("1", "2")
    }  # fmt: skip
    assert len(outs) == 1
