"""A suite's unit of work: a picklable description and the function that computes its result.

One idea: a `Unit` is what a suite kind hands the fan-out seam (`bench.fanout`) — a label, a
module-level function (pickled by reference on Dask) and its arguments — and `timed_unit` is how
any executor runs one: its value, the name of the worker it ran on and its wall seconds.

Examples:
    >>> Unit("sq", pow, (3, 2))()
    9
    >>> timed_unit(Unit("sq", pow, (3, 2)))[0]
    9
"""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

R = TypeVar("R")

UNIT_TASK = "maserve-suite-unit"
"""The Prefect task name of a unit run on Dask (its task run is named after the unit)."""


@dataclass(frozen=True, slots=True)
class Unit(Generic[R]):
    """One independent piece of a suite's work.

    Attributes:
        label: what the progress bar and the units table call it (`scenario/arm/b0`).
        fn: a module-level function (pickled by reference on Dask).
        args: its arguments (picklable: they travel to the worker).
    """

    label: str
    fn: Callable[..., R]
    args: tuple[Any, ...] = ()

    def __call__(self) -> R:
        return self.fn(*self.args)


def timed_unit(unit: Unit[R]) -> tuple[R, str, float]:
    """Run `unit` on a worker: its result, the worker's name and the wall seconds."""
    t0 = time.perf_counter()
    value = unit()
    return value, _worker_name(), time.perf_counter() - t0


def _worker_name() -> str:
    try:
        from distributed import get_worker

        return str(get_worker().address)
    except ValueError:
        return f"{socket.gethostname()}:{os.getpid()}"
