"""Scrape a vLLM server's Prometheus `/metrics` into the engine timeline the simulator also writes.

The one idea: a real server's state is recorded as the same `EngineSample(source, t_s, name,
value)` series the simulator's `Timeline` produces (vLLM's Prometheus names, `engines.sim.step.records.
SERIES`), so reports read real and simulated runs alike. `MetricsScraper` polls a URL on a
background thread, turns each exposition text into `{name: value}` with `parse_vllm_metrics`
(`metrics_parse.py`, which also holds the series names and the parsing choices), keeps the
timeline in memory and hands each scrape's samples to a sink (e.g. the trace ledger). Reading a
timeline over a window (`counter_delta`, `gauge_time_average`) is `metrics_report.py`.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from types import TracebackType

import httpx

from maserve_prefect.engines.openai.metrics_parse import DEFAULT_NAMES, parse_vllm_metrics
from maserve_prefect.errors import ConfigError, EngineError
from maserve_prefect.trace.model import EngineSample


@dataclass(frozen=True, slots=True)
class ScrapeError:
    """One failed scrape (or failed sink call): when, and what went wrong."""

    t_s: float
    message: str


Sink = Callable[[list[EngineSample]], object]


class MetricsScraper:
    """Poll a server's `/metrics` on a background thread and keep its engine timeline.

    Each scrape stamps its samples with the caller's clock at the moment the request is sent
    (as Prometheus does), appends them to the in-memory timeline, updates `latest()` and calls
    `sink(samples)`. Failures (connection refused after the server died, HTTP errors, malformed
    text, a failing sink) are recorded in `errors` and never leave the thread; the scraper keeps
    trying until `stop()`.

    Args:
        url: the server's metrics URL, e.g. `http://127.0.0.1:8000/metrics`.
        source: the `source` of every sample (the replica's name).
        interval_s: seconds between scrape starts (paced on the monotonic clock).
        now: the caller's clock in seconds; default: monotonic seconds since construction.
        sink: called with each successful scrape's samples, on the scraper's thread.
        client: an httpx client to reuse (the scraper then does not close it).
        names: series to record (default `DEFAULT_NAMES`).
        model_name: keep only samples of this `model_name` label.
        timeout_s: HTTP timeout of one scrape.

    Raises:
        ConfigError: `interval_s` or `timeout_s` is not positive.

    Examples:
        >>> from maserve_prefect.trace.cas import MemoryStore
        >>> from maserve_prefect.trace.ledger import Ledger
        >>> from maserve_prefect.trace.model import Manifest
        >>> ledger = Ledger("sqlite://", MemoryStore()); ledger.begin_run(Manifest(trace_id="t"))
        >>> scraper = MetricsScraper("http://127.0.0.1:8000/metrics", source="replica0",
        ...                          sink=lambda s: ledger.append_samples("t", s))
        >>> scraper.interval_s
        0.5
    """

    def __init__(
        self,
        url: str,
        *,
        source: str,
        interval_s: float = 0.5,
        now: Callable[[], float] | None = None,
        sink: Sink | None = None,
        client: httpx.Client | None = None,
        names: Sequence[str] = DEFAULT_NAMES,
        model_name: str | None = None,
        timeout_s: float = 5.0,
    ) -> None:
        if not interval_s > 0:
            raise ConfigError(f"MetricsScraper({url!r}): interval_s must be > 0, got {interval_s}")
        if not timeout_s > 0:
            raise ConfigError(f"MetricsScraper({url!r}): timeout_s must be > 0, got {timeout_s}")
        self.url = url
        self.source = source
        self.interval_s = interval_s
        self.names = tuple(names)
        self.model_name = model_name
        self.timeout_s = timeout_s
        self._sink = sink
        if now is None:
            t0 = time.monotonic()
            now = lambda: time.monotonic() - t0  # noqa: E731
        self._now = now
        self._client = client
        self._owns_client = client is None
        self._lock = threading.Lock()
        self._samples: list[EngineSample] = []
        self._latest: dict[str, float] = {}
        self._errors: list[ScrapeError] = []
        self._num_scrapes = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # -- reading ------------------------------------------------------------------------------

    def latest(self) -> dict[str, float]:
        """The values of the last successful scrape (empty before the first)."""
        with self._lock:
            return dict(self._latest)

    def samples(self) -> list[EngineSample]:
        """Every recorded sample, in scrape order."""
        with self._lock:
            return list(self._samples)

    @property
    def errors(self) -> list[ScrapeError]:
        """Failed scrapes and sink calls, oldest first."""
        with self._lock:
            return list(self._errors)

    @property
    def num_scrapes(self) -> int:
        """Successful scrapes so far."""
        with self._lock:
            return self._num_scrapes

    @property
    def num_errors(self) -> int:
        """Failed scrapes and sink calls so far."""
        with self._lock:
            return len(self._errors)

    @property
    def running(self) -> bool:
        """Whether the background thread is alive."""
        return self._thread is not None and self._thread.is_alive()

    # -- scraping -----------------------------------------------------------------------------

    def scrape_once(self) -> list[EngineSample]:
        """Scrape now, record the samples and feed the sink.

        Returns:
            The samples recorded, or `[]` when the scrape failed (the failure is in `errors`).
        """
        t_s = self._now()
        try:
            response = self._http().get(self.url, timeout=self.timeout_s)
            response.raise_for_status()
            values = parse_vllm_metrics(response.text, self.names, self.model_name)
        except (httpx.HTTPError, EngineError) as e:
            self._record_error(t_s, f"scrape of {self.url} failed: {type(e).__name__}: {e}")
            return []
        batch = [
            EngineSample(source=self.source, t_s=t_s, name=n, value=v) for n, v in values.items()
        ]
        with self._lock:
            self._samples.extend(batch)
            self._latest = values
            self._num_scrapes += 1
        if self._sink is not None and batch:
            try:
                self._sink(batch)
            except Exception as e:  # the sink is the caller's code: record, keep scraping
                self._record_error(t_s, f"sink of {self.url} failed: {type(e).__name__}: {e}")
        return batch

    def start(self) -> MetricsScraper:
        """Start the background thread (no-op while it runs); returns self."""
        if self.running:
            return self
        self._stop.clear()
        self._thread = threading.Thread(
            target=self._run, name=f"maserve-metrics-{self.source}", daemon=True
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop the thread, wait for it (at most one in-flight scrape) and close an owned client."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        if self._owns_client and self._client is not None:
            self._client.close()
            self._client = None

    def __enter__(self) -> MetricsScraper:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def _run(self) -> None:
        next_start = time.monotonic()
        while not self._stop.is_set():
            self.scrape_once()
            next_start += self.interval_s
            # a slow scrape skips the starts it missed instead of bursting to catch up
            now = time.monotonic()
            if next_start < now:
                next_start = now
            self._stop.wait(next_start - now)

    def _http(self) -> httpx.Client:
        with self._lock:
            if self._client is None:
                self._client = httpx.Client()
            return self._client

    def _record_error(self, t_s: float, message: str) -> None:
        with self._lock:
            self._errors.append(ScrapeError(t_s=t_s, message=message))
