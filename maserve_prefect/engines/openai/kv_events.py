"""Follow a vLLM server's KV cache events over ZMQ and keep a directory of resident prefix blocks.

The one idea: vLLM (started with `--kv-events-config`) publishes every block it stores in or
evicts from its prefix cache; replaying those events into a `ResidencyDirectory` tells the harness
which prompt prefixes a replica still holds (HEAR's *state* channel), without asking the engine.

Each ZMQ message is multipart `[topic, seq, payload]`: `seq` is an 8-byte big-endian counter
starting at 0; `kv_decode.decode_batch` reads the payload (the wire format is described there) and
`kv_residency.ResidencyDirectory` keeps the blocks.

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
from collections.abc import Callable, Sequence
from types import TracebackType
from typing import Any

import zmq

from maserve_prefect.engines.openai.kv_decode import KVEvent, decode_batch
from maserve_prefect.engines.openai.kv_residency import ResidencyDirectory
from maserve_prefect.errors import ConfigError, EngineError

__all__ = ["KVEventSubscriber"]


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
