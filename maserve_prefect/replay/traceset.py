"""Trace sets: a scenario's cohorts loaded, namespaced, merged, and placed in arrival slots.

One idea: every cohort becomes part of one trace whose ids cannot collide — with several
cohorts each id (root, stage, session, op, and every dep) gets the prefix `"<cohort>/"` — and the
merged roots are put in a fixed slot order that the arrival process then times:

- `interleaved`: the target roots are spread evenly among the background roots (each cohort's
  i-th root sits at fraction (i + ½)/n of the sequence; ties by cohort order), so targets meet
  steady background load;
- `clustered`: the target roots sit together in the middle of the background roots.

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
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from maserve_prefect.errors import ConfigError, EngineError
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
    """The merged trace, its payload store, slot order and each root's cohort and role."""

    trace: Trace
    store: BlobStore
    slots: list[str]
    cohort_of: dict[str, str]
    role_of: dict[str, str]

    def targets(self) -> list[str]:
        """Root ids of target cohorts, in slot order."""
        return [r for r in self.slots if self.role_of[r] == "target"]


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


def _load_cohort(scenario: Scenario, cohort: Cohort) -> tuple[Trace, BlobStore]:
    if cohort.bundle is not None:
        from maserve_prefect.trace.bundle import import_bundle

        b = import_bundle(scenario.path(cohort.bundle))
        return b.trace, b.store
    from maserve_prefect.engines.poolfile import load_pool_file
    from maserve_prefect.taskrunner.native import run_native

    assert cohort.native is not None
    r = cohort.native
    pool = load_pool_file(scenario.path(r.pool)) if r.pool is not None else None
    for attempt in range(NATIVE_ATTEMPTS):
        run = run_native(r.workflow, r.binding, users=r.users, seed=r.seed, pool=pool)
        errors = [x.error for x in run.roots]
        if len(run.trace.roots) >= r.users or attempt == NATIVE_ATTEMPTS - 1:
            break
    check_native_roots(scenario, cohort, len(run.trace.roots), errors)
    return run.trace, run.harness.store


def check_native_roots(
    scenario: Scenario, cohort: Cohort, num_recorded: int, errors: Sequence[str | None]
) -> None:
    """Refuse a native cohort that recorded fewer roots than its recipe asked for.

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
        maserve_prefect.errors.EngineError: scenario (inline): cohort 'c' recorded 2 of 3 native roots (first root error: TimeoutError: api); the Prefect API may be overloaded: rerun, or point PREFECT_API_URL at a dedicated server
    """
    assert cohort.native is not None
    want = cohort.native.users
    if num_recorded >= want:
        return
    first = next((e for e in errors if e), "none reported")
    raise EngineError(
        f"scenario {scenario.source}: cohort {cohort.name!r} recorded {num_recorded} of {want} "
        f"native roots (first root error: {first}); the Prefect API may be overloaded: rerun, "
        "or point PREFECT_API_URL at a dedicated server"
    )


def build_trace_set(
    scenario: Scenario, loaded: Mapping[str, tuple[Trace, BlobStore]] | None = None
) -> TraceSet:
    """Load (or take from `loaded`, by cohort name) every cohort and merge them.

    Raises:
        ConfigError: a cohort has no roots.
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
        trace, src = (loaded or {}).get(cohort.name) or _load_cohort(scenario, cohort)
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
    slots = place_slots(by_cohort, targets, scenario.placement)
    return TraceSet(merged, store, slots, cohort_of, role_of)
