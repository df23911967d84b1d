"""Pool-executor inputs: workflows and options are frozen values with documented defaults."""

from __future__ import annotations

import dataclasses

import pytest

from maserve_prefect.pool.inputs import GIB, REVEAL_MODES, ExecOptions, RootDag
from maserve_prefect.pool.window import WorkUnit


def test_defaults_are_the_full_joint_runtime() -> None:
    opts = ExecOptions()
    assert (opts.fusion, opts.prefetch, opts.coalesce) == (True, True, True)
    assert opts.reveal == REVEAL_MODES[0] == "arrival"
    assert opts.warm == () and opts.requests is None


def test_default_replicas_are_sized_as_vllm_sizes_them() -> None:
    """One replica per GPU at vLLM's 0.9, KV from the memory model; co-location is explicit."""
    opts = ExecOptions()
    assert (opts.gpu_memory_utilization, opts.kv_cache_bytes) == (0.9, None)
    dep = opts.deployment("Qwen3-8B")
    assert (dep.gpu_memory_utilization, dep.kv_cache_bytes) == (0.9, None)
    colo = ExecOptions.colocated()
    assert colo.kv_cache_bytes == 2 * GIB
    assert colo.deployment("Qwen3-14B").kv_cache_bytes == 2 * GIB


def test_inputs_are_frozen() -> None:
    wf = RootDag("r", 0.0, (WorkUnit("r/a", "r", "Qwen3-0.6B", 10, 2),))
    with pytest.raises(dataclasses.FrozenInstanceError):
        wf.arrival_s = 1.0  # type: ignore[misc]
    with pytest.raises(dataclasses.FrozenInstanceError):
        ExecOptions().reveal = "released"  # type: ignore[misc]
