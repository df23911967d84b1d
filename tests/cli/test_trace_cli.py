"""Tests for `maserve trace` (import-mooncake, stats) through typer's CliRunner."""

from __future__ import annotations

import json
from pathlib import Path

from typer.testing import CliRunner

from maserve_prefect.cli.trace_cmd import app
from maserve_prefect.trace.bundle import export_bundle, import_bundle
from maserve_prefect.trace.cas import MemoryStore
from maserve_prefect.trace.model import (
    Dep,
    EdgeKind,
    Manifest,
    OpKind,
    OpRecord,
    RootRecord,
    Trace,
)

runner = CliRunner()
# The `maserve` console script, run by this interpreter (the checkout under test).
MAIN = "import sys; from maserve_prefect.cli import main; sys.argv[0] = 'maserve'; main()"


def table_row(output: str, first_cell: str) -> list[str]:
    """Cells of the rich table row whose first cell is `first_cell`."""
    for line in output.splitlines():
        cells = [c.strip() for c in line.strip().strip("│").split("│")]
        if len(cells) > 1 and cells[0] == first_cell:
            return cells
    raise AssertionError(f"no table row {first_cell!r} in:\n{output}")


def row(ts: int, n_in: int = 600, hashes: tuple[int, ...] = (1, 2)) -> str:
    return json.dumps(
        {"timestamp": ts, "input_length": n_in, "output_length": 4, "hash_ids": list(hashes)}
    )


def test_import_shared_trace_then_stats(shared_data: Path, tmp_path: Path) -> None:
    src = shared_data / "traces" / "mooncake_synthetic_trace.jsonl"
    out = tmp_path / "mc"
    result = runner.invoke(app, ["import-mooncake", str(src), "--out", str(out)])
    assert result.exit_code == 0, result.output
    assert table_row(result.output, "rows accepted") == ["rows accepted", "3993"]
    assert table_row(result.output, "rows rejected") == ["rows rejected", "0"]
    assert "Rejected rows" not in result.output
    bundle = import_bundle(out)
    assert len(bundle.trace.roots) == 3993
    assert bundle.trace.manifest.notes["num_rejected"] == 0

    stats = runner.invoke(app, ["stats", str(out)])
    assert stats.exit_code == 0, stats.output
    # Large trace: a distribution summary, every root a single call (depth 1).
    assert "LLM-call graph over 3993 roots" in stats.output
    assert table_row(stats.output, "depth") == ["depth", "1.00", "1", "1"]
    assert table_row(stats.output, "antichain width") == ["antichain width", "1.00", "1", "1"]
    assert table_row(stats.output, "roots") == ["roots", "3993"]


def test_malformed_line_reported_with_its_number(tmp_path: Path) -> None:
    src = tmp_path / "bad.jsonl"
    src.write_text("\n".join([row(0), row(5), "{not json", row(9, n_in=5000)]) + "\n")
    result = runner.invoke(app, ["import-mooncake", str(src), "--out", str(tmp_path / "b")])
    assert result.exit_code == 0, result.output
    assert table_row(result.output, "malformed_json")[1:3] == ["1", "3"]
    assert table_row(result.output, "block_count")[1:3] == ["1", "4"]
    assert len(import_bundle(tmp_path / "b").trace.roots) == 2


def test_strict_fails_with_file_and_line(tmp_path: Path) -> None:
    src = tmp_path / "bad.jsonl"
    src.write_text("\n".join([row(0), "{not json"]) + "\n")
    out = tmp_path / "b"
    result = runner.invoke(app, ["import-mooncake", str(src), "--out", str(out), "--strict"])
    assert result.exit_code == 1
    assert f"{src}:2" in result.output.replace("\n", "")
    assert "Traceback" not in result.output
    assert not out.exists()


def test_default_out_dir_under_maserve_home_and_force(tmp_path: Path) -> None:
    src = tmp_path / "small.jsonl"
    src.write_text(row(0) + "\n")
    env = {"MASERVE_HOME": str(tmp_path / "home")}
    first = runner.invoke(app, ["import-mooncake", str(src)], env=env)
    assert first.exit_code == 0, first.output
    assert (tmp_path / "home" / "traces" / "small" / "trace.jsonl").is_file()
    again = runner.invoke(app, ["import-mooncake", str(src)], env=env)
    assert again.exit_code == 1 and "already exists" in again.output
    forced = runner.invoke(app, ["import-mooncake", str(src), "--force"], env=env)
    assert forced.exit_code == 0, forced.output


def test_missing_input_file_is_a_clean_error(tmp_path: Path) -> None:
    result = runner.invoke(
        app, ["import-mooncake", str(tmp_path / "nope.jsonl"), "--out", str(tmp_path / "b")]
    )
    assert result.exit_code == 1
    assert "cannot read Mooncake trace" in result.output
    assert "Traceback" not in result.output


def test_stats_per_root_table_for_small_trace(tmp_path: Path) -> None:
    def op(op_id: str, kind: OpKind, *deps: str) -> OpRecord:
        return OpRecord(
            op_id=op_id,
            root_id="r",
            kind=kind,
            # Control deps: data deps would need output payloads in the store.
            deps=tuple(Dep(op_id=d, kind=EdgeKind.CONTROL) for d in deps),
        )

    trace = Trace(
        manifest=Manifest(trace_id="four-call"),
        roots=[RootRecord(root_id="r")],
        ops=[
            op("r/a1", OpKind.MODEL),
            op("r/a2", OpKind.MODEL),
            op("r/syn", OpKind.MODEL, "r/a1", "r/a2"),
            op("r/tool", OpKind.TOOL, "r/syn"),
            op("r/ver", OpKind.MODEL, "r/tool"),
        ],
    )
    out = export_bundle(trace, MemoryStore(), tmp_path / "b")
    result = runner.invoke(app, ["stats", str(out)])
    assert result.exit_code == 0, result.output
    # root, ops, calls, depth, level widths, antichain, peak in-flight (no timestamps)
    assert table_row(result.output, "r") == ["r", "5", "4", "3", "2 1 1", "2", "-"]
    assert table_row(result.output, "tool ops") == ["tool ops", "1"]


def test_stats_on_missing_bundle_is_a_clean_error(tmp_path: Path) -> None:
    result = runner.invoke(app, ["stats", str(tmp_path / "none")])
    assert result.exit_code == 1
    assert "no such file" in result.output
    assert "Traceback" not in result.output


def test_concurrent_imports_to_one_destination_one_wins(tmp_path: Path) -> None:
    """Two `maserve trace import-mooncake` of files with the same stem, started together in
    separate processes: exactly one writes the bundle, the other fails with one clear line and
    replaces nothing (with or without the race window hit, never both exit 0)."""
    import os
    import subprocess
    import sys

    home = tmp_path / "home"
    sources = []
    for name, n_in in (("a", 600), ("b", 900)):
        folder = tmp_path / name
        folder.mkdir()
        src = folder / "same.jsonl"
        src.write_text("".join(row(ts, n_in) + "\n" for ts in range(0, 4000, 10)))
        sources.append(src)
    env = {**os.environ, "MASERVE_HOME": str(home)}
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", MAIN, "trace", "import-mooncake", str(src)],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for src in sources
    ]
    results = [(p.wait(timeout=300), *p.communicate()) for p in procs]
    codes = sorted(code for code, _, _ in results)
    assert codes == [0, 1], results
    _, _, err = next(r for r in results if r[0] == 1)
    assert "Traceback" not in err
    assert "already exists" in err or "written by another process" in err
    assert "--force" in err
    bundle = import_bundle(home / "traces" / "same").trace
    winner = next(i for i, r in enumerate(results) if r[0] == 0)
    assert bundle.ops[0].num_input_tokens == (600, 900)[winner]
    # no temporary folder left behind
    assert [p.name for p in (home / "traces").iterdir()] == ["same"]
