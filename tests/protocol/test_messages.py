"""HEAR messages: subjects, predictions, intent encoding, capabilities, outcomes from tickets."""

from __future__ import annotations

import dataclasses

import pytest
from hear_factories import seam_caps

from maserve_prefect.errors import ConfigError, EngineError, RequestError
from maserve_prefect.protocol import messages as m
from maserve_prefect.protocol.outcomes import Acceptance, Attempt, Outcome, OutcomeStatus, Ticket


def test_every_message_names_its_subject() -> None:
    kinds = [
        m.RoleIntent,
        m.StageIntent,
        m.DependencyIntent,
        m.SizeIntent,
        m.ContextIntent,
        m.FutureUseIntent,
        m.CachePrepare,
        m.CacheRetain,
        m.CacheRelease,
        m.StateReport,
        m.Accepted,
        m.Completed,
        m.Rejected,
        m.Unsupported,
        m.Failed,
    ]
    for kind in kinds:
        assert "subject" in {f.name for f in dataclasses.fields(kind)}, kind.__name__
    with pytest.raises(RequestError, match="ContextRef"):
        m.CacheRetain(m.RequestRef("r1"), (1,), 0.5)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "build",
    [
        lambda: m.RequestRef(""),
        lambda: m.ContextRef("c", -1),
        lambda: m.ContextIntent(m.ContextRef("c", 2), m.ContextAction.OPEN),
        lambda: m.ContextIntent(m.ContextRef("c", 0), m.ContextAction.EXTEND),
        lambda: m.Prediction(3, source=""),
        lambda: m.MaxWait(-1.0),
        lambda: m.CacheRetain(m.ContextRef("c"), (), 0.5),
    ],
)
def test_malformed_messages_raise(build: object) -> None:
    with pytest.raises(RequestError):
        build()  # type: ignore[operator]


def test_predictions_are_marked_and_survive_encoding() -> None:
    known = m.FutureUseIntent(m.ContextRef("c", 1), num_uses=2, within_s=5.0)
    guessed = m.FutureUseIntent(m.ContextRef("c", 1), num_uses=m.Prediction(2, source="lgbm"))
    assert not known.is_predicted and guessed.is_predicted
    assert guessed.num_uses.is_prediction  # type: ignore[union-attr]
    e = m.encode_intent(guessed)
    assert e.kind == "future_use" and e.request_id is None
    assert e.payload["subject"] == "context:c@1"
    assert e.payload["num_uses.predicted"] == "true" and e.payload["num_uses.source"] == "lgbm"
    assert "num_uses.predicted" not in m.encode_intent(known).payload


def test_encode_intent_refuses_a_control() -> None:
    with pytest.raises(RequestError, match="not a HEAR intent"):
        m.encode_intent(m.Priority(1))  # type: ignore[arg-type]


def test_hear_capabilities_derive_from_the_engine_and_add_extras() -> None:
    caps = m.HearCapabilities.from_engine(
        seam_caps(),
        cache_controls={m.CacheOp.RETAIN, m.CacheOp.RELEASE},
        kv_tiers=[m.Tier.CPU, m.Tier.GPU],
        waiting_requirements=True,
    )
    assert caps.kv_tiers == (m.Tier.GPU, m.Tier.CPU)
    assert {m.CacheRetain, m.CacheRelease, m.MaxWait} <= set(caps.control_types)
    assert m.CachePrepare not in caps.control_types
    plain = m.HearCapabilities.from_engine(seam_caps(prefix_caching=False))
    assert plain.cache_controls == frozenset() and plain.kv_tiers == ()
    with pytest.raises(ConfigError, match="KV tier"):
        m.HearCapabilities.from_engine(
            seam_caps(prefix_caching=False), cache_controls={m.CacheOp.RETAIN}
        )


def test_usable_sends_what_is_supported_and_flags_withheld_requirements() -> None:
    caps = m.HearCapabilities.from_engine(seam_caps(control_types=(m.ExecutionMode,)))
    req = m.Force.REQUIREMENT
    u = m.usable(
        [m.ExecutionMode("eager"), m.ExecutionMode("x", fallback=("default",)), m.Priority(3)],
        caps,
    )
    assert [type(c).__name__ for c in u.send] == ["ExecutionMode", "ExecutionMode"]
    assert u.ok and len(u.withheld) == 1
    assert not m.usable([m.ExecutionMode("x", force=req)], caps).ok
    with pytest.raises(RequestError, match="fallback entry"):
        m.usable([m.Priority(1, fallback=("high",))], caps)


def _outcome(status: OutcomeStatus) -> Outcome:
    return Outcome(
        "r1",
        status,
        num_prompt_tokens=100,
        num_output_tokens=20,
        num_cached_tokens=60,
        num_preemptions=1,
        realized_mode="eager",
        arrival_s=1.0,
        first_scheduled_s=1.5,
        first_token_s=2.0,
        finish_s=4.0,
        error="boom" if status is OutcomeStatus.FAILED else None,
        attempts=(Attempt(1, 1.0, 2.0, "503"), Attempt(2, 2.0, 4.0)),
    )


def test_outcome_of_reads_each_ticket_state() -> None:
    assert isinstance(m.outcome_of(Ticket("r1", Acceptance.REJECTED, "too long")), m.Rejected)
    uns = m.outcome_of(Ticket("r1", Acceptance.UNSUPPORTED, "required X"))
    assert isinstance(uns, m.Unsupported) and uns.reason == "required X"
    t = Ticket("r1", Acceptance.ACCEPTED)
    pending = m.outcome_of(t)
    assert isinstance(pending, m.Accepted) and not pending.is_final
    t.resolve(_outcome(OutcomeStatus.COMPLETED))
    done = m.require_completed(m.outcome_of(t))
    assert done.cache.fraction == pytest.approx(0.6)
    assert (done.latency.queue_s, done.latency.ttft_s, done.latency.e2e_s) == (0.5, 1.0, 3.0)
    assert done.num_retries == 1 and done.realization.mode == "eager"
    assert done.resources.num_preemptions == 1


def test_a_failed_outcome_is_final_but_not_completed() -> None:
    t = Ticket("r1", Acceptance.ACCEPTED)
    t.resolve(_outcome(OutcomeStatus.FAILED))
    failed = m.outcome_of(t)
    assert isinstance(failed, m.Failed) and failed.is_final and failed.num_retries == 1
    with pytest.raises(EngineError, match="ended failed, not completed: boom"):
        m.require_completed(failed)
