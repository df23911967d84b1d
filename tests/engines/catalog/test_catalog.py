"""Catalog: model numbers, GPU lookup, KV capacity, lifecycle plans, user device files."""

from __future__ import annotations

from pathlib import Path

import pytest

from maserve_prefect.engines.catalog import get_gpu, get_model, list_gpus, list_models
from maserve_prefect.engines.catalog.devices import load_device_file
from maserve_prefect.engines.catalog.lifecycle import (
    ReplicaState,
    load_plan,
    sleep_plan,
    unload_plan,
    wake_plan,
)
from maserve_prefect.engines.catalog.memory import GIB, kv_capacity_bytes, num_gpu_blocks
from maserve_prefect.errors import ConfigError


def test_qwen3_8b_numbers() -> None:
    spec = get_model("Qwen3-8B")
    assert spec.weight_bytes == pytest.approx(16.4e9, rel=0.005)
    assert spec.kv_bytes_per_token == 2 * 36 * 8 * 128 * 2 == 147_456


def test_tied_embeddings_count_once() -> None:
    small = get_model("Qwen3-0.6B")
    embed = small.vocab_size * small.hidden_size
    layers = small.num_layers * small.params_per_layer
    assert small.tie_word_embeddings
    assert small.num_params == embed + layers + small.hidden_size
    big = get_model("Qwen3-8B")
    assert big.num_params == 2 * big.vocab_size * big.hidden_size + 36 * big.params_per_layer + 4096


@pytest.mark.parametrize("alias", ["Qwen3-8B", "qwen3-8b", "Qwen/Qwen3-8B", " QWEN3_8B "])
def test_model_aliases(alias: str) -> None:
    assert get_model(alias) is get_model("Qwen3-8B")


def test_unknown_model_lists_known_names() -> None:
    with pytest.raises(ConfigError, match="Qwen3-14B"):
        get_model("Qwen3-9B")


def test_tp_sharding_of_gemms() -> None:
    spec = get_model("Qwen3-32B")
    full = {g.name: (g.in_dim, g.out_dim) for g in spec.layer_gemms(1)}
    half = {g.name: (g.in_dim, g.out_dim) for g in spec.layer_gemms(2)}
    assert full["qkv"] == (5120, (64 + 16) * 128)
    assert half["qkv"] == (5120, (64 + 16) * 128 // 2)
    assert half["down"] == (25600 // 2, 5120)


def test_gpu_lookup_and_aliases() -> None:
    assert get_gpu("v100").peak_flops == 125e12
    assert get_gpu("RTXPRO6000") is get_gpu("RTX PRO 6000")
    assert {"V100-32GB", "A100-40GB", "A100-80GB", "H100", "H200", "L40S"} <= set(list_gpus())
    with pytest.raises(ConfigError, match=r"known GPUs: V100-32GB.*maserve sim device add"):
        get_gpu("B900")
    assert "Qwen3-32B" in list_models()


def test_kv_capacity() -> None:
    cap = kv_capacity_bytes(get_model("Qwen3-8B"), get_gpu("H100"))
    # 0.9 * 79.6 GiB - 16.4 GB weights - activations/overhead: tens of GiB, well below the total.
    assert 40 * GIB < cap < 0.9 * get_gpu("H100").memory_bytes - get_model("Qwen3-8B").weight_bytes
    with pytest.raises(ConfigError, match=r"Qwen3-32B needs ~65.5 GB.*V100-32GB"):
        kv_capacity_bytes(get_model("Qwen3-32B"), get_gpu("V100-32GB"))
    # Two ranks each hold half the weights, so the pair fits where one GPU does not.
    assert kv_capacity_bytes(get_model("Qwen3-14B"), get_gpu("A100-40GB"), tp=2) > 0
    with pytest.raises(ConfigError):
        kv_capacity_bytes(get_model("Qwen3-8B"), get_gpu("H100"), gpu_memory_utilization=1.5)


def test_num_gpu_blocks_consistent_with_capacity() -> None:
    model, gpu = get_model("Qwen3-0.6B"), get_gpu("V100-32GB")
    blocks = num_gpu_blocks(model, gpu, block_size=16)
    cap = kv_capacity_bytes(model, gpu)
    per_block = 16 * model.kv_bytes_per_token
    assert blocks == cap // per_block
    assert num_gpu_blocks(model, gpu, block_size=32) == cap // (2 * per_block)


def test_lifecycle_plans() -> None:
    model, gpu = get_model("Qwen3-8B"), get_gpu("H100")
    kv = 40 * GIB
    load = load_plan(model, gpu, kv)
    wake1 = wake_plan(model, gpu, kv, level=1)
    wake2 = wake_plan(model, gpu, kv, level=2, source="disk")
    assert wake1.total_s < wake2.total_s < load.total_s
    # Level-1 wake is bounded by weight bytes over the host link (blog: 0.1-6 s).
    assert 0.1 < wake1.total_s < 6
    assert load.peak_gpu_bytes == model.weight_bytes + kv
    assert load.end is ReplicaState.AWAKE
    s1 = sleep_plan(model, gpu, kv, level=1)
    assert s1.phases[-1].gpu_bytes_end == 0
    assert s1.phases[-1].host_bytes_end == model.weight_bytes
    s2 = sleep_plan(model, gpu, kv, level=2)
    assert s2.phases[-1].host_bytes_end == 0
    assert unload_plan(model, kv).phases[0].gpu_bytes_end == 0
    with pytest.raises(ConfigError, match="levels 1 and 2"):
        sleep_plan(model, gpu, kv, level=3)
    with pytest.raises(ConfigError, match="weight source"):
        load_plan(model, gpu, kv, source="tape")


def test_enforce_eager_skips_capture() -> None:
    from maserve_prefect.engines.catalog.lifecycle import LifecycleParams

    model, gpu = get_model("Qwen3-0.6B"), get_gpu("L40S")
    normal = load_plan(model, gpu, GIB)
    eager = load_plan(model, gpu, GIB, params=LifecycleParams(enforce_eager=True))
    p = LifecycleParams()
    assert normal.total_s - eager.total_s == pytest.approx(p.compile_s + p.graph_capture_s)


def test_bad_device_file_names_file(tmp_path: Path) -> None:
    path = tmp_path / "x.yaml"
    path.write_text("name: Mystery\ngpu: {peak_flops: 1e15}\n")
    with pytest.raises(ConfigError, match=r"x\.yaml.*base_gpu"):
        load_device_file(path)
    path.write_text("name: Mine\nbase_gpu: L40S\nefficiency: {linear_mem: -1}\n")
    with pytest.raises(ConfigError, match=r"x\.yaml.*linear_mem"):
        load_device_file(path)
