"""A Semantic Trace as AIPerf inputs: `mooncake_trace` JSONL files plus the map back to the ops.

The one idea: `plan_aiperf_export` is pure — it turns a trace into the lines of three files —
and `write_aiperf_export` only writes them, all or nothing (a temporary folder renamed into
place). What maps and what does not:

- **One request per model op** (`mooncake_trace.jsonl`, the exact schedule): each model op's
  final attempt that was submitted becomes one row — `timestamp` (its recorded submission, ms on
  the run's clock), `input_length`, `output_length`, `hash_ids` (512-token blocks) and a
  `session_id` of its own (the op id), so AIPerf's `conversation_id` names the op in its records.
  Replayed with `--fixed-schedule`, every request is sent at its recorded time with its recorded
  lengths; parallel ops stay parallel. Dependencies are kept only through those times (AIPerf
  does not wait for a predecessor): an open-loop replay of the recorded schedule.
- **Multi-call roots as sessions** (`mooncake_sessions.jsonl`): one AIPerf session per root
  (`session_id` = root id), its model ops as turns in submission order; the first turn has the
  `timestamp`, each later turn a `delay` = recorded gap between the previous turn's completion
  and its own submission. AIPerf sends a session's turns one after another, so a root's DAG
  parallelism is serialized, and (its default context mode for synthetic prompts) it prepends
  the earlier turns and their live replies to each turn: a later turn's `input_length` is
  therefore its *new* tokens (recorded prompt minus the previous prompt and reply) when the
  recorded prompts grow that way, else its whole prompt (counted in `num_non_cumulative`).
  AIPerf's conversation-DAG mode (forks / spawns without joins) is not written.
- Tool, transform and state ops are not requests: they are left out (counted), and a model
  op's dependencies through them are collapsed onto the nearest model ops in the map.
- `maserve_map.jsonl` maps every request back to its op (op id, root, workflow, class, the
  root's arrival, deps among exported ops, whether it is the root's final op), for
  `maserve trace import-aiperf --schedule DIR`.

`hash_ids` follow `trace.mooncake`'s convention (`(n-1)*512 < input_length <= n*512`): an op's
recorded prefix-block hashes when it has them at 512 tokens, else fresh ids (no sharing
assumed) numbered after the largest recorded one. Timestamps are written so that
`timestamp / 1000` is exactly the op's `submitted_s`, so `maserve trace import-mooncake` reads
back each op's submission time, lengths and hashes unchanged.

Examples:
    >>> from maserve_prefect.trace.model import Manifest, OpKind, OpRecord, OpTimes, RootRecord, Trace
    >>> op = OpRecord(op_id="r/0", root_id="r", kind=OpKind.MODEL, num_input_tokens=600,
    ...               num_output_tokens=5, times=OpTimes(submitted_s=0.25, completed_s=1.0))
    >>> plan = plan_aiperf_export(Trace(manifest=Manifest(trace_id="t"),
    ...                                 roots=[RootRecord(root_id="r")], ops=[op]))
    >>> plan.requests[0]
    {'timestamp': 250, 'input_length': 600, 'output_length': 5, 'hash_ids': [0, 1], 'session_id': 'r/0'}
"""

from __future__ import annotations

import json
import math
import os
import shutil
import tempfile
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from maserve_prefect.errors import BundleExistsError, TraceValidationError
from maserve_prefect.trace.model import OpKind, OpRecord, Trace

AIPERF_BLOCK_SIZE = 512
"""Tokens per `hash_ids` block in AIPerf's and Mooncake's traces."""
REQUESTS_FILE = "mooncake_trace.jsonl"
SESSIONS_FILE = "mooncake_sessions.jsonl"
MAP_FILE = "maserve_map.jsonl"
README_FILE = "README.txt"

Row = dict[str, Any]


@dataclass(slots=True)
class AiperfExport:
    """The lines of the AIPerf input files for one trace (see the module docstring).

    Attributes:
        trace_id: the exported trace.
        requests: `mooncake_trace.jsonl` rows, one per exported model op, by timestamp.
        sessions: `mooncake_sessions.jsonl` rows, one session per root, turns in order.
        op_map: `maserve_map.jsonl` rows, one per exported op (same order as `requests`).
        num_not_model: ops left out because they are not model calls.
        num_unsent: model ops left out because they were never submitted (no `submitted_s`).
        num_non_cumulative: session turns whose prompt does not contain the previous turn's
            prompt and reply (written with their whole prompt).
    """

    trace_id: str
    requests: list[Row] = field(default_factory=list)
    sessions: list[Row] = field(default_factory=list)
    op_map: list[Row] = field(default_factory=list)
    num_not_model: int = 0
    num_unsent: int = 0
    num_non_cumulative: int = 0

    @property
    def num_multi_call_roots(self) -> int:
        """Roots with more than one exported model op (sessions of several turns)."""
        return sum(1 for r in self.sessions if r.get("_turn") == 1)


def ms_of(t_s: float) -> int | float:
    """A millisecond timestamp whose `/ 1000` is `t_s` (an int when one exists).

    Exact for every time on the millisecond grid (every Mooncake trace) and for most others;
    about 2% of arbitrary floats have no float `m` with `m / 1000 == t_s`, and get the nearest
    (one ulp, < 2.3e-16 relative, away).

    Examples:
        >>> ms_of(0.005), ms_of(1.2345)
        (5, 1234.5)
        >>> all(ms_of(t) / 1000 == t for t in (0.1, 0.7000000000000001, 3.3333333333))
        True
    """
    v = t_s * 1000.0
    r = round(v)
    if r / 1000.0 == t_s:
        return int(r)
    cand = v
    for _ in range(4):  # v is within an ulp or two of the exact value
        if cand / 1000.0 == t_s:
            return cand
        cand = math.nextafter(cand, math.inf if cand / 1000.0 < t_s else -math.inf)
    return v


def _blocks(num_tokens: int) -> int:
    return -(-num_tokens // AIPERF_BLOCK_SIZE)


def _recorded_hashes(op: OpRecord) -> list[int] | None:
    """The op's prefix-block hashes when they are 512-token blocks that cover its prompt."""
    hashes = list(op.prefix_block_hashes)
    if not hashes or (op.block_size or AIPERF_BLOCK_SIZE) != AIPERF_BLOCK_SIZE:
        return None
    n = len(hashes)
    if not (n - 1) * AIPERF_BLOCK_SIZE < op.num_input_tokens <= n * AIPERF_BLOCK_SIZE:
        return None
    return hashes


def _final_attempts(ops: Iterable[OpRecord]) -> dict[str, OpRecord]:
    out: dict[str, OpRecord] = {}
    for op in ops:
        if op.op_id not in out or op.attempt >= out[op.op_id].attempt:
            out[op.op_id] = op
    return out


def _model_deps(
    op_id: str, finals: dict[str, OpRecord], exported: set[str], memo: dict[str, list[str]]
) -> list[str]:
    """The exported model ops `op_id` depends on, looking through non-exported ops."""
    if op_id in memo:
        return memo[op_id]
    memo[op_id] = []  # a cycle (invalid trace) ends here instead of recursing forever
    found: list[str] = []
    for dep in finals[op_id].deps if op_id in finals else ():
        if dep.op_id in exported:
            chain = [dep.op_id]
        else:
            chain = _model_deps(dep.op_id, finals, exported, memo)
        found.extend(d for d in chain if d not in found)
    memo[op_id] = found
    return found


def plan_aiperf_export(trace: Trace) -> AiperfExport:
    """The AIPerf input rows of `trace` (see the module docstring).

    Raises:
        TraceValidationError: an exported op was submitted before time 0 (AIPerf timestamps are
            ms since the schedule's start), or a root id equals an op id (the map would be
            ambiguous).
    """
    finals = _final_attempts(trace.ops)
    order = {op_id: i for i, op_id in enumerate(finals)}
    out = AiperfExport(trace_id=trace.manifest.trace_id)
    sent: list[OpRecord] = []
    for op in finals.values():
        if op.kind is not OpKind.MODEL:
            out.num_not_model += 1
        elif op.times.submitted_s is None:
            out.num_unsent += 1
        elif op.times.submitted_s < 0:
            raise TraceValidationError(
                f"trace {out.trace_id!r}: op {op.op_id!r} was submitted at "
                f"{op.times.submitted_s} s, before time 0; AIPerf timestamps are ms since the "
                "schedule's start, so shift the trace's times to start at 0 or later"
            )
        else:
            sent.append(op)
    sent.sort(key=lambda o: (o.times.submitted_s or 0.0, order[o.op_id]))
    root_ids = {r.root_id for r in trace.roots} | {o.root_id for o in sent}
    clash = sorted(root_ids & {o.op_id for o in sent})
    if clash:
        raise TraceValidationError(
            f"trace {out.trace_id!r}: {clash[0]!r} is both a root id and an op id; AIPerf "
            "session ids must tell them apart, so rename one"
        )
    next_id = 1 + max((h for o in sent for h in (_recorded_hashes(o) or ())), default=-1)
    exported = {o.op_id for o in sent}
    memo: dict[str, list[str]] = {}
    roots = {r.root_id: r for r in trace.roots}
    hashes: dict[str, list[int]] = {}
    for op in sent:
        ids = _recorded_hashes(op)
        if ids is None:
            ids = list(range(next_id, next_id + _blocks(op.num_input_tokens)))
            next_id += len(ids)
        hashes[op.op_id] = ids
        out.requests.append(
            {
                "timestamp": ms_of(op.times.submitted_s or 0.0),
                "input_length": op.num_input_tokens,
                "output_length": op.num_output_tokens,
                "hash_ids": ids,
                "session_id": op.op_id,
            }
        )
    turns: dict[str, list[OpRecord]] = {}
    for op in sent:
        turns.setdefault(op.root_id, []).append(op)
    turn_of: dict[str, int] = {}
    for root_id, ops in turns.items():
        for k, op in enumerate(ops):
            turn_of[op.op_id] = k
            out.sessions.append(_session_row(root_id, k, ops, hashes[op.op_id], out))
    for op in sent:
        root = roots.get(op.root_id)
        out.op_map.append(
            {
                "trace_id": out.trace_id,
                "op_id": op.op_id,
                "root_id": op.root_id,
                "workflow": root.workflow if root else "",
                "workload_class": root.workload_class if root else "",
                "final": root is not None and root.final_op_id == op.op_id,
                "deps": _model_deps(op.op_id, finals, exported, memo),
                "request_session": op.op_id,
                "root_session": op.root_id,
                "turn": turn_of[op.op_id],
                "timestamp": ms_of(op.times.submitted_s or 0.0),
                "root_arrival": ms_of(max(0.0, root.arrival_s)) if root else None,
            }
        )
    return out


def _session_row(
    root_id: str, k: int, ops: list[OpRecord], ids: list[int], out: AiperfExport
) -> Row:
    """Turn `k` of root `root_id`'s session (see the module docstring)."""
    op = ops[k]
    sub = op.times.submitted_s or 0.0
    if k == 0:
        return {
            "session_id": root_id,
            "timestamp": ms_of(sub),
            "input_length": op.num_input_tokens,
            "output_length": op.num_output_tokens,
            "hash_ids": ids,
        }
    prev = ops[k - 1]
    after = prev.times.completed_s if prev.times.completed_s is not None else prev.times.submitted_s
    delay_ms = max(0.0, (sub - (after or 0.0)) * 1000.0)
    new_tokens = op.num_input_tokens - prev.num_input_tokens - prev.num_output_tokens
    if new_tokens < 1:
        out.num_non_cumulative += 1
        new_tokens = op.num_input_tokens
    return {
        "session_id": root_id,
        "delay": round(delay_ms, 6),
        "input_length": new_tokens,
        "output_length": op.num_output_tokens,
        "_turn": k,
    }


def readme_text(plan: AiperfExport, folder: Path) -> str:
    """README.txt of an export folder: what each file is and the commands to run it."""
    req, ses = folder / REQUESTS_FILE, folder / SESSIONS_FILE
    return f"""AIPerf inputs for maserve trace {plan.trace_id}
written by `maserve trace export --aiperf {folder}`

{REQUESTS_FILE}  {len(plan.requests)} requests, one per model op (mooncake_trace format:
    timestamp ms, input_length, output_length, hash_ids of 512-token blocks, session_id = op id).
    Sent at the recorded submission times; dependencies kept only through those times.
{SESSIONS_FILE}  the same ops as one session per root (first turn timestamp, later turns
    delay after the previous reply); turns of a root run one after another (DAG parallelism is
    serialized) and later turns carry only their new tokens (turns whose prompt did not grow
    that way carry their whole prompt: {plan.num_non_cumulative}).
{MAP_FILE}  each request's op, root, class and dependencies, for import-aiperf.
Left out: non-model ops (tools, transforms, state): {plan.num_not_model}; model ops never
submitted: {plan.num_unsent}.

Replay the recorded schedule (MODEL / TOKENIZER / URL are yours):

  aiperf profile --model MODEL --tokenizer TOKENIZER --url URL \\
      --endpoint-type chat --streaming \\
      --input-file {req} \\
      --custom-dataset-type mooncake_trace --fixed-schedule

Or the roots as sessions:

  aiperf profile --model MODEL --tokenizer TOKENIZER --url URL \\
      --endpoint-type chat --streaming \\
      --input-file {ses} \\
      --custom-dataset-type mooncake_trace --fixed-schedule

Then read AIPerf's per-request records back into the maserve ledger:

  maserve trace import-aiperf artifacts/<run>/profile_export.jsonl --schedule {folder}
"""


def _jsonl(rows: Iterable[Row]) -> str:
    return "".join(
        json.dumps({k: v for k, v in r.items() if not k.startswith("_")}, separators=(", ", ": "))
        + "\n"
        for r in rows
    )


def write_aiperf_export(plan: AiperfExport, folder: Path, *, overwrite: bool = False) -> Path:
    """Write `plan`'s files into `folder`, all or nothing; return the folder.

    Raises:
        BundleExistsError: `folder` exists and is not empty, and `overwrite` is False.
    """
    folder = Path(folder)
    if folder.exists() and any(folder.iterdir()) and not overwrite:
        raise BundleExistsError(
            f"--aiperf {folder}: the folder exists and is not empty; pass --force to replace it "
            "or give a new folder"
        )
    folder.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{folder.name}.", dir=folder.parent))
    try:
        (tmp / REQUESTS_FILE).write_text(_jsonl(plan.requests), encoding="utf-8")
        (tmp / SESSIONS_FILE).write_text(_jsonl(plan.sessions), encoding="utf-8")
        (tmp / MAP_FILE).write_text(_jsonl(plan.op_map), encoding="utf-8")
        (tmp / README_FILE).write_text(readme_text(plan, folder), encoding="utf-8")
        if folder.exists():
            shutil.rmtree(folder)
        os.replace(tmp, folder)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return folder
