"""AIPerf's per-request records (`profile_export.jsonl`), read and checked line by line.

The one idea: every line is checked by hand into a plain `AiperfRecord` — the record's times as
integer nanoseconds, its token counts and error — or refused with a `BadRecord` naming what is
wrong; `read_records` stops at the first bad line with one message naming the file and line, so
nothing downstream ever sees half a file.

The format (AIPerf 0.13, "Working with Profile Export Files"): one JSON object per request,

    {"metadata": {"conversation_id", "turn_index", "x_request_id", "x_correlation_id",
                  "request_start_ns", "request_ack_ns", "request_end_ns", "benchmark_phase",
                  "was_cancelled", "cancellation_time_ns", "worker_id", ...},
     "metrics": {"time_to_first_token": {"value": 12.5, "unit": "ms"},
                 "input_sequence_length": {"value": 550, "unit": "tokens"},
                 "output_sequence_length": {"value": 9, "unit": "tokens"}, ...} | null,
     "error": null | {"code", "type", "message"}}

Used here: `request_start_ns` / `request_end_ns` (epoch ns), `time_to_first_token` (streaming
runs; its unit converted to ns and rounded, which recovers AIPerf's integer-ns difference),
`input_sequence_length` and `output_sequence_length` (else `output_token_count`), `error_isl`
(a failed request's prompt length), `conversation_id` (the dataset conversation: with
`maserve trace export --aiperf`, the op or root id; AIPerf's schema allows null, and then
`x_correlation_id`, else `x_request_id`, stands in), `x_correlation_id` (the session instance)
and `turn_index` (null read as 0). Fields not named here are ignored; records of a phase other
than `profiling` (warm-up) are counted and skipped by the importer.

Examples:
    >>> rec = parse_record(b'{"metadata": {"conversation_id": "c", "turn_index": 0,'
    ...     b' "request_start_ns": 1000, "request_end_ns": 5000}, "metrics": {'
    ...     b'"time_to_first_token": {"value": 0.002, "unit": "ms"},'
    ...     b' "input_sequence_length": {"value": 7, "unit": "tokens"},'
    ...     b' "output_sequence_length": {"value": 3, "unit": "tokens"}}, "error": null}', 1)
    >>> rec.first_token_ns, rec.num_input_tokens, rec.num_output_tokens
    (3000, 7, 3)
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from maserve_prefect.errors import TraceImportError

NS_PER_UNIT = {"ns": 1, "us": 1_000, "ms": 1_000_000, "s": 1_000_000_000, "sec": 1_000_000_000}
"""Time units AIPerf writes metric values in, as nanoseconds."""
PROFILING = "profiling"


class BadRecord(Exception):
    """Internal: one line is not a usable AIPerf record (what is wrong)."""


@dataclass(frozen=True, slots=True)
class AiperfRecord:
    """One request as AIPerf recorded it (times in epoch nanoseconds).

    Attributes:
        line: 1-based line in the file.
        conversation_id: the dataset conversation (session) the request belongs to.
        correlation_id: the session instance (`x_correlation_id`), when recorded.
        turn_index: position in the conversation (0 for single-turn).
        request_id: `x_request_id`, when recorded.
        phase: `benchmark_phase` (`profiling` unless recorded otherwise).
        start_ns / end_ns: request sent / last response received (`end_ns` None only for a
            failed request that recorded none).
        first_token_ns: start + time to first token (streaming runs), else None.
        num_input_tokens / num_output_tokens: ISL and OSL (a failed request: `error_isl`, 0).
        error: "type (code): message" of a failed or cancelled request, else None.
    """

    line: int
    conversation_id: str
    correlation_id: str | None
    turn_index: int
    request_id: str | None
    phase: str
    start_ns: int
    end_ns: int | None
    first_token_ns: int | None
    num_input_tokens: int
    num_output_tokens: int
    error: str | None


def _obj(value: Any, what: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise BadRecord(f"{what} must be a JSON object, got {type(value).__name__}")
    return value


def _int(value: Any, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise BadRecord(f"{what} must be an integer, got {value!r}")
    if value < 0:
        raise BadRecord(f"{what} must be >= 0, got {value}")
    return value


def _metric(metrics: dict[str, Any], name: str) -> tuple[float, str] | None:
    """(value, unit) of metric `name`, None when absent."""
    if name not in metrics or metrics[name] is None:
        return None
    m = metrics[name]
    if not isinstance(m, dict) or "value" not in m or not isinstance(m.get("unit"), str):
        raise BadRecord(f'metrics.{name} must be {{"value": number, "unit": str}}, got {m!r}')
    v = m["value"]
    if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v) or v < 0:
        raise BadRecord(f"metrics.{name}.value must be a finite number >= 0, got {v!r}")
    return float(v), m["unit"]


def _tokens(metrics: dict[str, Any], *names: str) -> int | None:
    for name in names:
        got = _metric(metrics, name)
        if got is None:
            continue
        value, unit = got
        if unit != "tokens" or not value.is_integer():
            raise BadRecord(
                f"metrics.{name} must be a whole number of tokens, got {value:g} {unit}"
            )
        return int(value)
    return None


def _duration_ns(metrics: dict[str, Any], name: str) -> int | None:
    got = _metric(metrics, name)
    if got is None:
        return None
    value, unit = got
    if unit not in NS_PER_UNIT:
        raise BadRecord(
            f"metrics.{name} has unit {unit!r}; expected one of {', '.join(NS_PER_UNIT)}"
        )
    return round(value * NS_PER_UNIT[unit])


def _error_text(error: Any) -> str | None:
    if error is None:
        return None
    err = _obj(error, "error")
    kind, code, msg = err.get("type"), err.get("code"), err.get("message")
    head = str(kind or "error") + (f" ({code})" if code is not None else "")
    return f"{head}: {msg}" if msg else head


def parse_record(raw: bytes, line: int) -> AiperfRecord:
    """Check one line of `profile_export.jsonl` (see the module docstring).

    Raises:
        BadRecord: what is wrong with it.
    """
    try:
        row = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise BadRecord(f"not valid JSON ({exc})") from None
    row = _obj(row, "a record")
    if "metadata" not in row:
        raise BadRecord("no metadata object; an AIPerf record has metadata, metrics and error")
    meta = _obj(row["metadata"], "metadata")
    metrics_raw = row.get("metrics")
    metrics = {} if metrics_raw is None else _obj(metrics_raw, "metrics")
    error = _error_text(row.get("error"))
    cancelled = meta.get("was_cancelled", False)
    if not isinstance(cancelled, bool):
        raise BadRecord(f"metadata.was_cancelled must be true or false, got {cancelled!r}")
    if cancelled and error is None:
        error = "cancelled"
    ids = {k: meta.get(k) for k in ("conversation_id", "x_correlation_id", "x_request_id")}
    for key, value in ids.items():
        if value is not None and (not isinstance(value, str) or not value):
            raise BadRecord(f"metadata.{key} must be a non-empty string or null, got {value!r}")
    # AIPerf's schema allows a null conversation_id (no dataset conversation): the session
    # instance, else the request, names it then.
    conv = next((v for v in ids.values() if v is not None), None)
    if conv is None:
        raise BadRecord(
            "metadata has no conversation_id, x_correlation_id or x_request_id: nothing names "
            "the request"
        )
    raw_turn = meta.get("turn_index")
    turn = 0 if raw_turn is None else _int(raw_turn, "metadata.turn_index")
    start = _int(meta.get("request_start_ns"), "metadata.request_start_ns")
    raw_end = meta.get("request_end_ns")
    # A failed request may have recorded no end.
    end = (
        None if raw_end is None and error is not None else _int(raw_end, "metadata.request_end_ns")
    )
    if end is not None and end < start:
        raise BadRecord(f"metadata.request_end_ns {end} is before request_start_ns {start}")
    ttft = _duration_ns(metrics, "time_to_first_token")
    first = None if ttft is None else start + ttft
    if first is not None and end is not None and first > end:
        raise BadRecord(
            f"time_to_first_token puts the first token at {first} ns, after request_end_ns {end}"
        )
    if error is None:
        isl = _tokens(metrics, "input_sequence_length")
        osl = _tokens(metrics, "output_sequence_length", "output_token_count")
        missing = [
            n
            for n, v in (("input_sequence_length", isl), ("output_sequence_length", osl))
            if v is None
        ]
        if missing:
            raise BadRecord(
                f"a successful request needs metrics {' and '.join(missing)} (the token counts)"
            )
    else:
        isl = _tokens(metrics, "input_sequence_length", "error_isl")
        osl = _tokens(metrics, "output_sequence_length", "output_token_count")
    phase = meta.get("benchmark_phase") or PROFILING
    return AiperfRecord(
        line=line,
        conversation_id=conv,
        correlation_id=ids["x_correlation_id"],
        turn_index=turn,
        request_id=ids["x_request_id"],
        phase=str(phase),
        start_ns=start,
        end_ns=end,
        first_token_ns=first,
        num_input_tokens=isl or 0,
        num_output_tokens=osl or 0,
        error=error,
    )


@dataclass(slots=True)
class RecordFile:
    """Every record of one file, in line order, with the file's SHA-256."""

    path: Path
    records: list[AiperfRecord]
    sha256: str


def _lines(path: Path, digest: Any) -> Iterator[tuple[int, bytes]]:
    with path.open("rb") as fh:
        for line_no, raw in enumerate(fh, start=1):
            digest.update(raw)
            if raw.strip():
                yield line_no, raw


def read_records(path: str | Path) -> RecordFile:
    """Read and check every line of `path`; refuse the file at its first bad line.

    Raises:
        TraceImportError: the file cannot be read, holds no record, or a line is bad; the
            message names the file and line and what is wrong.
    """
    path = Path(path)
    digest = hashlib.sha256()
    records: list[AiperfRecord] = []
    try:
        for line_no, raw in _lines(path, digest):
            try:
                records.append(parse_record(raw, line_no))
            except BadRecord as bad:
                raise TraceImportError(
                    f"{path}:{line_no}: {bad}; fix or remove the line (nothing was imported)"
                ) from None
    except OSError as exc:
        raise TraceImportError(f"cannot read AIPerf records {path}: {exc.strerror}") from None
    if not records:
        raise TraceImportError(
            f"{path}: no record; give AIPerf's profile_export.jsonl (one JSON record per request)"
        )
    return RecordFile(path=path, records=records, sha256=digest.hexdigest())
