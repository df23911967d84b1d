"""Request-level latency: TTFT, TPOT / ITL and end-to-end latency of a trace's model calls.

The one idea: a load generator such as AIPerf reports per-request figures — time to first token,
time per output token, end-to-end latency — as mean and percentiles over the requests of a run.
The same figures come out of any Semantic Trace, from the times of its completed model ops:

- **TTFT** = `first_token_s − submitted_s` (on a real engine `submitted_s` is the moment the
  request was sent, `engines.openai.stream`);
- **TPOT** = `(completed_s − first_token_s) / (num_output_tokens − 1)`, for ops with two or more
  output tokens; the engine client records no per-chunk times, so this per-request mean gap is
  also the **ITL** (AIPerf's `inter_token_latency` is defined the same way, per request);
- **e2e** = `completed_s − submitted_s`.

Percentiles are numpy's linear ones (as AIPerf's); an op without the times a figure needs is left
out of that figure only.

Examples:
    >>> from maserve_prefect.trace.model import Manifest, OpKind, OpRecord, OpTimes, Trace
    >>> op = OpRecord(op_id="a", root_id="r", kind=OpKind.MODEL, num_output_tokens=3,
    ...               times=OpTimes(submitted_s=1.0, first_token_s=1.1, completed_s=1.5))
    >>> s = request_latencies(Trace(manifest=Manifest(trace_id="t"), ops=[op]))
    >>> round(s["ttft"].p50_ms, 3), round(s["tpot"].mean_ms, 3), round(s["e2e"].p99_ms, 3)
    (100.0, 200.0, 500.0)
"""

from __future__ import annotations

from collections.abc import Container, Sequence
from dataclasses import dataclass

import numpy as np

from maserve_prefect.trace.model import OpKind, OpStatus, Trace

__all__ = ["REQUEST_METRICS", "LatencyStats", "request_latencies", "request_samples_ms"]

REQUEST_METRICS = ("ttft", "tpot", "e2e")
"""The request-level figures, in report order (TPOT is also the per-request ITL)."""


@dataclass(frozen=True, slots=True)
class LatencyStats:
    """Mean and percentiles of one request-level figure, in milliseconds."""

    n: int
    mean_ms: float
    p50_ms: float
    p90_ms: float
    p99_ms: float

    @classmethod
    def of(cls, values_ms: Sequence[float]) -> LatencyStats | None:
        """The stats of `values_ms` (None when empty)."""
        if not values_ms:
            return None
        arr = np.asarray(values_ms, dtype=float)
        p50, p90, p99 = (float(v) for v in np.percentile(arr, (50, 90, 99)))
        return cls(len(arr), float(arr.mean()), p50, p90, p99)


def request_samples_ms(trace: Trace, roots: Container[str] | None = None) -> dict[str, list[float]]:
    """Per figure (`REQUEST_METRICS`), one value in ms per completed model op that has it; only
    ops of `roots` when given."""
    out: dict[str, list[float]] = {k: [] for k in REQUEST_METRICS}
    for op in trace.ops:
        if op.kind is not OpKind.MODEL or op.status is not OpStatus.COMPLETED:
            continue
        if roots is not None and op.root_id not in roots:
            continue
        t = op.times
        if t.submitted_s is None or t.completed_s is None:
            continue
        out["e2e"].append((t.completed_s - t.submitted_s) * 1e3)
        if t.first_token_s is None:
            continue
        out["ttft"].append((t.first_token_s - t.submitted_s) * 1e3)
        n = op.num_output_tokens or 0
        if n >= 2:
            out["tpot"].append((t.completed_s - t.first_token_s) * 1e3 / (n - 1))
    return out


def request_latencies(
    trace: Trace, roots: Container[str] | None = None
) -> dict[str, LatencyStats | None]:
    """Per figure, its stats over the completed model ops (of `roots` when given)."""
    return {k: LatencyStats.of(v) for k, v in request_samples_ms(trace, roots).items()}
