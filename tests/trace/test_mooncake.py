"""Tests for trace.mooncake: FAST'25 JSONL import."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from maserve_prefect.errors import TraceImportError
from maserve_prefect.trace.model import OpKind, Trace
from maserve_prefect.trace.mooncake import MAX_TIMESTAMP_MS, import_mooncake


def row(ts: object = 0, n_in: object = 600, n_out: object = 5, hashes: object = (1, 2)) -> str:
    return json.dumps(
        {
            "timestamp": ts,
            "input_length": n_in,
            "output_length": n_out,
            "hash_ids": list(hashes) if isinstance(hashes, tuple) else hashes,
        }
    )


def write(tmp_path: Path, *lines: str) -> Path:
    path = tmp_path / "trace.jsonl"
    path.write_text("".join(f"{line}\n" for line in lines))
    return path


def test_shared_mooncake_trace_imports_fully(shared_data: Path) -> None:
    path = shared_data / "traces" / "mooncake_synthetic_trace.jsonl"
    res = import_mooncake(path)
    assert res.num_rows == 3993
    assert res.rejected == []
    assert len(res.trace.roots) == 3993
    assert len(res.trace.ops) == 3993
    assert res.trace.manifest.source == "mooncake"
    assert res.trace.manifest.notes["sha256"] == hashlib.sha256(path.read_bytes()).hexdigest()
    assert res.trace.manifest.notes["file"] == path.name
    # Every op obeys the block rule and its root's arrival is its ready and submitted time.
    arrivals = {r.root_id: r.arrival_s for r in res.trace.roots}
    for op in res.trace.ops:
        n = len(op.prefix_block_hashes)
        assert (n - 1) * 512 < op.num_input_tokens <= n * 512
        assert op.times.ready_s == op.times.submitted_s == arrivals[op.root_id]
    # Spot-check the first row against the file.
    first = json.loads(path.read_text().splitlines()[0])
    op0 = res.trace.ops[0]
    assert op0.op_id == "mc-000001/op0"
    assert op0.num_input_tokens == first["input_length"]
    assert op0.num_output_tokens == first["output_length"]
    assert list(op0.prefix_block_hashes) == first["hash_ids"]


def test_records_round_trip_through_validation(tmp_path: Path) -> None:
    res = import_mooncake(write(tmp_path, row(ts=1500), row(ts=2500, n_in=512, hashes=(9,))))
    # Built with model_construct: a full validation must give back equal records.
    again = Trace.model_validate_json(res.trace.model_dump_json())
    assert again.ops == res.trace.ops
    assert again.roots == res.trace.roots
    op = again.ops[1]
    assert (op.root_id, op.kind, op.block_size) == ("mc-000002", OpKind.MODEL, 512)
    assert again.roots[0].arrival_s == 1.5
    assert again.roots[0].workflow == "mooncake"


@pytest.mark.parametrize(
    ("line", "reason"),
    [
        ('{"timestamp": 0, "input_length": ', "malformed_json"),
        ("[1, 2]", "not_an_object"),
        ('{"timestamp": 0, "input_length": 5, "output_length": 1}', "missing_field"),
        (row(n_in="600"), "bad_type"),
        (row(n_out=True), "bad_type"),
        (row(hashes=[1, "x"]), "bad_type"),
        (row(hashes=[1, 2.5]), "bad_type"),
        (row(ts="now"), "bad_type"),
        (
            '{"timestamp": NaN, "input_length": 600, "output_length": 5, "hash_ids": [1, 2]}',
            "bad_type",
        ),
        (b"\xff\xfe".decode("latin-1"), "malformed_json"),
        (row(ts=-1), "negative_value"),
        (row(n_out=-3), "negative_value"),
        (row(n_in=1024, hashes=(1,)), "block_count"),  # one block cannot hold 1024 tokens
        (row(n_in=512, hashes=(1, 2)), "block_count"),  # second block would be empty
        (row(n_in=0, hashes=(1,)), "block_count"),
    ],
)
def test_bad_row_is_reported_with_its_line(tmp_path: Path, line: str, reason: str) -> None:
    path = write(tmp_path, row(), "", line, row(ts=10))
    res = import_mooncake(path)
    assert res.num_rows == 3  # the blank line is not a row
    assert [(r.line, r.reason) for r in res.rejected] == [(3, reason)]
    assert res.num_accepted == 2
    # Root ids carry the source line, so the skipped row leaves a gap.
    assert [r.root_id for r in res.trace.roots] == ["mc-000001", "mc-000004"]
    assert res.trace.manifest.notes["num_rejected"] == 1


def test_block_rule_boundaries_accepted(tmp_path: Path) -> None:
    res = import_mooncake(
        write(
            tmp_path,
            row(n_in=513, hashes=(1, 2)),
            row(n_in=1024, hashes=(1, 2)),
            row(n_in=0, hashes=()),
        )
    )
    assert res.rejected == []
    assert len(res.trace.roots) == 3


def test_strict_raises_naming_file_and_line(tmp_path: Path) -> None:
    path = write(tmp_path, row(), row(ts=1), "{oops")
    with pytest.raises(TraceImportError, match=rf"{path}:3: not valid JSON"):
        import_mooncake(path, strict=True)


def test_block_size_parameter(tmp_path: Path) -> None:
    path = write(tmp_path, row(n_in=600, hashes=(1, 2, 3)), row(ts=1, n_in=600, hashes=(1, 2)))
    assert import_mooncake(path).rejected[0].reason == "block_count"
    res = import_mooncake(path, block_size=256)
    assert [r.line for r in res.rejected] == [2] and res.trace.ops[0].block_size == 256
    with pytest.raises(TraceImportError, match="block_size must be positive"):
        import_mooncake(path, block_size=0)


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(TraceImportError, match="cannot read Mooncake trace"):
        import_mooncake(tmp_path / "absent.jsonl")


def test_rejected_by_reason_groups_lines(tmp_path: Path) -> None:
    res = import_mooncake(write(tmp_path, "x", row(), "y", row(n_out=-1)))
    assert res.rejected_by_reason() == {"malformed_json": [1, 3], "negative_value": [4]}


def test_zero_lengths_out_of_order_and_duplicates_warn_and_strict_refuses(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        row(ts=10),
        row(ts=20, n_out=0),  # zero output length
        row(ts=5),  # earlier than line 2
        row(ts=10),  # the same as line 1, and out of order
        row(ts=30),
    )
    res = import_mooncake(path)
    assert res.num_accepted == 5 and res.rejected == []
    assert res.warnings_by_reason() == {
        "zero_length": [2],
        "out_of_order": [3, 4],
        "duplicate": [4],
    }
    assert res.trace.manifest.notes["num_warnings"] == 4
    with pytest.raises(TraceImportError, match=rf"{path}:2: .*zero length.*--strict"):
        import_mooncake(path, strict=True)


@pytest.mark.parametrize(
    ("line", "reason"),
    [
        (row(n_out=2**63), "beyond_context"),
        (row(n_in=600, n_out=40960 - 600 + 1), "beyond_context"),
        (row(ts=1e308), "timestamp_range"),
        (row(ts=MAX_TIMESTAMP_MS * 1.0001), "timestamp_range"),
    ],
)
def test_values_beyond_a_context_or_a_century_are_refused(
    tmp_path: Path, line: str, reason: str
) -> None:
    path = write(tmp_path, row(), line)
    res = import_mooncake(path, max_context_tokens=40960)
    assert [(r.line, r.reason) for r in res.rejected] == [(2, reason)]
    assert len(res.trace.roots) == 1
    with pytest.raises(TraceImportError, match=rf"{path}:2: "):
        import_mooncake(path, strict=True, max_context_tokens=40960)


def test_a_row_at_the_context_window_is_kept(tmp_path: Path) -> None:
    res = import_mooncake(
        write(tmp_path, row(n_in=600, n_out=40960 - 600)), max_context_tokens=40960
    )
    assert res.rejected == [] and len(res.trace.roots) == 1


@pytest.mark.parametrize("lines", [(), ("",), ("x", row(n_out=-1))])
def test_an_empty_result_is_an_error(tmp_path: Path, lines: tuple[str, ...]) -> None:
    path = write(tmp_path, *lines)
    with pytest.raises(TraceImportError, match=rf"{path}: no row imported"):
        import_mooncake(path)
