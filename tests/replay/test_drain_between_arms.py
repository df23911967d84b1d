"""Draining a shared server before an arm (`engines.openai.wall.drain_server`).

A stand-in HTTP server plays the two endpoints the drain reads: vLLM's `/metrics` request gauges
and `POST /reset_prefix_cache` (present only with VLLM_SERVER_DEV_MODE=1; it answers
`success: false` while cache blocks are held). The real server is drained in
tests/integration/test_real_scenario.py.
"""

from __future__ import annotations

import json
import math
import socket
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import httpx
import pytest

from maserve_prefect.engines.openai.wall import DrainReport, drain_server


@dataclass
class _Server:
    """What the stand-in answers: `busy` running requests (one fewer per scrape), `metrics`
    served at all, the reset endpoint present, and `held` resets that answer success=false."""

    busy: int = 0
    metrics: bool = True
    reset: bool = True
    held: int = 0
    calls: list[str] = field(default_factory=list)
    url: str = ""


def _handler(state: _Server) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args: object) -> None:
            pass

        def _send(self, code: int, body: str, kind: str = "text/plain") -> None:
            data = body.encode()
            self.send_response(code)
            self.send_header("Content-Type", kind)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self) -> None:
            state.calls.append(f"GET {self.path}")
            if self.path != "/metrics" or not state.metrics:
                self._send(404, "not found")
                return
            running, state.busy = state.busy, max(state.busy - 1, 0)
            self._send(200, f'vllm:num_requests_running{{model_name="m"}} {running}\n'
                            'vllm:num_requests_waiting{model_name="m"} 0\n')  # fmt: skip

        def do_POST(self) -> None:
            state.calls.append(f"POST {self.path}")
            if self.path != "/reset_prefix_cache" or not state.reset:
                self._send(404, json.dumps({"detail": "Not Found"}), "application/json")
                return
            ok, state.held = state.held == 0, max(state.held - 1, 0)
            self._send(200, json.dumps({"success": ok}), "application/json")

    return Handler


@pytest.fixture
def server() -> Iterator[_Server]:
    state = _Server()
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), _handler(state))
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    state.url = f"http://127.0.0.1:{httpd.server_address[1]}"
    try:
        yield state
    finally:
        httpd.shutdown()
        httpd.server_close()


def test_waits_until_idle_then_retries_the_reset_until_it_succeeds(server: _Server) -> None:
    server.busy, server.held = 3, 2
    report = drain_server(server.url, poll_s=0.001)
    assert report.drained and report.describe() == "idle; prefix cache reset"
    # three busy scrapes, then the idle one; two held resets, then the one that succeeded
    assert server.calls == ["GET /metrics"] * 4 + ["POST /reset_prefix_cache"] * 3


def test_a_server_without_the_reset_endpoint_is_reported_not_reset(server: _Server) -> None:
    server.reset = False
    report = drain_server(server.url, poll_s=0.001)
    assert (report.idle, report.prefix_cache_reset, report.drained) == (True, None, False)
    assert report.describe() == "idle; prefix cache not reset: unsupported by the server"


def test_a_busy_server_is_reported_busy_at_the_timeout(server: _Server) -> None:
    server.busy = 10**9
    report = drain_server(server.url, timeout_s=0.05, poll_s=0.001)
    assert report.idle is False and not report.drained
    assert "running and 0 waiting requests at the timeout" in report.describe()


def test_a_reset_that_stays_held_is_reported_not_reset(server: _Server) -> None:
    server.held = 10**9
    report = drain_server(server.url, timeout_s=0.05, poll_s=0.001)
    assert (report.idle, report.prefix_cache_reset) == (True, False)
    assert "success=false" in report.detail


def test_a_server_without_request_gauges_has_unknown_idleness(server: _Server) -> None:
    server.metrics = False
    report = drain_server(server.url, poll_s=0.001)
    assert report == DrainReport(None, True, report.waited_s,
                                 "the server exposes no vllm:num_requests_* gauges")  # fmt: skip
    assert report.describe().startswith("idleness unknown; prefix cache reset")


@pytest.fixture
def silent_url() -> Iterator[str]:
    """A server that accepts connections (the kernel completes the handshake) and never answers."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    sock.listen(16)
    try:
        yield f"http://127.0.0.1:{sock.getsockname()[1]}"
    finally:
        sock.close()


def test_a_server_that_never_answers_holds_the_drain_its_timeout_not_more(
    silent_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every HTTP wait of the drain comes out of one budget: the timeouts it gives its requests
    add up to `timeout_s` (plus the floor of the last one), not one full timeout per request."""
    given: list[float] = []
    real_request = httpx.Client.request

    def request(self: httpx.Client, method: str, url: object, **kw: Any) -> httpx.Response:
        timeout = kw.get("timeout", self.timeout)
        read = timeout if isinstance(timeout, float | int) else self.timeout.read
        given.append(float(read if read is not None else math.inf))
        return real_request(self, method, url, **kw)  # type: ignore[arg-type]

    monkeypatch.setattr(httpx.Client, "request", request)
    box: list[DrainReport] = []
    budget = 0.4
    worker = threading.Thread(target=lambda: box.append(drain_server(silent_url, timeout_s=budget)))
    worker.start()
    worker.join(60.0)  # a bound on the test, far above the budget
    assert not worker.is_alive() and box
    report = box[0]
    assert (report.idle, report.prefix_cache_reset, report.drained) == (None, False, False)
    assert "did not answer before the drain's deadline" in report.detail
    assert len(given) == 2  # one scrape, one reset, each timing out
    assert sum(given) <= budget + 0.1


def test_the_pre_arm_drain_is_bounded_by_the_arm_timeout(monkeypatch: pytest.MonkeyPatch) -> None:
    import maserve_prefect.engines.openai.wall as wall
    from maserve_prefect.replay.arms import drain_engine
    from maserve_prefect.replay.scenario import Scenario

    seen: list[float] = []

    def fake_drain(
        base_url: str,
        *,
        timeout_s: float = wall.DRAIN_TIMEOUT_S,
        api_key: str = "EMPTY",
        headers: dict[str, str] | None = None,
    ) -> DrainReport:
        seen.append(timeout_s)
        assert (api_key, headers) == ("EMPTY", {})  # no credentials configured
        return DrainReport(True, True, 0.0)

    monkeypatch.setattr(wall, "drain_server", fake_drain)
    spec = {
        "name": "x",
        "engine": "openai:http://127.0.0.1:9",
        "cohorts": [{"name": "t", "bundle": "b"}],
        "arms": [{"name": "dag"}],
    }
    drain_engine(Scenario.model_validate({**spec, "timeout_s": 10}))
    drain_engine(Scenario.model_validate(spec))  # no --timeout: the default arm limit (1800 s)
    assert seen == [10.0, wall.DRAIN_TIMEOUT_S]
