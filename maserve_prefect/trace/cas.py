"""Content-addressed store (CAS) for trace payloads: a blob's name is the SHA-256 of its bytes.

Prompts, artifacts and token ids live here; trace records carry only the 64-hex digest.
`ContentStore` keeps one file per blob under a two-character fan-out, `root/ab/abcdef...`.

Guarantees:

- **Durable, never half.** `put` writes a temp file in the blob's own folder, fsyncs it, then
  `os.replace`s it into place (atomic on POSIX) and fsyncs the folder. A crash leaves either the
  whole blob or at most a stray `.tmp-*` file, which `iter_digests` ignores.
- **Dedupe.** A blob already present is not rewritten.
- **Integrity on read.** `get` re-hashes; bytes that do not match their name raise
  `IntegrityError` naming the digest and the file.

`MemoryStore` has the same interface (the `BlobStore` protocol) for tests and the simulator.
JSON payloads go through `canonical_json` (sorted keys, compact, UTF-8) so equal objects get
equal digests.

Examples:
    >>> store = MemoryStore()
    >>> d = store.put_json({"role": "user", "content": "hi"})
    >>> store.get_json(d)
    {'content': 'hi', 'role': 'user'}
    >>> store.put_json({"content": "hi", "role": "user"}) == d
    True
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import tempfile
from abc import ABC, abstractmethod
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from maserve_prefect.errors import BlobNotFoundError, IntegrityError, TraceValidationError
from maserve_prefect.settings import private_dir

_DIGEST_RE = re.compile(r"^[0-9a-f]{64}$")


def sha256_hex(data: bytes) -> str:
    """Lower-case hex SHA-256 of `data`."""
    return hashlib.sha256(data).hexdigest()


def canonical_json(obj: Any) -> bytes:
    """Canonical JSON bytes: sorted keys, no whitespace, UTF-8, no NaN/Infinity.

    Examples:
        >>> canonical_json({"b": 1, "a": [1, 2]})
        b'{"a":[1,2],"b":1}'
    """
    return json.dumps(
        obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False
    ).encode("utf-8")


def is_digest(value: str) -> bool:
    """Whether `value` looks like a digest this store issues (64 lower-case hex characters)."""
    return bool(_DIGEST_RE.match(value))


def check_digest(digest: str) -> str:
    """Return `digest` if well formed, else raise `TraceValidationError` saying what is expected."""
    if not isinstance(digest, str) or not is_digest(digest):
        raise TraceValidationError(
            f"{digest!r} is not a CAS digest; expected 64 lower-case hex characters (SHA-256)"
        )
    return digest


@runtime_checkable
class BlobStore(Protocol):
    """What the ledger, bundles and validation need from a payload store."""

    def put(self, data: bytes) -> str:
        """Store `data`; return its hex SHA-256 digest."""
        ...

    def get(self, digest: str) -> bytes:
        """Bytes of `digest`; `BlobNotFoundError` if absent, `IntegrityError` if corrupt."""
        ...

    def has(self, digest: str) -> bool:
        """Whether a blob with `digest` is stored."""
        ...

    def iter_digests(self) -> Iterator[str]:
        """Every stored digest, in sorted order."""
        ...

    def put_json(self, obj: Any) -> str:
        """Store `obj` as canonical JSON; return its digest."""
        ...

    def get_json(self, digest: str) -> Any:
        """Decode the JSON blob `digest`."""
        ...


class _JsonMixin(ABC):
    """JSON helpers shared by the stores, written once on top of `put` / `get`."""

    @abstractmethod
    def put(self, data: bytes) -> str:
        """Store `data`; return its digest."""

    @abstractmethod
    def get(self, digest: str) -> bytes:
        """Bytes of `digest`."""

    def put_json(self, obj: Any) -> str:
        """Store `obj` as canonical JSON; return its digest."""
        return self.put(canonical_json(obj))

    def get_json(self, digest: str) -> Any:
        """Decode the JSON blob `digest`."""
        return json.loads(self.get(digest))


class ContentStore(_JsonMixin):
    """A directory of blobs named by SHA-256, fanned out by the first two hex characters.

    Args:
        root: the store's folder; created on first `put`.

    Examples:
        >>> import tempfile
        >>> store = ContentStore(Path(tempfile.mkdtemp()))
        >>> d = store.put(b"hello")
        >>> store.path_of(d).relative_to(store.root).as_posix()[:3]
        '2c/'
        >>> store.get(d)
        b'hello'
    """

    def __init__(self, root: Path) -> None:
        self.root = Path(root)

    def __repr__(self) -> str:
        return f"ContentStore({str(self.root)!r})"

    def path_of(self, digest: str) -> Path:
        """Where the blob `digest` lives (whether or not it exists)."""
        check_digest(digest)
        return self.root / digest[:2] / digest

    def put(self, data: bytes) -> str:
        """Store `data` durably (temp file + fsync + atomic rename); return its digest."""
        digest = sha256_hex(data)
        path = self.root / digest[:2] / digest
        if path.exists():
            return digest
        private_dir(path.parent)
        fd, tmp = tempfile.mkstemp(prefix=".tmp-", dir=path.parent)
        try:
            with os.fdopen(fd, "wb") as fh:
                fh.write(data)
                fh.flush()
                os.fsync(fh.fileno())
            os.replace(tmp, path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
        fsync_dir(path.parent)
        return digest

    def get(self, digest: str) -> bytes:
        """Read and verify the blob `digest`.

        Raises:
            BlobNotFoundError: no such blob.
            IntegrityError: the file's bytes do not hash to `digest`.
        """
        path = self.path_of(digest)
        try:
            data = path.read_bytes()
        except FileNotFoundError:
            raise BlobNotFoundError(
                f"blob {digest} is not in the content store at {self.root} (looked for {path})"
            ) from None
        actual = sha256_hex(data)
        if actual != digest:
            raise IntegrityError(
                f"blob {digest} at {path} is corrupt: its bytes hash to {actual}; "
                f"restore the file from a bundle or delete it and re-record the run"
            )
        return data

    def has(self, digest: str) -> bool:
        """Whether a blob named `digest` exists (not verified; `get` verifies)."""
        return self.path_of(digest).is_file()

    def iter_digests(self) -> Iterator[str]:
        """Every stored digest in sorted order; stray temp files are skipped."""
        if not self.root.is_dir():
            return
        for sub in sorted(self.root.iterdir()):
            if not sub.is_dir() or len(sub.name) != 2:
                continue
            for f in sorted(sub.iterdir()):
                if is_digest(f.name) and f.name.startswith(sub.name) and f.is_file():
                    yield f.name


class MemoryStore(_JsonMixin):
    """An in-memory `BlobStore` (same contract as `ContentStore`, nothing on disk).

    Examples:
        >>> s = MemoryStore()
        >>> s.has(s.put(b"x"))
        True
    """

    def __init__(self) -> None:
        self._blobs: dict[str, bytes] = {}

    def __len__(self) -> int:
        return len(self._blobs)

    def put(self, data: bytes) -> str:
        """Store `data`; return its digest."""
        digest = sha256_hex(data)
        self._blobs.setdefault(digest, bytes(data))
        return digest

    def get(self, digest: str) -> bytes:
        """Bytes of `digest`, verified like `ContentStore.get`."""
        check_digest(digest)
        try:
            data = self._blobs[digest]
        except KeyError:
            raise BlobNotFoundError(f"blob {digest} is not in the in-memory store") from None
        if sha256_hex(data) != digest:
            raise IntegrityError(f"in-memory blob {digest} does not hash to its digest")
        return data

    def has(self, digest: str) -> bool:
        """Whether `digest` is stored."""
        return digest in self._blobs

    def iter_digests(self) -> Iterator[str]:
        """Every stored digest in sorted order."""
        yield from sorted(self._blobs)


def fsync_dir(path: Path) -> None:
    """Flush a folder's entries to disk (makes a rename into it durable)."""
    # The rename is durable only once the folder entry is on disk. Not every platform can open a
    # directory (Windows); there the rename itself is the best available guarantee.
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
