"""A replay scenario on the real vLLM: paired arms from a drained server, under a wall-clock limit.

`run_scenario` with `engine: openai:URL` locks deadlines from a reference replay, then runs a DAG
and a Barrier arm (one block) on the session's server. Before each arm the server is drained:
idle, and its prefix cache reset when the server offers `POST /reset_prefix_cache` (vLLM with
VLLM_SERVER_DEV_MODE=1); otherwise the arm records that the cache was not reset. A scenario whose
limit is too short for its work ends with its unfinished roots counted, not a hang, and leaves the
server drainable.
"""

from __future__ import annotations

import httpx
import pytest
from maserve_prefect.flows.native import run_native

from maserve_prefect.engines.openai.wall import drain_server
from maserve_prefect.engines.target import parse_engine
from maserve_prefect.metrics.task import root_class
from maserve_prefect.replay.arms import run_scenario
from maserve_prefect.replay.conformance import audit
from maserve_prefect.replay.scenario import parse_scenario
from maserve_prefect.trace.cas import BlobStore
from maserve_prefect.trace.model import OpKind, Trace

Loaded = tuple[Trace, BlobStore]


MAX_OUTPUT_TOKENS = 32
"""Output lengths are capped so the CPU server replays an arm in seconds (recorded: up to ~760)."""


@pytest.fixture(scope="module")
def native_pair(prefect_api: None) -> Loaded:
    """Two four-call roots recorded on the simulator (sized for the tiny model's context)."""
    run = run_native("four_call_selected", users=2, seed=1)
    return run.trace, run.harness.store


@pytest.fixture(scope="module")
def short_pair(native_pair: Loaded) -> Loaded:
    """`native_pair` with every model op's output capped at `MAX_OUTPUT_TOKENS`."""
    trace, store = native_pair
    ops = [
        op.model_copy(update={"num_output_tokens": min(op.num_output_tokens, MAX_OUTPUT_TOKENS)})
        if op.kind is OpKind.MODEL
        else op
        for op in trace.ops
    ]
    return trace.model_copy(update={"ops": ops}), store


def _scenario(engine_url: str, **extra: object) -> dict[str, object]:
    return {
        "name": "real-dag-barrier",
        "engine": engine_url,
        "cohorts": [{"name": "tgt", "bundle": "unused"}],
        "lock": "length",
        "arms": [{"name": "dag"}, {"name": "barrier", "release": "barrier",
                                   "barrier": [{"before": "analyst_a", "after": "analyst_b"}]}],
    } | extra  # fmt: skip


def _reset_supported(url: str) -> bool:
    """Whether the server serves the prefix-cache reset (it is idle here: a reset is harmless)."""
    return httpx.post(f"{url}/reset_prefix_cache", timeout=30).status_code not in (404, 405)


def test_dag_and_barrier_arms_run_drained_and_conformant(
    engine_url: str, short_pair: Loaded
) -> None:
    trace, _ = short_pair
    s = parse_scenario(
        _scenario(engine_url, timeout_s=300, deadlines={"reference": {"factor": 1.5}})
    )
    res = run_scenario(s, prefect=False, loaded={"tgt": short_pair})
    url = parse_engine(engine_url).base_url
    reset = True if _reset_supported(url) else None

    classes = {root_class(r) for r in trace.roots}
    assert set(res.deadlines_s) == classes and all(d > 0 for d in res.deadlines_s.values())
    assert res.reference_state is not None and res.reference_state.startswith("idle; ")
    assert [r.summary.arm for r in res.results] == ["dag", "barrier"]
    recorded = trace.op_index()
    for r in res.results:
        s_ = r.summary
        assert r.drain is not None and r.drain.idle is True
        assert r.drain.prefix_cache_reset is reset and s_.initial_state == r.drain.describe()
        if reset is None:
            assert s_.initial_state.endswith("prefix cache not reset: unsupported by the server")
        assert (s_.num_measured, s_.num_completed) == (len(trace.roots), len(trace.roots))
        assert s_.num_failed_ops == s_.num_incomplete_ops == s_.num_early_releases == 0
        rep = audit(r.run, trace)
        # the work checks of the audit (lateness is a wall-clock figure: reported, not asserted)
        assert rep.completed_ok and not rep.token_mismatches and rep.early_releases_ok
        assert rep.num_ops_checked == len(recorded)
        for op in r.run.trace.ops:
            if op.kind is OpKind.MODEL:
                want = recorded[op.op_id]
                assert (op.num_input_tokens, op.num_output_tokens) == (
                    want.num_input_tokens, want.num_output_tokens), op.op_id  # fmt: skip
    barrier = res.results[1].run.trace
    ops = barrier.op_index()
    edges = barrier.manifest.notes["replay"]["barrier_edges"]
    assert len(edges) == len(trace.roots)
    for src, dst, note in edges:
        assert note == "stage analyst_a -> analyst_b"
        assert ops[dst].times.ready_s >= ops[src].times.completed_s


def test_an_arm_past_its_timeout_ends_with_its_roots_incomplete(
    engine_url: str, native_pair: Loaded
) -> None:
    trace, _ = native_pair
    # 50 ms cannot hold a root of four sequential model calls
    s = parse_scenario(_scenario(engine_url, timeout_s=0.05, arms=[{"name": "dag"}],
                                 deadlines={"classes": {"four_call_selected": 60.0}}))  # fmt: skip
    res = run_scenario(s, prefect=False, loaded={"tgt": native_pair})
    summary = res.results[0].summary
    assert summary.num_measured == len(trace.roots)
    assert summary.num_completed == 0 and summary.num_incomplete_roots == len(trace.roots)
    assert summary.num_incomplete_ops > 0 and summary.attainment == 0.0
    rep = audit(res.results[0].run, trace)
    assert not rep.passed and len(rep.incomplete_ops) == summary.num_incomplete_ops
    # the cut-off requests are aborted: the server drains for the next arm
    assert drain_server(parse_engine(engine_url).base_url).idle is True
