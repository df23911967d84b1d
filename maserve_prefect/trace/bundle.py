"""Trace bundles: a self-describing folder that carries one trace and its payloads.

Layout::

    <bundle>/trace.jsonl        line 1: header {"type":"manifest", "bundle_format", "schema_version",
                                "counts", "layout", "manifest"}; then one record per line,
                                {"type": "root"|"stage"|"session"|"op"|"sample", ...record fields}
    <bundle>/blobs/ab/abcd...   every payload an op references, named by its SHA-256

The one idea: **a bundle is a canonical form.** Records are written in a canonical order (roots
by arrival then id, stages and sessions by root then id, ops in topological order with ties
broken by root and a natural sort of the op id, attempts in order, samples by time), every line
is sorted-key compact JSON, and nothing run-specific is written: the manifest's `created_at` is
left out, and Prefect run ids are not part of records. So export → import → export is
byte-identical, and two deterministic runs give byte-identical bundles.

Export writes into a temp folder next to the destination and renames it into place: a bundle
is whole or absent. Without `overwrite` the rename never replaces a bundle, even one another
process wrote meanwhile (two imports racing for one destination: one wins, the other gets
`BundleExistsError`). Import checks every line with pydantic (errors name file and line), refuses
unknown formats and schema versions, verifies every blob's hash, checks the header's counts
(a truncated file is caught), and validates the trace (`trace.validate`) with op line numbers.

Examples:
    >>> import tempfile
    >>> from maserve_prefect.trace.cas import MemoryStore
    >>> from maserve_prefect.trace.model import Manifest, OpKind, OpRecord, RootRecord, Trace
    >>> t = Trace(manifest=Manifest(trace_id="t"), roots=[RootRecord(root_id="r")],
    ...           ops=[OpRecord(op_id="r/0", root_id="r", kind=OpKind.TOOL)])
    >>> out = export_bundle(t, MemoryStore(), Path(tempfile.mkdtemp()) / "b")
    >>> import_bundle(out).trace.ops == t.ops
    True
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import re
import shutil
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ValidationError

from maserve_prefect.dag import topological_order
from maserve_prefect.errors import BundleExistsError, IntegrityError, TraceError, TraceImportError
from maserve_prefect.trace.cas import BlobStore, MemoryStore, fsync_dir, is_digest, sha256_hex
from maserve_prefect.trace.model import (
    SCHEMA_VERSION,
    EngineSample,
    Manifest,
    OpRecord,
    RootRecord,
    SessionRecord,
    StageRecord,
    Trace,
)
from maserve_prefect.trace.validate import validate_trace

BUNDLE_FORMAT = "maserve.trace-bundle/1"
TRACE_FILE = "trace.jsonl"
BLOB_DIR = "blobs"
SUPPORTED_SCHEMA_VERSIONS = frozenset({SCHEMA_VERSION})
LAYOUT = (
    f"{TRACE_FILE}: this header, then one JSON record per line with 'type' in "
    f"root|stage|session|op|sample, in canonical order; "
    f"{BLOB_DIR}/<first 2 hex>/<sha256 hex>: payload bytes named by their SHA-256"
)

_RECORD_TYPES: dict[str, type[BaseModel]] = {
    "root": RootRecord,
    "stage": StageRecord,
    "session": SessionRecord,
    "op": OpRecord,
    "sample": EngineSample,
}
_COUNT_KEYS = {
    "root": "roots",
    "stage": "stages",
    "session": "sessions",
    "op": "ops",
    "sample": "samples",
}


@dataclass(slots=True)
class ImportedBundle:
    """What `import_bundle` returns.

    Attributes:
        trace: the trace, records in the bundle's (canonical) order.
        store: the store the blobs were put into.
        op_lines: `(op_id, attempt) → line` in `trace.jsonl` (1-based), for error messages.
        path: the bundle folder.
    """

    trace: Trace
    store: BlobStore
    path: Path
    op_lines: dict[tuple[str, int], int] = field(default_factory=dict)


def canonical_trace(trace: Trace) -> Trace:
    """`trace` in bundle order and without `created_at` (what an export then import yields).

    Dependencies on ops outside the trace are ignored for ordering (`validate_trace` reports
    them).

    Raises:
        TraceValidationError: the op graph has a cycle (the message names it).
    """
    root_rank = {
        r.root_id: i
        for i, r in enumerate(sorted(trace.roots, key=lambda r: (r.arrival_s, r.root_id)))
    }

    def rank(root_id: str) -> int:
        return root_rank.get(root_id, len(root_rank))

    latest = trace.op_index()
    edges = {(d.op_id, op.op_id) for op in trace.ops for d in op.deps if d.op_id in latest}
    try:
        order = topological_order(
            latest, sorted(edges), key=lambda n: (rank(latest[n].root_id), _natural_key(n))
        )
    except ValueError:
        validate_trace(trace)  # names the cycle
        raise
    position = {op_id: i for i, op_id in enumerate(order)}
    return Trace(
        manifest=trace.manifest.model_copy(update={"created_at": None}),
        roots=sorted(trace.roots, key=lambda r: rank(r.root_id)),
        stages=sorted(trace.stages, key=lambda s: (rank(s.root_id), _natural_key(s.stage_id))),
        sessions=sorted(
            trace.sessions,
            key=lambda s: (rank(s.root_id), _natural_key(s.stage_id), _natural_key(s.session_id)),
        ),
        ops=sorted(trace.ops, key=lambda op: (position[op.op_id], op.attempt)),
        samples=sorted(trace.samples, key=lambda s: (s.t_s, s.source, s.name)),
    )


def export_bundle(trace: Trace, store: BlobStore, dest: Path, *, overwrite: bool = False) -> Path:
    """Write `trace` and every blob it references as a bundle folder at `dest`; return `dest`.

    Args:
        trace: the trace (validated first: a bundle that would not import is never written).
        store: where the referenced blobs are read from (and verified).
        dest: the bundle folder; must not exist or be empty unless `overwrite`.
        overwrite: replace an existing bundle (the old one is removed only after the new one
            is complete).

    Raises:
        BundleExistsError: `dest` is a non-empty folder (or a file) and `overwrite` is False.
        TraceValidationError: the trace is invalid or a referenced blob is missing.
        IntegrityError: a stored blob is corrupt.

    Examples:
        >>> import tempfile
        >>> from maserve_prefect.trace.model import Manifest, Trace
        >>> p = export_bundle(Trace(manifest=Manifest(trace_id="t")), MemoryStore(), Path(tempfile.mkdtemp()))
        >>> sorted(f.name for f in p.iterdir())
        ['blobs', 'trace.jsonl']
    """
    dest = Path(dest)
    if dest.exists() and not overwrite and (not dest.is_dir() or any(dest.iterdir())):
        raise BundleExistsError(
            f"{dest} already exists and is not an empty folder; choose another destination "
            f"or pass --force (overwrite=True) to replace it"
        )
    validate_trace(trace, store)
    canon = canonical_trace(trace)
    digests = sorted({d for op in canon.ops for d in _refs(op)})
    text = "\n".join(_bundle_lines(canon, num_blobs=len(digests))) + "\n"

    try:
        dest.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{dest.name}.tmp-", dir=dest.parent))
    except OSError as exc:  # a file where a folder must be, no permission, read-only disk
        raise TraceError(
            f"{dest}: cannot write a bundle there ({exc.strerror or exc}); choose a folder "
            "path whose parents are folders you can write"
        ) from None
    try:
        _write_durably(tmp / TRACE_FILE, text.encode("utf-8"))
        (tmp / BLOB_DIR).mkdir()
        for digest in digests:
            _write_durably(tmp / BLOB_DIR / digest[:2] / digest, store.get(digest))
        if overwrite:
            _swap_into_place(tmp, dest)
        else:
            _rename_if_absent(tmp, dest)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return dest


def import_bundle(
    src: Path, store: BlobStore | None = None, *, validate: bool = True
) -> ImportedBundle:
    """Read a bundle folder: records (checked line by line), blobs (verified) and validation.

    Args:
        src: the bundle folder (or its `trace.jsonl`).
        store: where to put the blobs; a new `MemoryStore` when None.
        validate: run `validate_trace` with bundle line numbers (default True).

    Raises:
        TraceImportError: missing file, malformed line, unknown format / schema version, counts
            that disagree with the header, or a referenced blob that is absent (file and line).
        IntegrityError: a blob's bytes do not match its name.
        TraceValidationError: the trace breaks an invariant (messages carry `trace.jsonl:line`).

    Examples:
        >>> import_bundle(Path("/nonexistent"))
        Traceback (most recent call last):
        ...
        maserve_prefect.errors.TraceImportError: /nonexistent/trace.jsonl: no such file; a bundle folder holds trace.jsonl and blobs/
    """
    src = Path(src)
    if src.name == TRACE_FILE and src.is_file():
        src = src.parent
    trace_file = src / TRACE_FILE
    try:
        raw_text = trace_file.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise TraceImportError(
            f"{trace_file}: no such file; a bundle folder holds {TRACE_FILE} and {BLOB_DIR}/"
        ) from None
    except (NotADirectoryError, IsADirectoryError):
        raise TraceImportError(
            f"{src}: not a bundle folder; give the folder that holds {TRACE_FILE} and {BLOB_DIR}/"
        ) from None
    except OSError as exc:
        raise TraceImportError(f"{trace_file}: cannot read it ({exc.strerror or exc})") from None
    except UnicodeDecodeError as exc:
        raise TraceImportError(f"{trace_file}: not UTF-8 text ({exc.reason})") from exc

    rows = list(_numbered_objects(trace_file, raw_text))
    if not rows:
        raise TraceImportError(f"{trace_file}: empty; line 1 must be the manifest header")
    header_line, header = rows[0]
    manifest, counts = _read_header(trace_file, header_line, header)

    records: dict[str, list[Any]] = {k: [] for k in _RECORD_TYPES}
    op_lines: dict[tuple[str, int], int] = {}
    for lineno, obj in rows[1:]:
        kind = obj.pop("type", None)
        model = _RECORD_TYPES.get(kind) if isinstance(kind, str) else None
        if model is None:
            raise TraceImportError(
                f"{trace_file}:{lineno}: unknown record type {kind!r}; expected one of "
                f"{sorted(_RECORD_TYPES)} (the manifest header is only allowed on line 1)"
            )
        rec = _validated(model, obj, f"{trace_file}:{lineno}: invalid {kind} record")
        if isinstance(rec, OpRecord):
            op_lines.setdefault((rec.op_id, rec.attempt), lineno)
        records[kind].append(rec)

    for kind, key in _COUNT_KEYS.items():
        if counts.get(key) != len(records[kind]):
            raise TraceImportError(
                f"{trace_file}: the header announces {counts.get(key)} {key} but the file holds "
                f"{len(records[kind])}; the bundle is truncated or was edited — re-export it"
            )

    trace = Trace(
        manifest=manifest,
        roots=records["root"],
        stages=records["stage"],
        sessions=records["session"],
        ops=records["op"],
        samples=records["sample"],
    )
    store = MemoryStore() if store is None else store
    num_blobs = _import_blobs(src / BLOB_DIR, store)
    if counts.get("blobs") != num_blobs:
        raise TraceImportError(
            f"{src / BLOB_DIR}: the header announces {counts.get('blobs')} blobs but the folder "
            f"holds {num_blobs}; the bundle is incomplete — re-export it"
        )
    for op in trace.ops:
        for digest in _refs(op):
            if not store.has(digest):
                line = op_lines[(op.op_id, op.attempt)]
                raise TraceImportError(
                    f"{trace_file}:{line}: op {op.op_id!r} references blob {digest}, which is "
                    f"not in {src / BLOB_DIR}; the bundle is incomplete — re-export it"
                )
    if validate:
        validate_trace(trace, store, source=str(trace_file), op_lines=op_lines)
    return ImportedBundle(trace=trace, store=store, path=src, op_lines=op_lines)


# ---- helpers ----------------------------------------------------------------------------------


def _dumps(obj: Any) -> str:
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), allow_nan=False)


def _bundle_lines(trace: Trace, *, num_blobs: int) -> Iterator[str]:
    counts = {key: len(getattr(trace, key)) for key in _COUNT_KEYS.values()}
    counts["blobs"] = num_blobs
    yield _dumps(
        {
            "type": "manifest",
            "bundle_format": BUNDLE_FORMAT,
            "schema_version": trace.manifest.schema_version,
            "counts": counts,
            "layout": LAYOUT,
            "manifest": trace.manifest.model_dump(mode="json", exclude={"created_at"}),
        }
    )
    for kind, key in _COUNT_KEYS.items():
        for rec in getattr(trace, key):
            yield _dumps({**rec.model_dump(mode="json"), "type": kind})


def _read_header(
    path: Path, lineno: int, header: dict[str, Any]
) -> tuple[Manifest, dict[str, Any]]:
    where = f"{path}:{lineno}"
    if header.get("type") != "manifest":
        raise TraceImportError(
            f"{where}: line 1 must be the manifest header (type 'manifest'), got type "
            f"{header.get('type')!r}; is this a maserve trace bundle?"
        )
    fmt = header.get("bundle_format")
    if fmt != BUNDLE_FORMAT:
        raise TraceImportError(
            f"{where}: unknown bundle_format {fmt!r}; this version reads {BUNDLE_FORMAT!r}"
        )
    version = header.get("schema_version")
    manifest_obj = header.get("manifest")
    inner = manifest_obj.get("schema_version") if isinstance(manifest_obj, dict) else None
    for v in (version, inner):
        if v not in SUPPORTED_SCHEMA_VERSIONS:
            raise TraceImportError(
                f"{where}: schema_version {v!r} is not supported by this version of "
                f"maserve-prefect (it reads {sorted(SUPPORTED_SCHEMA_VERSIONS)}); upgrade "
                f"maserve-prefect or re-export the trace with a matching version"
            )
    counts = header.get("counts")
    if not isinstance(counts, dict):
        raise TraceImportError(f"{where}: header has no 'counts' object; re-export the bundle")
    manifest = _validated(Manifest, manifest_obj, f"{where}: invalid manifest")
    assert isinstance(manifest, Manifest)
    return manifest, counts


def _validated(model: type[BaseModel], obj: Any, where: str) -> BaseModel:
    try:
        return model.model_validate(obj)
    except ValidationError as exc:
        details = "; ".join(
            f"{'.'.join(str(p) for p in e['loc']) or '(record)'}: {e['msg']}" for e in exc.errors()
        )
        raise TraceImportError(f"{where}: {details}") from None


def _numbered_objects(path: Path, text: str) -> Iterator[tuple[int, dict[str, Any]]]:
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    for lineno, line in enumerate(lines, start=1):
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as exc:
            raise TraceImportError(
                f"{path}:{lineno}: not valid JSON ({exc.msg} at column {exc.colno}); each line "
                f"must be one JSON object"
            ) from None
        if not isinstance(obj, dict):
            raise TraceImportError(
                f"{path}:{lineno}: expected a JSON object, got {type(obj).__name__}"
            )
        yield lineno, obj


def _import_blobs(blob_dir: Path, store: BlobStore) -> int:
    if not blob_dir.is_dir():
        raise TraceImportError(f"{blob_dir}: missing; a bundle holds a {BLOB_DIR}/ folder")
    num = 0
    for sub in sorted(blob_dir.iterdir()):
        for f in sorted(sub.iterdir()) if sub.is_dir() else [sub]:
            name = f.name
            if not (sub.is_dir() and is_digest(name) and name[:2] == sub.name and f.is_file()):
                raise TraceImportError(
                    f"{f}: not a blob; {BLOB_DIR}/ holds only <first 2 hex>/<sha256 hex> files"
                )
            data = f.read_bytes()
            actual = sha256_hex(data)
            if actual != name:
                raise IntegrityError(
                    f"blob {name} at {f} is corrupt: its bytes hash to {actual}; "
                    f"re-export the bundle from its source"
                )
            store.put(data)
            num += 1
    return num


def _refs(op: OpRecord) -> list[str]:
    return [d for d in (*op.input_refs, op.output_ref, op.output_token_ids_ref) if d is not None]


_NUM_RE = re.compile(r"(\d+)")


def _natural_key(s: str) -> tuple[Any, ...]:
    """'op10' after 'op9': digit runs compare as numbers (types alternate str, int, str, ...)."""
    return tuple(int(p) if i % 2 else p for i, p in enumerate(_NUM_RE.split(s)))


def _write_durably(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "wb") as fh:
        fh.write(data)
        fh.flush()
        os.fsync(fh.fileno())


def _rename_if_absent(tmp: Path, dest: Path) -> None:
    """Rename the finished `tmp` folder to `dest` unless a bundle got there first.

    `rename(2)` of a folder onto a non-empty folder fails (ENOTEMPTY / EEXIST), onto a file
    fails (ENOTDIR), and onto an empty folder replaces it: two writers racing for one `dest`
    both get past the early check, and exactly one rename wins.

    Raises:
        BundleExistsError: another bundle (or a file) took `dest` meanwhile.
    """
    if dest.is_dir():
        with contextlib.suppress(OSError):
            dest.rmdir()  # empty counts as absent; a full one stays and the rename fails
    try:
        os.rename(tmp, dest)
    except OSError as exc:
        if exc.errno not in (errno.ENOTEMPTY, errno.EEXIST, errno.ENOTDIR, errno.EISDIR):
            raise
        raise BundleExistsError(
            f"{dest} was written by another process while this bundle was being built; "
            "choose another destination or pass --force to replace it"
        ) from None
    fsync_dir(dest.parent)


def _swap_into_place(tmp: Path, dest: Path) -> None:
    """Rename the finished `tmp` folder to `dest`; an old `dest` goes only after that."""
    old: Path | None = None
    if dest.exists():
        if dest.is_dir() and not any(dest.iterdir()):
            dest.rmdir()
        else:
            old = tmp.with_name(tmp.name + ".old")
            os.replace(dest, old)
    os.replace(tmp, dest)
    fsync_dir(dest.parent)
    if old is not None:
        if old.is_dir():
            shutil.rmtree(old)
        else:
            old.unlink()


__all__: list[str] = [
    "BUNDLE_FORMAT",
    "ImportedBundle",
    "canonical_trace",
    "export_bundle",
    "import_bundle",
]
