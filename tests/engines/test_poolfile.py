"""Pool files: the shipped default loads and places; bad files name the file and the problem."""

from __future__ import annotations

from pathlib import Path

import pytest

from maserve_prefect.clock.kernel import Kernel
from maserve_prefect.engines.poolfile import (
    DEFAULT_POOL,
    build_sim_pool,
    default_pool_file,
    load_pool_file,
)
from maserve_prefect.errors import ConfigError


def test_default_pool_loads_every_placement_warm() -> None:
    pool_file = default_pool_file()
    kernel = Kernel()
    pool = build_sim_pool(pool_file, kernel)
    assert len(pool.replicas()) == len(pool_file.placements)
    assert kernel.now() > 0  # loads took (virtual) time before the pool is handed over
    assert pool_file.resolve("some-spec-name") == pool_file.default


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("- just\n- a list\n", "expected a mapping"),
        ("devices: [H100:0]\n  bad: [\n", "not valid YAML: line 2"),
        (
            "devices: [H100:0]\ndeployments: [{name: m, model: Qwen3-8B}]\n"
            "placements: [{deployment: m, device: H100:9}]\n",
            "unknown device 'H100:9'",
        ),
    ],
)
def test_bad_pool_file_names_file_and_problem(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "pool.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError, match=message) as info:
        load_pool_file(path)
    assert str(path) in str(info.value)


def test_host_kv_tier_from_a_pool_file() -> None:
    from maserve_prefect.clock.kernel import Kernel
    from maserve_prefect.engines.poolfile import PoolFile, build_sim_pool

    pf = PoolFile.model_validate(
        {
            "devices": ["H100:0", "H100:1"],
            "deployments": [
                {"name": "main", "model": "Qwen3-0.6B", "host_kv_gib": 4},
                {"name": "side", "model": "Qwen3-0.6B"},
            ],
            "placements": [
                {"deployment": "main", "device": "H100:0"},
                {"deployment": "side", "device": "H100:1"},
            ],
            "default": "main",
        }
    )
    pool = build_sim_pool(pf, Kernel())
    caps = {r.deployment: r.hear_capabilities() for r in pool.replicas()}
    assert len(caps["main"].kv_tiers) == 2 and len(caps["side"].kv_tiers) == 1


def test_paper_serving_setup_reaches_the_simulated_replica() -> None:
    """MAServeBench's serving setup (§C: request limit 128, prefix caching off, 8,192 max model
    length and batched tokens, Qwen3-8B on one Ascend 910C) set in the shared pool file is the
    replica's scheduler configuration, and its prefix cache never hashes."""
    pf = load_pool_file(
        Path(__file__).parents[2] / "deployments/suites/scenarios/pool_910c_qwen3_8b.yaml"
    )
    pool = build_sim_pool(pf, Kernel())
    (replica,) = pool.replicas()
    cfg = replica.config
    assert (cfg.max_num_seqs, cfg.max_model_len, cfg.max_num_batched_tokens) == (128, 8192, 8192)
    assert cfg.enable_prefix_caching is False
    assert replica.capabilities().prefix_caching is False


def test_every_shipped_pool_file_still_loads() -> None:
    root = Path(__file__).parents[2]
    found = [
        p
        for p in [*sorted((root / "deployments").rglob("*.yaml")), DEFAULT_POOL]
        if "placements:" in p.read_text()
    ]
    assert found
    for path in found:
        pf = load_pool_file(path)
        assert pf.devices and pf.placements and not pf.is_fleet_only


FLEET = (
    "deployments:\n"
    "  - name: main\n    model: Qwen3-8B\n"
    "    replicas: ['http://u:secret@10.0.0.1:8000/v1', 'http://10.0.0.2:8000#qwen']\n"
    "  - {name: small, model: Qwen3-0.6B, replicas: http://10.0.0.3:8000}\n"
    "default: main\n"
)


def test_a_fleet_pool_file_lists_endpoints_per_deployment_redacted(tmp_path: Path) -> None:
    path = tmp_path / "fleet.yaml"
    path.write_text(FLEET)
    pf = load_pool_file(path)
    main, small = pf.deployments
    assert main.replicas == ("http://***@10.0.0.1:8000", "http://10.0.0.2:8000#qwen")
    assert small.replicas == ("http://10.0.0.3:8000",)  # one URL is a list of one
    first = main.endpoints()[0]
    assert (first.base_url, first.basic_auth) == ("http://10.0.0.1:8000", ("u", "secret"))
    assert main.endpoints()[1].model == "qwen"
    assert "secret" not in pf.model_dump_json()
    assert pf.is_fleet_only
    with pytest.raises(ConfigError, match=r"lists no devices, only endpoints: run it with"):
        build_sim_pool(pf, Kernel())


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (
            FLEET.replace("http://10.0.0.3:8000", "http://10.0.0.2:8000/v1/"),
            "deployment small: endpoint http://10.0.0.2:8000 is listed twice "
            r"\(also under deployment main\)",
        ),
        (FLEET.replace("http://10.0.0.3:8000", "ftp://x"), "deployment small: replicas: endpoint 'ftp://x': expected http://HOST:PORT"),
        (
            FLEET.replace("  - {name: small, model: Qwen3-0.6B, replicas: http://10.0.0.3:8000}\n",
                          "  - {name: small, model: Qwen3-0.6B}\n"),
            "devices: give at least one",
        ),
    ],
)  # fmt: skip
def test_bad_fleet_pool_files_are_one_line_naming_the_file(
    tmp_path: Path, text: str, message: str
) -> None:
    path = tmp_path / "pool.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError, match=message) as info:
        load_pool_file(path)
    assert str(info.value).startswith(f"pool file {path}: ") and "\n" not in str(info.value)


def test_fleet_is_an_engine_target_for_native_runs_only() -> None:
    from maserve_prefect.engines.target import parse_engine, parse_single_engine
    from maserve_prefect.errors import UnsupportedError

    target = parse_engine("fleet")
    assert target.is_fleet and not target.is_sim and str(target) == "fleet"
    with pytest.raises(ConfigError, match="give each endpoint its own `\\?api_key_env=NAME`"):
        target.with_api_key_env("KEY")
    with pytest.raises(UnsupportedError, match="--engine fleet: maserve replay runs on 'sim'"):
        parse_single_engine("fleet", "maserve replay")
    assert parse_single_engine("openai:http://h:1", "maserve replay").kind == "openai"
