"""The KV cache events vLLM publishes, as typed values, and the decoder of their wire format.

The one idea: whatever shape a vLLM version sends, `decode_batch` turns one message payload into a
`KVEventBatch` of `BlockStored` / `BlockRemoved` / `AllBlocksCleared` / `UnknownEvent` values, or
raises an `EngineError` that names the event index and field; nothing downstream sees msgpack.

Wire format (vLLM `vllm/distributed/kv_events.py`, read to understand only). Each ZMQ message is
multipart `[topic, seq, payload]`: `seq` is an 8-byte big-endian counter starting at 0, `payload`
is msgpack of a `KVEventBatch` encoded by msgspec. Versions differ in shape, so `decode_batch`
accepts both:

- batch: an array `[ts, events]` / `[ts, events, data_parallel_rank]` (array_like) or a map
  `{"ts", "events", "data_parallel_rank"}`;
- event: a tagged array `["BlockStored", block_hashes, parent_block_hash, token_ids, block_size,
  lora_id, medium, ...]`, `["BlockRemoved", block_hashes, medium, ...]`, `["AllBlocksCleared"]`,
  or a map with the tag under `"type"`. Trailing fields newer versions add are ignored; fields
  older versions lack (`lora_id`, `medium`) default to None; an unknown tag decodes to
  `UnknownEvent` (counted, not fatal). Block hashes are ints (older vLLM) or bytes (newer).

Examples:
    >>> batch = decode_batch(msgpack.packb([1.0, [["BlockRemoved", [12], "GPU"]]]))
    >>> batch.events, batch.data_parallel_rank
    ((BlockRemoved(block_hashes=(12,), medium='GPU'),), None)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import msgpack

from maserve_prefect.errors import EngineError

__all__ = [
    "AllBlocksCleared",
    "BlockHash",
    "BlockRemoved",
    "BlockStored",
    "KVEvent",
    "KVEventBatch",
    "UnknownEvent",
    "decode_batch",
]

BlockHash = int | bytes


@dataclass(frozen=True, slots=True)
class BlockStored:
    """Blocks entered the prefix cache; `token_ids` covers all of them, `block_size` per block."""

    block_hashes: tuple[BlockHash, ...]
    parent_block_hash: BlockHash | None
    token_ids: tuple[int, ...]
    block_size: int
    lora_id: int | None = None
    medium: str | None = None


@dataclass(frozen=True, slots=True)
class BlockRemoved:
    """Blocks left the cache of `medium`."""

    block_hashes: tuple[BlockHash, ...]
    medium: str | None = None


@dataclass(frozen=True, slots=True)
class AllBlocksCleared:
    """The prefix cache was reset."""


@dataclass(frozen=True, slots=True)
class UnknownEvent:
    """An event with a tag this module does not know (a newer vLLM); kept, counted, not applied."""

    tag: str


KVEvent = BlockStored | BlockRemoved | AllBlocksCleared | UnknownEvent


@dataclass(frozen=True, slots=True)
class KVEventBatch:
    """One published message: vLLM's wall time `ts`, its events, the publishing DP rank."""

    ts: float
    events: tuple[KVEvent, ...]
    data_parallel_rank: int | None = None


_FIELDS: dict[str, tuple[str, ...]] = {
    "BlockStored": (
        "block_hashes",
        "parent_block_hash",
        "token_ids",
        "block_size",
        "lora_id",
        "medium",
    ),
    "BlockRemoved": ("block_hashes", "medium"),
    "AllBlocksCleared": (),
}
_REQUIRED = {"BlockStored": 4, "BlockRemoved": 1, "AllBlocksCleared": 0}


def _bad(where: str, field: str, expected: str, got: object) -> EngineError:
    return EngineError(
        f"malformed KV event batch: {where} field {field!r}: expected {expected}, got "
        f"{type(got).__name__} {got!r:.80}; is the publisher a vLLM KV event stream?"
    )


def _hashes(where: str, field: str, value: object) -> tuple[BlockHash, ...]:
    if not isinstance(value, list | tuple) or not all(
        isinstance(h, int | bytes) and not isinstance(h, bool) for h in value
    ):
        raise _bad(where, field, "a list of int or bytes block hashes", value)
    return tuple(value)


def _opt(where: str, field: str, value: object, kind: type, expected: str) -> Any:
    if value is not None and not isinstance(value, kind):
        raise _bad(where, field, expected, value)
    return value


def _decode_event(raw: object, where: str) -> KVEvent:
    if isinstance(raw, list | tuple) and raw and isinstance(raw[0], str):
        tag, values = raw[0], list(raw[1:])
        fields = _FIELDS.get(tag)
        if fields is None:
            return UnknownEvent(tag)
        if len(values) < _REQUIRED[tag]:
            missing = fields[len(values)]
            raise _bad(where, missing, f"{_REQUIRED[tag]} fields after the tag", raw)
        got = dict(zip(fields, values, strict=False))  # extra trailing fields are ignored
    elif isinstance(raw, dict) and isinstance(raw.get("type"), str):
        tag, got = raw["type"], raw
        fields = _FIELDS.get(tag)
        if fields is None:
            return UnknownEvent(tag)
        for f in fields[: _REQUIRED[tag]]:
            if f not in got:
                raise _bad(where, f, "a value (field missing)", raw)
    else:
        raise _bad(where, "tag", "an array whose first item is the event tag, or a map", raw)
    where = f"{where} ({tag})"
    medium = _opt(where, "medium", got.get("medium"), str, "a string or None")
    if tag == "BlockStored":
        token_ids = got["token_ids"]
        if not isinstance(token_ids, list | tuple) or not all(
            isinstance(t, int) for t in token_ids
        ):
            raise _bad(where, "token_ids", "a list of ints", token_ids)
        block_size = got["block_size"]
        if not isinstance(block_size, int) or block_size <= 0:
            raise _bad(where, "block_size", "a positive int", block_size)
        parent = got["parent_block_hash"]
        if parent is not None and not isinstance(parent, int | bytes):
            raise _bad(where, "parent_block_hash", "an int or bytes hash or None", parent)
        return BlockStored(
            block_hashes=_hashes(where, "block_hashes", got["block_hashes"]),
            parent_block_hash=parent,
            token_ids=tuple(token_ids),
            block_size=block_size,
            lora_id=_opt(where, "lora_id", got.get("lora_id"), int, "an int or None"),
            medium=medium,
        )
    if tag == "BlockRemoved":
        return BlockRemoved(_hashes(where, "block_hashes", got["block_hashes"]), medium)
    return AllBlocksCleared()


def decode_batch(payload: bytes) -> KVEventBatch:
    """Decode one message payload (msgpack of vLLM's `KVEventBatch`, either encoding).

    Raises:
        EngineError: the payload is not msgpack or a field has the wrong shape; the message
            names the event index and field.

    Examples:
        >>> batch = decode_batch(msgpack.packb([2.5, [["AllBlocksCleared"], ["Future", 1]], 0]))
        >>> batch.events
        (AllBlocksCleared(), UnknownEvent(tag='Future'))
    """
    try:
        raw = msgpack.unpackb(payload, raw=False)
    except (ValueError, msgpack.UnpackException) as e:
        raise EngineError(
            f"malformed KV event batch: payload is not msgpack ({e}); is the publisher a "
            "vLLM KV event stream?"
        ) from e
    if isinstance(raw, list | tuple) and len(raw) >= 2:
        ts, events, rank = raw[0], raw[1], raw[2] if len(raw) > 2 else None
    elif isinstance(raw, dict) and "ts" in raw and "events" in raw:
        ts, events, rank = raw["ts"], raw["events"], raw.get("data_parallel_rank")
    else:
        raise _bad("batch", "ts/events", "an array [ts, events, ...] or a map", raw)
    if not isinstance(ts, int | float) or isinstance(ts, bool):
        raise _bad("batch", "ts", "a number", ts)
    if not isinstance(events, list | tuple):
        raise _bad("batch", "events", "a list", events)
    rank = _opt("batch", "data_parallel_rank", rank, int, "an int or None")
    decoded = tuple(_decode_event(e, f"events[{i}]") for i, e in enumerate(events))
    return KVEventBatch(ts=float(ts), events=decoded, data_parallel_rank=rank)
