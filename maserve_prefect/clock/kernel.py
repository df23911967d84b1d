"""The discrete-event kernel: a virtual clock over one event heap (SimPy's idea, with `async def`).

One ordering key decides everything: `(time, priority, seq)`, where `seq` comes from a counter held
by the kernel instance (never a class-level counter, so two runs in one process are identical).
Events at the same time fire by priority (`URGENT` < `NORMAL` < `LATE`), then in the order they
were scheduled. Time never goes backwards.

A callback that raises stops the run: `step()` re-raises it as `SimulationError` naming the event,
with the original exception as `__cause__`. Failures are never swallowed.

Coroutine processes run in virtual time: `kernel.process(coro)` drives an `async def` that awaits
kernel `Event`s (`await kernel.timeout(dt)`, `await kernel.sleep(dt)`, `await event`). An `Event`
also quacks like an asyncio future (`set_result`, `done`, `result`), so code written against the
`Clock` protocol (`clock.create_future()`) runs under either clock. An event that fails while
nobody waits on it stops the run (unless `defused`).

`run(until=t)` processes every event strictly before `t` and then sets the clock to `t` (SimPy's
convention: events at exactly `t` stay pending for the next call).

Examples:
    >>> k = Kernel()
    >>> log = []
    >>> _ = k.call_at(2.0, lambda: log.append(k.now()))
    >>> async def proc():
    ...     await k.sleep(1.0)
    ...     log.append(k.now())
    >>> _ = k.process(proc())
    >>> k.run()
    >>> log
    [1.0, 2.0]
"""

from __future__ import annotations

import heapq
import itertools
import math
from collections.abc import Callable, Coroutine, Generator
from typing import Any

from maserve_prefect.errors import SimulationError

URGENT = 0
NORMAL = 1
LATE = 2


class Handle:
    """A scheduled callback; `cancel()` keeps it from firing."""

    __slots__ = ("cancelled", "fn", "name", "priority", "time")

    def __init__(self, time: float, priority: int, fn: Callable[[], object], name: str) -> None:
        self.time = time
        self.priority = priority
        self.fn = fn
        self.name = name
        self.cancelled = False

    def cancel(self) -> None:
        """Keep the callback from running (a no-op once it ran)."""
        self.cancelled = True


class Kernel:
    """Virtual clock and event heap; implements the `Clock` protocol.

    Args:
        start_s: initial virtual time in seconds.
    """

    def __init__(self, start_s: float = 0.0) -> None:
        self._now = float(start_s)
        self._heap: list[tuple[float, int, int, Handle]] = []
        self._seq = itertools.count()

    def now(self) -> float:
        """Current virtual time (seconds)."""
        return self._now

    def call_at(
        self, t: float, fn: Callable[[], object], priority: int = NORMAL, name: str = ""
    ) -> Handle:
        """Schedule `fn()` at virtual time `t` (not earlier than now).

        Examples:
            >>> k = Kernel()
            >>> h = k.call_at(1.0, lambda: None, name="tick")
            >>> k.peek()
            1.0
        """
        if not t >= self._now:  # also rejects NaN
            raise SimulationError(
                f"event {name or fn!r} scheduled at t={t} before now={self._now}; "
                "schedule at or after kernel.now()"
            )
        handle = Handle(float(t), priority, fn, name)
        heapq.heappush(self._heap, (handle.time, priority, next(self._seq), handle))
        return handle

    def call_later(
        self, dt: float, fn: Callable[[], object], priority: int = NORMAL, name: str = ""
    ) -> Handle:
        """Schedule `fn()` after `dt` seconds of virtual time."""
        return self.call_at(self._now + dt, fn, priority, name)

    def peek(self) -> float:
        """Time of the next pending event, `inf` when none is pending."""
        heap = self._heap
        while heap and heap[0][3].cancelled:
            heapq.heappop(heap)
        return heap[0][0] if heap else math.inf

    def step(self) -> None:
        """Process the next event; raises `SimulationError` if its callback fails."""
        if self.peek() == math.inf:
            raise SimulationError("step() on an empty event heap; check peek() first")
        self._fire(*heapq.heappop(self._heap))

    def _fire(self, t: float, _priority: int, _seq: int, handle: Handle) -> None:
        assert t >= self._now, "time went backwards"
        self._now = t
        try:
            handle.fn()
        except SimulationError:
            raise
        except Exception as exc:
            raise SimulationError(
                f"event {handle.name or handle.fn!r} at t={t:.9g} failed: {exc!r}"
            ) from exc

    def run(self, until: float | None = None) -> None:
        """Process events until the heap is empty, or all events strictly before `until`."""
        if until is not None and until < self._now:
            raise SimulationError(f"run(until={until}) is before now={self._now}")
        end = math.inf if until is None else until
        heap, pop, fire = self._heap, heapq.heappop, self._fire
        while heap:  # `peek` then `step`, inlined: this loop runs once per event
            entry = heap[0]
            if entry[3].cancelled:
                pop(heap)
            elif entry[0] < end:
                fire(*pop(heap))
            else:
                break
        if until is not None:
            self._now = float(until)

    # -- awaitables -------------------------------------------------------------------------

    def event(self) -> Event:
        """A new untriggered event (a future in virtual time)."""
        return Event(self)

    def create_future(self) -> Event:
        """`Clock` protocol: a future resolved with `set_result` (an `Event` here)."""
        return Event(self)

    def timeout(self, dt: float, value: object = None) -> Event:
        """An event that succeeds with `value` after `dt` seconds."""
        if dt < 0:
            raise SimulationError(f"timeout({dt}) is negative")
        ev = Event(self)
        ev._triggered = True
        ev._value = value
        self.call_at(self._now + dt, ev._process, NORMAL, "timeout")
        return ev

    async def sleep(self, dt: float) -> None:
        """Suspend the calling process for `dt` seconds of virtual time."""
        await self.timeout(dt)

    def process(self, coro: Coroutine[Any, Any, Any]) -> Process:
        """Start `coro` as a process at the current time; the returned event holds its result."""
        return Process(self, coro)


class Event:
    """Something that happens once in virtual time; awaitable from kernel processes."""

    __slots__ = (
        "_callbacks",
        "_exc",
        "_processed",
        "_triggered",
        "_value",
        "defused",
        "kernel",
    )

    def __init__(self, kernel: Kernel) -> None:
        self.kernel = kernel
        self._callbacks: list[Callable[[Event], None]] = []
        self._value: Any = None
        self._exc: BaseException | None = None
        self._triggered = False
        self._processed = False
        self.defused = False

    @property
    def triggered(self) -> bool:
        return self._triggered

    @property
    def processed(self) -> bool:
        return self._processed

    def succeed(self, value: object = None) -> Event:
        """Trigger with `value`; waiters resume at the current time."""
        self._trigger(value, None)
        return self

    def fail(self, exc: BaseException) -> Event:
        """Trigger with an exception; it stops the run unless someone waits or it is defused."""
        self._trigger(None, exc)
        return self

    def _trigger(self, value: object, exc: BaseException | None) -> None:
        if self._triggered:
            raise SimulationError(f"{self!r} was already triggered")
        self._triggered = True
        self._value = value
        self._exc = exc
        self.kernel.call_at(self.kernel.now(), self._process, NORMAL, type(self).__name__)

    def _process(self) -> None:
        self._processed = True
        callbacks, self._callbacks = self._callbacks, []
        for cb in callbacks:
            cb(self)
        if self._exc is not None and not callbacks and not self.defused:
            raise self._exc

    def add_callback(self, cb: Callable[[Event], None]) -> None:
        """Call `cb(event)` when processed (at once, synchronously, if it already was)."""
        if self._processed:
            cb(self)
        else:
            self._callbacks.append(cb)

    # asyncio-future-like surface (so `Clock.create_future()` works on both clocks)
    def set_result(self, value: object) -> None:
        self.succeed(value)

    def set_exception(self, exc: BaseException) -> None:
        self.fail(exc)

    def done(self) -> bool:
        return self._processed

    def result(self) -> Any:
        if not self._processed:
            raise SimulationError("result() of an event that has not happened yet")
        if self._exc is not None:
            raise self._exc
        return self._value

    def __await__(self) -> Generator[Event, None, Any]:
        if not self._processed:
            yield self
        return self.result()


class Process(Event):
    """Drives a coroutine that awaits kernel events; succeeds with its return value."""

    __slots__ = ("_coro",)

    def __init__(self, kernel: Kernel, coro: Coroutine[Any, Any, Any]) -> None:
        super().__init__(kernel)
        self._coro = coro
        kernel.call_at(kernel.now(), lambda: self._resume(None), URGENT, "process-start")

    def _resume(self, event: Event | None) -> None:
        try:
            if event is not None and event._exc is not None:
                target = self._coro.throw(event._exc)
            else:
                target = self._coro.send(None if event is None else event._value)
        except StopIteration as stop:
            self.succeed(stop.value)
            return
        except Exception as exc:
            self.fail(exc)
            return
        if not isinstance(target, Event) or target.kernel is not self.kernel:
            self._coro.close()
            raise SimulationError(
                f"a kernel process awaited {target!r}; await kernel events only "
                "(kernel.timeout, kernel.sleep, kernel.event, tickets via clock.create_future)"
            )
        target.add_callback(self._resume)
