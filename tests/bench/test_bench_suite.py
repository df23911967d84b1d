"""Suite files: parsing, scale overrides applied before validation, errors that name the key."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml
from bench_factories import write_scenario, write_suite

from maserve_prefect.bench.suite import apply_scale, find_suites, load_suite, parse_suite
from maserve_prefect.errors import ConfigError

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
    toy, other = load_suite(path).load_scenarios("full")
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


def test_bad_scale_name_and_scenario_errors(tmp_path: Path) -> None:
    suite = load_suite(write_suite(tmp_path))
    with pytest.raises(ConfigError, match="unknown scale 'medium'"):
        suite.load_scenarios("medium")
    missing = load_suite(write_suite(tmp_path, name="m", scenarios=["scenarios/none.yaml"]))
    with pytest.raises(ConfigError, match=re.escape("none.yaml: cannot read it")):
        missing.load_scenarios()
    (tmp_path / "scenarios" / "bad.yaml").write_text("name: y\ncohorts: []\narms: [{name: a}]\n")
    bad = load_suite(write_suite(tmp_path, name="b", scenarios=["scenarios/bad.yaml"]))
    with pytest.raises(ConfigError, match=re.escape("bad.yaml: cohorts")):
        bad.load_scenarios()


def test_duplicate_scenario_names_are_refused(tmp_path: Path) -> None:
    path = write_suite(
        tmp_path, scenarios=["scenarios/toy.yaml", "scenarios/../scenarios/toy.yaml"]
    )
    with pytest.raises(ConfigError, match="scenario names must be unique"):
        load_suite(path).load_scenarios()


def test_analysis_is_imported_or_named_in_the_error(tmp_path: Path) -> None:
    ok = load_suite(write_suite(tmp_path, analysis="bench_factories.count_rows"))
    fn = ok.analysis_fn()
    assert fn is not None and fn({"a": 1}) == [{"num_scenarios": 1}]
    bad = load_suite(write_suite(tmp_path, name="b", analysis="bench_factories.nothing"))
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
