"""vLLM KV event decoding, the residency directory, and the ZMQ subscriber end to end.

Payloads are built the way vLLM's msgspec encoder lays them out: a batch `[ts, events, dp_rank]`
(array_like) or a map, events as tagged arrays `["BlockStored", ...]` or maps with `"type"`. The
publisher is an XPUB socket (a PUB that also reports subscriptions) so a test can wait until the
subscriber's subscription arrived instead of sleeping; on the wire it is what vLLM's PUB sends.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import msgpack
import pytest
import zmq

from maserve_prefect.engines.openai.kv_decode import (
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    KVEventBatch,
    UnknownEvent,
    decode_batch,
)
from maserve_prefect.engines.openai.kv_events import KVEventSubscriber
from maserve_prefect.engines.openai.kv_residency import BlockInfo, ResidencyDirectory
from maserve_prefect.errors import ConfigError, EngineError

TIMEOUT_S = 10.0


def stored(
    hashes: list[Any],
    parent: Any = None,
    *,
    block_size: int = 2,
    medium: str | None = "GPU",
    extra: tuple[Any, ...] = (),
) -> list[Any]:
    tokens = list(range(block_size * len(hashes)))
    return ["BlockStored", hashes, parent, tokens, block_size, None, medium, *extra]


def removed(hashes: list[Any], medium: str | None = "GPU") -> list[Any]:
    return ["BlockRemoved", hashes, medium]


def pack(events: list[Any], ts: float = 1.0, rank: int | None = 0) -> bytes:
    batch: list[Any] = [ts, events] if rank is None else [ts, events, rank]
    return msgpack.packb(batch)


# -- decoding ---------------------------------------------------------------------------------


def test_decode_array_like_batch_with_newer_trailing_fields() -> None:
    payload = pack(
        [
            # newer vLLM adds lora_name, extra_keys, group_idx, kv_cache_spec_kind, ...
            stored([b"\x01" * 32, 7], None, extra=("adapter", [None, None], 0, "full_attention")),
            [*removed([7], None), 0],  # group_idx
            ["AllBlocksCleared"],
        ],
        ts=12.5,
        rank=1,
    )
    assert decode_batch(payload) == KVEventBatch(
        ts=12.5,
        events=(
            BlockStored((b"\x01" * 32, 7), None, (0, 1, 2, 3), 2, None, "GPU"),
            BlockRemoved((7,), None),
            AllBlocksCleared(),
        ),
        data_parallel_rank=1,
    )


def test_decode_map_encoding_and_older_shapes() -> None:
    as_map = msgpack.packb(
        {
            "ts": 3,
            "events": [
                {
                    "type": "BlockStored",
                    "block_hashes": [1, 2],
                    "parent_block_hash": 0,
                    "token_ids": [5, 6, 7, 8],
                    "block_size": 2,
                    "lora_id": None,
                    "medium": "CPU",
                    "group_idx": 0,
                },
                {"type": "BlockRemoved", "block_hashes": [2], "medium": "CPU"},
            ],
        }
    )
    assert decode_batch(as_map) == KVEventBatch(
        3.0, (BlockStored((1, 2), 0, (5, 6, 7, 8), 2, None, "CPU"), BlockRemoved((2,), "CPU"))
    )
    # vLLM before the medium field: 5 fields after the tag; a batch without the DP rank
    older = pack([["BlockStored", [1], None, [1, 2], 2, None], ["BlockRemoved", [1]]], rank=None)
    assert decode_batch(older).events == (
        BlockStored((1,), None, (1, 2), 2, None, None),
        BlockRemoved((1,), None),
    )


def test_decode_unknown_tags_are_kept_not_fatal() -> None:
    batch = decode_batch(pack([["BlockMoved", [1], "GPU", "CPU"], {"type": "Future"}]))
    assert batch.events == (UnknownEvent("BlockMoved"), UnknownEvent("Future"))


@pytest.mark.parametrize(
    ("payload", "match"),
    [
        (b"\xc1not msgpack", "not msgpack"),
        (msgpack.packb({"events": []}), "ts/events"),
        (msgpack.packb(["yesterday", []]), "'ts'"),
        (pack([stored(["x"])]), r"events\[0\] \(BlockStored\) field 'block_hashes'"),
        (
            pack([["AllBlocksCleared"], ["BlockStored", [1], None]]),
            r"events\[1\] field 'token_ids'",
        ),
        (pack([stored([1], block_size=0)]), "'block_size'"),
        (pack([removed([1], medium=5)]), "'medium'"),
        (pack([{"type": "BlockRemoved"}]), "'block_hashes'"),
        (pack([[1, 2]]), "'tag'"),
    ],
)
def test_decode_errors_name_the_field(payload: bytes, match: str) -> None:
    with pytest.raises(EngineError, match=match):
        decode_batch(payload)


# -- directory --------------------------------------------------------------------------------


def apply_all(d: ResidencyDirectory, payload: bytes, t_s: float = 0.0) -> None:
    for ev in decode_batch(payload).events:
        d.apply(ev, t_s)


def test_directory_stores_removes_and_clears() -> None:
    d = ResidencyDirectory()
    apply_all(d, pack([stored([10, 11, 12], 9, block_size=4)]), t_s=1.0)
    apply_all(d, pack([stored([11], None, medium="cpu")]), t_s=2.0)  # offloaded copy
    assert d.info(11) == BlockInfo("GPU", 10, 4, 1.0)
    assert d.info(10) == BlockInfo("GPU", 9, 4, 1.0)
    assert d.info(11, "CPU") == BlockInfo("CPU", None, 2, 2.0)
    assert d.counts_by_medium() == {"CPU": 1, "GPU": 3}
    assert d.num_blocks() == 3 and d.num_blocks("gpu") == 3

    apply_all(d, pack([removed([11, 99])]))  # 99 was never stored
    assert not d.resident(11, "GPU") and d.resident(11, "CPU") and d.resident(11)
    assert d.num_unmatched_removals == 1
    assert d.reusable_prefix_blocks([10, 11, 12]) == 3  # 11 still on CPU
    assert d.reusable_prefix_blocks([10, 11, 12], media=("GPU",)) == 1

    apply_all(d, pack([["AllBlocksCleared"], ["SomethingNew", 1]]))
    assert d.num_blocks() == 0 and not d.resident(10)
    assert (d.num_stored, d.num_removed, d.num_cleared, d.num_unknown) == (4, 2, 1, 1)


def test_reusable_prefix_stops_at_first_missing_hash() -> None:
    d = ResidencyDirectory()
    h = [bytes([i]) * 32 for i in range(5)]
    apply_all(d, pack([stored(h[:2]), stored(h[3:], h[2])]))  # h[2] never stored
    assert d.reusable_prefix_blocks(h) == 2
    assert d.reusable_prefix_blocks(h[3:]) == 2
    assert d.reusable_prefix_blocks([h[2], *h[3:]]) == 0
    assert d.reusable_prefix_blocks([]) == 0
    # bytes and int hashes are distinct keys
    apply_all(d, pack([stored([7])]))
    assert d.resident(7) and not d.resident(b"\x07")


def test_missing_medium_means_gpu() -> None:
    d = ResidencyDirectory()
    apply_all(d, pack([["BlockStored", [1], None, [1, 2], 2, None]]))
    assert d.resident(1, "GPU") and d.counts_by_medium() == {"GPU": 1}
    apply_all(d, pack([["BlockRemoved", [1]]]))
    assert not d.resident(1)


# -- subscriber over ZMQ ----------------------------------------------------------------------


@pytest.fixture
def zctx() -> Iterator[zmq.Context[Any]]:
    ctx: zmq.Context[Any] = zmq.Context()
    yield ctx
    ctx.destroy(linger=0)  # closes publishers a failed assertion left open (term() would hang)


def connect_publisher(ctx: zmq.Context[Any], endpoint: str, topic: bytes = b"") -> Any:
    """An XPUB that connects like vLLM's PUB and returns once the subscription arrived."""
    pub = ctx.socket(zmq.XPUB)
    pub.setsockopt(zmq.LINGER, 0)
    pub.setsockopt(zmq.RCVTIMEO, int(TIMEOUT_S * 1000))
    pub.connect(endpoint)
    assert pub.recv() == b"\x01" + topic  # the subscriber's subscription
    return pub


def send(pub: Any, seq: int, payload: bytes, topic: bytes = b"") -> None:
    pub.send_multipart([topic, seq.to_bytes(8, "big"), payload])


def stop_bounded(sub: KVEventSubscriber) -> None:
    stopper = threading.Thread(target=sub.stop)
    stopper.start()
    stopper.join(timeout=TIMEOUT_S)
    assert not stopper.is_alive(), "stop() did not return"


def test_subscriber_end_to_end(zctx: zmq.Context[Any]) -> None:
    clock = iter(float(i) for i in range(100))
    sub = KVEventSubscriber(now=lambda: next(clock)).start()
    try:
        assert sub.endpoint.startswith("tcp://127.0.0.1:") and not sub.endpoint.endswith(":0")
        pub = connect_publisher(zctx, sub.endpoint)
        h = [bytes([i]) * 32 for i in range(4)]
        send(pub, 0, pack([stored(h[:3], None)]))
        send(pub, 1, pack([removed([h[2]]), ["BlockMoved", [h[0]], "GPU", "CPU"]]))
        assert sub.wait_for(lambda: sub.num_batches == 2, TIMEOUT_S)
        d = sub.directory
        assert d.reusable_prefix_blocks(h) == 2 and d.num_unknown == 1
        assert [type(e).__name__ for _, e in sub.events()] == [
            "BlockStored",
            "BlockRemoved",
            "UnknownEvent",
        ]
        assert [t for t, _ in sub.events()] == [0.0, 1.0, 1.0]
        assert d.info(h[0]) == BlockInfo("GPU", None, 2, 0.0)

        send(pub, 4, pack([stored([h[3]], h[2], medium="CPU")]))  # seq 2 and 3 lost
        send(pub, 5, b"\xc1garbage")
        send(pub, 6, pack([["AllBlocksCleared"]]))
        assert sub.wait_for(lambda: d.num_cleared == 1, TIMEOUT_S)
        assert (sub.num_gaps, sub.num_missed, sub.num_malformed) == (1, 2, 1)
        assert "seq 5" in sub.errors[0][1] and d.num_blocks() == 0

        send(pub, 0, pack([stored([h[0]])]))  # the server restarted: seq from 0
        assert sub.wait_for(lambda: sub.num_restarts == 1 and d.resident(h[0]), TIMEOUT_S)
        assert sub.num_gaps == 1 and d.num_cleared == 2
        pub.close()
    finally:
        stop_bounded(sub)
    assert sub.num_events == 6


def test_subscriber_filters_topic_and_rejects_short_messages(zctx: zmq.Context[Any]) -> None:
    sub = KVEventSubscriber(topic="kv").start()
    try:
        pub = connect_publisher(zctx, sub.endpoint, b"kv")
        pub.send_multipart([b"other", (0).to_bytes(8, "big"), pack([stored([1])])])
        pub.send_multipart([b"kv", b"\x00"])  # not [topic, seq, payload]
        send(pub, 0, pack([stored([2])]), topic=b"kv")
        assert sub.wait_for(lambda: sub.num_batches == 1, TIMEOUT_S)
        assert sub.directory.resident(2) and not sub.directory.resident(1)
        assert sub.num_malformed == 1 and sub.num_gaps == 0
        pub.close()
    finally:
        stop_bounded(sub)


def test_subscriber_connects_when_vllm_binds(zctx: zmq.Context[Any]) -> None:
    pub = zctx.socket(zmq.XPUB)  # vLLM with "tcp://*:PORT" binds its PUB
    pub.setsockopt(zmq.LINGER, 0)
    pub.setsockopt(zmq.RCVTIMEO, int(TIMEOUT_S * 1000))
    pub.bind("tcp://127.0.0.1:*")
    port = pub.getsockopt(zmq.LAST_ENDPOINT).decode().rsplit(":", 1)[1]
    sub = KVEventSubscriber(f"tcp://*:{port}")
    assert not sub.bind
    with sub:
        assert sub.endpoint == f"tcp://*:{port}"
        assert pub.recv() == b"\x01"
        send(pub, 0, pack([stored([b"\xaa"])]))
        assert sub.wait_for(lambda: sub.directory.resident(b"\xaa"), TIMEOUT_S)
    assert sub.wait_for(lambda: True, 0.0)
    pub.close()


def test_subscriber_stop_while_idle_and_restart() -> None:
    sub = KVEventSubscriber(poll_interval_s=0.01)
    with pytest.raises(EngineError, match="call start"):
        _ = sub.endpoint
    sub.start()
    assert not sub.wait_for(lambda: sub.num_batches > 0, 0.05)  # nothing arrives: times out
    stop_bounded(sub)
    sub.start()  # a stopped subscriber can bind again
    stop_bounded(sub)
    stop_bounded(sub)  # idempotent


def test_subscriber_rejects_inproc_and_busy_port() -> None:
    with pytest.raises(ConfigError, match="inproc"):
        KVEventSubscriber("inproc://kv")
    with KVEventSubscriber() as first:
        second = KVEventSubscriber(first.endpoint)
        with pytest.raises(EngineError, match="cannot bind"):
            second.start()
