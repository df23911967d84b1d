"""The HEAR force rules: one test per distinction, each failing if the rule is broken."""

from __future__ import annotations

import pytest
from hear_factories import FakeReplica, make_engine, seam_caps

from maserve_prefect.errors import EngineError, RequestError
from maserve_prefect.protocol.channel import Channel
from maserve_prefect.protocol.controls import (
    CacheOp,
    CacheRelease,
    CacheRetain,
    ExecutionMode,
    Force,
    MaxWait,
    Priority,
    Tier,
)
from maserve_prefect.protocol.force import resolve
from maserve_prefect.protocol.intents import (
    ContextAction,
    ContextIntent,
    FutureUseIntent,
    Prediction,
    RoleIntent,
)
from maserve_prefect.protocol.outcomes import (
    Acceptance,
    Accepted,
    Completed,
    OutcomeKind,
    Unsupported,
    require_completed,
)
from maserve_prefect.protocol.requests import Request
from maserve_prefect.protocol.subjects import ContextRef, RequestRef

CTX = ContextRef("sess-1", 1)
REQ = Force.REQUIREMENT


# --- an intent never triggers an action ------------------------------------------------------


def test_retain_intent_alone_pins_nothing_but_a_retain_control_does() -> None:
    eng = make_engine()
    eng.admit_blocks((1, 2, 3))
    eng.inform(ContextIntent(ContextRef("sess-1", 0), ContextAction.OPEN, 48, (1, 2, 3)))
    eng.inform(FutureUseIntent(CTX, num_uses=Prediction(4, source="history"), within_s=2.0))
    assert len(eng.intents) == 2
    assert eng.pinned() == {}
    assert eng.evict(3) == [1, 2, 3]

    eng.admit_blocks((1, 2, 3))
    eng.control([CacheRetain(CTX, (1, 2, 3), retention_priority=0.9, force=REQ)])
    assert eng.evict(3) == []
    assert sorted(eng.resident()) == [1, 2, 3]


@pytest.mark.parametrize(
    "intent",
    [
        RoleIntent(RequestRef("r1"), "critic"),
        FutureUseIntent(CTX, num_uses=3),
    ],
)
def test_an_intent_passed_as_a_control_is_refused(intent: object) -> None:
    eng = make_engine()
    with pytest.raises(RequestError, match="intent, not a control"):
        eng.submit("r1", [intent])  # type: ignore[list-item]


def test_channel_inform_goes_to_the_intent_channel_only() -> None:
    replica = FakeReplica(seam_caps())
    ch = Channel(replica)
    result = ch.inform(RoleIntent(RequestRef("r1"), "critic"))  # type: ignore[func-returns-value]
    assert result is None
    assert [i.kind for i in replica.intents] == ["role"]
    assert replica.intents[0].payload["role"] == "critic"
    assert replica.submitted == []


# --- a preference never overrides a requirement --------------------------------------------


@pytest.mark.parametrize("pref_first", [True, False])
def test_preference_never_overrides_requirement(pref_first: bool) -> None:
    pref, req = ExecutionMode("eager"), ExecutionMode("default", force=REQ)
    controls = [pref, req] if pref_first else [req, pref]
    res = resolve(controls, make_engine().capabilities)
    assert res.acceptance is Acceptance.ACCEPTED
    assert res.realized_mode("?") == "default"
    assert [d.control for d in res.dropped] == [pref]
    assert "conflicts with requirement" in res.dropped[0].reason
    assert any("dropped preference" in n for n in res.notes())


def test_release_preference_cannot_unpin_a_required_retain() -> None:
    eng = make_engine()
    eng.admit_blocks((5, 6))
    res = eng.control(
        [CacheRelease(CTX, (5,)), CacheRetain(CTX, (5, 6), retention_priority=1.0, force=REQ)]
    )
    assert [type(d.control) for d in res.dropped] == [CacheRelease]
    assert eng.evict(2) == []


def test_two_conflicting_requirements_are_unsupported_not_merged() -> None:
    res = resolve([Priority(1, force=REQ), Priority(2, force=REQ)], make_engine().capabilities)
    assert res.acceptance is Acceptance.UNSUPPORTED
    assert "Priority(" in res.reason and "conflicts with requirement" in res.reason


# --- an unsatisfiable requirement: UNSUPPORTED, or an explicit fallback --------------------


def test_unsupported_requirement_yields_unsupported_outcome_naming_it() -> None:
    eng = make_engine(cache_ops=(CacheOp.RELEASE,))
    eng.admit_blocks((1,))
    retain = CacheRetain(CTX, (1,), retention_priority=0.5, force=REQ)
    out = eng.submit("r1", [retain])
    assert isinstance(out, Unsupported)
    assert out.kind is OutcomeKind.UNSUPPORTED
    assert out.requirements == (retain,)
    assert out.reason.startswith("required CacheRetain(")
    assert "CacheRetain is not among the engine's control types" in out.reason
    assert eng.pinned() == {}


def test_unsupported_preference_is_dropped_and_noted_not_rejected() -> None:
    eng = make_engine(cache_ops=(CacheOp.RELEASE,))
    out = eng.submit("r1", [CacheRetain(CTX, (1,), retention_priority=0.5)])
    assert isinstance(out, Accepted)
    assert any("dropped preference CacheRetain(" in n for n in out.realization.notes)


def test_channel_answers_unsupported_requirement_without_silence() -> None:
    replica = FakeReplica(seam_caps(control_types=(ExecutionMode,)))
    ch = Channel(replica)
    request = Request("r1", "m", num_prompt_tokens=8)
    ticket = ch.submit(request, [MaxWait(5.0, force=REQ)])
    assert ticket.acceptance is Acceptance.UNSUPPORTED
    assert "MaxWait" in ticket.reason
    assert replica.submitted == []

    ticket = ch.submit(request, [MaxWait(5.0), ExecutionMode("eager")])
    assert ticket.acceptance is Acceptance.ACCEPTED
    assert replica.submitted[0][1] == (ExecutionMode("eager"),)
    assert any("withheld preference MaxWait" in n for n in ticket.notes)


def test_allowed_fallback_is_used_and_recorded() -> None:
    eng = make_engine(modes=("default", "eager"))
    asked = ExecutionMode("turbo", force=REQ, fallback=("cuda_graph", "eager"))
    out = eng.submit("r1", [asked])
    assert isinstance(out, Accepted)
    assert out.realization.mode == "eager"
    (fb,) = out.realization.fallbacks
    assert fb.requested == asked
    assert isinstance(fb.used, ExecutionMode) and fb.used.mode == "eager"
    assert fb.used.force is REQ  # a fallback keeps the force of what it stands in for
    assert any("fallback" in n for n in out.realization.notes)


def test_cache_fallback_to_cpu_tier_is_honoured() -> None:
    eng = make_engine(tiers={Tier.CPU: 8})
    eng.admit_blocks((3,), Tier.CPU)
    gpu = CacheRetain(
        CTX, (3,), 0.7, force=REQ, fallback=(CacheRetain(CTX, (3,), 0.7, tier=Tier.CPU),)
    )
    res = eng.control([gpu])
    assert res.acceptance is Acceptance.ACCEPTED
    assert res.fallbacks[0].used.tier is Tier.CPU  # type: ignore[attr-defined]
    assert eng.evict(1, Tier.CPU) == []


def test_requirement_without_workable_fallback_is_unsupported() -> None:
    out = make_engine().submit("r1", [ExecutionMode("turbo", force=REQ, fallback=("fp4",))])
    assert isinstance(out, Unsupported)
    assert "'turbo'" in out.reason and "'fp4'" in out.reason


# --- state never reserves -------------------------------------------------------------------


def test_a_state_report_does_not_reserve() -> None:
    eng = make_engine()
    eng.admit_blocks((1, 2))
    report = eng.state(at_s=1.0)
    view = report.residency_view()
    assert view.reusable_blocks((1, 2)) == 2
    assert eng.evict(2) == [1, 2]  # reported resident, still evictable
    assert view.reusable_blocks((1, 2)) == 2  # the photograph does not change either
    assert eng.state().residency_view().reusable_blocks((1, 2)) == 0
    with pytest.raises(RequestError, match="state never reserves"):
        eng.control([report])  # type: ignore[list-item]


# --- acceptance is not completion -----------------------------------------------------------


def test_accepted_is_not_completed() -> None:
    eng = make_engine()
    acc = eng.submit("r1", [ExecutionMode("eager")], at_s=2.0)
    assert isinstance(acc, Accepted) and not isinstance(acc, Completed)
    assert acc.kind is OutcomeKind.ACCEPTED and not acc.is_final
    with pytest.raises(EngineError, match="accepted, not completed"):
        require_completed(acc)
    with pytest.raises(AttributeError):
        _ = acc.latency  # type: ignore[attr-defined]
    done = eng.complete("r1", num_prompt_tokens=10, num_output_tokens=4, finish_s=3.5)
    assert require_completed(done) is done
    assert done.is_final and done.realization.mode == "eager"
    assert done.latency.e2e_s == pytest.approx(1.5)
