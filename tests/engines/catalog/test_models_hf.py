"""Models from Hugging Face config.json: parsing, the shipped set, MoE memory and compute,
`maserve sim model add` round trip."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest
from hf_fixtures import MIXTRAL_8X7B, PUBLISHED, QWEN3_30B_A3B, write_config
from typer.testing import CliRunner

from maserve_prefect.cli import _mount, app
from maserve_prefect.engines.catalog import get_gpu, get_model, list_models
from maserve_prefect.engines.catalog.hf_config import spec_from_hf_config
from maserve_prefect.engines.catalog.memory import kv_capacity_bytes
from maserve_prefect.engines.catalog.models import MODELS
from maserve_prefect.engines.sim.cost.roofline import experts_touched
from maserve_prefect.engines.sim.cost.step_cost import ScheduledChunk
from maserve_prefect.engines.sim.cost.step_time import RooflineStepModel, make_step_model
from maserve_prefect.errors import ConfigError

runner = CliRunner()
_mount()


@pytest.mark.parametrize("key", sorted(PUBLISHED))
def test_config_json_gives_published_sizes_and_the_shipped_entry(key: str) -> None:
    cfg, shipped, total_b, active_b = PUBLISHED[key]
    spec = spec_from_hf_config(cfg, shipped, "config.json")
    assert spec.num_params / 1e9 == pytest.approx(total_b, rel=0.02)
    assert spec.active_params / 1e9 == pytest.approx(active_b, rel=0.02)
    # the shipped entry is the same architecture (only names differ)
    assert dataclasses.replace(get_model(shipped), aliases=()) == spec


@pytest.mark.parametrize("name", [m.name for m in MODELS])
def test_every_shipped_model_predicts_a_step(name: str) -> None:
    spec = get_model(name)
    step = make_step_model(name, "H200")
    mixed = step.step_cost([ScheduledChunk(1, 2000), ScheduledChunk(256, 0)])
    assert mixed.total_s > step.decode_affine(1).step_s(2000) > 0
    assert spec.kv_bytes_per_token > 0 and spec.weight_bytes > 0


def test_seed_and_profile_models_are_shipped() -> None:
    names = set(list_models())
    profiled = {"Llama-2-7B", "Meta-Llama-3-8B", "CodeLlama-34B", "InternLM-20B", "Phi-2"}
    profiled |= {"Llama-3.1-8B", "Qwen3-32B"}
    seeds = {"Qwen3-0.6B", "Qwen3-1.7B", "Qwen3-4B", "Qwen3-8B", "Qwen3-14B"}
    big = {"Llama-2-70B", "Llama-3-70B", "Qwen2.5-72B", "Qwen-72B"}
    assert profiled | seeds | big <= names
    assert get_model("Qwen3-4B-Instruct-2507") is get_model("Qwen3-4B")
    assert get_model("meta-llama/Llama-2-70b-hf").name == "Llama-2-70B"


def test_moe_memory_holds_every_expert_compute_uses_the_routed_ones() -> None:
    moe = get_model("Mixtral-8x7B")
    expert = sum(g.in_dim * g.out_dim for g in moe.expert_gemms(1))
    assert expert == 3 * 4096 * 14336
    routed_out = moe.num_layers * (moe.num_experts - moe.num_experts_per_tok) * expert
    assert moe.num_params - moe.active_params == routed_out
    # memory: 93 GB of weights do not fit one 80 GB H100, though the active 26 GB would
    with pytest.raises(ConfigError, match=r"Mixtral-8x7B needs ~93\.4 GB"):
        kv_capacity_bytes(moe, get_gpu("H100"))
    assert kv_capacity_bytes(moe, get_gpu("H100"), tp=2) > 0
    # FLOPs per token: the GEMM shapes carry the active width
    flops = sum(g.flops_per_token for g in moe.layer_gemms(1))
    assert flops == 2 * (moe.active_params_per_layer - 2 * moe.hidden_size)


def _dense_twin(width: int) -> RooflineStepModel:
    """A dense model with Mixtral's attention and an MLP of `width` (same device)."""
    moe = get_model("Mixtral-8x7B")
    dense = dataclasses.replace(moe, name="twin", num_experts=0, num_experts_per_tok=0,
                                intermediate_size=width)  # fmt: skip
    step = make_step_model("Mixtral-8x7B", "H100")
    return RooflineStepModel(dense, step.gpu, step.eff)


def test_moe_step_reads_the_touched_experts_only() -> None:
    assert experts_touched(1.0, 128, 8) == pytest.approx(8.0)
    assert experts_touched(4096.0, 128, 8) == pytest.approx(128.0)
    moe = make_step_model("Mixtral-8x7B", "H100")
    active = _dense_twin(2 * 14336)  # two experts' width: the routed compute of one token
    every = _dense_twin(8 * 14336)  # all eight experts' width: the weights memory holds
    one = moe.step_cost([ScheduledChunk(1, 100)]).linear_s
    # one decode token reads 2 experts: like the active-width twin, far below all experts
    assert one == pytest.approx(active.step_cost([ScheduledChunk(1, 100)]).linear_s, rel=0.05)
    assert one < 0.4 * every.step_cost([ScheduledChunk(1, 100)]).linear_s
    # 64 decodes touch nearly every expert: weight reads approach the all-expert twin's
    many = [ScheduledChunk(1, 100)] * 64
    assert moe.step_cost(many).linear_s > 0.9 * every.step_cost(many).linear_s
    # a long prefill is compute-bound on the routed rows: close to the active twin
    long = [ScheduledChunk(8192, 0)]
    assert moe.step_cost(long).linear_s == pytest.approx(active.step_cost(long).linear_s, rel=0.1)


def test_model_add_round_trip(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MASERVE_HOME", str(tmp_path / "home"))
    cfg = write_config(tmp_path, {**QWEN3_30B_A3B, "rope_scaling": {"type": "yarn"}})
    result = runner.invoke(app, ["sim", "model", "add", str(cfg), "--name", "my-moe",
                                 "--alias", "org/my-moe"])  # fmt: skip
    assert result.exit_code == 0, result.output
    assert "MoE 8/128 experts" in result.output
    spec = get_model("ORG/my-moe")
    assert spec == spec_from_hf_config(QWEN3_30B_A3B, "my-moe", "x", ("org/my-moe",))
    assert "my-moe" in list_models()
    listed = runner.invoke(app, ["sim", "model", "list"])
    assert listed.exit_code == 0 and "my-moe" in listed.output and "8/128" in listed.output
    assert make_step_model("my-moe", "B200").decode_affine(4).num_seqs == 4
    again = runner.invoke(app, ["sim", "model", "add", str(cfg), "--name", "my-moe"])
    assert again.exit_code == 1 and "--force" in again.output
    forced = runner.invoke(app, ["sim", "model", "add", str(cfg), "--name", "my-moe", "--force"])
    assert forced.exit_code == 0, forced.output


@pytest.mark.parametrize(
    ("cfg", "message"),
    [
        ({"model_type": "bert"}, "model_type 'bert' is not supported"),
        ({**MIXTRAL_8X7B, "num_local_experts": 0}, "num_local_experts=0 must be a positive"),
        ({**QWEN3_30B_A3B, "mlp_only_layers": [0]}, "mixed dense / MoE layers"),
        ({**MIXTRAL_8X7B, "quantization_config": {"quant_method": "awq"}}, "quantized"),
        ({k: v for k, v in MIXTRAL_8X7B.items() if k != "hidden_size"}, "missing 'hidden_size'"),
        ({**MIXTRAL_8X7B, "hidden_size": 4095, "head_dim": None}, "missing 'head_dim'"),
    ],
)
def test_model_add_errors_are_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, cfg: dict[str, Any], message: str
) -> None:
    monkeypatch.setenv("MASERVE_HOME", str(tmp_path / "home"))
    path = write_config(tmp_path, cfg)
    result = runner.invoke(app, ["sim", "model", "add", str(path), "--name", "m"])
    assert result.exit_code == 1
    assert message in result.output and "Traceback" not in result.output
    assert result.output.strip().count("\n") <= 1  # one line (rich may wrap once)
    assert not (tmp_path / "home" / "models").exists() or not any(
        (tmp_path / "home" / "models").iterdir()
    )


def test_model_add_refuses_builtin_names_and_bad_json(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("MASERVE_HOME", str(tmp_path / "home"))
    cfg = write_config(tmp_path, MIXTRAL_8X7B)
    result = runner.invoke(app, ["sim", "model", "add", str(cfg), "--name", "qwen3-8b"])
    assert result.exit_code == 1 and "already a built-in model: Qwen3-8B" in result.output
    bad = tmp_path / "bad.json"
    bad.write_text('{"model_type": "llama",\n')
    result = runner.invoke(app, ["sim", "model", "add", str(bad), "--name", "x"])
    assert result.exit_code == 1 and "bad.json:2: not valid JSON" in result.output


def test_unknown_model_says_how_to_add_one() -> None:
    with pytest.raises(ConfigError, match=r"unknown model 'Foo-9B'.*maserve sim model add"):
        get_model("Foo-9B")


def test_shipped_model_file_parses_as_json_configs() -> None:
    # every shipped entry is plain config.json content: it round-trips through JSON unchanged
    import yaml

    from maserve_prefect.engines.catalog.models import models_path

    for entry in yaml.safe_load(models_path().read_text()):
        assert json.loads(json.dumps(entry["config"])) == entry["config"]
        assert entry["source"]


def test_null_keys_take_their_defaults() -> None:
    # phi-2's config.json writes num_key_value_heads: null (MHA); head_dim may be null too
    phi = {"model_type": "phi", "hidden_size": 2560, "num_hidden_layers": 32,
           "num_attention_heads": 32, "num_key_value_heads": None, "head_dim": None,
           "intermediate_size": 10240, "vocab_size": 51200, "max_position_embeddings": 2048,
           "tie_word_embeddings": False}  # fmt: skip
    spec = spec_from_hf_config(phi, "Phi-2", "config.json", ("microsoft/phi-2",))
    assert spec == get_model("Phi-2")
