"""Artifacts: what ops hand each other — text plus named fields, addressed by content.

An artifact is small and picklable (it travels through Prefect futures and parameters); its text
and fields are also stored in the run's CAS, and `digest` is that blob's SHA-256, so the trace's
data edges point at real payloads.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from maserve_prefect.trace.cas import canonical_json

FieldValue = str | int | float | bool


@dataclass(frozen=True, slots=True)
class Artifact:
    """One op's output.

    Attributes:
        name: the artifact interface name (e.g. "draft", "review").
        text: the content (synthetic on the simulator).
        fields: structured fields templates decide on (e.g. verdict, answer, count).
        num_tokens: the content's length in tokens.
        producer: op id that produced it.
        digest: SHA-256 of `payload()` in the CAS.
    """

    name: str
    text: str
    fields: Mapping[str, FieldValue] = field(default_factory=dict)
    num_tokens: int = 0
    producer: str = ""
    digest: str = ""

    def payload(self) -> bytes:
        """The canonical bytes stored in the CAS."""
        return canonical_json({"name": self.name, "text": self.text, "fields": dict(self.fields)})

    def field(self, name: str, default: Any = None) -> Any:
        """A field's value (or `default`)."""
        return self.fields.get(name, default)

    def select(self, names: tuple[str, ...]) -> str:
        """The artifact reduced to the named fields (Selected context delivery)."""
        picked = {k: self.fields[k] for k in names if k in self.fields}
        if not picked:
            return self.text.split(". ")[0][:200]
        return "; ".join(f"{k}: {v}" for k, v in sorted(picked.items()))
