"""HEAR suites: demo runs produce every row beside the paper's, arms replay one workload, every
turn goes to the engine, Guard and Session-Aware act through it."""

from __future__ import annotations

import doctest
import json
import math
from pathlib import Path
from types import SimpleNamespace

import pytest

from maserve_prefect.bench.hear import adapters, tables
from maserve_prefect.bench.hear.adapters import ContinuationHook
from maserve_prefect.bench.hear.arms import Arm, make_pool, parse_arm, run_arm
from maserve_prefect.bench.hear.mooncake_suite import (
    PAPER_TABLE4,
    offered_tpm,
    paper_offered_tpm,
    regime_rows,
    run_mooncake,
)
from maserve_prefect.bench.hear.suite_file import MooncakeSuite, RoleModesSuite
from maserve_prefect.bench.hear.tables import wait_reuse_rows
from maserve_prefect.bench.result import SuiteResult
from maserve_prefect.bench.runner import execute_suite
from maserve_prefect.bench.suite import load_suite
from maserve_prefect.errors import ConfigError
from maserve_prefect.hear.modemap import ModeMap
from maserve_prefect.hear.policies import RoleModeSelection, SessionAware
from maserve_prefect.replay.session_results import SessionReplayResult, TurnResult
from maserve_prefect.workloads.scbench import generate_scbench
from maserve_prefect.workloads.sessions import Session, SessionSet, Turn

SUITES = Path(__file__).resolve().parents[3] / "deployments" / "suites"


def small_pool(policy: str = "fcfs") -> list:
    return make_pool("RTX-PRO-6000", "Qwen3-0.6B", 1, 1.0, {"policy": policy})


def contended() -> SessionSet:
    """Sessions over a few shared contexts, arriving at once (a long admission queue)."""
    return generate_scbench(12, 3, arrival_rate_per_s=50.0, num_contexts=3,
                            context_tokens=(4096, 8192), mean_turns=3, min_turns=2, max_turns=4,
                            think_mean_s=1.0)  # fmt: skip


def test_doctests() -> None:
    for mod in (adapters, tables):
        res = doctest.testmod(mod)
        assert res.failed == 0


@pytest.fixture(scope="module")
def scbench_demo(tmp_path_factory: pytest.TempPathFactory) -> SuiteResult:
    out = tmp_path_factory.mktemp("scb")
    res = execute_suite(load_suite(SUITES / "hear_scbench.yaml"), "demo", prefect=False, out=out)
    res.write(out)
    return res


def test_scbench_demo_rows_and_one_workload(scbench_demo: SuiteResult) -> None:
    rows = scbench_demo.tables()["arms"]
    assert [r["policy"] for r in rows] == [
        "fcfs", "cache_aware", "cache_aware+guard40", "cache_aware+guard60"]  # fmt: skip
    assert len({r["workload_sha256"] for r in rows}) == 1
    assert all(r["num_completed"] == r["num_turns"] > 0 for r in rows)
    # no harness cap: every turn went to the engine the moment it arrived
    assert all(r["max_queue_s"] == 0.0 for r in rows)
    assert [r["engine_policy"] for r in rows] == ["fcfs", "priority", "priority", "priority"]
    assert rows[0]["num_priority_updates"] == 0 < rows[1]["num_priority_updates"]
    assert [h["metric"] for h in scbench_demo.tables()["headline"]] == [
        "batch_speedup", "p50_ttft_reduction", "p95_ttft_reduction"]  # fmt: skip
    assert [p.name for p in scbench_demo.files] == [
        "hear_scbench_demo_workload.jsonl", "hear-scbench.json", "hear-scbench.md"]  # fmt: skip
    assert all(p.exists() for p in scbench_demo.files)


def test_scbench_rows_carry_the_papers_table3(scbench_demo: SuiteResult) -> None:
    by = {r["policy"]: r for r in scbench_demo.tables()["arms"]}
    assert by["fcfs"]["paper_makespan_s"] == 481.0 and by["fcfs"]["paper_ttft_p50_s"] == 63.1
    assert by["cache_aware+guard40"]["paper_batch_speedup"] == pytest.approx(481 / 299)
    assert by["cache_aware"]["paper_reuse"] == 0.876
    for r in by.values():
        assert r["batch_speedup"] == pytest.approx(by["fcfs"]["makespan_s"] / r["makespan_s"])


def test_scbench_headline_ratios_recomputed_from_the_arm_rows(
    scbench_demo: SuiteResult,
) -> None:
    by = {r["policy"]: r for r in scbench_demo.tables()["arms"]}
    base, best = by["fcfs"], by["cache_aware+guard40"]
    want = {
        # batch completion: FCFS's makespan over the headline arm's (> 1: the arm finishes first)
        "batch_speedup": (base["makespan_s"] / best["makespan_s"], 481 / 299),
        # median and tail TTFT: FCFS's over the headline arm's (> 1: the arm's is lower)
        "p50_ttft_reduction": (base["ttft_p50_s"] / best["ttft_p50_s"], 63.1 / 28.3),
        "p95_ttft_reduction": (base["ttft_p95_s"] / best["ttft_p95_s"], 74.2 / 51.1),
    }
    head = {h["metric"]: h for h in scbench_demo.tables()["headline"]}
    assert set(head) == set(want)
    for metric, (value, paper) in want.items():
        got = head[metric]
        assert got["measured"] == pytest.approx(value, rel=1e-12), metric
        assert got["paper"] == pytest.approx(paper, rel=1e-12), metric
        assert got["at_least_paper"] is (value >= paper), metric
        row = f"| {metric} | {value:.4g} | {paper:.4g} | {value >= paper} |"
        assert row in scbench_demo.markdown(), row
    # and the JSON written beside the text holds the same headline
    (js,) = [p for p in scbench_demo.files if p.suffix == ".json"]
    written = {h["metric"]: h for h in json.loads(js.read_text())["tables"]["headline"]}
    for metric, (value, _) in want.items():
        assert written[metric]["measured"] == pytest.approx(value, rel=1e-12), metric


def test_waiting_table_splits_follow_ups_at_the_guards_wait(scbench_demo: SuiteResult) -> None:
    rows = {r["policy"]: r for r in scbench_demo.tables()["waiting"]}
    assert set(rows) == {"fcfs", "cache_aware", "cache_aware+guard40", "cache_aware+guard60"}
    for r in rows.values():
        assert 0.0 <= r["followups_waited_40s_share"] <= 1.0
        assert r["last_first_turn_served_s"] > 0
    # Cache-Aware serves hot follow-ups first and defers cold first turns; Guard-40 bounds that
    ca, g40 = rows["cache_aware"], rows["cache_aware+guard40"]
    assert ca["last_first_turn_served_s"] > rows["fcfs"]["last_first_turn_served_s"]
    assert g40["last_first_turn_served_s"] < ca["last_first_turn_served_s"]
    # a follow-up the guard had to protect found less of its context than one served sooner
    assert g40["reuse_waited_40s"] < g40["reuse_waited_less"]
    # the reuse-by-wait curve covers every completed follow-up once, per arm
    curve = scbench_demo.tables()["reuse_by_wait"]
    follow_ups = {r["policy"]: r["num_completed"] for r in scbench_demo.tables()["arms"]}
    meta = scbench_demo.tables()["meta"][0]
    for policy in rows:
        n = sum(c["num_followups"] for c in curve if c["policy"] == policy)
        assert n == follow_ups[policy] - meta["num_sessions"]


def test_waiting_rows_tell_queue_time_from_ttft() -> None:
    """Guard protects by time in the engine's queue; a turn admitted quickly whose prefill ran
    long waited by TTFT but was never protected."""

    def turn(i: int, arrival: float, scheduled: float, first: float, cached: int) -> TurnResult:
        return TurnResult("s", i, f"s/t{i}", "r0", "completed", "", arrival, arrival, first,
                          first + 1.0, 100, 10, cached, 0, scheduled)  # fmt: skip

    turns = [turn(0, 0.0, 0.0, 5.0, 0), turn(1, 10.0, 12.0, 60.0, 0),
             turn(2, 70.0, 115.0, 116.0, 0), turn(3, 120.0, 121.0, 122.0, 90)]  # fmt: skip
    result = SessionReplayResult("h", "open", 0.0, 117.0, turns, [])
    (row,) = wait_reuse_rows({"x": SimpleNamespace(result=result)}, 40.0)  # type: ignore[dict-item]
    assert row["followups_waited_40s_share"] == 2 / 3  # t1 (TTFT 50 s) and t2 (46 s)
    assert row["followups_queued_40s_share"] == 1 / 3  # t2 only (queued 45 s; t1 2 s)
    assert (row["reuse_waited_40s"], row["reuse_waited_less"]) == (0.0, 0.9)
    assert row["last_first_turn_served_s"] == 5.0


def test_overhead_rows_present(scbench_demo: SuiteResult) -> None:
    over = scbench_demo.tables()["overhead"]
    ca = {r["op"]: r["count"] for r in over if r["policy"] == "cache_aware"}
    assert ca["kv_state_update"] > 0 and ca["scheduling_decision"] > 0


def test_control_plane_time_is_included_in_the_end_to_end_time(
    scbench_demo: SuiteResult,
) -> None:
    """Each arm's end-to-end makespan includes the control-plane time its operations measured
    (the overhead table's per-op totals), and the suite prints that column."""
    over = scbench_demo.tables()["overhead"]
    for row in scbench_demo.tables()["arms"]:
        measured_ms = sum(r["total_ms"] for r in over if r["policy"] == row["policy"])
        assert row["control_plane_ms"] == pytest.approx(measured_ms)
        assert row["makespan_incl_cp_s"] == pytest.approx(row["makespan_s"] + measured_ms / 1e3)
        if row["policy"] != "fcfs":
            assert row["makespan_incl_cp_s"] > row["makespan_s"]
    assert "makespan_incl_cp_s" in scbench_demo.markdown()


def test_guard_bounds_the_wait_cache_aware_alone_does_not(
    scbench_demo: SuiteResult,
) -> None:
    by = {r["policy"]: r for r in scbench_demo.tables()["arms"]}
    # in the demo case Cache-Aware alone starves some cold turn far past 40 s; Guard-40 cuts it
    assert by["cache_aware"]["ttft_max_s"] > 60.0
    assert by["cache_aware+guard40"]["ttft_max_s"] < by["cache_aware"]["ttft_max_s"]
    # and Cache-Aware's reuse beats FCFS's on a working set that outgrows the cache
    assert by["cache_aware"]["followup_reuse"] > by["fcfs"]["followup_reuse"]


def overtakes(turns: list[TurnResult], wait_s: float) -> int:
    """Pairs where a protected turn (waited >= W in the engine) was overtaken: a younger turn
    first scheduled after the older one had waited W, and before it."""
    n = 0
    for r in turns:
        for x in turns:
            if (x.first_scheduled_s is not None and r.first_scheduled_s is not None
                    and x.first_scheduled_s >= r.arrival_s + wait_s
                    and x.first_scheduled_s < r.first_scheduled_s
                    and x.arrival_s > r.arrival_s):  # fmt: skip
                n += 1
    return n


def test_guard_protected_turns_are_never_overtaken_by_younger_ones() -> None:
    # one context per session, more of them than the GPU holds: the engine's queue is long
    sset = generate_scbench(24, 3, arrival_rate_per_s=50.0, num_contexts=None,
                            context_tokens=(8192, 8192), mean_turns=3, min_turns=2, max_turns=4,
                            think_mean_s=1.0)  # fmt: skip
    w = 5.0

    def pool() -> list:
        return make_pool("A100-40GB", "Qwen3-8B", 1, 4.0, {"policy": "priority"})

    guarded = run_arm(sset, parse_arm("g", f"cache_aware+guard{w:g}"), pool())
    assert all(t.first_scheduled_s is not None for t in guarded.result.turns)
    assert overtakes(guarded.result.turns, w) == 0
    plain = run_arm(sset, parse_arm("c", "cache_aware"), pool())
    assert overtakes(plain.result.turns, w) > 0  # the property can fail without the guard


def test_arm_refuses_a_different_workload() -> None:
    sset = contended()
    with pytest.raises(ConfigError, match="same SessionSet"):
        run_arm(sset, parse_arm("f", "fcfs"), small_pool(), expect_hash="0" * 64)


def test_parse_arm_rejects_unknown_terms() -> None:
    with pytest.raises(ConfigError, match="unknown policy term"):
        parse_arm("x", "cache_aware+magic")


def test_continuation_forecasts_learn_from_completed_conversations_only() -> None:
    reps = small_pool()
    hook = ContinuationHook(SessionAware(), reps)
    t0 = Turn(0, 64, 4, (1, 2, 3, 4), 16, arrival_s=0.0)
    t1 = Turn(1, 96, 4, (1, 2, 3, 4, 5, 6), 16, think_s=1.0)
    s = Session("a-1", (t0, t1))

    def res(turn: Turn, arrival: float, finish: float) -> TurnResult:
        return TurnResult("a-1", turn.turn_index, s.request_id(turn.turn_index), reps[0].name,
                          "completed", "", arrival, arrival, arrival + 0.5, finish,
                          turn.num_prompt_tokens, 4, 0, 0)  # fmt: skip

    hook(s, t0, res(t0, 0.0, 1.0))
    told = reps[0].hear.intents.records
    assert len(told) == 1 and told[0].p_return.value == 0.5  # nothing completed yet: Laplace
    assert hook.views["a-1"].gaps_s == () and hook._completed == []
    hook(s, t1, res(t1, 2.0, 3.0))
    assert hook.views["a-1"].gaps_s == (1.0,)  # arrival 2.0 after the first turn's finish 1.0
    # its last forecast was told before the conversation joined the completed ones
    assert reps[0].hear.intents.records[-1].p_return.value == 0.5
    assert [v.num_turns for v in hook._completed] == [2] and hook.num_intents == 2


def test_continuation_intents_reach_the_engine_ranking() -> None:
    sset = contended()
    run = run_arm(sset, parse_arm("s", "session_aware"), small_pool())
    hook = run.continuation
    assert hook is not None and hook.num_intents == sset.num_turns
    (rep,) = run.replicas
    assert len(rep.hear.intents) == sset.num_turns
    assert len(rep.hear.retention) > 0  # resident contexts ranked by p · e^(-idle/400)
    assert run.recorder.summary()["outcome_report"].count == sset.num_turns
    # an intent never controls: no order updates, no controls at submission
    assert run.ordering.num_updates == 0 and not run.ordering.controls_at_submit


def test_mode_selection_sends_and_records_modes() -> None:
    sset = SessionSet((Session("reader-1", (Turn(0, 2000, 40, arrival_s=0.0),)),
                       Session("main-1", (Turn(0, 2000, 40, arrival_s=0.0),))), "open")  # fmt: skip
    mapping = ModeMap.of("v1", {"main": "sparse_attention", "reader": "kv_budget"})
    arm = Arm("m", selection=RoleModeSelection(mapping))
    run = run_arm(sset, arm, small_pool())
    got = sorted((r.role, r.requested, r.realized) for r in run.mode_records)
    assert got == [("main", "sparse_attention", "sparse_attention"),
                   ("reader", "kv_budget", "kv_budget")]  # fmt: skip
    assert run.recorder.summary()["mode_lookup"].count == 2


def test_mooncake_demo_every_load_and_arm() -> None:
    suite = load_suite(SUITES / "hear_mooncake.yaml")
    assert isinstance(suite, MooncakeSuite)
    seen: list[str] = []
    report = run_mooncake(suite, "demo", progress=lambda done, total, label: seen.append(label))
    assert seen[:2] == ["50%/fcfs", "50%/cache_aware"] and len(seen) == 15  # (level, arm)
    rows = report.tables["arms"].rows
    loads = sorted({r["load"] for r in rows})
    assert loads == ["100%", "50%", "75%"]
    for load in loads:
        arms = [r for r in rows if r["load"] == load]
        assert len(arms) == 5 and len({r["workload_sha256"] for r in arms}) == 1
    # nested load levels differ, so the hashes per load differ
    assert len({r["workload_sha256"] for r in rows}) == 3
    ops = {(r["policy"], r["op"]) for r in report.tables["overhead"].rows}
    assert ("session_aware", "outcome_report") in ops
    waiting = report.tables["waiting"].rows  # one row per (load, arm), Guard's W from the arms
    assert {(r["load"], r["policy"]) for r in waiting} == {(r["load"], r["policy"]) for r in rows}
    for r in waiting:  # a turn's queue time ends at its first scheduling, before its first token
        assert 0.0 <= r["followups_queued_40s_share"] <= r["followups_waited_40s_share"] <= 1.0
    regime = {r["load"]: r for r in report.tables["regime"].rows}
    assert set(regime) == set(loads)
    for load, r in regime.items():
        (fcfs,) = [a for a in rows if a["load"] == load and a["policy"] == "fcfs"]
        assert r["pressure"] == pytest.approx(r["offered_tpm"] / fcfs["throughput_tpm"])
    assert (
        regime["50%"]["offered_tpm"] < regime["75%"]["offered_tpm"] < regime["100%"]["offered_tpm"]
    )
    matched = report.tables["shape_matched"].rows
    assert {(r["load"], r["paper_load"]) for r in matched} == {
        (load, r["matched_paper_load"]) for load, r in regime.items()
    }
    assert len(matched) == 3 * 6  # loads x compared metrics


def test_regime_matches_each_load_to_the_paper_level_of_closest_pressure() -> None:
    """Pressure = offered turns/min over FCFS's served turns/min; the paper's offered rate is its
    unqueued 50 % level's throughput scaled by the session fraction."""
    paper_fcfs = {k: v["fcfs"]["throughput_tpm"] for k, v in PAPER_TABLE4.items()}
    assert paper_offered_tpm("75%") == pytest.approx(paper_fcfs["50%"] * 1.5)
    paper = {k: paper_offered_tpm(k) / paper_fcfs[k] for k in paper_fcfs}
    assert paper["50%"] == 1.0 and 1.0 < paper["75%"] < paper["100%"]
    rows = [{"load": "50%", "policy": "fcfs", "throughput_tpm": 100.0},
            {"load": "50%", "policy": "cache_aware", "throughput_tpm": 120.0},
            {"load": "75%", "policy": "fcfs", "throughput_tpm": 100.0}]  # fmt: skip
    out = {r["load"]: r for r in regime_rows(rows, {"50%": 135.0, "75%": 101.0})}
    assert out["50%"]["pressure"] == pytest.approx(1.35)
    assert out["50%"]["matched_paper_load"] == "100%"  # 1.35 is closest to the paper's ~1.40
    assert out["75%"]["matched_paper_load"] == "50%"  # 1.01 ~ the paper's unqueued 1.0
    assert out["75%"]["paper_pressure"] == pytest.approx(paper["75%"])


def test_offered_rate_is_turns_over_the_arrival_span() -> None:
    two = (Turn(0, 10, 2, arrival_s=0.0), Turn(1, 10, 2, arrival_s=30.0))
    sset = SessionSet((Session("a", two), Session("b", (Turn(0, 10, 2, arrival_s=60.0),))), "open")
    assert offered_tpm(sset) == pytest.approx(3.0)  # 3 turns over one minute
    one = SessionSet((Session("a", (Turn(0, 10, 2, arrival_s=0.0),)),), "open")
    assert math.isnan(offered_tpm(one))


def test_a_hear_suite_refuses_an_unknown_scale() -> None:
    with pytest.raises(ConfigError, match="suite hear-mooncake: unknown scale 'huge'"):
        load_suite(SUITES / "hear_mooncake.yaml").scaled("huge")  # type: ignore[union-attr]


def test_role_modes_mapping_frozen_and_evaluated(tmp_path: Path) -> None:
    from maserve_prefect.bench.hear.role_modes import run_role_modes

    suite = load_suite(SUITES / "hear_role_modes.yaml")
    assert isinstance(suite, RoleModesSuite)
    seen: list[tuple[int, int, str]] = []
    report = run_role_modes(suite, "demo", tmp_path, lambda *step: seen.append(step))
    # 3 + 3 candidate modes x 2 development sets, then the two evaluation arms
    assert [t for _, t, _ in seen] == [14] * 14 and seen[-1] == (14, 14, "eval/rm-v1")
    files = list(tmp_path.glob("role_modes_*.json"))
    assert len(files) == 1
    frozen = ModeMap.load(files[0])
    assert frozen.lookup("main") == "sparse_attention"  # kv_budget fails the quality proxy
    files[0].write_text(files[0].read_text().replace("sparse_attention", "kv_budget"))
    with pytest.raises(ConfigError, match="hash"):
        ModeMap.load(files[0])
    ev = report.tables["evaluation"].rows
    assert [r["mapping"] for r in ev] == ["all-dense", frozen.version]
    assert len({r["workload_sha256"] for r in ev}) == 1
    modes = report.tables["modes"].rows
    assert {m["role"]: m["requested"] for m in modes}["main"] == "sparse_attention"
    assert report.files == files
