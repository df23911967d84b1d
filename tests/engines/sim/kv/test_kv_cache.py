"""Paged KV cache with prefix caching (vLLM v1 BlockPool semantics)."""

from __future__ import annotations

import random

from hypothesis import given, settings
from hypothesis import strategies as st
from kv_reference import ReferenceKV

from maserve_prefect.engines.sim.kv.hash_index import HashIndex
from maserve_prefect.engines.sim.kv.manager import KVCacheManager
from maserve_prefect.engines.sim.request import SimRequest
from maserve_prefect.protocol.outcomes import Acceptance, Ticket
from maserve_prefect.protocol.requests import Request

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
        "from maserve_prefect.protocol.engine import *;"
        "from maserve_prefect.engines.sim.request import SimRequest;"
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


# -- differential: the segment queue against the per-block reference --------------------------


@st.composite
def kv_programs(draw: st.DrawFn) -> tuple[int, int, list[tuple[str, int, int]]]:
    """A block size, a capacity and a list of ops `(kind, request index, amount)`."""
    bs = draw(st.sampled_from([1, 1, 2, 4]))
    num_blocks = draw(st.integers(1, 48))
    ops = draw(
        st.lists(
            st.tuples(
                st.sampled_from(["admit", "grow", "free"]), st.integers(0, 4), st.integers(1, 40)
            ),
            min_size=4,
            max_size=80,
        )
    )
    return bs, num_blocks, ops


def _canonical(kv: KVCacheManager | ReferenceKV) -> tuple[object, ...]:
    refs = [int(c) for c in kv.ref_cnt]
    tables = {seq: list(b) for seq, b in kv.req_blocks.items()}
    return list(kv.free_queue), dict(kv.cached), refs, tables, kv.num_free_blocks


@settings(max_examples=300, deadline=None)
@given(kv_programs(), st.sampled_from([None, 1, 3]), st.randoms(use_true_random=False))
def test_segment_queue_matches_the_per_block_lru(
    program: tuple[int, int, list[tuple[str, int, int]]],
    table_bits: int | None,
    rnd: random.Random,
) -> None:
    bs, num_blocks, ops = program
    fast, ref = KVCacheManager(num_blocks, bs), ReferenceKV(num_blocks, bs)
    fast.max_queue_entries = num_blocks + rnd.randint(0, 4)  # compact the queue often
    if table_bits is not None:  # a tiny hash table: most hashes collide and overflow
        fast._idx = HashIndex(num_blocks, table_bits)
        fast._idx._max_overflow = 3
    # prompts share prefixes (few distinct tokens) so hits, touches and duplicates all happen
    prompts = [
        (0,) * rnd.randint(0, 25) + tuple(rnd.choice([0, 1]) for _ in range(rnd.randint(1, 10)))
        for _ in range(8)
    ]
    live: dict[int, tuple[SimRequest, int]] = {}  # request index -> (request, tokens held)
    for kind, i, amount in ops:
        if kind == "admit" and i not in live:
            req = ids(f"r{i}", list(prompts[i]))
            probed = fast.probe_prefix(req)  # a router's read-only question: changes nothing
            hits, num_hit = fast.get_computed_blocks(req)
            assert (hits, num_hit) == ref.get_computed_blocks(req)
            assert probed == num_hit
            # a partial first chunk lets another request compute the same blocks (duplicates)
            total = max(min(len(prompts[i]), amount), num_hit + 1)
            got = fast.ensure_slots(req, total, hits)
            assert got == ref.ensure_slots(req, total, hits)
            if got is not None:
                live[i] = (req, total)
        elif kind == "grow" and i in live:
            req, held = live[i]
            got = fast.ensure_slots(req, held + amount % 13)
            assert got == ref.ensure_slots(req, held + amount % 13)
            if got is not None:
                live[i] = (req, held + amount % 13)
        elif kind == "free" and i in live:
            req, _ = live.pop(i)
            fast.free(req)
            ref.free(req)
        assert _canonical(fast) == _canonical(ref)
        fast.check_invariants()


def test_lookups_stay_exact_after_many_evictions() -> None:
    def one(rid: str, tokens: list[int]) -> SimRequest:
        return sreq(Request(rid, "", prompt_token_ids=tuple(tokens)), bs=1)

    kv, ref = KVCacheManager(num_blocks=4, block_size=1), ReferenceKV(num_blocks=4, block_size=1)
    for i in range(1500):  # each request evicts most of the previous one's hashes
        r = one(f"x{i}", [i, i + 1, i + 2])
        for m in (kv, ref):
            m.ensure_slots(r, 3, m.get_computed_blocks(r)[0])
            m.free(r)
    assert _canonical(kv) == _canonical(ref)
    assert kv.get_computed_blocks(one("y", [1499, 1500, 1501, 7]))[1] == 3
    # x1498's head block survived (freed tail first), its other blocks were taken
    assert kv.get_computed_blocks(one("z", [1498, 1499, 1500, 7]))[1] == 1
    kv.check_invariants()


def test_a_chunked_prefill_duplicating_cached_blocks_leaves_them_uncached() -> None:
    def one(rid: str, tokens: list[int]) -> SimRequest:
        return sreq(Request(rid, "", prompt_token_ids=tuple(tokens)), bs=1)

    kv, ref = KVCacheManager(num_blocks=64, block_size=1), ReferenceKV(64, 1)
    a, c = one("a", [0] * 20 + [1]), one("c", [0] * 20 + [2])
    for m in (kv, ref):
        m.ensure_slots(a, 3)  # a's first chunk: blocks 0..2
        hits, _ = m.get_computed_blocks(c)
        m.ensure_slots(c, 21, hits)  # c hits 0..2 and computes 3..20
        m.ensure_slots(a, 21)  # a's rest duplicates c's blocks 3..19: vLLM keeps c's
    assert _canonical(kv) == _canonical(ref)
    assert kv.cached[a.block_hash(10)] == kv.blocks_of(c)[10] != kv.blocks_of(a)[10]
    kv.check_invariants()


def test_a_kept_admission_lookup_goes_stale_when_another_request_caches_the_prefix() -> None:
    # a's admission lookup (all misses) is kept for its later chunks; c caching the same blocks
    # in between must make a's continuation look again and leave its duplicates uncached
    def one(rid: str, tokens: list[int]) -> SimRequest:
        return sreq(Request(rid, "", prompt_token_ids=tuple(tokens)), bs=1)

    kv, ref = KVCacheManager(num_blocks=64, block_size=1), ReferenceKV(64, 1)
    a, c = one("a", [0] * 20 + [1]), one("c", [0] * 20 + [2])
    for m in (kv, ref):
        m.ensure_slots(a, 6, m.get_computed_blocks(a)[0])  # a's first chunk: blocks 0..5
        hits, _ = m.get_computed_blocks(c)
        m.ensure_slots(c, 21, hits)  # c hits 0..5 and computes 6..20
        m.ensure_slots(a, 15)  # a's next chunk duplicates c's blocks 6..14
    assert _canonical(kv) == _canonical(ref)
    assert kv.cached[a.block_hash(10)] == kv.blocks_of(c)[10] != kv.blocks_of(a)[10]
    kv.check_invariants()
