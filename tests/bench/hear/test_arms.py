"""Policy arms: specs parse into policies, and an arm wires its hooks onto one replay."""

from __future__ import annotations

import doctest

from maserve_prefect.bench.hear import arms
from maserve_prefect.bench.hear.arms import make_pool, parse_arm, run_arm
from maserve_prefect.hear.policies import CacheAware, Composed, Fcfs, GuardW
from maserve_prefect.workloads.scbench import generate_scbench


def test_doctests() -> None:
    result = doctest.testmod(arms)
    assert result.attempted > 0 and result.failed == 0


def test_parse_arm_terms() -> None:
    assert parse_arm("f", "fcfs").order.name == "fcfs"
    plain = parse_arm("s", "session_aware")  # retention alone orders FCFS
    assert isinstance(plain.order, Fcfs) and plain.retention is not None
    guarded = parse_arm("g", " cache_aware + guard12.5 ")
    assert isinstance(guarded.order, Composed) and guarded.retention is None
    assert {type(p) for p in guarded.order.policies} == {CacheAware, GuardW}
    assert [p.wait_s for p in guarded.order.policies if isinstance(p, GuardW)] == [12.5]


def test_run_arm_wires_hooks_and_keeps_the_workload() -> None:
    sset = generate_scbench(3, 1, context_tokens=(512, 1024), mean_turns=2, min_turns=2,
                            max_turns=2)  # fmt: skip
    replicas = make_pool("RTX-PRO-6000", "Qwen3-0.6B", 1, 1.0, {})
    run = run_arm(sset, parse_arm("s", "session_aware"), replicas, max_in_flight=2,
                  expect_hash=sset.content_hash())  # fmt: skip
    assert run.result.content_hash == sset.content_hash()
    assert run.result.status_counts() == {"completed": 6}
    assert run.retention_hook is not None and run.retention_hook.num_retains > 0
    assert run.order_hook.recorder is run.recorder and run.mode_records == []
    assert run.replicas == replicas
