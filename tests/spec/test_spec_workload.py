"""Whole-workload validation: each cross-element check raises one SpecError naming the element."""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import pytest
from spec_factories import make_artifact, make_chain_data, make_stage, make_workload

from maserve_prefect.errors import SpecError
from maserve_prefect.spec.artifacts import ArtifactField, ArtifactInterface
from maserve_prefect.spec.examples import example_spec
from maserve_prefect.spec.io import spec_to_data
from maserve_prefect.spec.stages import Participant, Stage
from maserve_prefect.spec.templates import SingleConfig
from maserve_prefect.spec.workload import Dependency, WorkloadSpec

Mutation = Callable[[dict[str, Any]], None]


def _four_call() -> dict[str, Any]:
    return copy.deepcopy(spec_to_data(example_spec("four_call")))


def _raises(mutate: Mutation) -> str:
    data = _four_call()
    mutate(data)
    with pytest.raises(SpecError) as info:
        make_workload(data)
    return str(info.value)


def test_unknown_stage_in_dependency_lists_declared_stages() -> None:
    msg = _raises(lambda d: d["dependencies"].append({"source": "synthesis", "target": "ghost"}))
    assert msg == (
        "<test>: workload 'four_call': dependency 'synthesis' -> 'ghost': unknown stage 'ghost' "
        "(declared stages: analyst_a, analyst_b, synthesis, verification)"
    )


def test_cycle_is_reported_as_its_path() -> None:
    msg = _raises(
        lambda d: d["dependencies"].append({"source": "verification", "target": "analyst_a"})
    )
    assert "dependency cycle: analyst_a -> synthesis -> verification -> analyst_a" in msg


def test_self_dependency_is_a_cycle() -> None:
    msg = _raises(
        lambda d: d["dependencies"].append({"source": "synthesis", "target": "synthesis"})
    )
    assert "dependency cycle: synthesis -> synthesis" in msg


def test_join_wider_than_parallel_names_the_node() -> None:
    msg = _raises(lambda d: d["composition"]["steps"][0].update(join={"rule": "k_of_n", "k": 3}))
    assert msg == (
        "<test>: composition (sequence).steps[0] (parallel): join k=3 is wider than its 2 branches"
    )


@pytest.mark.parametrize(
    ("mutate", "needle"),
    [
        (
            lambda d: d["stages"].append(make_stage("analyst_a", ["task"], ["draft"])),
            "duplicate stage name 'analyst_a'",
        ),
        (
            lambda d: d["artifacts"].append(make_artifact("task")),
            "duplicate artifact name 'task'",
        ),
        (lambda d: d.update(inputs=["nope"]), "input 'nope': unknown artifact"),
        (
            lambda d: d["stages"][0].update(outputs=["missing"]),
            "stage 'analyst_a' produces unknown artifact 'missing'",
        ),
        (
            lambda d: d["dependencies"][0].update(artifact="draft"),
            "carries 'draft', but stage 'analyst_a' does not produce it (outputs: analysis_a)",
        ),
        (
            lambda d: d["dependencies"].append(
                {"source": "analyst_a", "target": "verification", "artifact": "analysis_a"}
            ),
            "carries 'analysis_a', but stage 'verification' does not consume it",
        ),
        (
            lambda d: d["dependencies"].pop(1),
            "stage 'synthesis' consumes 'analysis_b', but no upstream stage produces it "
            "(upstream: analyst_a); add a dependency 'analyst_b' -> 'synthesis'",
        ),
        (
            lambda d: d.update(inputs=[]),
            "stage 'analyst_a' consumes 'task', but no upstream stage produces it (upstream: none); "
            "no stage produces it",
        ),
        (
            lambda d: d["stages"][3]["context"]["fields"].update(draft=["tone"]),
            "stage 'verification': context selects field 'tone' of 'draft', which has fields "
            "answer, rationale",
        ),
        (
            lambda d: d["composition"]["steps"].append("ghost"),
            "composition.steps[3] (stage): unknown stage 'ghost'",
        ),
        (
            lambda d: d["composition"]["steps"].pop(),
            "stage 'verification' is declared but the composition never runs it",
        ),
        (
            lambda d: d["composition"]["steps"].reverse(),
            "dependency 'analyst_a' -> 'synthesis' contradicts the composition, which runs "
            "'synthesis' before 'analyst_a'",
        ),
        (
            lambda d: d["composition"]["steps"].append(
                {"kind": "choice", "on": "verdict.verdict", "cases": {"maybe": "verification"}}
            ),
            "composition.steps[3] (choice): verdict.verdict can never be 'maybe' "
            "(allowed: accept, reject)",
        ),
        (
            lambda d: d["composition"]["steps"].append(
                {"kind": "choice", "on": "ghost.x", "cases": {"a": "verification"}}
            ),
            "condition on unknown artifact 'ghost'",
        ),
        (
            lambda d: d["composition"]["steps"].append(
                {
                    "kind": "repeat",
                    "body": "verification",
                    "max_iterations": 2,
                    "until": {"on": "draft.score", "equals": "1"},
                }
            ),
            "composition.steps[3] (repeat): artifact 'draft' has no field 'score'",
        ),
        (
            lambda d: d.update(memory=[{"name": "m", "scope": "private", "readers": ["ghost"]}]),
            "memory namespace 'm': role 'ghost' is not a participant of any stage",
        ),
        (
            lambda d: d["stages"][0].update(context={"memory": ["nowhere"]}),
            "stage 'analyst_a': context attaches unknown memory namespace 'nowhere'",
        ),
    ],
)
def test_cross_element_problems(mutate: Mutation, needle: str) -> None:
    assert needle in _raises(mutate)


def test_optional_inputs_need_no_upstream() -> None:
    data = make_chain_data(
        ["draft", "review"],
        composition={
            "kind": "repeat",
            "max_iterations": 3,
            "body": {"kind": "sequence", "steps": ["draft", "review"]},
        },
    )
    data["stages"][0]["optional_inputs"] = ["out_review"]
    spec = make_workload(data)
    assert spec.stage("draft").consumed() == ("task", "out_review")
    data["stages"][0]["inputs"].append("out_review")
    data["stages"][0]["optional_inputs"] = []
    with pytest.raises(SpecError, match="consumes 'out_review', but no upstream stage"):
        make_workload(data)


def test_python_construction_raises_spec_error_for_workload_problems() -> None:
    stage = Stage(
        name="a",
        participants=(Participant(role="r", deployment="m"),),
        control=SingleConfig(role="r"),
        outputs=("x",),
    )
    with pytest.raises(
        SpecError, match=r"^WorkloadSpec: workload 'w': stage 'a' produces unknown artifact 'x'"
    ):
        WorkloadSpec(name="w", stages=(stage,))
    with pytest.raises(SpecError, match="unknown stage 'b'"):
        WorkloadSpec(
            name="w",
            artifacts=(ArtifactInterface(name="x", fields=(ArtifactField(name="t"),)),),
            stages=(stage,),
            dependencies=(Dependency(source="a", target="b"),),
        )


def test_accessors_and_order() -> None:
    spec = example_spec("four_call")
    assert spec.topological_stages() == ["analyst_a", "analyst_b", "synthesis", "verification"]
    assert sorted(spec.graph().edges) == [
        ("analyst_a", "synthesis"),
        ("analyst_b", "synthesis"),
        ("synthesis", "verification"),
    ]
    assert spec.roles() == ["analyst_a", "analyst_b", "writer", "verifier"]
    assert spec.artifact("verdict").field("verdict").choices == ("accept", "reject")
    with pytest.raises(SpecError, match="unknown stage 'x' \\(stages: analyst_a"):
        spec.stage("x")
    with pytest.raises(SpecError, match="unknown artifact 'x'"):
        spec.artifact("x")
    assert example_spec("spawn").tools() == ["web_search"]


def test_no_composition_means_dataflow() -> None:
    spec = make_workload(make_chain_data(["a", "b", "c"]))
    assert spec.composition is None
    assert spec.topological_stages() == ["a", "b", "c"]
