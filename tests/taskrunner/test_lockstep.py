"""Lockstep gate: virtual time advances only at quiescence; deferred actions run in key order."""

from __future__ import annotations

import random
import threading
import time

import pytest

from maserve_prefect.clock.kernel import Kernel
from maserve_prefect.errors import SimulationError
from maserve_prefect.taskrunner.lockstep import VirtualGate


def _spawn(gate: VirtualGate, fn, *args) -> threading.Thread:  # type: ignore[no-untyped-def]
    gate.admit()

    def body() -> None:
        try:
            fn(*args)
        finally:
            gate.leave()

    th = threading.Thread(target=body)
    th.start()
    return th


def test_time_does_not_advance_while_a_participant_computes() -> None:
    gate = VirtualGate(Kernel())
    log: list[tuple[str, float]] = []

    def slow() -> None:
        # Real work takes wall time; virtual time must stay frozen meanwhile.
        deadline = time.monotonic() + 0.05
        while time.monotonic() < deadline:
            pass
        log.append(("slow-done", gate.now()))

    def sleeper() -> None:
        gate.sleep(1.0, what="sleeper")
        log.append(("sleeper-woke", gate.now()))

    with gate:
        gate.admit()  # the launcher counts until both are started
        threads = [_spawn(gate, sleeper), _spawn(gate, slow)]
        gate.leave()
        for th in threads:
            th.join()
    assert ("slow-done", 0.0) in log
    assert ("sleeper-woke", 1.0) in log


def test_deferred_actions_run_sorted_regardless_of_thread_timing() -> None:
    for trial in range(5):
        gate = VirtualGate(Kernel())
        order: list[str] = []
        rng = random.Random(trial)

        def worker(
            name: str, jitter: float, gate: VirtualGate = gate, order: list[str] = order
        ) -> None:
            time.sleep(jitter)
            gate.defer(name, lambda: order.append(name))
            gate.sleep(0.5, what=name)

        with gate:
            names = [f"op{i}" for i in range(6)]
            gate.admit()
            threads = [_spawn(gate, worker, n, rng.random() * 0.01) for n in reversed(names)]
            gate.leave()
            for th in threads:
                th.join()
        assert order == sorted(names)
        assert gate.now() == 0.5


def test_chain_of_handoffs_keeps_counts_exact() -> None:
    gate = VirtualGate(Kernel())
    seen: list[float] = []

    def stage(n: int) -> None:
        gate.sleep(1.0, what=f"stage{n}")
        seen.append(gate.now())
        if n < 4:
            _spawn(gate, stage, n + 1)  # admitted before this participant leaves

    with gate:
        _spawn(gate, stage, 0).join()
        while len(seen) < 5:
            gate.admit()
            gate.sleep(0.25, what="observer")
            gate.leave()
    assert seen == [1.0, 2.0, 3.0, 4.0, 5.0]


def test_deadlock_fails_waiters_with_a_named_error() -> None:
    gate = VirtualGate(Kernel())
    errors: list[BaseException] = []

    def stuck() -> None:
        try:
            gate.block(lambda wake: None, what="op r0/s1/0 outcome")
        except SimulationError as exc:
            errors.append(exc)

    with pytest.raises(SimulationError, match=r"deadlock.*op r0/s1/0 outcome"):
        with gate:
            _spawn(gate, stuck).join()
    assert errors and "deadlock" in str(errors[0])


def test_failed_event_stops_the_run_with_its_cause() -> None:
    gate = VirtualGate(Kernel())

    def boom() -> None:
        raise RuntimeError("engine exploded")

    def waiter() -> None:
        with gate.locked():
            gate.kernel.call_later(1.0, boom, name="step")
        with pytest.raises(SimulationError):
            gate.sleep(2.0, what="waiter")

    with pytest.raises(SimulationError) as info:
        with gate:
            _spawn(gate, waiter).join()
    assert "engine exploded" in repr(info.value) + repr(info.value.__cause__)
