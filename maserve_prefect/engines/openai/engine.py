"""`OpenAIEngine`: the `Replica` protocol over any OpenAI-compatible server (vLLM first).

The one idea: `submit` never waits on the network. It decides acceptance at once (deployment,
controls, prompt form, context length), hands the request to an asyncio loop that the engine runs
in its own daemon thread, and returns the `Ticket`. The loop streams the call on one persistent
`httpx` client whose pooled connections are opened when the engine starts (at most
`max_concurrency` at a time; the body is encoded at submission; one attempt is
`stream.stream_attempt`), retries 5xx answers, connection errors and timeouts by its `RetryPolicy`
(`retry.py`) — a retry after a partial stream restarts the request — and resolves the ticket
through `deliver`, which moves the callbacks onto the caller's regime (e.g.
`lambda fn: gate.defer(None, fn)` runs them under the `WallGate` lock).

Times: every time in an `Outcome` (arrival = submit time, first token, finish, each `Attempt`'s
start and end) is on the caller's clock `now`; an attempt starts when its request is handed to the
connection pool, built and encoded (the send: what TTFT counts from, as a load generator's does) (default: monotonic seconds since construction).
`first_scheduled_s` is None: HTTP does not show when the server first scheduled a request. The
ticket's first-token callback fires once, at the first token of any attempt; the outcome's
`first_token_s` belongs to the attempt whose output it reports (a note says when they differ).

Callbacks run under the engine's callback lock (inside `deliver`); `wait` registers under the same
lock, so registering after `submit` from another thread cannot miss an outcome. Do not call
`close()` from a ticket callback, nor while holding the lock your `deliver` takes: close waits for
the loop to resolve every in-flight ticket as ABORTED.

State: `lifecycle` is READY, UNREACHABLE (discovery failed or the last attempt could not
connect) or STOPPED (closed). Queue counts are this engine's own in-flight requests (running =
holding a concurrency slot) unless a `state_source` supplies vLLM's gauges by Prometheus name
(`vllm:num_requests_running`, `vllm:num_requests_waiting`, `vllm:kv_cache_usage_perc`); block
fields are 0 (HTTP does not show blocks).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import threading
import time
from collections.abc import Callable, Mapping, Sequence

import httpx

from maserve_prefect.engines.openai.discovery import ServerInfo, discover, normalize_base_url
from maserve_prefect.engines.openai.prompts import (
    DEFAULT_VOCAB_SIZE,
    CallSpec,
    ServerFeatures,
    build_call,
    resolve_controls,
    synth_token_ids,
)
from maserve_prefect.engines.openai.retry import RetryPolicy, classify_error
from maserve_prefect.engines.openai.stream import (
    Job,
    completed_outcome,
    ended_outcome,
    request_body,
    stream_attempt,
)
from maserve_prefect.errors import ConfigError, EngineError, UnsupportedError
from maserve_prefect.protocol.capabilities import Capabilities, HearCapabilities
from maserve_prefect.protocol.controls import Control, ExecutionMode, Force, Priority
from maserve_prefect.protocol.force import Dropped, Resolution, Unsatisfied, resolve
from maserve_prefect.protocol.intents import Intent
from maserve_prefect.protocol.outcomes import Acceptance, Attempt, Outcome, OutcomeStatus, Ticket
from maserve_prefect.protocol.requests import Request
from maserve_prefect.protocol.state import EngineState, Lifecycle

__all__ = ["OpenAIEngine"]

log = logging.getLogger(__name__)

Deliver = Callable[[Callable[[], None]], None]


class OpenAIEngine:
    """A `Replica` over one OpenAI-compatible endpoint (see the module docstring).

    Args:
        base_url: the server root, with or without `/v1`.
        model: the server's model id; None picks the only one it serves.
        name: replica name in records and messages.
        deployment: the deployment it serves (requests for another are REJECTED); None uses
            the model id.
        api_key: bearer token (vLLM ignores it unless started with `--api-key`).
        headers: extra request headers (`EngineTarget.auth_headers`: basic auth replaces the
            bearer token).
        max_concurrency: requests streaming at once; the rest wait in this engine.
        request_timeout_s: limit on one attempt, first byte to last.
        discovery_timeout_s: the time budget of server discovery, all its calls together (a
            replay passes its arm's timeout).
        retry: the retry policy.
        deliver: runs ticket callbacks on the caller's regime; None runs them on the loop thread.
        now: the caller's clock (seconds); default monotonic seconds since construction.
        vocab_size: bound for synthesized prompt ids (servers do not report the vocabulary).
        state_source: latest vLLM gauge values by Prometheus name, for `state()`.
        server_info: skip discovery and use these facts.
        kv_events_endpoint: the server's KV-event publisher, if subscribed elsewhere.
        warm_connections: pooled connections opened when the engine starts (0: none).

    Raises:
        ConfigError: bad bounds or URL.

    Examples:
        >>> eng = OpenAIEngine("http://127.0.0.1:9/v1", model="m")
        >>> eng.state().lifecycle.label, eng.deployment
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
        headers: Mapping[str, str] | None = None,
        max_concurrency: int = 64,
        request_timeout_s: float = 600.0,
        retry: RetryPolicy | None = None,
        deliver: Deliver | None = None,
        now: Callable[[], float] | None = None,
        vocab_size: int = DEFAULT_VOCAB_SIZE,
        state_source: Callable[[], Mapping[str, float]] | None = None,
        server_info: ServerInfo | None = None,
        kv_events_endpoint: str | None = None,
        discovery_timeout_s: float = 30.0,
        warm_connections: int = 4,
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
        self._api_key = api_key  # private: never in a repr, a record or a log line
        self._headers = dict(headers or {})
        self.max_concurrency = max_concurrency
        self.request_timeout_s = request_timeout_s
        self.discovery_timeout_s = discovery_timeout_s
        self.retry = retry if retry is not None else RetryPolicy()
        self.vocab_size = vocab_size
        self.state_source = state_source
        self.kv_events_endpoint = kv_events_endpoint
        self.warm_connections = warm_connections
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
        self._http: httpx.AsyncClient | None = None
        self._warming: asyncio.Task[None] | None = None
        self._sem: asyncio.Semaphore | None = None
        self._jobs: dict[str, Job] = {}
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
                        api_key=self._api_key,
                        headers=self._headers,
                        kv_events_endpoint=self.kv_events_endpoint,
                        timeout_s=self.discovery_timeout_s,
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
            self._warm_code()
            self._http = self._new_http(info)
            self._sem = asyncio.Semaphore(self.max_concurrency)
            self._loop, self._loop_thread = loop, threading.current_thread()
            self._warming = loop.create_task(self._warm())
        return self

    async def warmed(self) -> None:
        """Wait until the pooled connections an attached engine opens are open (at once for a
        started one, which opens them in `start`); a timed run awaits this before its first
        request so the first requests do not queue behind the warm-up."""
        warming = self._warming
        if warming is not None and not warming.done():
            await asyncio.shield(warming)

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
        self._warm_code()
        self._http = self._new_http(info)
        self._sem = asyncio.Semaphore(self.max_concurrency)
        await self._warm()

    def _new_http(self, info: ServerInfo) -> httpx.AsyncClient:
        """The persistent client every call goes through: one kept-alive connection per
        concurrency slot, no per-request setup."""
        headers = {"Authorization": f"Bearer {self._api_key}"} | self._headers
        return httpx.AsyncClient(
            base_url=f"{info.base_url}/v1/",
            headers=headers,
            timeout=self.request_timeout_s,
            limits=httpx.Limits(
                max_connections=self.max_concurrency,
                max_keepalive_connections=self.max_concurrency,
                keepalive_expiry=None,
            ),
        )

    def _warm_code(self) -> None:
        """Run the submission path's first-use work once (numpy's generator set-up costs ~10 ms
        on its first call), so that no timed request pays for it."""
        synth_token_ids(2, (0,), 1, self.vocab_size, salt="warm-up")
        request_body(CallSpec("completions", {"prompt": [1]}, {}))

    async def _warm(self) -> None:
        """Open `warm_connections` pooled connections before the first call (one `GET
        /v1/models` each, which no server counts as a request), so the first calls do not pay
        for a connect; a failure here is left to the calls themselves to report."""
        if self._http is None or self.warm_connections < 1:
            return
        n = min(self.warm_connections, self.max_concurrency)
        await asyncio.gather(*(self._http.get("models") for _ in range(n)), return_exceptions=True)

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
            self._finish(
                job,
                ended_outcome(job, OutcomeStatus.ABORTED, "aborted: engine closed", self._now()),
            )
        warming = self._warming
        if warming is not None and not warming.done():
            warming.cancel()
            await asyncio.gather(warming, return_exceptions=True)
        if self._http is not None:
            await self._http.aclose()

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
            max_model_len=info.max_model_len,  # outputs drawn by a content model are capped to it
        )

    def hear_capabilities(self) -> HearCapabilities:
        """HEAR's view of the server: priority (when it schedules by priority) and its modes
        for a submission; no cache controls (vLLM's OpenAI server has no retain, prepare or
        release); residency on the GPU tier through its KV events."""
        return HearCapabilities.from_engine(self.capabilities(), cache_controls=())

    def control(self, controls: Sequence[Control]) -> Resolution:
        """Controls outside a submission, answered by HEAR's force rules and applied never: the
        server has no cache controls, and priority and mode apply to one request (send them
        with `submit`). A required one is unsatisfied (the answer is UNSUPPORTED, naming it); a
        preferred one is dropped with its reason.

        Examples:
            >>> from maserve_prefect.protocol.force import resolve
            >>> from maserve_prefect.protocol.capabilities import Capabilities
            >>> from maserve_prefect.protocol.controls import Force
            >>> from maserve_prefect.protocol.controls import CacheRetain
            >>> from maserve_prefect.protocol.subjects import ContextRef
            >>> keep = CacheRetain(ContextRef("s"), (1,), 0.5, force=Force.REQUIREMENT)
            >>> caps = Capabilities((ExecutionMode,), True, True, False, True, True, (),
            ...                     ("default",))
            >>> resolve([keep], caps).acceptance.value  # what `control` answers for vLLM
            'unsupported'
        """
        res = resolve(controls, self.hear_capabilities())
        unsatisfied, dropped = list(res.unsatisfied), list(res.dropped)
        for c in res.honoured:  # only request-scoped controls can be honoured here
            why = "it applies to one request; send it with submit()"
            if c.force is Force.REQUIREMENT:
                unsatisfied.append(Unsatisfied(c, why))
            else:
                dropped.append(Dropped(c, why))
        return Resolution((), (), tuple(dropped), tuple(unsatisfied))

    def update(self, request_id: str, controls: Sequence[Control]) -> Resolution:
        """HEAR's subsequent update of a submitted request (a refreshed priority, a waiting
        requirement sent later): applied never — vLLM's OpenAI server fixes a request's priority
        when it arrives and has no call to change it. A required control is unsatisfied (the
        answer is UNSUPPORTED, naming it), a preferred one dropped with the reason.
        """
        why = f"{self.name} cannot change request {request_id!r} after submission (send it with submit())"
        return Resolution(
            (),
            (),
            tuple(Dropped(c, why) for c in controls if c.force is Force.PREFERENCE),
            tuple(Unsatisfied(c, why) for c in controls if c.force is not Force.PREFERENCE),
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
            choice = resolve_controls(request, controls, capabilities=caps, where=self.name)
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
        job = Job(request, spec, ticket, notes, choice.mode, arrival_s, body=request_body(spec))
        with self._lock:
            if self._closed:
                return Ticket(rid, Acceptance.REJECTED, f"{self.name} is closed")
            if rid in self._jobs:
                return Ticket(rid, Acceptance.REJECTED, f"request id {rid!r} is already in flight")
            self._jobs[rid] = job
            self._counters["num_submitted"] += 1
            assert self._loop is not None
            if self._loop_thread is not None and threading.current_thread() is self._loop_thread:
                self._spawn(job)  # attached, on the loop: no wake-up through the self-pipe
            else:
                self._loop.call_soon_threadsafe(self._spawn, job)  # before any close() shutdown
        return ticket

    def inform(self, intent: Intent) -> None:
        """Record an intent; it never changes what the engine does."""
        with self._lock:
            self.intents.append(intent)

    @property
    def lifecycle(self) -> Lifecycle:
        """STOPPED once closed, UNREACHABLE while the server cannot be reached, else READY."""
        if self._closed:
            return Lifecycle.STOPPED
        return Lifecycle.UNREACHABLE if self._unreachable else Lifecycle.READY

    def state(self) -> EngineState:
        """A snapshot (no HTTP): lifecycle, queue counts, KV usage from `state_source`."""
        with self._lock:
            lifecycle = self.lifecycle
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

    def _spawn(self, job: Job) -> None:
        task = asyncio.get_running_loop().create_task(self._serve(job))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _finish(self, job: Job, outcome: Outcome) -> None:
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

    async def _serve(self, job: Job) -> None:
        try:
            outcome = await self._attempts(job)
        except asyncio.CancelledError:
            self._finish(
                job,
                ended_outcome(job, OutcomeStatus.ABORTED, "aborted: engine closed", self._now()),
            )
            raise
        except Exception as exc:  # a bug here must still resolve the ticket, loudly
            log.exception("%s: request %s crashed", self.name, job.request.request_id)
            outcome = ended_outcome(
                job, OutcomeStatus.FAILED, f"internal error: {exc!r}", self._now()
            )
        self._finish(job, outcome)

    async def _attempts(self, job: Job) -> Outcome:
        assert self._sem is not None and self._http is not None
        for number in range(1, self.retry.max_attempts + 1):
            async with self._sem:
                job.running = True
                sent = [self._now()]  # replaced by the send stamp once the request goes out

                def on_sent(t_s: float, box: list[float] = sent) -> None:
                    box[0] = t_s

                try:
                    got = await asyncio.wait_for(
                        stream_attempt(
                            self._http,
                            job,
                            self._now,
                            lambda t_s: self._first_token(job, t_s),
                            on_sent,
                        ),
                        self.request_timeout_s,
                    )
                except asyncio.CancelledError:
                    job.attempts.append(Attempt(number, sent[0], self._now(), "aborted"))
                    raise
                except Exception as exc:
                    fail = classify_error(exc)
                    job.attempts.append(
                        Attempt(
                            number, sent[0], self._now(), fail.message, fail.status_code, fail.kind
                        )
                    )
                    self._unreachable = fail.kind == "connection"
                else:
                    job.attempts.append(Attempt(number, sent[0], self._now()))
                    self._unreachable = False
                    return completed_outcome(job, got)
                finally:
                    job.running = False
            if fail.kind not in self.retry.retry_on or number == self.retry.max_attempts:
                break
            await asyncio.sleep(self.retry.delay_s(number))
        return ended_outcome(
            job, OutcomeStatus.FAILED, f"after {number} attempt(s): {fail.message}", self._now()
        )

    def _first_token(self, job: Job, t_s: float) -> None:
        if job.first_token_s is None:
            job.first_token_s = t_s
            self._deliver(lambda: job.ticket.resolve_first_token(t_s))
