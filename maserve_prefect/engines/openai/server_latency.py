"""The server's own view of request latency: vLLM's Prometheus histograms over a window.

The one idea: what a client measures (TTFT from its send) is the server's TTFT plus the client's
own overhead (building and sending the request, the HTTP hop, reading the first chunk). vLLM
keeps histograms of its side — `vllm:time_to_first_token_seconds` (from the request's arrival in
the engine), `vllm:e2e_request_latency_seconds`, and the inter-token histogram
(`vllm:inter_token_latency_seconds`, `vllm:time_per_output_token_seconds` in older releases) —
and a count of finished requests (`vllm:request_success_total`). Two scrapes of `/metrics`, one
before and one after a run, give the run's own histograms (`ServerWindow`): their count (how
many requests reached the server in the window), their means (sum / count, exact) and their
percentiles (interpolated inside the buckets, as Prometheus' `histogram_quantile`, so only as
fine as the bucket bounds).

Examples:
    >>> text = ('vllm:time_to_first_token_seconds_bucket{le="0.01"} 1\\n'
    ...         'vllm:time_to_first_token_seconds_bucket{le="0.1"} 3\\n'
    ...         'vllm:time_to_first_token_seconds_bucket{le="+Inf"} 3\\n'
    ...         'vllm:time_to_first_token_seconds_sum 0.12\\n'
    ...         'vllm:time_to_first_token_seconds_count 3\\n')
    >>> h = parse_histograms(text)[TTFT]
    >>> h.count, round(h.mean_s * 1e3, 1), round(h.quantile(0.5) * 1e3, 1)
    (3.0, 40.0, 32.5)
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

import httpx
from prometheus_client.parser import text_string_to_metric_families

from maserve_prefect.errors import EngineError

__all__ = [
    "E2E",
    "ITL",
    "ITL_LEGACY",
    "TTFT",
    "Histogram",
    "ServerWindow",
    "parse_histograms",
    "scrape_histograms",
]

TTFT = "vllm:time_to_first_token_seconds"
E2E = "vllm:e2e_request_latency_seconds"
ITL = "vllm:inter_token_latency_seconds"
ITL_LEGACY = "vllm:time_per_output_token_seconds"
HISTOGRAMS = (TTFT, E2E, ITL, ITL_LEGACY)


@dataclass(frozen=True, slots=True)
class Histogram:
    """One histogram summed over its label sets: cumulative bucket counts by upper bound."""

    buckets: tuple[tuple[float, float], ...]  # (le, cumulative count), ascending le
    sum_s: float
    count: float

    @property
    def mean_s(self) -> float | None:
        """Sum / count (None without observations)."""
        return self.sum_s / self.count if self.count > 0 else None

    def minus(self, earlier: Histogram | None) -> Histogram:
        """This histogram less an earlier scrape of the same one (the window between them)."""
        if earlier is None:
            return self
        before = dict(earlier.buckets)
        return Histogram(
            tuple((le, c - before.get(le, 0.0)) for le, c in self.buckets),
            self.sum_s - earlier.sum_s,
            self.count - earlier.count,
        )

    def quantile(self, q: float) -> float | None:
        """The `q` quantile, interpolated linearly inside its bucket (None when empty; the
        largest finite bound when it falls in the +Inf bucket)."""
        if self.count <= 0 or not self.buckets:
            return None
        rank = q * self.count
        lower_le, lower_c = 0.0, 0.0
        for le, c in self.buckets:
            if c >= rank:
                if math.isinf(le):
                    return lower_le
                width = c - lower_c
                return lower_le + (le - lower_le) * ((rank - lower_c) / width if width else 1.0)
            lower_le, lower_c = le, c
        return lower_le


def parse_histograms(text: str, names: Iterable[str] = HISTOGRAMS) -> dict[str, Histogram]:
    """The histograms `names` found in a Prometheus exposition text, summed over label sets.

    Raises:
        EngineError: the text is not valid exposition format.
    """
    wanted = set(names)
    buckets: dict[str, dict[float, float]] = defaultdict(lambda: defaultdict(float))
    sums: dict[str, float] = defaultdict(float)
    counts: dict[str, float] = defaultdict(float)
    try:
        for family in text_string_to_metric_families(text):
            for s in family.samples:
                base, _, suffix = s.name.rpartition("_")
                if base not in wanted:
                    continue
                if suffix == "bucket":
                    buckets[base][float(s.labels["le"])] += float(s.value)
                elif suffix == "sum":
                    sums[base] += float(s.value)
                elif suffix == "count":
                    counts[base] += float(s.value)
    except (ValueError, KeyError) as e:
        raise EngineError(
            f"malformed Prometheus exposition text ({e}); check that the URL is the server's "
            "/metrics endpoint"
        ) from e
    return {
        name: Histogram(tuple(sorted(buckets[name].items())), sums[name], counts[name])
        for name in counts
    }


def scrape_histograms(
    base_url: str,
    *,
    api_key: str = "EMPTY",
    headers: Mapping[str, str] | None = None,
    timeout_s: float = 10.0,
) -> dict[str, Histogram] | None:
    """The server's latency histograms now (None when `/metrics` does not answer with them)."""
    sent = {"Authorization": f"Bearer {api_key}"} | dict(headers or {})
    try:
        resp = httpx.get(f"{base_url}/metrics", headers=sent, timeout=timeout_s)
    except httpx.HTTPError:
        return None
    if resp.status_code != 200:
        return None
    try:
        found = parse_histograms(resp.text)
    except EngineError:
        return None
    return found or None


@dataclass(frozen=True, slots=True)
class ServerWindow:
    """The server's histograms over one run (after − before) and what they say.

    Examples:
        >>> h = Histogram(((0.1, 2.0), (math.inf, 2.0)), 0.1, 2.0)
        >>> ServerWindow({TTFT: h}).row()["ttft_mean_ms"]
        50.0
    """

    histograms: Mapping[str, Histogram]

    @classmethod
    def between(
        cls, before: Mapping[str, Histogram] | None, after: Mapping[str, Histogram] | None
    ) -> ServerWindow | None:
        """The window between two scrapes (None when either is missing)."""
        if before is None or after is None:
            return None
        return cls({k: h.minus(before.get(k)) for k, h in after.items()})

    def get(self, name: str) -> Histogram | None:
        """A histogram of the window (the legacy inter-token name stands in for ITL)."""
        h = self.histograms.get(name)
        if h is None and name == ITL:
            h = self.histograms.get(ITL_LEGACY)
        return h

    def row(self) -> dict[str, float | None]:
        """Requests, mean and p50 / p90 / p99 in ms of TTFT, inter-token and e2e latency."""
        out: dict[str, float | None] = {}
        ttft = self.get(TTFT)
        out["requests"] = ttft.count if ttft is not None else None
        for key, name in (("ttft", TTFT), ("itl", ITL), ("e2e", E2E)):
            h = self.get(name)
            mean = None if h is None else h.mean_s
            out[f"{key}_mean_ms"] = None if mean is None else mean * 1e3
            for q in (50, 90, 99):
                v = None if h is None else h.quantile(q / 100)
                out[f"{key}_p{q}_ms"] = None if v is None else v * 1e3
        return out
