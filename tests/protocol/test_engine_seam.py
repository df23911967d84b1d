"""Engine protocol types, controls with force, intents, and the replica's admission answers."""

from __future__ import annotations

import pytest
from sim_factories import make_replica, req, submit_at

from maserve_prefect.engines.sim.step.scheduler import Policy
from maserve_prefect.errors import RequestError, UnsupportedError
from maserve_prefect.protocol.controls import Control, ExecutionMode, Force, Priority
from maserve_prefect.protocol.intents import Intent
from maserve_prefect.protocol.outcomes import Acceptance, Outcome, OutcomeStatus, Ticket
from maserve_prefect.protocol.requests import Request


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({}, "exactly one"),
        ({"prompt_token_ids": (1, 2), "num_prompt_tokens": 2}, "exactly one"),
        ({"prompt_token_ids": (1, 2), "prefix_block_hashes": (7,)}, "only go with"),
        ({"num_prompt_tokens": 0}, "at least one"),
        ({"num_prompt_tokens": 10, "prefix_block_hashes": (1,)}, "prefix_block_size"),
        (
            {"num_prompt_tokens": 10, "prefix_block_hashes": (1, 2, 3), "prefix_block_size": 8},
            "exceed",
        ),
        ({"num_prompt_tokens": 10, "max_tokens": 0}, "max_tokens"),
        ({"num_prompt_tokens": 10, "max_tokens": 4, "min_tokens": 5}, "min_tokens"),
    ],
)
def test_bad_requests_raise_naming_the_request(kwargs: dict[str, object], match: str) -> None:
    with pytest.raises(RequestError, match=match) as info:
        Request("req-7", "m", **kwargs)  # type: ignore[arg-type]
    assert "req-7" in str(info.value)


def test_partial_last_prefix_block_is_allowed() -> None:
    r = Request("r", "m", num_prompt_tokens=20, prefix_block_hashes=(1, 2, 3), prefix_block_size=8)
    assert r.num_prompt() == 20


def test_ticket_callbacks_fire_once_and_late_registrations_fire_at_once() -> None:
    t = Ticket("r", Acceptance.ACCEPTED)
    seen: list[object] = []
    t.on_done(seen.append)
    out = Outcome("r", OutcomeStatus.COMPLETED, 1, 1, 0, 0, "default", 0.0, 0.0, 0.1, 0.1)
    t.resolve(out)
    t.on_done(seen.append)
    assert seen == [out, out]


def test_waiting_on_a_rejected_ticket_raises() -> None:
    k, rep = make_replica(4, block_size=4)
    ticket = rep.submit(req("huge", 100, 1))
    assert ticket.acceptance is Acceptance.REJECTED and "KV blocks" in ticket.reason
    with pytest.raises(UnsupportedError, match="rejected"):
        ticket.wait_done(k)


def test_rejections_name_the_reason() -> None:
    _, rep = make_replica(64, max_model_len=100)
    assert rep.submit(req("long", 90, 20)).reason == (  # vLLM's words for a request over it
        "This model's maximum context length is 100 tokens. However, you requested 110 tokens "
        "(90 in the messages, 20 in the completion). Please reduce the length of the messages "
        "or completion."
    )
    assert rep.submit(req("a", 10, 1)).accepted
    assert "already in flight" in rep.submit(req("a", 10, 1)).reason
    rep.set_accepting(False)
    assert "draining" in rep.submit(req("b", 10, 1)).reason


def test_required_unsupported_control_is_unsupported_and_preference_is_noted() -> None:
    k, rep = make_replica(64)  # FCFS: priority is not a supported control
    t_req = rep.submit(req("a", 8, 1), [Priority(1, force=Force.REQUIREMENT)])
    assert t_req.acceptance is Acceptance.UNSUPPORTED
    t_pref = rep.submit(req("b", 8, 1), [Priority(1)])
    assert t_pref.accepted
    k.run()
    assert t_pref.outcome is not None
    assert any("ignored" in n for n in t_pref.outcome.notes)


def test_mode_fallback_is_used_and_recorded() -> None:
    k, rep = make_replica(64)
    required = ExecutionMode("eager", force=Force.REQUIREMENT)
    assert rep.submit(req("a", 8, 1), [required]).acceptance is Acceptance.UNSUPPORTED
    fallback = ExecutionMode("eager", force=Force.REQUIREMENT, fallback=("default",))
    t = rep.submit(req("b", 8, 1), [fallback])
    k.run()
    assert t.outcome is not None and t.outcome.realized_mode == "default"
    assert "fell back" in t.outcome.notes[0]


def test_unknown_control_types_follow_their_force() -> None:
    class KeepCache(Control):
        pass

    _, rep = make_replica(64)
    assert rep.submit(req("a", 8, 1), [KeepCache(force=Force.REQUIREMENT)]).acceptance is (
        Acceptance.UNSUPPORTED
    )
    assert rep.submit(req("b", 8, 1), [KeepCache()]).accepted


def test_priority_control_is_honoured_under_priority_scheduling() -> None:
    log: list = []
    k, rep = make_replica(64, log=log, policy=Policy.PRIORITY, max_num_seqs=1)
    assert Priority in rep.capabilities().control_types
    rep.submit(req("first", 8, 1))
    submit_at(k, rep, 0.001, req("low", 8, 1, priority=0))
    k.call_at(0.002, lambda: rep.submit(req("boosted", 8, 1, priority=5), [Priority(-1)]))
    k.run()
    assert [e[2] for e in log if e[1] == "schedule"] == ["first", "boosted", "low"]


def test_intents_are_recorded_and_never_change_scheduling() -> None:
    def run(with_intents: bool) -> tuple[list, list]:
        log: list = []
        k, rep = make_replica(6, log=log, block_size=4)
        for i in range(4):
            r = req(f"r{i}", 6 + i, 4)
            k.call_at(0.003 * i, lambda r=r: rep.submit(r))
            if with_intents:
                rep.inform(Intent("future_reuse", r.request_id, {"role": "critic"}))
        k.run()
        return log, rep.records

    plain, informed = run(False), run(True)
    assert plain == informed
    _, rep = make_replica(4)
    rep.inform(Intent("deps", None, {"after": "x"}))
    assert rep.intents == [Intent("deps", None, {"after": "x"})]
    assert rep.state().num_waiting == 0
