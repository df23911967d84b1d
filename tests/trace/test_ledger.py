"""Tests for trace.ledger (with trace.db, trace.tables and settings): append, load, checks."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest
from sqlalchemy import inspect
from sqlmodel import Session, select

from maserve_prefect.errors import (
    ConfigError,
    IntegrityError,
    TraceNotFoundError,
    TraceValidationError,
)
from maserve_prefect.settings import Settings
from maserve_prefect.trace.cas import ContentStore, MemoryStore, sha256_hex
from maserve_prefect.trace.db import make_engine
from maserve_prefect.trace.ledger import Ledger
from maserve_prefect.trace.model import (
    Dep,
    EdgeKind,
    EngineSample,
    GenerationSettings,
    Manifest,
    OpKind,
    OpRecord,
    OpStatus,
    OpTimes,
    RootRecord,
    SessionRecord,
    StageRecord,
)
from maserve_prefect.trace.runs import RunStatus
from maserve_prefect.trace.tables import EdgeRow, PayloadRefRow
from maserve_prefect.trace.validate import validate_trace


def make_ledger(url: str, cas: MemoryStore | None = None) -> Ledger:
    return Ledger(url, cas if cas is not None else MemoryStore())


def make_op(
    n: int, *deps: tuple[int, EdgeKind], out: bytes | None = None, **kw: object
) -> OpRecord:
    return OpRecord(
        op_id=f"r0/op{n}",
        root_id="r0",
        stage_id="r0/s0",
        session_id="r0/s0/a",
        kind=OpKind.MODEL,
        role="solver",
        deps=tuple(
            Dep(op_id=f"r0/op{d}", kind=k, required=k is not EdgeKind.CONTROL) for d, k in deps
        ),
        output_ref=sha256_hex(out) if out is not None else None,
        generation=GenerationSettings(
            deployment="llama-8b", max_tokens=64, temperature=0.0, seed=7
        ),
        num_input_tokens=100 + n,
        num_output_tokens=10 + n,
        times=OpTimes(
            ready_s=n * 1.0, submitted_s=n + 0.25, first_token_s=n + 0.5, completed_s=n + 0.75
        ),
        **kw,  # type: ignore[arg-type]
    )


def started(ledger: Ledger, trace_id: str = "t1") -> Ledger:
    ledger.begin_run(Manifest(trace_id=trace_id, model="llama-8b", seeds={"run": 1}))
    ledger.add_root(trace_id, RootRecord(root_id="r0", workflow="refine", arrival_s=0.0))
    ledger.add_stage(trace_id, StageRecord(stage_id="r0/s0", root_id="r0", name="refine"))
    ledger.add_session(
        trace_id, SessionRecord(session_id="r0/s0/a", root_id="r0", stage_id="r0/s0")
    )
    return ledger


def test_load_trace_reproduces_exactly_what_was_appended(ledger_url: str) -> None:
    ledger = started(make_ledger(ledger_url))
    prompt = b'[{"role":"user","content":"solve"}]'
    ops = [
        make_op(0, out=b"draft", input_refs=(sha256_hex(prompt),)),
        make_op(1, (0, EdgeKind.DATA), out=b"critique"),
        make_op(2, (0, EdgeKind.DATA), (1, EdgeKind.CONTROL), out=b"final"),
    ]
    blobs = {b"draft", b"critique", b"final", prompt}
    for op in ops:
        ledger.append_op("t1", op, payloads={sha256_hex(b): b for b in blobs})
    ledger.append_samples("t1", [EngineSample(source="rep0", t_s=0.5, name="kv", value=0.25)])
    trace = ledger.load_trace("t1")
    assert trace.ops == ops
    assert trace.roots == [RootRecord(root_id="r0", workflow="refine", arrival_s=0.0)]
    assert [s.stage_id for s in trace.stages] == ["r0/s0"]
    assert [s.session_id for s in trace.sessions] == ["r0/s0/a"]
    assert trace.samples == [EngineSample(source="rep0", t_s=0.5, name="kv", value=0.25)]
    assert trace.manifest.created_at is not None and trace.manifest.seeds == {"run": 1}
    validate_trace(trace, ledger.cas)
    assert ledger.cas.get(trace.ops[2].output_ref or "") == b"final"


def test_edges_and_payload_refs_are_indexed_in_the_same_transaction(ledger_url: str) -> None:
    ledger = started(make_ledger(ledger_url))
    ledger.append_op("t1", make_op(0, out=b"x"), payloads={sha256_hex(b"x"): b"x"})
    ledger.append_op("t1", make_op(1, (0, EdgeKind.DATA)))
    with Session(ledger.engine) as s:
        edges = s.exec(select(EdgeRow.src, EdgeRow.dst, EdgeRow.kind, EdgeRow.required)).all()
        refs = s.exec(select(PayloadRefRow.op_id, PayloadRefRow.role, PayloadRefRow.digest)).all()
    assert edges == [("r0/op0", "r0/op1", "data", True)]
    assert refs == [("r0/op0", "output", sha256_hex(b"x"))]


def test_failed_attempt_then_retry_are_both_kept(ledger_url: str) -> None:
    ledger = started(make_ledger(ledger_url))
    ledger.append_op("t1", make_op(0, status=OpStatus.FAILED, error="timeout"))
    ledger.append_op("t1", make_op(0, attempt=2))
    ops = ledger.load_trace("t1").ops
    assert [(o.op_id, o.attempt, o.status) for o in ops] == [
        ("r0/op0", 1, OpStatus.FAILED),
        ("r0/op0", 2, OpStatus.COMPLETED),
    ]
    with pytest.raises(TraceValidationError, match=r"'r0/op0' attempt 2 .* already recorded"):
        ledger.append_op("t1", make_op(0, attempt=2))


@pytest.mark.parametrize(
    ("op", "match"),
    [
        (make_op(1, (9, EdgeKind.DATA)), r"'r0/op1'.*depends on \['r0/op9'\]"),
        (make_op(1, (1, EdgeKind.CONTROL)), r"'r0/op1'.*depends on itself"),
        (make_op(1, out=b"never stored"), r"'r0/op1'.*not in the store"),
        (OpRecord(op_id="x", root_id="ghost", kind=OpKind.TOOL), r"root 'ghost'.*add_root"),
    ],
)
def test_bad_appends_are_refused_naming_the_op_and_leave_nothing(
    op: OpRecord, match: str, ledger_url: str
) -> None:
    ledger = started(make_ledger(ledger_url))
    ledger.append_op("t1", make_op(0))
    with pytest.raises(TraceValidationError, match=match):
        ledger.append_op("t1", op)
    assert [o.op_id for o in ledger.load_trace("t1").ops] == ["r0/op0"]
    with Session(ledger.engine) as s:
        assert s.exec(select(EdgeRow)).all() == []


def test_payload_with_wrong_digest_key_is_refused(ledger_url: str) -> None:
    ledger = started(make_ledger(ledger_url))
    op = make_op(0, out=b"real")
    with pytest.raises(IntegrityError, match="hashes to"):
        ledger.append_op("t1", op, payloads={sha256_hex(b"real"): b"other"})
    assert ledger.load_trace("t1").ops == []


def test_unknown_run_and_duplicate_run(ledger_url: str) -> None:
    ledger = started(make_ledger(ledger_url))
    with pytest.raises(TraceNotFoundError, match=r"'nope'.*begin_run"):
        ledger.load_trace("nope")
    with pytest.raises(TraceNotFoundError):
        ledger.append_op("nope", make_op(0))
    with pytest.raises(TraceValidationError, match="already recorded"):
        ledger.begin_run(Manifest(trace_id="t1"))
    with pytest.raises(TraceValidationError, match=r"root 'r0'.*unique"):
        ledger.add_root("t1", RootRecord(root_id="r0"))


def test_list_runs_finish_and_prefect_links(ledger_url: str) -> None:
    ledger = started(make_ledger(ledger_url))
    started(ledger, "t2")
    ledger.begin_run(
        Manifest(trace_id="t3", created_at="2000-01-01T00:00:00+00:00"), flow_run_id="fr-9"
    )
    ledger.append_op("t1", make_op(0))
    ledger.append_op("t1", make_op(1, (0, EdgeKind.CONTROL)))
    ledger.finish_run("t1", RunStatus.FAILED)
    runs = {r.trace_id: r for r in ledger.list_runs()}
    assert ledger.list_runs()[0].trace_id == "t3"  # oldest first
    assert runs["t1"].num_ops == 2 and runs["t2"].num_ops == 0
    assert runs["t1"].status is RunStatus.FAILED and runs["t1"].finished_at is not None
    assert runs["t2"].status is RunStatus.RUNNING and runs["t2"].finished_at is None

    ledger.link_prefect("t1", "r0/op0", 1, flow_run_id="fr-1", task_run_id="tr-a")
    ledger.link_prefect("t1", "r0/op0", 1, flow_run_id="fr-1", task_run_id="tr-b")  # update
    ledger.link_prefect("t1", "r0/op1", 1, flow_run_id="fr-1", task_run_id="tr-c")
    assert [(lk.op_id, lk.task_run_id) for lk in ledger.prefect_links("t1")] == [
        ("r0/op0", "tr-b"),
        ("r0/op1", "tr-c"),
    ]
    assert ledger.runs_of_flow_run("fr-1") == ["t1"]
    assert ledger.runs_of_flow_run("fr-9") == ["t3"]
    # Prefect ids never reach the records.
    assert "fr-1" not in ledger.load_trace("t1").model_dump_json()


def test_append_samples_accepts_tuples_in_bulk(ledger_url: str) -> None:
    ledger = started(make_ledger(ledger_url))
    n = ledger.append_samples(
        "t1", [("rep0", i * 0.1, "vllm:num_requests_running", i) for i in range(500)]
    )
    assert n == 500
    samples = ledger.load_trace("t1").samples
    assert len(samples) == 500
    assert samples[7] == EngineSample(
        source="rep0", t_s=0.7000000000000001, name="vllm:num_requests_running", value=7.0
    )
    assert ledger.append_samples("t1", []) == 0


def test_concurrent_appends_from_threads_are_all_recorded(ledger_url: str) -> None:
    ledger = started(make_ledger(ledger_url))
    ledger.append_op("t1", make_op(0))
    errors: list[BaseException] = []

    def worker(k: int) -> None:
        try:
            for i in range(10):
                ledger.append_op("t1", make_op(1 + k * 10 + i, (0, EdgeKind.CONTROL)))
        except BaseException as exc:  # surfaced below
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert sorted(o.op_id for o in ledger.load_trace("t1").ops) == sorted(
        f"r0/op{i}" for i in range(41)
    )


def test_file_ledger_survives_reopen_and_uses_wal(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/sub/ledger.db"
    cas = ContentStore(tmp_path / "cas")
    with Ledger(url, cas) as ledger:
        started(ledger)
        ledger.append_op("t1", make_op(0, out=b"o"), payloads={sha256_hex(b"o"): b"o"})
    engine = make_engine(url)
    with engine.connect() as conn:
        assert conn.exec_driver_sql("PRAGMA journal_mode").scalar() == "wal"
        assert conn.exec_driver_sql("PRAGMA synchronous").scalar() == 2  # FULL
    reopened = Ledger(engine, ContentStore(tmp_path / "cas"))
    assert [o.op_id for o in reopened.load_trace("t1").ops] == ["r0/op0"]
    assert set(inspect(engine).get_table_names()) >= {"trace_run", "trace_op", "trace_prefect_link"}


def test_settings_defaults_and_overrides(tmp_path: Path) -> None:
    s = Settings.from_env({"MASERVE_HOME": str(tmp_path)})
    assert s.home == tmp_path.resolve()
    assert s.ledger_url == f"sqlite:///{tmp_path.resolve()}/ledger.db"
    assert s.cas_dir == tmp_path.resolve() / "cas"
    s2 = Settings.from_env(
        {
            "MASERVE_HOME": str(tmp_path),
            "MASERVE_LEDGER_URL": "sqlite://",
            "MASERVE_CAS_DIR": str(tmp_path / "x"),
        }
    )
    assert (s2.ledger_url, s2.cas_dir) == ("sqlite://", tmp_path.resolve() / "x")
    assert Settings.from_env({}).home == (Path.home() / ".maserve").resolve()
    with pytest.raises(ConfigError, match="MASERVE_LEDGER_URL"):
        Settings.from_env({"MASERVE_LEDGER_URL": "not a url"})


def test_ledger_from_settings_uses_maserve_home(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("MASERVE_HOME", str(tmp_path))
    monkeypatch.delenv("MASERVE_LEDGER_URL", raising=False)
    monkeypatch.delenv("MASERVE_CAS_DIR", raising=False)
    with Ledger.from_settings() as ledger:
        started(ledger)
        ledger.append_op("t1", make_op(0, out=b"z"), payloads={sha256_hex(b"z"): b"z"})
    assert (tmp_path / "ledger.db").is_file()
    assert ContentStore(tmp_path / "cas").has(sha256_hex(b"z"))


def test_ledger_still_exports_its_run_values() -> None:
    """The run values were split out of `ledger` into `runs`; `ledger` still exports them."""
    from maserve_prefect.trace import ledger, runs

    for name in ("PrefectLink", "RunInfo", "RunStatus"):
        assert name in ledger.__all__ and getattr(ledger, name) is getattr(runs, name)
