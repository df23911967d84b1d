"""vLLM `/metrics` parsing, the background scraper against a local HTTP server, report helpers."""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from sqlmodel import Session, func, select

from maserve_prefect.engines.openai.metrics import MetricsScraper
from maserve_prefect.engines.openai.metrics_parse import DEFAULT_NAMES, parse_vllm_metrics
from maserve_prefect.engines.openai.metrics_report import counter_delta, gauge_time_average
from maserve_prefect.engines.sim.step.records import SERIES
from maserve_prefect.errors import ConfigError, EngineError
from maserve_prefect.trace.cas import MemoryStore
from maserve_prefect.trace.ledger import Ledger
from maserve_prefect.trace.model import EngineSample, Manifest
from maserve_prefect.trace.tables import SampleRow


def vllm_metrics_text(
    *,
    running: tuple[float, float] = (3.0, 2.0),
    kv: tuple[float, float] = (0.25, 0.75),
    preemptions: tuple[float, float] = (1.0, 4.0),
    legacy: bool = False,
) -> str:
    """A `/metrics` body shaped like vLLM v1's: two engine cores of model `qwen`, plus `other`."""
    kv_name = "vllm:gpu_cache_usage_perc" if legacy else "vllm:kv_cache_usage_perc"
    prefix = "vllm:gpu_prefix_cache" if legacy else "vllm:prefix_cache"
    return f"""# HELP python_gc_objects_collected_total Objects collected during gc
# TYPE python_gc_objects_collected_total counter
python_gc_objects_collected_total{{generation="0"}} 1234.0
# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{{engine="0",model_name="qwen"}} {running[0]}
vllm:num_requests_running{{engine="1",model_name="qwen"}} {running[1]}
vllm:num_requests_running{{engine="0",model_name="other"}} 7.0
# HELP vllm:num_requests_waiting Number of requests waiting to be processed.
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{{engine="0",model_name="qwen"}} 5.0
vllm:num_requests_waiting{{engine="1",model_name="qwen"}} 0.0
# HELP {kv_name} KV-cache usage. 1 means 100 percent usage.
# TYPE {kv_name} gauge
{kv_name}{{engine="0",model_name="qwen"}} {kv[0]}
{kv_name}{{engine="1",model_name="qwen"}} {kv[1]}
{kv_name}{{engine="0",model_name="other"}} 0.5
# HELP vllm:num_preemptions_total Cumulative number of preemption from the engine.
# TYPE vllm:num_preemptions_total counter
vllm:num_preemptions_total{{engine="0",model_name="qwen"}} {preemptions[0]}
vllm:num_preemptions_total{{engine="1",model_name="qwen"}} {preemptions[1]}
# HELP vllm:num_preemptions_created Cumulative number of preemption from the engine.
# TYPE vllm:num_preemptions_created gauge
vllm:num_preemptions_created{{engine="0",model_name="qwen"}} 1.7290e+09
vllm:num_preemptions_created{{engine="1",model_name="qwen"}} 1.7290e+09
# HELP {prefix}_queries_total Prefix cache queries, in terms of number of queried tokens.
# TYPE {prefix}_queries_total counter
{prefix}_queries_total{{engine="0",model_name="qwen"}} 1000.0
{prefix}_queries_total{{engine="1",model_name="qwen"}} 500.0
# HELP {prefix}_hits_total Prefix cache hits, in terms of number of cached tokens.
# TYPE {prefix}_hits_total counter
{prefix}_hits_total{{engine="0",model_name="qwen"}} 600.0
{prefix}_hits_total{{engine="1",model_name="qwen"}} 100.0
# HELP vllm:prompt_tokens_total Number of prefill tokens processed.
# TYPE vllm:prompt_tokens_total counter
vllm:prompt_tokens_total{{engine="0",model_name="qwen"}} 2048.0
vllm:prompt_tokens_total{{engine="1",model_name="qwen"}} 1024.0
vllm:prompt_tokens_created{{engine="0",model_name="qwen"}} 1.7290e+09
# HELP vllm:time_to_first_token_seconds Histogram of time to first token in seconds.
# TYPE vllm:time_to_first_token_seconds histogram
vllm:time_to_first_token_seconds_bucket{{engine="0",le="0.1",model_name="qwen"}} 3.0
vllm:time_to_first_token_seconds_bucket{{engine="0",le="+Inf",model_name="qwen"}} 4.0
vllm:time_to_first_token_seconds_count{{engine="0",model_name="qwen"}} 4.0
vllm:time_to_first_token_seconds_sum{{engine="0",model_name="qwen"}} 0.9
"""


# -- parsing ------------------------------------------------------------------------------------


def test_parse_sums_engines_and_keeps_total_suffix() -> None:
    got = parse_vllm_metrics(vllm_metrics_text(), model_name="qwen")
    assert got == {
        "vllm:kv_cache_usage_perc": 0.5,  # mean of 0.25 and 0.75
        "vllm:num_requests_running": 5.0,
        "vllm:num_requests_waiting": 5.0,
        "vllm:num_preemptions_total": 5.0,
        "vllm:prefix_cache_queries_total": 1500.0,
        "vllm:prefix_cache_hits_total": 700.0,
        "vllm:prompt_tokens_total": 3072.0,
    }  # no generation_tokens in the text: absent, not 0


def test_parse_without_model_filter_includes_every_model() -> None:
    got = parse_vllm_metrics(vllm_metrics_text())
    assert got["vllm:num_requests_running"] == 12.0
    assert got["vllm:kv_cache_usage_perc"] == pytest.approx(0.5)  # (0.25 + 0.75 + 0.5) / 3
    assert parse_vllm_metrics(vllm_metrics_text(), model_name="nope") == {}


def test_parse_maps_legacy_names() -> None:
    got = parse_vllm_metrics(vllm_metrics_text(legacy=True, kv=(0.1, 0.3)), model_name="qwen")
    assert got["vllm:kv_cache_usage_perc"] == pytest.approx(0.2)
    assert got["vllm:prefix_cache_queries_total"] == 1500.0
    assert got["vllm:prefix_cache_hits_total"] == 700.0
    assert "vllm:gpu_cache_usage_perc" not in got


def test_current_name_wins_over_legacy() -> None:
    text = 'vllm:gpu_cache_usage_perc{engine="0"} 0.9\nvllm:kv_cache_usage_perc{engine="0"} 0.4\n'
    assert parse_vllm_metrics(text) == {"vllm:kv_cache_usage_perc": 0.4}


def test_parse_selected_names_only() -> None:
    got = parse_vllm_metrics(vllm_metrics_text(), names=["vllm:num_preemptions_total"])
    assert got == {"vllm:num_preemptions_total": 5.0}


def test_parse_rejects_garbage() -> None:
    with pytest.raises(EngineError, match="malformed Prometheus"):
        parse_vllm_metrics('vllm:num_requests_running{engine="0" oops\n')


def test_default_names_cover_simulator_series() -> None:
    assert set(SERIES) <= set(DEFAULT_NAMES)


# -- report helpers ---------------------------------------------------------------------------


def tl(name: str, points: list[tuple[float, float]], source: str = "r0") -> list[EngineSample]:
    return [EngineSample(source=source, t_s=t, name=name, value=v) for t, v in points]


def test_counter_delta_step_reset_and_sources() -> None:
    c = "vllm:prefix_cache_hits_total"
    samples = tl(c, [(0.0, 10.0), (1.0, 15.0), (2.0, 3.0), (3.0, 8.0), (4.0, 100.0)])
    samples += tl(c, [(0.5, 0.0), (3.5, 7.0)], source="r1")
    samples += tl("other", [(1.0, 1e9)])
    assert counter_delta(samples, c, 0.5, 3.0, source="r0") == 13.0  # +5, reset +3, +5
    assert counter_delta(samples, c, 0.5, 3.0, source="r1") == 0.0  # only its start sample
    assert counter_delta(samples, c, 0.5, 3.5) == 13.0 + 7.0
    assert counter_delta(samples, c, -5.0, 0.9, source="r0") == 0.0  # first sample is the base
    assert counter_delta([], c, 0.0, 1.0) == 0.0
    with pytest.raises(ConfigError, match="before start_s"):
        counter_delta(samples, c, 2.0, 1.0)


def test_gauge_time_average_steps() -> None:
    g = "vllm:kv_cache_usage_perc"
    samples = tl(g, [(1.0, 0.2), (2.0, 0.6), (4.0, 0.0)])
    # [1,2): 0.2, [2,4): 0.6, [4,5]: 0.0 → (0.2 + 1.2 + 0) / 4
    assert gauge_time_average(samples, g, 1.0, 5.0) == pytest.approx(0.35)
    # time before the first sample is not counted
    assert gauge_time_average(samples, g, 0.0, 2.0) == pytest.approx(0.2)
    assert gauge_time_average(samples, g, 3.0, 3.0) == 0.6
    assert math.isnan(gauge_time_average(samples, g, 0.0, 0.5))
    assert math.isnan(gauge_time_average(samples, "missing", 0.0, 5.0))
    two = samples + tl(g, [(0.0, 1.0)], source="r1")
    with pytest.raises(ConfigError, match="several sources"):
        gauge_time_average(two, g, 0.0, 5.0)
    assert gauge_time_average(two, g, 0.0, 5.0, source="r1") == 1.0


# -- scraper against a local server -------------------------------------------------------------


@dataclass
class FakeVllm:
    """A tiny HTTP server whose `/metrics` body the test changes."""

    body: str
    status: int = 200
    num_requests: int = 0
    server: ThreadingHTTPServer | None = None
    thread: threading.Thread | None = None
    lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def url(self) -> str:
        assert self.server is not None
        host, port = self.server.server_address[:2]
        return f"http://{host!s}:{port}/metrics"

    def start(self) -> FakeVllm:
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                with fake.lock:
                    fake.num_requests += 1
                    body, status = fake.body.encode(), fake.status
                self.send_response(status)
                self.send_header("Content-Type", "text/plain; version=0.0.4")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(
            target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        )
        self.thread.start()
        return self

    def shutdown(self) -> None:
        if self.server is not None:
            self.server.shutdown()
            self.server.server_close()
            self.server = None


@pytest.fixture
def fake_vllm() -> Iterator[FakeVllm]:
    fake = FakeVllm(vllm_metrics_text()).start()
    yield fake
    fake.shutdown()


def wait_until(pred: Callable[[], bool], timeout_s: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if pred():
            return True
        time.sleep(0.005)
    return pred()


class StepClock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        self.t += 1.0
        return self.t


def test_scrape_once_stamps_caller_clock(fake_vllm: FakeVllm) -> None:
    batches: list[list[EngineSample]] = []
    scraper = MetricsScraper(
        fake_vllm.url, source="rep0", now=StepClock(), sink=batches.append, model_name="qwen"
    )
    first = scraper.scrape_once()
    fake_vllm.body = vllm_metrics_text(running=(1.0, 0.0), preemptions=(2.0, 4.0))
    second = scraper.scrape_once()
    scraper.stop()
    assert {s.t_s for s in first} == {1.0} and {s.t_s for s in second} == {2.0}
    assert {s.source for s in first + second} == {"rep0"}
    assert batches == [first, second]
    assert scraper.latest()["vllm:num_requests_running"] == 1.0
    assert scraper.samples() == first + second
    assert counter_delta(scraper.samples(), "vllm:num_preemptions_total", 0.0, 2.0) == 1.0
    assert scraper.num_scrapes == 2 and scraper.errors == []


def test_scraper_thread_accumulates_and_survives_server_death(fake_vllm: FakeVllm) -> None:
    batches: list[list[EngineSample]] = []
    scraper = MetricsScraper(
        fake_vllm.url, source="rep0", interval_s=0.01, sink=batches.append, model_name="qwen"
    )
    with scraper:
        assert wait_until(lambda: scraper.num_scrapes >= 3)
        assert scraper.latest()["vllm:num_requests_running"] == 5.0
        fake_vllm.body = vllm_metrics_text(running=(9.0, 1.0))
        assert wait_until(lambda: scraper.latest().get("vllm:num_requests_running") == 10.0)
        fake_vllm.status = 500
        assert wait_until(lambda: scraper.num_errors >= 1)
        assert "500" in scraper.errors[0].message
        fake_vllm.shutdown()  # the server dies mid-run
        n = scraper.num_errors
        assert wait_until(lambda: scraper.num_errors >= n + 2)
        assert scraper.running  # still trying
    assert not scraper.running
    assert (
        "ConnectError" in scraper.errors[-1].message and scraper.url in scraper.errors[-1].message
    )
    ts = [s.t_s for s in scraper.samples()]
    assert ts == sorted(ts)
    assert len(batches) == scraper.num_scrapes
    assert sum(len(b) for b in batches) == len(scraper.samples())
    assert {len(b) for b in batches} == {7}  # every series of the text, each scrape


def test_scraper_recovers_and_records_sink_failures(fake_vllm: FakeVllm) -> None:
    calls: list[int] = []

    def flaky_sink(samples: list[EngineSample]) -> None:
        calls.append(len(samples))
        if len(calls) == 1:
            raise RuntimeError("database is locked")

    scraper = MetricsScraper(fake_vllm.url, source="r", sink=flaky_sink, now=StepClock())
    assert scraper.scrape_once()  # sink fails: samples still recorded
    assert scraper.scrape_once()
    scraper.stop()
    assert len(calls) == 2 and scraper.num_scrapes == 2
    assert [e.message for e in scraper.errors] == [
        f"sink of {fake_vllm.url} failed: RuntimeError: database is locked"
    ]


def test_scraper_sink_into_ledger(fake_vllm: FakeVllm) -> None:
    ledger = Ledger("sqlite://", MemoryStore())
    ledger.begin_run(Manifest(trace_id="t1"))
    scraper = MetricsScraper(
        fake_vllm.url,
        source="rep0",
        interval_s=0.01,
        sink=lambda s: ledger.append_samples("t1", s),
        model_name="qwen",
    )
    with scraper:
        assert wait_until(lambda: scraper.num_scrapes >= 3)
    with Session(ledger.engine) as session:
        num_rows = session.exec(
            select(func.count()).select_from(SampleRow).where(SampleRow.trace_id == "t1")
        ).one()
    assert num_rows == len(scraper.samples()) == 7 * scraper.num_scrapes
    stored = ledger.load_trace("t1").samples
    assert stored == scraper.samples()
    ledger.close()


def test_scraper_rejects_bad_interval() -> None:
    with pytest.raises(ConfigError, match="interval_s"):
        MetricsScraper("http://127.0.0.1:1/metrics", source="r", interval_s=0)


def test_unreachable_server_is_an_error_not_a_raise() -> None:
    with ThreadingHTTPServer(("127.0.0.1", 0), BaseHTTPRequestHandler) as probe:
        port = probe.server_address[1]  # a port that was just free; nothing listens after close
    scraper = MetricsScraper(f"http://127.0.0.1:{port}/metrics", source="r", timeout_s=2.0)
    assert scraper.scrape_once() == []
    scraper.stop()
    assert scraper.num_errors == 1 and scraper.latest() == {}
    assert "ConnectError" in scraper.errors[0].message
