"""Scrape a vLLM server's Prometheus `/metrics` into the engine timeline the simulator also writes.

The one idea: a real server's state is recorded as the same `EngineSample(source, t_s, name,
value)` series the simulator's `Timeline` produces (vLLM's Prometheus names, `engine.sim.records.
SERIES`), so reports read real and simulated runs alike. `parse_vllm_metrics` turns one
exposition text into `{name: value}`; `MetricsScraper` polls a URL on a background thread, keeps
the timeline in memory and hands each scrape's samples to a sink (e.g. the trace ledger).

Parsing choices (vLLM exposes one label set per engine core, labelled `engine` and `model_name`):

- Result keys are the exact sample names, so counters keep their `_total` suffix (Prometheus'
  parser strips it from the *family* name only); `_created` samples are never selected.
- Counters and request gauges are summed over label sets. `vllm:kv_cache_usage_perc` is a
  fraction in [0, 1] per engine, so it is *averaged* over label sets (a sum could exceed 1, and
  the simulator's series is one replica's fraction); with equal-size engines that equals the
  server's overall usage.
- Older vLLM names map to the current ones (`vllm:gpu_cache_usage_perc`,
  `vllm:gpu_prefix_cache_{queries,hits}_total`); where a server exposes both (during a
  deprecation window) the current name wins.
- Missing names are absent from the result; NaN samples are skipped.

Report helpers read a timeline as a step function: a sample's value holds from its `t_s` until the
next sample of the same source and name (`counter_delta`, `gauge_time_average`).

Examples:
    >>> text = '''# TYPE vllm:num_requests_running gauge
    ... vllm:num_requests_running{engine="0",model_name="m"} 2.0
    ... vllm:num_requests_running{engine="1",model_name="m"} 1.0
    ... '''
    >>> parse_vllm_metrics(text)
    {'vllm:num_requests_running': 3.0}
"""

from __future__ import annotations

import math
import threading
import time
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from types import TracebackType

import httpx
from prometheus_client.parser import text_string_to_metric_families

from maserve_prefect.errors import ConfigError, EngineError
from maserve_prefect.trace.model import EngineSample

KV_CACHE_USAGE = "vllm:kv_cache_usage_perc"
NUM_REQUESTS_RUNNING = "vllm:num_requests_running"
NUM_REQUESTS_WAITING = "vllm:num_requests_waiting"
NUM_PREEMPTIONS = "vllm:num_preemptions_total"
PREFIX_CACHE_QUERIES = "vllm:prefix_cache_queries_total"
PREFIX_CACHE_HITS = "vllm:prefix_cache_hits_total"
PROMPT_TOKENS = "vllm:prompt_tokens_total"
GENERATION_TOKENS = "vllm:generation_tokens_total"

DEFAULT_NAMES: tuple[str, ...] = (
    KV_CACHE_USAGE,
    NUM_REQUESTS_RUNNING,
    NUM_REQUESTS_WAITING,
    NUM_PREEMPTIONS,
    PREFIX_CACHE_QUERIES,
    PREFIX_CACHE_HITS,
    PROMPT_TOKENS,
    GENERATION_TOKENS,
)
"""The series a scrape records: the simulator's `SERIES` plus the token counters."""

LEGACY_NAMES: Mapping[str, str] = {
    "vllm:gpu_cache_usage_perc": KV_CACHE_USAGE,
    "vllm:gpu_prefix_cache_queries_total": PREFIX_CACHE_QUERIES,
    "vllm:gpu_prefix_cache_hits_total": PREFIX_CACHE_HITS,
}
"""Older vLLM sample name → current name."""

MEAN_OVER_LABELS: frozenset[str] = frozenset({KV_CACHE_USAGE})
"""Series averaged (not summed) over label sets: per-engine fractions."""


def parse_vllm_metrics(
    text: str, names: Iterable[str] = DEFAULT_NAMES, model_name: str | None = None
) -> dict[str, float]:
    """Pick vLLM's engine series out of a Prometheus exposition text.

    Args:
        text: the body of a `/metrics` response.
        names: current sample names to return (legacy names of these are mapped onto them).
        model_name: keep only samples whose `model_name` label equals this (None keeps all).

    Returns:
        `{name: value}` for each requested name present: summed over label sets, except the
        fractions in `MEAN_OVER_LABELS`, which are averaged.

    Raises:
        EngineError: the text is not valid Prometheus exposition format.

    Examples:
        >>> parse_vllm_metrics('vllm:gpu_cache_usage_perc{engine="0"} 0.25\\n')
        {'vllm:kv_cache_usage_perc': 0.25}
        >>> parse_vllm_metrics('vllm:num_requests_waiting{model_name="a"} 4\\n', model_name="b")
        {}
    """
    names = tuple(names)
    wanted = set(names)
    legacy = {old: new for old, new in LEGACY_NAMES.items() if new in wanted}
    current: dict[str, list[float]] = defaultdict(list)
    older: dict[str, list[float]] = defaultdict(list)
    try:
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                if model_name is not None and sample.labels.get("model_name") != model_name:
                    continue
                value = float(sample.value)
                if math.isnan(value):
                    continue
                if sample.name in wanted:
                    current[sample.name].append(value)
                elif sample.name in legacy:
                    older[legacy[sample.name]].append(value)
    except ValueError as e:
        raise EngineError(
            f"malformed Prometheus exposition text ({e}); check that the URL is the server's "
            "/metrics endpoint"
        ) from e
    out: dict[str, float] = {}
    for name in (n for n in names if n in current or n in older):
        values = current.get(name) or older[name]
        out[name] = sum(values) / len(values) if name in MEAN_OVER_LABELS else sum(values)
    return out


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


# -- report helpers ---------------------------------------------------------------------------


def _series_by_source(
    samples: Iterable[EngineSample], name: str, source: str | None
) -> dict[str, list[tuple[float, float]]]:
    by_source: dict[str, list[tuple[float, float]]] = defaultdict(list)
    for s in samples:
        if s.name == name and (source is None or s.source == source):
            by_source[s.source].append((s.t_s, s.value))
    for points in by_source.values():
        points.sort(key=lambda p: p[0])  # stable: equal times keep recording order
    return by_source


def _check_window(fn: str, start_s: float, end_s: float) -> None:
    if end_s < start_s:
        raise ConfigError(f"{fn}: end_s ({end_s}) is before start_s ({start_s}); swap them")


def counter_delta(
    samples: Iterable[EngineSample],
    name: str,
    start_s: float,
    end_s: float,
    *,
    source: str | None = None,
) -> float:
    """How much a counter grew over `[start_s, end_s]`, summed over sources.

    The counter's value at `start_s` is the last sample at or before it (or, if there is none,
    the first sample inside the window: growth before the first observation is unknown). Every
    later sample up to `end_s` adds its increase; a decrease is a counter reset (the server
    restarted), which adds the new value, as Prometheus' `increase()` does.

    Args:
        samples: a timeline (e.g. `MetricsScraper.samples()` or a trace's samples).
        name: the counter, e.g. `vllm:prefix_cache_hits_total`.
        start_s / end_s: the window, on the samples' clock.
        source: only this source (None sums every source's own delta).

    Raises:
        ConfigError: `end_s < start_s`.

    Examples:
        >>> tl = [EngineSample(source="r", t_s=t, name="c", value=v)
        ...       for t, v in [(0, 10), (1, 15), (2, 3), (3, 8)]]
        >>> counter_delta(tl, "c", 0.5, 3.0)   # 10 → 15 (+5), reset to 3 (+3), → 8 (+5)
        13.0
    """
    _check_window("counter_delta", start_s, end_s)
    total = 0.0
    for points in _series_by_source(samples, name, source).values():
        prev: float | None = None
        for t, v in points:
            if t <= start_s:
                prev = v
                continue
            if t > end_s:
                break
            if prev is not None:
                total += v - prev if v >= prev else v
            prev = v
    return total


def gauge_time_average(
    samples: Iterable[EngineSample],
    name: str,
    start_s: float,
    end_s: float,
    *,
    source: str | None = None,
) -> float:
    """Time-weighted mean of a gauge over `[start_s, end_s]`, each sample holding until the next.

    Time before the first sample (when no sample is at or before `start_s`) is left out of the
    average. An empty window (`start_s == end_s`) gives the value holding at `start_s`.

    Args:
        samples: a timeline.
        name: the gauge, e.g. `vllm:kv_cache_usage_perc`.
        start_s / end_s: the window, on the samples' clock.
        source: the source to read; required when the samples hold several sources of `name`.

    Returns:
        The mean, or NaN when no sample covers any part of the window.

    Raises:
        ConfigError: `end_s < start_s`, or several sources and no `source` given.

    Examples:
        >>> tl = [EngineSample(source="r", t_s=t, name="g", value=v)
        ...       for t, v in [(0, 1.0), (1, 3.0)]]
        >>> gauge_time_average(tl, "g", 0.0, 2.0)
        2.0
    """
    _check_window("gauge_time_average", start_s, end_s)
    by_source = _series_by_source(samples, name, source)
    if len(by_source) > 1:
        raise ConfigError(
            f"gauge_time_average({name!r}): samples come from several sources "
            f"{sorted(by_source)}; pass source=... to pick one"
        )
    if not by_source:
        return math.nan
    points = next(iter(by_source.values()))
    area = 0.0
    covered = 0.0
    for i, (t, v) in enumerate(points):
        t_next = points[i + 1][0] if i + 1 < len(points) else math.inf
        lo, hi = max(t, start_s), min(t_next, end_s)
        if start_s == end_s and t <= start_s < t_next:
            return v
        if hi > lo:
            area += v * (hi - lo)
            covered += hi - lo
    return area / covered if covered > 0 else math.nan
