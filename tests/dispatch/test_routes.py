"""Routes: least-outstanding, prefix (longest cached prefix within a load bound) and session."""

from __future__ import annotations

import pytest
from dispatch_factories import make_plain_snapshot, make_sim_replicas, make_unit, make_view

from maserve_prefect.clock.kernel import Kernel
from maserve_prefect.dispatch.dispatcher import Dispatcher
from maserve_prefect.dispatch.kv_index import EventPrefixProbe, KVEventIndex
from maserve_prefect.dispatch.plans import get_plan, get_route, plan_names
from maserve_prefect.dispatch.routes import ROUTES, PrefixPlan, SessionPlan
from maserve_prefect.dispatch.snapshot import Snapshot, Unit
from maserve_prefect.engines.openai.kv_decode import AllBlocksCleared, BlockRemoved, BlockStored
from maserve_prefect.errors import ConfigError
from maserve_prefect.protocol.requests import Request


def _with_cache(snap: Snapshot, cached: dict[str, dict[str, int]]) -> Snapshot:
    return Snapshot(snap.now_s, snap.ready, snap.near_ready, snap.replicas, cached_tokens=cached)


def _placed(plan: PrefixPlan | SessionPlan, snap: Snapshot) -> list[tuple[str, str]]:
    return [(s.unit_id, s.replica) for s in plan.plan(snap).submits]


def test_every_route_is_a_registered_plan() -> None:
    assert set(ROUTES) <= set(plan_names())
    assert [get_route(r).name for r in ROUTES] == list(ROUTES)
    with pytest.raises(ConfigError, match="unknown route 'nearest'; routes: least-outstanding"):
        get_route("nearest")
    with pytest.raises(ConfigError, match="load_bound must be an integer >= 0"):
        get_plan("prefix", load_bound=-1)


def test_prefix_goes_to_the_replica_holding_the_longest_prefix() -> None:
    views = [make_view("a", 0), make_view("b", 2), make_view("c", 1)]
    snap = make_plain_snapshot([make_unit("u", num_prompt_tokens=4000)], views)
    snap = _with_cache(snap, {"u": {"b": 2048, "c": 1024}})
    assert _placed(PrefixPlan(load_bound=2), snap) == [("u", "b")]


def test_prefix_falls_back_to_least_loaded_past_the_load_bound() -> None:
    views = [make_view("a", 0), make_view("b", 3)]
    snap = _with_cache(make_plain_snapshot([make_unit("u")], views), {"u": {"b": 2048}})
    assert _placed(PrefixPlan(load_bound=3), snap) == [("u", "b")]  # 3 ahead: at the bound
    assert _placed(PrefixPlan(load_bound=2), snap) == [("u", "a")]  # past it


def test_prefix_without_any_cached_prefix_is_least_loaded_and_counts_its_own_submits() -> None:
    views = [make_view("b", 0), make_view("a", 0)]
    units = [make_unit("u1", ready_s=0.0), make_unit("u2", ready_s=1.0)]
    assert _placed(PrefixPlan(), make_plain_snapshot(units, views)) == [("u1", "a"), ("u2", "b")]


def test_prefix_ties_on_cached_tokens_go_to_the_less_loaded_then_by_name() -> None:
    views = [make_view("c", 1), make_view("b", 1), make_view("a", 2)]
    snap = _with_cache(
        make_plain_snapshot([make_unit("u")], views), {"u": dict.fromkeys("abc", 512)}
    )
    assert _placed(PrefixPlan(), snap) == [("u", "b")]


def test_prefix_skips_a_replica_at_its_cap() -> None:
    views = [make_view("a", 0), make_view("b", 1, max_outstanding=1)]
    snap = _with_cache(make_plain_snapshot([make_unit("u")], views), {"u": {"b": 4096}})
    assert _placed(PrefixPlan(), snap) == [("u", "a")]


def test_session_is_sticky_within_the_bound() -> None:
    def unit(uid: str, session: str, t: float) -> Unit:
        return Unit(uid, uid, "m", 10, 1, ready_s=t, session_id=session)

    views = [make_view("a", 0), make_view("b", 0)]
    units = [unit("s1-0", "s1", 0.0), unit("s2-0", "s2", 1.0), unit("s1-1", "s1", 2.0)]
    snap = make_plain_snapshot(units, views)
    # s1 starts on a, s2 on b (least-loaded), s1's next turn follows s1 home to a
    assert _placed(SessionPlan(), snap) == [("s1-0", "a"), ("s2-0", "b"), ("s1-1", "a")]
    homes = Snapshot(0.0, (unit("s1-2", "s1", 0.0),), (), (make_view("a", 5), make_view("b", 0)),
                     session_homes={"s1": "a"})  # fmt: skip
    assert _placed(SessionPlan(load_bound=5), homes) == [("s1-2", "a")]
    assert _placed(SessionPlan(load_bound=4), homes) == [("s1-2", "b")]


def _prefixed(rid: str, hashes: tuple[int, ...], n: int) -> Request:
    return Request(rid, "small", num_prompt_tokens=n, max_tokens=2,
                   prefix_block_hashes=hashes, prefix_block_size=512)  # fmt: skip


def test_dispatcher_routes_a_request_sharing_a_cached_prefix_to_that_replica() -> None:
    k = Kernel()
    r0, r1 = make_sim_replicas(k, ["r0", "r1"])
    r1.submit(_prefixed("warm", (1, 2, 3), 1536))  # r1 caches the prefix (1, 2, 3)
    k.run()
    assert r0.cached_prefix_tokens(_prefixed("x", (1, 2, 3, 4), 2000)) == 0
    assert r1.cached_prefix_tokens(_prefixed("x", (1, 2, 3, 4), 2000)) == 1536
    assert r1.cached_prefix_tokens(_prefixed("y", (1, 2, 9), 1536)) == 1024
    d = Dispatcher(lambda: [r0, r1], k.now, "prefix")
    where: dict[str, str] = {}
    for rid, hashes in (("share", (1, 2, 3, 4)), ("other", (7, 8, 9, 10))):
        req = _prefixed(rid, hashes, 2000)
        unit = Unit(rid, rid, "small", 2000, 2, ready_s=k.now())
        d.on_ready(unit, req, on_done=lambda o: None,
                   on_submitted=lambda now, name, rid=rid: where.__setitem__(rid, name))  # fmt: skip
    k.run()
    # "share" goes to r1 (its prefix is cached there) though r0 is as idle and first by name;
    # "other" shares nothing anywhere: least-loaded, and r1 now has "share" outstanding
    assert where == {"share": "r1", "other": "r0"}


def test_probe_answers_what_the_admission_then_hits() -> None:
    k = Kernel()
    (r,) = make_sim_replicas(k, ["r"])
    r.submit(_prefixed("warm", (1, 2, 3), 1500))
    k.run()
    for i, (hashes, n) in enumerate(
        (((1, 2, 3), 1536), ((1, 2), 700), ((1, 5), 1024), ((4,), 100))
    ):
        req = _prefixed(f"q{i}", hashes, n)
        probed = r.cached_prefix_tokens(req)
        ticket = r.submit(req)
        k.run()
        assert ticket.outcome is not None and ticket.outcome.num_cached_tokens == probed


def test_prefix_route_places_real_engine_requests_from_their_kv_events() -> None:
    """The same plan over KV-event indexes (what a vLLM endpoint publishes): a token-id prompt
    goes where its leading blocks were stored, until they are removed."""
    k = Kernel()
    r0, r1 = make_sim_replicas(k, ["r0", "r1"])
    idx = {"r0": KVEventIndex(), "r1": KVEventIndex()}
    prompt = tuple(range(100, 164))  # 4 blocks of 16
    idx["r1"].apply(BlockStored((11, 12, 13), None, prompt[:48], 16))
    idx["r0"].apply(BlockStored((21,), None, prompt[:16], 16))
    probe = EventPrefixProbe(idx)
    req = Request("p", "small", prompt_token_ids=prompt, max_tokens=1)
    assert (probe(r0, req), probe(r1, req)) == (16, 48)
    d = Dispatcher(lambda: [r0, r1], k.now, "prefix", prefix_probe=probe)
    where: list[str] = []
    d.on_ready(Unit("p", "p", "small", 64, 1), req, on_done=lambda o: None,
               on_submitted=lambda now, name: where.append(name))  # fmt: skip
    idx["r1"].apply(BlockRemoved((11,)))  # r1 lost its first block: nothing there matches now
    assert probe(r1, req) == 0
    d.on_ready(Unit("q", "q", "small", 64, 1),
               Request("q", "small", prompt_token_ids=prompt, max_tokens=1),
               on_done=lambda o: None, on_submitted=lambda now, name: where.append(name))  # fmt: skip
    k.run()
    assert where == ["r1", "r0"]
    idx["r0"].apply(AllBlocksCleared())
    assert probe(r0, req) == 0
