"""Import a Mooncake (FAST'25) JSONL request trace as a Semantic Trace of single-call roots.

Each line is one request: `timestamp` (ms since trace start), `input_length`, `output_length`
(tokens) and `hash_ids` (one id per `block_size`-token prompt block; equal ids mean a shared
prefix block). A row is accepted iff it parses and

    (len(hash_ids) - 1) * block_size < input_length <= len(hash_ids) * block_size,

i.e. the hash list covers the prompt with a partial last block at most. Each accepted row becomes a
`RootRecord` (`workflow="mooncake"`, `arrival_s = timestamp / 1000`) with one model `OpRecord`
carrying the token counts, prefix-block hashes, and `ready_s = submitted_s = arrival_s` (the
timestamp *is* the observed submission, which the Arrival release rule replays).

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
_FIELDS = ("timestamp", "input_length", "output_length", "hash_ids")


@dataclass(slots=True, frozen=True)
class RejectedRow:
    """A row that was not imported.

    Attributes:
        line: 1-based line number in the source file.
        reason: short category (`malformed_json`, `not_an_object`, `missing_field`, `bad_type`,
            `negative_value`, `block_count`), for grouping.
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
    """

    trace: Trace
    num_rows: int
    rejected: list[RejectedRow] = field(default_factory=list)

    @property
    def num_accepted(self) -> int:
        """Rows that became roots."""
        return self.num_rows - len(self.rejected)

    def rejected_by_reason(self) -> dict[str, list[int]]:
        """Reason category → line numbers, in line order."""
        out: dict[str, list[int]] = defaultdict(list)
        for row in self.rejected:
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


def _parse_row(raw: bytes, block_size: int) -> tuple[float, int, int, tuple[int, ...]]:
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
    num_in = _int_field(row, "input_length")
    num_out = _int_field(row, "output_length")
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


def import_mooncake(
    path: str | Path, *, strict: bool = False, block_size: int = MOONCAKE_BLOCK_SIZE
) -> MooncakeImport:
    """Read a Mooncake JSONL trace into a Semantic Trace.

    Args:
        path: the JSONL file.
        strict: raise at the first bad row instead of skipping it.
        block_size: tokens per `hash_ids` block (512 in the FAST'25 traces).

    Returns:
        The trace of accepted rows, the number of rows read and the rejected rows.

    Raises:
        TraceImportError: the file cannot be read, or (`strict=True`) a row is bad; the message
            names the file and line.

    Examples:
        >>> import_mooncake("/no/such.jsonl")  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        maserve_prefect.errors.TraceImportError: cannot read Mooncake trace /no/such.jsonl: ...
    """
    path = Path(path)
    if block_size <= 0:
        raise TraceImportError(f"block_size must be positive, got {block_size}")
    digest = hashlib.sha256()
    roots: list[RootRecord] = []
    ops: list[OpRecord] = []
    rejected: list[RejectedRow] = []
    num_rows = 0
    try:
        with path.open("rb") as fh:
            for line_no, raw in enumerate(fh, start=1):
                digest.update(raw)
                if not raw.strip():
                    continue
                num_rows += 1
                try:
                    parsed = _parse_row(raw, block_size)
                except _BadRow as bad:
                    if strict:
                        raise TraceImportError(
                            f"{path}:{line_no}: {bad.detail}; fix the row or import without "
                            "--strict to skip and count bad rows"
                        ) from None
                    rejected.append(RejectedRow(line_no, bad.reason, bad.detail))
                    continue
                root, op = _records(line_no, parsed, block_size)
                roots.append(root)
                ops.append(op)
    except OSError as exc:
        raise TraceImportError(f"cannot read Mooncake trace {path}: {exc.strerror}") from exc
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
        },
    )
    trace = Trace.model_construct(
        manifest=manifest, roots=roots, stages=[], sessions=[], ops=ops, samples=[]
    )
    return MooncakeImport(trace=trace, num_rows=num_rows, rejected=rejected)
