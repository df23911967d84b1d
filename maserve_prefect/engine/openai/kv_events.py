"""Follow a vLLM server's KV cache events over ZMQ and keep a directory of resident prefix blocks.

The one idea: vLLM (started with `--kv-events-config`) publishes every block it stores in or
evicts from its prefix cache; replaying those events into a `ResidencyDirectory` tells the harness
which prompt prefixes a replica still holds (HEAR's *state* channel), without asking the engine.

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

Directory choices: a block is keyed by `(hash, medium)`, so a block offloaded to CPU and still on
GPU is two entries; a missing medium means GPU (vLLM's GPU block pool is the only publisher that
omits it, in versions before the field existed); media are upper-cased. `AllBlocksCleared`
(a prefix-cache reset) clears every medium: under-reporting residency costs a cache miss,
over-reporting it misroutes a request. Block hashes of different KV cache groups (hybrid models)
share one key space. A block's parent is the previous hash of its `BlockStored` event (the first
one's is `parent_block_hash`).

Subscriber choices: with a `tcp://host:port` endpoint vLLM's PUB socket *connects*, so the
subscriber *binds* (port 0 picks a free port; read `.endpoint` after `start()` and put it in the
vLLM config). With a wildcard (`*`) or `ipc://` endpoint vLLM binds, so the subscriber connects —
the same heuristic vLLM uses, inverted. A `seq` that skips ahead (or a first `seq` above 0) is a
gap: events were lost and the directory may be stale (`num_gaps`, `num_missed`). A `seq` back to
0 is a publisher restart (a new server with an empty cache): the directory is cleared. vLLM's
replay socket is not used. With data parallelism each rank publishes on its own port (port +
rank): run one subscriber per rank.

Examples:
    >>> import msgpack
    >>> payload = msgpack.packb([1.0, [["BlockStored", [11, 12], None, [1, 2, 3, 4], 2, None,
    ...                                   "GPU"], ["BlockRemoved", [12], "GPU"]]])
    >>> d = ResidencyDirectory()
    >>> for ev in decode_batch(payload).events:
    ...     d.apply(ev)
    >>> d.reusable_prefix_blocks([11, 12]), d.num_stored, d.num_removed
    (1, 2, 1)
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from types import TracebackType
from typing import Any

import msgpack
import zmq

from maserve_prefect.errors import ConfigError, EngineError

BlockHash = int | bytes
DEFAULT_MEDIUM = "GPU"


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


# -- decoding ---------------------------------------------------------------------------------

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


# -- residency ----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class BlockInfo:
    """A resident block: where, its parent in the prefix chain, its tokens, when it was stored."""

    medium: str
    parent: BlockHash | None
    num_tokens: int
    stored_at: float


def _medium(medium: str | None) -> str:
    return DEFAULT_MEDIUM if medium is None else medium.upper()


class ResidencyDirectory:
    """Block hash → where it is resident, maintained from KV events. Thread-safe.

    Counters: `num_stored` / `num_removed` count blocks (hashes) in store / remove events,
    `num_cleared` counts `AllBlocksCleared` events (and publisher restarts), `num_unknown`
    unknown events, `num_unmatched_removals` removals of a block the directory did not hold (a
    sign of lost events).

    Examples:
        >>> d = ResidencyDirectory()
        >>> d.apply(BlockStored((b"a", b"b"), None, (), 16, medium="CPU"), t_s=1.0)
        >>> d.resident(b"b"), d.resident(b"b", "GPU"), d.counts_by_medium()
        (True, False, {'CPU': 2})
        >>> d.info(b"b")
        BlockInfo(medium='CPU', parent=b'a', num_tokens=16, stored_at=1.0)
    """

    def __init__(self) -> None:
        self._lock = threading.RLock()
        self._blocks: dict[BlockHash, dict[str, BlockInfo]] = {}
        self.num_stored = 0
        self.num_removed = 0
        self.num_cleared = 0
        self.num_unknown = 0
        self.num_unmatched_removals = 0

    def apply(self, event: KVEvent, t_s: float = 0.0) -> None:
        """Apply one event; `t_s` (the caller's clock) becomes `stored_at` of stored blocks."""
        with self._lock:
            if isinstance(event, BlockStored):
                self._store(event, t_s)
            elif isinstance(event, BlockRemoved):
                medium = _medium(event.medium)
                for h in event.block_hashes:
                    where = self._blocks.get(h)
                    if where is None or where.pop(medium, None) is None:
                        self.num_unmatched_removals += 1
                    elif not where:
                        del self._blocks[h]
                self.num_removed += len(event.block_hashes)
            elif isinstance(event, AllBlocksCleared):
                self.clear()
            else:
                self.num_unknown += 1

    def _store(self, event: BlockStored, t_s: float) -> None:
        medium, size = _medium(event.medium), event.block_size
        parent = event.parent_block_hash
        for i, h in enumerate(event.block_hashes):
            # vLLM caches full blocks only; without token ids (some connectors) trust block_size
            chunk = event.token_ids[i * size : (i + 1) * size]
            num_tokens = len(chunk) if event.token_ids else size
            self._blocks.setdefault(h, {})[medium] = BlockInfo(medium, parent, num_tokens, t_s)
            parent = h
        self.num_stored += len(event.block_hashes)

    def clear(self) -> None:
        """Forget every block (counted in `num_cleared`)."""
        with self._lock:
            self._blocks.clear()
            self.num_cleared += 1

    def resident(self, block_hash: BlockHash, medium: str | None = None) -> bool:
        """Whether the block is resident on `medium` (None: on any medium)."""
        with self._lock:
            where = self._blocks.get(block_hash)
            if not where:
                return False
            return medium is None or medium.upper() in where

    def info(self, block_hash: BlockHash, medium: str | None = None) -> BlockInfo | None:
        """The block's entry on `medium` (None: GPU if resident there, else any), or None."""
        with self._lock:
            where = self._blocks.get(block_hash) or {}
            if medium is not None:
                return where.get(medium.upper())
            return where.get(DEFAULT_MEDIUM) or next(iter(where.values()), None)

    def reusable_prefix_blocks(
        self, hashes: Iterable[BlockHash], media: Sequence[str] = ("GPU", "CPU")
    ) -> int:
        """Length of the leading run of `hashes` resident on any of `media`.

        A prefix cache can only reuse a prompt's blocks up to its first missing one, so the run
        stops there even if later blocks are resident.
        """
        wanted = {m.upper() for m in media}
        n = 0
        with self._lock:
            for h in hashes:
                if wanted.isdisjoint(self._blocks.get(h, ())):
                    break
                n += 1
        return n

    def num_blocks(self, medium: str | None = None) -> int:
        """Resident entries on `medium` (None: distinct hashes on any medium)."""
        with self._lock:
            if medium is None:
                return len(self._blocks)
            m = medium.upper()
            return sum(m in where for where in self._blocks.values())

    def counts_by_medium(self) -> dict[str, int]:
        """Resident blocks per medium."""
        counts: dict[str, int] = {}
        with self._lock:
            for where in self._blocks.values():
                for m in where:
                    counts[m] = counts.get(m, 0) + 1
        return dict(sorted(counts.items()))


# -- subscriber ---------------------------------------------------------------------------------


def _vllm_binds(endpoint: str) -> bool:
    """vLLM's publisher rule: bind on a wildcard or ipc endpoint, connect otherwise."""
    return "*" in endpoint or "::" in endpoint or endpoint.startswith("ipc://")


class KVEventSubscriber:
    """Receive vLLM KV event batches on a background thread and apply them to a directory.

    Args:
        endpoint: the address to give vLLM (`tcp://127.0.0.1:0` binds a free port).
        topic: the topic vLLM publishes on (a prefix filter; "" receives everything).
        directory: the directory to maintain (default: a new one, `.directory`).
        now: the caller's clock in seconds (stamps the event log and `stored_at`); default:
            monotonic seconds since construction.
        bind: bind (True) or connect (False); None mirrors vLLM's rule (see module docstring).
        poll_interval_s: how often the thread checks for `stop()` while idle.
        max_log_events: the event log keeps the newest this many `(t_s, event)` entries.

    Raises:
        ConfigError: an `inproc://` or non-tcp/ipc endpoint, or a non-positive interval.

    Examples:
        >>> with KVEventSubscriber() as sub:
        ...     sub.endpoint.startswith("tcp://127.0.0.1:") and not sub.endpoint.endswith(":0")
        True
    """

    def __init__(
        self,
        endpoint: str = "tcp://127.0.0.1:0",
        topic: str = "",
        *,
        directory: ResidencyDirectory | None = None,
        now: Callable[[], float] | None = None,
        bind: bool | None = None,
        poll_interval_s: float = 0.05,
        max_log_events: int = 100_000,
    ) -> None:
        if not endpoint.startswith(("tcp://", "ipc://")):
            raise ConfigError(
                f"KVEventSubscriber: endpoint {endpoint!r} must be tcp://host:port or ipc://path "
                "(vLLM runs in another process, so inproc:// cannot reach it)"
            )
        if not poll_interval_s > 0:
            raise ConfigError(f"KVEventSubscriber: poll_interval_s must be > 0: {poll_interval_s}")
        self.configured_endpoint = endpoint
        self.topic = topic
        self.directory = directory if directory is not None else ResidencyDirectory()
        self.bind = not _vllm_binds(endpoint) if bind is None else bind
        self.poll_interval_s = poll_interval_s
        if now is None:
            t0 = time.monotonic()
            now = lambda: time.monotonic() - t0  # noqa: E731
        self._now = now
        self._lock = threading.RLock()
        self._cond = threading.Condition(self._lock)
        self._log: deque[tuple[float, KVEvent]] = deque(maxlen=max_log_events)
        self._errors: list[tuple[float, str]] = []
        self._last_seq: int | None = None
        self._endpoint: str | None = None
        self._ctx: zmq.Context[Any] | None = None
        self._sock: zmq.Socket[Any] | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.num_batches = 0
        self.num_events = 0
        self.num_gaps = 0
        self.num_missed = 0
        self.num_restarts = 0
        self.num_malformed = 0

    @property
    def endpoint(self) -> str:
        """The address vLLM must use (the real port once bound).

        Raises:
            EngineError: not started yet (the port is chosen when the socket binds).
        """
        if self._endpoint is None:
            raise EngineError(
                "KVEventSubscriber.endpoint: not started; call start() first (the port is "
                "chosen when the socket binds)"
            )
        return self._endpoint

    def events(self) -> list[tuple[float, KVEvent]]:
        """The event log: `(t_s, event)` in arrival order (newest `max_log_events`)."""
        with self._lock:
            return list(self._log)

    @property
    def errors(self) -> list[tuple[float, str]]:
        """Malformed messages: `(t_s, message)`."""
        with self._lock:
            return list(self._errors)

    def start(self) -> KVEventSubscriber:
        """Open the socket (bind or connect) and start the receive thread; returns self."""
        if self._thread is not None:
            return self
        ctx: zmq.Context[Any] = zmq.Context()
        sock = ctx.socket(zmq.SUB)
        sock.setsockopt(zmq.SUBSCRIBE, self.topic.encode())
        sock.setsockopt(zmq.LINGER, 0)
        try:
            if self.bind:
                sock.bind(self.configured_endpoint)
                last = sock.getsockopt(zmq.LAST_ENDPOINT)
                self._endpoint = last.decode() if isinstance(last, bytes) else str(last)
            else:
                sock.connect(self.configured_endpoint.replace("*", "127.0.0.1"))
                self._endpoint = self.configured_endpoint
        except zmq.ZMQError as e:
            sock.close(0)
            ctx.term()
            verb = "bind" if self.bind else "connect"
            raise EngineError(
                f"KVEventSubscriber: cannot {verb} {self.configured_endpoint!r}: {e}"
            ) from e
        self._ctx, self._sock = ctx, sock
        self._last_seq = None
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name="maserve-kv-events", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop the thread (within about `poll_interval_s`), close the socket and context."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        if self._sock is not None:
            self._sock.close(0)
            self._sock = None
        if self._ctx is not None:
            self._ctx.term()
            self._ctx = None

    def __enter__(self) -> KVEventSubscriber:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def wait_for(self, predicate: Callable[[], bool], timeout_s: float) -> bool:
        """Block until `predicate()` is true (checked after each message) or `timeout_s` passes.

        Returns:
            The predicate's final value.
        """
        with self._cond:
            return self._cond.wait_for(predicate, timeout=timeout_s)

    def _run(self) -> None:
        sock = self._sock
        assert sock is not None
        poller = zmq.Poller()
        poller.register(sock, zmq.POLLIN)
        timeout_ms = max(1, int(self.poll_interval_s * 1000))
        while not self._stop.is_set():
            if not poller.poll(timeout_ms):
                continue
            while True:
                try:
                    frames = sock.recv_multipart(zmq.NOBLOCK)
                except zmq.Again:
                    break
                self.handle_message(frames)

    def handle_message(self, frames: Sequence[bytes]) -> None:
        """Apply one multipart message `[topic, seq, payload]` (the receive thread calls this)."""
        t_s = self._now()
        if len(frames) != 3 or len(frames[1]) != 8:
            self._malformed(t_s, f"expected [topic, 8-byte seq, payload], got {len(frames)} frames")
            return
        seq = int.from_bytes(frames[1], "big")
        try:
            batch = decode_batch(frames[2])
        except EngineError as e:
            self._track_seq(seq)
            self._malformed(t_s, f"seq {seq}: {e}")
            return
        with self._cond:
            self._track_seq(seq)
            for event in batch.events:
                self.directory.apply(event, t_s)
                self._log.append((t_s, event))
            self.num_batches += 1
            self.num_events += len(batch.events)
            self._cond.notify_all()

    def _track_seq(self, seq: int) -> None:
        with self._lock:
            expected = 0 if self._last_seq is None else self._last_seq + 1
            if seq == 0 and self._last_seq is not None:
                # a new publisher (restarted server) starts at 0 with an empty cache
                self.num_restarts += 1
                self.directory.clear()
            elif seq != expected:
                self.num_gaps += 1
                self.num_missed += max(0, seq - expected)
            self._last_seq = seq

    def _malformed(self, t_s: float, message: str) -> None:
        with self._cond:
            self.num_malformed += 1
            self._errors.append((t_s, message))
            self._cond.notify_all()
