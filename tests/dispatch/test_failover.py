"""Failover: a unit whose replica stopped answering is placed again; its attempts travel with it."""

from __future__ import annotations

from collections.abc import Sequence

from dispatch_factories import make_request, make_unit

from maserve_prefect.dispatch.dispatcher import Dispatcher
from maserve_prefect.protocol.controls import Control
from maserve_prefect.protocol.outcomes import Acceptance, Attempt, Outcome, OutcomeStatus, Ticket
from maserve_prefect.protocol.requests import Request
from maserve_prefect.protocol.state import Lifecycle


class Manual:
    """A replica whose tickets a test resolves by hand."""

    def __init__(self, name: str, deployment: str = "small") -> None:
        self.name, self.deployment = name, deployment
        self.lifecycle = Lifecycle.READY
        self.tickets: dict[str, Ticket] = {}

    def submit(self, request: Request, controls: Sequence[Control] = ()) -> Ticket:
        if not self.lifecycle.accepting:
            return Ticket(request.request_id, Acceptance.REJECTED, f"{self.name} is dead")
        t = Ticket(request.request_id, Acceptance.ACCEPTED)
        self.tickets[request.request_id] = t
        return t

    def end(self, rid: str, status: OutcomeStatus, attempts: tuple[Attempt, ...]) -> None:
        t = self.tickets.pop(rid)
        t.resolve(
            Outcome(rid, status, 8, 2 if status is OutcomeStatus.COMPLETED else 0, 0, 0, "",
                    0.0, None, None, 1.0, error=attempts[-1].error, attempts=attempts)
        )  # fmt: skip


class Health:
    """A failover that marks a replica dead on a lost connection, at most `max_reroutes`."""

    def __init__(self, replicas: dict[str, Manual], max_reroutes: int = 3) -> None:
        self.replicas, self.max_reroutes = replicas, max_reroutes

    def reroute(self, replica: str, outcome: Outcome, num_reroutes: int) -> bool:
        rep = self.replicas[replica]
        if outcome.attempts and outcome.attempts[-1].kind == "connection":
            rep.lifecycle = Lifecycle.UNREACHABLE
        return not rep.lifecycle.accepting and num_reroutes < self.max_reroutes

    def no_live_reason(self, deployment: str) -> str | None:
        return f"pool file p.yaml: deployment {deployment}: no live endpoint"


LOST = (Attempt(1, 0.0, 0.5, "connection error: cut", kind="connection"),)
OK = (Attempt(1, 0.6, 1.0),)


def make(n: int = 2, max_reroutes: int = 3) -> tuple[list[Manual], Dispatcher]:
    reps = [Manual(f"r{i}") for i in range(n)]
    health = Health({r.name: r for r in reps}, max_reroutes)
    d = Dispatcher(lambda: reps, lambda: 0.0, "least-outstanding", failover=health)
    return reps, d


def test_a_lost_unit_is_placed_on_the_live_replica_and_keeps_its_attempts() -> None:
    (a, b), d = make()
    done: list[Outcome] = []
    placed: list[str] = []
    for uid in ("u1", "u2"):
        unit = make_unit(uid, root="root0", deployment="small")
        d.on_ready(unit, make_request(unit), on_done=done.append,
                   on_submitted=lambda t, name: placed.append(name))  # fmt: skip
    assert placed == ["r0", "r1"] and set(a.tickets) == {"u1"}
    a.end("u1", OutcomeStatus.FAILED, LOST)
    assert not done and placed[-1] == "r1" and set(b.tickets) == {"u1", "u2"}
    assert a.lifecycle is Lifecycle.UNREACHABLE and d.stats.num_rerouted == 1
    b.end("u1", OutcomeStatus.COMPLETED, OK)
    (out,) = done
    assert out.status is OutcomeStatus.COMPLETED
    assert [(x.number, x.error) for x in out.attempts] == [
        (1, "r0: connection error: cut"), (2, None)
    ]  # fmt: skip


def test_a_refusal_by_a_dead_replica_is_placed_again() -> None:
    (a, b), d = make()
    done: list[Outcome] = []
    u1 = make_unit("u1", root="root0", deployment="small")
    d.on_ready(u1, make_request(u1), on_done=done.append)
    a.lifecycle = Lifecycle.UNREACHABLE  # died between the plan's view and the submission
    u2 = make_unit("u2", root="root1", deployment="small")
    # least-outstanding sees r0 empty and r1 busy, but r0 is no longer accepting: r1 takes it
    d.on_ready(u2, make_request(u2), on_done=done.append)
    assert set(b.tickets) == {"u2"} and not done


def test_an_ordinary_failure_goes_to_the_caller() -> None:
    (a, _), d = make()
    done: list[Outcome] = []
    u1 = make_unit("u1", root="root0", deployment="small")
    d.on_ready(u1, make_request(u1), on_done=done.append)
    a.end("u1", OutcomeStatus.FAILED, (Attempt(1, 0.0, 0.5, "HTTP 400: bad", 400, "4xx"),))
    assert [o.status for o in done] == [OutcomeStatus.FAILED] and d.stats.num_rerouted == 0
    assert done[0].attempts[0].error == "HTTP 400: bad"  # not carried: nothing renamed


def test_reroutes_are_bounded_and_every_attempt_is_kept() -> None:
    (a, b), d = make(max_reroutes=1)
    done: list[Outcome] = []
    u1 = make_unit("u1", root="root0", deployment="small")
    d.on_ready(u1, make_request(u1), on_done=done.append)
    a.end("u1", OutcomeStatus.FAILED, LOST)
    a.lifecycle = Lifecycle.READY  # probed back in
    b.end("u1", OutcomeStatus.FAILED, LOST)  # lost again: the bound says stop
    (out,) = done
    assert out.status is OutcomeStatus.FAILED
    assert [x.error for x in out.attempts] == ["r0: connection error: cut", "connection error: cut"]
    assert [x.number for x in out.attempts] == [1, 2]


def test_no_live_replica_fails_the_unit_with_the_failovers_reason_and_its_attempts() -> None:
    (a,), d = make(n=1)
    done: list[Outcome] = []
    u1 = make_unit("u1", root="root0", deployment="small")
    d.on_ready(u1, make_request(u1), on_done=done.append)
    a.end("u1", OutcomeStatus.FAILED, LOST)
    (out,) = done
    assert out.status is OutcomeStatus.FAILED
    assert out.error == "pool file p.yaml: deployment small: no live endpoint"
    assert [(x.number, x.error) for x in out.attempts] == [
        (1, "r0: connection error: cut"), (2, out.error)
    ]  # fmt: skip
