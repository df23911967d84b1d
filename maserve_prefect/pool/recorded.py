"""Recorded roots as pool work: native traces → `RootDag`s of `WorkUnit`s with arrivals.

One idea: the *work* is recorded once — a native simulator run of a workflow (`run_native`) for
a seed fixes every model call's input and output length and every dependency — and a pool
experiment only varies lifecycle and placement. So each root of a trace becomes one pool
`RootDag`: its model ops become `WorkUnit`s, and its non-model ops (tools, transforms, state
reads and writes) are collapsed into edges. A model op waits for every model op it reaches
backwards through required dependencies whose intermediate ops are all non-model
(`collapsed_preds`), so the units' DAG has exactly the trace's model-to-model reachability.

Known limit: a `WorkUnit` has no delay, so a tool's measured duration (and any controlled
external delay) is folded into a zero-cost edge. `RootWork.folded_delay_s` keeps the total per
root and the suite reports it (on the shipped workflows: the code-repair test runs, 1.5 s each).

Models. Specs name *logical* deployments (`main`, `large`, `small`, `tiny`); the pool file the
trace was recorded with (its manifest's `notes.pool`) maps them to models — the shipped default
pool: tiny → Qwen3-0.6B, small → Qwen3-1.7B, main → Qwen3-8B, large → Qwen3-14B. To use all
five Qwen3 sizes of the heterogeneous-pool experiment, `ROLE_MODELS` moves one role per
workflow to Qwen3-4B, as the specs suggest:

- math_ensemble: the five heterogeneous solvers get the five sizes — worker0 (large) 14B,
  worker1 (main) 8B, worker2 (main) **4B**, worker3 (small) 1.7B, worker4 (tiny) 0.6B; the
  refining writer (large) 14B;
- code_repair: coder (main) 8B, diagnoser (small) 1.7B, reviewer (large) 14B, repairer (main)
  **4B**, validator (tiny) 0.6B;
- hierarchical_summary (QMSum): the paper's map (§2.3, "two parallel three-node Qwen3-4B
  lanes followed by three Qwen3-8B aggregation nodes") — both rolling-summary chains **4B**,
  merge, answer and edit **8B**.

A unit's deployment is its model name, so every root needing a model shares that model's
replicas (`run_pool` builds a default deployment per model name). Keys of `ROLE_MODELS` are the
op's session within its root with iteration suffixes dropped (`repair#1.repairer` →
`repair.repairer`), so every iteration of a loop maps alike.

Sessions: `bench.pool.traces.record_traces` realizes `users` roots per workflow for one seed
(cached on disk, as JSON, under `$MASERVE_HOME/pool_traces/`); `build_root_dags` interleaves the
roots of several workflows in a seeded order and gives them arrival offsets from an
`ArrivalPattern` — burst (all at 0) or, as the paper's evaluation has it (§4.2, "per-scenario
rates"), one Poisson process per workflow at the rate, each with its own seed
(`ARRIVAL_SEED + run + 1000 * k` for the k-th workflow in order of first appearance).

Examples:
    >>> from maserve_prefect.trace.model import Dep, EdgeKind, Manifest, OpKind, OpRecord, Trace
    >>> from maserve_prefect.trace.model import GenerationSettings as G
    >>> m = lambda i, deps: OpRecord(op_id=f"r0/{i}", root_id="r0", kind=OpKind.MODEL,
    ...     session_id=f"r0/{i}.x", generation=G(deployment="main"), num_input_tokens=10,
    ...     num_output_tokens=5, deps=tuple(Dep(op_id=f"r0/{d}", kind=EdgeKind.DATA) for d in deps))
    >>> tool = OpRecord(op_id="r0/t", root_id="r0", kind=OpKind.TOOL, tool_duration_s=1.5,
    ...                 deps=(Dep(op_id="r0/a", kind=EdgeKind.DATA),))
    >>> t = Trace(manifest=Manifest(trace_id="t"), ops=[m("a", []), tool, m("b", ["t"])])
    >>> [work] = convert_trace(t, "demo", {"main": "Qwen3-8B"})
    >>> [(u.unit_id, u.deployment, u.preds) for u in work.units]
    [('demo/r0/a', 'Qwen3-8B', ()), ('demo/r0/b', 'Qwen3-8B', ('demo/r0/a',))]
    >>> work.folded_delay_s
    1.5
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from maserve_prefect.errors import ConfigError
from maserve_prefect.pool.inputs import RootDag
from maserve_prefect.pool.window import WorkUnit
from maserve_prefect.trace.model import OpKind, OpRecord, OpStatus, Trace
from maserve_prefect.workloads.arrivals import BurstArrivals, PoissonArrivals

POOL_MODELS = ("Qwen3-0.6B", "Qwen3-1.7B", "Qwen3-4B", "Qwen3-8B", "Qwen3-14B")
"""The five model sizes of the heterogeneous-pool experiment."""

WORKFLOWS = ("math_ensemble", "code_repair", "hierarchical_summary")
"""The experiment's workflows (`flows/specs/`)."""

ROLE_MODELS: Mapping[tuple[str, str], str] = {
    ("math_ensemble", "solve.worker2"): "Qwen3-4B",
    ("code_repair", "repair.repairer"): "Qwen3-4B",
    ("hierarchical_summary", "chain_a1.summarizer"): "Qwen3-4B",
    ("hierarchical_summary", "chain_a2.summarizer"): "Qwen3-4B",
    ("hierarchical_summary", "chain_a3.summarizer"): "Qwen3-4B",
    ("hierarchical_summary", "chain_b1.summarizer"): "Qwen3-4B",
    ("hierarchical_summary", "chain_b2.summarizer"): "Qwen3-4B",
    ("hierarchical_summary", "chain_b3.summarizer"): "Qwen3-4B",
    ("hierarchical_summary", "merge.aggregator"): "Qwen3-8B",
}
"""(workflow, session key) → model, overriding the pool file's model (module docstring)."""

ARRIVAL_SEED = 42
_ITERATION = re.compile(r"#\d+")


@dataclass(frozen=True, slots=True)
class RootWork:
    """One recorded root as pool work (arrival not yet chosen).

    Attributes:
        root_id: unique across workflows (`<workflow>/<recorded root id>`).
        units: the root's model calls, preds/succs after collapsing non-model ops.
        num_folded_ops: non-model ops collapsed into edges.
        folded_delay_s: their recorded tool durations + external delays (not modelled).
    """

    root_id: str
    workflow: str
    units: tuple[WorkUnit, ...]
    num_folded_ops: int
    folded_delay_s: float

    def at(self, arrival_s: float) -> RootDag:
        """This root as a pool `RootDag` arriving `arrival_s` after the run starts."""
        return RootDag(self.root_id, arrival_s, self.units, self.workflow)

    @property
    def models(self) -> tuple[str, ...]:
        """The models its units use, in `POOL_MODELS` order (others after, sorted)."""
        used = {u.deployment for u in self.units}
        return tuple(sorted(used, key=lambda m: (POOL_MODELS.index(m) if m in POOL_MODELS
                                                 else len(POOL_MODELS), m)))  # fmt: skip


def session_key(op: OpRecord) -> str:
    """The op's session within its root, iteration suffixes dropped.

    Examples:
        >>> from maserve_prefect.trace.model import OpRecord, OpKind
        >>> session_key(OpRecord(op_id="r/x", root_id="r0", kind=OpKind.MODEL,
        ...                      session_id="r0/repair#2.repairer"))
        'repair.repairer'
    """
    local = op.session_id.removeprefix(f"{op.root_id}/")
    return _ITERATION.sub("", local)


def recorded_models(trace: Trace) -> dict[str, str]:
    """Logical deployment → model, from the pool file recorded in the trace's manifest.

    Raises:
        ConfigError: the manifest carries no pool (not a native run of this project).
    """
    pool = trace.manifest.notes.get("pool")
    if not isinstance(pool, Mapping) or not pool.get("deployments"):
        raise ConfigError(
            f"trace {trace.manifest.trace_id}: the manifest has no `notes.pool.deployments`; "
            "record it with flows.native.run_native or pass the deployment → model map"
        )
    out = {str(d["name"]): str(d["model"]) for d in pool["deployments"]}
    aliases = pool.get("aliases") or {}
    out |= {str(a): out[str(t)] for a, t in aliases.items() if str(t) in out}
    return out


def _final_attempts(trace: Trace) -> dict[str, OpRecord]:
    """The completed attempt of every op (a later attempt supersedes an earlier one)."""
    ops: dict[str, OpRecord] = {}
    for op in sorted(trace.ops, key=lambda o: (o.op_id, o.attempt)):
        if op.status is OpStatus.COMPLETED:
            ops[op.op_id] = op
    missing = sorted({o.op_id for o in trace.ops} - set(ops))
    if missing:
        raise ConfigError(
            f"trace {trace.manifest.trace_id}: op {missing[0]!r} (and {len(missing) - 1} more) "
            "never completed; convert only complete traces (the work must be known)"
        )
    return ops


def collapsed_preds(ops: Mapping[str, OpRecord]) -> dict[str, tuple[str, ...]]:
    """Per model op, the model ops it waits for through required deps, non-model ops collapsed.

    A required dep on a model op is kept; a required dep on a non-model op is replaced by that
    op's own collapsed predecessors (recursively), so tool / transform / state ops vanish while
    every ordering they imposed between model ops stays.

    Raises:
        ConfigError: a dep names an op the trace does not hold.
    """
    memo: dict[str, frozenset[str]] = {}

    def reach(op_id: str) -> frozenset[str]:
        """Model ops reached backwards from `op_id`'s required deps (chains of non-model ops
        are short, so plain recursion with a memo is enough)."""
        if op_id not in memo:
            found: set[str] = set()
            for p in _required(ops, op_id):
                found |= {p} if ops[p].kind is OpKind.MODEL else reach(p)
            memo[op_id] = frozenset(found)
        return memo[op_id]

    out = {}
    for op_id, op in ops.items():
        if op.kind is not OpKind.MODEL:
            continue
        out[op_id] = tuple(sorted(reach(op_id)))
    return out


def _required(ops: Mapping[str, OpRecord], op_id: str) -> list[str]:
    deps = [d.op_id for d in ops[op_id].deps if d.required]
    for d in deps:
        if d not in ops:
            raise ConfigError(f"op {op_id!r}: dependency {d!r} is not in the trace")
    return deps


def model_of(
    workflow: str,
    op: OpRecord,
    deployments: Mapping[str, str],
    role_models: Mapping[tuple[str, str], str] = ROLE_MODELS,
) -> str:
    """The model serving model op `op` (module docstring: role override, else the pool file).

    Raises:
        ConfigError: the op has no deployment, or one the pool file does not map.
    """
    override = role_models.get((workflow, session_key(op)))
    if override is not None:
        return override
    dep = op.generation.deployment if op.generation else ""
    if dep not in deployments:
        raise ConfigError(
            f"op {op.op_id!r}: deployment {dep!r} is not in the recorded pool "
            f"({', '.join(sorted(deployments))}); pass a deployment → model map that has it"
        )
    return deployments[dep]


def convert_trace(
    trace: Trace,
    workflow: str,
    deployments: Mapping[str, str] | None = None,
    role_models: Mapping[tuple[str, str], str] = ROLE_MODELS,
) -> list[RootWork]:
    """Every root of a native trace as pool work, roots in id order (module docstring).

    Args:
        trace: a complete trace (every op has a completed attempt).
        workflow: its workflow name; prefixes root and unit ids and keys `role_models`.
        deployments: logical deployment → model (default: the trace's recorded pool file).
        role_models: per-role model overrides.

    Raises:
        ConfigError: an incomplete trace, a dangling dep, or an unmapped deployment.
    """
    deps_map = recorded_models(trace) if deployments is None else dict(deployments)
    ops = _final_attempts(trace)
    preds = collapsed_preds(ops)
    by_root: dict[str, list[OpRecord]] = {}
    for op in ops.values():
        by_root.setdefault(op.root_id, []).append(op)
    out = []
    for root in sorted(by_root):
        rid = f"{workflow}/{root}"
        mine = sorted(by_root[root], key=lambda o: o.op_id)
        models = [o for o in mine if o.kind is OpKind.MODEL]
        succs: dict[str, list[str]] = {o.op_id: [] for o in models}
        for o in models:
            for p in preds[o.op_id]:
                succs[p].append(o.op_id)
        units = tuple(
            WorkUnit(
                unit_id=f"{workflow}/{o.op_id}",
                root_id=rid,
                deployment=model_of(workflow, o, deps_map, role_models),
                input_len=o.num_input_tokens,
                max_tokens=o.num_output_tokens,
                preds=tuple(f"{workflow}/{p}" for p in preds[o.op_id]),
                succs=tuple(f"{workflow}/{s}" for s in sorted(succs[o.op_id])),
                priority=o.generation.priority if o.generation else 0,
                workflow=workflow,
            )
            for o in models
        )
        folded = [o for o in mine if o.kind is not OpKind.MODEL]
        delay = sum((o.tool_duration_s or 0.0) + o.external_delay_s for o in folded)
        out.append(RootWork(rid, workflow, units, len(folded), delay))
    return out


# -- sessions and arrivals ------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ArrivalPattern:
    """How sessions arrive: `burst` (all at 0) or `poisson` at `rate_per_s` (seed 42 + run).

    Examples:
        >>> ArrivalPattern("poisson", 0.15).offsets(3, run=0) == ArrivalPattern(
        ...     "poisson", 0.15).offsets(3, run=0)
        True
        >>> ArrivalPattern("burst").offsets(2, run=3), ArrivalPattern("poisson", 0.075).name
        ([0.0, 0.0], 'poisson-0.075')
    """

    kind: str
    rate_per_s: float = 0.0

    def __post_init__(self) -> None:
        if self.kind not in ("burst", "poisson"):
            raise ConfigError(f"arrival kind {self.kind!r}: use burst or poisson")
        if self.kind == "poisson" and self.rate_per_s <= 0:
            raise ConfigError(f"poisson arrivals need rate_per_s > 0, got {self.rate_per_s}")

    @property
    def name(self) -> str:
        return "burst" if self.kind == "burst" else f"poisson-{self.rate_per_s:.3f}"

    def offsets(self, n: int, run: int) -> list[float]:
        """Arrival offsets of `n` sessions in run `run` (Poisson seed `ARRIVAL_SEED + run`)."""
        if self.kind == "burst":
            return BurstArrivals(0.0).offsets(n)
        return PoissonArrivals(self.rate_per_s, ARRIVAL_SEED + run).offsets(n)


def session_order(roots: Sequence[RootWork], seed: int) -> list[RootWork]:
    """The roots in a seeded random order (workflows mixed), reproducible for a seed."""
    ordered = sorted(roots, key=lambda r: r.root_id)
    perm = np.random.default_rng(seed).permutation(len(ordered))
    return [ordered[i] for i in perm]


def build_root_dags(roots: Sequence[RootWork], pattern: ArrivalPattern, run: int) -> list[RootDag]:
    """Pool workflows: `roots` in the seeded order of run `run`, timed by `pattern` — per
    workflow (scenario), its own arrival process (module docstring), so each scenario's sessions
    arrive at the pattern's rate.

    Examples:
        >>> u = WorkUnit("w/r/a", "w/r", "Qwen3-0.6B", 10, 5)
        >>> [wf.arrival_s for wf in build_root_dags([RootWork("w/r", "w", (u,), 0, 0.0)],
        ...                                        ArrivalPattern("burst"), 0)]
        [0.0]
    """
    ordered = session_order(roots, ARRIVAL_SEED + run)
    by_workflow: dict[str, list[RootWork]] = {}
    for r in ordered:
        by_workflow.setdefault(r.workflow, []).append(r)
    timed: list[tuple[float, int, RootWork]] = []
    position = {r.root_id: i for i, r in enumerate(ordered)}
    for k, mine in enumerate(by_workflow.values()):
        times = pattern.offsets(len(mine), run + 1000 * k)
        timed += [(t, position[r.root_id], r) for r, t in zip(mine, times, strict=True)]
    return [r.at(t) for t, _, r in sorted(timed, key=lambda x: (x[0], x[1]))]


def recorded_roots(traces: Mapping[str, Trace]) -> list[RootWork]:
    """Every root of every workflow's trace as pool work (workflow order, then root id)."""
    return [w for name, trace in traces.items() for w in convert_trace(trace, name)]
