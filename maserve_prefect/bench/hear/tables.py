"""Rows and tables of the HEAR suites, laid out like the paper's, with a "paper" column.

One idea: a suite produces plain row dicts (one per arm, per load level, per control-plane
operation); this module turns an `ArmRun` into its row, and rows into a markdown table whose last
column is the paper's figure for that row ("n/a" where the issue gives none), and writes the JSON
and markdown files. Control-plane time (host CPU, `hear.overhead`) is measured per operation and
included in the end-to-end time as `makespan_incl_cp_s`: the virtual makespan plus every
control-plane second, as if each sat on the critical path (the harness runs them one at a time
between engine steps; an upper bound). Latencies stay in virtual time so reruns are identical;
`control_plane_share` says what the inclusion added. `reuse` is cached / prompt tokens over completed turns;
`reuse_host` is the part of it loaded back from the host KV tier, and `host_load_s` the virtual
seconds those PCIe loads added to the steps that admitted them (host reuse is not free).

Examples:
    >>> print(markdown([{"policy": "fcfs", "ttft_p50_s": 1.23456, "paper": "n/a"}]))
    | policy | ttft_p50_s | paper |
    |---|---|---|
    | fcfs | 1.235 | n/a |
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from maserve_prefect.bench.hear.arms import ArmRun
from maserve_prefect.errors import ConfigError

__all__ = [
    "SuiteReport",
    "arm_row",
    "capacity_line",
    "load_scale",
    "markdown",
    "overhead_rows",
    "write_outputs",
]


def arm_row(run: ArmRun) -> dict[str, Any]:
    """The metric row of one arm (latencies in virtual seconds, overhead in host ms)."""
    res = run.result
    sess = res.session_time()
    cp_ms = sum(s.total_ns for s in run.recorder.summary().values()) / 1e6
    host_tokens, host_s, host_n = run.host_tier_use()
    prompt = sum(t.num_prompt_tokens for t in res.completed())
    row: dict[str, Any] = {
        "policy": run.arm.name,
        "ttft_p50_s": res.ttft_percentile(50),
        "ttft_p95_s": res.ttft_percentile(95),
        "ttft_max_s": res.ttft_percentile(100),
        "makespan_s": res.makespan_s,
        "session_p50_s": sess.p50,
        "session_mean_s": sess.mean,
        "throughput_rps": res.throughput_rps,
        "reuse": res.reuse,
        "reuse_host": host_tokens / prompt if prompt else 0.0,
        "host_load_s": host_s,
        "num_host_loads": host_n,
        "max_queue_s": max((t.queue_s for t in res.turns), default=0.0),
        "num_turns": len(res.turns),
        "num_completed": len(res.completed()),
        "recheck_demoted": run.order_hook.num_recheck_demoted,
        "control_plane_ms": cp_ms,
        "makespan_incl_cp_s": res.makespan_s + cp_ms / 1e3,
        "control_plane_share": cp_ms / 1e3 / res.makespan_s if res.makespan_s > 0 else 0.0,
        "workload_sha256": res.content_hash,
    }
    if run.retention_hook is not None:
        row["retains"] = run.retention_hook.num_retains
        row["releases"] = run.retention_hook.num_releases
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


def _cell(value: Any) -> str:
    if isinstance(value, bool):
        return str(value)
    if isinstance(value, float):
        if value != value:  # NaN
            return "n/a"
        return f"{value:.3f}" if abs(value) < 1e4 else f"{value:.0f}"
    if isinstance(value, str) and len(value) == 64:
        return value[:12]  # a content hash
    return str(value)


def markdown(rows: Sequence[Mapping[str, Any]], columns: Sequence[str] | None = None) -> str:
    """A markdown table of `rows` (columns: the first row's keys unless given)."""
    if not rows:
        return "(no rows)"
    cols = list(columns) if columns is not None else list(rows[0])
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for row in rows:
        lines.append("| " + " | ".join(_cell(row.get(c, "")) for c in cols) + " |")
    return "\n".join(lines)


def write_outputs(out_dir: Path, name: str, tables: Mapping[str, Any], text: str) -> list[Path]:
    """Write `<name>.json` (the tables) and `<name>.md` (the printed text) into `out_dir`."""
    out_dir.mkdir(parents=True, exist_ok=True)
    js = out_dir / f"{name}.json"
    js.write_text(json.dumps(tables, indent=2, sort_keys=True, default=str) + "\n")
    md = out_dir / f"{name}.md"
    md.write_text(text + "\n")
    return [js, md]


@dataclass(slots=True)
class SuiteReport:
    """A suite's tables (name -> rows), the printed text, and the files written."""

    name: str
    scale: str
    tables: dict[str, list[dict[str, Any]]]
    text: str
    files: list[Path] = field(default_factory=list)


def load_scale(path: Path, scale: str) -> dict[str, Any]:
    """A suite YAML's top-level mapping with `scales[scale]` merged over it (key by key).

    Raises:
        ConfigError: unreadable file, not a mapping, or an unknown scale.
    """
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError) as exc:
        raise ConfigError(f"suite {path}: cannot read ({exc})") from None
    if not isinstance(data, dict):
        raise ConfigError(f"suite {path}: the top level must be a mapping")
    scales = data.get("scales") or {}
    if scale not in scales:
        raise ConfigError(f"suite {path}: no scale {scale!r}; have {sorted(scales)}")
    merged = {k: v for k, v in data.items() if k != "scales"}
    for key, value in (scales[scale] or {}).items():
        if isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = {**merged[key], **value}
        else:
            merged[key] = value
    return merged
