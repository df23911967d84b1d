"""Logical memory namespaces M: where state lives beyond one call, and which roles may touch it.

Three scopes:

- **private**: one role's own history; only that role reads or writes it.
- **shared_versioned**: task-shared state; every write makes a new version, and readers see a
  version (this is what makes state edges in the trace well defined). `max_versions` bounds it.
- **persistent**: outlives the task (e.g. a knowledge base written across tasks).

Roles are checked against the workload's participants by `WorkloadSpec`.

Examples:
    >>> ns = MemoryNamespace(name="notes", scope="shared_versioned", readers=("a", "b"), writers=("a",))
    >>> ns.can_write("b")
    False
"""

from __future__ import annotations

from enum import StrEnum
from typing import Annotated

from pydantic import Field, model_validator

from maserve_prefect.errors import SpecError
from maserve_prefect.spec.artifacts import NAME_PATTERN
from maserve_prefect.spec.base import SpecModel


class MemoryScope(StrEnum):
    """Lifetime and sharing of a namespace."""

    PRIVATE = "private"
    SHARED_VERSIONED = "shared_versioned"
    PERSISTENT = "persistent"


class MemoryNamespace(SpecModel):
    """A named namespace with a scope and the roles that read and write it.

    Attributes:
        name: namespace name, unique in the workload.
        scope: private, shared_versioned or persistent.
        readers / writers: role names; a writer may also read only if listed as a reader.
        max_versions: bound on retained versions (shared_versioned only); None = unbounded.
    """

    name: str = Field(pattern=NAME_PATTERN)
    scope: MemoryScope
    readers: tuple[Annotated[str, Field(pattern=NAME_PATTERN)], ...] = ()
    writers: tuple[Annotated[str, Field(pattern=NAME_PATTERN)], ...] = ()
    max_versions: int | None = Field(default=None, ge=1)

    @model_validator(mode="after")
    def _access(self) -> MemoryNamespace:
        if not self.readers and not self.writers:
            raise SpecError(f"memory namespace {self.name!r}: no role reads or writes it")
        if self.scope is MemoryScope.PRIVATE:
            owners = set(self.readers) | set(self.writers)
            if len(owners) != 1:
                raise SpecError(
                    f"memory namespace {self.name!r}: a private namespace belongs to one role, "
                    f"got {sorted(owners)}"
                )
        if self.max_versions is not None and self.scope is not MemoryScope.SHARED_VERSIONED:
            raise SpecError(
                f"memory namespace {self.name!r}: max_versions applies to shared_versioned "
                f"namespaces, not {self.scope.value!r}"
            )
        return self

    def roles(self) -> tuple[str, ...]:
        """Every role named by this namespace's access rules, in order, without repeats."""
        return tuple(dict.fromkeys(self.readers + self.writers))

    def can_read(self, role: str) -> bool:
        """Whether `role` may read this namespace."""
        return role in self.readers

    def can_write(self, role: str) -> bool:
        """Whether `role` may write this namespace."""
        return role in self.writers
