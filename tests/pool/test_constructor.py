"""The constructor: fusion rules, envelopes, coalescing, the memory ledger, victims, options."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st
from pool_factories import COSTS, footprint, make_device, make_pool, make_replica

from maserve_prefect.pool.constructor import (
    OptionKind,
    lifecycle_option,
    prefetch_victims,
    victim_order,
)
from maserve_prefect.pool.fusion import WorkItem, coalesce, envelope, fusible_chains
from maserve_prefect.pool.memory_ledger import MemoryLedger
from maserve_prefect.pool.state import (
    ActiveRequest,
    Lease,
    PlannedLoad,
)
from maserve_prefect.pool.window import WorkUnit, units_by_id
from maserve_prefect.protocol.state import Lifecycle

A100 = make_device("A100-40GB:0")


# -- fusion ------------------------------------------------------------------------------------


def units_from(edges: list[tuple[int, int]], n: int, deps: list[str]) -> dict[str, WorkUnit]:
    preds = {i: tuple(f"u{a}" for a, b in edges if b == i) for i in range(n)}
    succs = {i: tuple(f"u{b}" for a, b in edges if a == i) for i in range(n)}
    return units_by_id(
        WorkUnit(f"u{i}", "r", deps[i], 10 + i, 5, preds[i], succs[i]) for i in range(n)
    )


@st.composite
def random_dags(draw: st.DrawFn) -> dict[str, WorkUnit]:
    n = draw(st.integers(1, 12))
    pairs = [(a, b) for a in range(n) for b in range(a + 1, n)]
    edges = draw(st.lists(st.sampled_from(pairs), unique=True, max_size=20)) if pairs else []
    deps = draw(st.lists(st.sampled_from(["x", "y"]), min_size=n, max_size=n))
    return units_from(sorted(edges), n, deps)


@settings(max_examples=200, deadline=None)
@given(random_dags())
def test_fusion_never_crosses_a_branch_or_a_join_and_chains_are_maximal(
    units: dict[str, WorkUnit],
) -> None:
    chains = fusible_chains(units)
    assert set(chains) == set(units)
    seen: set[str] = set()
    for chain in {c.chain_id: c for c in chains.values()}.values():
        assert not seen & set(chain.unit_ids)
        seen |= set(chain.unit_ids)
        for a, b in zip(chain.unit_ids, chain.unit_ids[1:], strict=False):
            ua, ub = units[a], units[b]
            assert ua.succs == (b,), "a fused unit branches"
            assert ub.preds == (a,), "a fused unit joins"
            assert ua.deployment == ub.deployment
        head, last = units[chain.unit_ids[0]], units[chain.unit_ids[-1]]
        if len(head.preds) == 1:  # maximal backwards
            p = units[head.preds[0]]
            assert p.succs != (head.unit_id,) or p.deployment != head.deployment
        if len(last.succs) == 1:  # maximal forwards
            s = units[last.succs[0]]
            assert s.preds != (last.unit_id,) or s.deployment != last.deployment
    assert seen == set(units)
    off = fusible_chains(units, enabled=False)
    assert all(c.unit_ids == (u,) for u, c in off.items())


def test_fusion_stops_at_a_fork_a_join_and_a_deployment_change() -> None:
    # u0 -> u1 -> {u2, u3} -> u4 -> u5 (u5 on another deployment)
    edges = [(0, 1), (1, 2), (1, 3), (2, 4), (3, 4), (4, 5)]
    chains = fusible_chains(units_from(edges, 6, ["x", "x", "x", "x", "x", "y"]))
    groups = sorted({c.unit_ids for c in chains.values()})
    assert groups == [("u0", "u1"), ("u2",), ("u3",), ("u4",), ("u5",)]
    assert chains["u1"].rest("u1") == ("u1",)


def test_envelope_covers_the_largest_context() -> None:
    a = WorkUnit("a", "r", "x", 100, 50)
    b = WorkUnit("b", "r", "x", 300, 10)
    env = envelope([a, b])
    assert (env.max_context_tokens, env.max_input_len, env.max_output_len) == (310, 300, 50)
    item = WorkItem((a, b), 0.0)
    one = COSTS.runtime_s("Qwen3-8B", "A100-40GB", 1, 100, 50)
    two = COSTS.runtime_s("Qwen3-8B", "A100-40GB", 1, 300, 10)
    assert item.runtime_s(COSTS, "Qwen3-8B", "A100-40GB") == one + two


def test_demand_from_two_roots_is_coalesced_per_deployment() -> None:
    items = [
        WorkItem((WorkUnit("a", "r1", "m", 1, 1),), 0.0),
        WorkItem((WorkUnit("b", "r2", "m", 1, 1),), 0.0),
        WorkItem((WorkUnit("c", "r2", "n", 1, 1),), 0.0),
    ]
    demands = coalesce(items)
    assert [(d.deployment, d.roots, len(d.items)) for d in demands] == [
        ("m", ("r1", "r2"), 2),
        ("n", ("r2",), 1),
    ]


# -- memory ledger -----------------------------------------------------------------------------


def test_ledger_frees_an_unloading_replica_only_at_its_predicted_end() -> None:
    leaving = make_replica("old", "Qwen3-14B", phase=Lifecycle.UNLOADING, ready_s=1.0)
    ledger = MemoryLedger(make_pool(1, leaving))
    need = footprint("Qwen3-14B")
    assert not ledger.fits(A100.name, need, 0.0)
    assert not ledger.fits(A100.name, need, 1.0)  # a release at the same instant is not trusted
    assert ledger.fits(A100.name, need, 1.0, trusted=["old"])
    assert ledger.fits(A100.name, need, 1.5)


def test_ledger_checks_every_later_transition() -> None:
    planned = PlannedLoad("Qwen3-14B", A100.name, 5.0, 50.0, footprint("Qwen3-14B"))
    ledger = MemoryLedger(make_pool(1, planned=(planned,)))
    small = footprint("Qwen3-8B")
    # free now, but the planned load at t=5 leaves no room for it afterwards
    assert ledger.usage_at(A100.name, 0.0) == 0
    assert not ledger.fits(A100.name, small, 0.0)
    assert ledger.fits(A100.name, footprint("Qwen3-0.6B"), 0.0)


# -- victims and options -----------------------------------------------------------------------


def test_victims_are_lease_free_redundant_first_then_no_estimate_lru_then_most_slack() -> None:
    busy = ActiveRequest("u", 10, 10, 0.0, 5.0)
    s = make_pool(
        1,
        make_replica("copy-a", "Qwen3-0.6B", last_used_s=9.0),
        make_replica("copy-b", "Qwen3-0.6B", last_used_s=8.0),
        make_replica("soon", "Qwen3-4B", last_used_s=1.0),
        make_replica("unused-new", "Qwen3-8B", last_used_s=7.0),
        make_replica("busy", "Qwen3-14B", active=(busy,)),
        make_replica("leased", "Qwen3-14B"),
        leases=(Lease("leased", "chain"),),
    )
    order = [r.name for r in victim_order(s, A100.name, {"Qwen3-4B": 2.0}, COSTS)]
    assert order == ["copy-b", "copy-a", "unused-new", "soon"]


def test_options_load_into_free_memory_else_reclaim_named_victims() -> None:
    s = make_pool(1, make_replica("old", "Qwen3-8B", last_used_s=1.0))
    ledger = MemoryLedger(s)
    opt = lifecycle_option(s, ledger, "Qwen3-4B", A100.name, COSTS, {})
    assert opt is not None and opt.kind is OptionKind.LOAD and opt.victims == ()
    assert opt.ready_s == COSTS.load_s("Qwen3-4B", "A100-40GB")
    opt = lifecycle_option(s, ledger, "Qwen3-14B", A100.name, COSTS, {})
    assert opt is not None and opt.kind is OptionKind.RECLAIM_LOAD
    assert [v.name for v in opt.victims] == ["old"]
    assert opt.start_s == 1.0  # after the victim's unload
    unloads, load = opt.decisions(("u1",))
    assert [u.replica for u in unloads] == ["old"] and load.after == ("old",)
    pre = lifecycle_option(s, ledger, "Qwen3-14B", A100.name, COSTS, {}, prefetch=True)
    assert (
        pre is not None
        and pre.kind is OptionKind.RECLAIM_PREFETCH
        and pre.decisions(())[1].prefetch
    )


def test_no_option_when_only_leased_or_protected_replicas_hold_the_memory() -> None:
    leased = make_pool(1, make_replica("old", "Qwen3-8B"), leases=(Lease("old", "chain"),))
    assert lifecycle_option(leased, MemoryLedger(leased), "Qwen3-14B", A100.name, COSTS, {}) is None
    free = make_pool(1, make_replica("old", "Qwen3-8B"))
    protected = lifecycle_option(
        free,
        MemoryLedger(free),
        "Qwen3-14B",
        A100.name,
        COSTS,
        {"Qwen3-8B": 3.0},
        prefetch=True,
        protect_before_s=10.0,
    )
    assert protected is None
    assert (
        lifecycle_option(
            free, MemoryLedger(free), "Qwen3-14B", A100.name, COSTS, {}, allow_reclaim=False
        )
        is None
    )


def test_a_copy_is_never_reclaimed_to_load_its_own_deployment_again() -> None:
    """Unloading a replica of X to load X on the same device only churns (it was the prefetch
    loop the Poisson runs showed: unload 0.6B, load 0.6B, 1 s later)."""
    s = make_pool(1, make_replica("old", "Qwen3-14B", last_used_s=1.0))
    assert lifecycle_option(s, MemoryLedger(s), "Qwen3-14B", A100.name, COSTS, {}) is None
    pre = lifecycle_option(s, MemoryLedger(s), "Qwen3-14B", A100.name, COSTS, {}, prefetch=True)
    assert pre is None


def test_a_prefetch_only_evicts_copies_and_replicas_needed_well_after_it() -> None:
    s = make_pool(
        1,
        make_replica("copy", "Qwen3-0.6B"),
        make_replica("copy2", "Qwen3-0.6B", phase=Lifecycle.LOADING, ready_s=5.0),
        make_replica("unknown", "Qwen3-4B"),
        make_replica("later", "Qwen3-8B"),
        make_replica("soon", "Qwen3-14B"),
    )
    later = 10.0 + COSTS.load_s("Qwen3-8B", "A100-40GB") + 1.0
    uses = {"Qwen3-8B": later, "Qwen3-14B": 20.0}
    names = [r.name for r in prefetch_victims(s, A100.name, uses, COSTS, release_s=10.0)]
    assert names == ["copy", "later"]
