"""Pick vLLM's engine series out of a Prometheus `/metrics` exposition text.

The one idea: `parse_vllm_metrics` turns one exposition text into `{name: value}` under the
current vLLM sample names, which are also the simulator's series names (`engines.sim.step.records.
SERIES`), whatever the server's vLLM version or number of engine cores; a scrape (`metrics.py`)
and a wall-clock replica's state (`wall.py`) then read a real server the way reports read the
simulator.

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
from collections import defaultdict
from collections.abc import Iterable, Mapping

from prometheus_client.parser import text_string_to_metric_families

from maserve_prefect.errors import EngineError

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
