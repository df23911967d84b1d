"""Lockstep: run real threads (Prefect flows and tasks) against the virtual clock, deterministically.

The one idea: virtual time may advance only when the harness is quiescent — every participant
(a flow thread, a running op) is either finished or blocked on something only the clock can
resolve (an engine outcome, a tool's virtual duration, a future of an op that has not finished).
A single clock thread waits for that moment, then (1) runs the actions participants deferred to
this instant in a deterministic order (sorted by key, e.g. op id), and (2) steps the kernel one
event at a time until some participant wakes. Threads never touch the kernel except under the
gate's lock, and never while the clock thread is stepping.

Counting rules (they make a "false quiescence" impossible):
- a participant is counted *before* it starts (`admit`), and uncounted when it ends (`leave`);
- a thread that blocks registers its wake-up first, then uncounts itself; the wake-up recounts it
  before setting its event, so a wake that races the block nets to zero;
- work handed from one participant to another (an op finishing releases its successors) is
  admitted by the giver before the giver leaves.

If every participant is blocked and the kernel has no event left, the run is deadlocked: the gate
fails every waiter with a `SimulationError` listing what each was waiting for, instead of hanging.

Examples:
    >>> from maserve_prefect.clock.kernel import Kernel
    >>> import threading
    >>> gate = VirtualGate(Kernel())
    >>> seen = []
    >>> def worker(name, dt):
    ...     gate.sleep(dt, what=name)
    ...     seen.append((name, gate.now()))
    ...     gate.leave()
    >>> with gate:
    ...     gate.admit()                      # the launcher is a participant while it launches
    ...     threads = []
    ...     for name, dt in (("b", 2.0), ("a", 1.0)):
    ...         gate.admit()
    ...         threads.append(threading.Thread(target=worker, args=(name, dt)))
    ...         threads[-1].start()
    ...     gate.leave()
    ...     for t in threads:
    ...         t.join()
    >>> seen
    [('a', 1.0), ('b', 2.0)]
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from types import TracebackType
from typing import Any, Protocol

from maserve_prefect.clock.kernel import Kernel
from maserve_prefect.errors import SimulationError

Wake = Callable[[], None]


class Gate(Protocol):
    """What the runner, ops and dispatcher need from a clock regime (virtual or wall)."""

    def now(self) -> float: ...

    def admit(self) -> None: ...

    def leave(self) -> None: ...

    def block(self, register: Callable[[Wake], object], what: str) -> None: ...

    def sleep(self, dt: float, what: str = "sleep") -> None: ...

    def defer(self, key: Any, fn: Callable[[], None]) -> None: ...

    def locked(self) -> threading.RLock: ...


class VirtualGate:
    """Lockstep gate over a `Kernel` (see the module docstring).

    Use as a context manager: entering starts the clock thread, leaving stops it.

    Args:
        kernel: the virtual clock; only the gate's clock thread steps it.
    """

    def __init__(self, kernel: Kernel) -> None:
        self.kernel = kernel
        self._lock = threading.RLock()
        self._cond = threading.Condition(self._lock)
        self._active = 0
        self._blocked: dict[int, tuple[str, threading.Event, list[BaseException]]] = {}
        self._next_waiter = 0
        self._deferred: list[tuple[Any, int, Callable[[], None]]] = []
        self._deferred_seq = 0
        self._closed = False
        self._error: BaseException | None = None
        self._thread: threading.Thread | None = None

    # -- lifecycle -------------------------------------------------------------------------

    def __enter__(self) -> VirtualGate:
        self._thread = threading.Thread(target=self._run_clock, name="maserve-clock", daemon=True)
        self._thread.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        if self._thread is not None:
            self._thread.join()
        if self._error is not None and exc is None:
            raise self._error

    @property
    def error(self) -> BaseException | None:
        """The failure that stopped the clock, if any."""
        return self._error

    # -- participant API -------------------------------------------------------------------

    def now(self) -> float:
        """Current virtual time."""
        return self.kernel.now()

    def locked(self) -> threading.RLock:
        """The lock under which participants may touch the kernel or engines directly."""
        return self._lock

    def admit(self) -> None:
        """Count a participant that is about to run (call before starting its thread)."""
        with self._cond:
            self._active += 1

    def leave(self) -> None:
        """Uncount a participant that has finished."""
        with self._cond:
            self._active -= 1
            assert self._active >= 0, "lockstep: more leaves than admits"
            if self._active == 0:
                self._cond.notify_all()

    def block(self, register: Callable[[Wake], object], what: str) -> None:
        """Block the calling participant until the callback given to `register` is called.

        `register(wake)` is called under the gate's lock; it typically schedules `wake` on the
        kernel or hangs it on an engine ticket. Raises `SimulationError` if the run fails or
        deadlocks while waiting.
        """
        event = threading.Event()
        errors: list[BaseException] = []
        with self._cond:
            if self._error is not None:
                raise SimulationError(
                    f"run already failed while starting to wait for {what}"
                ) from self._error
            waiter = self._next_waiter
            self._next_waiter += 1
            self._blocked[waiter] = (what, event, errors)
            fired = False

            def wake() -> None:
                nonlocal fired
                with self._cond:
                    if fired:
                        return
                    fired = True
                    self._blocked.pop(waiter, None)
                    self._active += 1
                    event.set()

            register(wake)
            self._active -= 1
            assert self._active >= 0, "lockstep: block() called by an uncounted thread"
            if self._active == 0:
                self._cond.notify_all()
        event.wait()
        if errors:
            raise SimulationError(f"while waiting for {what}: {errors[0]}") from errors[0]

    def sleep(self, dt: float, what: str = "sleep") -> None:
        """Block for `dt` virtual seconds."""
        self.block(lambda wake: self.kernel.call_later(max(dt, 0.0), wake, name=what), what)

    def defer(self, key: Any, fn: Callable[[], None]) -> None:
        """Run `fn` at the next quiescent instant, after earlier-keyed deferred actions.

        Deferred actions of one instant run sorted by `key` (then by deferral order), so the
        order in which racing threads deferred them never matters.
        """
        with self._cond:
            self._deferred.append((key, self._deferred_seq, fn))
            self._deferred_seq += 1

    # -- the clock thread ------------------------------------------------------------------

    def _run_clock(self) -> None:
        with self._cond:
            while True:
                while self._active > 0 and not self._closed:
                    self._cond.wait()
                if self._closed:
                    return
                try:
                    if self._deferred:
                        batch = sorted(self._deferred, key=lambda d: (d[0], d[1]))
                        self._deferred.clear()
                        for _, _, fn in batch:
                            fn()
                        continue
                    if self.kernel.peek() != float("inf"):
                        self.kernel.step()
                        continue
                except BaseException as exc:  # a failed event stops the run with its cause
                    self._fail(exc)
                    return
                if self._blocked:
                    waits = sorted(what for what, _, _ in self._blocked.values())
                    self._fail(
                        SimulationError(
                            f"deadlock at t={self.kernel.now():.6f}s: every participant is "
                            f"blocked and no event is pending; waiting for: {', '.join(waits[:10])}"
                            + (f" (+{len(waits) - 10} more)" if len(waits) > 10 else "")
                        )
                    )
                    return
                self._cond.wait()

    def _fail(self, exc: BaseException) -> None:
        self._error = exc
        for _, event, errors in self._blocked.values():
            errors.append(exc)
            self._active += 1  # the released waiter runs again (to handle the error) and leaves
            event.set()
        self._blocked.clear()
