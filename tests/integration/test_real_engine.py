"""The OpenAI engine, metrics scraper and KV-event subscriber against the real vLLM server."""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from conftest import BLOCK_TOKENS, KV_BLOCKS, MAX_NUM_SEQS, server_config

from maserve_prefect.engines.openai.engine import OpenAIEngine
from maserve_prefect.engines.openai.kv_decode import BlockStored
from maserve_prefect.engines.openai.kv_events import KVEventSubscriber
from maserve_prefect.engines.openai.metrics import MetricsScraper
from maserve_prefect.engines.openai.metrics_parse import (
    NUM_REQUESTS_RUNNING,
    NUM_REQUESTS_WAITING,
    parse_vllm_metrics,
)
from maserve_prefect.engines.openai.metrics_report import counter_delta
from maserve_prefect.engines.vllm.server import VLLMServer
from maserve_prefect.protocol.controls import Force, Priority
from maserve_prefect.protocol.outcomes import OutcomeStatus
from maserve_prefect.protocol.requests import Request
from maserve_prefect.trace.cas import MemoryStore
from maserve_prefect.trace.ledger import Ledger
from maserve_prefect.trace.model import Manifest

PREEMPTIONS = "vllm:num_preemptions_total"
KV_USAGE = "vllm:kv_cache_usage_perc"


@pytest.fixture
def engine(vllm_server: VLLMServer) -> Iterator[OpenAIEngine]:
    with OpenAIEngine(vllm_server.url, name="tiny0", vocab_size=512) as eng:
        eng.start()
        yield eng


def _ids(n: int, seed: int) -> tuple[int, ...]:
    return tuple(16 + (seed * 7919 + i * 104729) % 480 for i in range(n))


def test_discovery_finds_what_vllm_supports(engine: OpenAIEngine) -> None:
    info = engine.server_info()
    assert info.is_vllm and info.version and info.metrics_available
    assert info.priority_scheduling and info.length_lock and info.token_id_prompts
    caps = engine.capabilities()
    assert caps.priority_scheduling and caps.length_lock and caps.accepts_token_ids
    assert Priority in caps.control_types
    assert caps.sleep_levels == ()  # the CPU build has no sleep mode: not offered


def test_length_lock_gives_exact_counts_for_every_prompt_form(engine: OpenAIEngine) -> None:
    reqs = [
        Request("ids", "tiny", prompt_token_ids=_ids(300, 1), max_tokens=37, min_tokens=37),
        Request(
            "hashes", "tiny", num_prompt_tokens=700, prefix_block_hashes=(11, 12),
            prefix_block_size=256, max_tokens=5, min_tokens=5,
        ),
        Request("chat", "tiny", num_prompt_tokens=9, messages=(("user", "hello there"),),
                max_tokens=12, min_tokens=12),
    ]  # fmt: skip
    outs = [engine.wait(engine.submit(r), timeout_s=120) for r in reqs]
    assert [o.status for o in outs] == [OutcomeStatus.COMPLETED] * 3
    assert [o.num_output_tokens for o in outs] == [37, 5, 12]
    assert outs[0].num_prompt_tokens == 300 and outs[1].num_prompt_tokens == 700
    for o in outs:
        assert o.first_token_s is not None and o.arrival_s < o.first_token_s <= o.finish_s
        assert len(o.attempts) == 1 and o.attempts[0].error is None
    # the same token-id prompt again: its full 128-token blocks are served from the prefix cache
    again = engine.wait(
        engine.submit(Request("ids2", "tiny", prompt_token_ids=_ids(300, 1), max_tokens=2,
                              min_tokens=2)), timeout_s=120,
    )  # fmt: skip
    assert again.num_cached_tokens == 256


SERIAL_MAX_LEN = 32768
"""The one-seat server's context: long enough for a blocker that outlasts any queueing."""


@pytest.fixture(scope="module")
def serial_server(
    vllm_python: Path, tiny_model: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[VLLMServer]:
    """A server with one seat (max_num_seqs=1): the execution order is the queue order."""
    log = tmp_path_factory.mktemp("serial") / "server.log"
    config = server_config(
        tiny_model, max_num_seqs=1, max_model_len=SERIAL_MAX_LEN, kv_cache_memory_bytes="80M"
    )
    server = VLLMServer(config, vllm_python, log)
    server.start()
    try:
        server.wait_healthy(timeout_s=300)
        yield server
    finally:
        server.stop()


def _server_queue(url: str) -> dict[str, float]:
    """The scheduler's own running / waiting counts, from the server's /metrics."""
    text = httpx.get(f"{url}/metrics", timeout=30).text
    return parse_vllm_metrics(text, (NUM_REQUESTS_RUNNING, NUM_REQUESTS_WAITING))


def _wait_for_queue(url: str, running: int, waiting: int, timeout_s: float = 120) -> None:
    deadline = time.monotonic() + timeout_s
    seen: dict[str, float] = {}
    while time.monotonic() < deadline:
        seen = _server_queue(url)
        if (seen.get(NUM_REQUESTS_RUNNING), seen.get(NUM_REQUESTS_WAITING)) == (running, waiting):
            return
        time.sleep(0.05)
    pytest.fail(f"server queue never reached running={running} waiting={waiting}: {seen}")


class _Blocker:
    """A long streamed completion that holds the only seat until `release()` disconnects it
    (vLLM aborts a request whose client goes away)."""

    def __init__(self, url: str) -> None:
        self.url = url
        self._release = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self.error: BaseException | None = None

    def _run(self) -> None:
        body = {
            "model": "tiny", "prompt": list(_ids(16, 1)), "max_tokens": SERIAL_MAX_LEN - 64,
            "min_tokens": SERIAL_MAX_LEN - 64, "stream": True, "priority": 10,
        }  # fmt: skip
        try:
            with httpx.stream("POST", f"{self.url}/v1/completions", json=body, timeout=300) as r:
                for _ in r.iter_lines():
                    if self._release.is_set():
                        return
        except BaseException as e:  # surfaced by release()
            self.error = e

    def __enter__(self) -> _Blocker:
        self._thread.start()
        return self

    def release(self) -> None:
        self._release.set()
        self._thread.join(timeout=60)
        assert self.error is None, self.error

    def __exit__(self, *exc: object) -> None:
        self._release.set()


def test_priority_is_honoured_under_contention(serial_server: VLLMServer) -> None:
    url = serial_server.url
    low = [Priority(10, force=Force.REQUIREMENT)]
    # The order of execution is read from the server's prefix cache, not from client-side times
    # (on shared cores the API server can hand several finished responses over in one burst).
    # Every prompt starts with block A; low i continues with blocks B0..Bi. Whoever runs first
    # finds nothing cached; low i finds A, B0..B(i-1) cached exactly when it runs after low i-1
    # and before any later low. So the cached counts [0 | 1, 2, 3, 4 blocks] hold if and only if
    # the urgent request ran first and the equal-priority ones ran in arrival order.
    block = 128  # the CPU build's KV block size
    a = _ids(block, 300)
    chain = [_ids(block, 301 + i) for i in range(4)]
    with OpenAIEngine(url, name="serial", vocab_size=512) as eng, _Blocker(url) as blocker:
        eng.start()
        # The blocker runs; four low-priority requests queue, then one urgent request. Wait until
        # the server's own scheduler reports each one waiting, so it sees them in this order.
        _wait_for_queue(url, running=1, waiting=0)
        queued = []
        for i in range(4):
            prompt = a + sum(chain[: i + 1], ()) + _ids(5, 400 + i)
            queued.append(
                eng.submit(
                    Request(f"low{i}", "tiny", prompt_token_ids=prompt, max_tokens=8,
                            min_tokens=8), low,
                )
            )  # fmt: skip
            _wait_for_queue(url, running=1, waiting=i + 1)
        urgent = eng.submit(
            Request("urgent", "tiny", prompt_token_ids=a + _ids(5, 399), max_tokens=4,
                    min_tokens=4),
            [Priority(0, force=Force.REQUIREMENT)],
        )  # fmt: skip
        _wait_for_queue(url, running=1, waiting=5)
        blocker.release()
        outs = [eng.wait(t, timeout_s=300) for t in queued]
        u = eng.wait(urgent, timeout_s=300)
    assert all(o.status is OutcomeStatus.COMPLETED for o in [u, *outs])
    # FCFS would have run low0 first (it arrived first): it would find nothing cached and the
    # urgent request would find block A.
    cached = [u.num_cached_tokens, *(o.num_cached_tokens for o in outs)]
    assert cached == [0, block, 2 * block, 3 * block, 4 * block], cached


def test_metrics_scraper_sees_kv_usage_and_preemptions(
    engine: OpenAIEngine, vllm_server: VLLMServer
) -> None:
    ledger = Ledger("sqlite://", MemoryStore())
    ledger.begin_run(Manifest(trace_id="scrape"))
    scraper = MetricsScraper(
        f"{vllm_server.url}/metrics",
        source="tiny0",
        interval_s=0.2,
        now=engine.now,
        sink=lambda s: ledger.append_samples("scrape", s),
    )
    with scraper:
        scraper.scrape_once()
        # MAX_NUM_SEQS requests run at once, each growing to a fifth more than its share of the
        # cache, so the running batch outgrows it and vLLM preempts (it did not when the cache was
        # raised to 80 MiB under a fixed 3,000-token load: 8 x 24 blocks fit in 320). Decode is the
        # slow part on CPU, so the size is in the prompt. The load lasts long enough for several
        # scrapes to land inside it: /metrics answers slowly (seconds) while the API server streams.
        per_request = math.ceil(1.2 * KV_BLOCKS * BLOCK_TOKENS / MAX_NUM_SEQS)
        decode = 1200
        tickets = [
            engine.submit(
                Request(f"big{i}", "tiny", prompt_token_ids=_ids(per_request - decode, 500 + i),
                        max_tokens=decode, min_tokens=decode)
            )
            for i in range(MAX_NUM_SEQS + 2)
        ]  # fmt: skip
        outs = [engine.wait(t, timeout_s=600) for t in tickets]
        scraper.scrape_once()
    assert all(o.status is OutcomeStatus.COMPLETED for o in outs)
    assert sum(o.num_preemptions for o in outs) == 0  # not observable per request over HTTP
    samples = scraper.samples()
    assert max(s.value for s in samples if s.name == KV_USAGE) > 0.5
    assert counter_delta(samples, PREEMPTIONS, samples[0].t_s, samples[-1].t_s) >= 1
    assert not scraper.errors
    stored = ledger.load_trace("scrape").samples
    assert len(stored) == len(samples) and {s.name for s in stored} >= {KV_USAGE, PREEMPTIONS}


def test_kv_events_arrive_and_track_residency(
    engine: OpenAIEngine, kv_subscriber: KVEventSubscriber
) -> None:
    before = kv_subscriber.directory.num_stored
    out = engine.wait(
        engine.submit(Request("kv", "tiny", prompt_token_ids=_ids(520, 77), max_tokens=3,
                              min_tokens=3)), timeout_s=120,
    )  # fmt: skip
    assert out.status is OutcomeStatus.COMPLETED
    assert kv_subscriber.wait_for(lambda: kv_subscriber.directory.num_stored >= before + 4, 30)
    stored = [e for _, e in kv_subscriber.events() if isinstance(e, BlockStored)]
    assert stored and all(e.block_size == 128 for e in stored)
    assert kv_subscriber.num_malformed == 0
    # the four full blocks of the prompt are resident on the GPU (the CPU build's only tier)
    chain = [h for e in stored for h in e.block_hashes]
    assert kv_subscriber.directory.reusable_prefix_blocks(chain[-4:]) >= 1
