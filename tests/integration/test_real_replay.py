"""Fixed-work replay of a simulator-recorded trace on the real vLLM, in wall time."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import budgeted_pool
from maserve_prefect.flows.native import run_native

from maserve_prefect.replay.arms import run_scenario
from maserve_prefect.replay.conformance import audit
from maserve_prefect.replay.driver import replay_trace
from maserve_prefect.replay.report import report_scenario
from maserve_prefect.replay.scenario import mooncake_scenario
from maserve_prefect.trace.cas import BlobStore
from maserve_prefect.trace.model import OpKind, OpStatus, Trace


@pytest.fixture(scope="module")
def sim_native() -> tuple[Trace, BlobStore]:
    """A small native trace recorded on the simulator, its outputs within the integration tests'
    budget (the replay re-generates every recorded output token on a CPU core)."""
    run = run_native("four_call_selected", users=2, seed=1, pool=budgeted_pool())
    return run.trace, run.harness.store


@pytest.mark.usefixtures("prefect_api")
@pytest.mark.parametrize("lock", ["length", "token"])
def test_replay_on_vllm_keeps_every_count_exact(
    engine_url: str, sim_native: tuple[Trace, BlobStore], lock: str
) -> None:
    trace, store = sim_native
    run = replay_trace(trace, store, rule="dag", lock=lock, engine=engine_url, timeout_s=300)
    assert run.pool is None and run.num_incomplete_ops == 0 and run.num_failed_ops == 0
    src = trace.op_index()
    models = [op for op in run.trace.ops if op.kind is OpKind.MODEL]
    assert models
    for op in models:
        want = src[op.op_id]
        assert op.status is OpStatus.COMPLETED
        # token-id prompts (synthesized or folded): exact input counts on another tokenizer
        assert op.num_input_tokens == want.num_input_tokens, op.op_id
        assert op.num_output_tokens == want.num_output_tokens, op.op_id
    rep = audit(run, trace)
    assert not rep.token_mismatches and rep.num_early_releases == 0
    assert rep.basis == "engine completion -> release" and rep.num_released == len(trace.ops)
    assert run.trace.manifest.engine == engine_url


def test_mooncake_replay_is_measured_against_the_servers_own_histograms(
    engine_url: str, tmp_path: Path
) -> None:
    rows = [{"timestamp": 40 * i, "input_length": 100 + 30 * i, "output_length": 4,
             "hash_ids": [i]} for i in range(3)]  # fmt: skip
    path = tmp_path / "requests.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    rep = report_scenario(run_scenario(mooncake_scenario(path, engine_url, timeout_s=120),
                                       prefect=False))  # fmt: skip
    table = {(r["source"], r["metric"]): r for r in rep.metric_tables["request latency"]}
    # the server counted this arm's 3 requests: the capability probes ran before the drain
    assert table[("server /metrics", "ttft")]["requests"] == len(rows)
    assert table[("client", "ttft")]["requests"] == len(rows)
    # the client's TTFT runs from its send and contains the server's (arrival to first token)
    assert table[("client - server", "ttft")]["mean_ms"] > 0
    assert rep.conformance[0].num_scheduled == len(rows) and rep.conformance[0].work_ok
