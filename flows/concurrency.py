"""Waiting and branching that respect the lockstep gate.

`first_k` waits for k of n futures (any / k-of-n joins) and returns the chosen ones
deterministically: the wake-up is deferred to the next quiescent instant, when every op finishing
at this virtual time has finished, and ties among the done futures break by position.
`run_branches` runs composition branches on their own threads, each counted by the gate, copying
the caller's context so Prefect submissions inside them belong to the same flow run.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from contextvars import copy_context
from typing import Any, TypeVar

from prefect.futures import PrefectFuture

from maserve_prefect.taskrunner.harness import active_harness, current_harness
from maserve_prefect.taskrunner.runner import mark_participant

T = TypeVar("T")


def _done(f: PrefectFuture[Any]) -> bool:
    wrapped = getattr(f, "wrapped_future", None)
    return bool(wrapped.done()) if wrapped is not None else f.state.is_final()


def first_k(futures: Sequence[PrefectFuture[Any]], k: int) -> list[int]:
    """Block until at least `k` of `futures` are done; return the indices of the first k done.

    Deterministic under virtual time (see the module docstring).
    """
    if not 1 <= k <= len(futures):
        raise ValueError(f"first_k: need 1 <= k <= {len(futures)}, got {k}")
    h = active_harness() or current_harness()
    gate = h.gate
    lock = threading.Lock()
    state = {"count": 0, "scheduled": False}

    def register(wake: Callable[[], None]) -> None:
        def on_done(_: object) -> None:
            with lock:
                state["count"] += 1
                if state["count"] < k or state["scheduled"]:
                    return
                state["scheduled"] = True
            gate.defer((gate.now(), "~join"), wake)

        for f in futures:
            f.add_done_callback(on_done)

    if sum(_done(f) for f in futures) < k:
        gate.block(register, what=f"{k} of {len(futures)} branches")
    return [i for i, f in enumerate(futures) if _done(f)][:k]


def run_branches(fns: Sequence[Callable[[], T]]) -> list[T]:
    """Run each function on its own gate-counted thread; return their results in order."""
    if len(fns) == 1:
        return [fns[0]()]
    h = active_harness() or current_harness()
    gate = h.gate
    results: list[Any] = [None] * len(fns)
    errors: list[BaseException] = []
    remaining = {"n": len(fns)}
    lock = threading.Lock()
    finished: list[Callable[[], None]] = []

    def body(i: int, fn: Callable[[], T]) -> None:
        mark_participant(True)
        try:
            results[i] = fn()
        except BaseException as exc:  # re-raised in the caller
            errors.append(exc)
        finally:
            mark_participant(False)
            with lock:
                remaining["n"] -= 1
                last = remaining["n"] == 0
                wake = finished[0] if (last and finished) else None
            if wake is not None:
                wake()
            gate.leave()

    def register(wake: Callable[[], None]) -> None:
        with lock:
            if remaining["n"] == 0:
                wake()
            else:
                finished.append(wake)

    threads = []
    for i, fn in enumerate(fns):
        gate.admit()
        ctx = copy_context()
        th = threading.Thread(target=ctx.run, args=(body, i, fn), name=f"maserve-branch-{i}")
        threads.append(th)
        th.start()
    gate.block(register, what=f"{len(fns)} parallel branches")
    for th in threads:
        th.join()
    if errors:
        raise errors[0]
    return results
