"""Versioned task-shared state and a persistent memory store, with the writer of every version.

A namespace key is `(scope, name)`: scope is a root id for task-shared state (one version history
per root) or `"persistent"` for memory that outlives roots. Each write appends a version that
remembers the op that wrote it; a read returns the latest version and its writer, so the reading
op gains a *state* dependency on that writer. Reads and writes are applied by the harness at
quiescent instants in op-id order, so racing threads never reorder versions.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Version:
    """One state version: its number (1-based), value digest, and writer op id."""

    number: int
    value: str
    writer: str


class StateStore:
    """Version histories by (scope, name)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._versions: dict[tuple[str, str], list[Version]] = {}

    def write(self, scope: str, name: str, value: str, writer: str) -> Version:
        """Append a version and return it."""
        with self._lock:
            history = self._versions.setdefault((scope, name), [])
            version = Version(len(history) + 1, value, writer)
            history.append(version)
            return version

    def read(self, scope: str, name: str) -> Version | None:
        """The latest version, or None when nothing was written."""
        with self._lock:
            history = self._versions.get((scope, name))
            return history[-1] if history else None

    def history(self, scope: str, name: str) -> list[Version]:
        with self._lock:
            return list(self._versions.get((scope, name), ()))
