"""Suite files of every kind: one loader, scale overrides, errors that name the file and key."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml
from bench_factories import write_hear_suite, write_pool_suite, write_scenario, write_suite

from maserve_prefect.bench.hear.suite_file import MooncakeSuite, RoleModesSuite, ScbenchSuite
from maserve_prefect.bench.pool.suite_file import PoolSuite
from maserve_prefect.bench.replay.suite_file import ReplaySuite, apply_scale
from maserve_prefect.bench.suite import find_suites, load_suite, parse_suite
from maserve_prefect.errors import ConfigError

SHIPPED = Path(__file__).resolve().parents[2] / "deployments" / "suites"

NATIVE: dict[str, Any] = {
    "name": "x",
    "cohorts": [
        {"name": "t", "native": {"workflow": "chat", "users": 1}},
        {"name": "bg", "role": "background", "bundle": "b"},
    ],
    "arrivals": {"kind": "poisson", "rate_per_s": 1.0},
    "arms": [{"name": "dag"}],
}


def test_apply_scale_edits_only_whitelisted_fields() -> None:
    out = apply_scale(NATIVE, {"users": 6, "rate_per_s": 3.0, "blocks": 2, "window_end_s": 9.0})
    assert out["cohorts"][0]["native"] == {"workflow": "chat", "users": 6}
    assert out["cohorts"][1] == NATIVE["cohorts"][1]  # bundle cohorts are untouched
    assert out["arrivals"] == {"kind": "poisson", "rate_per_s": 3.0}
    assert out["blocks"] == 2 and out["window"] == {"end_s": 9.0}
    assert NATIVE["cohorts"][0]["native"]["users"] == 1  # the input is not mutated


def test_closed_loop_users() -> None:
    data = NATIVE | {"arrivals": {"kind": "closed_loop", "users": 1}}
    assert apply_scale(data, {"closed_loop_users": 4})["arrivals"]["users"] == 4


@pytest.mark.parametrize(
    ("data", "overrides", "message"),
    [
        (NATIVE, {"seeds": 2}, "scale override 'seeds' is not one of"),
        (NATIVE | {"arrivals": {"kind": "burst"}}, {"rate_per_s": 2.0}, "arrivals.kind: poisson"),
        (NATIVE, {"closed_loop_users": 2}, "arrivals.kind: closed_loop"),
        ({"name": "x", "cohorts": [{"name": "t", "bundle": "b"}]}, {"users": 2}, "no native"),
    ],
)
def test_apply_scale_errors_name_the_key(
    data: dict[str, Any], overrides: dict[str, Any], message: str
) -> None:
    with pytest.raises(ConfigError, match=re.escape("scenario s.yaml")) as err:
        apply_scale(data, overrides, source="s.yaml")
    assert message in str(err.value)


def test_suite_scales_reach_the_validated_scenarios(tmp_path: Path) -> None:
    suite = load_suite(write_suite(tmp_path))
    assert isinstance(suite, ReplaySuite)
    demo, full = suite.load_scenarios("demo")[0], suite.load_scenarios("full")[0]
    assert demo.blocks == 1 and full.blocks == 2
    assert full.arrivals.kind == "poisson" and full.arrivals.rate_per_s == 2.0
    assert demo.base_dir == tmp_path / "scenarios"  # scenario paths stay relative to the scenario


def test_per_scenario_scales_override_the_suite(tmp_path: Path) -> None:
    write_scenario(tmp_path, "other")
    path = write_suite(
        tmp_path,
        scenarios=["scenarios/toy.yaml", {"path": "scenarios/other.yaml",
                                          "scales": {"full": {"blocks": 3}}}],
    )  # fmt: skip
    suite = load_suite(path)
    assert isinstance(suite, ReplaySuite)
    toy, other = suite.load_scenarios("full")
    assert (toy.blocks, other.blocks) == (2, 3)
    assert other.arrivals.rate_per_s == 2.0  # the suite's other override still applies


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ({"scales": {"demo": {"nodes": 2}}}, "unknown override 'nodes'"),
        ({"scales": {"huge": {"blocks": 2}}}, "scales.huge"),
        ({"schedule": {}}, "exactly one of `cron` or `interval_s`"),
        ({"schedule": {"cron": "* * * * *", "interval_s": 5}}, "exactly one"),
        ({"scenarios": []}, "scenarios"),
        ({"name": "has space"}, "name"),
        ({"analysis": "no_dots"}, "analysis"),
    ],
)
def test_bad_suite_fields_are_named(extra: dict[str, Any], message: str) -> None:
    data = {"name": "s", "scenarios": ["a.yaml"]} | extra
    with pytest.raises(ConfigError, match=re.escape("suite s.yaml")) as err:
        parse_suite(data, source="s.yaml")
    assert message in str(err.value)


def replay_suite(path: Path) -> ReplaySuite:
    suite = load_suite(path)
    assert isinstance(suite, ReplaySuite)
    return suite


def test_bad_scale_name_and_scenario_errors(tmp_path: Path) -> None:
    suite = replay_suite(write_suite(tmp_path))
    with pytest.raises(ConfigError, match="unknown scale 'medium'"):
        suite.load_scenarios("medium")
    missing = replay_suite(write_suite(tmp_path, name="m", scenarios=["scenarios/none.yaml"]))
    with pytest.raises(ConfigError, match=re.escape("none.yaml: cannot read it")):
        missing.load_scenarios()
    (tmp_path / "scenarios" / "bad.yaml").write_text("name: y\ncohorts: []\narms: [{name: a}]\n")
    bad = replay_suite(write_suite(tmp_path, name="b", scenarios=["scenarios/bad.yaml"]))
    with pytest.raises(ConfigError, match=re.escape("bad.yaml: cohorts")):
        bad.load_scenarios()


def test_duplicate_scenario_names_are_refused(tmp_path: Path) -> None:
    path = write_suite(
        tmp_path, scenarios=["scenarios/toy.yaml", "scenarios/../scenarios/toy.yaml"]
    )
    with pytest.raises(ConfigError, match="scenario names must be unique"):
        replay_suite(path).load_scenarios()


def test_analysis_is_imported_or_named_in_the_error(tmp_path: Path) -> None:
    ok = replay_suite(write_suite(tmp_path, analysis="bench_factories.count_rows"))
    fn = ok.analysis_fn()
    assert fn is not None and fn({"a": 1}) == [{"num_scenarios": 1}]
    bad = replay_suite(write_suite(tmp_path, name="b", analysis="bench_factories.nothing"))
    with pytest.raises(
        ConfigError, match=re.escape("'bench_factories.nothing' cannot be imported")
    ):
        bad.analysis_fn()


def test_find_suites_lists_top_level_yaml_only(tmp_path: Path) -> None:
    write_suite(tmp_path, name="a")
    write_suite(tmp_path, name="b")
    (tmp_path / "notes.txt").write_text("x")
    assert [p.name for p in find_suites(tmp_path)] == ["a.yaml", "b.yaml"]
    with pytest.raises(ConfigError, match="pass --suites DIR"):
        find_suites(tmp_path / "missing")


def test_unreadable_suite_file(tmp_path: Path) -> None:
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump(["a list"]))
    with pytest.raises(ConfigError, match="expected a mapping"):
        load_suite(path)


# -- one loader for every kind ------------------------------------------------------------------


def test_every_shipped_suite_loads_as_its_kind_and_says_its_kind() -> None:
    kinds = {p.name: type(load_suite(p)) for p in find_suites(SHIPPED)}
    assert kinds == {
        "conformance_replay_native.yaml": ReplaySuite,
        "finding_background.yaml": ReplaySuite,
        "finding_barrier.yaml": ReplaySuite,
        "finding_cohorts.yaml": ReplaySuite,
        "finding_context.yaml": ReplaySuite,
        "finding_demand.yaml": ReplaySuite,
        "finding_kv_budget.yaml": ReplaySuite,
        "finding_rate_sweep.yaml": ReplaySuite,
        "finding_request_limit.yaml": ReplaySuite,
        "finding_temporal_mixing.yaml": ReplaySuite,
        "hear_mooncake.yaml": MooncakeSuite,
        "hear_role_modes.yaml": RoleModesSuite,
        "hear_scbench.yaml": ScbenchSuite,
        "pool_hetero.yaml": PoolSuite,
    }
    for path in find_suites(SHIPPED):  # shipped files write their kind out
        assert "kind" in yaml.safe_load(path.read_text()), path.name
    pool = load_suite(SHIPPED / "pool_hetero.yaml")
    assert pool.scale_names() == ("demo", "medium", "full", "full-headline", "pressure")
    assert load_suite(SHIPPED / "hear_mooncake.yaml").scale_names() == ("demo", "full")


def test_kind_defaults_to_replay() -> None:
    suite = parse_suite({"name": "s", "scenarios": ["a.yaml"]}, source="s.yaml")
    assert isinstance(suite, ReplaySuite) and suite.kind == "replay"


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ({"name": "s", "kind": "experiment"}, "kind: unknown kind 'experiment'; use one of replay"),
        ({"name": "s", "kind": "hear"}, "experiment: a `kind: hear` suite names its experiment"),
        ({"name": "s", "kind": "hear", "experiment": "bogus"}, "one of scbench, mooncake"),
        ({"name": "s", "kind": "pool", "scenarios": ["a.yaml"]}, "workflows: Field required"),
    ],
)
def test_bad_kind_or_experiment_is_named(data: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError, match=re.escape("suite s.yaml: ")) as err:
        parse_suite(data, source="s.yaml")
    assert message in str(err.value)


def test_hear_scales_are_merged_one_level_deep_and_validated(tmp_path: Path) -> None:
    suite = load_suite(write_hear_suite(tmp_path))
    assert isinstance(suite, ScbenchSuite)
    demo, full = suite.scaled("demo"), suite.scaled("full")
    assert (demo.workload.num_sessions, full.workload.num_sessions) == (3, 4)
    assert demo.workload.num_contexts == full.workload.num_contexts == 1  # the rest is kept
    assert demo.workload.mean_turns == 2 and isinstance(demo.workload.mean_turns, int)
    with pytest.raises(ConfigError, match="unknown scale 'medium'"):
        suite.scaled("medium")


@pytest.mark.parametrize(
    ("extra", "key", "message"),
    [
        ({"scales": {"demo": {"workload": {"num_sesions": 3}}}}, "scales.demo.workload.num_sesions",
         "Extra inputs are not permitted"),
        ({"scales": {"demo": {"refresh_s": 0}}}, "scales.demo.refresh_s", "greater than 0"),
        ({"max_in_flight": 4}, "max_in_flight", "Extra inputs are not permitted"),
        ({"calibration": {"target": {"makespan_s": 481, "ttft_p50_s": 63.1, "ttft_p95_s": 74.2,
                                     "ttft_max_s": 79, "followup_reuse": 0.192},
                          "grid": {"num_sesions": [1]}}}, "calibration.grid",
         "['num_sesions'] are not workload keys"),
        ({"scales": {"demo": {"name": "other"}}}, "scales.demo.name", "cannot change"),
        ({"arms": {}}, "arms", "at least 1 item"),
        ({"pool": {"gpu": "RTX-PRO-6000"}}, "pool.model", "Field required"),
        ({"experiment": "mooncake", "scales": {"demo": {}}, "pool": {"gpu": "H100", "model": "m"},
          "workload": {"trace": "t.jsonl", "window_s": 5, "fractions": [1.0]}},
         "pool: give `sizing`", "or `num_devices`"),
    ],
)  # fmt: skip
def test_bad_hear_key_names_the_file_and_the_key(
    tmp_path: Path, extra: dict[str, Any], key: str, message: str
) -> None:
    path = write_hear_suite(tmp_path, **extra)
    with pytest.raises(ConfigError) as err:
        load_suite(path)
    assert str(err.value).startswith(f"suite {path}: {key}")
    assert message in str(err.value)


def test_bad_pool_key_names_the_file_and_the_key(tmp_path: Path) -> None:
    good = load_suite(write_pool_suite(tmp_path, tmp_path))
    assert isinstance(good, PoolSuite) and good.scale_names() == ("tiny",)
    with pytest.raises(ConfigError, match="unknown scale 'demo'"):
        good.scale("demo")
    path = write_pool_suite(tmp_path, tmp_path, name="bad", baselines={"fcfs": "nope"})
    with pytest.raises(ConfigError) as err:
        load_suite(path)
    assert str(err.value).startswith(f"suite {path}: baselines.fcfs: unknown arm 'nope'")
    path = write_pool_suite(
        tmp_path, tmp_path, name="bad2", arms={"joint": {"plan": "joint", "predictor": "x"}}
    )
    with pytest.raises(ConfigError, match=re.escape(f"suite {path}: arms.joint.predictor")):
        load_suite(path)


def test_every_kind_takes_a_schedule(tmp_path: Path) -> None:
    hear = load_suite(write_hear_suite(tmp_path, schedule={"interval_s": 60}))
    pool = load_suite(write_pool_suite(tmp_path, tmp_path, schedule={"cron": "0 4 * * *"}))
    assert hear.schedule is not None and hear.schedule.interval_s == 60.0
    assert pool.schedule is not None and pool.schedule.cron == "0 4 * * *"
    path = write_hear_suite(tmp_path, name="both", schedule={"cron": "x", "interval_s": 1})
    with pytest.raises(ConfigError, match="schedule: give exactly one"):
        load_suite(path)
