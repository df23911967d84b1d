"""Device datasheets: every built-in entry loads, has a source and predicts; user datasheets
via `maserve sim device add`; calibration from profiles; unknown devices are one-line errors."""

from __future__ import annotations

import importlib.util
import shutil
from pathlib import Path
from types import ModuleType

import pytest
import yaml
from typer.testing import CliRunner

from maserve_prefect.cli import _mount, app
from maserve_prefect.engines.catalog import get_device, get_gpu, list_gpus
from maserve_prefect.engines.catalog.datasheet import parse_datasheet
from maserve_prefect.engines.catalog.gpus import GPUS, builtin_gpu
from maserve_prefect.engines.catalog.memory import num_gpu_blocks
from maserve_prefect.engines.catalog.models import get_model
from maserve_prefect.engines.sim.cost.roofline import attention_tile_m
from maserve_prefect.engines.sim.cost.step_cost import ScheduledChunk
from maserve_prefect.engines.sim.cost.step_time import make_step_model
from maserve_prefect.errors import ConfigError

runner = CliRunner()
_mount()

ISSUE_DEVICES = (
    "V100-16GB", "V100-32GB", "T4", "A10", "A40", "L4", "L40S", "A100-40GB", "A100-80GB",
    "H100 SXM", "H100 PCIe", "H200", "B200", "RTX 3090", "RTX 4090", "RTX 5090", "RTX PRO 5000",
    "RTX PRO 6000", "MI300X", "Ascend 910C",
)  # fmt: skip
SHEET = {
    "name": "Lab Card", "aliases": ["labcard"], "memory_mib": 24576, "bf16_tflops": 100.0,
    "mem_bw_gb_s": 900, "num_sms": 80, "l2_mib": 32, "arch": "sm89", "source": "our bench",
}  # fmt: skip


@pytest.mark.parametrize("name", ISSUE_DEVICES)
def test_issue_devices_are_catalogued(name: str) -> None:
    assert builtin_gpu(name) is not None, name


@pytest.mark.parametrize("gpu", GPUS, ids=lambda g: g.name)
def test_every_entry_loads_names_its_source_and_predicts(gpu: object) -> None:
    spec = get_device(gpu.name).gpu  # type: ignore[attr-defined]
    assert len(spec.source) > 20 and spec.arch
    assert spec.peak_flops > 1e13 and spec.mem_bw_bytes_s > 1e11 and spec.memory_bytes > 2**33
    assert 1e10 <= spec.host_link_bytes_s <= spec.interconnect_bytes_s
    step = make_step_model("Qwen3-0.6B", spec.name)
    decode = step.decode_affine(8).step_s(8 * 1000)
    mixed = step.step_cost([ScheduledChunk(1, 1000)] * 7 + [ScheduledChunk(512, 0)]).total_s
    assert 0 < decode < mixed < 1.0
    assert num_gpu_blocks(get_model("Qwen3-0.6B"), spec) > 1000


def test_faster_datasheet_predicts_faster_steps() -> None:
    chunk = [ScheduledChunk(2048, 0)]
    times = {g: make_step_model("Qwen3-8B", g).step_cost(chunk).linear_s for g in ("T4", "H100")}
    assert times["H100"] < times["T4"] / 5


def test_attention_tiles_follow_the_architecture() -> None:
    assert {attention_tile_m(get_gpu(g)) for g in ("L40S", "RTX 4090", "A10", "RTX 5090")} == {64}
    assert {attention_tile_m(get_gpu(g)) for g in ("A100", "H100", "B200", "MI300X")} == {128}


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"bf16_tflops": None}, "give bf16_tflops or fp16_tflops"),
        ({"mem_bw_gb_s": -5}, "mem_bw_gb_s=-5 must be > 0"),
        ({"num_sms": 80.5}, "num_sms=80.5 must be a whole number"),
        ({"l2_mb": 3}, "unknown fields ['l2_mb']"),
        ({"interconnect": "nvlink"}, "interconnect nvlink needs interconnect_gb_s"),
        ({"host_link": "pcie9"}, "host_link='pcie9'"),
        ({"memory_mib": "lots"}, "memory_mib='lots' is not a number"),
    ],
)
def test_bad_datasheet_is_one_line_naming_file_and_field(change: dict, message: str) -> None:
    with pytest.raises(ConfigError) as err:
        parse_datasheet({**SHEET, **change}, "sheet.yaml")
    assert message in str(err.value) and "sheet.yaml (Lab Card)" in str(err.value)
    assert "\n" not in str(err.value)


def test_device_add_round_trip(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MASERVE_HOME", str(tmp_path / "home"))
    sheet = tmp_path / "card.yaml"
    sheet.write_text(yaml.safe_dump(SHEET))
    result = runner.invoke(app, ["sim", "device", "add", str(sheet)])
    assert result.exit_code == 0, result.output
    gpu = get_gpu("LABCARD")
    assert (gpu.name, gpu.peak_flops, gpu.memory_bytes) == ("Lab Card", 100e12, 24576 * 2**20)
    assert gpu == parse_datasheet(SHEET, "x")
    assert "Lab Card" in list_gpus()
    assert make_step_model("Qwen3-8B", "labcard").decode_affine(2).num_seqs == 2
    listed = runner.invoke(app, ["sim", "device", "list"])
    assert listed.exit_code == 0 and "Lab Card" in listed.output
    lab = next(line for line in listed.output.splitlines() if "Lab Card" in line)
    assert "uncalibrated" in lab  # a datasheet alone is not a calibration
    again = runner.invoke(app, ["sim", "device", "add", str(sheet)])
    assert again.exit_code == 1 and "--force" in again.output
    sheet.write_text(yaml.safe_dump({**SHEET, "bf16_tflops": 120.0}))
    forced = runner.invoke(app, ["sim", "device", "add", str(sheet), "--force"])
    assert forced.exit_code == 0 and get_gpu("Lab Card").peak_flops == 120e12


def test_device_add_of_a_bad_list_writes_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("MASERVE_HOME", str(tmp_path / "home"))
    sheet = tmp_path / "cards.yaml"
    sheet.write_text(yaml.safe_dump([SHEET, {**SHEET, "name": "Broken", "num_sms": 0}]))
    result = runner.invoke(app, ["sim", "device", "add", str(sheet)])
    assert result.exit_code == 1
    assert "cards.yaml entry 2 (Broken): num_sms=0 must be > 0" in result.output
    assert not (tmp_path / "home" / "devices").exists()
    with pytest.raises(ConfigError, match="unknown GPU 'Lab Card'"):
        get_gpu("Lab Card")


def _profiles_of(shared_data: Path, tmp_path: Path, label: str) -> Path:
    root = tmp_path / "profiles" / "vidur" / label
    for model in ("phi-2", "Llama-2-7b-hf"):
        shutil.copytree(shared_data / "profiles" / "vidur" / "a100" / model, root / model)
    return tmp_path / "profiles"


def test_device_calibrate_from_profiles(
    shared_data: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("MASERVE_HOME", str(tmp_path / "home"))
    profiles = _profiles_of(shared_data, tmp_path, "a40")
    result = runner.invoke(app, ["sim", "device", "calibrate", "A40 (lab)", "--profiles",
                                 str(profiles), "--base-gpu", "A40"])  # fmt: skip
    assert result.exit_code == 0, result.output
    assert "held-out model" in result.output
    entry = get_device("A40 (lab)")
    assert entry.base_gpu == "A40" and entry.gpu.arch == "sm86"
    assert entry.fit["models"] == ["Llama-2-7B", "Phi-2"]
    assert entry.efficiency != get_device("A40").efficiency


def test_calibrate_unknown_base_is_one_line(tmp_path: Path, shared_data: Path) -> None:
    profiles = _profiles_of(shared_data, tmp_path, "a40")
    result = runner.invoke(app, ["sim", "device", "calibrate", "Z80", "--profiles", str(profiles)])
    assert result.exit_code == 1 and "Traceback" not in result.output
    assert "NAME (no --base-gpu given) 'Z80' has no datasheet" in result.output
    assert "maserve sim device add" in result.output


def _benchmark(name: str = "step_time_wape") -> ModuleType:
    path = Path(__file__).resolve().parents[3] / "benchmarks" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_benchmark_unknown_device_is_one_line(
    shared_data: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    profiles = _profiles_of(shared_data, tmp_path, "zz9000")
    monkeypatch.setattr("sys.argv", ["step_time_wape.py", str(profiles)])
    with pytest.raises(SystemExit) as done:
        _benchmark().main()
    assert done.value.code == 1
    err = capsys.readouterr().err
    assert "profiles name device 'zz9000', which is not in the catalog" in err
    assert "maserve sim device add" in err and "Traceback" not in err


def test_predictor_eval_unknown_device_is_one_line(
    shared_data: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    profiles = _profiles_of(shared_data, tmp_path, "zz9000")
    out = tmp_path / "figures.json"
    monkeypatch.setattr("sys.argv", ["predictor_eval.py", "--profiles", str(profiles),
                                     "--out", str(out)])  # fmt: skip
    with pytest.raises(SystemExit) as done:
        _benchmark("predictor_eval").main()
    assert done.value.code == 1
    err = capsys.readouterr().err
    assert "device 'zz9000' not in the catalog" in err and "maserve sim device add" in err
    assert "Traceback" not in err and not out.exists()
