"""Request-level latency from a trace's model ops: TTFT, TPOT / ITL, e2e."""

from __future__ import annotations

import pytest

from maserve_prefect.metrics.request import request_latencies, request_samples_ms
from maserve_prefect.trace.model import Manifest, OpKind, OpRecord, OpStatus, OpTimes, Trace


def _op(op_id: str, root: str, n: int, times: OpTimes, **kw: object) -> OpRecord:
    return OpRecord(op_id=op_id, root_id=root, kind=OpKind.MODEL, num_output_tokens=n,
                    times=times, **kw)  # type: ignore[arg-type]  # fmt: skip


def test_each_figure_counts_the_ops_that_have_its_times() -> None:
    ops = [
        _op("a", "r1", 5, OpTimes(submitted_s=0.0, first_token_s=0.1, completed_s=0.5)),
        _op("b", "r1", 1, OpTimes(submitted_s=1.0, first_token_s=1.3, completed_s=1.3)),
        _op("c", "r2", 3, OpTimes(submitted_s=2.0, completed_s=2.2)),  # no first token
        _op("d", "r2", 3, OpTimes(submitted_s=3.0), status=OpStatus.INCOMPLETE),
        _op("e", "r2", 3, OpTimes(submitted_s=4.0, first_token_s=4.1, completed_s=4.2),
            status=OpStatus.FAILED),
        OpRecord(op_id="t", root_id="r1", kind=OpKind.TOOL,
                 times=OpTimes(submitted_s=0.0, completed_s=9.0)),
    ]  # fmt: skip
    trace = Trace(manifest=Manifest(trace_id="t"), ops=ops)
    got = request_samples_ms(trace)
    assert got["e2e"] == pytest.approx([500.0, 300.0, 200.0])
    assert got["ttft"] == pytest.approx([100.0, 300.0])
    assert got["tpot"] == pytest.approx([100.0])  # (0.5 - 0.1) / (5 - 1); one token has none
    only_r2 = request_latencies(trace, roots={"r2"})
    assert only_r2["ttft"] is None and only_r2["e2e"] is not None and only_r2["e2e"].n == 1
    stats = request_latencies(trace)["e2e"]
    assert stats is not None and stats.p50_ms == pytest.approx(300.0)
    assert stats.mean_ms == pytest.approx(1000.0 / 3) and stats.p99_ms == pytest.approx(496.0)
