"""Policy arms: specs parse into policies, and an arm wires its hooks onto one replay."""

from __future__ import annotations

import doctest

import pytest

from maserve_prefect.bench.hear import arms
from maserve_prefect.bench.hear.arms import make_pool, parse_arm, run_arm
from maserve_prefect.errors import ConfigError
from maserve_prefect.hear.policies import CacheAware, GuardW
from maserve_prefect.workloads.scbench import generate_scbench


def test_doctests() -> None:
    result = doctest.testmod(arms)
    assert result.attempted > 0 and result.failed == 0


def test_parse_arm_terms() -> None:
    fcfs = parse_arm("f", "fcfs")
    assert fcfs.cache_aware is None and fcfs.guard is None and fcfs.engine_policy == "fcfs"
    plain = parse_arm("s", "session_aware")  # continuation intents alone: the default scheduler
    assert plain.session_aware is not None and plain.engine_policy == "fcfs"
    guarded = parse_arm("g", " cache_aware + guard12.5 ")
    assert isinstance(guarded.cache_aware, CacheAware) and isinstance(guarded.guard, GuardW)
    assert guarded.guard.wait_s == 12.5 and guarded.engine_policy == "priority"
    assert parse_arm("c", "fcfs+cap3").harness_cap == 3  # the ablation, named separately
    with pytest.raises(ConfigError, match="repeats"):
        parse_arm("x", "guard40+guard60")


def test_run_arm_wires_hooks_and_keeps_the_workload() -> None:
    sset = generate_scbench(3, 1, context_tokens=(512, 1024), mean_turns=2, min_turns=2,
                            max_turns=2)  # fmt: skip
    replicas = make_pool("RTX-PRO-6000", "Qwen3-0.6B", 1, 1.0, {})
    run = run_arm(sset, parse_arm("s", "session_aware"), replicas,
                  expect_hash=sset.content_hash())  # fmt: skip
    assert run.result.content_hash == sset.content_hash()
    assert run.result.status_counts() == {"completed": 6}
    assert run.continuation is not None and run.continuation.num_intents == 6
    assert run.ordering.recorder is run.recorder and run.mode_records == []
    assert run.replicas == replicas


def test_run_arm_refuses_engines_that_do_not_run_the_arms_policy() -> None:
    sset = generate_scbench(1, 1, context_tokens=(512, 512), mean_turns=1, min_turns=1,
                            max_turns=1)  # fmt: skip
    fcfs_engine = make_pool("RTX-PRO-6000", "Qwen3-0.6B", 1, 0.0, {})
    with pytest.raises(ConfigError, match="scheduling by 'priority'"):
        run_arm(sset, parse_arm("c", "cache_aware"), fcfs_engine)
