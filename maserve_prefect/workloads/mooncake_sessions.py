"""Sessions inferred from a Mooncake-format trace, a 15-minute window, and 50 / 75 / 100 % loads.

One idea: a Mooncake trace has no session field, but a conversation's next request repeats its
previous prompt — so its `hash_ids` start with the previous request's. Requests are taken in
arrival order (ties: file line) and each one either continues an open session or starts a new one:

    Request r *continues* session S (whose latest request, its *tail*, is t) iff
      1. r arrives at most `max_gap_s` after t;
      2. L = the longest common leading run of t's and r's `hash_ids` has L >= `min_shared_blocks`
         and L >= `min_shared_fraction` * len(t.hash_ids) (t's hash list being a proper prefix of
         r's is the case L = len(t.hash_ids); usually L = len(t.hash_ids) - 1, because t's last,
         partial block is completed by the answer and the new query);
      3. with `require_growth`, also r.input_length >= t.input_length + t.output_length (the new
         prompt holds the old one and its answer — this tells a conversation's next turn from
         another query over the same shared document).
    Among eligible sessions r joins the one with the largest L, then the latest tail, then the
    smallest session id. Otherwise r starts a new session. A session has one tail, so a second
    request branching off an older turn starts its own session (its hashes still carry the
    reuse).

Sessions are named after their first request's line (`mcs-000017`). Rows the importer rejects are
counted and skipped, as are rows with an empty prompt; a 0-token output is replayed as 1 token
(an engine samples at least one) and counted. Turns keep the recorded timestamps as open-loop
arrivals (`arrival_s = timestamp / 1000`).

Load levels: `select_window` keeps the sessions that *start* in `[start_s, start_s + window_s)`
(whole sessions, later turns included); `load_levels` draws one seeded permutation of their ids
and keeps its first ceil(f * n) for each fraction f, so the 50 % set is a subset of the 75 % set,
which is a subset of the 100 % set, and the same seed always gives the same sets.

The format is Mooncake's (`timestamp`, `input_length`, `output_length`, `hash_ids`), so
conversation and tool-agent traces in that format work the same way.

Examples:
    >>> import pathlib, tempfile
    >>> p = pathlib.Path(tempfile.mkdtemp()) / "t.jsonl"
    >>> rows = ['{"timestamp": 0, "input_length": 700, "output_length": 5, "hash_ids": [1, 2]}',
    ...         '{"timestamp": 10, "input_length": 600, "output_length": 5, "hash_ids": [1, 3]}',
    ...         '{"timestamp": 20, "input_length": 1500, "output_length": 5, '
    ...         '"hash_ids": [1, 2, 4]}']
    >>> _ = p.write_text("\\n".join(rows) + "\\n")
    >>> inf = infer_sessions(p)
    >>> [(s.session_id, [t.source for t in s.turns]) for s in inf.sessions]
    [('mcs-000001', ['line 1', 'line 2', 'line 3'])]
    >>> grown = infer_sessions(p, SessionRule(require_growth=True))
    >>> [(s.session_id, [t.source for t in s.turns]) for s in grown.sessions]
    [('mcs-000001', ['line 1', 'line 3']), ('mcs-000002', ['line 2'])]
"""

from __future__ import annotations

import math
from collections import Counter, defaultdict
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from maserve_prefect.errors import ConfigError
from maserve_prefect.trace.model import OpKind
from maserve_prefect.trace.mooncake import MOONCAKE_BLOCK_SIZE, import_mooncake
from maserve_prefect.workloads.sessions import Session, SessionSet, Turn

__all__ = [
    "InferredSessions",
    "SessionRule",
    "infer_sessions",
    "load_levels",
    "mooncake_load_levels",
    "select_window",
]

LOAD_FRACTIONS = (0.5, 0.75, 1.0)
WINDOW_S = 15 * 60.0


@dataclass(frozen=True, slots=True)
class SessionRule:
    """Parameters of the continuation rule (see the module docstring).

    Attributes:
        max_gap_s: longest pause between a session's consecutive requests.
        min_shared_blocks: least shared leading blocks to continue a session.
        min_shared_fraction: least share of the tail's blocks the new request repeats.
        require_growth: the new prompt must be at least the tail's prompt plus its answer.

    Raises:
        ConfigError: a gap that is not positive, `min_shared_blocks < 1`, or a fraction outside
            (0, 1].
    """

    max_gap_s: float = 600.0
    min_shared_blocks: int = 1
    min_shared_fraction: float = 0.5
    require_growth: bool = False

    def __post_init__(self) -> None:
        if not self.max_gap_s > 0:
            raise ConfigError(f"SessionRule: max_gap_s must be > 0, got {self.max_gap_s}")
        if self.min_shared_blocks < 1:
            raise ConfigError(
                f"SessionRule: min_shared_blocks must be >= 1, got {self.min_shared_blocks}"
            )
        if not 0 < self.min_shared_fraction <= 1:
            raise ConfigError(
                "SessionRule: min_shared_fraction must be in (0, 1], got "
                f"{self.min_shared_fraction}"
            )


@dataclass(frozen=True, slots=True)
class _Row:
    line: int
    arrival_s: float
    num_in: int
    num_out: int
    hashes: tuple[int, ...]


@dataclass(slots=True)
class InferredSessions:
    """What `infer_sessions` found.

    Attributes:
        session_set: every inferred session, open loop.
        rule: the rule used.
        num_rows: non-blank rows read; `num_rejected` of them the importer rejected and
            `num_empty` had an empty prompt (both skipped).
        num_padded_outputs: turns whose recorded output of 0 tokens is replayed as 1.
    """

    session_set: SessionSet
    rule: SessionRule
    num_rows: int
    num_rejected: int
    num_empty: int
    num_padded_outputs: int

    @property
    def sessions(self) -> tuple[Session, ...]:
        return self.session_set.sessions

    @property
    def num_turns(self) -> int:
        return self.session_set.num_turns

    def turns_histogram(self) -> dict[int, int]:
        """Turns per session -> number of sessions, by turn count."""
        return dict(sorted(Counter(len(s.turns) for s in self.sessions).items()))

    def summary(self) -> dict[str, float]:
        """Sessions, turns, multi-turn sessions, mean / p50 / p90 / max turns per session."""
        counts = np.array([len(s.turns) for s in self.sessions], dtype=float)
        return {
            "num_sessions": float(counts.size),
            "num_turns": float(counts.sum()),
            "num_multi_turn_sessions": float((counts > 1).sum()),
            "mean_turns": float(counts.mean()),
            "p50_turns": float(np.percentile(counts, 50)),
            "p90_turns": float(np.percentile(counts, 90)),
            "max_turns": float(counts.max()),
        }


def _read_rows(path: Path, block_size: int) -> tuple[list[_Row], int, int]:
    imported = import_mooncake(path, block_size=block_size)
    rows = []
    for op in imported.trace.ops:
        if op.kind is not OpKind.MODEL:
            continue
        assert op.times.submitted_s is not None  # the importer sets it from the timestamp
        line = int(op.root_id.rsplit("-", 1)[1])
        rows.append(
            _Row(
                line,
                op.times.submitted_s,
                op.num_input_tokens,
                op.num_output_tokens,
                tuple(op.prefix_block_hashes),
            )
        )
    rows.sort(key=lambda r: (r.arrival_s, r.line))
    return rows, imported.num_rows, len(imported.rejected)


def _common_prefix(a: tuple[int, ...], b: tuple[int, ...]) -> int:
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


def _group(rows: Sequence[_Row], rule: SessionRule) -> list[list[_Row]]:
    """Apply the continuation rule; sessions in order of their first request."""
    sessions: list[list[_Row]] = []
    by_first: dict[int, list[int]] = defaultdict(list)  # first hash -> sessions (tails share it)
    for r in rows:
        best: tuple[int, float, int] | None = None  # (L, tail arrival, -session index)
        cands = by_first.get(r.hashes[0], [])
        live = []
        for idx in cands:
            tail = sessions[idx][-1]
            if r.arrival_s - tail.arrival_s > rule.max_gap_s:
                continue  # expired for good: arrivals only grow
            live.append(idx)
            shared = _common_prefix(tail.hashes, r.hashes)
            if shared < rule.min_shared_blocks:
                continue
            if shared < rule.min_shared_fraction * len(tail.hashes):
                continue
            if rule.require_growth and r.num_in < tail.num_in + tail.num_out:
                continue
            key = (shared, tail.arrival_s, -idx)
            if best is None or key > best:
                best = key
        if cands:
            by_first[r.hashes[0]] = live
        if best is not None:
            sessions[-best[2]].append(r)
        else:
            by_first[r.hashes[0]].append(len(sessions))
            sessions.append([r])
    return sessions


def infer_sessions(
    path: str | Path,
    rule: SessionRule | None = None,
    *,
    block_size: int = MOONCAKE_BLOCK_SIZE,
) -> InferredSessions:
    """Group a Mooncake-format trace's requests into sessions (rule: the module docstring).

    Args:
        path: the JSONL trace.
        rule: the continuation rule (defaults: `SessionRule()`).
        block_size: tokens per `hash_ids` block (512 in the FAST'25 traces).

    Raises:
        TraceImportError: the file cannot be read.
        ConfigError: no usable row.
    """
    path = Path(path)
    rule = rule if rule is not None else SessionRule()
    rows, num_rows, num_rejected = _read_rows(path, block_size)
    usable = [r for r in rows if r.num_in >= 1 and r.hashes]
    if not usable:
        raise ConfigError(f"{path}: no usable request rows (read {num_rows}, {num_rejected} bad)")
    groups = _group(usable, rule)
    sessions = []
    padded = 0
    for g in groups:
        turns = []
        for i, r in enumerate(g):
            padded += r.num_out < 1
            turns.append(
                Turn(
                    i,
                    num_prompt_tokens=r.num_in,
                    num_output_tokens=max(r.num_out, 1),
                    prefix_block_hashes=r.hashes,
                    block_size=block_size,
                    arrival_s=r.arrival_s,
                    source=f"line {r.line}",
                )
            )
        sessions.append(Session(f"mcs-{g[0].line:06d}", tuple(turns)))
    meta = {
        "generator": "mooncake_sessions",
        "source": path.name,
        "rule": asdict(rule),
        "block_size": block_size,
    }
    sset = SessionSet(tuple(sessions), "open", meta)
    return InferredSessions(sset, rule, num_rows, num_rejected, len(rows) - len(usable), padded)


def select_window(sset: SessionSet, start_s: float = 0.0, window_s: float = WINDOW_S) -> SessionSet:
    """The sessions whose first turn arrives in `[start_s, start_s + window_s)` (whole sessions).

    Raises:
        ConfigError: `window_s <= 0`, or no session starts in the window.
    """
    if not window_s > 0:
        raise ConfigError(f"select_window: window_s must be > 0, got {window_s}")
    end_s = start_s + window_s
    ids = [s.session_id for s in sset if start_s <= s.start_s < end_s]
    if not ids:
        raise ConfigError(
            f"no session starts in [{start_s}, {end_s}) s; sessions start between "
            f"{min(s.start_s for s in sset)} and {max(s.start_s for s in sset)} s"
        )
    return sset.subset(ids, window_start_s=start_s, window_s=window_s)


def load_levels(
    sset: SessionSet, fractions: Sequence[float] = LOAD_FRACTIONS, *, seed: int = 0
) -> dict[float, SessionSet]:
    """Nested seeded subsets of whole sessions: fraction -> the first ceil(f * n) of one
    permutation of the ids (so a smaller fraction's set is inside every larger one's).

    Raises:
        ConfigError: a fraction outside (0, 1].

    Examples:
        >>> t = Turn(0, 1, 1, arrival_s=0.0)
        >>> sset = SessionSet(tuple(Session(f"s{i}", (t,)) for i in range(4)))
        >>> {f: len(s) for f, s in load_levels(sset, (0.5, 1.0)).items()}
        {0.5: 2, 1.0: 4}
    """
    for f in fractions:
        if not 0 < f <= 1:
            raise ConfigError(f"load fraction {f} is outside (0, 1]")
    ids = [s.session_id for s in sset]  # SessionSet keeps them sorted
    order = np.random.default_rng(seed).permutation(len(ids))
    out = {}
    for f in sorted(fractions):
        k = math.ceil(f * len(ids) - 1e-9)
        out[f] = sset.subset([ids[i] for i in order[:k]], load_fraction=f, load_seed=seed)
    return out


def mooncake_load_levels(
    path: str | Path,
    *,
    rule: SessionRule | None = None,
    start_s: float = 0.0,
    window_s: float = WINDOW_S,
    fractions: Sequence[float] = LOAD_FRACTIONS,
    seed: int = 0,
) -> dict[float, SessionSet]:
    """Infer sessions, keep those starting in the window, and subsample them per fraction."""
    inferred = infer_sessions(path, rule)
    return load_levels(select_window(inferred.session_set, start_s, window_s), fractions, seed=seed)
