"""Shared machinery of the shipped bindings: data loading, answer parsing, scoring, prompts.

A shipped binding is a `ShippedBinding`: a `TaskBinding` whose instances are the lines of one
JSONL file in `data/` (package data, so a wheel carries it), whose role prompts come from
`role_prompts(task framing)` — one prompt for every generic collaboration role the templates
use — and which carries a documented `ContentProfile` for simulator runs.

Scoring helpers are shared so every evaluator parses answers the same way: `answer_text` takes
the text of an answer (a string, or the `answer` / `code` / `text` field of an artifact);
`final_number` reads the number after the last "answer:" marker, else the last number;
`key_point_recall` scores summaries and research answers.

Examples:
    >>> final_number("2 + 3 = 5, so the answer is 5 apples")
    5.0
    >>> key_point_recall("Heappush from heapq.", [KeyPoint("p", ("heapq",)), KeyPoint("q", ("bisect",))])
    0.5
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from functools import cache
from importlib import resources
from typing import Any, ClassVar

from maserve_prefect.bindings.content import ContentModel, ContentProfile

from maserve_prefect.errors import ConfigError, SpecError
from maserve_prefect.spec.binding import Answer, Provenance, Quality, TaskBinding, TaskInstance

AUTHORED = "authored for maserve-prefect, 2026-11-29"


def provenance(method: str) -> Provenance:
    """Provenance of a shipped data file written for this project by `method`."""
    return Provenance(
        source=f"{AUTHORED}, {method}", version="1", license="Apache-2.0", url="bindings/data"
    )


@cache
def load_jsonl(name: str, required: tuple[str, ...]) -> tuple[dict[str, Any], ...]:
    """The records of `data/<name>`; `ConfigError` naming file and line on a bad record."""
    ref = resources.files("maserve_prefect.bindings").joinpath("data", name)
    try:
        text = ref.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError(
            f"binding data file data/{name} is missing from maserve_prefect.bindings; "
            "reinstall the package (it ships as package data)"
        ) from None
    records = []
    for lineno, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as exc:
            raise ConfigError(f"data/{name} line {lineno}: invalid JSON ({exc.msg})") from None
        missing = [k for k in required if k not in record]
        if missing:
            raise ConfigError(f"data/{name} line {lineno}: record lacks {', '.join(missing)}")
        records.append(record)
    if not records:
        raise ConfigError(f"data/{name} holds no records")
    return tuple(records)


def answer_text(answer: Answer, fields: Sequence[str] = ("answer", "code", "text")) -> str:
    """The text of an answer: the string itself, or the first of `fields` an artifact has."""
    if isinstance(answer, str):
        return answer
    for name in fields:
        if name in answer and answer[name] is not None:
            return str(answer[name])
    return " ".join(str(v) for v in answer.values())


_NUMBER = re.compile(r"[-−]?\$?\d[\d,]*(?:\.\d+)?|[-−]?\$?\.\d+")
_MARKER = re.compile(r"(?:answer|result)\s*(?:is|=|:)?\s*|####\s*", re.IGNORECASE)


def _parse_number(token: str) -> float:
    return float(token.replace("−", "-").replace("$", "").replace(",", ""))


def final_number(text: str) -> float | None:
    """The number after the last "answer:"/"answer is"/"####" marker, else the last number."""
    markers = list(_MARKER.finditer(text))
    if markers:
        match = _NUMBER.search(text, markers[-1].end())
        if match:
            return _parse_number(match.group())
    numbers = _NUMBER.findall(text)
    return _parse_number(numbers[-1]) if numbers else None


@dataclass(frozen=True, slots=True)
class KeyPoint:
    """A reference point; matched when every term occurs (a term may list `a|b` alternatives)."""

    point: str
    terms: tuple[str, ...]

    def matched_by(self, normalized_answer: str) -> bool:
        """Whether `normalized_answer` (see `normalize`) holds every term."""
        return all(
            any(_contains(normalized_answer, normalize(alt)) for alt in term.split("|"))
            for term in self.terms
        )


def normalize(text: str) -> str:
    """Lower case, single spaces (for term matching)."""
    return " ".join(text.lower().split())


def _contains(haystack: str, needle: str) -> bool:
    # Word boundaries where the term starts/ends with a word character ("June 23" ≠ "June 230").
    left = r"\b" if needle[:1].isalnum() else ""
    right = r"\b" if needle[-1:].isalnum() else ""
    return re.search(left + re.escape(needle) + right, haystack) is not None


def key_points(raw: Iterable[Mapping[str, Any]]) -> tuple[KeyPoint, ...]:
    """Key points from data records `{"point": ..., "terms": [...]}`."""
    return tuple(
        KeyPoint(str(kp.get("point", " / ".join(kp["terms"]))), tuple(kp["terms"])) for kp in raw
    )


def key_point_recall(answer: str, points: Sequence[KeyPoint]) -> float:
    """Fraction of `points` matched by `answer`."""
    text = normalize(answer)
    return sum(p.matched_by(text) for p in points) / len(points)


def recall_quality(answer: str, points: Sequence[KeyPoint], threshold: float) -> Quality:
    """Key-point recall as a `Quality` (pass at `threshold`), naming the missed points."""
    text = normalize(answer)
    missed = [p.point for p in points if not p.matched_by(text)]
    score = 1 - len(missed) / len(points)
    detail = f"key-point recall {score:.2f} (pass >= {threshold:g})"
    if missed:
        detail += "; missed: " + "; ".join(missed)
    return Quality(score=score, passed=score >= threshold, detail=detail)


_GENERIC_ROLES: Mapping[str, str] = {
    "solver": "Solve the task on your own. Show your reasoning briefly, then give the final answer.",
    "worker": "Do the sub-task you were given and report the result concisely.",
    "child": "Do the sub-task you were given with a fresh context and return a short summary.",
    "analyst": "Analyse the task independently: list the facts that matter and a candidate answer.",
    "synthesizer": "Combine the analyses you receive into one answer; resolve disagreements explicitly.",
    "writer": "Write the answer for the task, using the material you were given.",
    "editor": "Polish the accepted draft: keep its content, fix clarity and format.",
    "expert": "The draft was rejected. Using its history, write a corrected final answer.",
    "verifier": "Check the proposed answer step by step. Reply accept or reject, then the answer you trust.",
    "validator": "Validate the final answer against the task's requirements; reply accept or reject with reasons.",
    "critic": "Critique the draft: list concrete errors and omissions, then a verdict: accept or revise.",
    "evaluator": "Score the draft from 0 to 1 against the task and say accept or revise.",
    "reviewer": "Review the work for correctness and completeness; list required changes.",
    "debater": "Argue for the answer you believe is right; respond to the other debaters' last points.",
    "pro": "Defend the most likely answer; respond to the other debaters' last points.",
    "con": "Challenge the leading answer and propose the strongest alternative.",
    "skeptic": "Look for the weakest step in every argument so far and say whether it holds.",
    "judge": "Read the candidate answers or the debate and rule on the single best final answer.",
    "aggregator": "Merge the partial results you receive into one consistent result.",
    "summarizer": "Summarize the material you receive, keeping facts, numbers, names and dates.",
    "researcher": "Research the question with the search tool; report findings with their sources.",
    "lead": "Plan the work: decide how many researchers to spawn and what each should look into; then write the report from their findings.",
    "planner": "Break the task into independent sub-tasks and say how many workers are needed.",
    "parent": "Break the task into independent sub-tasks, spawn workers, then combine their results.",
    "coder": "Write the Python code that solves the task; return only the code.",
    "tester": "Run the unit tests with the run_tests tool and report which tests fail and why.",
    "diagnoser": "Read the failing test output and explain the root cause of each failure.",
    "repairer": "Fix the code so that every test passes; return only the full corrected code.",
}


def role_prompts(task: str, overrides: Mapping[str, str] | None = None) -> dict[str, str]:
    """A prompt for every generic role, each prefixed with the binding's task framing `task`.

    `overrides` replaces the role-specific part for some roles (and may add roles). Every
    binding covers the same role keys, so any template runs under any binding.
    """
    roles = dict(_GENERIC_ROLES)
    roles.update(overrides or {})
    prompts = {role: f"{task}\n\nYour role ({role}): {text}" for role, text in roles.items()}
    prompts["analyst_a"] = prompts["analyst"]
    prompts["analyst_b"] = prompts["analyst"] + " Take a different approach from other analysts."
    return prompts


class ShippedBinding(TaskBinding):
    """A binding backed by one JSONL data file in `data/` and a documented content profile.

    Subclasses set `info`, `data_file`, `required_fields`, `content_profile`, and implement
    `_inputs(record)` and `evaluate`.
    """

    data_file: ClassVar[str]
    required_fields: ClassVar[tuple[str, ...]] = ("id", "question")
    content_profile: ClassVar[ContentProfile]

    @classmethod
    def records(cls) -> tuple[dict[str, Any], ...]:
        """The data file's records, in file order."""
        return load_jsonl(cls.data_file, cls.required_fields)

    def record(self, instance_id: str) -> dict[str, Any]:
        """The data record of `instance_id`; `SpecError` if the binding has no such instance."""
        for rec in self.records():
            if rec["id"] == instance_id:
                return rec
        raise SpecError(
            f"binding {self.binding_id!r} has no instance {instance_id!r} "
            f"(ids {self.info.instance_ids[0]} … {self.info.instance_ids[-1]}, "
            f"{len(self.info.instance_ids)} in all)"
        )

    def instance(self, instance_id: str) -> TaskInstance:
        """The task instance `instance_id`: its input artifacts (the `task` artifact at least)."""
        return TaskInstance(instance_id, self._inputs(self.record(instance_id)))

    def _inputs(self, record: Mapping[str, Any]) -> dict[str, Any]:
        return {"task": {"question": record["question"]}}

    def content_model(self, seed: int = 0) -> ContentModel:
        """The seeded simulator content model of this binding for run seed `seed`."""
        return ContentModel(self.binding_id, self.content_profile, seed)


def instance_ids(records: Iterable[Mapping[str, Any]]) -> tuple[str, ...]:
    """The ids of data records, in order."""
    return tuple(str(r["id"]) for r in records)
