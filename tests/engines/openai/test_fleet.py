"""A fleet of OpenAI-compatible endpoints against real HTTP servers on 127.0.0.1 that a test kills.

Routing, dead-marking, rerouting and probing back in, end to end through the one dispatcher; the
real-vLLM version (a server SIGKILLed mid-run) is `tests/integration/test_real_fleet.py`.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from http.server import ThreadingHTTPServer

import pytest
from openai_stub import StubConfig, StubServer, _make_handler

from maserve_prefect.dispatch.dispatcher import Dispatcher
from maserve_prefect.dispatch.routes import ROUTES
from maserve_prefect.dispatch.snapshot import Unit
from maserve_prefect.engines.openai.fleet import Fleet, FleetOptions, endpoint_name
from maserve_prefect.engines.openai.fleet_open import open_fleet
from maserve_prefect.engines.poolfile import PoolFile
from maserve_prefect.engines.vllm.server import free_port
from maserve_prefect.errors import ConfigError
from maserve_prefect.protocol.outcomes import Outcome, OutcomeStatus
from maserve_prefect.protocol.requests import Request
from maserve_prefect.protocol.state import Lifecycle

FAST = FleetOptions(heartbeat_s=None, probe_first_s=0.05, probe_max_s=0.1, probe_timeout_s=0.5)


class Killable:
    """A stub OpenAI server on a fixed port that can be killed (no new connection answered) and
    started again on the same port."""

    def __init__(self, config: StubConfig | None = None) -> None:
        self.stub = StubServer(config or StubConfig())
        self.port = free_port()
        self.stub.url = f"http://127.0.0.1:{self.port}"
        self._httpd: ThreadingHTTPServer | None = None
        self.restart()

    @property
    def url(self) -> str:
        return self.stub.url

    def restart(self, config: StubConfig | None = None) -> None:
        if config is not None:
            self.stub.config = config
        httpd = ThreadingHTTPServer(("127.0.0.1", self.port), _make_handler(self.stub))
        httpd.daemon_threads = True
        threading.Thread(
            target=httpd.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True
        ).start()
        self._httpd = httpd

    def kill(self) -> None:
        if self._httpd is not None:
            self._httpd.shutdown()
            self._httpd.server_close()
            self._httpd = None


@pytest.fixture
def servers() -> Iterator[list[Killable]]:
    made: list[Killable] = []
    yield made
    for s in made:
        if s.stub.config.hold is not None:
            s.stub.config.hold.set()
        s.kill()


def pool_of(*urls: str) -> PoolFile:
    return PoolFile.model_validate(
        {"deployments": [{"name": "main", "model": "Qwen3-0.6B", "replicas": list(urls)}],
         "source": "fleet.yaml"}
    ).check()  # fmt: skip


class Harness:
    """A dispatcher over a fleet, driven under one lock as the wall gate drives it."""

    def __init__(self, fleet: Fleet) -> None:
        self.fleet = fleet
        self.lock = threading.RLock()
        self.dispatcher = Dispatcher(fleet.replicas, time.monotonic, "least-outstanding",
                                     failover=fleet)  # fmt: skip
        fleet.watch(self.dispatcher.on_lifecycle_done)
        self.done: dict[str, Outcome] = {}
        self.placed: dict[str, list[str]] = {}

    def submit(self, uid: str) -> None:
        unit = Unit(uid, "root", "main", 8, 4)

        def placed(t: float, name: str) -> None:
            self.placed.setdefault(uid, []).append(name)

        def done(outcome: Outcome) -> None:
            self.done[uid] = outcome

        with self.lock:
            self.dispatcher.on_ready(
                unit, Request(uid, "main", num_prompt_tokens=8, max_tokens=4),
                on_done=done, on_submitted=placed,
            )  # fmt: skip


def until(cond: Callable[[], bool], what: str, limit_s: float = 15.0) -> None:
    deadline = time.monotonic() + limit_s
    while not cond():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out waiting for {what}")
        time.sleep(0.01)


def open_harness(servers: list[Killable], options: FleetOptions = FAST) -> Harness:
    lock = threading.RLock()

    def deliver(fn: Callable[[], None]) -> None:
        with lock:
            fn()

    fleet = open_fleet(pool_of(*(s.url for s in servers)), ["main"], now=time.monotonic,
                       deliver=deliver, options=options)  # fmt: skip
    h = Harness(fleet)
    h.lock = lock
    return h


def test_ops_of_a_killed_endpoint_finish_on_the_other_and_it_is_probed_back_in(
    servers: list[Killable],
) -> None:
    hold = threading.Event()
    doomed = Killable(StubConfig(hold=hold, drop_next=100, drop_after_chunks=1))
    other = Killable()
    servers += [doomed, other]
    h = open_harness(servers)
    try:
        dead = endpoint_name("main", doomed.url)
        for i in range(4):
            h.submit(f"u{i}")
        on_doomed = sorted(u for u, p in h.placed.items() if p == [dead])
        assert len(on_doomed) == 2  # least-outstanding spread them over both endpoints
        until(lambda: len(h.done) == 2, "the other endpoint's ops")
        doomed.kill()
        hold.set()  # the held streams go on and are cut mid-answer: the server is gone
        until(lambda: len(h.done) == 4, "every op")
        assert all(o.status is OutcomeStatus.COMPLETED for o in h.done.values())
        for uid in on_doomed:
            attempts = h.done[uid].attempts
            assert [a.number for a in attempts] == [1, 2]
            assert attempts[0].error is not None and attempts[0].error.startswith(f"{dead}: ")
            assert attempts[1].error is None and h.placed[uid][-1] != dead
        assert h.fleet.log[0][:2] == (dead, "dead")
        assert h.dispatcher.stats.num_rerouted == 2
        ep = next(e for e in h.fleet.endpoints if e.name == dead)
        assert ep.lifecycle is Lifecycle.UNREACHABLE and not ep.live
        # the server comes back on its port: the fleet probes it back in, discovery runs again
        doomed.restart(StubConfig())
        until(lambda: ep.live, "the probe back in")
        assert h.fleet.log[-1][:2] == (dead, "live")
        for i in range(4, 6):
            h.submit(f"u{i}")
        assert dead in (h.placed["u4"] + h.placed["u5"])
        until(lambda: len(h.done) == 6, "the ops after the return")
        assert all(o.status is OutcomeStatus.COMPLETED for o in h.done.values())
    finally:
        h.fleet.close()


def test_a_fleet_with_no_live_endpoint_fails_its_ops_with_one_line_naming_the_pool_file(
    servers: list[Killable],
) -> None:
    a = Killable(StubConfig(drop_next=100, drop_after_chunks=1))
    servers.append(a)
    h = open_harness(servers)
    try:
        a.kill()
        h.submit("u0")
        until(lambda: "u0" in h.done, "the op's end")
        out = h.done["u0"]
        assert out.status is OutcomeStatus.FAILED and out.error is not None
        assert out.error.startswith("pool file fleet.yaml: deployment main: no live endpoint (")
        assert a.url in out.error and "\n" not in out.error
        assert len(out.attempts) == 2  # the lost attempt, and the end
    finally:
        h.fleet.close()


def test_heartbeats_mark_an_idle_endpoint_dead(servers: list[Killable]) -> None:
    a, b = Killable(), Killable()
    servers += [a, b]
    opts = FleetOptions(heartbeat_s=0.05, heartbeat_timeout_s=0.5, max_missed_heartbeats=2,
                        probe_first_s=0.05, probe_max_s=0.1, probe_timeout_s=0.5)  # fmt: skip
    h = open_harness(servers, opts)
    try:
        a.kill()
        ep = next(e for e in h.fleet.endpoints if e.name == endpoint_name("main", a.url))
        until(lambda: not ep.live, "the heartbeat to notice")
        assert "heartbeats unanswered" in h.fleet.log[0][2]
        h.submit("u0")
        assert h.placed["u0"] == [endpoint_name("main", b.url)]
        until(lambda: "u0" in h.done, "the op")
        assert h.done["u0"].status is OutcomeStatus.COMPLETED and len(h.done["u0"].attempts) == 1
    finally:
        h.fleet.close()


def test_an_unreachable_endpoint_at_discovery_is_one_line_naming_file_deployment_and_url(
    servers: list[Killable],
) -> None:
    ok = Killable()
    servers.append(ok)
    nowhere = f"http://127.0.0.1:{free_port()}"
    with pytest.raises(ConfigError) as info:
        open_fleet(pool_of(ok.url, nowhere), ["main"], now=time.monotonic, deliver=None,
                   options=FleetOptions(discovery_timeout_s=2.0))  # fmt: skip
    msg = str(info.value)
    assert msg.startswith(f"pool file fleet.yaml: deployment main: endpoint {nowhere} did not")
    assert "\n" not in msg


def test_a_deployment_without_endpoints_is_refused() -> None:
    pf = PoolFile.model_validate(
        {"devices": ["H100:0"], "deployments": [{"name": "main", "model": "Qwen3-8B"}],
         "placements": [{"deployment": "main", "device": "H100:0"}], "source": "p.yaml"}
    ).check()  # fmt: skip
    with pytest.raises(ConfigError, match=r"pool file p.yaml: deployment main: no endpoints"):
        open_fleet(pf, ["main"], now=time.monotonic, deliver=None)


@pytest.mark.parametrize("route", ROUTES)
def test_every_route_places_on_the_fleets_endpoints(servers: list[Killable], route: str) -> None:
    servers += [Killable(StubConfig(chunk_delay_s=0.02)), Killable(StubConfig(chunk_delay_s=0.02))]
    h = open_harness(servers)
    h.dispatcher = Dispatcher(h.fleet.replicas, time.monotonic, route, failover=h.fleet)
    try:
        for i in range(4):  # one root: `session` keeps it home unless the home is too busy
            h.submit(f"u{i}")
        until(lambda: len(h.done) == 4, "every op")
        assert all(o.status is OutcomeStatus.COMPLETED for o in h.done.values())
        used = {p[-1] for p in h.placed.values()}
        if route == "session":  # sticky: the root's home takes them all (within the bound)
            assert len(used) == 1
        else:  # least-outstanding, and prefix with no cached prefix known: spread over both
            assert used == {e.name for e in h.fleet.endpoints}
    finally:
        h.fleet.close()
