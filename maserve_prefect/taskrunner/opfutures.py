"""Futures of ops submitted to `MAServeTaskRunner`, and which threads the lockstep gate counts.

The one idea: a flow thread or a running op that waits on an op's future must wait *through the
gate* (`Gate.block`), so that under virtual time the clock knows it is blocked and may advance; a
thread the gate does not count waits directly. Also here: reading a done Prefect future's final
state from its wrapped (concurrent or distributed) future, without a round trip to the API.
"""

from __future__ import annotations

import concurrent.futures
import threading
import uuid
from typing import Any

from prefect.client.schemas.objects import State
from prefect.futures import PrefectConcurrentFuture, PrefectFuture
from prefect.states import Failed

_participant = threading.local()


def is_participant() -> bool:
    return bool(getattr(_participant, "on", False))


def mark_participant(on: bool) -> None:
    """Declare that the calling thread is (or no longer is) counted by the gate.

    A driver that admits a root's thread before starting it calls `mark_participant(True)` in
    that thread, so the runner does not count it twice.
    """
    _participant.on = on


class MAServeFuture(PrefectConcurrentFuture[Any]):
    """A Prefect future whose waits go through the lockstep gate."""

    def __init__(
        self,
        task_run_id: uuid.UUID,
        wrapped: concurrent.futures.Future[Any],
        runner: Any,
        op_id: str,
    ) -> None:
        super().__init__(task_run_id=task_run_id, wrapped_future=wrapped)
        self._runner = runner
        self.op_id = op_id
        self._node: Any = None  # the runner's node for this op

    def _gate_wait(self) -> None:
        fut = self._wrapped_future
        harness = self._runner._harness
        if fut.done() or harness is None or not is_participant():
            return
        harness.gate.block(
            lambda wake: fut.add_done_callback(lambda _: wake()), what=f"future of {self.op_id}"
        )

    def wait(self, timeout: float | None = None) -> None:
        self._gate_wait()
        super().wait(timeout)

    def result(self, timeout: float | None = None, raise_on_failure: bool = True) -> Any:
        self._gate_wait()
        return super().result(timeout=timeout, raise_on_failure=raise_on_failure)


def future_done(f: PrefectFuture[Any]) -> bool:
    wrapped = getattr(f, "wrapped_future", None)
    if isinstance(wrapped, concurrent.futures.Future):
        return wrapped.done()
    return f.state.is_final()


def final_state_of(obj: Any) -> Any:
    """A done future's final state (other objects unchanged), without asking the API.

    Both concurrent and distributed futures resolve to the task engine's final `State`; one that
    raised instead (a lost worker, an unpicklable result) becomes a `Failed` state naming why.
    """
    if not isinstance(obj, PrefectFuture):
        return obj
    wrapped = getattr(obj, "wrapped_future", None)
    if wrapped is None or not hasattr(wrapped, "result"):
        return obj.state
    try:
        res = wrapped.result()  # done already (callers ensure it); distributed's timeout=0 fails
    except Exception as exc:
        return Failed(message=f"task run {obj.task_run_id} raised {type(exc).__name__}: {exc}")
    return res if isinstance(res, State) else obj.state
