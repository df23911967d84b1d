"""AIPerf in and out: `trace export --aiperf`, `trace import-aiperf`, and the round trips.

The source trace is built here with times on the nanosecond grid (what a real clock records):
a fork-join root with a tool op between model calls, a single-call root with recorded prefix
hashes, and a model op that was never submitted. AIPerf's side is synthetic: records written
in AIPerf 0.13's documented `profile_export.jsonl` format from the exported schedule, as a
perfect replay would record them.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from maserve_prefect.cli.trace_cmd import app
from maserve_prefect.errors import TraceImportError, TraceValidationError
from maserve_prefect.interop.aiperf_export import (
    MAP_FILE,
    README_FILE,
    REQUESTS_FILE,
    SESSIONS_FILE,
    plan_aiperf_export,
)
from maserve_prefect.interop.aiperf_import import import_aiperf
from maserve_prefect.metrics.path import path_ledger
from maserve_prefect.metrics.task import root_latencies
from maserve_prefect.trace.bundle import export_bundle
from maserve_prefect.trace.cas import MemoryStore
from maserve_prefect.trace.ledger import Ledger
from maserve_prefect.trace.model import (
    Dep,
    EdgeKind,
    Manifest,
    OpKind,
    OpRecord,
    OpStatus,
    OpTimes,
    RootRecord,
    Trace,
)
from maserve_prefect.trace.mooncake import import_mooncake

runner = CliRunner()
BASE_NS = 1_759_813_207_000_000_000  # AIPerf's clock is the epoch, in ns


def _model(
    op_id: str,
    root: str,
    sub: float,
    first: float,
    done: float,
    n_in: int,
    n_out: int,
    deps: tuple[str, ...] = (),
    **kw: Any,
) -> OpRecord:
    return OpRecord(
        op_id=op_id,
        root_id=root,
        kind=OpKind.MODEL,
        deps=tuple(Dep(op_id=d, kind=EdgeKind.CONTROL) for d in deps),
        num_input_tokens=n_in,
        num_output_tokens=n_out,
        times=OpTimes(ready_s=sub, submitted_s=sub, first_token_s=first, completed_s=done),
        **kw,
    )


def source_trace() -> Trace:
    """r0: plan -> tool -> (w1 || w2) -> join; r1: one call with hashes; r2: never sent."""
    tool = OpRecord(
        op_id="r0/tool",
        root_id="r0",
        kind=OpKind.TOOL,
        tool_name="search",
        deps=(Dep(op_id="r0/plan", kind=EdgeKind.CONTROL),),
        times=OpTimes(ready_s=0.120000007, submitted_s=0.120000007, completed_s=0.2),
    )
    ops = [
        _model("r0/plan", "r0", 0.001000003, 0.010500001, 0.120000007, 700, 40),
        tool,
        _model("r0/w1", "r0", 0.200300011, 0.21, 0.61234567, 1500, 90, ("r0/tool",)),
        _model("r0/w2", "r0", 0.200400013, 0.215, 0.733333331, 1400, 64, ("r0/tool",)),
        _model("r0/join", "r0", 0.800000001, 0.81, 0.950000009, 3100, 20, ("r0/w1", "r0/w2")),
        _model(
            "r1/op0", "r1", 0.05, 0.0625, 0.3, 600, 5, prefix_block_hashes=(7, 8), block_size=512
        ),
        OpRecord(
            op_id="r2/op0",
            root_id="r2",
            kind=OpKind.MODEL,
            num_input_tokens=10,
            status=OpStatus.SKIPPED,
            error="cancelled first",
        ),
    ]
    roots = [
        RootRecord(root_id="r0", workflow="fork_join", arrival_s=0.0, final_op_id="r0/join"),
        RootRecord(root_id="r1", workflow="chat", arrival_s=0.05),
        RootRecord(root_id="r2", workflow="chat", arrival_s=0.5),
    ]
    return Trace(manifest=Manifest(trace_id="src"), roots=roots, ops=ops)


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


@pytest.fixture
def exported(tmp_path: Path) -> Path:
    """The source trace exported with `maserve trace export --bundle B --aiperf DIR`."""
    bundle = export_bundle(source_trace(), MemoryStore(), tmp_path / "bundle")
    out = tmp_path / "aiperf_in"
    result = runner.invoke(app, ["export", "--bundle", str(bundle), "--aiperf", str(out)])
    assert result.exit_code == 0, result.output
    assert "5 requests (1 multi-call roots as sessions)" in result.output
    return out


def record(
    conv: str,
    turn: int,
    start_ns: int,
    op: OpRecord,
    *,
    corr: str | None = None,
    error: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """One `profile_export.jsonl` record as AIPerf 0.13 writes it (streaming chat run)."""
    t = op.times
    assert t.first_token_s is not None and t.completed_s is not None
    first_ns = BASE_NS + round(t.first_token_s * 1e9)
    end_ns = BASE_NS + round(t.completed_s * 1e9)
    metrics = {
        "input_sequence_length": {"value": op.num_input_tokens, "unit": "tokens"},
        "time_to_first_token": {"value": (first_ns - start_ns) / 1e6, "unit": "ms"},
        "request_latency": {"value": (end_ns - start_ns) / 1e6, "unit": "ms"},
        "output_sequence_length": {"value": op.num_output_tokens, "unit": "tokens"},
        "inter_token_latency": {"value": 5.2, "unit": "ms"},
        "inter_chunk_latency": {"value": [4.9, 5.3], "unit": "ms"},
    }
    return {
        "metadata": {
            "session_num": 0,
            "x_request_id": f"req-{conv}-{turn}",
            "x_correlation_id": corr or f"corr-{conv}",
            "conversation_id": conv,
            "turn_index": turn,
            "request_start_ns": start_ns,
            "request_ack_ns": start_ns + 1000,
            "request_end_ns": end_ns,
            "worker_id": "worker_1",
            "record_processor_id": "record_processor_1",
            "benchmark_phase": "profiling",
            "was_cancelled": False,
            "cancellation_time_ns": None,
        },
        "metrics": metrics,
        "error": error,
    }


def records_from_requests(folder: Path) -> list[dict[str, Any]]:
    """A perfect fixed-schedule replay of `mooncake_trace.jsonl`: each request sent at its
    timestamp, answered at the source op's recorded times."""
    ops = source_trace().op_index()
    return [
        record(
            row["session_id"], 0, BASE_NS + round(row["timestamp"] * 1e6), ops[row["session_id"]]
        )
        for row in read_jsonl(folder / REQUESTS_FILE)
    ]


def write_records(path: Path, records: list[dict[str, Any]]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


def test_export_writes_mooncake_rows_sessions_map_and_readme(exported: Path) -> None:
    rows = read_jsonl(exported / REQUESTS_FILE)
    assert [r["session_id"] for r in rows] == ["r0/plan", "r1/op0", "r0/w1", "r0/w2", "r0/join"]
    assert [r["timestamp"] for r in rows] == sorted(r["timestamp"] for r in rows)
    for r in rows:
        n = len(r["hash_ids"])
        assert (n - 1) * 512 < r["input_length"] <= n * 512
    assert rows[1]["hash_ids"] == [7, 8]  # recorded prefix hashes kept
    fresh = [h for r in rows if r["session_id"] != "r1/op0" for h in r["hash_ids"]]
    assert len(set(fresh)) == len(fresh) and min(fresh) > 8  # no sharing invented
    sessions = [s for s in read_jsonl(exported / SESSIONS_FILE) if s["session_id"] == "r0"]
    assert "timestamp" in sessions[0] and all("delay" in s for s in sessions[1:])
    # w1 is sent 80.3 ms after plan's reply (the tool ran in between); its new tokens are
    # what its prompt adds to plan's prompt and reply.
    assert sessions[1]["delay"] == pytest.approx(80.300004)
    assert sessions[1]["input_length"] == 1500 - 700 - 40
    by_op = {m["op_id"]: m for m in read_jsonl(exported / MAP_FILE)}
    assert by_op["r0/w1"]["deps"] == ["r0/plan"]  # through the tool op
    assert by_op["r0/join"]["deps"] == ["r0/w1", "r0/w2"]
    assert by_op["r0/join"]["final"] and by_op["r1/op0"]["workflow"] == "chat"
    readme = (exported / README_FILE).read_text()
    assert "--custom-dataset-type mooncake_trace --fixed-schedule" in readme
    assert str(exported / REQUESTS_FILE) in readme
    assert "(tools, transforms, state): 1" in readme and "submitted: 1." in readme


def test_export_then_import_mooncake_keeps_times_lengths_hashes(exported: Path) -> None:
    ops = source_trace().op_index()
    back = import_mooncake(exported / REQUESTS_FILE, strict=True)
    rows = read_jsonl(exported / REQUESTS_FILE)
    assert len(back.trace.ops) == len(rows)
    for row, op in zip(rows, back.trace.ops, strict=True):
        src = ops[row["session_id"]]
        assert op.times.submitted_s == src.times.submitted_s  # exact
        assert (op.num_input_tokens, op.num_output_tokens) == (
            src.num_input_tokens,
            src.num_output_tokens,
        )
        assert list(op.prefix_block_hashes) == row["hash_ids"]


def _ledger_url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'ledger.db'}"


def test_aiperf_round_trip_keeps_every_op_time_and_token_count(
    exported: Path, tmp_path: Path
) -> None:
    prof = write_records(tmp_path / "profile_export.jsonl", records_from_requests(exported))
    url = _ledger_url(tmp_path)
    result = runner.invoke(
        app,
        [
            "import-aiperf",
            str(prof),
            "--schedule",
            str(exported),
            "--trace-id",
            "ap1",
            "--ledger",
            url,
            "--slo",
            "0.9",
            "--slo",
            "chat=0.2",
        ],
    )
    assert result.exit_code == 0, result.output
    assert "recorded as run ap1" in result.output and "SLO attainment" in result.output
    with Ledger(url, MemoryStore()) as ledger:
        got = ledger.load_trace("ap1")
    src = source_trace().op_index()
    assert {o.op_id for o in got.ops} == {"r0/plan", "r0/w1", "r0/w2", "r0/join", "r1/op0"}
    for op in got.ops:
        s = src[op.op_id]
        assert op.root_id == s.root_id
        assert op.times.submitted_s == s.times.submitted_s
        assert op.times.first_token_s == s.times.first_token_s
        assert op.times.completed_s == s.times.completed_s
        assert (op.num_input_tokens, op.num_output_tokens) == (
            s.num_input_tokens,
            s.num_output_tokens,
        )
    assert [d.op_id for d in got.op_index()["r0/join"].deps] == ["r0/w1", "r0/w2"]
    # Task level on the AIPerf run: root latency ends at the final op, the completion path
    # follows the recorded dependencies (w2 finished last, so it binds the join).
    lats = {r.root_id: r for r in root_latencies(got)}
    assert lats["r0"].latency_s == 0.950000009  # from the scheduled arrival at 0 s
    assert lats["r0"].workload_class == "fork_join"
    assert lats["r1"].latency_s == 0.3 - 0.05
    paths = {p.root_id: [s.op_id for s in p.segments] for p in path_ledger(got)}
    assert paths["r0"] == ["r0/plan", "r0/w2", "r0/join"]
    assert "chat" in result.output and "fork_join" in result.output


def test_sessions_file_records_map_to_the_same_ops(exported: Path, tmp_path: Path) -> None:
    ops = source_trace().op_index()
    by_turn = {(m["root_session"], m["turn"]): m for m in read_jsonl(exported / MAP_FILE)}
    recs = []
    for row in read_jsonl(exported / SESSIONS_FILE):
        turn = sum(1 for r in recs if r["metadata"]["conversation_id"] == row["session_id"])
        op = ops[by_turn[(row["session_id"], turn)]["op_id"]]
        start = BASE_NS + round((op.times.submitted_s or 0.0) * 1e9)
        recs.append(record(row["session_id"], turn, start, op))
    prof = write_records(tmp_path / "profile_export.jsonl", recs)
    got = import_aiperf(prof, schedule=exported).trace
    for op in got.ops:
        assert op.times.completed_s == ops[op.op_id].times.completed_s
        assert op.times.submitted_s == ops[op.op_id].times.submitted_s


def test_import_without_schedule_makes_one_root_per_session(tmp_path: Path) -> None:
    a = _model("x", "x", 1.0, 1.1, 1.5, 100, 10)
    b = _model("y", "y", 2.0, 2.2, 2.5, 300, 12)
    c = _model("z", "z", 1.2, 1.3, 1.4, 50, 3)
    recs = [
        record("conv-a", 0, BASE_NS + 1_000_000_000, a),
        record("conv-a", 1, BASE_NS + 2_000_000_000, b),
        record("conv-b", 0, BASE_NS + 1_200_000_000, c, error=None),
    ]
    recs.append(
        {
            "metadata": {
                "conversation_id": "conv-c",
                "turn_index": 0,
                "request_start_ns": BASE_NS + 1_300_000_000,
                "request_end_ns": BASE_NS + 1_300_600_000,
                "was_cancelled": True,
            },
            "metrics": {"error_isl": {"value": 550, "unit": "tokens"}},
            "error": {"code": 499, "type": "RequestCancellationError", "message": "cancelled"},
        }
    )
    recs.append(dict(recs[0], metadata=dict(recs[0]["metadata"], benchmark_phase="warmup")))
    got = import_aiperf(write_records(tmp_path / "p.jsonl", recs))
    trace = got.trace
    assert [r.root_id for r in trace.roots] == ["corr-conv-a", "corr-conv-b", "conv-c"]
    idx = trace.op_index()
    first = idx["corr-conv-a/turn0"]
    assert first.times.submitted_s == 0.0 and first.times.completed_s == 0.5
    assert first.times.first_token_s == pytest.approx(0.1, abs=1e-12)
    assert [d.op_id for d in idx["corr-conv-a/turn1"].deps] == ["corr-conv-a/turn0"]
    failed = idx["conv-c/turn0"]
    assert failed.status is OpStatus.FAILED and failed.num_input_tokens == 550
    assert "RequestCancellationError (499)" in (failed.error or "")
    assert (got.num_records, got.num_failed, got.num_skipped_phase) == (5, 1, 1)
    lats = {r.root_id: r.latency_s for r in root_latencies(trace)}
    assert lats["corr-conv-a"] == 1.5 and lats["conv-c"] is None


def _good(exported: Path) -> list[dict[str, Any]]:
    return records_from_requests(exported)


def _set(rec: dict[str, Any], path: str, value: Any) -> dict[str, Any]:
    rec = json.loads(json.dumps(rec))
    *parents, leaf = path.split(".")
    node = rec
    for p in parents:
        node = node[p]
    if value is _DROP:
        del node[leaf]
    else:
        node[leaf] = value
    return rec


_DROP = object()
BAD = [
    ("not json", None, "not valid JSON"),
    ("no metadata", ("metadata", _DROP), "no metadata object"),
    ("start as text", ("metadata.request_start_ns", "soon"), "request_start_ns must be an integer"),
    ("end before start", ("metadata.request_end_ns", 5), "is before request_start_ns"),
    ("no isl", ("metrics.input_sequence_length", _DROP), "needs metrics input_sequence_length"),
    ("bad unit", ("metrics.time_to_first_token.unit", "fortnights"), "has unit 'fortnights'"),
    ("fractional tokens", ("metrics.output_sequence_length.value", 2.5), "whole number of tokens"),
    ("unknown conversation", ("metadata.conversation_id", "nope"), "is not in the schedule map"),
    ("conversation id a number", ("metadata.conversation_id", 7), "non-empty string or null"),
    ("turn negative", ("metadata.turn_index", -1), "turn_index must be >= 0"),
]


@pytest.mark.parametrize(("name", "change", "message"), BAD, ids=[b[0] for b in BAD])
def test_bad_record_is_one_line_naming_file_and_line_and_nothing_is_written(
    exported: Path, tmp_path: Path, name: str, change: tuple[str, Any] | None, message: str
) -> None:
    recs = _good(exported)
    lines = [json.dumps(r) for r in recs]
    lines[2] = "{not json" if change is None else json.dumps(_set(recs[2], *change))
    prof = tmp_path / "profile_export.jsonl"
    prof.write_text("\n".join(lines) + "\n")
    url = _ledger_url(tmp_path)
    result = runner.invoke(
        app, ["import-aiperf", str(prof), "--schedule", str(exported), "--ledger", url]
    )
    assert result.exit_code == 1
    err = result.output.strip()
    assert len(err.splitlines()) == 1 and f"{prof}:3:" in err and message in err, err
    with Ledger(url, MemoryStore()) as ledger:
        assert ledger.list_runs() == []


def test_request_sent_twice_is_refused_with_both_lines(exported: Path, tmp_path: Path) -> None:
    recs = _good(exported)
    prof = write_records(tmp_path / "p.jsonl", [*recs, recs[0]])
    result = runner.invoke(
        app,
        [
            "import-aiperf",
            str(prof),
            "--schedule",
            str(exported),
            "--ledger",
            _ledger_url(tmp_path),
        ],
    )
    assert result.exit_code == 1
    assert f"{prof}:6:" in result.output and "already sent at line 1" in result.output


def test_ledger_record_trace_is_all_or_nothing() -> None:
    ledger = Ledger("sqlite://", MemoryStore())
    op = OpRecord(op_id="r/0", root_id="r", kind=OpKind.MODEL)
    dup = Trace(manifest=Manifest(trace_id="t"), roots=[RootRecord(root_id="r")], ops=[op, op])
    with pytest.raises(TraceValidationError, match="clashes"):
        ledger.record_trace(dup)
    assert ledger.list_runs() == []  # neither the run nor its root was left behind
    ok = dup.model_copy(update={"ops": [op]})
    ledger.record_trace(ok)
    with pytest.raises(TraceValidationError, match="already recorded"):
        ledger.record_trace(ok)
    assert [r.num_ops for r in ledger.list_runs()] == [1]


def test_export_refuses_negative_times() -> None:
    trace = source_trace()
    early = trace.ops[0].model_copy(update={"times": OpTimes(submitted_s=-0.5, completed_s=0.1)})
    with pytest.raises(TraceValidationError, match="before time 0"):
        plan_aiperf_export(trace.model_copy(update={"ops": [early, *trace.ops[1:]]}))


def test_export_from_the_ledger_equals_export_from_the_bundle(
    exported: Path, tmp_path: Path
) -> None:
    url = _ledger_url(tmp_path)
    with Ledger(url, MemoryStore()) as ledger:
        ledger.record_trace(source_trace())
    out = tmp_path / "from_ledger"
    args = ["export", "--run", "src", "--ledger", url, "--aiperf", str(out)]
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    for name in (REQUESTS_FILE, SESSIONS_FILE, MAP_FILE):
        assert (out / name).read_text() == (exported / name).read_text()
    again = runner.invoke(app, args)  # an existing, non-empty folder is refused...
    assert again.exit_code == 1 and "--force" in again.output
    assert runner.invoke(app, [*args, "--force"]).exit_code == 0  # ...unless --force


def test_null_conversation_id_falls_back_to_the_session_instance(tmp_path: Path) -> None:
    a = _model("x", "x", 1.0, 1.1, 1.5, 100, 10)
    rec = record("ignored", 0, BASE_NS + 1_000_000_000, a, corr="sess-9")
    rec["metadata"].update(conversation_id=None, turn_index=None)
    no_ids = json.loads(json.dumps(rec))
    no_ids["metadata"].update(x_correlation_id=None, x_request_id=None)
    got = import_aiperf(write_records(tmp_path / "p.jsonl", [rec])).trace
    assert [o.op_id for o in got.ops] == ["sess-9/turn0"]
    with pytest.raises(TraceImportError, match=r"p2.jsonl:1: metadata has no conversation_id"):
        import_aiperf(write_records(tmp_path / "p2.jsonl", [no_ids]))


def test_simulator_times_off_the_ns_grid_come_back_to_the_nanosecond(tmp_path: Path) -> None:
    """A virtual clock's times are arbitrary floats: AIPerf records whole nanoseconds, so the
    round trip returns each time rounded to the nanosecond, exactly."""
    ops = [
        _model(f"q{i}/op0", f"q{i}", sub, sub + 0.0123456789123, sub + 0.4567891234567, 90, 7)
        for i, sub in enumerate((0.1234567890123, 1.0 / 3.0, 2.718281828459045))
    ]
    roots = [RootRecord(root_id=o.root_id, arrival_s=o.times.submitted_s or 0.0) for o in ops]
    trace = Trace(manifest=Manifest(trace_id="sim"), roots=roots, ops=ops)
    bundle = export_bundle(trace, MemoryStore(), tmp_path / "b")
    out = tmp_path / "in"
    assert (
        runner.invoke(app, ["export", "--bundle", str(bundle), "--aiperf", str(out)]).exit_code == 0
    )
    src = trace.op_index()
    recs = [
        record(r["session_id"], 0, BASE_NS + round(r["timestamp"] * 1e6), src[r["session_id"]])
        for r in read_jsonl(out / REQUESTS_FILE)
    ]
    got = import_aiperf(write_records(tmp_path / "p.jsonl", recs), schedule=out).trace
    for op in got.ops:
        s, t = src[op.op_id].times, op.times
        for name in ("submitted_s", "first_token_s", "completed_s"):
            want = getattr(s, name)
            assert getattr(t, name) == round(want * 1e9) / 1e9, (op.op_id, name)
