"""Which ops of a trace share a stage for a barrier: stage instances, widened by the workflow's Γ.

One idea: a barrier coordinates ops *within one stage* (`trace.barrier`). A fork of several roles
can be written two ways — one stage with several branches (a fork-join's workers, a spawn's
children: one stage instance), or several single stages under one Γ `parallel` node (the
four-call's `analyst_a` / `analyst_b`, the hierarchical summary's two chains). The paper writes
both as one fork stage, so two ops share a coordination stage when they are in the same stage
instance, or when their stage instances (same root, same iteration) run stages that lie in
*different branches of one `parallel` node* of the root's workflow composition. Ops of stages Γ
runs in sequence (or of a workflow whose spec is not installed, e.g. an imported trace) are in
different stages.

The recorded stage label is the stage instance id, or `<root>/parallel(<stages>)` for a
composition-level fork (its stages sorted, comma-separated).

Examples:
    >>> from maserve_prefect.spec.composition import Parallel, Sequence
    >>> tree = Sequence(steps=(Parallel(branches=(Sequence(steps=("a1", "a2")), "b")), "c"))
    >>> forks = parallel_forks(tree)
    >>> forks[("a2", "b")], ("a1", "a2") in forks, ("b", "c") in forks
    ('parallel(a1,a2,b)', False, False)
"""

from __future__ import annotations

from maserve_prefect.errors import ConfigError
from maserve_prefect.spec.composition import Node, Parallel, stage_names, walk
from maserve_prefect.taskrunner.native import get_workflow
from maserve_prefect.trace.barrier import StageOf, same_stage_instance
from maserve_prefect.trace.model import OpRecord, Trace


def parallel_forks(composition: Node) -> dict[tuple[str, str], str]:
    """(stage a, stage b) → label of the `parallel` node whose different branches run them
    (both orders; the node is the pair's lowest common ancestor, so each pair has one)."""
    out: dict[tuple[str, str], str] = {}
    for _, node in walk(composition):
        if not isinstance(node, Parallel):
            continue
        branches = [stage_names(b) for b in node.branches]
        label = f"parallel({','.join(sorted(set().union(*branches)))})"
        for i, left in enumerate(branches):
            for right in branches[i + 1 :]:
                for a in left:
                    for b in right:
                        out[a, b] = out[b, a] = label
    return out


def workflow_composition(workflow: str) -> Node | None:
    """The Γ of an installed workflow (None for an unknown name, e.g. an imported trace's)."""
    if not workflow:
        return None
    try:
        return get_workflow(workflow).spec.composition
    except ConfigError:  # not an installed workflow (an import, a synthetic trace)
        return None


def coordination_stage_of(trace: Trace) -> StageOf:
    """The `StageOf` of `trace` (module docstring) for `trace.barrier.barrier_edges`."""
    stages = {s.stage_id: s for s in trace.stages}
    workflow = {r.root_id: r.workflow for r in trace.roots}
    cache: dict[str, dict[tuple[str, str], str]] = {}

    def forks(name: str) -> dict[tuple[str, str], str]:
        if name not in cache:
            composition = workflow_composition(name)
            cache[name] = parallel_forks(composition) if composition is not None else {}
        return cache[name]

    def stage_of(a: OpRecord, b: OpRecord) -> str | None:
        same = same_stage_instance(a, b)
        if same is not None or a.root_id != b.root_id:
            return same
        sa, sb = stages.get(a.stage_id), stages.get(b.stage_id)
        if sa is None or sb is None or sa.iteration != sb.iteration:
            return None
        label = forks(workflow.get(a.root_id, "")).get((sa.name, sb.name))
        return None if label is None else f"{a.root_id}/{label}"

    return stage_of
