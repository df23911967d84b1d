"""Subjects: what every HEAR message is about.

One idea: no HEAR exchange is anonymous. Each message names exactly one subject — a request
(`RequestRef`), a versioned context (`ContextRef`: a conversation's KV prefix at one version), or a
serving instance (`InstanceRef`: a replica). Controls sent with `submit(request, controls)` take
that request as their subject; everything else carries its subject in a `subject` field.

Examples:
    >>> ContextRef("sess-1", 2).key()
    'context:sess-1@2'
    >>> ContextRef("sess-1", 2).next().version
    3
    >>> subject_key(RequestRef("r7"))
    'request:r7'
"""

from __future__ import annotations

from dataclasses import dataclass

from maserve_prefect.errors import RequestError


@dataclass(frozen=True, slots=True)
class RequestRef:
    """One generation request, by the id the engine knows it under."""

    request_id: str

    def __post_init__(self) -> None:
        if not self.request_id:
            raise RequestError("RequestRef: request_id must be a non-empty string")

    def key(self) -> str:
        return f"request:{self.request_id}"


@dataclass(frozen=True, slots=True)
class ContextRef:
    """A context (e.g. a session's growing prompt prefix) at one version.

    The version grows by one each time the context is extended, so a control about version 3
    never silently applies to the longer version 4.
    """

    context_id: str
    version: int = 0

    def __post_init__(self) -> None:
        if not self.context_id:
            raise RequestError("ContextRef: context_id must be a non-empty string")
        if self.version < 0:
            raise RequestError(
                f"ContextRef {self.context_id!r}: version must be >= 0, got {self.version}"
            )

    def key(self) -> str:
        return f"context:{self.context_id}@{self.version}"

    def next(self) -> ContextRef:
        """The same context one extension later."""
        return ContextRef(self.context_id, self.version + 1)


@dataclass(frozen=True, slots=True)
class InstanceRef:
    """A serving instance (one replica), by name."""

    name: str

    def __post_init__(self) -> None:
        if not self.name:
            raise RequestError("InstanceRef: name must be a non-empty string")

    def key(self) -> str:
        return f"instance:{self.name}"


Subject = RequestRef | ContextRef | InstanceRef


def subject_key(subject: Subject) -> str:
    """A stable text key for a subject (used in logs, notes and intent payloads).

    Raises:
        RequestError: `subject` is not one of the three subject types.
    """
    if not isinstance(subject, RequestRef | ContextRef | InstanceRef):
        raise RequestError(
            f"a HEAR subject must be a RequestRef, ContextRef or InstanceRef, got {subject!r}"
        )
    return subject.key()
