"""Artifact interfaces: the typed values stages consume and produce.

An artifact is named once per workload (`analysis_a`, `review`) and has fields with simple types.
A field may list its allowed values (`verdict: accept | revise`), which lets a `Choice` node check
its case labels. Artifacts are what dependency edges carry and what `Choice` / `Repeat` inspect,
addressed as `"artifact.field"`.

Examples:
    >>> review = ArtifactInterface(
    ...     name="review",
    ...     fields=(ArtifactField(name="verdict", type="text", choices=("accept", "revise")),),
    ... )
    >>> review.field("verdict").choices
    ('accept', 'revise')
"""

from __future__ import annotations

from enum import StrEnum

from pydantic import Field, model_validator

from maserve_prefect.errors import SpecError
from maserve_prefect.spec.base import SpecModel

NAME_PATTERN = r"^[A-Za-z_][A-Za-z0-9_\-]*$"
"""Names of stages, artifacts, fields, roles and namespaces: identifier-like, dashes allowed."""


class FieldType(StrEnum):
    """Value type of an artifact field."""

    TEXT = "text"
    INT = "int"
    FLOAT = "float"
    BOOL = "bool"
    LIST = "list"
    JSON = "json"


class ArtifactField(SpecModel):
    """One field of an artifact interface; `choices` restricts a text field to listed values."""

    name: str = Field(pattern=NAME_PATTERN)
    type: FieldType = FieldType.TEXT
    choices: tuple[str, ...] = ()
    description: str = ""

    @model_validator(mode="after")
    def _choices_are_text(self) -> ArtifactField:
        if self.choices and self.type is not FieldType.TEXT:
            raise SpecError(
                f"field {self.name!r}: choices need type 'text', not {self.type.value!r}"
            )
        if len(set(self.choices)) != len(self.choices):
            raise SpecError(f"field {self.name!r}: duplicate choices in {list(self.choices)}")
        return self


class ArtifactInterface(SpecModel):
    """A named artifact and its fields.

    Examples:
        >>> ArtifactInterface(name="task", fields=(ArtifactField(name="question"),)).field_names()
        ('question',)
    """

    name: str = Field(pattern=NAME_PATTERN)
    fields: tuple[ArtifactField, ...] = Field(min_length=1)
    description: str = ""

    @model_validator(mode="after")
    def _unique_fields(self) -> ArtifactInterface:
        names = self.field_names()
        for name in names:
            if names.count(name) > 1:
                raise SpecError(f"artifact {self.name!r}: duplicate field {name!r}")
        return self

    def field_names(self) -> tuple[str, ...]:
        """Field names in declaration order."""
        return tuple(f.name for f in self.fields)

    def field(self, name: str) -> ArtifactField:
        """The field called `name`; `SpecError` naming the known fields if there is none."""
        for f in self.fields:
            if f.name == name:
                return f
        raise SpecError(
            f"artifact {self.name!r} has no field {name!r} (fields: {', '.join(self.field_names())})"
        )


def split_field_path(path: str) -> tuple[str, str]:
    """Split `"artifact.field"` into its parts; `SpecError` if it is not of that form.

    Examples:
        >>> split_field_path("review.verdict")
        ('review', 'verdict')
    """
    artifact, dot, field = path.partition(".")
    if not dot or not artifact or not field or "." in field:
        raise SpecError(f"{path!r} is not of the form 'artifact.field'")
    return artifact, field
