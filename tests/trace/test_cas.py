"""Tests for trace.cas: content addressing, dedupe, durability layout, integrity on read."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from maserve_prefect.errors import BlobNotFoundError, IntegrityError, TraceValidationError
from maserve_prefect.trace.cas import BlobStore, ContentStore, MemoryStore, canonical_json


@pytest.fixture(params=["disk", "memory"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> BlobStore:
    return ContentStore(tmp_path / "cas") if request.param == "disk" else MemoryStore()


def test_put_returns_sha256_and_get_round_trips(store: BlobStore) -> None:
    data = b"the prompt \x00\xff bytes"
    digest = store.put(data)
    assert digest == hashlib.sha256(data).hexdigest()
    assert store.has(digest)
    assert store.get(digest) == data


def test_json_is_canonical_so_equal_objects_share_a_digest(store: BlobStore) -> None:
    a = store.put_json({"role": "user", "content": "héllo", "n": [1, 2]})
    b = store.put_json({"n": [1, 2], "content": "héllo", "role": "user"})
    assert a == b
    assert store.get(a) == '{"content":"héllo","n":[1,2],"role":"user"}'.encode()
    assert store.get_json(a) == {"role": "user", "content": "héllo", "n": [1, 2]}


def test_canonical_json_rejects_nan() -> None:
    with pytest.raises(ValueError):
        canonical_json({"x": float("nan")})


def test_iter_digests_is_sorted_and_deduplicated(store: BlobStore) -> None:
    digests = {store.put(f"blob {i}".encode()) for i in range(20)}
    store.put(b"blob 3")  # duplicate
    assert list(store.iter_digests()) == sorted(digests)


def test_missing_blob_raises_not_found(store: BlobStore) -> None:
    digest = hashlib.sha256(b"never stored").hexdigest()
    assert not store.has(digest)
    with pytest.raises(BlobNotFoundError, match=digest):
        store.get(digest)


def test_malformed_digest_is_rejected(tmp_path: Path) -> None:
    store = ContentStore(tmp_path)
    with pytest.raises(TraceValidationError, match="64 lower-case hex"):
        store.get("../../etc/passwd")


def test_disk_layout_fans_out_and_leaves_no_temp_files(tmp_path: Path) -> None:
    store = ContentStore(tmp_path / "cas")
    digest = store.put(b"abc")
    assert store.path_of(digest) == tmp_path / "cas" / digest[:2] / digest
    assert sorted(p.name for p in (tmp_path / "cas" / digest[:2]).iterdir()) == [digest]


def test_dedupe_does_not_rewrite_an_existing_blob(tmp_path: Path) -> None:
    store = ContentStore(tmp_path)
    digest = store.put(b"same")
    path = store.path_of(digest)
    inode = path.stat().st_ino
    assert store.put(b"same") == digest
    assert path.stat().st_ino == inode


def test_corrupt_blob_on_disk_raises_integrity_error_naming_digest_and_path(tmp_path: Path) -> None:
    store = ContentStore(tmp_path)
    digest = store.put(b"original payload")
    path = store.path_of(digest)
    path.write_bytes(b"tampered payload")
    with pytest.raises(IntegrityError) as err:
        store.get(digest)
    assert digest in str(err.value)
    assert str(path) in str(err.value)


def test_stray_temp_files_are_not_listed(tmp_path: Path) -> None:
    store = ContentStore(tmp_path)
    digest = store.put(b"kept")
    (tmp_path / digest[:2] / ".tmp-crashed").write_bytes(b"half")
    assert list(store.iter_digests()) == [digest]


def test_stores_satisfy_the_protocol(tmp_path: Path) -> None:
    assert isinstance(ContentStore(tmp_path), BlobStore)
    assert isinstance(MemoryStore(), BlobStore)
