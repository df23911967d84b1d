"""The KV cache on prompts given as prefix-block hashes (Mooncake-style sharing units) against
the per-block reference: deferred hash-index entries (`HashIndex.add_deferred`), lookups kept in
short form (`_find_head`), freed blocks queued as segments, the one-segment fast path for taking
free blocks, decode runs' appended blocks hashed without a check (`hash_full_blocks`) and
truncated block tables (`compress`) must leave hit counts, eviction order and capacity exactly
as vLLM's block-by-block accounting has them."""

from __future__ import annotations

import itertools
import random

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st
from kv_reference import ReferenceKV

from maserve_prefect.engines.sim.kv.hash_index import HashIndex
from maserve_prefect.engines.sim.kv.manager import KVCacheManager
from maserve_prefect.engines.sim.kv.prefix_cache import BlockRange, _found_span
from maserve_prefect.engines.sim.request import SimRequest
from maserve_prefect.protocol.outcomes import Acceptance, Ticket
from maserve_prefect.protocol.requests import Request

_seq = iter(range(1_000_000))


def unit_request(rid: str, units: tuple[int, ...], tail: int, pbs: int, bs: int) -> SimRequest:
    """A prompt of `len(units)` prefix blocks of `pbs` tokens (hash ids `units`) plus `tail`
    more tokens, served with `bs`-token KV blocks."""
    r = Request(
        rid,
        "",
        num_prompt_tokens=len(units) * pbs + tail,
        prefix_block_hashes=units,
        prefix_block_size=pbs,
        max_tokens=64,
    )
    t = Ticket(rid, Acceptance.ACCEPTED)
    return SimRequest(r, seq=next(_seq), arrival_s=0.0, priority=0, block_size=bs, ticket=t)


def _canonical(kv: KVCacheManager | ReferenceKV) -> tuple[object, ...]:
    refs = [int(c) for c in kv.ref_cnt]
    tables = {seq: list(b) for seq, b in kv.req_blocks.items()}
    counters = (kv.num_queried_tokens, kv.num_hit_tokens)
    return list(kv.free_queue), dict(kv.cached), refs, tables, kv.num_free_blocks, counters


@st.composite
def unit_programs(draw: st.DrawFn) -> tuple[int, int, int, int, list[tuple[str, int, int]]]:
    """(block size, prefix block size, capacity, seed, ops): ops are (kind, request, amount)."""
    bs = draw(st.sampled_from([1, 2, 4]))
    pbs = bs * draw(st.sampled_from([1, 2, 4, 8]))
    num_blocks = draw(st.integers(8, 160))
    ops = draw(
        st.lists(
            st.tuples(
                st.sampled_from(
                    [
                        *("admit", "admit", "chunk", "grow", "free", "preempt", "probe"),
                        *("decode", "any", "compress"),
                    ]
                ),
                st.integers(0, 7),
                st.integers(1, 400),
            ),
            min_size=4,
            max_size=60,
        )
    )
    return bs, pbs, num_blocks, draw(st.integers(0, 2**32 - 1)), ops


@settings(max_examples=250, deadline=None)
@given(unit_programs(), st.sampled_from([None, 2]), st.sampled_from([None, 1, 40]))
def test_unit_prompts_match_the_per_block_reference(
    program: tuple[int, int, int, int, list[tuple[str, int, int]]],
    table_bits: int | None,
    max_pending: int | None,
) -> None:
    bs, pbs, num_blocks, seed, ops = program
    rnd = random.Random(seed)
    fast, ref = KVCacheManager(num_blocks, bs), ReferenceKV(num_blocks, bs)
    if table_bits is not None:  # a tiny table: entries collide and overflow
        fast._idx = HashIndex(num_blocks, table_bits)
        fast._idx._max_overflow = 3
    if max_pending is not None:  # compact the deferred entries often
        fast._idx._max_pending_pairs = max_pending
    # a small tree of hash ids: prompts share leading units, then diverge
    prompts = []
    for _ in range(8):
        n = rnd.randint(1, 12)
        units = tuple(rnd.choice([1, 2]) if i < 3 else rnd.randint(1, 4) for i in range(n))
        prompts.append((units, rnd.randint(0, pbs - 1)))
    reqs: dict[int, SimRequest] = {}
    held: dict[int, int] = {}  # request index -> tokens it holds blocks for
    compressed: set[int] = set()  # held to their blocks (`compress`): they grow no more

    def admit(i: int, amount: int) -> None:
        req = reqs.get(i)
        if req is None:
            units, tail = prompts[i]
            req = reqs[i] = unit_request(f"r{i}-{next(_seq)}", units, tail, pbs, bs)
        probed = fast.probe_prefix(req)
        hits, num_hit = fast.get_computed_blocks(req)
        assert (hits, num_hit) == ref.get_computed_blocks(req)
        if not req.num_preemptions:  # a router's probe is about requests not sent yet
            assert probed == num_hit
        total = max(min(req.num_tokens, num_hit + amount), num_hit + 1)
        got = fast.ensure_slots(req, total, hits)
        assert got == ref.ensure_slots(req, total, hits)
        if got is not None:
            fast.record_lookup(req.num_tokens, num_hit)
            ref.record_lookup(req.num_tokens, num_hit)
            held[i] = total

    for kind, i, amount in ops:
        if kind == "admit" and i not in held:
            admit(i, amount)
        elif kind in ("chunk", "grow") and i in held and i not in compressed:
            req = reqs[i]
            step = amount if kind == "chunk" else amount % 5 + 1
            total = held[i] + step
            if kind == "grow" and held[i] >= req.num_tokens:
                req.num_output_tokens += step  # decode: outputs join the sequence
            total = min(total, req.num_tokens)
            if total > held[i]:
                got = fast.ensure_slots(req, total)
                assert got == ref.ensure_slots(req, total)
                if got is not None:
                    held[i] = total
        elif kind == "decode" and i in held and i not in compressed:
            # a fast-forwarded decode run (`allocate_run`): its block crossings taken in one
            # pop, then the filled blocks hashed, vs stepping's allocation in the reference
            req = reqs[i]
            if held[i] == req.num_tokens and not req.num_preemptions:
                step = amount % 40 + 1
                total = held[i] + step
                need = -(-total // bs) - len(fast.req_blocks[req.seq])
                if need <= fast.num_free_blocks:
                    req.num_output_tokens += step
                    fast.append_blocks([req] * need)
                    fast.hash_full_blocks(req, total)
                    assert ref.ensure_slots(req, total) is not None
                    held[i] = total
        elif kind == "any" and i in held and i not in compressed:
            # a prefill run's question about the blocks it will hash (`plan_prefill_run`)
            req = reqs[i]
            first = fast.num_cached_blocks.get(req.seq, 0)
            last = min(first + amount % 9 + 1, req.num_tokens // bs)
            if last > first:
                hashes = req.block_hashes(last)[first:last]
                want = any(h in ref.cached for h in hashes)
                assert fast.any_cached(BlockRange(req, first, last)) == want
        elif kind == "compress" and i in held and i not in compressed:
            req = reqs[i]
            keep = amount % (len(fast.req_blocks[req.seq]) + 1)
            assert fast.compress(req, keep) == ref.compress(req, keep)
            compressed.add(i)
        elif kind in ("free", "preempt") and i in held:
            req = reqs[i]
            fast.free(req)
            ref.free(req)
            del held[i]
            compressed.discard(i)
            if kind == "preempt":  # recompute: re-admitted later with its own old hashes
                req.num_preemptions += 1
            else:
                del reqs[i]
        elif kind == "probe" and i not in held:
            units, tail = prompts[i]
            probe = unit_request("probe", units, tail, pbs, bs)
            assert fast.probe_prefix(probe) == ref.get_computed_blocks(probe)[1]
        assert _canonical(fast) == _canonical(ref)
    # at the end only: its index check enters every deferred entry (a full flush), which
    # after each op would hide a lookup that failed to enter the entries it needs
    fast.check_invariants()


def test_a_unit_nobody_looks_up_again_never_enters_the_hash_table() -> None:
    """A prompt's hashes wait outside the hash table until a lookup walks their prefix key:
    a replica that only ever sees distinct prompts makes no table entries."""
    kv = KVCacheManager(num_blocks=8192, block_size=16)
    for i in range(20):
        req = unit_request(f"u{i}", tuple(range(100 * i, 100 * i + 8)), 0, 512, 16)
        hits, num_hit = kv.lookup_prefix(req)
        assert num_hit == 0
        assert kv.ensure(req, req.num_tokens, hits) is not None
        kv.free(req)
    assert not kv._idx.entered()
    # a prompt sharing u3's first 5 units hits them: the lookup entered what it needed
    again = unit_request("again", (*range(300, 305), 7, 7, 7), 0, 512, 16)
    assert kv.lookup_prefix(again)[1] == 5 * 512
    assert 0 < len(kv._idx.entered()) <= 8 * 32
    kv.check_invariants()


@settings(max_examples=150, deadline=None)
@given(st.randoms(use_true_random=False))
def test_compacting_deferred_entries_keeps_exactly_the_live_pairs(rnd: random.Random) -> None:
    """`HashIndex._compact` checks every deferred batch at once: afterwards a flush must enter
    exactly the (block, hash) pairs still cached, in any mix of dead, live and partly live
    batches (empty ones included), and keep each key's batches findable by `flush_keys`."""
    num_blocks = 64
    idx = HashIndex(num_blocks)
    idx._max_pending_pairs = 1 << 30  # compaction only when the test asks
    next_hash = itertools.count(1000)
    of_key: dict[int | None, set[int]] = {}  # hashes deferred under each key
    for _ in range(rnd.randint(1, 12)):  # batches of distinct blocks (a pool never repeats one)
        free = [b for b in range(num_blocks) if not idx.hashed[b]]
        blocks = np.array(rnd.sample(free, rnd.randint(0, min(6, len(free)))), dtype=np.int64)
        hashes = np.array([next(next_hash) for _ in blocks], dtype=np.uint64)
        key = rnd.choice([None, 1, 2, 3])
        idx.add_deferred(blocks, hashes, key)
        of_key.setdefault(key, set()).update(hashes.tolist())
        for b in rnd.sample(range(num_blocks), rnd.randint(0, 8)):  # taken: no longer cached
            idx.evict_one(b)
    live = {int(idx.hash_val[b]) for b in range(num_blocks) if idx.hashed[b]}
    idx._compact()
    assert idx._num_pending_pairs == len(live)
    want: set[int] = set()
    for key in (1, 2, 3):  # a lookup walking a key enters that key's live pairs, no others
        idx.flush_keys([key])
        want |= of_key.get(key, set()) & live
        assert idx.entered() == want
    idx.flush()
    assert idx.entered() == live


def test_a_lookup_answer_is_kept_through_its_last_found_block() -> None:
    """`_found_span`: the leading hit and the short form's length (every entry past it is -1,
    so the admission's duplicate check looks at nothing past it)."""
    cases = {
        (): (0, 0),
        (4, 5, 6): (3, 3),
        (-1, -1): (0, 0),
        (4, -1, 7, -1, -1): (1, 3),
        (-1, -1, 9): (0, 3),
        (3, 4, -1): (2, 2),
    }
    for found, span in cases.items():
        assert _found_span(np.array(found, dtype=np.intp)) == span, found


def test_a_preempted_request_finds_its_own_blocks_without_entering_the_others() -> None:
    """A re-admitted (preempted) request may hit any of its blocks, its unique ones too: the
    lookup enters the deferred entries of its prefix keys and of its own blocks (`_own_key`),
    and those only; every other request's stay deferred (no full flush)."""
    fast, ref = KVCacheManager(num_blocks=512, block_size=16), ReferenceKV(512, 16)
    a = unit_request("a", (1, 2, 3), 100, 512, 16)  # 3 units + a 100-token tail
    other = unit_request("other", (7, 8), 300, 512, 16)
    for kv in (fast, ref):
        for req in (a, other):
            hits, _ = kv.get_computed_blocks(req)
            assert kv.ensure_slots(req, req.num_tokens, hits) is not None
    # decode runs fill 40 blocks past the prompt (deferred entries under each one's own key)
    for req in (a, other):
        req.num_output_tokens += 640
        need = -(-req.num_tokens // 16) - len(fast.req_blocks[req.seq])
        fast.append_blocks([req] * need)
        fast.hash_full_blocks(req, req.num_tokens)
        assert ref.ensure_slots(req, req.num_tokens) is not None
    fast.free(a)
    ref.free(a)
    a.num_preemptions += 1  # recompute: its prompt and outputs are all looked up again
    assert fast.get_computed_blocks(a) == ref.get_computed_blocks(a)
    assert fast.get_computed_blocks(a)[1] == (a.num_tokens - 1) // 16 * 16  # every full block
    own = set(other.block_hashes(other.num_tokens // 16)[other.num_shareable_blocks :])
    assert fast._idx.num_pending and not own & fast._idx.entered()
    assert _canonical(fast) == _canonical(ref)
    fast.check_invariants()
