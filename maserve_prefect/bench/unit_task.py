"""The `maserve-suite-unit` Prefect task: one suite unit run on a Dask worker (`bench.fanout`).

One idea: the task lives at module level so Dask pickles it by reference (the worker imports
this module) rather than by value; importing it imports Prefect, so `bench.fanout` imports it
only when units go to Dask inside a flow run. No cache, no persisted result: the unit's value
travels back through Dask.
"""

from __future__ import annotations

from typing import Any

from prefect import task
from prefect.cache_policies import NO_CACHE

from maserve_prefect.bench.units import UNIT_TASK, Unit, timed_unit


@task(name=UNIT_TASK, persist_result=False, cache_policy=NO_CACHE)
def run_unit(unit: Unit[Any]) -> tuple[Any, str, float]:
    """Run `unit` here: its result, this worker's name and the wall seconds."""
    return timed_unit(unit)
