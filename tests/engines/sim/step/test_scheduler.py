"""Scheduler configuration: vLLM's per-device defaults and validation."""

from __future__ import annotations

import pytest

from maserve_prefect.engines.sim.step.scheduler import (
    GIB_BYTES,
    Policy,
    SchedulerConfig,
    default_batch_limits,
)
from maserve_prefect.errors import ConfigError


@pytest.mark.parametrize(
    ("memory_gib", "name", "expected"),
    [
        (80, "NVIDIA H100 80GB HBM3", (8192, 1024)),
        (141, "NVIDIA H200", (8192, 1024)),
        (80, "NVIDIA A100-SXM4-80GB", (2048, 256)),
        (48, "NVIDIA L40S", (2048, 256)),
        (24, "NVIDIA A10G", (2048, 256)),
    ],
)
def test_batch_defaults_follow_vllm_device_classes(
    memory_gib: int, name: str, expected: tuple[int, int]
) -> None:
    assert default_batch_limits(memory_gib * GIB_BYTES, name) == expected


def test_config_defaults_and_for_device() -> None:
    cfg = SchedulerConfig()
    assert (cfg.block_size, cfg.enable_prefix_caching, cfg.long_prefill_token_threshold) == (
        16,
        True,
        0,
    )
    assert cfg.policy is Policy.FCFS
    big = SchedulerConfig.for_device(80 * GIB_BYTES, "H100", policy=Policy.PRIORITY)
    assert (big.max_num_batched_tokens, big.max_num_seqs, big.policy) == (
        8192,
        1024,
        Policy.PRIORITY,
    )
    assert SchedulerConfig.for_device(80 * GIB_BYTES, "H100", max_num_seqs=8).max_num_seqs == 8


@pytest.mark.parametrize(
    "kwargs", [{"block_size": 0}, {"max_num_seqs": 0}, {"long_prefill_token_threshold": -1}]
)
def test_bad_config_is_refused(kwargs: dict[str, int]) -> None:
    with pytest.raises(ConfigError):
        SchedulerConfig(**kwargs)  # type: ignore[arg-type]
