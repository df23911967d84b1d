"""The TaskBinding interface, exercised by a tiny in-test binding."""

from __future__ import annotations

from typing import ClassVar

import pytest

from maserve_prefect.errors import SpecError
from maserve_prefect.spec.binding import (
    Answer,
    BindingInfo,
    Provenance,
    Quality,
    TaskBinding,
    TaskInstance,
)
from maserve_prefect.spec.examples import example_spec

GOLD = {"q1": "4", "q2": "9"}


class ArithmeticBinding(TaskBinding):
    """Two questions with exact-match scoring; prompts for the four-call roles."""

    info: ClassVar[BindingInfo] = BindingInfo(
        binding_id="arith-tiny",
        provenance=Provenance(source="hand-written", version="1", license="CC0"),
        instance_ids=("q1", "q2"),
        role_prompts={
            "analyst_a": "Solve it.",
            "analyst_b": "Solve it differently.",
            "writer": "Combine the analyses.",
            "verifier": "Check the answer.",
        },
    )

    def instance(self, instance_id: str) -> TaskInstance:
        if instance_id not in GOLD:
            raise SpecError(f"binding 'arith-tiny': unknown instance {instance_id!r}")
        question = "2+2" if instance_id == "q1" else "3*3"
        return TaskInstance(instance_id, {"task": {"question": question}})

    def evaluate(self, instance: TaskInstance, answer: Answer) -> Quality:
        text = answer if isinstance(answer, str) else str(answer.get("answer", ""))
        ok = text.strip() == GOLD[instance.instance_id]
        return Quality(score=1.0 if ok else 0.0, passed=ok, detail="exact match")


def test_instances_and_evaluation() -> None:
    binding = ArithmeticBinding()
    instances = list(binding.instances())
    assert [i.instance_id for i in instances] == ["q1", "q2"]
    assert instances[1].inputs["task"]["question"] == "3*3"
    assert binding.evaluate(instances[0], "4") == Quality(1.0, True, "exact match")
    assert binding.evaluate(instances[1], {"answer": "8"}).passed is False


def test_role_prompts_and_coverage_of_a_workload() -> None:
    binding = ArithmeticBinding()
    assert binding.role_prompt("writer") == "Combine the analyses."
    with pytest.raises(SpecError, match="no role prompt 'critic' \\(prompts: analyst_a"):
        binding.role_prompt("critic")
    binding.check_covers(example_spec("four_call"))
    with pytest.raises(
        SpecError, match="binding 'arith-tiny' for workload 'debate': no role prompt 'pro'"
    ):
        binding.check_covers(example_spec("debate"))


def test_coverage_checks_tools_and_inputs() -> None:
    class NoTools(ArithmeticBinding):
        info = ArithmeticBinding.info.model_copy(
            update={"role_prompts": {"lead": "Plan.", "researcher": "Search."}}
        )

    with pytest.raises(SpecError, match="no tool 'web_search' \\(binding tools: none\\)"):
        NoTools().check_covers(example_spec("spawn"))

    class NoInputs(NoTools):
        info = NoTools.info.model_copy(update={"tools": ("web_search",)})

        def instance(self, instance_id: str) -> TaskInstance:
            return TaskInstance(instance_id, {})

    with pytest.raises(SpecError, match="instance 'q1' lacks input artifact 'task'"):
        NoInputs().check_covers(example_spec("spawn"))


def test_binding_info_validation() -> None:
    with pytest.raises(SpecError, match="duplicate instance id 'a'"):
        BindingInfo(binding_id="b", instance_ids=("a", "a"))
    with pytest.raises(SpecError, match="instance_ids: Tuple should have at least 1 item"):
        BindingInfo(binding_id="b", instance_ids=())


def test_abstract_methods_are_required() -> None:
    class Incomplete(TaskBinding):
        info = ArithmeticBinding.info

    with pytest.raises(TypeError, match="abstract"):
        Incomplete()  # type: ignore[abstract]
