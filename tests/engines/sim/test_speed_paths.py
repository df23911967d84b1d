"""The simulator's speed paths give the results of the plain ones (issue 3).

Block tables as arrays, block hashes as `splitmix64(key) + j`, the index's prefix-key filter, the
`BlockRange` form of `any_cached`, the shared step model with its one-chunk cache and the inlined
kernel loop: each is checked against the per-block reference or the uncached computation.
"""

from __future__ import annotations

import random

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st
from kv_reference import ReferenceKV

from maserve_prefect.clock.kernel import Kernel
from maserve_prefect.engines.sim.cost.step_cost import ScheduledChunk
from maserve_prefect.engines.sim.cost.step_time import make_step_model
from maserve_prefect.engines.sim.kv.block_table import BlockTable
from maserve_prefect.engines.sim.kv.manager import KVCacheManager
from maserve_prefect.engines.sim.kv.prefix_cache import BlockRange
from maserve_prefect.engines.sim.request import SimRequest
from maserve_prefect.protocol.outcomes import Acceptance, Ticket
from maserve_prefect.protocol.requests import Request

_seq = iter(range(1_000_000))


def prefix_req(
    rid: str, hash_ids: tuple[int, ...], num_tokens: int, bs: int, pbs: int
) -> SimRequest:
    """A request whose prompt is given as prefix-block hash ids (`pbs` tokens each)."""
    req = Request(
        rid,
        "",
        num_prompt_tokens=num_tokens,
        prefix_block_hashes=hash_ids,
        prefix_block_size=pbs,
        max_tokens=4,
    )
    t = Ticket(rid, Acceptance.ACCEPTED)
    return SimRequest(req, seq=next(_seq), arrival_s=0.0, priority=0, block_size=bs, ticket=t)


# -- block tables -------------------------------------------------------------------------------


@given(st.lists(st.tuples(st.sampled_from(["extend", "append", "truncate"]), st.integers(0, 40))))
def test_block_table_behaves_like_a_list(ops: list[tuple[str, int]]) -> None:
    table, ref = BlockTable(capacity=3), list[int]()
    for kind, n in ops:
        if kind == "extend":
            new = list(range(len(ref), len(ref) + n))
            table.extend(np.array(new, dtype=np.int64))
            ref.extend(new)
        elif kind == "append":
            table.append(n)
            ref.append(n)
        else:
            assert table.truncate(n).tolist() == ref[n:]
            del ref[n:]
        assert len(table) == len(ref) and table.tolist() == ref == list(table)


# -- block hashes -------------------------------------------------------------------------------


def test_blocks_of_one_prefix_block_get_consecutive_hashes() -> None:
    bs, pbs = 4, 16  # four engine blocks per prefix block
    a = prefix_req("a", (7, 8, 9), 48, bs, pbs)
    b = prefix_req("b", (7, 8, 5), 48, bs, pbs)
    ha, hb = a.block_hash_array(12).tolist(), b.block_hash_array(12).tolist()
    for j in range(12):
        if j % 4:  # same prefix block as j - 1: the next hash
            assert ha[j] == (ha[j - 1] + 1) % 2**64
    assert ha[:8] == hb[:8] and not set(ha[8:]) & set(hb[8:])  # shared up to hash id 8
    assert len(set(ha)) == 12


def test_hashes_do_not_depend_on_how_they_were_asked_for() -> None:
    bs, pbs = 4, 16
    whole = prefix_req("w", (1, 2, 3), 44, bs, pbs)
    whole.num_output_tokens = 30  # past the prompt: the request's own (unique) blocks
    parts = prefix_req("p", (1, 2, 3), 44, bs, pbs)
    parts.seq = whole.seq  # unique blocks are keyed by the admission sequence
    parts.num_output_tokens = 30
    expected = whole.block_hash_array(18).tolist()
    for n in (1, 2, 3, 9, 10, 11, 12, 13, 17, 18):  # numpy ranges and the per-block path
        parts.block_hash_array(n)
    assert parts.block_hash_array(18).tolist() == expected


# -- the prefix-key filter and `any_cached` ---------------------------------------------------


@settings(max_examples=150, deadline=None)
@given(st.randoms(use_true_random=False), st.sampled_from([(2, 8), (4, 8), (4, 16), (2, 6)]))
def test_prefix_hash_prompts_match_the_per_block_reference(
    rnd: random.Random, sizes: tuple[int, int]
) -> None:
    """Lookups, allocations, hashing and frees of prefix-hash prompts (shared prefixes,
    preemption-style re-admissions) agree with the reference, which looks every hash up."""
    bs, pbs = sizes
    num_blocks = rnd.randint(4, 60)
    fast, ref = KVCacheManager(num_blocks, bs), ReferenceKV(num_blocks, bs)
    roots = [tuple(rnd.randint(0, 3) for _ in range(rnd.randint(1, 6))) for _ in range(4)]
    live: dict[int, tuple[SimRequest, int]] = {}
    reqs: dict[int, SimRequest] = {}
    for _ in range(rnd.randint(5, 60)):
        i = rnd.randint(0, 5)
        if i in live and rnd.random() < 0.4:
            req, held = live.pop(i)
            fast.free(req)
            ref.free(req)
            if rnd.random() < 0.5:  # preempted: it recomputes and may hit its own blocks
                req.num_preemptions += 1
                reqs[i] = req
        elif i in live:
            req, held = live[i]
            total = held + rnd.randint(1, 3 * bs)
            got = fast.ensure_slots(req, total)
            assert got == ref.ensure_slots(req, total)
            if got is not None:
                live[i] = (req, total)
        else:
            old = reqs.pop(i, None)
            if old is not None:
                req = old
            else:
                ids = rnd.choice(roots) + tuple(rnd.randint(0, 3) for _ in range(rnd.randint(0, 3)))
                # the last prefix block may be partial; a tail past the hashes too
                tokens = rnd.randint((len(ids) - 1) * pbs + 1, len(ids) * pbs + 2 * bs)
                req = prefix_req(f"r{i}", ids, tokens, bs, pbs)
            hits, num_hit = fast.get_computed_blocks(req)
            assert (hits, num_hit) == ref.get_computed_blocks(req)
            total = max(min(req.num_tokens, num_hit + rnd.randint(1, 4 * bs)), num_hit + 1)
            got = fast.ensure_slots(req, total, hits)
            assert got == ref.ensure_slots(req, total, hits)
            if got is not None:
                live[i] = (req, total)
        assert dict(fast.cached) == dict(ref.cached)
        assert list(fast.free_queue) == list(ref.free_queue)
        fast.check_invariants()
        for req, held in live.values():  # the range form answers as a plain lookup does
            start = fast.num_cached_blocks.get(req.seq, 0)  # (for blocks `req` did not cache)
            end = min(req.num_tokens // bs, held // bs + 3)
            if end > start:
                plain = fast.any_cached(req.block_hash_array(end)[start:end])
                assert fast.any_cached(BlockRange(req, start, end)) == plain


def test_hashes_of_unknown_origin_turn_the_filter_off() -> None:
    kv = KVCacheManager(num_blocks=16, block_size=4)
    req = prefix_req("a", (5, 6), 32, 4, 16)
    hashes = req.block_hash_array(7)[:7].tolist()
    assert kv.get_computed_blocks(req) == ([], 0)
    kv.load_blocks(hashes[:3])  # a CachePrepare: cached without any request's prefix keys
    hits, num_hit = kv.get_computed_blocks(req)
    assert len(hits) == 3 and num_hit == 12


# -- step costs and the kernel ----------------------------------------------------------------


def test_one_chunk_cost_cache_returns_the_computed_cost() -> None:
    model = make_step_model("Qwen3-8B", "H100")
    assert make_step_model("Qwen3-8B", "H100") is model  # replicas share one model
    for chunk in (ScheduledChunk(8192, 0), ScheduledChunk(100, 300), ScheduledChunk(1, 5000)):
        first = model.step_cost([chunk])
        assert model.step_cost([chunk]) is first
        assert first == model._step_cost([chunk])


def test_kernel_run_skips_cancelled_events_and_stops_before_until() -> None:
    k = Kernel()
    log: list[str] = []
    k.call_at(1.0, lambda: log.append("a"))
    k.call_at(2.0, lambda: log.append("cancelled")).cancel()
    k.call_at(3.0, lambda: log.append("at until"))
    k.call_at(float("inf"), lambda: log.append("never"))
    k.run(until=3.0)
    assert log == ["a"] and k.now() == 3.0
    k.run()
    assert log == ["a", "at until"] and k.peek() == float("inf")
