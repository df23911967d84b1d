"""Processor sharing of a device's compute between replicas' steps (`step/device_share.py`).

Exact event times on a hand-computable case: every step costs 1 s of full-speed work
(`LinearCost` with no per-token term), so a step shared by two replicas advances at 1/2 and the
end times are exact binary fractions.
"""

from __future__ import annotations

import pytest
from sim_factories import LinearCost

from maserve_prefect.clock.kernel import Kernel
from maserve_prefect.engines.sim.replica import SimReplica
from maserve_prefect.engines.sim.step.device_share import DeviceShare
from maserve_prefect.engines.sim.step.scheduler import SchedulerConfig
from maserve_prefect.protocol.outcomes import Ticket
from maserve_prefect.protocol.requests import Request

ONE_SECOND_STEPS = LinearCost(per_token_s=0.0, overhead_s=1.0)


def _replicas(
    k: Kernel, names: list[str], device_of: dict[str, tuple[str, ...]], fast_forward: bool
) -> dict[str, SimReplica]:
    share = DeviceShare(k)
    out = {}
    for name in names:
        rep = SimReplica(
            k, ONE_SECOND_STEPS, 64, SchedulerConfig(fast_forward=fast_forward),
            name=name, check_invariants=True,
        )  # fmt: skip
        rep.share_devices(share, device_of[name])
        out[name] = rep
    return out


def _submit_at(
    k: Kernel, rep: SimReplica, t: float, req: Request, tickets: dict[str, Ticket]
) -> None:
    k.call_at(t, lambda: tickets.__setitem__(req.request_id, rep.submit(req)))


def _times(tickets: dict[str, Ticket]) -> dict[str, tuple[float | None, float]]:
    out = {}
    for rid, t in tickets.items():
        assert t.outcome is not None
        out[rid] = (t.outcome.first_token_s, t.outcome.finish_s)
    return out


@pytest.mark.parametrize("fast_forward", [True, False])
def test_step_in_flight_is_retimed_when_a_replica_beside_it_starts(fast_forward: bool) -> None:
    """r0 runs a (4 steps) from 0; r1's b (2 steps) arrives at 1.5 on the same device.

    r0's step 1 (started 1.0) has 0.5 s of work left at 1.5 and ends at 2.5 at half speed (a
    fast-forwarded decode run is first cut to that step); from then on both step at half speed;
    the device does exactly 6 s of work in 6 s.
    """
    k = Kernel()
    reps = _replicas(k, ["r0", "r1"], {"r0": ("D:0",), "r1": ("D:0",)}, fast_forward)
    tickets: dict[str, Ticket] = {}
    _submit_at(k, reps["r0"], 0.0, Request("a", "", num_prompt_tokens=16, max_tokens=4), tickets)
    _submit_at(k, reps["r1"], 1.5, Request("b", "", num_prompt_tokens=16, max_tokens=2), tickets)
    k.run()
    assert _times(tickets) == {"a": (1.0, 6.0), "b": (3.5, 5.5)}
    steps = [(r.start_s, r.end_s) for r in reps["r0"].records]
    assert steps == [(0.0, 1.0), (1.0, 2.5), (2.5, 4.5), (4.5, 6.0)]
    assert [(r.start_s, r.end_s) for r in reps["r1"].records] == [(1.5, 3.5), (3.5, 5.5)]
    assert reps["r0"].num_steps == 4 and reps["r1"].num_steps == 2


@pytest.mark.parametrize("fast_forward", [True, False])
def test_replicas_on_different_devices_do_not_share(fast_forward: bool) -> None:
    k = Kernel()
    reps = _replicas(k, ["r0", "r1"], {"r0": ("D:0",), "r1": ("D:1",)}, fast_forward)
    tickets: dict[str, Ticket] = {}
    _submit_at(k, reps["r0"], 0.0, Request("a", "", num_prompt_tokens=16, max_tokens=4), tickets)
    _submit_at(k, reps["r1"], 1.5, Request("b", "", num_prompt_tokens=16, max_tokens=2), tickets)
    k.run()
    assert _times(tickets) == {"a": (1.0, 4.0), "b": (2.5, 3.5)}


def test_tp_replica_runs_at_its_most_contended_device() -> None:
    """A tp=2 replica on D:0 + D:1 and a replica on D:1: both at half speed while both step."""
    k = Kernel()
    reps = _replicas(k, ["tp", "r1"], {"tp": ("D:0", "D:1"), "r1": ("D:1",)}, True)
    tickets: dict[str, Ticket] = {}
    _submit_at(k, reps["tp"], 0.0, Request("a", "", num_prompt_tokens=16, max_tokens=2), tickets)
    _submit_at(k, reps["r1"], 0.0, Request("b", "", num_prompt_tokens=16, max_tokens=1), tickets)
    k.run()
    # both start at 0 at half speed; b ends at 2, then a's second step runs alone
    assert _times(tickets) == {"a": (2.0, 3.0), "b": (2.0, 2.0)}


def test_three_replicas_share_in_thirds() -> None:
    k = Kernel()
    names = ["r0", "r1", "r2"]
    reps = _replicas(k, names, dict.fromkeys(names, ("D:0",)), True)
    tickets: dict[str, Ticket] = {}
    for i, name in enumerate(names):
        req = Request(f"x{i}", "", num_prompt_tokens=16, max_tokens=i + 1)
        _submit_at(k, reps[name], 0.0, req, tickets)
    k.run()
    # 3 steps at 1/3 speed end at 3 (x0 done); 2 at 1/2 from 3 to 5 (x1 done); x2's last alone
    assert _times(tickets) == {"x0": (3.0, 3.0), "x1": (3.0, 5.0), "x2": (3.0, 6.0)}
