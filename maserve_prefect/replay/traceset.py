"""Trace sets: a scenario's cohorts loaded, namespaced, merged, and placed in arrival slots.

One idea: every cohort becomes part of one trace whose ids cannot collide — with several
cohorts each id (root, stage, session, op, and every dep) gets the prefix `"<cohort>/"` — and the
merged roots are put in a fixed slot order that the arrival process then times:

- `interleaved`: the target roots are spread evenly among the background roots (each cohort's
  i-th root sits at fraction (i + ½)/n of the sequence; ties by cohort order), so targets meet
  steady background load;
- `clustered`: the target roots sit together in the middle of the background roots;
- `round_robin` / `concatenated` (fixed global slots, seed paper App. G.1): the target roots
  first, then the background grouped by workflow class in lexicographic order, one root of each
  class in turn (`round_robin`) or class after class (`concatenated`); within a class its
  cohorts alternate, their order rotated by the block index (`place_fixed_slots`).

Within a cohort, roots keep their recorded arrival order. The merged manifest's `source` is the
cohorts' common source (`"native"` when every cohort was realized natively), else `"mixed"`:
consumers that compare a replay with its native run (the replay/native latency ratio) must not
take a set holding imported or replayed cohorts for a native one.

Examples:
    >>> from maserve_prefect.trace.model import Manifest, RootRecord, Trace
    >>> t = Trace(manifest=Manifest(trace_id="t"), roots=[RootRecord(root_id="r0")])
    >>> prefixed(t, "bg").roots[0].root_id
    'bg/r0'
    >>> place_slots({"tgt": ["a"], "bg": ["b0", "b1", "b2"]}, ["tgt"], "clustered")
    ['b0', 'b1', 'a', 'b2']
    >>> by = {"t": ["t0"], "loop": ["l0", "l1"], "spawn": ["s0", "s1"]}
    >>> cls = {"l0": "loop", "l1": "loop", "s0": "spawn", "s1": "spawn"}
    >>> place_fixed_slots(by, ["t"], cls, "round_robin")
    ['t0', 'l0', 's0', 'l1', 's1']
    >>> place_fixed_slots(by, ["t"], cls, "concatenated")
    ['t0', 'l0', 'l1', 's0', 's1']
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from itertools import zip_longest
from pathlib import Path

from maserve_prefect.errors import ConfigError, EngineError
from maserve_prefect.metrics.task import root_class
from maserve_prefect.replay.driver import slot_order
from maserve_prefect.replay.scenario import Cohort, Scenario
from maserve_prefect.trace.cas import BlobStore, MemoryStore
from maserve_prefect.trace.model import Manifest, Trace

NATIVE_ATTEMPTS = 3
"""Times a native cohort is realized before a short one is refused (`check_native_roots`): a
root whose flow run could not be created (the Prefect API answering 503 under load) leaves no
record; the realization is deterministic in its seed, so another attempt gives the same work."""

MIXED_SOURCE = "mixed"
"""`Manifest.source` of a merged trace set whose cohorts come from different sources."""


@dataclass(slots=True)
class TraceSet:
    """The merged trace, its payload store, slot order and each root's cohort and role
    (`by_cohort`: each cohort's roots in recorded order, for placements other than the
    scenario's, `slots_for`)."""

    trace: Trace
    store: BlobStore
    slots: list[str]
    cohort_of: dict[str, str]
    role_of: dict[str, str]
    by_cohort: dict[str, list[str]] = field(default_factory=dict)

    def targets(self) -> list[str]:
        """Root ids of target cohorts, in slot order."""
        return [r for r in self.slots if self.role_of[r] == "target"]

    def slots_for(self, placement: str, block: int = 0) -> list[str]:
        """Slot order under `placement` in paired block `block` (only the fixed-slot
        placements depend on the block)."""
        if not self.by_cohort:
            return list(self.slots)
        targets = [c for c, roots in self.by_cohort.items() if self._role(roots) == "target"]
        if placement in ("round_robin", "concatenated"):
            classes = {r.root_id: root_class(r) for r in self.trace.roots}
            return place_fixed_slots(self.by_cohort, targets, classes, placement, rotation=block)
        return place_slots(self.by_cohort, targets, placement)

    def _role(self, roots: Sequence[str]) -> str:
        return self.role_of[roots[0]] if roots else "background"


def prefixed(trace: Trace, prefix: str) -> Trace:
    """`trace` with every id prefixed by `prefix + "/"` (identity for an empty prefix)."""
    if not prefix:
        return trace

    def p(s: str) -> str:
        return f"{prefix}/{s}" if s else s

    roots = [
        r.model_copy(
            update={
                "root_id": p(r.root_id),
                "final_op_id": p(r.final_op_id) if r.final_op_id else None,
            }
        )
        for r in trace.roots
    ]
    stages = [
        s.model_copy(
            update={
                "stage_id": p(s.stage_id),
                "root_id": p(s.root_id),
                "parent_stage_id": p(s.parent_stage_id) if s.parent_stage_id else None,
            }
        )
        for s in trace.stages
    ]
    sessions = [
        s.model_copy(
            update={
                "session_id": p(s.session_id),
                "root_id": p(s.root_id),
                "stage_id": p(s.stage_id),
            }
        )
        for s in trace.sessions
    ]
    ops = [
        op.model_copy(
            update={
                "op_id": p(op.op_id),
                "root_id": p(op.root_id),
                "stage_id": p(op.stage_id),
                "session_id": p(op.session_id),
                "deps": tuple(d.model_copy(update={"op_id": p(d.op_id)}) for d in op.deps),
            }
        )
        for op in trace.ops
    ]
    return trace.model_copy(
        update={"roots": roots, "stages": stages, "sessions": sessions, "ops": ops}
    )


def place_slots(
    roots_by_cohort: Mapping[str, Sequence[str]], targets: Sequence[str], placement: str
) -> list[str]:
    """Slot order of the merged roots (see the module docstring)."""
    names = list(roots_by_cohort)
    if placement == "clustered" and targets:
        tgt = [r for c in names if c in targets for r in roots_by_cohort[c]]
        bg = [r for c in names if c not in targets for r in roots_by_cohort[c]]
        mid = (len(bg) + 1) // 2 if bg else 0
        return bg[:mid] + tgt + bg[mid:]
    keyed = [
        ((i + 0.5) / len(roots), k, i, r)
        for k, c in enumerate(names)
        for roots in (roots_by_cohort[c],)
        for i, r in enumerate(roots)
    ]
    return [r for *_, r in sorted(keyed)]


def place_fixed_slots(
    roots_by_cohort: Mapping[str, Sequence[str]],
    targets: Sequence[str],
    class_of: Mapping[str, str],
    placement: str,
    *,
    rotation: int = 0,
) -> list[str]:
    """Targets first, then the background by class (module docstring; a pure function).

    Args:
        roots_by_cohort: cohort name → its roots in recorded order (cohort order is the
            scenario's).
        targets: the target cohorts' names; their roots come first, the cohorts alternating.
        class_of: root → its workflow class (`metrics.task.root_class`).
        placement: `round_robin` (one background root of each class in turn, classes in
            lexicographic order) or `concatenated` (class after class).
        rotation: rotates each class's cohort order (block b of a paired design uses b), so
            the cohort (binding) that leads each class changes per block.

    Raises:
        ConfigError: another placement.

    Examples:
        >>> by = {"t": ["t0"], "a": ["a0", "a1"], "b": ["b0", "b1"]}
        >>> place_fixed_slots(by, ["t"], {"a0": "x", "a1": "x", "b0": "x", "b1": "x"},
        ...                   "concatenated", rotation=1)
        ['t0', 'b0', 'a0', 'b1', 'a1']
    """
    if placement not in ("round_robin", "concatenated"):
        raise ConfigError(
            f"placement {placement!r} is not a fixed-slot placement; use round_robin or "
            "concatenated"
        )
    tgt = [roots_by_cohort[c] for c in roots_by_cohort if c in targets]
    head = [r for group in zip_longest(*tgt) for r in group if r is not None]
    cohorts_of: dict[str, list[list[str]]] = {}
    for c, roots in roots_by_cohort.items():
        if c in targets:
            continue
        by_class: dict[str, list[str]] = {}
        for r in roots:
            by_class.setdefault(class_of[r], []).append(r)
        for cls, rs in by_class.items():
            cohorts_of.setdefault(cls, []).append(rs)
    queues: list[list[str]] = []
    for cls in sorted(cohorts_of):
        groups = cohorts_of[cls]
        k = rotation % len(groups)
        groups = groups[k:] + groups[:k]
        queues.append([r for g in zip_longest(*groups) for r in g if r is not None])
    if placement == "concatenated":
        return head + [r for q in queues for r in q]
    return head + [r for g in zip_longest(*queues) for r in g if r is not None]


def realization_pool(scenario: Scenario, cohort: Cohort) -> Path | None:
    """The pool file a native cohort is realized on: its recipe's `pool`, else the first arm's
    pool (the serving setup its replay arms use, without their overrides: a realized call is
    capped at that pool's max model length, so replay never meets a call its arms would
    refuse), else None (the shipped default pool). None for a bundle cohort."""
    r = cohort.native
    if r is None:
        return None
    if r.pool is not None:
        return scenario.path(r.pool)
    arm_pools = [scenario.path(a.pool) for a in scenario.arms if a.pool is not None]
    return arm_pools[0] if arm_pools else None


def load_mooncake(path: Path) -> Trace:
    """A Mooncake JSONL file as a trace; every row must import (warnings such as zero lengths are
    kept in the manifest notes, as the import records them).

    Raises:
        TraceImportError: the file cannot be read, or a row was rejected (file, line, why).
    """
    from maserve_prefect.errors import TraceImportError
    from maserve_prefect.trace.mooncake import import_mooncake

    res = import_mooncake(path)
    if res.rejected:
        first = res.rejected[0]
        raise TraceImportError(
            f"{path}:{first.line}: {first.reason}: {first.detail} ({len(res.rejected)} of "
            f"{res.num_rows} rows rejected); fix or drop the row(s): a replay of a request "
            "file replays every row"
        )
    return res.trace


def load_cohort(scenario: Scenario, cohort: Cohort) -> tuple[Trace, BlobStore]:
    """The cohort's trace and payload store: its bundle or Mooncake file imported, or its native
    recipe run (on `realization_pool`).

    Raises:
        TraceImportError: a Mooncake row does not import (the message names the file and line).
    """
    if cohort.mooncake is not None:
        return load_mooncake(scenario.path(cohort.mooncake)), MemoryStore()
    if cohort.bundle is not None:
        from maserve_prefect.trace.bundle import import_bundle

        b = import_bundle(scenario.path(cohort.bundle))
        return b.trace, b.store
    from maserve_prefect.engines.poolfile import load_pool_file
    from maserve_prefect.prefect_server import recording_api
    from maserve_prefect.taskrunner.native import run_native

    assert cohort.native is not None
    r = cohort.native
    pool_path = realization_pool(scenario, cohort)
    pool = load_pool_file(pool_path) if pool_path is not None else None
    with recording_api():
        for attempt in range(NATIVE_ATTEMPTS):
            run = run_native(r.workflow, r.binding, users=r.users, seed=r.seed, pool=pool)
            errors = [x.error for x in run.roots]
            complete = len(run.trace.roots) >= r.users and not any(errors)
            if complete or attempt == NATIVE_ATTEMPTS - 1:
                break
    check_native_roots(scenario, cohort, len(run.trace.roots), errors)
    return run.trace, run.harness.store


def check_native_roots(
    scenario: Scenario, cohort: Cohort, num_recorded: int, errors: Sequence[str | None]
) -> None:
    """Refuse a native cohort that recorded fewer roots than its recipe asked for, or a failed
    root (fixed work from it would silently lack that root's work).

    A root whose flow run could not start (e.g. the Prefect API timed out under load) leaves no
    record, so the trace set would silently hold fewer roots than the protocol offers.

    Raises:
        EngineError: naming the scenario, the cohort, how many roots are missing and the first
            root error.

    Examples:
        >>> from maserve_prefect.replay.scenario import parse_scenario
        >>> s = parse_scenario({"name": "x", "cohorts": [{"name": "c", "native": {
        ...     "workflow": "fork_join", "users": 3}}], "arms": [{"name": "dag"}]})
        >>> check_native_roots(s, s.cohorts[0], 3, [None] * 3)
        >>> check_native_roots(s, s.cohorts[0], 2, [None, "TimeoutError: api", None])
        Traceback (most recent call last):
        ...
        maserve_prefect.errors.EngineError: scenario (inline): cohort 'c' recorded 2 of 3 native roots, 1 failed (first root error: TimeoutError: api); the Prefect API may be overloaded: rerun, or point PREFECT_API_URL at a dedicated server
    """
    assert cohort.native is not None
    want = cohort.native.users
    failed = [e for e in errors if e]
    if num_recorded >= want and not failed:
        return
    first = failed[0] if failed else "none reported"
    raise EngineError(
        f"scenario {scenario.source}: cohort {cohort.name!r} recorded {num_recorded} of {want} "
        f"native roots, {len(failed)} failed (first root error: {first}); the Prefect API may "
        "be overloaded: rerun, "
        "or point PREFECT_API_URL at a dedicated server"
    )


def build_trace_set(
    scenario: Scenario, loaded: Mapping[str, tuple[Trace, BlobStore]] | None = None
) -> TraceSet:
    """Load (or take from `loaded`, by cohort name) every cohort and merge them.

    Raises:
        ConfigError: a cohort has no roots, or a root of a native cohort's run failed (the
            message gives the first root's error): fixed work from it would silently lack that
            root, as `bench.pool.traces.record_traces` already refuses.
    """
    many = len(scenario.cohorts) > 1
    store = MemoryStore()
    roots, stages, sessions, ops = [], [], [], []
    by_cohort: dict[str, list[str]] = {}
    cohort_of: dict[str, str] = {}
    role_of: dict[str, str] = {}
    notes: dict[str, str] = {}
    manifests: list[Manifest] = []
    for cohort in scenario.cohorts:
        trace, src = (loaded or {}).get(cohort.name) or load_cohort(scenario, cohort)
        if not trace.roots:
            raise ConfigError(f"scenario {scenario.name}: cohort {cohort.name!r} has no roots")
        for digest in src.iter_digests():
            store.put(src.get(digest))
        t = prefixed(trace, cohort.name if many else "")
        notes[cohort.name] = trace.manifest.trace_id
        manifests.append(trace.manifest)
        by_cohort[cohort.name] = slot_order(t)
        for r in by_cohort[cohort.name]:
            cohort_of[r], role_of[r] = cohort.name, cohort.role
        roots += t.roots
        stages += t.stages
        sessions += t.sessions
        ops += t.ops
    sources = {m.source for m in manifests}
    manifest = (
        Manifest(
            trace_id=f"scenario-{scenario.name}",
            source=sources.pop() if len(sources) == 1 else MIXED_SOURCE,
            notes={"cohorts": notes},
        )
        if many
        else manifests[0]
    )
    merged = Trace(manifest=manifest, roots=roots, stages=stages, sessions=sessions, ops=ops)
    targets = [c.name for c in scenario.cohorts if c.role == "target"]
    ts = TraceSet(merged, store, [], cohort_of, role_of, by_cohort)
    if scenario.placement in ("round_robin", "concatenated"):
        ts.slots = ts.slots_for(scenario.placement, 0)
    else:
        ts.slots = place_slots(by_cohort, targets, scenario.placement)
    return ts
