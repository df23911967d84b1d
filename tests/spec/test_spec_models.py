"""Element-level checks: join rules, templates, stages, memory, artifacts, composition helpers."""

from __future__ import annotations

import pytest

from maserve_prefect.errors import SpecError
from maserve_prefect.spec.artifacts import ArtifactField, ArtifactInterface, split_field_path
from maserve_prefect.spec.composition import (
    Choice,
    Handoff,
    Parallel,
    Repeat,
    Sequence,
    StageRef,
    precedence,
    stage_names,
    walk,
)
from maserve_prefect.spec.memory import MemoryNamespace, MemoryScope
from maserve_prefect.spec.rules import JoinRule
from maserve_prefect.spec.stages import ContextRule, Participant, Stage
from maserve_prefect.spec.templates import (
    DebateConfig,
    ForkJoinConfig,
    RefinementLoopConfig,
    SingleConfig,
    SpawnConfig,
)


def test_join_rule_required_counts() -> None:
    assert JoinRule().required(4) == 4
    assert JoinRule(rule="any").required(4) == 1
    assert JoinRule(rule="k_of_n", k=3).required(4) == 3


@pytest.mark.parametrize(
    ("kwargs", "needle"),
    [
        ({"rule": "k_of_n"}, "needs k"),
        ({"rule": "all", "k": 2}, "takes no k"),
        ({"rule": "k_of_n", "k": 0}, "k: Input should be greater than or equal to 1"),
        ({"rule": "most"}, "rule: Input should be 'all', 'any' or 'k_of_n'"),
    ],
)
def test_join_rule_rejects(kwargs: dict[str, object], needle: str) -> None:
    with pytest.raises(SpecError, match=needle):
        JoinRule(**kwargs)  # type: ignore[arg-type]


def test_direct_construction_raises_spec_error_naming_model_and_field() -> None:
    with pytest.raises(SpecError) as info:
        ForkJoinConfig(worker_role="w", width=-2)
    assert str(info.value) == (
        "ForkJoinConfig: width: Input should be greater than or equal to 1 (got -2)"
    )


def test_spawn_needs_a_bound_and_checks_completion_width() -> None:
    with pytest.raises(SpecError, match="needs num_children"):
        SpawnConfig(parent_role="p", child_role="c")
    with pytest.raises(SpecError, match="needs max_children"):
        SpawnConfig(parent_role="p", child_role="c", children="decided")
    with pytest.raises(SpecError, match="join k=4 is wider than its 3 children"):
        SpawnConfig(
            parent_role="p",
            child_role="c",
            num_children=3,
            completion=JoinRule(rule="k_of_n", k=4),
        )
    decided = SpawnConfig(parent_role="p", child_role="c", children="decided", max_children=6)
    assert decided.bound() == 6


def test_fork_join_model_aggregation_needs_aggregator() -> None:
    with pytest.raises(SpecError, match="'summarize' needs aggregator_role"):
        ForkJoinConfig(worker_role="w", width=2, aggregation="summarize")
    ok = ForkJoinConfig(worker_role="w", width=2, aggregation="vote")
    assert ok.roles() == ("w",)


def test_refinement_loop_evaluator_and_accept_rule() -> None:
    with pytest.raises(SpecError, match="needs evaluator_role"):
        RefinementLoopConfig(generator_role="g", max_rounds=3)
    with pytest.raises(SpecError, match="needs evaluator_tool"):
        RefinementLoopConfig(generator_role="g", evaluator="tool", max_rounds=3)
    with pytest.raises(SpecError, match="threshold is required"):
        RefinementLoopConfig(
            generator_role="g", evaluator="binding", accept={"rule": "score_at_least"}, max_rounds=2
        )
    loop = RefinementLoopConfig(
        generator_role="g",
        evaluator="binding",
        accept={"rule": "score_at_least", "threshold": 0.8},
        max_rounds=2,
    )
    assert loop.roles() == ("g",)


def test_debate_peers_topology_and_hub() -> None:
    with pytest.raises(SpecError, match="at least 2 items"):
        DebateConfig(peers=("a",), rounds=2)
    with pytest.raises(SpecError, match="distinct roles"):
        DebateConfig(peers=("a", "a"), rounds=2)
    with pytest.raises(SpecError, match="only meaningful for topology 'star'"):
        DebateConfig(peers=("a", "b"), rounds=2, hub="a")
    with pytest.raises(SpecError, match="hub 'c' is not one of the peers"):
        DebateConfig(peers=("a", "b"), rounds=2, topology="star", hub="c")
    star = DebateConfig(peers=("a", "b", "c"), rounds=2, topology="star", judge_role="j")
    assert star.star_hub() == "a"
    assert star.roles() == ("a", "b", "c", "j")


def _stage(**overrides: object) -> Stage:
    fields: dict[str, object] = {
        "name": "s",
        "participants": (Participant(role="r", deployment="m"),),
        "control": SingleConfig(role="r"),
        "inputs": ("x",),
        "outputs": ("y",),
    }
    fields.update(overrides)
    return Stage(**fields)  # type: ignore[arg-type]


def test_stage_checks_roles_and_context() -> None:
    assert _stage().delivered() == ("x",)
    with pytest.raises(SpecError, match=r"control single names role 'ghost'.*participants: r"):
        _stage(control=SingleConfig(role="ghost"))
    with pytest.raises(SpecError, match="role 'r' appears twice"):
        _stage(participants=(Participant(role="r", deployment="m"),) * 2)
    with pytest.raises(SpecError, match="delivers 'z', which is not one of its inputs"):
        _stage(context=ContextRule(deliver=("z",)))
    with pytest.raises(SpecError, match="'selected' needs fields"):
        ContextRule(delivery="selected")
    with pytest.raises(SpecError, match="artifact 'x' is listed twice in inputs"):
        _stage(optional_inputs=("x",))
    with pytest.raises(SpecError, match="outputs: Tuple should have at least 1 item"):
        _stage(outputs=())


def test_participant_prompt_key_defaults_to_role() -> None:
    assert Participant(role="critic", deployment="m").prompt() == "critic"
    assert Participant(role="critic", deployment="m", prompt_key="judge").prompt() == "judge"


def test_memory_scopes_and_access() -> None:
    ns = MemoryNamespace(name="t", scope="shared_versioned", readers=("a", "b"), writers=("a",))
    assert (ns.can_read("b"), ns.can_write("b"), ns.can_write("a")) == (True, False, True)
    assert ns.roles() == ("a", "b")
    with pytest.raises(SpecError, match="private namespace belongs to one role"):
        MemoryNamespace(name="p", scope=MemoryScope.PRIVATE, readers=("a", "b"))
    with pytest.raises(SpecError, match="no role reads or writes it"):
        MemoryNamespace(name="p", scope="persistent")
    with pytest.raises(SpecError, match="max_versions applies to shared_versioned"):
        MemoryNamespace(name="p", scope="persistent", readers=("a",), max_versions=3)


def test_artifact_fields() -> None:
    art = ArtifactInterface(
        name="review", fields=(ArtifactField(name="verdict", choices=("yes", "no")),)
    )
    assert art.field("verdict").choices == ("yes", "no")
    with pytest.raises(SpecError, match="has no field 'score' \\(fields: verdict\\)"):
        art.field("score")
    with pytest.raises(SpecError, match="duplicate field 'a'"):
        ArtifactInterface(name="x", fields=(ArtifactField(name="a"), ArtifactField(name="a")))
    with pytest.raises(SpecError, match="choices need type 'text'"):
        ArtifactField(name="n", type="int", choices=("1",))
    assert split_field_path("a.b") == ("a", "b")
    for bad in ("a", "a.", ".b", "a.b.c"):
        with pytest.raises(SpecError, match=r"not of the form 'artifact\.field'"):
            split_field_path(bad)


def test_composition_shorthand_walk_and_precedence() -> None:
    tree = Sequence.model_validate(
        {
            "steps": [
                "a",
                {
                    "kind": "parallel",
                    "branches": ["b", {"kind": "repeat", "body": "c", "max_iterations": 2}],
                },
                {
                    "kind": "choice",
                    "on": "x.f",
                    "cases": {"u": "d"},
                    "default": {"kind": "handoff", "source": "e", "target": "f"},
                },
            ]
        }
    )
    assert isinstance(tree.steps[0], StageRef)
    assert stage_names(tree) == {"a", "b", "c", "d", "e", "f"}
    paths = [p for p, _ in walk(tree)]
    assert "composition.steps[1].branches[1].body" in paths
    assert "composition.steps[2].default" in paths
    order = precedence(tree)
    assert ("a", "c") in order and ("a", "f") in order and ("b", "d") in order
    assert ("e", "f") in order  # the handoff
    assert ("b", "c") not in order and ("c", "b") not in order  # parallel siblings
    assert ("d", "e") not in order  # choice case vs default


def test_composition_node_checks() -> None:
    with pytest.raises(SpecError, match="join k=3 is wider than its 2 branches"):
        Parallel(
            branches=(StageRef(stage="a"), StageRef(stage="b")), join=JoinRule(rule="k_of_n", k=3)
        )
    with pytest.raises(SpecError, match="handoff from stage 'a' to itself"):
        Handoff(source="a", target="a")
    with pytest.raises(
        SpecError, match="max_iterations: Input should be greater than or equal to 1"
    ):
        Repeat(body=StageRef(stage="a"), max_iterations=0)
    with pytest.raises(SpecError, match="cases: Dictionary should have at least 1 item"):
        Choice(on="a.b", cases={})
