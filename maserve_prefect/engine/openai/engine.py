"""`OpenAIEngine`: the `Replica` protocol over any OpenAI-compatible server (vLLM first).

The one idea: `submit` never waits on the network. It decides acceptance at once (deployment,
controls, prompt form, context length), hands the request to an asyncio loop that the engine runs
in its own daemon thread, and returns the `Ticket`. The loop streams the call with the `openai`
client (at most `max_concurrency` at a time, the client's own retries off), retries 5xx answers,
connection errors and timeouts by its `RetryPolicy` — a retry after a partial stream restarts the
request — and resolves the ticket through `deliver`, which moves the callbacks onto the caller's
regime (e.g. `lambda fn: gate.defer(None, fn)` runs them under the `WallGate` lock).

Times: every time in an `Outcome` (arrival = submit time, first token, finish, each `Attempt`'s
start and end) is on the caller's clock `now` (default: monotonic seconds since construction).
`first_scheduled_s` is None: HTTP does not show when the server first scheduled a request. The
ticket's first-token callback fires once, at the first token of any attempt; the outcome's
`first_token_s` belongs to the attempt whose output it reports (a note says when they differ).

Callbacks run under the engine's callback lock (inside `deliver`); `wait` registers under the same
lock, so registering after `submit` from another thread cannot miss an outcome. Do not call
`close()` from a ticket callback, nor while holding the lock your `deliver` takes: close waits for
the loop to resolve every in-flight ticket as ABORTED.

State: `lifecycle` is "ready", "unreachable" (discovery failed or the last attempt could not
connect) or "stopped" (closed). Queue counts are this engine's own in-flight requests (running =
holding a concurrency slot) unless a `state_source` supplies vLLM's gauges by Prometheus name
(`vllm:num_requests_running`, `vllm:num_requests_waiting`, `vllm:kv_cache_usage_perc`); block
fields are 0 (HTTP does not show blocks).

Examples:
    >>> RetryPolicy(max_attempts=3, backoff_s=0.2).delay_s(2)
    0.4
    >>> classify_error(TimeoutError()).kind
    'timeout'
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import json
import logging
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import httpx
import openai

from maserve_prefect.engine.openai.discovery import ServerInfo, discover, normalize_base_url
from maserve_prefect.engine.openai.prompts import (
    DEFAULT_VOCAB_SIZE,
    CallSpec,
    ServerFeatures,
    build_call,
    resolve_controls,
)
from maserve_prefect.engine.protocol import (
    Acceptance,
    Attempt,
    Capabilities,
    Control,
    EngineState,
    ExecutionMode,
    Intent,
    Outcome,
    OutcomeStatus,
    Priority,
    Request,
    Ticket,
)
from maserve_prefect.errors import ConfigError, EngineError, UnsupportedError

try:  # openai >= 3 speaks through httpx2; older releases through httpx
    import httpx2

    _TRANSPORT_ERRORS: tuple[type[Exception], ...] = (httpx.TransportError, httpx2.TransportError)
except ImportError:  # pragma: no cover - depends on the installed openai
    _TRANSPORT_ERRORS = (httpx.TransportError,)

__all__ = ["ERROR_KINDS", "Failure", "OpenAIEngine", "RetryPolicy", "classify_error"]

log = logging.getLogger(__name__)

ERROR_KINDS = ("5xx", "4xx", "429", "connection", "timeout", "internal")
"""How a failed attempt is classified; `RetryPolicy.retry_on` names the kinds to retry."""

Deliver = Callable[[Callable[[], None]], None]


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """When and how often a failed attempt is tried again.

    Args:
        max_attempts: attempts in all (1 = never retry).
        backoff_s: wait before the second attempt; doubles each time, capped at `max_backoff_s`.
        max_backoff_s: the longest wait between attempts.
        retry_on: error kinds to retry (see `ERROR_KINDS`); 4xx answers are not retried by
            default (the request itself is wrong), 429 only if listed.

    Raises:
        ConfigError: a bound out of range or an unknown kind.
    """

    max_attempts: int = 3
    backoff_s: float = 0.2
    max_backoff_s: float = 5.0
    retry_on: tuple[str, ...] = ("5xx", "connection", "timeout")

    def __post_init__(self) -> None:
        if self.max_attempts < 1 or self.backoff_s < 0 or self.max_backoff_s < 0:
            raise ConfigError(
                f"{self!r}: need max_attempts >= 1 and non-negative backoff_s / max_backoff_s"
            )
        unknown = sorted(set(self.retry_on) - set(ERROR_KINDS))
        if unknown:
            raise ConfigError(f"RetryPolicy.retry_on: unknown kinds {unknown}; use {ERROR_KINDS}")

    def delay_s(self, attempt: int) -> float:
        """The wait after failed attempt number `attempt` (1-based)."""
        return min(self.backoff_s * 2 ** (attempt - 1), self.max_backoff_s)


@dataclass(frozen=True, slots=True)
class Failure:
    """A classified attempt failure: its kind, the HTTP status (if any) and a message."""

    kind: str
    status_code: int | None
    message: str


class IncompleteStreamError(Exception):
    """The stream ended without a finish reason (the connection went away mid-answer)."""


def _server_message(exc: openai.APIStatusError) -> str:
    """The server's own message (vLLM: `{"message": ...}` or `{"error": {"message": ...}}`)."""
    body = exc.body
    if isinstance(body, dict):
        inner = body.get("error")
        msg = inner.get("message") if isinstance(inner, dict) else body.get("message")
        if isinstance(msg, str) and msg:
            return msg
    return exc.message


def classify_error(exc: BaseException) -> Failure:
    """Classify an attempt's exception into one of `ERROR_KINDS`.

    Examples:
        >>> classify_error(IncompleteStreamError("cut")).kind
        'connection'
        >>> classify_error(ValueError("bug")).kind
        'internal'
    """
    if isinstance(exc, openai.APIStatusError):
        code = exc.status_code
        kind = "5xx" if code >= 500 else ("429" if code == 429 else "4xx")
        return Failure(kind, code, f"HTTP {code}: {_server_message(exc)}")
    if isinstance(exc, openai.APITimeoutError | TimeoutError):
        return Failure("timeout", None, f"timed out ({type(exc).__name__})")
    if isinstance(exc, (openai.APIConnectionError, IncompleteStreamError, *_TRANSPORT_ERRORS)):
        cause = f" ({type(exc.__cause__).__name__}: {exc.__cause__})" if exc.__cause__ else ""
        return Failure("connection", None, f"connection error: {type(exc).__name__}: {exc}{cause}")
    if isinstance(exc, openai.APIError):  # an error event inside the stream: the server failed
        return Failure("5xx", None, f"server error in stream: {exc.message}")
    return Failure("internal", None, f"{type(exc).__name__}: {exc}")


@dataclass(slots=True)
class _Job:
    request: Request
    spec: CallSpec
    ticket: Ticket
    notes: tuple[str, ...]
    mode: str
    arrival_s: float
    attempts: list[Attempt] = field(default_factory=list)
    running: bool = False
    first_token_s: float | None = None  # first token of any attempt (what the ticket reported)


@dataclass(slots=True)
class _Streamed:
    text: str
    token_ids: tuple[int, ...] | None
    first_token_s: float | None
    num_prompt_tokens: int | None
    num_output_tokens: int | None
    num_cached_tokens: int
    num_pieces: int  # chunks that carried output (the count when the server sends no usage)


class OpenAIEngine:
    """A `Replica` over one OpenAI-compatible endpoint (see the module docstring).

    Args:
        base_url: the server root, with or without `/v1`.
        model: the server's model id; None picks the only one it serves.
        name: replica name in records and messages.
        deployment: the deployment it serves (requests for another are REJECTED); None uses
            the model id.
        api_key: bearer token (vLLM ignores it unless started with `--api-key`).
        max_concurrency: requests streaming at once; the rest wait in this engine.
        request_timeout_s: limit on one attempt, first byte to last.
        retry: the retry policy.
        deliver: runs ticket callbacks on the caller's regime; None runs them on the loop thread.
        now: the caller's clock (seconds); default monotonic seconds since construction.
        vocab_size: bound for synthesized prompt ids (servers do not report the vocabulary).
        state_source: latest vLLM gauge values by Prometheus name, for `state()`.
        server_info: skip discovery and use these facts.
        kv_events_endpoint: the server's KV-event publisher, if subscribed elsewhere.

    Raises:
        ConfigError: bad bounds or URL.

    Examples:
        >>> eng = OpenAIEngine("http://127.0.0.1:9/v1", model="m")
        >>> eng.state().lifecycle, eng.deployment
        ('ready', 'm')
    """

    def __init__(
        self,
        base_url: str,
        *,
        model: str | None = None,
        name: str = "openai0",
        deployment: str | None = None,
        api_key: str = "EMPTY",
        max_concurrency: int = 64,
        request_timeout_s: float = 600.0,
        retry: RetryPolicy | None = None,
        deliver: Deliver | None = None,
        now: Callable[[], float] | None = None,
        vocab_size: int = DEFAULT_VOCAB_SIZE,
        state_source: Callable[[], Mapping[str, float]] | None = None,
        server_info: ServerInfo | None = None,
        kv_events_endpoint: str | None = None,
    ) -> None:
        if max_concurrency < 1 or not request_timeout_s > 0:
            raise ConfigError(
                f"OpenAIEngine {name!r}: need max_concurrency >= 1 and request_timeout_s > 0, "
                f"got {max_concurrency} and {request_timeout_s}"
            )
        if server_info is not None and model is not None and server_info.model != model:
            raise ConfigError(
                f"OpenAIEngine {name!r}: model {model!r} differs from server_info.model "
                f"{server_info.model!r}"
            )
        self.base_url = normalize_base_url(base_url)
        self.name = name
        self.model = model if server_info is None else server_info.model
        self.deployment = deployment if deployment is not None else (self.model or "")
        self.api_key = api_key
        self.max_concurrency = max_concurrency
        self.request_timeout_s = request_timeout_s
        self.retry = retry if retry is not None else RetryPolicy()
        self.vocab_size = vocab_size
        self.state_source = state_source
        self.kv_events_endpoint = kv_events_endpoint
        self.intents: list[Intent] = []
        self.callback_errors: list[BaseException] = []
        self._deliver_fn = deliver
        t0 = time.monotonic()
        self._now: Callable[[], float] = now if now is not None else lambda: time.monotonic() - t0
        self._info = server_info
        self._start_lock = threading.Lock()  # discovery and loop start, once
        self._lock = threading.RLock()  # jobs, counters, closed flag
        self._callback_lock = threading.RLock()  # every ticket resolution runs under it
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._loop_thread: threading.Thread | None = None  # the caller's, when attached
        self._client: openai.AsyncOpenAI | None = None
        self._sem: asyncio.Semaphore | None = None
        self._jobs: dict[str, _Job] = {}
        self._tasks: set[asyncio.Task[None]] = set()  # touched on the loop thread only
        self._closed = False
        self._unreachable = False
        self._counters = dict.fromkeys(
            ("num_submitted", "num_completed", "num_failed", "num_aborted", "num_retries"), 0
        )

    # -- lifecycle -------------------------------------------------------------------------

    def server_info(self) -> ServerInfo:
        """The discovered server facts (discovers on the first call).

        Raises:
            EngineError: the server cannot be reached.
            ConfigError: unknown model, or several served and none chosen.
        """
        with self._start_lock:
            if self._info is None:
                try:
                    self._info = discover(
                        self.base_url,
                        model=self.model,
                        api_key=self.api_key,
                        kv_events_endpoint=self.kv_events_endpoint,
                    )
                except EngineError:
                    self._unreachable = True
                    raise
                self._unreachable = False
                self.model = self._info.model
                self.deployment = self.deployment or self._info.model
            return self._info

    def start(self) -> OpenAIEngine:
        """Discover the server (once) and start the event-loop thread; idempotent.

        Raises:
            EngineError: closed already, or the server cannot be reached.
        """
        info = self.server_info()
        with self._start_lock:
            if self._closed:
                raise EngineError(f"{self.name}: start() after close(); build a new OpenAIEngine")
            if self._thread is not None:
                return self
            if self._loop is not None:
                raise EngineError(f"{self.name}: start() on an attached engine")
            loop = asyncio.new_event_loop()
            thread = threading.Thread(
                target=loop.run_forever, name=f"{self.name}-loop", daemon=True
            )
            thread.start()
            asyncio.run_coroutine_threadsafe(self._setup(info), loop).result()
            self._loop, self._thread = loop, thread
        return self

    def attach(self) -> OpenAIEngine:
        """Discover the server and run on the *calling* thread's running event loop.

        For callers that are themselves asyncio programs (the wall-clock replay driver): no loop
        thread, no hop between threads, so a completion is seen by the caller in the same loop
        iteration that read it off the socket. Call `aclose()` (awaited, on that loop) to stop.

        Raises:
            EngineError: no running loop, already started or closed, or the server is gone.
        """
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            raise EngineError(
                f"{self.name}: attach() needs a running event loop; use start() from sync code"
            ) from None
        info = self.server_info()
        with self._start_lock:
            if self._closed or self._loop is not None:
                raise EngineError(f"{self.name}: attach() on a started or closed engine")
            self._client = openai.AsyncOpenAI(
                base_url=f"{info.base_url}/v1",
                api_key=self.api_key,
                max_retries=0,
                timeout=self.request_timeout_s,
            )
            self._sem = asyncio.Semaphore(self.max_concurrency)
            self._loop, self._loop_thread = loop, threading.current_thread()
        return self

    async def aclose(self) -> None:
        """Close an attached engine on its loop (see `close` for what closing does)."""
        with self._start_lock, self._lock:
            if self._closed:
                return
            self._closed = True
        if self._loop is not None:
            await self._shutdown()
        self._raise_callback_errors()

    def _raise_callback_errors(self) -> None:
        if self.callback_errors:
            first = self.callback_errors[0]
            raise EngineError(
                f"{self.name}: {len(self.callback_errors)} ticket callback(s) raised; the first: "
                f"{type(first).__name__}: {first}"
            ) from first

    async def _setup(self, info: ServerInfo) -> None:
        self._client = openai.AsyncOpenAI(
            base_url=f"{info.base_url}/v1",
            api_key=self.api_key,
            max_retries=0,
            timeout=self.request_timeout_s,
        )
        self._sem = asyncio.Semaphore(self.max_concurrency)

    def close(self, timeout_s: float = 30.0) -> None:
        """Abort in-flight requests (each ticket resolves ABORTED), stop the loop; idempotent.

        Raises:
            EngineError: called on the loop thread (from a ticket callback), the loop did not
                stop within `timeout_s`, or a ticket callback raised earlier (the first error is
                the cause).
        """
        if self._thread is None and self._loop is not None:
            raise EngineError(f"{self.name}: an attached engine closes with `await aclose()`")
        if self._thread is not None and threading.current_thread() is self._thread:
            raise EngineError(
                f"{self.name}: close() called from a ticket callback on the engine's loop "
                "thread; close it from another thread"
            )
        with self._start_lock, self._lock:
            if self._closed:
                return
            self._closed = True
            loop, thread = self._loop, self._thread
        if loop is not None and thread is not None:
            fut = asyncio.run_coroutine_threadsafe(self._shutdown(), loop)
            try:
                fut.result(timeout_s)
            except concurrent.futures.TimeoutError as exc:
                raise EngineError(
                    f"{self.name}: in-flight requests did not abort within {timeout_s} s; is a "
                    "ticket callback blocked on a lock held by the thread calling close()?"
                ) from exc
            finally:
                loop.call_soon_threadsafe(loop.stop)
                thread.join(timeout_s)
                if not thread.is_alive():
                    loop.close()
        self._raise_callback_errors()

    async def _shutdown(self) -> None:
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        with self._lock:  # tasks cancelled before their first step never ran their handler
            left = list(self._jobs.values())
        for job in left:
            self._finish(job, self._ended(job, OutcomeStatus.ABORTED, "aborted: engine closed"))
        if self._client is not None:
            await self._client.close()

    def __enter__(self) -> OpenAIEngine:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- Replica protocol ------------------------------------------------------------------

    def capabilities(self) -> Capabilities:
        """What the server honours (discovers on the first call; see `server_info`)."""
        info = self.server_info()
        controls: tuple[type[Control], ...] = (ExecutionMode,)
        return Capabilities(
            control_types=(*controls, Priority) if info.priority_scheduling else controls,
            accepts_token_ids=info.token_id_prompts,
            length_lock=info.length_lock,
            priority_scheduling=info.priority_scheduling,
            prefix_caching=info.is_vllm,
            kv_events=info.kv_events,
            sleep_levels=(),
            modes=("default",),
        )

    def submit(self, request: Request, controls: Sequence[Control] = ()) -> Ticket:
        """Answer at once: ACCEPTED (the call starts on the loop), REJECTED or UNSUPPORTED.

        The first call discovers the server and starts the loop (call `start()` up front to
        keep that off the submit path); an unreachable server answers REJECTED.
        """
        rid = request.request_id
        arrival_s = self._now()
        if self._closed:
            return Ticket(rid, Acceptance.REJECTED, f"{self.name} is closed")
        try:
            if self._loop is None:
                self.start()
        except EngineError as exc:
            return Ticket(rid, Acceptance.REJECTED, str(exc))
        info = self.server_info()
        if self.deployment and request.deployment != self.deployment:
            return Ticket(
                rid,
                Acceptance.REJECTED,
                f"{self.name} serves {self.deployment!r}, not {request.deployment!r}",
            )
        caps = self.capabilities()
        try:
            choice = resolve_controls(
                request,
                controls,
                control_types=caps.control_types,
                modes=caps.modes,
                where=self.name,
            )
            features = ServerFeatures(
                token_id_prompts=info.token_id_prompts,
                length_lock=info.length_lock,
                cache_salt=info.is_vllm,
                return_token_ids=info.returns_token_ids,
            )
            spec = build_call(
                request,
                model=info.model,
                features=features,
                priority=choice.priority,
                vocab_size=self.vocab_size,
                where=self.name,
            )
        except UnsupportedError as exc:
            return Ticket(rid, Acceptance.UNSUPPORTED, str(exc))
        total = request.num_prompt() + request.max_tokens
        if spec.endpoint == "completions" and info.max_model_len and total > info.max_model_len:
            return Ticket(
                rid,
                Acceptance.REJECTED,
                f"prompt + max_tokens = {total} exceeds max_model_len {info.max_model_len} of "
                f"{info.model!r}; shorten the prompt or lower max_tokens",
            )
        notes = choice.notes + spec.notes
        ticket = Ticket(rid, Acceptance.ACCEPTED, notes=notes)
        job = _Job(request, spec, ticket, notes, choice.mode, arrival_s)
        with self._lock:
            if self._closed:
                return Ticket(rid, Acceptance.REJECTED, f"{self.name} is closed")
            if rid in self._jobs:
                return Ticket(rid, Acceptance.REJECTED, f"request id {rid!r} is already in flight")
            self._jobs[rid] = job
            self._counters["num_submitted"] += 1
            assert self._loop is not None
            self._loop.call_soon_threadsafe(self._spawn, job)  # before any close() shutdown
        return ticket

    def inform(self, intent: Intent) -> None:
        """Record an intent; it never changes what the engine does."""
        with self._lock:
            self.intents.append(intent)

    def state(self) -> EngineState:
        """A snapshot (no HTTP): lifecycle, queue counts, KV usage from `state_source`."""
        with self._lock:
            lifecycle = (
                "stopped" if self._closed else ("unreachable" if self._unreachable else "ready")
            )
            num_running = sum(job.running for job in self._jobs.values())
            num_local_waiting = len(self._jobs) - num_running
            counters: dict[str, float] = {k: float(v) for k, v in self._counters.items()}
        gauges = dict(self.state_source()) if self.state_source is not None else {}
        num_waiting = num_local_waiting
        if "vllm:num_requests_waiting" in gauges:
            num_waiting += int(gauges["vllm:num_requests_waiting"])
        kv_usage = gauges.get("vllm:kv_cache_usage_perc", gauges.get("vllm:gpu_cache_usage_perc"))
        counters |= {"num_in_flight": float(num_running + num_local_waiting)}
        return EngineState(
            name=self.name,
            deployment=self.deployment,
            lifecycle=lifecycle,
            num_running=int(gauges.get("vllm:num_requests_running", num_running)),
            num_waiting=num_waiting,
            kv_usage=float(kv_usage or 0.0),
            num_free_blocks=0,
            num_total_blocks=0,
            block_size=0,
            counters=counters | gauges,
        )

    # -- waiting on tickets ----------------------------------------------------------------

    def now(self) -> float:
        """The engine's clock (the caller's `now`, else monotonic seconds since construction)."""
        return self._now()

    def wait(self, ticket: Ticket, timeout_s: float | None = None) -> Outcome:
        """Block until `ticket` has its outcome (safe from any thread but the loop's).

        Raises:
            UnsupportedError: the ticket was not accepted.
            EngineError: called on the loop thread, or no outcome within `timeout_s`.
        """
        if not ticket.accepted:
            raise UnsupportedError(
                f"request {ticket.request_id!r} was {ticket.acceptance.value}: {ticket.reason}"
            )
        if threading.current_thread() in (self._thread, self._loop_thread):
            raise EngineError(f"{self.name}: wait() on the loop thread would deadlock")
        done = threading.Event()
        box: list[Outcome] = []

        def got(outcome: Outcome) -> None:
            box.append(outcome)
            done.set()

        with self._callback_lock:
            ticket.on_done(got)
        if not done.wait(timeout_s):
            raise EngineError(
                f"{self.name}: request {ticket.request_id!r} has no outcome after {timeout_s} s"
            )
        return box[0]

    # -- the loop side ---------------------------------------------------------------------

    def _deliver(self, fn: Callable[[], None]) -> None:
        def locked() -> None:
            with self._callback_lock:
                fn()

        try:
            if self._deliver_fn is None:
                locked()
            else:
                self._deliver_fn(locked)
        except Exception as exc:  # keep the loop alive; close() reports it
            log.exception("%s: a ticket callback raised", self.name)
            self.callback_errors.append(exc)

    def _spawn(self, job: _Job) -> None:
        task = asyncio.get_running_loop().create_task(self._serve(job))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _finish(self, job: _Job, outcome: Outcome) -> None:
        with self._lock:
            if self._jobs.pop(job.request.request_id, None) is None:
                return  # already resolved
            key = {
                OutcomeStatus.COMPLETED: "num_completed",
                OutcomeStatus.FAILED: "num_failed",
                OutcomeStatus.ABORTED: "num_aborted",
            }[outcome.status]
            self._counters[key] += 1
            self._counters["num_retries"] += max(len(job.attempts) - 1, 0)
        self._deliver(lambda: job.ticket.resolve(outcome))

    def _ended(self, job: _Job, status: OutcomeStatus, error: str) -> Outcome:
        req = job.request
        return Outcome(
            request_id=req.request_id,
            status=status,
            num_prompt_tokens=req.num_prompt(),
            num_output_tokens=0,
            num_cached_tokens=0,
            num_preemptions=0,
            realized_mode=job.mode,
            arrival_s=job.arrival_s,
            first_scheduled_s=None,
            first_token_s=None,
            finish_s=self._now(),
            notes=job.notes,
            error=error,
            attempts=tuple(job.attempts),
        )

    async def _serve(self, job: _Job) -> None:
        try:
            outcome = await self._attempts(job)
        except asyncio.CancelledError:
            self._finish(job, self._ended(job, OutcomeStatus.ABORTED, "aborted: engine closed"))
            raise
        except Exception as exc:  # a bug here must still resolve the ticket, loudly
            log.exception("%s: request %s crashed", self.name, job.request.request_id)
            outcome = self._ended(job, OutcomeStatus.FAILED, f"internal error: {exc!r}")
        self._finish(job, outcome)

    async def _attempts(self, job: _Job) -> Outcome:
        assert self._sem is not None
        for number in range(1, self.retry.max_attempts + 1):
            async with self._sem:
                job.running = True
                start_s = self._now()
                try:
                    got = await asyncio.wait_for(self._stream(job), self.request_timeout_s)
                except asyncio.CancelledError:
                    job.attempts.append(Attempt(number, start_s, self._now(), "aborted"))
                    raise
                except Exception as exc:
                    fail = classify_error(exc)
                    job.attempts.append(
                        Attempt(number, start_s, self._now(), fail.message, fail.status_code)
                    )
                    self._unreachable = fail.kind == "connection"
                else:
                    job.attempts.append(Attempt(number, start_s, self._now()))
                    self._unreachable = False
                    return self._completed(job, got)
                finally:
                    job.running = False
            if fail.kind not in self.retry.retry_on or number == self.retry.max_attempts:
                break
            await asyncio.sleep(self.retry.delay_s(number))
        return self._ended(job, OutcomeStatus.FAILED, f"after {number} attempt(s): {fail.message}")

    async def _stream(self, job: _Job) -> _Streamed:
        """One streaming call through the openai client, read as raw server-sent events.

        The chunks are decoded with `json.loads` rather than the SDK's typed models: a vLLM
        stream carries one chunk per token per request, and on a small machine per-chunk model
        construction would make this client, not the server, the bottleneck — late first-token
        and finish times are exactly what a measurement tool must not produce.
        """
        assert self._client is not None
        spec, chat = job.spec, job.spec.endpoint == "chat"
        resource: Any = self._client.chat.completions if chat else self._client.completions
        parts: list[str] = []
        ids: list[int] | None = []
        num_pieces = 0
        usage: dict[str, Any] | None = None
        first_s: float | None = None
        finished = False
        async with resource.with_streaming_response.create(
            **spec.params, extra_body=spec.extra_body or None
        ) as response:
            async for line in response.iter_lines():
                if not line.startswith("data:"):
                    continue
                data = line[5:].strip()
                if data == "[DONE]":
                    continue  # the stream ends here; let the line iterator finish cleanly
                chunk = json.loads(data)
                if "error" in chunk and not chunk.get("choices"):
                    raise IncompleteStreamError(f"the server sent an error: {chunk['error']}")
                usage = chunk.get("usage") or usage
                for choice in chunk.get("choices") or ():
                    piece = (
                        (choice.get("delta") or {}).get("content") if chat else choice.get("text")
                    ) or ""
                    toks = choice.get("token_ids")
                    if piece or toks:
                        num_pieces += 1
                        if first_s is None:
                            first_s = self._now()
                            self._first_token(job, first_s)
                    parts.append(piece)
                    if toks and ids is not None:
                        ids.extend(int(t) for t in toks)
                    elif piece:
                        ids = None  # text without ids: the server does not return them
                    finished = finished or bool(choice.get("finish_reason"))
        if not finished:
            raise IncompleteStreamError("the stream ended before a finish_reason")
        details = (usage or {}).get("prompt_tokens_details") or {}
        return _Streamed(
            text="".join(parts),
            token_ids=tuple(ids) if ids else None,
            first_token_s=first_s,
            num_prompt_tokens=(usage or {}).get("prompt_tokens"),
            num_output_tokens=(usage or {}).get("completion_tokens"),
            num_cached_tokens=int(details.get("cached_tokens") or 0),
            num_pieces=num_pieces,
        )

    def _first_token(self, job: _Job, t_s: float) -> None:
        if job.first_token_s is None:
            job.first_token_s = t_s
            self._deliver(lambda: job.ticket.resolve_first_token(t_s))

    def _completed(self, job: _Job, got: _Streamed) -> Outcome:
        notes = list(job.notes)
        num_prompt, num_output = got.num_prompt_tokens, got.num_output_tokens
        if num_prompt is None or num_output is None:
            notes.append("the server sent no usage; token counts are estimates")
            num_prompt = job.request.num_prompt() if num_prompt is None else num_prompt
            if num_output is None:
                num_output = len(got.token_ids) if got.token_ids else got.num_pieces
        if job.first_token_s is not None and job.first_token_s != got.first_token_s:
            notes.append(
                f"the ticket's first token ({job.first_token_s:.6f} s) came from a failed attempt"
            )
        return Outcome(
            request_id=job.request.request_id,
            status=OutcomeStatus.COMPLETED,
            num_prompt_tokens=num_prompt,
            num_output_tokens=num_output,
            num_cached_tokens=got.num_cached_tokens,
            num_preemptions=0,
            realized_mode=job.mode,
            arrival_s=job.arrival_s,
            first_scheduled_s=None,
            first_token_s=got.first_token_s,
            finish_s=job.attempts[-1].end_s,
            notes=tuple(notes),
            output_text=got.text,
            output_token_ids=got.token_ids,
            attempts=tuple(job.attempts),
        )
