"""A fleet of two real vLLM servers, one killed mid-run: every root finishes on the other.

Two CPU vLLM servers of the tiny model (each pinned to its own core) are the two endpoints of one
deployment in a pool file; a native run of 6 `fork_join` roots (`--engine fleet`) places on both
by least-outstanding.
Once a few ops are recorded one server is SIGKILLed: its in-flight ops fail as attempts, the
fleet marks it dead and the dispatcher places them again on the survivor, where they finish as
attempt + 1. Nothing recorded before the kill is lost from the ledger.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from conftest import server_config
from maserve_prefect.flows.native import NativeRun, run_native

from maserve_prefect.engines.openai.fleet import Fleet, FleetOptions, endpoint_name
from maserve_prefect.engines.poolfile import load_pool_file
from maserve_prefect.engines.vllm.server import VLLMServer
from maserve_prefect.trace.cas import ContentStore
from maserve_prefect.trace.ledger import Ledger
from maserve_prefect.trace.model import OpKind, OpStatus

ROOTS = 6
OPS_BEFORE_KILL = 4
OUTPUT_BUDGET = 192


@pytest.fixture
def two_servers(vllm_python: Path, tiny_model: Path, tmp_path: Path) -> Iterator[list[VLLMServer]]:
    """Two servers of their own, started together, each on its own core; the test kills one."""
    servers = [
        VLLMServer(server_config(tiny_model, cpus=str(i)), vllm_python, tmp_path / f"s{i}.log")
        for i in range(2)
    ]
    try:
        for s in servers:
            s.start()
        loads = [s.wait_healthy(timeout_s=300) for s in servers]
        print(f"fleet: both servers healthy {max(loads):.0f} s after spawn")  # `pytest -s`
        yield servers
    finally:
        for s in servers:
            s.stop()


@pytest.mark.usefixtures("prefect_api")
def test_killed_endpoint_is_rerouted_and_every_root_finishes(
    two_servers: list[VLLMServer], tmp_path: Path
) -> None:
    doomed, survivor = two_servers
    pool_path = tmp_path / "fleet.yaml"
    pool_path.write_text(
        yaml.safe_dump(
            {
                "deployments": [
                    {
                        "name": "main",
                        "model": "Qwen3-0.6B",
                        "replicas": [f"{doomed.url}#tiny", f"{survivor.url}#tiny"],
                        # The binding's paper-length outputs (~2,600 tokens a call) took 8.5 min
                        # on one loaded CPU core and ran past the join timeout (CI); the test
                        # is about failover, so every call gets a short output budget.
                        "max_tokens": OUTPUT_BUDGET,
                    }
                ],
                "default": "main",
            }
        )
    )
    ledger = Ledger(f"sqlite:///{tmp_path / 'ledger.db'}", ContentStore(tmp_path / "cas"))
    tid = "fleet-killed-mid-run"
    box: list[NativeRun] = []
    errors: list[BaseException] = []
    # no heartbeat: on a shared 2-core machine a slow answer must not mark the survivor dead;
    # the killed server's cut streams and refused connections mark it dead
    options = FleetOptions(heartbeat_s=None, probe_first_s=0.5, probe_max_s=2.0)

    def body() -> None:
        try:
            box.append(
                run_native(
                    "fork_join", users=ROOTS, seed=2, ledger=ledger, trace_id=tid,
                    pool=load_pool_file(pool_path), engine="fleet", plan="least-outstanding",
                    fleet_options=options,
                )
            )  # fmt: skip
        except BaseException as exc:  # reported below
            errors.append(exc)

    runner = threading.Thread(target=body, name="fleet-run")
    start_s = time.monotonic()
    runner.start()
    before: list = []
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline and runner.is_alive():
        try:
            before = ledger.load_trace(tid).ops
        except Exception:  # the run row may not exist yet
            before = []
        if len(before) >= OPS_BEFORE_KILL:
            break
        time.sleep(0.05)
    assert len(before) >= OPS_BEFORE_KILL, f"the run finished or stalled before the kill {errors}"
    doomed.kill()
    runner.join(timeout=400)
    assert not runner.is_alive() and not errors, errors
    run_s = time.monotonic() - start_s
    run = box[0]

    # Every root finished, on the survivor.
    assert len(run.roots) == ROOTS and [r.error for r in run.roots] == [None] * ROOTS
    dispatcher = run.harness.dispatcher
    assert dispatcher is not None
    fleet = dispatcher.failover
    assert isinstance(fleet, Fleet)
    dead_name = endpoint_name("main", doomed.url)
    assert (dead_name, "dead") in [(name, what) for name, what, _ in fleet.log]
    assert (dead_name, "live") not in [(name, what) for name, what, _ in fleet.log]
    assert dispatcher.stats.num_rerouted >= 1

    after = ledger.load_trace(tid)
    # Nothing recorded is lost: every op (attempt) seen before the kill is intact, and the
    # ledger holds exactly the run's records.
    recorded = {(op.op_id, op.attempt): op for op in after.ops}
    for op in before:
        assert recorded[(op.op_id, op.attempt)] == op
    assert sorted(recorded) == sorted((op.op_id, op.attempt) for op in run.trace.ops)
    # Each op's last attempt completed; an op that lost its endpoint recorded a failed attempt
    # naming it, and the retry as attempt + 1.
    models = [op for op in after.ops if op.kind is OpKind.MODEL]
    by_op: dict[str, list] = {}
    for op in models:
        by_op.setdefault(op.op_id, []).append(op)
    for attempts in by_op.values():
        attempts.sort(key=lambda op: op.attempt)
        assert [op.attempt for op in attempts] == list(range(1, len(attempts) + 1))
        assert attempts[-1].status is OpStatus.COMPLETED
        assert all(op.status is OpStatus.FAILED for op in attempts[:-1])
    failed = [op for op in models if op.status is OpStatus.FAILED]
    assert failed, "no attempt was lost with the killed server"
    assert all(op.error and dead_name in op.error for op in failed)
    assert all(len(by_op[op.op_id]) >= 2 for op in failed)
    print(  # the figures the README quotes (`pytest -s`)
        f"fleet: {ROOTS} roots, {len(by_op)} model ops, {len(failed)} failed attempts on "
        f"{dead_name}, {dispatcher.stats.num_rerouted} re-placements; run {run_s:.0f} s"
    )
