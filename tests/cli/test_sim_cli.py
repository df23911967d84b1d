"""`maserve sim replay` on a slice of the shared Mooncake trace."""

from __future__ import annotations

import csv
import json
from pathlib import Path

from typer.testing import CliRunner

from maserve_prefect.cli import _mount, app

runner = CliRunner()
_mount()


def slice_file(shared_data: Path, tmp_path: Path, n: int = 200) -> Path:
    lines = (shared_data / "traces" / "mooncake_synthetic_trace.jsonl").read_text().splitlines()
    path = tmp_path / "mc.jsonl"
    path.write_text("\n".join(lines[:n]) + "\n")
    return path


def test_replay_prints_percentiles_and_writes_outputs(shared_data: Path, tmp_path: Path) -> None:
    trace = slice_file(shared_data, tmp_path)
    out = tmp_path / "out"
    result = runner.invoke(
        app,
        ["sim", "replay", str(trace), "--gpu", "H100", "--model", "Qwen3-8B",
         "--replicas", "2", "--out", str(out)],
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    for word in ("TTFT", "TPOT", "E2E", "p99", "prefix hit rate", "preemptions", "KV usage"):
        assert word in result.output
    assert "200 requests" in result.output
    with (out / "requests.csv").open() as fh:
        rows = list(csv.DictReader(fh))
    # Requests over Qwen3-8B's 40,960-token context are refused, as vLLM refuses them.
    source = [json.loads(line) for line in trace.read_text().splitlines()]
    too_long = {i for i, r in enumerate(source) if r["input_length"] + r["output_length"] > 40960}
    assert len(rows) == 200 and too_long
    assert {i for i, r in enumerate(rows) if r["status"] == "rejected"} == too_long
    assert {r["status"] for i, r in enumerate(rows) if i not in too_long} == {"completed"}
    with (out / "device_time.csv").open() as fh:
        devices = [r["device"] for r in csv.DictReader(fh)]
    assert devices == ["H100:0", "H100:1"]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["ttft"]["count"] == 200 - len(too_long)
    assert (out / "timelines.csv").stat().st_size > 0


def test_unknown_gpu_is_one_red_line_and_exit_1(shared_data: Path, tmp_path: Path) -> None:
    trace = slice_file(shared_data, tmp_path, 5)
    result = runner.invoke(app, ["sim", "replay", str(trace), "--gpu", "H900"])
    assert result.exit_code == 1
    assert "unknown GPU 'H900'" in result.output


def test_model_that_does_not_fit_exits_1(shared_data: Path, tmp_path: Path) -> None:
    trace = slice_file(shared_data, tmp_path, 5)
    result = runner.invoke(
        app, ["sim", "replay", str(trace), "--gpu", "V100-32GB", "--model", "Qwen3-32B"]
    )
    assert result.exit_code == 1
    assert "cannot load Qwen3-32B on V100-32GB:0" in result.output
