"""`OpenAIEngine` and `discover` against a real HTTP server on 127.0.0.1 (`openai_stub.py`)."""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from openai_stub import StubConfig, StubServer, serve

from maserve_prefect.engines.openai import OpenAIEngine, RetryPolicy, discover, synth_token_ids
from maserve_prefect.engines.openai.retry import classify_error
from maserve_prefect.errors import ConfigError, EngineError
from maserve_prefect.protocol.controls import (
    CachePrepare,
    CacheRetain,
    ExecutionMode,
    Force,
    MaxWait,
    Priority,
)
from maserve_prefect.protocol.intents import Intent
from maserve_prefect.protocol.outcomes import Acceptance, Outcome, OutcomeStatus
from maserve_prefect.protocol.requests import Request
from maserve_prefect.protocol.state import Lifecycle
from maserve_prefect.protocol.subjects import ContextRef
from maserve_prefect.taskrunner.wallgate import WallGate

FAST = RetryPolicy(max_attempts=3, backoff_s=0.01)


@pytest.fixture
def stub() -> Iterator[StubServer]:
    with serve() as s:
        yield s


def make_engine(stub: StubServer, **kw: Any) -> OpenAIEngine:
    kw.setdefault("retry", FAST)
    kw.setdefault("request_timeout_s", 10.0)
    return OpenAIEngine(stub.url, **kw)


def req(rid: str = "r1", **kw: Any) -> Request:
    if "prompt_token_ids" not in kw:
        kw.setdefault("num_prompt_tokens", 8)
    kw.setdefault("max_tokens", 4)
    return Request(rid, "tiny", **kw)


def run_one(engine: OpenAIEngine, request: Request, controls: Any = ()) -> Outcome:
    ticket = engine.submit(request, controls)
    assert ticket.acceptance is Acceptance.ACCEPTED, ticket.reason
    return engine.wait(ticket, timeout_s=10.0)


def until(cond: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + 10.0
    while not cond():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out waiting for {what}")
        time.sleep(0.01)


# -- discovery ---------------------------------------------------------------------------------


def test_discover_reports_what_the_vllm_stub_supports(stub: StubServer) -> None:
    info = discover(stub.url + "/v1/")
    assert (info.base_url, info.models, info.model) == (stub.url, ("tiny",), "tiny")
    assert info.max_model_len == 2048 and info.version == "0.0.0-stub"
    assert info.is_vllm and info.metrics_available
    assert info.token_id_prompts and info.length_lock and info.returns_token_ids
    assert not info.priority_scheduling and not info.kv_events
    probes = [body for path, body in stub.received if path == "/v1/completions"]
    assert any(body.get("priority") == 1 for body in probes)


def test_discover_sees_priority_scheduling_only_on_vllm() -> None:
    with serve(StubConfig(priority_scheduling=True)) as s:
        assert discover(s.url).priority_scheduling
    with serve(StubConfig(priority_scheduling=True, vllm=False)) as s:
        info = discover(s.url, kv_events_endpoint="tcp://127.0.0.1:5557")
        assert not info.is_vllm and not info.priority_scheduling
        assert info.kv_events and info.kv_events_endpoint == "tcp://127.0.0.1:5557"


def test_discover_without_token_ids_in_answers() -> None:
    with serve(StubConfig(return_token_ids=False)) as s:
        info = discover(s.url)
    assert info.token_id_prompts and not info.returns_token_ids


def test_discover_needs_a_model_choice_when_several_are_served() -> None:
    models = [{"id": "a"}, {"id": "b"}]
    with serve(StubConfig(models=models)) as s:
        with pytest.raises(ConfigError, match=r"serves 2 models \['a', 'b'\]"):
            discover(s.url)
        with pytest.raises(ConfigError, match="'c' is not served"):
            discover(s.url, model="c")
        info = discover(s.url, model="b", probe=False)
    assert info.model == "b" and info.max_model_len is None and not info.token_id_prompts


def test_unreachable_server_names_the_url_and_the_fix() -> None:
    with serve() as s:
        url = s.url  # the port is free again once the stub stops
    with pytest.raises(EngineError, match=f"{url}.*start the server or check --engine openai:URL"):
        discover(url, timeout_s=2.0)
    engine = OpenAIEngine(url, model="tiny")
    ticket = engine.submit(req())
    assert ticket.acceptance is Acceptance.REJECTED and url in ticket.reason
    assert engine.state().lifecycle is Lifecycle.UNREACHABLE
    engine.close()
    assert engine.state().lifecycle is Lifecycle.STOPPED


def test_capabilities_follow_the_server(stub: StubServer) -> None:
    caps = make_engine(stub).capabilities()
    assert caps.control_types == (ExecutionMode,)
    assert caps.accepts_token_ids and caps.length_lock and caps.prefix_caching
    assert not caps.priority_scheduling and caps.sleep_levels == () and caps.modes == ("default",)
    with serve(StubConfig(priority_scheduling=True)) as s:
        caps = make_engine(s).capabilities()
    assert caps.control_types == (ExecutionMode, Priority) and caps.priority_scheduling


# -- the request mapping on the wire ---------------------------------------------------------


def test_token_id_prompts_reach_completions_unchanged(stub: StubServer) -> None:
    with make_engine(stub) as engine:
        out = run_one(engine, req(prompt_token_ids=(5, 6, 7, 8, 9)))
    (body,) = stub.streams()
    assert body["prompt"] == [5, 6, 7, 8, 9]
    assert body["stream"] is True and body["stream_options"] == {"include_usage": True}
    assert body["model"] == "tiny" and body["max_tokens"] == 4
    assert out.status is OutcomeStatus.COMPLETED
    assert (out.num_prompt_tokens, out.num_output_tokens) == (5, 4)
    assert out.output_text == " t0 t1 t2 t3" and out.output_token_ids == (100, 101, 102, 103)
    assert [p for p, b in stub.received if b.get("stream")] == ["/v1/completions"]


def test_length_lock_sends_min_tokens_and_ignore_eos(stub: StubServer) -> None:
    with make_engine(stub) as engine:
        out = run_one(engine, req(max_tokens=6, min_tokens=6))
        run_one(engine, req("r2", max_tokens=6, min_tokens=2))
        run_one(engine, req("r3", max_tokens=6))
    locked, partial, free = stub.streams()
    assert (locked["min_tokens"], locked["ignore_eos"]) == (6, True)
    assert partial["min_tokens"] == 2 and "ignore_eos" not in partial
    assert "min_tokens" not in free and "ignore_eos" not in free
    assert out.num_output_tokens == 6


def test_length_only_requests_send_synthesized_shared_prefixes(stub: StubServer) -> None:
    with make_engine(stub, vocab_size=300) as engine:
        for rid, hashes in (("a", (1, 2)), ("b", (1, 3))):
            r = req(rid, num_prompt_tokens=40, prefix_block_hashes=hashes, prefix_block_size=16)
            assert run_one(engine, r).num_prompt_tokens == 40
    a, b = (body["prompt"] for body in stub.streams())
    assert a == synth_token_ids(40, (1, 2), 16, 300, salt="a")
    assert a[:16] == b[:16] and a[16:32] != b[16:32]


def test_chat_messages_stream_from_chat_completions(stub: StubServer) -> None:
    with make_engine(stub) as engine:
        out = run_one(engine, req(messages=(("user", "say three words"),), max_tokens=3))
    assert [p for p, b in stub.received if b.get("stream")] == ["/v1/chat/completions"]
    assert stub.streams()[0]["messages"] == [{"role": "user", "content": "say three words"}]
    assert out.output_text == " t0 t1 t2" and out.num_prompt_tokens == 3


def test_cached_tokens_come_from_usage_and_missing_ids_stay_none() -> None:
    with serve(StubConfig(cached_tokens=7, return_token_ids=False)) as s:
        with make_engine(s) as engine:
            out = run_one(engine, req(prompt_token_ids=tuple(range(16, 32))))
    assert out.num_cached_tokens == 7
    assert out.output_token_ids is None and out.output_text == " t0 t1 t2 t3"
    assert "return_token_ids" not in s.streams()[0]


def test_first_token_precedes_finish_on_the_callers_clock() -> None:
    ticks = itertools.count(1000)
    clock_lock = threading.Lock()

    def now() -> float:
        with clock_lock:
            return float(next(ticks))

    with serve(StubConfig(chunk_delay_s=0.01)) as s, make_engine(s, now=now) as engine:
        ticket = engine.submit(req(max_tokens=5))
        firsts: list[float] = []
        ticket.on_first_token(firsts.append)
        out = engine.wait(ticket, 10.0)
    (attempt,) = out.attempts
    assert out.first_token_s is not None and out.first_scheduled_s is None
    assert 1000 <= out.arrival_s <= attempt.start_s < out.first_token_s < out.finish_s
    assert out.finish_s == attempt.end_s and attempt.error is None
    assert firsts == [out.first_token_s] == [ticket.first_token_s]


# -- retries ---------------------------------------------------------------------------------


def test_two_503s_then_success_records_three_attempts() -> None:
    with serve(StubConfig(fail_next=2)) as s, make_engine(s) as engine:
        out = run_one(engine, req())
        state = engine.state()
    assert out.status is OutcomeStatus.COMPLETED and out.num_output_tokens == 4
    assert [a.number for a in out.attempts] == [1, 2, 3]
    assert [a.status_code for a in out.attempts] == [503, 503, None]
    assert out.attempts[0].error == "HTTP 503: engine overloaded"
    assert out.attempts[2].error is None
    times = [t for a in out.attempts for t in (a.start_s, a.end_s)]
    assert times == sorted(times)
    assert state.counters["num_retries"] == 2 and state.counters["num_completed"] == 1


def test_a_4xx_is_not_retried() -> None:
    config = StubConfig(fail_next=1, fail_status=400, fail_message="prompt too long for tiny")
    with serve(config) as s, make_engine(s) as engine:
        out = run_one(engine, req())
    assert out.status is OutcomeStatus.FAILED
    assert len(out.attempts) == 1 and out.attempts[0].status_code == 400
    assert out.error is not None and "prompt too long for tiny" in out.error
    assert len(s.streams()) == 1


def test_the_last_failure_is_the_error_after_all_attempts() -> None:
    with serve(StubConfig(fail_next=5, fail_status=502)) as s, make_engine(s) as engine:
        out = run_one(engine, req())
    assert out.status is OutcomeStatus.FAILED and len(out.attempts) == 3
    assert out.error == "after 3 attempt(s): HTTP 502: engine overloaded"
    assert len(s.streams()) == 3


def test_a_dropped_stream_is_retried_from_the_start() -> None:
    with serve(StubConfig(drop_next=1, drop_after_chunks=2)) as s, make_engine(s) as engine:
        out = run_one(engine, req(max_tokens=5))
    assert out.status is OutcomeStatus.COMPLETED
    assert out.output_text == " t0 t1 t2 t3 t4"  # the partial first answer is not kept
    first, second = out.attempts
    assert first.error is not None and first.error.startswith("connection error")
    assert second.error is None and len(s.streams()) == 2
    assert any("came from a failed attempt" in n for n in out.notes)


def test_timeouts_are_retried_then_fail() -> None:
    config = StubConfig(hold=threading.Event())
    retry = RetryPolicy(max_attempts=2, backoff_s=0.01)
    with serve(config) as s, make_engine(s, request_timeout_s=0.3, retry=retry) as engine:
        out = run_one(engine, req())
    assert out.status is OutcomeStatus.FAILED and len(out.attempts) == 2
    assert all(a.error is not None and a.error.startswith("timed out") for a in out.attempts)
    assert out.error is not None and "after 2 attempt(s): timed out" in out.error


def test_retry_policy_validates_and_classifies() -> None:
    with pytest.raises(ConfigError, match="unknown kinds"):
        RetryPolicy(retry_on=("5xx", "sometimes"))
    with pytest.raises(ConfigError):
        RetryPolicy(max_attempts=0)
    assert RetryPolicy(backoff_s=1.0, max_backoff_s=3.0).delay_s(4) == 3.0
    assert classify_error(TimeoutError()).kind == "timeout"


# -- controls --------------------------------------------------------------------------------


def test_required_priority_on_a_non_priority_server_is_unsupported(stub: StubServer) -> None:
    with make_engine(stub) as engine:
        ticket = engine.submit(req(), [Priority(1, force=Force.REQUIREMENT)])
        assert ticket.acceptance is Acceptance.UNSUPPORTED
        assert "Priority" in ticket.reason and "openai0" in ticket.reason
        out = run_one(engine, req("r2"), [Priority(1)])
    assert out.status is OutcomeStatus.COMPLETED
    assert any("preference Priority" in n for n in out.notes)
    (body,) = stub.streams()  # the unsupported request never reached the server
    assert "priority" not in body


def test_hear_controls_outside_a_submission_are_answered_never_applied() -> None:
    """vLLM's OpenAI side answers retain / prepare "unsupported" and applies nothing; priority
    outside a submission is refused as request-scoped."""
    keep = CacheRetain(ContextRef("s1"), (1, 2), 0.5, force=Force.REQUIREMENT)
    warm = CachePrepare(ContextRef("s1"), (1, 2))
    with serve(StubConfig(priority_scheduling=True)) as s, make_engine(s) as engine:
        hc = engine.hear_capabilities()
        assert hc.cache_controls == frozenset() and Priority in hc.control_types
        res = engine.control([keep, warm, Priority(1)])
        assert res.acceptance is Acceptance.UNSUPPORTED and res.honoured == ()
        assert [type(u.control) for u in res.unsatisfied] == [CacheRetain]
        assert "CacheRetain is not among" in res.reason
        assert {type(d.control) for d in res.dropped} == {CachePrepare, Priority}
        assert any("send it with submit()" in d.reason for d in res.dropped)
        assert engine.control([warm]).acceptance is Acceptance.ACCEPTED  # dropped, noted
    assert s.streams() == []  # nothing reached the server


def test_updates_after_submission_are_unsupported() -> None:
    """HEAR's subsequent updates (a refreshed priority, a later waiting requirement) have no
    vLLM call: required ones are unsupported, preferred ones dropped, nothing is sent."""
    with serve(StubConfig(priority_scheduling=True)) as s, make_engine(s) as engine:
        res = engine.update("r1", [Priority(-3, force=Force.REQUIREMENT),
                                   MaxWait(40.0, force=Force.REQUIREMENT), Priority(2)])  # fmt: skip
        assert res.acceptance is Acceptance.UNSUPPORTED and res.honoured == ()
        assert [type(u.control) for u in res.unsatisfied] == [Priority, MaxWait]
        assert [type(d.control) for d in res.dropped] == [Priority]
        assert "cannot change request 'r1' after submission" in res.reason
        # a waiting requirement with the submission is unsupported too (no such vLLM field)
        ticket = engine.submit(req(), [MaxWait(40.0, force=Force.REQUIREMENT)])
        assert ticket.acceptance is Acceptance.UNSUPPORTED and "MaxWait" in ticket.reason
    assert s.streams() == []


def test_priority_is_sent_to_a_priority_server() -> None:
    with serve(StubConfig(priority_scheduling=True)) as s, make_engine(s) as engine:
        out = run_one(engine, req(), [Priority(-3, force=Force.REQUIREMENT)])
        run_one(engine, req("r2", priority=2))
    assert out.status is OutcomeStatus.COMPLETED and out.notes == ()
    assert [b["priority"] for b in s.streams()] == [-3, 2]


def test_submit_rejects_other_deployments_duplicates_and_overlong_prompts(
    stub: StubServer,
) -> None:
    with make_engine(stub, max_concurrency=1) as engine:
        assert engine.submit(Request("x", "other", num_prompt_tokens=4)).acceptance is (
            Acceptance.REJECTED
        )
        too_long = engine.submit(req("y", num_prompt_tokens=2040, max_tokens=16))
        assert (
            too_long.acceptance is Acceptance.REJECTED and "max_model_len 2048" in too_long.reason
        )
        stub.config.hold = threading.Event()
        first = engine.submit(req("dup"))
        again = engine.submit(req("dup"))
        assert again.acceptance is Acceptance.REJECTED and "already in flight" in again.reason
        stub.config.hold.set()
        assert engine.wait(first, 10.0).status is OutcomeStatus.COMPLETED


# -- callbacks, state, close -----------------------------------------------------------------


def test_deliver_runs_callbacks_under_the_callers_gate(stub: StubServer) -> None:
    gate = WallGate()
    active = threading.local()
    seen: list[tuple[str, bool]] = []

    def deliver(fn: Callable[[], None]) -> None:
        def marked() -> None:
            active.inside = True
            try:
                fn()
            finally:
                active.inside = False

        gate.defer(None, marked)  # runs it under the gate's lock

    stub.config.hold = threading.Event()  # no token before the callbacks are registered
    with make_engine(stub, deliver=deliver) as engine:
        ticket = engine.submit(req())
        with gate.locked():  # what a dispatcher holds while it registers
            ticket.on_first_token(lambda _: seen.append(("first", active.inside)))
            ticket.on_done(lambda _: seen.append(("done", active.inside)))
        stub.config.hold.set()
        engine.wait(ticket, 10.0)
    assert seen == [("first", True), ("done", True)]


def test_state_reports_in_flight_and_gauges(stub: StubServer) -> None:
    gauges = {"vllm:num_requests_waiting": 3.0, "vllm:kv_cache_usage_perc": 0.25}
    stub.config.hold = threading.Event()
    with make_engine(stub, max_concurrency=1, state_source=lambda: gauges) as engine:
        tickets = [engine.submit(req(f"r{i}")) for i in range(2)]
        until(lambda: len(stub.streams()) == 1, "the first stream")
        st = engine.state()
        assert (st.lifecycle, st.num_running, st.num_waiting) == (Lifecycle.READY, 1, 1 + 3)
        assert st.kv_usage == 0.25 and st.num_total_blocks == 0
        assert st.counters["num_in_flight"] == 2
        assert st.counters["vllm:num_requests_waiting"] == 3.0
        stub.config.hold.set()
        for t in tickets:
            assert engine.wait(t, 10.0).status is OutcomeStatus.COMPLETED
        assert engine.state().counters["num_in_flight"] == 0
        engine.inform(Intent("reuse", "r0", {"next": "r9"}))
        assert engine.intents == [Intent("reuse", "r0", {"next": "r9"})]


def test_close_aborts_in_flight_and_queued_requests(stub: StubServer) -> None:
    stub.config.hold = threading.Event()
    engine = make_engine(stub, max_concurrency=2).start()
    tickets = [engine.submit(req(f"r{i}")) for i in range(3)]
    until(lambda: len(stub.streams()) == 2, "two streams")
    engine.close()
    outcomes = [t.outcome for t in tickets]
    assert all(o is not None and o.status is OutcomeStatus.ABORTED for o in outcomes)
    running = [o for o in outcomes if o is not None and o.attempts]
    assert len(running) == 2 and all(o.attempts[-1].error == "aborted" for o in running)
    assert engine.state().lifecycle is Lifecycle.STOPPED
    assert engine.state().counters["num_aborted"] == 3
    late = engine.submit(req("late"))
    assert late.acceptance is Acceptance.REJECTED and "closed" in late.reason
    engine.close()  # idempotent


def test_a_raising_callback_is_reported_at_close(stub: StubServer) -> None:
    engine = make_engine(stub).start()
    ticket = engine.submit(req())

    def boom(_: object) -> None:
        raise RuntimeError("callback bug")

    ticket.on_done(boom)
    until(lambda: ticket.outcome is not None, "the outcome")
    with pytest.raises(EngineError, match="callback bug"):
        engine.close()
