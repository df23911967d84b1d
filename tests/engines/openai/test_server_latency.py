"""vLLM's latency histograms over a window: parse, subtract, mean and bucket quantiles."""

from __future__ import annotations

import math

import pytest

from maserve_prefect.engines.openai.server_latency import (
    E2E,
    ITL,
    ITL_LEGACY,
    TTFT,
    ServerWindow,
    parse_histograms,
)
from maserve_prefect.errors import EngineError


def _text(name: str, buckets: dict[str, int], total: float, engine: str = "0") -> str:
    lines = [f'{name}_bucket{{engine="{engine}",le="{le}"}} {c}' for le, c in buckets.items()]
    n = max(buckets.values())
    return "\n".join([*lines, f'{name}_sum{{engine="{engine}"}} {total}',
                      f'{name}_count{{engine="{engine}"}} {n}']) + "\n"  # fmt: skip


def test_label_sets_are_summed_and_a_window_subtracts_the_earlier_scrape() -> None:
    before = parse_histograms(_text(TTFT, {"0.01": 1, "0.1": 2, "+Inf": 2}, 0.05))
    after = parse_histograms(
        _text(TTFT, {"0.01": 1, "0.1": 4, "+Inf": 5}, 0.5)
        + _text(TTFT, {"0.01": 0, "0.1": 1, "+Inf": 1}, 0.05, engine="1")
    )
    window = ServerWindow.between(before, after)
    assert window is not None
    h = window.get(TTFT)
    assert h is not None and h.count == 4.0 and math.isclose(h.sum_s, 0.5)
    assert dict(h.buckets) == {0.01: 0.0, 0.1: 3.0, math.inf: 4.0}
    row = window.row()
    assert row["requests"] == 4.0 and math.isclose(row["ttft_mean_ms"] or 0, 125.0)
    # 3 of 4 observations in (0.01, 0.1]: the median interpolates inside it; p99 is in +Inf
    assert math.isclose(row["ttft_p50_ms"] or 0, 1e3 * (0.01 + 0.09 * 2 / 3))
    assert row["ttft_p99_ms"] == pytest.approx(100.0)
    assert row["e2e_mean_ms"] is None and row["itl_p50_ms"] is None


def test_the_legacy_inter_token_histogram_stands_in_and_a_missing_scrape_gives_none() -> None:
    h = parse_histograms(_text(ITL_LEGACY, {"0.02": 2, "+Inf": 2}, 0.02))
    window = ServerWindow(h)
    assert window.get(ITL) is h[ITL_LEGACY] and window.row()["itl_mean_ms"] == pytest.approx(10.0)
    assert ServerWindow.between(None, h) is None and E2E not in h


def test_malformed_exposition_text_is_an_engine_error() -> None:
    with pytest.raises(EngineError, match="/metrics"):
        parse_histograms('vllm:time_to_first_token_seconds_bucket{le="0.1" 3\n')
