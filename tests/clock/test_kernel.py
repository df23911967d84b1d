"""The event kernel: one ordering key, failures stop the run, coroutine processes."""

from __future__ import annotations

import math

import pytest

from maserve_prefect.clock import VirtualClock
from maserve_prefect.clock.kernel import LATE, NORMAL, URGENT, Event, Kernel
from maserve_prefect.errors import SimulationError


def test_same_time_events_fire_in_schedule_order_and_priority_breaks_ties_first() -> None:
    k = Kernel()
    log: list[str] = []
    k.call_at(1.0, lambda: log.append("n1"), NORMAL)
    k.call_at(1.0, lambda: log.append("late"), LATE)
    k.call_at(1.0, lambda: log.append("n2"), NORMAL)
    k.call_at(1.0, lambda: log.append("urgent"), URGENT)
    k.call_at(0.5, lambda: log.append("early"), LATE)
    k.run()
    assert log == ["early", "urgent", "n1", "n2", "late"]
    assert k.now() == 1.0


def test_peek_step_and_cancel() -> None:
    k = Kernel()
    assert k.peek() == math.inf
    log: list[float] = []
    h = k.call_at(2.0, lambda: log.append(2.0))
    k.call_later(3.0, lambda: log.append(k.now()))
    assert k.peek() == 2.0
    h.cancel()
    assert k.peek() == 3.0
    k.step()
    assert log == [3.0]
    with pytest.raises(SimulationError, match="empty"):
        k.step()


def test_run_until_excludes_events_at_until_and_sets_the_clock() -> None:
    k = Kernel()
    log: list[float] = []
    for t in (1.0, 2.0, 3.0):
        k.call_at(t, lambda t=t: log.append(t))
    k.run(until=2.0)
    assert log == [1.0] and k.now() == 2.0
    k.run()
    assert log == [1.0, 2.0, 3.0]
    with pytest.raises(SimulationError):
        k.run(until=1.0)


def test_scheduling_in_the_past_is_refused() -> None:
    k = Kernel(start_s=5.0)
    with pytest.raises(SimulationError, match="before now"):
        k.call_at(4.0, lambda: None, name="late-bird")


def test_a_failing_callback_stops_the_run_with_its_cause_and_name() -> None:
    k = Kernel()
    ran: list[int] = []

    def boom() -> None:
        raise KeyError("x")

    k.call_at(1.0, boom, name="boom-event")
    k.call_at(2.0, lambda: ran.append(1))
    with pytest.raises(SimulationError, match="boom-event") as info:
        k.run()
    assert isinstance(info.value.__cause__, KeyError)
    assert ran == [] and k.now() == 1.0


def test_counters_are_per_kernel() -> None:
    def trace(k: Kernel) -> list[str]:
        log: list[str] = []
        for name in "abc":
            k.call_at(1.0, lambda name=name: log.append(name))
        k.run()
        return log

    k1, k2 = Kernel(), Kernel()
    k1.call_at(0.0, lambda: None)  # advance k1's counter only
    assert trace(k1) == trace(k2) == ["a", "b", "c"]


def test_processes_sleep_and_await_events_in_virtual_time() -> None:
    k = VirtualClock()
    log: list[tuple[str, float]] = []
    gate = k.event()

    async def waiter() -> str:
        value = await gate
        log.append((f"got {value}", k.now()))
        return "done"

    async def opener() -> None:
        await k.sleep(1.5)
        log.append(("open", k.now()))
        gate.succeed("key")

    w = k.process(waiter())
    k.process(opener())
    k.run()
    assert log == [("open", 1.5), ("got key", 1.5)]
    assert w.result() == "done"


def test_a_process_can_await_another_and_receive_its_failure() -> None:
    k = Kernel()

    async def failing() -> None:
        await k.timeout(1.0)
        raise ValueError("bad")

    async def parent() -> str:
        try:
            await k.process(failing())
        except ValueError as exc:
            return f"caught {exc} at {k.now()}"
        return "no"

    p = k.process(parent())
    k.run()
    assert p.result() == "caught bad at 1.0"


def test_an_unawaited_failure_stops_the_run() -> None:
    k = Kernel()

    async def failing() -> None:
        await k.timeout(1.0)
        raise ValueError("nobody listens")

    k.process(failing())
    with pytest.raises(SimulationError) as info:
        k.run()
    assert isinstance(info.value.__cause__, ValueError)


def test_a_defused_failure_does_not_stop_the_run() -> None:
    k = Kernel()
    ev = Event(k)
    ev.defused = True
    ev.fail(RuntimeError("ignored"))
    k.run()
    assert ev.done()


def test_awaiting_a_non_kernel_object_is_an_error() -> None:
    k = Kernel()

    class Foreign:
        def __await__(self):  # type: ignore[no-untyped-def]
            yield "not an event"

    async def proc() -> None:
        await Foreign()

    k.process(proc())
    with pytest.raises(SimulationError, match="kernel events only"):
        k.run()


def test_events_trigger_once() -> None:
    k = Kernel()
    ev = k.event().succeed(1)
    with pytest.raises(SimulationError, match="already"):
        ev.succeed(2)
    with pytest.raises(SimulationError, match="not happened"):
        ev.result()
    k.run()
    assert ev.result() == 1
