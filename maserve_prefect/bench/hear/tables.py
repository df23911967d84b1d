"""Rows of the HEAR suites, laid out like the paper's, with a "paper" column.

One idea: a suite produces plain row dicts (one per arm, per load level, per control-plane
operation); this module turns an `ArmRun` into its row and the control-plane recorder into
overhead rows; each experiment adds the paper's figures beside a row (Tables 3 and 4) and the
suite report renders them (`bench.report`, `metrics.report.markdown_table`).
Control-plane time (host CPU, `hear.overhead`) is measured per operation and
included in the end-to-end time as `makespan_incl_cp_s`: the virtual makespan plus every
control-plane second, as if each sat on the critical path (the harness runs them one at a time
between engine steps; an upper bound). Latencies stay in virtual time so reruns are identical;
`control_plane_share` says what the inclusion added. `followup_reuse` is the paper's reuse: cached /
prompt tokens over completed follow-up turns (every turn after a session's first); `reuse` counts
every turn; `reuse_host` is the part of `reuse` loaded back from the host KV tier, and
`host_load_s` the virtual seconds those PCIe loads added to the steps that admitted them (host
reuse is not free). `session_wait_*` is the paper's "session": per conversation, the total time
its user waited for responses (arrival to finish over its turns); `throughput_tpm` is turns per
minute.

Examples:
    >>> overhead_rows([])
    []
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from typing import Any

from maserve_prefect.bench.hear.arms import ArmRun
from maserve_prefect.replay.session_results import TurnResult

__all__ = [
    "WAIT_BINS_S",
    "arm_row",
    "capacity_line",
    "overhead_rows",
    "reuse_by_wait_rows",
    "reuse_of",
    "wait_reuse_rows",
]


def arm_row(run: ArmRun) -> dict[str, Any]:
    """The metric row of one arm (latencies in virtual seconds, overhead in host ms)."""
    res = run.result
    sess = res.session_time()
    wait = res.session_waiting()
    cp_ms = sum(s.total_ns for s in run.recorder.summary().values()) / 1e6
    host_tokens, host_s, host_n = run.host_tier_use()
    prompt = sum(t.num_prompt_tokens for t in res.completed())
    row: dict[str, Any] = {
        "policy": run.arm.name,
        "ttft_p50_s": res.ttft_percentile(50),
        "ttft_p95_s": res.ttft_percentile(95),
        "ttft_max_s": res.ttft_percentile(100),
        "makespan_s": res.makespan_s,
        "session_wait_mean_s": wait.mean,
        "session_wait_p50_s": wait.p50,
        "session_span_p50_s": sess.p50,
        "throughput_tpm": res.throughput_tpm,
        "followup_reuse": res.followup_reuse,
        "reuse": res.reuse,
        "reuse_host": host_tokens / prompt if prompt else 0.0,
        "host_load_s": host_s,
        "num_host_loads": host_n,
        "max_queue_s": max((t.queue_s for t in res.turns), default=0.0),
        "num_turns": len(res.turns),
        "num_completed": len(res.completed()),
        "num_priority_updates": run.ordering.num_updates,
        "num_intents": run.continuation.num_intents if run.continuation is not None else 0,
        "engine_policy": run.arm.engine_policy,
        "control_plane_ms": cp_ms,
        "makespan_incl_cp_s": res.makespan_s + cp_ms / 1e3,
        "control_plane_share": cp_ms / 1e3 / res.makespan_s if res.makespan_s > 0 else 0.0,
        "workload_sha256": res.content_hash,
    }
    return row


def capacity_line(run: ArmRun, distinct_prompt_tokens: int) -> str:
    """KV room per replica (GPU and host tier, in tokens) beside the workload's distinct prompt
    tokens: whether the working set fits decides whether ordering can change reuse at all."""
    rep = run.replicas[0] if run.replicas else None
    if rep is None:
        return ""
    bs = rep.config.block_size
    gpu = rep.kv.num_blocks * bs
    host = rep.hear.host
    host_tokens = host.capacity_blocks * bs if host is not None else 0
    return (
        f"KV room per replica: GPU {gpu:,} tokens, host tier {host_tokens:,} tokens; the "
        f"workload's distinct prompt tokens: {distinct_prompt_tokens:,} "
        f"({distinct_prompt_tokens / max(1, gpu + host_tokens):.2f}x GPU + host)"
    )


def overhead_rows(runs: Sequence[ArmRun]) -> list[dict[str, Any]]:
    """One row per (arm, control-plane operation): count, total, p50, p99, share of makespan."""
    out: list[dict[str, Any]] = []
    for run in runs:
        span = run.result.makespan_s
        for r in run.recorder.rows():
            total_ms = float(r["total_ms"])
            out.append(
                {
                    "policy": run.arm.name,
                    **r,
                    "per_turn_us": total_ms * 1e3 / max(1, len(run.result.turns)),
                    "share_of_makespan": total_ms / 1e3 / span if span > 0 else 0.0,
                }
            )
    return out


def wait_reuse_rows(runs: dict[str, ArmRun], wait_s: float) -> list[dict[str, Any]]:
    """Per arm, how waiting and reuse go together: the share of follow-up turns whose TTFT was at
    least `wait_s`, the share that sat in the engine's queue at least `wait_s` (those a
    Guard-`wait_s` protects: the two agree when prefill after admission is short), the follow-up
    reuse of the first and of the rest, and when the last session's first turn got its first
    token (how long the cold first-turn backlog took). When the follow-ups that waited `wait_s`
    find their context evicted, protecting them serves cold turns first."""
    out = []
    for name, run in runs.items():
        done = run.result.completed()
        follow = [t for t in done if t.turn_index > 0]
        late = [t for t in follow if (t.ttft_s or 0.0) >= wait_s]
        queued = [t for t in follow if _queue_s(t) >= wait_s]
        early = [t for t in follow if (t.ttft_s or 0.0) < wait_s]
        firsts = [(t.first_token_s or 0.0) - run.result.start_s for t in done if t.turn_index == 0]
        out.append({
            "policy": name,
            f"followups_waited_{wait_s:g}s_share": len(late) / len(follow) if follow else 0.0,
            f"followups_queued_{wait_s:g}s_share": len(queued) / len(follow) if follow else 0.0,
            f"reuse_waited_{wait_s:g}s": reuse_of(late),
            "reuse_waited_less": reuse_of(early),
            "last_first_turn_served_s": max(firsts, default=0.0),
        })  # fmt: skip
    return out


WAIT_BINS_S = (0.0, 10.0, 20.0, 30.0, 40.0, 45.0, 50.0, 60.0, 80.0, math.inf)
"""Follow-up TTFT bins of the reuse-by-wait curve (seconds)."""


def reuse_by_wait_rows(runs: dict[str, ArmRun]) -> list[dict[str, Any]]:
    """Per arm and follow-up TTFT bin (`WAIT_BINS_S`): how many follow-ups, and the reuse they
    found — the curve that shows how long a waiting session's context survives in the cache."""
    out = []
    for name, run in runs.items():
        follow = [t for t in run.result.completed() if t.turn_index > 0]
        for lo, hi in itertools.pairwise(WAIT_BINS_S):
            got = [t for t in follow if lo <= (t.ttft_s or 0.0) < hi]
            if got:
                out.append({"policy": name, "ttft_from_s": lo, "ttft_to_s": hi,
                            "num_followups": len(got), "reuse": reuse_of(got)})  # fmt: skip
    return out


def reuse_of(turns: list[TurnResult]) -> float:
    """Cached / prompt tokens over `turns` (NaN when there are none)."""
    prompt = sum(t.num_prompt_tokens for t in turns)
    return sum(t.num_cached_tokens for t in turns) / prompt if prompt else math.nan


def _queue_s(turn: TurnResult) -> float:
    start = turn.first_scheduled_s if turn.first_scheduled_s is not None else turn.first_token_s
    return (start if start is not None else turn.arrival_s) - turn.arrival_s
