"""maserve_prefect.tasks, op by op: prompt order, the select_field and majority_vote transforms,
and state versions with the state edge a read gains."""

from __future__ import annotations

import pytest
from maserve_prefect.tasks import Artifact, ContextSpec, build_messages, state_read, state_write
from maserve_prefect.tasks.transform import get_transform
from prefect import flow

from maserve_prefect.clock.kernel import Kernel
from maserve_prefect.errors import ConfigError
from maserve_prefect.spec.rules import Delivery, HistoryMode
from maserve_prefect.taskrunner.harness import Harness, activate
from maserve_prefect.taskrunner.lockstep import VirtualGate
from maserve_prefect.taskrunner.oprun import scope
from maserve_prefect.taskrunner.runner import MAServeTaskRunner
from maserve_prefect.trace.model import Dep, EdgeKind, Manifest, OpKind, OpRecord

# -- build_messages -------------------------------------------------------------------------


def test_fresh_history_drops_the_history_and_keeps_delivery_order() -> None:
    a, b = Artifact("b-second", "B", producer="r/x/1"), Artifact("a-first", "A", producer="r/x/0")
    msgs = build_messages("sys", "", delivered=[a, b], history=[("user", "old")])
    assert msgs == (
        ("system", "sys"),
        ("user", "[b-second from r/x/1]\nB\n\n[a-first from r/x/0]\nA"),
    )


def test_selected_delivery_reduces_only_the_named_artifacts() -> None:
    named = Artifact("analysis", "Long text. More.", {"claim": "up", "n": 3}, producer="r/a/0")
    other = Artifact("summary", "whole summary", {"claim": "ignored"}, producer="r/s/0")
    ctx = ContextSpec(delivery=Delivery.SELECTED, fields={"analysis": ("n", "claim")})
    user = build_messages("sys", "task", delivered=[named, other], context=ctx)[-1][1]
    assert (
        user
        == "task\n\n[analysis from r/a/0] claim: up; n: 3\n\n[summary from r/s/0]\nwhole summary"
    )


def test_inherited_history_sits_between_system_and_the_new_turn() -> None:
    history = [("user", "q1"), ("assistant", "a1")]
    ctx = ContextSpec(history=HistoryMode.INHERITED)
    msgs = build_messages("sys", "q2", history=history, context=ctx, instruction="be brief")
    assert msgs == (("system", "sys"), *history, ("user", "q2\n\nbe brief"))


# -- transforms -----------------------------------------------------------------------------


def test_select_field_joins_every_value_and_keeps_the_first() -> None:
    inputs = [
        Artifact("x", "", {"answer": 7}),
        Artifact("y", "", {}),
        Artifact("z", "", {"answer": "b"}),
    ]
    assert get_transform("select_field")(inputs, "answer") == ("7\n\nb", {"answer": "7"})
    assert get_transform("select_field")([], "answer") == ("", {"answer": ""})


def test_majority_vote_ties_break_by_first_appearance() -> None:
    votes = ["b", "a", "a", "b", "c"]
    inputs = [Artifact("v", f"text {i}", {"answer": v}) for i, v in enumerate(votes)]
    text, fields = get_transform("majority_vote")(inputs, "")  # default field: answer
    assert (text, fields) == ("text 0", {"answer": "b", "support": 2, "voters": 5})
    # The same votes in another order: the tie now goes to "a", the first to appear.
    text, fields = get_transform("majority_vote")(inputs[1:] + inputs[:1], "answer")
    assert (text, fields["answer"]) == ("text 1", "a")


def test_majority_vote_counts_a_missing_field_as_an_empty_vote() -> None:
    inputs = [Artifact("v", "no answer", {}), Artifact("v", "", {}), Artifact("v", "y", {"k": "y"})]
    text, fields = get_transform("majority_vote")(inputs, "k")
    assert (text, fields) == ("no answer", {"k": "", "support": 2, "voters": 3})


def test_unknown_transform_names_the_known_ones() -> None:
    with pytest.raises(ConfigError, match=r"unknown transform 'median'; known: .*majority_vote"):
        get_transform("median")


# -- state ----------------------------------------------------------------------------------


@flow(task_runner=MAServeTaskRunner(max_workers=2))
def state_flow() -> dict[str, object]:
    out: dict[str, object] = {}
    with scope(root_id="r0", stage_id="s", session_id="mem"):
        empty = state_read.submit(name="notes")
        w1 = state_write.submit(name="notes", value=Artifact("n", "one"), wait_for=[empty])
        w2 = state_write.submit(name="notes", value=Artifact("n", "two"), wait_for=[w1])
        r = state_read.submit(name="notes", wait_for=[w2])
        w3 = state_write.submit(name="notes", value=Artifact("n", "three"), wait_for=[r])
        shared = state_write.submit(name="lessons", value=Artifact("l", "L"), persistent=True)
        out.update(empty=empty.result(), w1=w1.result(), w2=w2.result(), read=r.result())
        out.update(w3=w3.result(), shared=shared.result())
    with scope(root_id="r1", stage_id="s", session_id="mem"):
        other = state_read.submit(name="notes")
        lessons = state_read.submit(name="lessons", persistent=True, wait_for=[other])
        out.update(other=other.result(), lessons=lessons.result())
    return out


@pytest.fixture(scope="module")
def state_run(prefect_api: None) -> tuple[dict[str, Artifact], dict[str, OpRecord]]:
    gate = VirtualGate(Kernel())
    harness = Harness(gate, Manifest(trace_id="state"))
    with gate, activate(harness):
        out = state_flow()
    arts = {k: v for k, v in out.items() if isinstance(v, Artifact)}
    return arts, {op.op_id: op for op in harness.book.ops}


def state_deps(op: OpRecord) -> list[Dep]:
    return [d for d in op.deps if d.kind is EdgeKind.STATE]


def test_state_versions_increase_per_write(
    state_run: tuple[dict[str, Artifact], dict[str, OpRecord]],
) -> None:
    arts, _ = state_run
    assert [arts[k].field("version") for k in ("w1", "w2", "w3")] == [1, 2, 3]
    assert arts["empty"].field("version") == 0 and arts["empty"].text == ""


def test_a_read_gains_a_state_edge_to_the_latest_writer(
    state_run: tuple[dict[str, Artifact], dict[str, OpRecord]],
) -> None:
    arts, ops = state_run
    read = ops[arts["read"].producer]
    assert read.kind is OpKind.STATE_READ
    assert (arts["read"].text, arts["read"].field("version")) == ("two", 2)
    assert state_deps(read) == [Dep(op_id=arts["w2"].producer, kind=EdgeKind.STATE)]
    assert state_deps(ops[arts["empty"].producer]) == []  # nothing written yet: no edge


def test_task_state_is_per_root_and_persistent_memory_edges_are_not_required(
    state_run: tuple[dict[str, Artifact], dict[str, OpRecord]],
) -> None:
    arts, ops = state_run
    assert arts["other"].field("version") == 0  # r0's notes are not r1's
    lessons = ops[arts["lessons"].producer]
    writer = arts["shared"].producer  # root r0's write: a cross-root edge replay may relax
    assert ops[writer].root_id == "r0"
    assert state_deps(lessons) == [Dep(op_id=writer, kind=EdgeKind.STATE, required=False)]
