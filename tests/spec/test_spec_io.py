"""Loading and dumping specs: shipped examples round-trip; every failure names the file."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import yaml

from maserve_prefect.errors import SpecError
from maserve_prefect.spec.composition import Choice, Sequence
from maserve_prefect.spec.examples import example_names, example_path, example_spec
from maserve_prefect.spec.io import (
    dump_spec,
    load_spec,
    parse_spec,
    spec_from_json,
    spec_from_yaml,
    spec_to_data,
    spec_to_json,
    spec_to_yaml,
)

EXPECTED_EXAMPLES = ["debate", "fork_join", "four_call", "refinement_loop", "spawn"]


def test_shipped_examples_cover_the_control_and_every_template() -> None:
    assert example_names() == EXPECTED_EXAMPLES
    kinds = {
        stage.control.kind for name in EXPECTED_EXAMPLES for stage in example_spec(name).stages
    }
    assert kinds == {"single", "spawn", "fork_join", "refinement_loop", "debate"}


@pytest.mark.parametrize("name", EXPECTED_EXAMPLES)
@pytest.mark.parametrize("suffix", [".yaml", ".yml", ".json"])
def test_examples_round_trip_through_files(name: str, suffix: str, tmp_path: Path) -> None:
    spec = example_spec(name)
    path = dump_spec(spec, tmp_path / f"{name}{suffix}")
    again = load_spec(path)
    assert again == spec
    assert dump_spec(again, tmp_path / f"again{suffix}").read_text() == path.read_text()


def test_json_dump_is_json_and_yaml_dump_is_yaml() -> None:
    spec = example_spec("debate")
    assert json.loads(spec_to_json(spec))["stages"][0]["control"]["kind"] == "debate"
    assert yaml.safe_load(spec_to_yaml(spec))["composition"]["kind"] == "repeat"
    assert spec_from_json(spec_to_json(spec)) == spec


def test_dump_omits_defaults_but_keeps_kind_tags() -> None:
    data = spec_to_data(example_spec("four_call"))
    assert data["stages"][0]["control"] == {"kind": "single", "role": "analyst_a"}
    parallel = data["composition"]["steps"][0]
    assert parallel == {"kind": "parallel", "branches": ["analyst_a", "analyst_b"]}


def test_yaml_on_key_is_not_a_boolean() -> None:
    spec = example_spec("refinement_loop")
    assert isinstance(spec.composition, Sequence)
    choice = spec.composition.steps[1]
    assert isinstance(choice, Choice) and choice.on == "review.verdict"


def test_structural_error_names_file_line_and_element(tmp_path: Path) -> None:
    text = example_path("fork_join").read_text().replace("width: 5", "width: 0")
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    line = next(i for i, ln in enumerate(text.splitlines(), 1) if "width: 0" in ln)
    with pytest.raises(SpecError) as info:
        load_spec(path)
    assert str(info.value) == (
        f"{path}, line {line}: stages[0] ('solve').control (fork_join).width: "
        "Input should be greater than or equal to 1 (got 0)"
    )


def test_semantic_error_names_file(tmp_path: Path) -> None:
    text = (
        example_path("four_call")
        .read_text()
        .replace("target: synthesis, artifact: analysis_b", "target: ghost")
    )
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    with pytest.raises(
        SpecError,
        match="^"
        + re.escape(
            f"{path}: workload 'four_call': dependency 'analyst_b' -> 'ghost': unknown stage 'ghost'"
        ),
    ):
        load_spec(path)


def test_json_errors_name_the_file(tmp_path: Path) -> None:
    path = tmp_path / "bad.json"
    data = spec_to_data(example_spec("debate"))
    data["stages"][0]["control"]["rounds"] = -1
    path.write_text(json.dumps(data))
    with pytest.raises(
        SpecError, match="^" + re.escape(f"{path}: stages[0] ('debate').control (debate).rounds")
    ):
        load_spec(path)
    path.write_text("{ not json")
    with pytest.raises(SpecError, match="^" + re.escape(f"{path}, line 1: not valid JSON")):
        load_spec(path)


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ("name: x\nstages: [\n", "<string>, line 3: not valid YAML"),
        ("- a\n- b\n", "<string>: a workload spec must be a mapping, got list"),
        ("name: x\nstages: []\n", "<string>, line 2: stages: Tuple should have at least 1 item"),
        (
            "bogus: 1\n" + example_path("spawn").read_text(),
            "<string>, line 1: bogus: Extra inputs are not permitted (got 1)",
        ),
    ],
)
def test_yaml_text_errors(text: str, needle: str) -> None:
    with pytest.raises(SpecError) as info:
        spec_from_yaml(text)
    assert needle in str(info.value)


def test_file_level_errors(tmp_path: Path) -> None:
    with pytest.raises(SpecError, match=r"unsupported spec file type '\.toml'"):
        load_spec(tmp_path / "spec.toml")
    with pytest.raises(SpecError, match="unsupported spec file type"):
        dump_spec(example_spec("spawn"), tmp_path / "spec.txt")
    with pytest.raises(SpecError, match="cannot read spec file"):
        load_spec(tmp_path / "missing.yaml")
    with pytest.raises(SpecError, match="unknown example spec 'nope' \\(available: debate"):
        example_spec("nope")


def test_parse_spec_accepts_plain_data() -> None:
    data = spec_to_data(example_spec("spawn"))
    assert parse_spec(data) == example_spec("spawn")
