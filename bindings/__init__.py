"""maserve_prefect.bindings: the shipped task bindings (inputs, role prompts, tools, evaluation).

Six bindings, each with small data written for this project (see each module's docstring for
its data, evaluator and simulator content distributions): `math`, `code`, `meeting_summary`,
`research`, `finance`, `science_qa`. `get_binding(name)` returns a fresh binding; unknown names
raise `ConfigError` listing the known ones. `content_model_for(binding, seed)` gives any binding's
simulator content model (the binding's own, or a generic default profile).

Examples:
    >>> from maserve_prefect.bindings import get_binding, list_bindings
    >>> list_bindings()
    ['code', 'finance', 'math', 'meeting_summary', 'research', 'science_qa']
    >>> get_binding("math").evaluate(get_binding("math").instance("math-07"), "Answer: 63").passed
    True
"""

from __future__ import annotations

from maserve_prefect.bindings.base import ShippedBinding
from maserve_prefect.bindings.code_tasks import CodeBinding
from maserve_prefect.bindings.content import (
    ContentModel,
    ContentProfile,
    LengthDist,
    synthetic_text,
    synthetic_token_ids,
)
from maserve_prefect.bindings.finance import FinanceBinding
from maserve_prefect.bindings.math_word import MathBinding
from maserve_prefect.bindings.meeting_summary import MeetingSummaryBinding
from maserve_prefect.bindings.research import ResearchBinding
from maserve_prefect.bindings.science_qa import ScienceQABinding

from maserve_prefect.errors import ConfigError
from maserve_prefect.spec.binding import QualitySummary, TaskBinding, summarize_quality

_BINDINGS: dict[str, type[ShippedBinding]] = {
    cls.info.binding_id: cls
    for cls in (
        MathBinding,
        CodeBinding,
        MeetingSummaryBinding,
        ResearchBinding,
        FinanceBinding,
        ScienceQABinding,
    )
}

DEFAULT_PROFILE = ContentProfile(lengths={"default": LengthDist(250, 0.5, 20, 1000)}).responsive()
"""Content profile for bindings that do not define one (user bindings); it responds to what a
call was given like every shipped binding (`ContentProfile.responsive`)."""


def list_bindings() -> list[str]:
    """Names of the shipped bindings, sorted."""
    return sorted(_BINDINGS)


def get_binding(name: str) -> ShippedBinding:
    """A new instance of the shipped binding `name`; `ConfigError` listing names otherwise."""
    try:
        return _BINDINGS[name]()
    except KeyError:
        raise ConfigError(
            f"unknown binding {name!r} (shipped bindings: {', '.join(list_bindings())})"
        ) from None


def content_model_for(binding: TaskBinding, seed: int = 0) -> ContentModel:
    """The simulator content model of `binding` for run seed `seed`.

    Examples:
        >>> content_model_for(get_binding("code"), seed=1).binding_id
        'code'
    """
    if isinstance(binding, ShippedBinding):
        return binding.content_model(seed)
    return ContentModel(binding.binding_id, DEFAULT_PROFILE, seed)


__all__ = [
    "DEFAULT_PROFILE",
    "CodeBinding",
    "ContentModel",
    "ContentProfile",
    "FinanceBinding",
    "LengthDist",
    "MathBinding",
    "MeetingSummaryBinding",
    "QualitySummary",
    "ResearchBinding",
    "ScienceQABinding",
    "ShippedBinding",
    "content_model_for",
    "get_binding",
    "list_bindings",
    "summarize_quality",
    "synthetic_text",
    "synthetic_token_ids",
]
