"""Every evaluator, on every shipped instance, with a known-right and a known-wrong answer."""

from __future__ import annotations

import pytest
from maserve_prefect.bindings import get_binding
from maserve_prefect.bindings.base import final_number
from maserve_prefect.bindings.science_qa import chosen_letter


def _ids(name: str) -> list[str]:
    return list(get_binding(name).info.instance_ids)


@pytest.mark.parametrize("iid", _ids("math"))
def test_math_worked_solution_passes_and_off_by_one_fails(iid: str) -> None:
    b = get_binding("math")
    rec, inst = b.record(iid), b.instance(iid)
    assert b.evaluate(inst, rec["solution"]).passed
    assert b.evaluate(inst, {"answer": f"Answer: {rec['answer']}"}).passed
    wrong = b.evaluate(inst, f"So the answer is {rec['answer'] + 1}.")
    assert not wrong.passed and wrong.score == 0.0


@pytest.mark.parametrize("iid", _ids("finance"))
def test_finance_tolerance(iid: str) -> None:
    b = get_binding("finance")
    rec, inst = b.record(iid), b.instance(iid)
    exact = rec["answer"]
    assert b.evaluate(inst, f"Answer: {exact:,.2f}").passed
    assert b.evaluate(inst, f"about {exact * (1 + rec['rel_tolerance'] / 2):.4f}").passed
    assert not b.evaluate(inst, f"Answer: {exact * 1.05 + 1:.2f}").passed


@pytest.mark.parametrize("iid", _ids("science_qa"))
def test_science_letter_match(iid: str) -> None:
    b = get_binding("science_qa")
    rec, inst = b.record(iid), b.instance(iid)
    right = rec["answer"]
    wrong = next(letter for letter in "ABCD" if letter != right)
    assert b.evaluate(inst, f"Reasoning... Answer: {right}").passed
    assert b.evaluate(inst, f"The answer is {rec['choices'][right]}.").passed
    assert not b.evaluate(inst, f"Answer: ({wrong})").passed


@pytest.mark.parametrize("iid", _ids("meeting_summary"))
def test_meeting_reference_passes_other_meeting_fails(iid: str) -> None:
    b = get_binding("meeting_summary")
    inst = b.instance(iid)
    assert b.evaluate(inst, b.record(iid)["reference"]).score == 1.0
    assert not b.evaluate(inst, "The team discussed several items and agreed to follow up.").passed


def test_meeting_partial_answer_scores_between() -> None:
    b = get_binding("meeting_summary")
    rec = b.record("meet-03")
    first_sentence = rec["reference"].split(". ")[0]
    q = b.evaluate(b.instance("meet-03"), first_sentence)
    assert 0 < q.score < 1 and not q.passed and "missed" in q.detail


@pytest.mark.parametrize("iid", _ids("research"))
def test_research_key_terms(iid: str) -> None:
    b = get_binding("research")
    rec, inst = b.record(iid), b.instance(iid)
    right = " and ".join(term.split("|")[0] for kp in rec["key_points"] for term in kp["terms"])
    assert b.evaluate(inst, right).passed
    assert not b.evaluate(inst, "Use the os module and read the manual.").passed


@pytest.mark.parametrize("iid", _ids("code"))
def test_code_reference_passes_stub_fails(iid: str) -> None:
    b = get_binding("code")
    rec, inst = b.record(iid), b.instance(iid)
    fenced = f"Here is the code:\n```python\n{rec['reference']}```\nDone."
    assert b.evaluate(inst, fenced).passed
    stub = f"def {rec['function']}(*args, **kwargs):\n    return None\n"
    q = b.evaluate(inst, {"code": stub})
    assert not q.passed and q.score < 1.0


def test_code_timeout_is_a_failed_answer() -> None:
    b = get_binding("code")
    q = b.evaluate(b.instance("code-01"), "def is_palindrome(s):\n    while True:\n        pass\n")
    assert not q.passed


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("#### 42", 42.0),
        ("Answer: -2,452.02 dollars", -2452.02),
        ("12 then 7", 7.0),
        ("none", None),
    ],
)
def test_final_number(text: str, value: float | None) -> None:
    assert final_number(text) == value


def test_chosen_letter_ambiguous_is_none() -> None:
    choices = {"A": "red", "B": "blue", "C": "green", "D": "grey"}
    assert chosen_letter("red or blue", choices) is None
    assert chosen_letter("b", choices) == "B"
    assert chosen_letter("AB", choices) is None
