"""Import a Mooncake (FAST'25) JSONL request trace as a Semantic Trace of single-call roots.

Each line is one request: `timestamp` (ms since trace start), `input_length`, `output_length`
(tokens) and `hash_ids` (one id per `block_size`-token prompt block; equal ids mean a shared
prefix block). A row is accepted iff it parses and

    (len(hash_ids) - 1) * block_size < input_length <= len(hash_ids) * block_size,

i.e. the hash list covers the prompt with a partial last block at most. Each accepted row becomes a
`RootRecord` (`workflow="mooncake"`, `arrival_s = timestamp / 1000`) with one model `OpRecord`
carrying the token counts, prefix-block hashes, and `ready_s = submitted_s = arrival_s` (the
timestamp *is* the observed submission, which the Arrival release rule replays).

Rows whose values no replay could serve are rejected too: `input_length + output_length` beyond
`max_context_tokens` (a model's context window: `--model` in the CLI; by default
`MAX_CONTEXT_TOKENS`, above any model's) and timestamps beyond a 100-year span
(`MAX_TIMESTAMP_MS`).

Rows that import but look wrong are *warnings* (`MooncakeImport.warnings`, same shape as the
rejections): a zero `input_length` or `output_length`, a timestamp earlier than an earlier row's
(out of order), and a row equal to an earlier one (duplicate). `strict=True` refuses the first
rejected row *or* warning. A file from which no row imports is an error, never an empty trace.

Root ids carry the 1-based source line, zero-padded to six digits (`mc-000001`), so a root can be
traced back to its row even when earlier rows were skipped. Blank lines are not rows.

The file is streamed once: each line is hashed (manifest `notes.sha256`), parsed with `json` and
checked by hand; records are then built with `model_construct` because every field was already
checked here (validating twice would dominate the import time).

Examples:
    >>> import pathlib, tempfile
    >>> p = pathlib.Path(tempfile.mkdtemp()) / "t.jsonl"
    >>> _ = p.write_text('{"timestamp": 5, "input_length": 600, "output_length": 3, "hash_ids": [7, 8]}\\n'
    ...                  '{"timestamp": 9, "input_length": 10}\\n')
    >>> res = import_mooncake(p)
    >>> [r.root_id for r in res.trace.roots], [(r.line, r.reason) for r in res.rejected]
    (['mc-000001'], [(2, 'missing_field')])
"""

from __future__ import annotations

import hashlib
import json
import math
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from maserve_prefect.errors import TraceImportError
from maserve_prefect.trace.model import Manifest, OpKind, OpRecord, OpTimes, RootRecord, Trace

MOONCAKE_BLOCK_SIZE = 512
MAX_CONTEXT_TOKENS = 1 << 24
"""Tokens per request (prompt + output) above which a row is refused when no model is named:
larger than any model's context window (16,777,216)."""
MAX_TIMESTAMP_MS = 100 * 365.25 * 86_400 * 1000.0
"""A 100-year span: timestamps (ms since the trace start) beyond it are refused."""
_FIELDS = ("timestamp", "input_length", "output_length", "hash_ids")


@dataclass(slots=True, frozen=True)
class RejectedRow:
    """A row that was not imported.

    Attributes:
        line: 1-based line number in the source file.
        reason: short category, for grouping: rejections `malformed_json`, `not_an_object`,
            `missing_field`, `bad_type`, `negative_value`, `block_count`, `beyond_context`,
            `timestamp_range`; warnings `zero_length`, `out_of_order`, `duplicate`.
        detail: what exactly was wrong and the offending values.
    """

    line: int
    reason: str
    detail: str


@dataclass(slots=True)
class MooncakeImport:
    """Result of `import_mooncake`.

    Attributes:
        trace: the imported trace (accepted rows only).
        num_rows: non-blank lines read.
        rejected: rows skipped, in line order.
        warnings: rows imported that look wrong (zero length, out of order, duplicate).
    """

    trace: Trace
    num_rows: int
    rejected: list[RejectedRow] = field(default_factory=list)
    warnings: list[RejectedRow] = field(default_factory=list)

    @property
    def num_accepted(self) -> int:
        """Rows that became roots."""
        return self.num_rows - len(self.rejected)

    def rejected_by_reason(self) -> dict[str, list[int]]:
        """Reason category → line numbers, in line order."""
        return _by_reason(self.rejected)

    def warnings_by_reason(self) -> dict[str, list[int]]:
        """Warning category → line numbers, in line order."""
        return _by_reason(self.warnings)


def _by_reason(rows: list[RejectedRow]) -> dict[str, list[int]]:
    out: dict[str, list[int]] = defaultdict(list)
    for row in rows:
        out[row.reason].append(row.line)
    return dict(out)


class _BadRow(Exception):
    """Internal: a row failed a check (reason category, detail)."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(detail)
        self.reason = reason
        self.detail = detail


def _int_field(row: dict[str, Any], name: str) -> int:
    value = row[name]
    # bool is an int subclass; `true` is not a token count.
    if isinstance(value, bool) or not isinstance(value, int):
        raise _BadRow("bad_type", f"{name} must be an integer, got {value!r}")
    if value < 0:
        raise _BadRow("negative_value", f"{name} must be >= 0, got {value}")
    return value


def _parse_row(
    raw: bytes, block_size: int, max_context_tokens: int
) -> tuple[float, int, int, tuple[int, ...]]:
    """Check one line; return (arrival_s, input_length, output_length, hash_ids)."""
    try:
        row = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise _BadRow("malformed_json", f"not valid JSON ({exc})") from None
    if not isinstance(row, dict):
        raise _BadRow("not_an_object", f"expected a JSON object, got {type(row).__name__}")
    missing = [name for name in _FIELDS if name not in row]
    if missing:
        raise _BadRow("missing_field", f"missing field(s) {', '.join(missing)}")
    ts = row["timestamp"]
    if isinstance(ts, bool) or not isinstance(ts, int | float):
        raise _BadRow("bad_type", f"timestamp must be a number of ms, got {ts!r}")
    if not math.isfinite(ts):
        raise _BadRow("bad_type", f"timestamp must be finite, got {ts}")
    if ts < 0:
        raise _BadRow("negative_value", f"timestamp must be >= 0 ms, got {ts}")
    if ts > MAX_TIMESTAMP_MS:
        raise _BadRow(
            "timestamp_range",
            f"timestamp {ts} ms is beyond a 100-year span ({MAX_TIMESTAMP_MS:.0f} ms); "
            "timestamps are ms since the trace start",
        )
    num_in = _int_field(row, "input_length")
    num_out = _int_field(row, "output_length")
    if num_in + num_out > max_context_tokens:
        raise _BadRow(
            "beyond_context",
            f"input_length + output_length = {num_in + num_out} tokens exceeds the context "
            f"window of {max_context_tokens} tokens",
        )
    hash_ids = row["hash_ids"]
    if not isinstance(hash_ids, list) or any(
        isinstance(h, bool) or not isinstance(h, int) for h in hash_ids
    ):
        raise _BadRow("bad_type", "hash_ids must be a list of integers")
    n = len(hash_ids)
    if not (n - 1) * block_size < num_in <= n * block_size:
        raise _BadRow(
            "block_count",
            f"{n} hash_ids of {block_size} tokens cannot cover input_length={num_in} "
            f"(need {(n - 1) * block_size} < input_length <= {n * block_size})",
        )
    return ts / 1000.0, num_in, num_out, tuple(hash_ids)


def _records(
    line_no: int, parsed: tuple[float, int, int, tuple[int, ...]], block_size: int
) -> tuple[RootRecord, OpRecord]:
    arrival_s, num_in, num_out, hash_ids = parsed
    root_id = f"mc-{line_no:06d}"
    root = RootRecord.model_construct(root_id=root_id, workflow="mooncake", arrival_s=arrival_s)
    op = OpRecord.model_construct(
        op_id=f"{root_id}/op0",
        root_id=root_id,
        kind=OpKind.MODEL,
        num_input_tokens=num_in,
        num_output_tokens=num_out,
        prefix_block_hashes=hash_ids,
        block_size=block_size,
        times=OpTimes.model_construct(ready_s=arrival_s, submitted_s=arrival_s),
    )
    return root, op


def _warnings(
    parsed: tuple[float, int, int, tuple[int, ...]], latest_s: float, seen: set[bytes]
) -> list[tuple[str, str]]:
    """The warnings of an accepted row: (reason, detail); records its key in `seen`."""
    arrival_s, num_in, num_out, _ = parsed
    found = []
    if num_in == 0 or num_out == 0:
        found.append(
            ("zero_length", f"input_length={num_in}, output_length={num_out}: a zero length")
        )
    if arrival_s < latest_s:
        found.append(
            ("out_of_order", f"timestamp {arrival_s * 1000:g} ms is earlier than an earlier "
             f"row's {latest_s * 1000:g} ms")
        )  # fmt: skip
    key = hashlib.blake2b(repr(parsed).encode(), digest_size=16).digest()
    if key in seen:
        found.append(("duplicate", "the same timestamp, lengths and hash_ids as an earlier row"))
    seen.add(key)
    return found


def import_mooncake(
    path: str | Path,
    *,
    strict: bool = False,
    block_size: int = MOONCAKE_BLOCK_SIZE,
    max_context_tokens: int = MAX_CONTEXT_TOKENS,
) -> MooncakeImport:
    """Read a Mooncake JSONL trace into a Semantic Trace.

    Args:
        path: the JSONL file.
        strict: raise at the first bad row or warning instead of skipping / noting it.
        block_size: tokens per `hash_ids` block (512 in the FAST'25 traces).
        max_context_tokens: refuse rows whose prompt plus output exceed it (a model's context
            window).

    Returns:
        The trace of accepted rows, the number of rows read, the rejected rows and warnings.

    Raises:
        TraceImportError: the file cannot be read, no row was imported, or (`strict=True`) a
            row is bad or draws a warning; the message names the file and line.

    Examples:
        >>> import_mooncake("/no/such.jsonl")  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        maserve_prefect.errors.TraceImportError: cannot read Mooncake trace /no/such.jsonl: ...
    """
    path = Path(path)
    if block_size <= 0:
        raise TraceImportError(f"block_size must be positive, got {block_size}")
    if max_context_tokens <= 0:
        raise TraceImportError(f"max_context_tokens must be positive, got {max_context_tokens}")
    digest = hashlib.sha256()
    roots: list[RootRecord] = []
    ops: list[OpRecord] = []
    rejected: list[RejectedRow] = []
    warnings: list[RejectedRow] = []
    seen: set[bytes] = set()
    latest_s = -math.inf
    num_rows = 0
    try:
        with path.open("rb") as fh:
            for line_no, raw in enumerate(fh, start=1):
                digest.update(raw)
                if not raw.strip():
                    continue
                num_rows += 1
                try:
                    parsed = _parse_row(raw, block_size, max_context_tokens)
                except _BadRow as bad:
                    if strict:
                        raise TraceImportError(
                            f"{path}:{line_no}: {bad.detail}; fix the row or import without "
                            "--strict to skip and count bad rows"
                        ) from None
                    rejected.append(RejectedRow(line_no, bad.reason, bad.detail))
                    continue
                for reason, detail in _warnings(parsed, latest_s, seen):
                    if strict:
                        raise TraceImportError(
                            f"{path}:{line_no}: {detail} ({reason}); fix the row or import "
                            "without --strict to keep it with a warning"
                        )
                    warnings.append(RejectedRow(line_no, reason, detail))
                latest_s = max(latest_s, parsed[0])
                root, op = _records(line_no, parsed, block_size)
                roots.append(root)
                ops.append(op)
    except OSError as exc:
        raise TraceImportError(f"cannot read Mooncake trace {path}: {exc.strerror}") from None
    if not roots:
        reasons = ", ".join(
            f"{len(lines)} {reason}" for reason, lines in _by_reason(rejected).items()
        )
        raise TraceImportError(
            f"{path}: no row imported ({num_rows} rows read"
            + (f"; rejected: {reasons}" if reasons else "")
            + "); a Mooncake trace holds one JSON object per line with timestamp, "
            "input_length, output_length and hash_ids"
        )
    sha = digest.hexdigest()
    manifest = Manifest(
        trace_id=f"mooncake-{path.stem}-{sha[:12]}",
        source="mooncake",
        notes={
            "file": path.name,
            "sha256": sha,
            "block_size": block_size,
            "num_rows": num_rows,
            "num_rejected": len(rejected),
            "num_warnings": len(warnings),
        },
    )
    trace = Trace.model_construct(
        manifest=manifest, roots=roots, stages=[], sessions=[], ops=ops, samples=[]
    )
    return MooncakeImport(trace=trace, num_rows=num_rows, rejected=rejected, warnings=warnings)
