"""`maserve replay SCENARIO`: tables, bundles per arm, unsupported engines."""

from __future__ import annotations

from pathlib import Path

import typer
import yaml
from typer.testing import CliRunner

from maserve_prefect.cli import replay_cmd
from maserve_prefect.trace.bundle import export_bundle, import_bundle
from maserve_prefect.trace.cas import BlobStore
from maserve_prefect.trace.model import Trace

app = typer.Typer()
app.command("replay")(replay_cmd.replay_cmd)


@app.callback()
def _group() -> None:
    """Keep `replay` a named subcommand."""


runner = CliRunner()


def _write_scenario(tmp_path: Path, four_call: tuple[Trace, BlobStore]) -> Path:
    trace, store = four_call
    export_bundle(trace, store, tmp_path / "fc")
    sc = {
        "name": "fc",
        "cohorts": [{"name": "fc", "bundle": "fc"}],
        "arrivals": {"kind": "poisson", "rate_per_s": 0.5, "seed": 1},
        "arms": [
            {"name": "dag", "release": "dag"},
            {"name": "bar", "release": "barrier",
             "barrier": [{"before": "analyst_a", "after": "analyst_b"}]},
            {"name": "flat", "release": "flat"},
        ],
    }  # fmt: skip
    path = tmp_path / "scenario.yaml"
    path.write_text(yaml.safe_dump(sc))
    return path


def test_replay_prints_arms_and_writes_bundles(
    tmp_path: Path, four_call: tuple[Trace, BlobStore]
) -> None:
    path = _write_scenario(tmp_path, four_call)
    out = tmp_path / "out"
    res = runner.invoke(app, ["replay", str(path), "--no-prefect", "--out", str(out)])
    assert res.exit_code == 0, res.output
    assert "flat (non-causal)" in res.output and "scenario fc" in res.output
    for arm in ("dag", "bar", "flat"):
        back = import_bundle(out / f"{arm}-b0")
        assert back.trace.manifest.source == "replay"
        assert back.trace.manifest.notes["replay"]["arm"] == arm
    assert (out / "summary.json").is_file()


def test_replay_names_a_malformed_engine(tmp_path: Path) -> None:
    path = tmp_path / "s.yaml"
    path.write_text("name: x\ncohorts: [{name: t, bundle: b}]\narms: [{name: a}]\n")
    res = runner.invoke(app, ["replay", str(path), "--engine", "tgi:http://localhost:1"])
    assert res.exit_code == 1
    assert "expected 'sim' or 'openai:URL'" in res.output


def test_replay_names_a_bad_scenario_field(tmp_path: Path) -> None:
    path = tmp_path / "s.yaml"
    path.write_text("name: x\ncohorts: [{name: t}]\narms: [{name: a}]\n")
    res = runner.invoke(app, ["replay", str(path), "--no-prefect"])
    assert res.exit_code == 1
    assert "cohorts.0" in res.output and "bundle" in res.output
