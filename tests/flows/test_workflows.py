"""The shipped workflows: registry, native runs on the simulator, Full vs Selected, determinism."""

from __future__ import annotations

import ast
import json
from pathlib import Path

import pytest
from maserve_prefect.bindings import get_binding, list_bindings
from maserve_prefect.flows.native import NativeRun, run_native
from maserve_prefect.flows.workflows import get_workflow, list_workflows, load_registry
from maserve_prefect.tasks import model_call
from prefect import flow

from maserve_prefect.errors import ConfigError
from maserve_prefect.trace.bundle import export_bundle
from maserve_prefect.trace.model import OpKind

FLOWS_DIR = Path(__file__).resolve().parents[2] / "flows"
OPS = {"model_call", "tool_call", "transform", "state_read", "state_write"}
SHIPPED = {
    "spawn", "spawn_decided", "fork_join", "refinement_loop", "debate", "ordinary", "four_call_full",
    "four_call_selected", "spawn_fork_join_refinement", "fork_join_debate_refinement",
    "research_review_writing", "math_ensemble", "code_repair", "hierarchical_summary",
    "gpt_researcher_full", "gpt_researcher_selected",
}  # fmt: skip


# -- registry ---------------------------------------------------------------------------------


def test_registry_lists_every_shipped_workflow_with_its_binding() -> None:
    assert set(list_workflows()) == SHIPPED
    assert get_workflow("hierarchical_summary").default_binding == "meeting_summary"
    assert get_workflow("code_repair").final_artifact() == "code"
    with pytest.raises(ConfigError, match=r"unknown workflow 'nope'.*ordinary"):
        get_workflow("nope")


def test_unlisted_spec_file_is_an_error_naming_the_fix(tmp_path: Path) -> None:
    (tmp_path / "index.yaml").write_text("ordinary: {binding: science_qa}\n")
    for name in ("ordinary", "math_ensemble"):
        (tmp_path / f"{name}.yaml").write_text((FLOWS_DIR / "specs" / f"{name}.yaml").read_text())
    with pytest.raises(ConfigError, match=r"math_ensemble\.yaml: spec file not listed"):
        load_registry(tmp_path / "index.yaml")


def test_index_entry_must_match_its_spec(tmp_path: Path) -> None:
    (tmp_path / "index.yaml").write_text("solo: {binding: math, spec: ordinary.yaml}\n")
    (tmp_path / "ordinary.yaml").write_text((FLOWS_DIR / "specs" / "ordinary.yaml").read_text())
    with pytest.raises(ConfigError, match="spec is named 'ordinary'"):
        load_registry(tmp_path / "index.yaml")


# -- ops are only ever submitted ------------------------------------------------------------


def direct_op_calls(source: str) -> list[int]:
    """Lines where an op task is called other than through `.submit` / `.map`."""
    lines = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.Call):
            continue
        fn = node.func
        if isinstance(fn, ast.Name) and fn.id in OPS:
            lines.append(node.lineno)
        elif (
            isinstance(fn, ast.Attribute)
            and isinstance(fn.value, ast.Name)
            and fn.value.id in OPS
            and fn.attr not in ("submit", "map")
        ):
            lines.append(node.lineno)
    return lines


def test_scanner_flags_direct_calls() -> None:
    code = "model_call(role='r')\ntransform.submit(fn='x')\ntool_call.fn(tool='t')\n"
    assert direct_op_calls(code) == [1, 3]


@pytest.mark.parametrize("path", sorted(FLOWS_DIR.glob("*.py")), ids=lambda p: p.name)
def test_flows_only_submit_ops(path: Path) -> None:
    assert direct_op_calls(path.read_text()) == [], f"{path}: call ops with .submit()/.map()"


@pytest.mark.usefixtures("prefect_api")
def test_direct_op_call_in_a_flow_is_refused() -> None:
    @flow
    def bad() -> None:
        model_call(role="solver", deployment="main", system="s")

    with pytest.raises(ConfigError, match=r"model_call\.submit"):
        bad()


# -- native runs ------------------------------------------------------------------------------


@pytest.mark.usefixtures("prefect_api")
@pytest.mark.parametrize("name", sorted(SHIPPED))
def test_every_workflow_runs_one_root(name: str) -> None:
    run = run_native(name, users=1, seed=0)
    assert [r.error for r in run.roots] == [None]
    ops = run.trace.ops
    assert ops and all(op.times.completed_s is not None for op in ops)
    assert any(op.kind is OpKind.MODEL for op in ops)
    stages = {s.name for s in get_workflow(name).spec.stages}
    assert {op.stage_id.split("/", 1)[1].split("#")[0] for op in ops} <= stages


@pytest.mark.usefixtures("prefect_api")
def test_math_ensemble_solvers_span_four_deployments() -> None:
    run = run_native("math_ensemble", users=1, seed=0)
    solvers = [op for op in run.trace.ops if op.role == "solver"]
    used = sorted(op.generation.deployment for op in solvers if op.generation is not None)
    assert used == ["large", "main", "main", "small", "tiny"]
    vote = next(op for op in run.trace.ops if op.kind is OpKind.TRANSFORM)
    assert len(vote.deps) == 5


@pytest.mark.usefixtures("prefect_api")
def test_code_repair_runs_tests_as_a_tool_and_loops_until_they_pass() -> None:
    run = run_native("code_repair", users=1, seed=0)
    tools = [op for op in run.trace.ops if op.kind is OpKind.TOOL]
    assert tools and all(op.tool_name == "run_tests" for op in tools)
    repairs = [op for op in run.trace.ops if op.role == "repairer"]
    # every test run but the last one was failed and repaired (the loop stops on a pass or at
    # three iterations, in which case the last repair is never re-tested)
    assert len(repairs) in (len(tools) - 1, len(tools))
    models = {op.generation.deployment for op in run.trace.ops if op.generation is not None}
    assert models == {"main", "small", "large", "tiny"}


@pytest.mark.usefixtures("prefect_api")
def test_hierarchical_summary_stages_read_only_their_chunk() -> None:
    run = run_native("hierarchical_summary", users=1, seed=0)
    binding = get_binding(get_workflow("hierarchical_summary").default_binding)
    chunks = binding.instance(run.roots[0].instance_id).inputs["document"]["chunks"]
    calls = {op.stage_id.split("/", 1)[1]: op for op in run.trace.ops}
    for stage, index in (("chain_a1", 0), ("chain_a3", 2), ("chain_b1", 3), ("chain_b3", 5)):
        prompt = json.dumps(run.harness.store.get_json(calls[stage].input_refs[0]))
        seen = [i for i, chunk in enumerate(chunks) if json.dumps(chunk)[1:-1] in prompt]
        assert seen == [index], stage
    chain = [calls[f"chain_a{k}"] for k in (1, 2, 3)]
    assert [d.op_id for d in chain[2].deps] == [chain[1].op_id]


def _by_stage(run: NativeRun) -> dict[str, tuple[int, int]]:
    return {
        op.stage_id.split("/", 1)[1]: (op.num_input_tokens, op.num_output_tokens)
        for op in run.trace.ops
    }


@pytest.mark.usefixtures("prefect_api")
@pytest.mark.parametrize("binding", list_bindings())
def test_selected_delivery_changes_downstream_work_natively(binding: str) -> None:
    """Full vs Selected on the simulator, under every shipped binding (each responds to
    context): the analysts are given the same and do the same work; synthesis is given less
    under Selected, and both downstream calls realize different input *and* output work
    (issue 16: lengths are functions of what the call was given, seeded by its prompt digest)."""
    for seed in (0, 4) if binding == "research" else (0,):
        full = _by_stage(run_native("four_call_full", binding, users=1, seed=seed))
        selected = _by_stage(run_native("four_call_selected", binding, users=1, seed=seed))
        assert full.keys() == selected.keys()
        for stage in ("analyst_a", "analyst_b"):
            assert selected[stage] == full[stage]
        for stage in ("synthesis", "verification"):
            assert selected[stage][0] < full[stage][0], (seed, stage)
            assert selected[stage][1] != full[stage][1], (seed, stage)


@pytest.mark.usefixtures("prefect_api")
def test_same_seed_gives_a_byte_identical_bundle(tmp_path: Path) -> None:
    dirs = []
    for i in range(2):
        run = run_native("code_repair", users=2, seed=9)
        dirs.append(export_bundle(run.trace, run.harness.store, tmp_path / f"b{i}"))

    def files(d: Path) -> dict[str, bytes]:
        return {str(p.relative_to(d)): p.read_bytes() for p in sorted(d.rglob("*")) if p.is_file()}

    first, second = files(dirs[0]), files(dirs[1])
    assert len(first) > 2
    assert first == second
