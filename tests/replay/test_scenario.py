"""Scenario files and `run_scenario`: field errors, cohorts and slots, locked deadlines, blocks."""

from __future__ import annotations

from pathlib import Path

import pytest
from replay_factories import make_trace

from maserve_prefect.errors import ConfigError, IllegalReleaseError
from maserve_prefect.replay.arms import arm_pool_file, run_scenario
from maserve_prefect.replay.scenario import DEFAULT_WALL_TIMEOUT_S, load_scenario, parse_scenario
from maserve_prefect.replay.traceset import place_slots
from maserve_prefect.trace.barrier import BarrierEdge, PerRootEdge
from maserve_prefect.trace.cas import MemoryStore

TOY = {"tgt": (make_trace(2, workflow="toy"), MemoryStore())}
TWO_CLASSES = {"tgt": (make_trace(2, workflow="toy"), MemoryStore()),
               "bg": (make_trace(1, workflow="other"), MemoryStore())}  # fmt: skip

# The toy workflow's stages s1 and s2 are two branches of one Γ fork (conftest `toy_fork`), so
# the scenarios' barriers between their ops are stage-local.
pytestmark = pytest.mark.usefixtures("toy_fork")


def _scenario(**extra: object) -> dict[str, object]:
    base: dict[str, object] = {
        "name": "toy",
        "cohorts": [{"name": "tgt", "bundle": "unused"}],
        "lock": "length",
        "arms": [{"name": "dag"}, {"name": "bar", "release": "barrier",
                                   "barrier": [{"before": "s1", "after": "s2"}]}],
    }  # fmt: skip
    return base | extra


def test_yaml_error_names_file_and_field(tmp_path: Path) -> None:
    f = tmp_path / "bad.yaml"
    f.write_text(
        "name: x\ncohorts: [{name: t, bundle: b}]\narms:\n  - {name: a, release: sideways}\n"
    )
    with pytest.raises(ConfigError, match=rf"scenario {f}: arms\.0\.release"):
        load_scenario(f)


def test_barrier_edges_without_barrier_rule_are_refused() -> None:
    with pytest.raises(ConfigError, match=r"arms\.0.*release: barrier"):
        parse_scenario(_scenario(arms=[{"name": "a", "barrier": [{"before": "x", "after": "y"}]}]))


def test_unknown_override_deployment_is_named() -> None:
    s = parse_scenario(_scenario(arms=[{"name": "a", "overrides": {"nope": {"max_num_seqs": 2}}}]))
    with pytest.raises(ConfigError, match="'nope'"):
        arm_pool_file(s, s.arms[0])


def test_overrides_change_only_the_named_deployment() -> None:
    s = parse_scenario(_scenario(arms=[{"name": "a", "overrides": {"main": {"max_num_seqs": 2}}}]))
    deps = {d.name: d for d in arm_pool_file(s, s.arms[0]).deployments}
    assert deps["main"].max_num_seqs == 2 and deps["large"].max_num_seqs is None


def test_slot_placement() -> None:
    cohorts = {"t": ["t0", "t1"], "b": ["b0", "b1", "b2", "b3"]}
    assert place_slots(cohorts, ["t"], "interleaved") == ["b0", "t0", "b1", "b2", "t1", "b3"]
    assert place_slots(cohorts, ["t"], "clustered") == ["b0", "b1", "t0", "t1", "b2", "b3"]


def test_cohorts_are_namespaced_and_background_is_not_measured() -> None:
    s = parse_scenario(_scenario(cohorts=[{"name": "tgt", "bundle": "x"},
                                          {"name": "bg", "role": "background", "bundle": "y"}]))  # fmt: skip
    loaded = TOY | {"bg": (make_trace(3, workflow="bg"), MemoryStore())}
    res = run_scenario(s, prefect=False, loaded=loaded)
    assert res.trace_set.slots[:2] == ["bg/r0", "tgt/r0"]
    summary = res.results[0].summary
    assert (summary.num_roots, summary.num_measured) == (5, 2)


def test_deadlines_are_locked_from_the_reference_before_arms() -> None:
    cohorts = [{"name": "tgt", "bundle": "x"}, {"name": "bg", "role": "background", "bundle": "y"}]
    # two arms (both DAG: a stage barrier s1 -> s2 crosses stages, which a barrier may not)
    s = parse_scenario(_scenario(cohorts=cohorts, arms=[{"name": "dag"}, {"name": "again"}],
                                 deadlines={"classes": {"other": 9.0},
                                            "reference": {"factor": 2.0, "quantile": 0.5}}))  # fmt: skip
    res = run_scenario(s, prefect=False, loaded=TWO_CLASSES)
    # alone, a toy root takes its longest tool op (2 s); the deadline is 2 x the median
    assert res.reference_latency_s["toy"] == [2.0, 2.0]
    assert res.deadlines_s == {"other": 9.0, "toy": 4.0}
    only_dag = parse_scenario(
        _scenario(cohorts=cohorts, arms=[{"name": "dag"}], deadlines=s.deadlines.model_dump())
    )
    assert run_scenario(only_dag, prefect=False, loaded=TWO_CLASSES).deadlines_s == res.deadlines_s


def test_a_deadline_for_a_class_no_root_has_is_refused_before_anything_runs() -> None:
    s = parse_scenario(_scenario(deadlines={"classes": {"toy": 3.0, "tyop": 9.0}}))
    with pytest.raises(ConfigError, match=r"deadlines\.classes names tyop.*classes are toy"):
        run_scenario(s, prefect=False, loaded=TOY)


@pytest.mark.parametrize(
    ("extra", "field", "why"),
    [
        ({"arrivals": {"kind": "poisson", "rate_per_s": float("inf")}}, "rate_per_s", "finite"),
        ({"arrivals": {"kind": "burst", "at_s": float("inf")}}, "at_s", "finite"),
        ({"window": {"start_s": 5.0, "end_s": 1.0}}, "window", "end after it starts"),
        ({"deadlines": {"classes": {"toy": float("nan")}}}, "classes", "finite"),
        ({"deadlines": {"classes": {"toy": 0.0}}}, "classes", "greater than 0"),
        ({"arrivals": {"kind": "closed_loop", "users": 1,
                       "think_time": {"dist": "uniform", "low_s": 3, "high_s": 1}}},
         "think_time", "low_s <= high_s"),
    ],
)  # fmt: skip
def test_impossible_numbers_are_refused_naming_the_field(
    extra: dict[str, object], field: str, why: str
) -> None:
    with pytest.raises(ConfigError, match=rf"{field}.*{why}"):
        parse_scenario(_scenario(**extra))


def test_blocks_alternate_arm_order_and_summarize_median_range() -> None:
    s = parse_scenario(_scenario(blocks=3, arrivals={"kind": "poisson", "rate_per_s": 1.0}))
    res = run_scenario(s, prefect=False, loaded=TOY)
    assert [(r.summary.arm, r.summary.block) for r in res.results] == [
        ("dag", 0), ("bar", 0), ("bar", 1), ("dag", 1), ("dag", 2), ("bar", 2)]  # fmt: skip
    # tool ops do not contend: a DAG root takes max(1, 2) s; the barrier serializes them to 3 s
    across = res.across_blocks()
    assert across["dag"]["latency_p50_s"] == (2.0, 2.0, 2.0)
    assert across["bar"]["latency_p50_s"] == (3.0, 3.0, 3.0)
    assert all(r.summary.num_early_releases == 0 for r in res.results)


def test_same_scenario_twice_gives_identical_results() -> None:
    s = parse_scenario(_scenario(arrivals={"kind": "poisson", "rate_per_s": 2.0, "seed": 4}))
    one, two = (
        run_scenario(s, prefect=False, loaded=TOY),
        run_scenario(s, prefect=False, loaded=TOY),
    )
    assert [r.summary for r in one.results] == [r.summary for r in two.results]
    assert [r.run.trace for r in one.results] == [r.run.trace for r in two.results]


@pytest.mark.usefixtures("prefect_api")
def test_each_arm_is_one_prefect_flow_run() -> None:
    res = run_scenario(parse_scenario(_scenario()), prefect=True, loaded=TOY)
    ids = [r.flow_run_id for r in res.results]
    assert all(ids) and len(set(ids)) == 2


def test_timeout_applies_to_real_engines_only() -> None:
    real = parse_scenario(_scenario(engine="openai:http://127.0.0.1:9", timeout_s=30))
    assert real.wall_timeout_s() == 30.0
    default = parse_scenario(_scenario(engine="openai:http://127.0.0.1:9"))
    assert default.wall_timeout_s() == DEFAULT_WALL_TIMEOUT_S
    assert parse_scenario(_scenario(timeout_s=30)).wall_timeout_s() is None  # virtual time
    with pytest.raises(ConfigError, match=r"timeout_s: Input should be greater than 0"):
        parse_scenario(_scenario(timeout_s=0))


def _slow_first(arms: list[dict[str, object]]) -> dict[str, object]:
    return _scenario(
        arms=arms, deadlines={"reference": {"factor": 1.0, "quantile": 1.0}},
        cohorts=[{"name": "tgt", "bundle": "unused"}],
    )  # fmt: skip


def test_reference_pool_ignores_arm_overrides_and_order() -> None:
    toy = make_trace(1, tool_s=(0.01, 0.01), model_tokens=(2048, 16))
    loaded = {"tgt": (toy, MemoryStore())}
    slow = {"name": "slow", "overrides": {"main": {"max_num_batched_tokens": 16}}}
    fast = {"name": "fast"}
    one = run_scenario(parse_scenario(_slow_first([slow, fast])), prefect=False, loaded=loaded)
    two = run_scenario(parse_scenario(_slow_first([fast, slow])), prefect=False, loaded=loaded)
    # the override matters (16-token prefill chunks), yet both orders lock the same deadline
    arms = {r.summary.arm: r.summary.latency_p50_s for r in one.results}
    assert arms["slow"] > arms["fast"]
    assert one.deadlines_s == two.deadlines_s == {"toy": max(one.reference_latency_s["toy"])}
    assert one.reference_latency_s["toy"] == [arms["fast"]]  # one root: the burst is the reference
    assert one.reference_state == "fresh simulated pool"


def test_arms_on_different_pools_must_name_the_reference_pool(tmp_path: Path) -> None:
    arms = [{"name": "a"}, {"name": "b", "pool": "other.yaml"}]
    ref = {"factor": 1.5}
    with pytest.raises(ConfigError, match=r"set deadlines\.reference\.pool"):
        parse_scenario(_scenario(arms=arms, deadlines={"reference": ref}))
    named = parse_scenario(_scenario(arms=arms, deadlines={"reference": ref | {"pool": "p.yaml"}}))
    assert named.reference_pool() == Path("p.yaml")
    assert parse_scenario(_scenario(arms=arms)).deadlines.reference is None  # no reference: ok


def test_merged_trace_set_keeps_a_common_source_or_says_mixed() -> None:
    from maserve_prefect.replay.traceset import build_trace_set

    two = _scenario(cohorts=[{"name": "tgt", "bundle": "x"}, {"name": "bg", "bundle": "y"}])
    native = TOY | {"bg": (make_trace(1), MemoryStore())}
    assert build_trace_set(parse_scenario(two), native).trace.manifest.source == "native"
    imported = make_trace(1)
    imported = imported.model_copy(
        update={"manifest": imported.manifest.model_copy(update={"source": "mooncake"})}
    )
    mixed = TOY | {"bg": (imported, MemoryStore())}
    assert build_trace_set(parse_scenario(two), mixed).trace.manifest.source == "mixed"


def test_one_root_class_for_deadlines_and_metrics() -> None:
    from maserve_prefect.metrics import task
    from maserve_prefect.replay import arms
    from maserve_prefect.trace.model import RootRecord

    assert arms.root_class is task.root_class
    assert task.root_class(RootRecord(root_id="r")) == task.DEFAULT_CLASS == "default"


def _per_root(*pairs: tuple[str, str], name: str = "bar") -> dict[str, object]:
    edges = [{"src": src, "dst": dst, "each_root": True} for src, dst in pairs]
    return {"name": name, "release": "barrier", "barrier": edges}


def test_per_root_barrier_loads_from_yaml(tmp_path: Path) -> None:
    f = tmp_path / "per_root.yaml"
    f.write_text(
        "name: x\ncohorts: [{name: t, bundle: b}]\narms:\n"
        "  - name: bar\n    release: barrier\n    barrier:\n"
        "      - {src: research.child0/0, dst: research.child1/0, each_root: true}\n"
        "      - {src: r0/a, dst: r0/b}\n"
    )
    s = load_scenario(f)
    assert s.source == str(f)
    assert [b.to_release() for b in s.arms[0].barrier] == [
        PerRootEdge("research.child0/0", "research.child1/0"),
        BarrierEdge("r0/a", "r0/b", "scenario"),
    ]


@pytest.mark.parametrize(
    ("barrier", "message"),
    [
        ({"before": "s1", "after": "s2", "each_root": True}, r"`each_root: true` needs `src`"),
        ({"src": "a", "each_root": True}, r"`each_root: true` needs `src` \+ `dst`"),
        ({"src": "a", "dst": "b", "root_id": "r0", "each_root": True}, r"`root_id` restricts"),
        ({"src": "r0/a", "dst": "r0/b", "root_id": "r0"}, r"`root_id` restricts a stage"),
        ({"src": "a", "dst": "b", "each_root": "sometimes"}, r"valid boolean"),
    ],
)
def test_bad_per_root_barrier_form_is_named(barrier: dict[str, object], message: str) -> None:
    arm = {"name": "bar", "release": "barrier", "barrier": [barrier]}
    with pytest.raises(ConfigError, match=rf"scenario \(inline\): arms\.0\.barrier\.0.*{message}"):
        parse_scenario(_scenario(arms=[arm]))


def test_per_root_barrier_covers_every_root_of_the_trace_set() -> None:
    s = parse_scenario(_scenario(arms=[{"name": "dag"}, _per_root(("a", "b"))]))
    five = {"tgt": (make_trace(5, workflow="toy"), MemoryStore())}
    res = run_scenario(s, prefect=False, loaded=five)
    bar = next(r for r in res.results if r.summary.arm == "bar")
    assert bar.run.trace.manifest.notes["replay"]["barrier_edges"] == [
        [f"r{i}/a", f"r{i}/b", "each root a -> b"] for i in range(5)
    ]
    # tool ops do not contend: DAG takes max(1, 2) s per root, the barrier 1 + 2 s
    across = res.across_blocks()
    assert across["dag"]["latency_p50_s"] == (2.0, 2.0, 2.0)
    assert across["bar"]["latency_p50_s"] == (3.0, 3.0, 3.0)


def test_per_root_barrier_with_an_unknown_op_is_refused_before_any_arm_runs(
    tmp_path: Path,
) -> None:
    f = tmp_path / "typo.yaml"
    f.write_text(
        "name: typo\ncohorts: [{name: tgt, bundle: unused}]\nlock: length\narms:\n"
        "  - {name: dag}\n"
        "  - name: bar\n    release: barrier\n"
        "    barrier: [{src: a, dst: bb, each_root: true}]\n"
    )
    ran: list[str] = []
    with pytest.raises(
        IllegalReleaseError,
        match=rf"scenario {f}: arm 'bar': per-root barrier edge a -> bb: no root of the trace "
        r"holds op 'bb'; .* e\.g\. a, b",
    ):
        run_scenario(
            load_scenario(f), prefect=False, loaded=TOY, on_arm=lambda r: ran.append(r.summary.arm)
        )
    assert ran == []  # refused before the DAG arm (listed first) replayed


def test_per_root_barrier_cycle_is_refused_naming_the_arm() -> None:
    s = parse_scenario(_scenario(arms=[_per_root(("a", "b"), ("b", "a"), name="rev")]))
    with pytest.raises(IllegalReleaseError, match=r"scenario \(inline\): arm 'rev': .*cycle r0/"):
        run_scenario(s, prefect=False, loaded=TOY)


def _refused(tmp_path: Path, barrier: str, loaded: dict[str, object]) -> str:
    f = tmp_path / "illegal.yaml"
    f.write_text(
        "name: illegal\ncohorts: [{name: tgt, bundle: unused}]\nlock: length\narms:\n"
        f"  - {{name: dag}}\n  - {{name: bar, release: barrier, barrier: [{barrier}]}}\n"
    )
    ran: list[str] = []
    with pytest.raises(IllegalReleaseError) as exc:
        run_scenario(
            load_scenario(f),
            prefect=False,
            loaded=loaded,  # type: ignore[arg-type]
            on_arm=lambda r: ran.append(r.summary.arm),
        )
    assert ran == []  # refused before the DAG arm (listed first) replayed
    msg = str(exc.value)
    assert "\n" not in msg and msg.startswith(f"scenario {f}: arm 'bar': ")
    return msg.removeprefix(f"scenario {f}: arm 'bar': ")


def test_illegal_barriers_are_refused_before_any_arm_naming_file_arm_and_both_ops(
    tmp_path: Path,
) -> None:
    # across stages: the same s1 / s2 pair in a workflow whose Γ runs them in sequence
    seq = {"tgt": (make_trace(2, workflow="chain"), MemoryStore())}
    assert _refused(tmp_path, "{before: s1, after: s2}", seq) == (
        "barrier edge r0/a -> r0/b crosses stages (r0/s1 -> r0/s2); a barrier "
        "orders ops of one stage only"
    )
    # between dependent ops: m consumes a's output
    dep = {"tgt": (make_trace(2, workflow="toy", model_tokens=(8, 2)), MemoryStore())}
    assert _refused(tmp_path, "{src: a, dst: m, each_root: true}", dep).startswith(
        "barrier edge r0/a -> r0/m: the ops are not independent (r0/a -> r0/m through recorded "
        "deps)"
    )


def test_a_legal_barrier_records_coordination_edges_with_their_stage() -> None:
    s = parse_scenario(_scenario())
    res = run_scenario(s, prefect=False, loaded=TOY)
    bar = next(r for r in res.results if r.summary.arm == "bar")
    for trace in (bar.run.source, bar.run.trace):  # the replayed trace and its realization
        added = [d for d in trace.op_index()["r0/b"].deps if d.is_coordination]
        assert [(d.op_id, d.stage) for d in added] == [("r0/a", "r0/parallel(s1,s2)")]


def test_a_native_cohort_with_a_failed_root_is_refused_with_the_root_error(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A failed root is not silently missing from the fixed work (a full-scale mixed cohort held
    63 of 64 roots under load), nor hidden behind "cohort has no roots": the message carries the
    first root's error."""
    import contextlib
    from types import SimpleNamespace

    from maserve_prefect import prefect_server
    from maserve_prefect.errors import EngineError
    from maserve_prefect.replay.traceset import NATIVE_ATTEMPTS, build_trace_set
    from maserve_prefect.taskrunner import native

    failed = SimpleNamespace(
        roots=[SimpleNamespace(error=None), SimpleNamespace(error="PrefectHTTPStatusError: 503")],
        trace=make_trace(1),
        harness=SimpleNamespace(store=MemoryStore()),
    )
    calls: list[int] = []

    def fake_run_native(*a: object, **k: object) -> SimpleNamespace:
        calls.append(1)
        return failed

    monkeypatch.setattr(native, "run_native", fake_run_native)
    monkeypatch.setattr(prefect_server, "recording_api", contextlib.nullcontext)
    native_cohort = {"name": "tgt", "native": {"workflow": "spawn", "users": 2}}
    sc = parse_scenario(_scenario(cohorts=[native_cohort]))
    with pytest.raises(EngineError, match=r"recorded 1 of 2 native roots, 1 failed .*503"):
        build_trace_set(sc)
    assert len(calls) == NATIVE_ATTEMPTS  # retried before refusing
    failed.roots = [SimpleNamespace(error=None)]  # a root that never recorded, no error
    with pytest.raises(EngineError, match="recorded 1 of 2 native roots, 0 failed"):
        build_trace_set(sc)
