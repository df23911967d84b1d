"""Calibration against the shared real profiles: loaders, fit quality on held-out data, CLI."""

from __future__ import annotations

from pathlib import Path

import pytest
import typer
import yaml
from typer.testing import CliRunner

from maserve_prefect.cli import sim_cmd
from maserve_prefect.engines.catalog import get_gpu, list_gpus
from maserve_prefect.engines.catalog.gpus import GpuSpec, builtin_gpu
from maserve_prefect.engines.sim.cost.calibrate import (
    WapeTable,
    leave_one_device_out,
    leave_one_model_out,
    unfitted,
)
from maserve_prefect.engines.sim.cost.profiles import ProfileSet, load_profiles
from maserve_prefect.engines.sim.cost.step_time import make_step_model
from maserve_prefect.errors import ConfigError


def _gpu(name: str) -> GpuSpec:
    gpu = builtin_gpu(name)
    assert gpu is not None
    return gpu


@pytest.fixture(scope="module")
def sets(shared_data: Path) -> list[ProfileSet]:
    return load_profiles(shared_data / "profiles").sets


def _dense_wape(table: WapeTable, device: str) -> float:
    err = sum(table.abs_err.get((device, g), 0.0) for g in ("linear", "elementwise"))
    tot = sum(table.meas.get((device, g), 0.0) for g in ("linear", "elementwise"))
    return err / tot


def test_loader_reads_both_formats(sets: list[ProfileSet]) -> None:
    devices = {s.device for s in sets}
    assert devices == {"A100-80GB", "H100", "RTX PRO 6000"}
    vidur = [s for s in sets if s.device == "A100-80GB" and s.model.name == "Llama-2-7B"]
    assert {s.tp for s in vidur} == {1, 2, 4, 8}
    attn = [s for s in sets if s.op == "attention"]
    assert len(attn) == 2 and attn[0].x.shape[1] == 4
    # Vidur milliseconds and LLMServingSim microseconds both end up in seconds.
    lm_head = next(s for s in sets if s.op == "lm_head" and s.model.name == "Llama-3.1-8B")
    assert 1e-4 < lm_head.seconds[0] < 1e-2


def test_fit_beats_unfitted_on_held_out_models(sets: list[ProfileSet]) -> None:
    held = leave_one_model_out(sets, _gpu)
    base = unfitted(sets, _gpu)
    for device in ("A100-80GB", "H100", "RTX PRO 6000"):
        assert _dense_wape(held, device) < _dense_wape(base, device), device
    # Linear layers carry most of a step; on held-out models they stay within the 8% goal.
    for device in ("A100-80GB", "H100", "RTX PRO 6000"):
        wape = held.wape(device, "linear")
        assert wape is not None and wape < 0.08, (device, wape)


def test_leave_one_device_out_scores_only_measured_groups(sets: list[ProfileSet]) -> None:
    table = leave_one_device_out(sets, _gpu)
    # Attention was measured on RTX PRO 6000 only, so no other device can predict it.
    assert table.wape("RTX PRO 6000", "attention") is None
    linear = table.wape("RTX PRO 6000", "linear")
    assert linear is not None and linear < unfitted(sets, _gpu).wape("RTX PRO 6000", "linear")  # type: ignore[operator]


def test_datacenter_gpus_transfer_within_the_goal(sets: list[ProfileSet]) -> None:
    # an A100 or H100 scored with factors fitted on the other devices only (issue 17: < 10 %)
    table = leave_one_device_out(sets, _gpu)
    for device in ("A100-80GB", "H100"):
        wape = table.wape(device)
        assert wape is not None and wape < 0.10, (device, wape)
    # vLLM's fused kernels were measured on RTX PRO 6000 only: never scored elsewhere
    assert table.wape("A100-80GB", "op:add_norm") is None
    assert table.wape("RTX PRO 6000", "op:add_norm") is None


def test_loader_errors(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="does not exist"):
        load_profiles(tmp_path / "nope")
    with pytest.raises(ConfigError, match="no profiles found"):
        load_profiles(tmp_path)
    bad = tmp_path / "a100" / "Llama-2-7b-hf"
    bad.mkdir(parents=True)
    (bad / "mlp.csv").write_text(
        "time_stats.mlp_up_proj.median,n_head,n_kv_head,n_embd,n_expanded_embd,vocab_size,"
        "use_gated_mlp,num_tokens,num_tensor_parallel_workers\n0.1,32,32,4096,999,32000,True,1,1\n"
    )
    with pytest.raises(ConfigError, match=r"mlp\.csv:2: shape columns"):
        load_profiles(tmp_path)


def test_calibrate_cli_writes_loadable_entry(
    shared_data: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("MASERVE_HOME", str(tmp_path))
    profiles = shared_data / "profiles" / "llmservingsim" / "RTXPRO6000"
    root = typer.Typer()
    root.add_typer(sim_cmd.app, name="sim")
    result = CliRunner().invoke(
        root,
        ["sim", "calibrate", str(profiles), "--gpu", "Lab Card", "--base-gpu", "RTX PRO 6000"],
    )
    assert result.exit_code == 0, result.output
    path = tmp_path / "devices" / "Lab-Card.yaml"
    doc = yaml.safe_load(path.read_text())
    assert doc["base_gpu"] == "RTX PRO 6000" and doc["fit"]["models"] == [
        "Llama-3.1-8B",
        "Qwen3-32B",
    ]
    assert "Lab Card" in list_gpus()
    assert get_gpu("lab card").mem_bw_bytes_s == get_gpu("RTX PRO 6000").mem_bw_bytes_s
    fitted = make_step_model("Qwen3-8B", "Lab Card")
    assert fitted.eff.linear_mem == pytest.approx(doc["efficiency"]["linear_mem"])
    result = CliRunner().invoke(root, ["sim", "calibrate", str(profiles), "--gpu", "Nowhere"])
    # one red line, exit 1, no traceback
    assert result.exit_code == 1 and isinstance(result.exception, SystemExit)
    assert "'Nowhere' has no datasheet" in result.output and "Traceback" not in result.output
