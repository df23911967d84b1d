"""Server discovery runs on one time budget: a server that lists its models and then hangs holds
discovery (and so a replay's start) for the budget, not one full timeout per probe."""

from __future__ import annotations

import json
import math
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import httpx
import pytest

from maserve_prefect.engines.openai.discovery import discover
from maserve_prefect.errors import EngineError


class _ListsThenHangs(BaseHTTPRequestHandler):
    release = threading.Event()

    def do_GET(self) -> None:
        if self.path.endswith("/v1/models"):
            body = json.dumps({"data": [{"id": "m", "max_model_len": 4096}]}).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
            return
        self.release.wait(30.0)  # hang (the test releases it when done)

    def do_POST(self) -> None:
        self.release.wait(30.0)

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def hanging_url() -> Iterator[str]:
    _ListsThenHangs.release.clear()
    server = ThreadingHTTPServer(("127.0.0.1", 0), _ListsThenHangs)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        _ListsThenHangs.release.set()
        server.shutdown()
        server.server_close()


def test_discovery_shares_one_budget_across_its_calls(
    hanging_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    timed_out: list[float] = []  # the timeout each call that ran out of time was given
    real_request = httpx.Client.request

    def request(self: httpx.Client, method: str, url: object, **kw: Any) -> httpx.Response:
        timeout = kw.get("timeout", self.timeout)
        read = timeout if isinstance(timeout, float | int) else self.timeout.read
        try:
            return real_request(self, method, url, **kw)  # type: ignore[arg-type]
        except httpx.TimeoutException:
            timed_out.append(float(read if read is not None else math.inf))
            raise

    monkeypatch.setattr(httpx.Client, "request", request)
    budget = 0.6
    box: list[BaseException] = []

    def run() -> None:
        try:
            discover(hanging_url, timeout_s=budget)
        except BaseException as exc:
            box.append(exc)

    worker = threading.Thread(target=run)
    worker.start()
    worker.join(60.0)  # a bound on the test, far above the budget
    assert not worker.is_alive() and box
    assert isinstance(box[0], EngineError)
    assert f"took longer than {budget:g} s" in str(box[0])
    assert timed_out  # the probes hung
    assert sum(timed_out) <= budget + 0.1  # without the shared budget: 0.6 per probe


def test_the_replay_engine_takes_the_arms_timeout_for_discovery() -> None:
    from maserve_prefect.engines.openai.engine import OpenAIEngine

    eng = OpenAIEngine("http://127.0.0.1:9/v1", model="m", discovery_timeout_s=2.5)
    assert eng.discovery_timeout_s == 2.5
