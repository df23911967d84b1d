"""The frozen, versioned role -> execution-mode mapping, its JSON file, and its ledger.

One idea: a mapping is calibrated once (`mode_calibration.calibrate`), then frozen: it carries a
version and a SHA-256 content hash over its canonical JSON, the file repeats the hash, and
`load` refuses a file whose content no longer matches it — so a run can name exactly which
mapping it used, and a hand-edited file cannot pass as the calibrated one. Writes are atomic
(temporary file in the same folder, fsync, rename). `ModeLedger` records, per request, the
mode the mapping asked for and the mode the engine realized (a difference is a fallback).

File format::

    {"format": "maserve-hear-mode-map", "version": "dev-2024-06", "default": "default",
     "modes": {"critic": "eager", "planner": "default"}, "sha256": "<hex>"}

Examples:
    >>> m = ModeMap.of("v1", {"planner": "default", "critic": "eager"})
    >>> m.lookup("critic")
    'eager'
    >>> ModeMap.from_json(m.to_json()) == m
    True
    >>> len(m.content_hash)
    64
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import Any

from maserve_prefect.errors import ConfigError
from maserve_prefect.protocol.outcomes import (
    Accepted,
    Completed,
    Failed,
    HearOutcome,
    Realization,
    Unsupported,
)

FORMAT = "maserve-hear-mode-map"


@dataclass(frozen=True, slots=True)
class ModeMap:
    """Role -> mode, frozen. Build with `of`, `from_json` or `load`."""

    version: str
    modes: Mapping[str, str]
    default: str | None = None

    @classmethod
    def of(cls, version: str, modes: Mapping[str, str], default: str | None = None) -> ModeMap:
        """A frozen mapping over a private copy of `modes`.

        Raises:
            ConfigError: empty version, or an empty role or mode name.
        """
        if not version:
            raise ConfigError("ModeMap: version must be a non-empty string")
        for role, mode in modes.items():
            if not role or not mode or not isinstance(mode, str):
                raise ConfigError(f"ModeMap {version}: bad entry {role!r} -> {mode!r}")
        return cls(version, MappingProxyType(dict(sorted(modes.items()))), default)

    @property
    def content_hash(self) -> str:
        """SHA-256 (hex) of the canonical JSON of version, default and modes."""
        return hashlib.sha256(self._canonical().encode()).hexdigest()

    def lookup(self, role: str) -> str:
        """The mode for `role` (the default for a role not mapped).

        Raises:
            ConfigError: `role` is not mapped and the mapping has no default.
        """
        mode = self.modes.get(role, self.default)
        if mode is None:
            raise ConfigError(
                f"mode map {self.version} has no mode for role {role!r} and no default; "
                f"mapped roles: {', '.join(self.modes) or 'none'}"
            )
        return mode

    def to_json(self) -> str:
        body = self._body()
        body["sha256"] = self.content_hash
        return json.dumps(body, indent=2, sort_keys=True) + "\n"

    @classmethod
    def from_json(cls, text: str, where: str = "<string>") -> ModeMap:
        """Parse and verify a mode-map file's text.

        Raises:
            ConfigError: not JSON, wrong format, missing fields, or the hash does not match
                the content (names `where`).
        """
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise ConfigError(f"{where}:{exc.lineno}: not valid JSON ({exc.msg})") from None
        if not isinstance(data, dict) or data.get("format") != FORMAT:
            raise ConfigError(f"{where}: not a {FORMAT} file (format field missing or different)")
        modes = data.get("modes")
        if not isinstance(modes, dict) or not isinstance(data.get("version"), str):
            raise ConfigError(f"{where}: needs a string 'version' and a 'modes' object")
        mapping = cls.of(data["version"], modes, data.get("default"))
        if data.get("sha256") != mapping.content_hash:
            raise ConfigError(
                f"{where}: content hash mismatch (file says {data.get('sha256')!r}, content "
                f"hashes to {mapping.content_hash!r}); the mapping was edited after "
                "calibration — recalibrate instead of editing"
            )
        return mapping

    def save(self, path: Path | str) -> Path:
        """Write the file atomically (same-folder temp file, fsync, rename); returns the path."""
        target = Path(path)
        target.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", dir=target.parent)
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as fh:
                fh.write(self.to_json())
                fh.flush()
                os.fsync(fh.fileno())
            os.replace(tmp, target)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
        return target

    @classmethod
    def load(cls, path: Path | str) -> ModeMap:
        """Read and verify a mode-map file.

        Raises:
            ConfigError: the file is missing or invalid (see `from_json`).
        """
        p = Path(path)
        try:
            text = p.read_text(encoding="utf-8")
        except OSError as exc:
            raise ConfigError(f"{p}: cannot read mode map ({exc.strerror})") from None
        return cls.from_json(text, where=str(p))

    def _body(self) -> dict[str, Any]:
        return {
            "format": FORMAT,
            "version": self.version,
            "default": self.default,
            "modes": dict(self.modes),
        }

    def _canonical(self) -> str:
        return json.dumps(self._body(), sort_keys=True, separators=(",", ":"))


@dataclass(frozen=True, slots=True)
class ModeRecord:
    """Requested vs realized mode of one request (`realized` None: it never ran)."""

    request_id: str
    role: str
    requested: str
    realized: str | None
    mapping_version: str

    @property
    def fell_back(self) -> bool:
        return self.realized is not None and self.realized != self.requested


class ModeLedger:
    """Records what role -> mode selection asked for and what the engines did."""

    __slots__ = ("_records",)

    def __init__(self) -> None:
        self._records: list[ModeRecord] = []

    def record(
        self, mapping: ModeMap, request_id: str, role: str, outcome: HearOutcome
    ) -> ModeRecord:
        """Add the record for one request's outcome (realized mode from its `Realization`).

        Raises:
            ConfigError: `role` has no mode in `mapping` (it could not have been requested).
        """
        realization = None if isinstance(outcome, Unsupported) else _realization(outcome)
        realized = realization.mode if realization is not None and realization.mode else None
        rec = ModeRecord(request_id, role, mapping.lookup(role), realized, mapping.version)
        self._records.append(rec)
        return rec

    @property
    def records(self) -> tuple[ModeRecord, ...]:
        return tuple(self._records)

    def num_fallbacks(self) -> int:
        return sum(r.fell_back for r in self._records)


def _realization(outcome: HearOutcome) -> Realization | None:
    if isinstance(outcome, Accepted | Completed):
        return outcome.realization
    if isinstance(outcome, Failed):
        return outcome.realization
    return None
