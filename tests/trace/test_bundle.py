"""Tests for trace.bundle: canonical export, byte-identical round trip, import errors by line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from maserve_prefect.errors import (
    BundleExistsError,
    IntegrityError,
    TraceImportError,
    TraceValidationError,
)
from maserve_prefect.trace.bundle import (
    BUNDLE_FORMAT,
    canonical_trace,
    export_bundle,
    import_bundle,
)
from maserve_prefect.trace.cas import ContentStore, MemoryStore
from maserve_prefect.trace.model import (
    SCHEMA_VERSION,
    Dep,
    EdgeKind,
    EngineSample,
    Manifest,
    OpKind,
    OpRecord,
    OpStatus,
    OpTimes,
    RootRecord,
    SessionRecord,
    StageRecord,
    Trace,
)


def make_trace(store: MemoryStore) -> Trace:
    """Two roots, a fork-join in r1 with a retried op, samples; records deliberately unordered."""
    prompt = store.put_json([{"role": "user", "content": "plan"}])

    def op(op_id: str, root: str, *deps: tuple[str, EdgeKind], **kw: object) -> OpRecord:
        return OpRecord(
            op_id=op_id,
            root_id=root,
            stage_id=f"{root}/s0",
            kind=OpKind.MODEL,
            deps=tuple(Dep(op_id=d, kind=k) for d, k in deps),
            input_refs=(prompt,),
            output_ref=store.put(f"out {op_id} {kw.get('attempt', 1)}".encode()),
            output_token_ids_ref=store.put_json([1, 2, 3]),
            num_input_tokens=50,
            num_output_tokens=3,
            times=OpTimes(ready_s=0.5, completed_s=1.25),
            **kw,  # type: ignore[arg-type]
        )

    return Trace(
        manifest=Manifest(
            trace_id="t", model="m", created_at="2024-05-01T00:00:00+00:00", seeds={"s": 3}
        ),
        roots=[RootRecord(root_id="r1", arrival_s=2.0), RootRecord(root_id="r0", arrival_s=0.0)],
        stages=[
            StageRecord(stage_id="r1/s0", root_id="r1", name="fork"),
            StageRecord(stage_id="r0/s0", root_id="r0", name="one"),
        ],
        sessions=[SessionRecord(session_id="r1/s0/b", root_id="r1", stage_id="r1/s0")],
        ops=[
            op("r1/op10", "r1", ("r1/op2", EdgeKind.DATA), ("r1/op9", EdgeKind.DATA)),
            op("r1/op9", "r1", ("r1/op2", EdgeKind.DATA)),
            op("r1/op2", "r1", status=OpStatus.FAILED, error="oom"),
            op("r1/op2", "r1", attempt=2),
            op("r0/op0", "r0"),
        ],
        samples=[
            EngineSample(source="rep0", t_s=1.0, name="kv", value=0.5),
            EngineSample(source="rep0", t_s=0.0, name="kv", value=0.0),
        ],
    )


def read_tree(root: Path) -> dict[str, bytes]:
    return {
        p.relative_to(root).as_posix(): p.read_bytes()
        for p in sorted(root.rglob("*"))
        if p.is_file()
    }


def test_export_import_export_is_byte_identical(tmp_path: Path) -> None:
    store = MemoryStore()
    trace = make_trace(store)
    first = export_bundle(trace, store, tmp_path / "a")
    imported = import_bundle(first, ContentStore(tmp_path / "cas"))
    second = export_bundle(imported.trace, imported.store, tmp_path / "b")
    a, b = read_tree(first), read_tree(second)
    assert a == b
    assert (
        len([k for k in a if k.startswith("blobs/")]) == 7
    )  # prompt, 5 outputs (one per attempt), token ids


def test_import_restores_records_in_canonical_order_without_created_at(tmp_path: Path) -> None:
    store = MemoryStore()
    trace = make_trace(store)
    got = import_bundle(export_bundle(trace, store, tmp_path / "b")).trace
    assert got == canonical_trace(trace)
    assert got.manifest.created_at is None and got.manifest.seeds == {"s": 3}
    assert [r.root_id for r in got.roots] == ["r0", "r1"]  # by arrival
    # Topological, then natural id order; attempts in order.
    assert [(o.op_id, o.attempt) for o in got.ops] == [
        ("r0/op0", 1),
        ("r1/op2", 1),
        ("r1/op2", 2),
        ("r1/op9", 1),
        ("r1/op10", 1),
    ]
    assert [s.t_s for s in got.samples] == [0.0, 1.0]
    assert sorted(map(repr, got.ops)) == sorted(map(repr, trace.ops))


def test_bundle_is_self_describing_and_leaves_out_created_at(tmp_path: Path) -> None:
    store = MemoryStore()
    out = export_bundle(make_trace(store), store, tmp_path / "b")
    lines = (out / "trace.jsonl").read_text().splitlines()
    header = json.loads(lines[0])
    assert header["type"] == "manifest"
    assert (header["bundle_format"], header["schema_version"]) == (BUNDLE_FORMAT, SCHEMA_VERSION)
    assert header["counts"] == {
        "roots": 2,
        "stages": 2,
        "sessions": 1,
        "ops": 5,
        "samples": 2,
        "blobs": 7,
    }
    assert (
        "created_at" not in header["manifest"]
        and "2024-05-01" not in (out / "trace.jsonl").read_text()
    )
    assert [json.loads(x)["type"] for x in lines[1:]] == ["root"] * 2 + ["stage"] * 2 + [
        "session"
    ] + ["op"] * 5 + ["sample"] * 2


def test_a_bundle_written_meanwhile_is_never_replaced_without_overwrite(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Another process writes the destination after this export's early check (validation is
    where the window is widest): the rename refuses, the other bundle stays whole."""
    import maserve_prefect.trace.bundle as bundle_mod

    store = MemoryStore()
    trace = make_trace(store)
    dest = tmp_path / "b"
    other = trace.model_copy(update={"samples": []})
    real_validate = bundle_mod.validate_trace

    def validate_while_another_writes(t: Trace, s: object) -> None:
        real_validate(t, s)  # type: ignore[arg-type]
        if not dest.exists():
            monkeypatch.setattr(bundle_mod, "validate_trace", real_validate)
            export_bundle(other, store, dest)

    monkeypatch.setattr(bundle_mod, "validate_trace", validate_while_another_writes)
    with pytest.raises(BundleExistsError, match=r"another process.*--force"):
        export_bundle(trace, store, dest)
    assert import_bundle(dest).trace.samples == []  # the other writer's bundle, untouched
    assert sorted(p.name for p in tmp_path.iterdir()) == ["b"]  # no temp folders left


def test_existing_destination_is_refused_unless_overwrite(tmp_path: Path) -> None:
    store = MemoryStore()
    trace = make_trace(store)
    dest = export_bundle(trace, store, tmp_path / "b")
    before = read_tree(dest)
    with pytest.raises(BundleExistsError, match="overwrite=True"):
        export_bundle(trace, store, dest)
    smaller = trace.model_copy(update={"samples": []})
    export_bundle(smaller, store, dest, overwrite=True)
    assert read_tree(dest) != before
    assert import_bundle(dest).trace.samples == []
    assert sorted(p.name for p in tmp_path.iterdir()) == ["b"]  # no temp folders left


def test_failed_export_leaves_no_bundle_and_no_temp(tmp_path: Path) -> None:
    store = MemoryStore()
    trace = make_trace(store)
    with pytest.raises(TraceValidationError, match="not in the store"):
        export_bundle(trace, MemoryStore(), tmp_path / "b")  # blobs are elsewhere
    assert list(tmp_path.iterdir()) == []


def corrupt_line(bundle: Path, lineno: int, text: str) -> Path:
    path = bundle / "trace.jsonl"
    lines = path.read_text().splitlines()
    lines[lineno - 1] = text
    path.write_text("\n".join(lines) + "\n")
    return path


@pytest.fixture
def bundle(tmp_path: Path) -> Path:
    store = MemoryStore()
    return export_bundle(make_trace(store), store, tmp_path / "b")


def test_malformed_json_line_names_file_and_line(bundle: Path) -> None:
    path = corrupt_line(bundle, 7, '{"type": "op", oops')
    with pytest.raises(TraceImportError, match=rf"{path}:7: not valid JSON"):
        import_bundle(bundle)


def test_invalid_record_names_line_and_field(bundle: Path) -> None:
    line = json.loads((bundle / "trace.jsonl").read_text().splitlines()[6])
    line["num_input_tokens"] = -4
    path = corrupt_line(bundle, 7, json.dumps(line))
    with pytest.raises(TraceImportError, match=rf"{path}:7: invalid op record: num_input_tokens"):
        import_bundle(bundle)


def test_unknown_record_type_and_schema_version(bundle: Path) -> None:
    path = corrupt_line(bundle, 3, '{"type": "widget"}')
    with pytest.raises(TraceImportError, match=rf"{path}:3: unknown record type 'widget'"):
        import_bundle(bundle)
    header = json.loads(path.read_text().splitlines()[0])
    header["schema_version"] = "maserve.semantic-trace/99"
    corrupt_line(bundle, 1, json.dumps(header))
    with pytest.raises(TraceImportError, match=r"semantic-trace/99' is not supported.*upgrade"):
        import_bundle(bundle)


def test_truncated_bundle_is_caught_by_header_counts(bundle: Path) -> None:
    path = bundle / "trace.jsonl"
    path.write_text("\n".join(path.read_text().splitlines()[:-1]) + "\n")
    with pytest.raises(TraceImportError, match="announces 2 samples but the file holds 1"):
        import_bundle(bundle)


def test_corrupt_blob_raises_integrity_error(bundle: Path) -> None:
    blob = next(p for p in (bundle / "blobs").rglob("*") if p.is_file())
    blob.write_bytes(b"garbage")
    with pytest.raises(IntegrityError, match=str(blob)):
        import_bundle(bundle)


def test_missing_blob_names_the_op_line(bundle: Path) -> None:
    lines = (bundle / "trace.jsonl").read_text().splitlines()
    op = json.loads(lines[6])
    (bundle / "blobs" / op["output_ref"][:2] / op["output_ref"]).unlink()
    header = json.loads(lines[0])
    header["counts"]["blobs"] -= 1
    corrupt_line(bundle, 1, json.dumps(header))
    with pytest.raises(
        TraceImportError, match=rf"trace.jsonl:7: op '{op['op_id']}' references blob"
    ):
        import_bundle(bundle)


def test_invalid_graph_in_bundle_reports_op_line(bundle: Path) -> None:
    lines = (bundle / "trace.jsonl").read_text().splitlines()
    op = json.loads(lines[6])
    op["deps"] = [{"op_id": "nowhere", "kind": "control", "required": True}]
    corrupt_line(bundle, 7, json.dumps(op))
    with pytest.raises(
        TraceValidationError, match=rf"trace.jsonl:7: op '{op['op_id']}'.*'nowhere'"
    ):
        import_bundle(bundle)
