"""Small rules shared by composition nodes, stages and template configs.

`JoinRule` says when a set of concurrent branches counts as done: all of them, any one, or
k of n. It does not know n; whoever holds the branches (a `Parallel` node, a Fork–Join width, a
Spawn's children) checks `k <= n` with `JoinRule.check_width`, so the error names that element.

Examples:
    >>> JoinRule(rule="k_of_n", k=2).required(3)
    2
    >>> JoinRule().required(3)
    3
"""

from __future__ import annotations

from enum import StrEnum

from pydantic import Field, model_validator

from maserve_prefect.errors import SpecError
from maserve_prefect.spec.base import SpecModel


class JoinKind(StrEnum):
    """How many concurrent branches must finish before the join completes."""

    ALL = "all"
    ANY = "any"
    K_OF_N = "k_of_n"


class HistoryMode(StrEnum):
    """Whether a participant starts with the conversation it came from or with an empty one."""

    INHERITED = "inherited"
    FRESH = "fresh"


class Delivery(StrEnum):
    """Whether delivered artifacts are passed whole or only selected fields."""

    FULL = "full"
    SELECTED = "selected"


class JoinRule(SpecModel):
    """A completion rule over n concurrent branches.

    Attributes:
        rule: all, any, or k_of_n.
        k: required for k_of_n (>= 1), forbidden otherwise.

    Examples:
        >>> JoinRule(rule="any").required(4)
        1
    """

    rule: JoinKind = JoinKind.ALL
    k: int | None = Field(default=None, ge=1)

    @model_validator(mode="after")
    def _k_matches_rule(self) -> JoinRule:
        if self.rule is JoinKind.K_OF_N and self.k is None:
            raise SpecError("join rule k_of_n needs k (how many branches must finish)")
        if self.rule is not JoinKind.K_OF_N and self.k is not None:
            raise SpecError(f"join rule {self.rule.value!r} takes no k; use rule k_of_n")
        return self

    def required(self, width: int) -> int:
        """Number of branches out of `width` that must finish."""
        if self.rule is JoinKind.ALL:
            return width
        if self.rule is JoinKind.ANY:
            return 1
        assert self.k is not None
        return self.k

    def check_width(self, width: int, what: str) -> None:
        """Raise `SpecError` if this join waits for more than `width` branches of `what`."""
        if self.k is not None and self.k > width:
            raise SpecError(f"join k={self.k} is wider than its {width} {what}")
