"""Recorded multi-turn session workloads: `Turn`, `Session`, `SessionSet` and their JSONL form.

One idea: a workload is *recorded once, then replayed identically for every policy*. A
`SessionSet` is immutable, saves to a canonical JSONL file (sorted keys, compact separators,
shortest round-trip floats, sessions in id order) and is identified by the SHA-256 of its session
lines (`content_hash`), so two sets with the same sessions have the same identity whatever
generator metadata they carry, and a loaded file is checked against the hash in its header.

Timing has two modes (`SessionSet.mode`):

- `"open"` (open loop, e.g. a recorded trace): every turn has `arrival_s`, the time it is sent
  whatever happened to earlier turns.
- `"closed"` (closed loop, e.g. SCBench-style users): turn 0 has `arrival_s` (the session's
  start); every later turn has `think_s`, the pause between the previous turn's completion and
  this turn's submission.

A turn's prompt is described the way engines see it: `num_prompt_tokens` and the hashes of its
`block_size`-token prefix blocks, covering the prompt with a partial last block at most
(`(n-1)*block_size < num_prompt_tokens <= n*block_size`, Mooncake's convention; an empty list is
allowed and means "no reusable prefix").

File layout: line 1 is a header `{"format": "maserve.sessions", "version": 1, "mode": ...,
"num_sessions": ..., "content_sha256": ..., "meta": {...}}`; every further line is one session
`{"session_id": ..., "turns": [{...}, ...]}`.

Examples:
    >>> t0 = Turn(0, num_prompt_tokens=40, num_output_tokens=8, prefix_block_hashes=(1, 2, 3),
    ...           block_size=16, arrival_s=0.0)
    >>> t1 = Turn(1, num_prompt_tokens=70, num_output_tokens=8,
    ...           prefix_block_hashes=(1, 2, 4, 5, 6), block_size=16, think_s=2.0)
    >>> s = SessionSet((Session("s0", (t0, t1)),), mode="closed")
    >>> s.num_turns, len(s.content_hash())
    (2, 64)
    >>> SessionSet.from_jsonl(s.to_jsonl()) == s
    True
"""

from __future__ import annotations

import hashlib
import itertools
import json
import math
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from maserve_prefect.errors import ConfigError

FORMAT = "maserve.sessions"
VERSION = 1
Mode = Literal["open", "closed"]
MODES: tuple[Mode, ...] = ("open", "closed")

__all__ = ["FORMAT", "MODES", "VERSION", "Mode", "Session", "SessionSet", "Turn"]


@dataclass(frozen=True, slots=True)
class Turn:
    """One request of a session.

    Attributes:
        turn_index: 0-based position in its session.
        num_prompt_tokens: prompt length (whole conversation so far plus the new query).
        num_output_tokens: answer length (replayed length-locked).
        prefix_block_hashes: one hash per `block_size`-token prompt block, in order.
        block_size: tokens per hash block (0 only with no hashes).
        arrival_s: when it is sent (open loop: every turn; closed loop: turn 0 only).
        think_s: closed loop, turns >= 1: pause after the previous turn completed.
        source: where the turn came from (e.g. a trace line), for traceability only.

    Raises:
        ConfigError: counts below 1, hashes that do not cover the prompt, or negative times.
    """

    turn_index: int
    num_prompt_tokens: int
    num_output_tokens: int
    prefix_block_hashes: tuple[int, ...] = ()
    block_size: int = 0
    arrival_s: float | None = None
    think_s: float | None = None
    source: str = ""

    def __post_init__(self) -> None:
        where = f"turn {self.turn_index}"
        if self.turn_index < 0:
            raise ConfigError(f"{where}: turn_index must be >= 0")
        if self.num_prompt_tokens < 1 or self.num_output_tokens < 1:
            raise ConfigError(
                f"{where}: need num_prompt_tokens >= 1 and num_output_tokens >= 1, got "
                f"{self.num_prompt_tokens} / {self.num_output_tokens}"
            )
        n = len(self.prefix_block_hashes)
        if n:
            bs = self.block_size
            if bs < 1 or not (n - 1) * bs < self.num_prompt_tokens <= n * bs:
                raise ConfigError(
                    f"{where}: {n} block hashes of {bs} tokens do not cover a "
                    f"{self.num_prompt_tokens}-token prompt (need (n-1)*block_size < "
                    "num_prompt_tokens <= n*block_size)"
                )
        for name in ("arrival_s", "think_s"):
            value = getattr(self, name)
            if value is not None and not (math.isfinite(value) and value >= 0):
                raise ConfigError(f"{where}: {name} must be a finite time >= 0, got {value}")

    def to_dict(self) -> dict[str, Any]:
        """The JSON object of this turn (None times left out)."""
        out: dict[str, Any] = {
            "turn_index": self.turn_index,
            "num_prompt_tokens": self.num_prompt_tokens,
            "num_output_tokens": self.num_output_tokens,
            "prefix_block_hashes": list(self.prefix_block_hashes),
            "block_size": self.block_size,
        }
        if self.arrival_s is not None:
            out["arrival_s"] = self.arrival_s
        if self.think_s is not None:
            out["think_s"] = self.think_s
        if self.source:
            out["source"] = self.source
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Turn:
        """Inverse of `to_dict`.

        Raises:
            ConfigError: a field is missing or has the wrong type.
        """
        try:
            return cls(
                turn_index=int(data["turn_index"]),
                num_prompt_tokens=int(data["num_prompt_tokens"]),
                num_output_tokens=int(data["num_output_tokens"]),
                prefix_block_hashes=tuple(int(h) for h in data.get("prefix_block_hashes", ())),
                block_size=int(data.get("block_size", 0)),
                arrival_s=_opt_float(data.get("arrival_s")),
                think_s=_opt_float(data.get("think_s")),
                source=str(data.get("source", "")),
            )
        except (KeyError, TypeError, ValueError) as exc:
            if isinstance(exc, ConfigError):
                raise
            raise ConfigError(f"bad turn record {dict(data)!r:.200}: {exc!r}") from None


def _opt_float(value: Any) -> float | None:
    return None if value is None else float(value)


@dataclass(frozen=True, slots=True)
class Session:
    """A conversation: turns in order (`turns[i].turn_index == i`).

    Raises:
        ConfigError: no turns, or turn indices out of order.
    """

    session_id: str
    turns: tuple[Turn, ...]

    def __post_init__(self) -> None:
        if not self.session_id:
            raise ConfigError("a session needs a non-empty session_id")
        if not self.turns:
            raise ConfigError(f"session {self.session_id!r} has no turns")
        for i, turn in enumerate(self.turns):
            if turn.turn_index != i:
                raise ConfigError(
                    f"session {self.session_id!r}: turn at position {i} has turn_index "
                    f"{turn.turn_index}; number turns 0, 1, 2, ... in order"
                )

    @property
    def start_s(self) -> float:
        """Arrival of the first turn (0.0 when unset)."""
        first = self.turns[0].arrival_s
        return 0.0 if first is None else first

    def request_id(self, turn_index: int) -> str:
        """The engine request id of one turn: `"<session_id>/t<index>"`."""
        return f"{self.session_id}/t{turn_index}"

    def to_dict(self) -> dict[str, Any]:
        """The JSON object of this session; turn t's hashes are stored as the number of leading
        hashes it shares with turn t-1 (`prev_blocks`) plus the rest."""
        turns = []
        prev: tuple[int, ...] = ()
        for t in self.turns:
            d = t.to_dict()
            cur = t.prefix_block_hashes
            k = _common_prefix(prev, cur)
            if k:
                d["prev_blocks"] = k
                d["prefix_block_hashes"] = list(cur[k:])
            turns.append(d)
            prev = cur
        return {"session_id": self.session_id, "turns": turns}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Session:
        """Inverse of `to_dict`.

        Raises:
            ConfigError: missing fields, or a `prev_blocks` longer than the previous turn's.
        """
        try:
            sid, raw_turns = str(data["session_id"]), list(data["turns"])
        except (KeyError, TypeError):
            raise ConfigError(
                f"bad session record {data!r:.200}: need session_id and turns"
            ) from None
        turns: list[Turn] = []
        prev: tuple[int, ...] = ()
        for raw in raw_turns:
            k = int(raw.get("prev_blocks", 0)) if isinstance(raw, Mapping) else 0
            if k:
                if k > len(prev):
                    raise ConfigError(
                        f"session {sid!r}: prev_blocks={k} but the previous turn has "
                        f"{len(prev)} block hashes"
                    )
                raw = {**raw, "prefix_block_hashes": [*prev[:k], *raw["prefix_block_hashes"]]}
            turn = Turn.from_dict(raw)
            turns.append(turn)
            prev = turn.prefix_block_hashes
        return cls(sid, tuple(turns))


def _common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    """Length of the longest common leading run of `a` and `b`."""
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


def _dumps(obj: Any) -> str:
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), allow_nan=False)


@dataclass(frozen=True, slots=True)
class SessionSet:
    """An immutable, replayable set of sessions (see the module docstring).

    Args:
        sessions: the sessions; stored sorted by id (ids must be unique).
        mode: "open" (every turn has `arrival_s`) or "closed" (turn 0 `arrival_s`, later turns
            `think_s`).
        meta: how the set was made (generator, parameters, seed, source file hash); saved in the
            header, not part of `content_hash`.

    Raises:
        ConfigError: unknown mode, duplicate ids, or a turn without the time its mode needs.
    """

    sessions: tuple[Session, ...]
    mode: Mode = "open"
    meta: Mapping[str, Any] = field(default_factory=dict, compare=False)

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise ConfigError(f"unknown session mode {self.mode!r}; use one of {MODES}")
        ordered = tuple(sorted(self.sessions, key=lambda s: s.session_id))
        object.__setattr__(self, "sessions", ordered)
        try:  # JSON-normal form (tuples become lists), so a loaded set's meta equals this one's
            object.__setattr__(self, "meta", json.loads(_dumps(dict(self.meta))))
        except (TypeError, ValueError) as exc:
            raise ConfigError(f"SessionSet meta must be JSON data: {exc}") from None
        for prev, cur in itertools.pairwise(ordered):
            if prev.session_id == cur.session_id:
                raise ConfigError(f"session id {cur.session_id!r} appears twice")
        for s in ordered:
            for t in s.turns:
                self._check_times(s, t)

    def _check_times(self, s: Session, t: Turn) -> None:
        where = f"session {s.session_id!r} turn {t.turn_index}"
        if self.mode == "open" and t.arrival_s is None:
            raise ConfigError(f"{where}: open-loop turns need arrival_s")
        if self.mode == "closed":
            if t.turn_index == 0 and t.arrival_s is None:
                raise ConfigError(f"{where}: a closed-loop session's first turn needs arrival_s")
            if t.turn_index > 0 and t.think_s is None:
                raise ConfigError(f"{where}: closed-loop turns after the first need think_s")

    def __iter__(self) -> Iterator[Session]:
        return iter(self.sessions)

    def __len__(self) -> int:
        return len(self.sessions)

    @property
    def num_turns(self) -> int:
        return sum(len(s.turns) for s in self.sessions)

    def session(self, session_id: str) -> Session:
        for s in self.sessions:
            if s.session_id == session_id:
                return s
        raise ConfigError(f"no session {session_id!r} in this set of {len(self)}")

    def subset(self, session_ids: Sequence[str], **meta: Any) -> SessionSet:
        """The sessions with these ids (same mode), with `meta` merged into this set's."""
        wanted = set(session_ids)
        missing = wanted - {s.session_id for s in self.sessions}
        if missing:
            raise ConfigError(f"subset names unknown sessions {sorted(missing)[:5]}")
        kept = tuple(s for s in self.sessions if s.session_id in wanted)
        return SessionSet(kept, self.mode, {**self.meta, **meta})

    # -- identity and files ----------------------------------------------------------------

    def _session_lines(self) -> list[str]:
        return [_dumps(s.to_dict()) for s in self.sessions]

    def content_hash(self) -> str:
        """SHA-256 (hex) of the mode and the canonical session lines: the workload's identity."""
        digest = hashlib.sha256(f"{FORMAT}/{VERSION}/{self.mode}\n".encode())
        for line in self._session_lines():
            digest.update(line.encode())
            digest.update(b"\n")
        return digest.hexdigest()

    def to_jsonl(self) -> str:
        """The canonical file text (header line, then one line per session)."""
        lines = self._session_lines()
        header = {
            "format": FORMAT,
            "version": VERSION,
            "mode": self.mode,
            "num_sessions": len(lines),
            "content_sha256": self.content_hash(),
            "meta": dict(self.meta),
        }
        return "\n".join([_dumps(header), *lines]) + "\n"

    def save(self, path: str | Path) -> Path:
        """Write the canonical JSONL file; the same set always writes the same bytes."""
        path = Path(path)
        path.write_text(self.to_jsonl(), encoding="utf-8")
        return path

    @classmethod
    def from_jsonl(cls, text: str, *, source: str = "(text)") -> SessionSet:
        """Parse a session file's text and check its content hash.

        Raises:
            ConfigError: not a session file, a bad line (named), or a content hash mismatch.
        """
        lines = [ln for ln in text.splitlines() if ln.strip()]
        if not lines:
            raise ConfigError(f"{source}: empty session file")
        try:
            header = json.loads(lines[0])
        except json.JSONDecodeError as exc:
            raise ConfigError(f"{source}:1: header is not JSON ({exc})") from None
        if not isinstance(header, dict) or header.get("format") != FORMAT:
            raise ConfigError(f"{source}:1: not a {FORMAT} file (header {lines[0][:80]!r})")
        if header.get("version") != VERSION:
            raise ConfigError(
                f"{source}:1: version {header.get('version')!r}; this code reads {VERSION}"
            )
        sessions = []
        for n, line in enumerate(lines[1:], start=2):
            try:
                sessions.append(Session.from_dict(json.loads(line)))
            except json.JSONDecodeError as exc:
                raise ConfigError(f"{source}:{n}: not JSON ({exc})") from None
            except ConfigError as exc:
                raise ConfigError(f"{source}:{n}: {exc}") from None
        out = cls(tuple(sessions), header.get("mode", "open"), header.get("meta") or {})
        want = header.get("content_sha256")
        if want is not None and want != out.content_hash():
            raise ConfigError(
                f"{source}: content hash {out.content_hash()[:12]} does not match the header's "
                f"{str(want)[:12]}; the file was edited or truncated — regenerate it"
            )
        return out

    @classmethod
    def load(cls, path: str | Path) -> SessionSet:
        """Read a file written by `save`.

        Raises:
            ConfigError: unreadable file, or any `from_jsonl` error (names the file and line).
        """
        path = Path(path)
        try:
            text = path.read_text(encoding="utf-8")
        except OSError as exc:
            raise ConfigError(f"cannot read session file {path}: {exc.strerror}") from exc
        return cls.from_jsonl(text, source=str(path))
