"""Clock seam: the same code under virtual time and paced wall time."""

from __future__ import annotations

import asyncio

import pytest
from sim_factories import LinearCost, req

from maserve_prefect.clock import Clock, VirtualClock, WallClock
from maserve_prefect.engines.sim.loop import LogEntry
from maserve_prefect.engines.sim.replica import SimReplica
from maserve_prefect.errors import ConfigError
from maserve_prefect.protocol.outcomes import Outcome


async def client(clock: Clock, rep: SimReplica, results: list[tuple[str, int]]) -> None:
    """Submit, wait, submit a follow-up after a think time: the replay driver's shape."""
    first = rep.submit(req("a", 16, 3))
    outcome: Outcome = await first.wait_done(clock)
    results.append((outcome.request_id, outcome.num_output_tokens))
    await clock.sleep(0.05)
    follow = rep.submit(req("b", 8, 2))
    results.append(("b", (await follow.wait_done(clock)).num_output_tokens))


def test_virtual_clock_runs_client_code_deterministically() -> None:
    k = VirtualClock()
    log: list[LogEntry] = []
    rep = SimReplica(k, LinearCost(), 32, log=log)
    results: list[tuple[str, int]] = []
    k.process(client(k, rep, results))
    k.run()
    assert results == [("a", 3), ("b", 2)]
    # a: prefill 16 tok = 0.026, two decodes of 0.011 -> done at 0.048; b submitted at 0.098
    assert [e[0] for e in log if e[1] == "arrive"] == pytest.approx([0.0, 0.098])


def test_wall_clock_paces_the_same_code_and_the_same_event_order() -> None:
    log: list[LogEntry] = []
    results: list[tuple[str, int]] = []

    async def main() -> float:
        clock = WallClock(scale=0.01)
        rep = SimReplica(clock, LinearCost(), 32, log=log)
        await client(clock, rep, results)
        return clock.now()

    end = asyncio.run(main())
    assert results == [("a", 3), ("b", 2)]
    assert [e[1:] for e in log] == [
        ("arrive", "a", 0), ("schedule", "a", 0), ("first_token", "a", 1), ("finish", "a", 3),
        ("arrive", "b", 0), ("schedule", "b", 0), ("first_token", "b", 1), ("finish", "b", 2),
    ]  # fmt: skip
    # paced time never runs ahead of the simulated durations
    assert end >= 0.098 + 0.018 + 0.011


def test_wall_clock_rejects_bad_scale() -> None:
    async def main() -> None:
        WallClock(scale=0)

    with pytest.raises(ConfigError, match="scale"):
        asyncio.run(main())
