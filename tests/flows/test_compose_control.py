"""Composition decisions are CONTROL edges in the Semantic Trace, exactly where they gate ops.

A choice's branch waits for the op its predicate read; a repeat's next iteration for the op its
until-condition read, and once that condition holds, everything after the repeat does; after an
any / k-of-n join, everything that follows waits for the branch outputs that completed the join.
An op that already reaches the deciding op through data edges gets no control edge, so no pair
of ops is joined by both kinds.

The expected edges are derived here from the rule and the realized run (which iterations ran,
which branches finished first), never from the edges themselves.
"""

from __future__ import annotations

import pytest
from maserve_prefect.flows.native import run_native
from maserve_prefect.flows.workflows import Workflow

from maserve_prefect.spec.io import spec_from_yaml
from maserve_prefect.trace.model import EdgeKind, OpRecord, Trace

pytestmark = pytest.mark.usefixtures("prefect_api")

_SPEC = """
name: compose_control
artifacts:
  - {{name: task, fields: [{{name: question}}]}}
  - {{name: draft, fields: [{{name: answer}}]}}
  - {{name: report, fields: [{{name: verdict, choices: [accept, revise]}}, {{name: ok, type: bool}}]}}
  - {{name: note, fields: [{{name: answer}}]}}
  - {{name: pa_out, fields: [{{name: answer}}]}}
  - {{name: pb_out, fields: [{{name: answer}}]}}
  - {{name: pc_out, fields: [{{name: answer}}]}}
  - {{name: mid_out, fields: [{{name: answer}}]}}
  - {{name: qa_out, fields: [{{name: answer}}]}}
  - {{name: qb_out, fields: [{{name: answer}}]}}
  - {{name: qc_out, fields: [{{name: answer}}]}}
  - {{name: brief, fields: [{{name: answer}}]}}
  - {{name: final, fields: [{{name: answer}}]}}
inputs: [task]
stages:
  - {{name: draft, inputs: [task], outputs: [draft],
     participants: [{{role: writer, deployment: main}}], control: {{kind: single, role: writer}}}}
  - name: check
    inputs: [draft]
    outputs: [report]
    participants: [{{role: verifier, deployment: main, tools: [binding_evaluate]}}]
    control: {{kind: tool, role: verifier, tool: binding_evaluate, arg_from: {{answer: draft}},
              verdict: true}}
  - {{name: fix, inputs: [task], outputs: [note],
     participants: [{{role: editor, deployment: main}}], control: {{kind: single, role: editor}}}}
{workers}
  - {{name: lead, inputs: [task], outputs: [brief],
     participants: [{{role: lead, deployment: main}}], control: {{kind: single, role: lead}}}}
  - {{name: follow, inputs: [task], outputs: [final], context: {{history: inherited}},
     participants: [{{role: lead, deployment: main}}], control: {{kind: single, role: lead}}}}
dependencies:
  - {{source: draft, target: check, artifact: draft}}
composition:
  kind: sequence
  steps:
    - draft
    - kind: repeat
      max_iterations: {iterations}
      until: {{on: {until_on}, equals: accept}}
      body:
        kind: sequence
        steps:
          - check
          - {{kind: choice, on: report.verdict, cases: {{revise: fix}}}}
    - {{kind: parallel, join: {{rule: any}}, branches: [pa, pb, pc]}}
    - mid
    - {{kind: parallel, join: {{rule: k_of_n, k: 2}}, branches: [qa, qb, qc]}}
    - {{kind: handoff, source: lead, target: follow, carry: history}}
"""
_WORKERS = {"pa": "solver", "pb": "analyst", "pc": "expert", "mid": "synthesizer"}
_WORKERS |= {"qa": "solver", "qb": "analyst", "qc": "expert"}
MAX_ITERATIONS = 4


def control_workflow(until_on: str = "report.verdict") -> Workflow:
    """Choice, repeat-until, an any join, a 2-of-3 join and a history handoff in one root.

    `until_on` names the field the repeat stops on (`note.answer` never reads "accept": the
    repeat then runs out of iterations).
    """
    workers = "\n".join(
        f"  - {{name: {name}, inputs: [task], outputs: [{name}_out],\n"
        f"     participants: [{{role: {role}, deployment: main}}],"
        f" control: {{kind: single, role: {role}}}}}"
        for name, role in _WORKERS.items()
    )
    text = _SPEC.format(workers=workers, iterations=MAX_ITERATIONS, until_on=until_on)
    return Workflow("compose_control", spec_from_yaml(text), "finance")  # accepts 0.5 at round 1


Edge = tuple[str, str]


def control_edges(trace: Trace) -> set[Edge]:
    """(upstream stage instance, downstream stage instance) of every CONTROL dep."""
    stage_of = {op.op_id: _local(op.stage_id) for op in trace.ops}
    return {
        (stage_of[d.op_id], _local(op.stage_id))
        for op in trace.ops
        for d in op.deps
        if d.kind is EdgeKind.CONTROL
    }


def _local(stage_id: str) -> str:
    return stage_id.split("/", 1)[1]


def _name(op: OpRecord) -> str:
    """The stage an op belongs to (its instance id without the `#iteration` suffix)."""
    return _local(op.stage_id).partition("#")[0]


def _one(trace: Trace, stage_id: str) -> OpRecord:
    (op,) = [op for op in trace.ops if _local(op.stage_id) == stage_id]
    return op


def first_done(trace: Trace, stages: list[str], k: int) -> list[str]:
    """The join's choice: of the branches done when the k-th finished, the first k by position."""
    done_at = {s: _one(trace, s).times.completed_s for s in stages}
    t_k = sorted(done_at.values())[k - 1]
    return [s for s in stages if done_at[s] <= t_k][:k]


def assert_no_double_edges(trace: Trace) -> None:
    for op in trace.ops:
        ups = [d.op_id for d in op.deps if d.kind in (EdgeKind.DATA, EdgeKind.CONTROL)]
        assert len(ups) == len(set(ups)), f"{op.op_id} has both a data and a control edge"


def _instance(name: str, iteration: int) -> str:
    return f"{name}#{iteration}" if iteration else name


@pytest.mark.parametrize("seed", [2, 5])  # seeds whose loop revises (finance binding)
def test_every_decision_gates_exactly_the_ops_it_released(seed: int) -> None:
    run = run_native(control_workflow(), users=1, seed=seed)
    assert [r.error for r in run.roots] == [None]
    trace = run.trace
    checks = sorted((op for op in trace.ops if _name(op) == "check"), key=lambda op: op.iteration)
    n = len(checks)
    fixes = [op for op in trace.ops if _name(op) == "fix"]
    # the seed's loop revised at least once, then ended on its until-condition
    assert 2 <= n < MAX_ITERATIONS and len(fixes) == n - 1

    expected: set[Edge] = set()
    for i in range(n - 1):  # iteration i said "revise": the fix branch and the next iteration
        expected.add((_instance("check", i), _instance("fix", i)))
        expected.add((_instance("check", i), _instance("check", i + 1)))
    accepting = _instance("check", n - 1)
    expected |= {(accepting, p) for p in ("pa", "pb", "pc")}
    (winner,) = first_done(trace, ["pa", "pb", "pc"], 1)
    expected |= {(winner, s) for s in ("mid", "qa", "qb", "qc")}
    expected |= {(w, "lead") for w in first_done(trace, ["qa", "qb", "qc"], 2)}
    # the handoff target continues the lead's conversation: a data edge, no control edge
    assert control_edges(trace) == expected
    assert [(d.op_id, d.kind) for d in _one(trace, "follow").deps] == [
        (_one(trace, "lead").op_id, EdgeKind.DATA)
    ]
    assert_no_double_edges(trace)

    again = run_native(control_workflow(), users=1, seed=seed).trace
    assert sorted((op.op_id, op.deps) for op in again.ops) == sorted(
        (op.op_id, op.deps) for op in trace.ops
    )


def test_a_repeat_that_runs_out_of_iterations_gates_only_its_next_iterations() -> None:
    """Until `note.answer` (never "accept"): each next iteration waits for the latest fix (the
    op the condition read, when one has run), and nothing after the repeat waits for it."""
    run = run_native(control_workflow(until_on="note.answer"), users=1, seed=2)
    assert [r.error for r in run.roots] == [None]
    trace = run.trace
    ran = {_local(op.stage_id) for op in trace.ops}
    assert {_instance("check", i) for i in range(MAX_ITERATIONS)} <= ran
    assert "fix" in ran

    expected: set[Edge] = set()
    latest_fix: str | None = None
    for i in range(MAX_ITERATIONS):
        if _instance("fix", i) in ran:
            expected.add((_instance("check", i), _instance("fix", i)))
            latest_fix = _instance("fix", i)
        if latest_fix is not None and i + 1 < MAX_ITERATIONS:
            expected.add((latest_fix, _instance("check", i + 1)))
    (winner,) = first_done(trace, ["pa", "pb", "pc"], 1)
    expected |= {(winner, s) for s in ("mid", "qa", "qb", "qc")}
    expected |= {(w, "lead") for w in first_done(trace, ["qa", "qb", "qc"], 2)}
    assert control_edges(trace) == expected
    assert_no_double_edges(trace)


def test_code_repair_validate_waits_for_the_accepting_test_run() -> None:
    run = run_native("code_repair", users=1, seed=0)
    assert [r.error for r in run.roots] == [None]
    trace = run.trace
    tests = sorted(
        (op for op in trace.ops if _name(op) == "run_tests"), key=lambda op: op.iteration
    )
    repairs = [op for op in trace.ops if _name(op) == "repair"]
    # the loop ended on "accept": every earlier run said "revise" and was repaired
    assert len(repairs) == len(tests) - 1 >= 1
    validate = _one(trace, "validate")
    last_repair = max(repairs, key=lambda op: op.iteration)
    assert {(d.op_id, d.kind) for d in validate.deps} == {
        (last_repair.op_id, EdgeKind.DATA),
        (tests[-1].op_id, EdgeKind.CONTROL),
    }
    # every other decision's released ops already read the deciding test run through data
    assert control_edges(trace) == {(_local(tests[-1].stage_id), "validate")}
    assert_no_double_edges(trace)
