"""The shipped data: sizes, provenance, integrity, package data, coverage of example specs."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
from maserve_prefect.bindings import get_binding, list_bindings, meeting_gen

from maserve_prefect.errors import ConfigError, SpecError
from maserve_prefect.spec.examples import example_spec
from maserve_prefect.tools import list_tools
from maserve_prefect.tools.retrieval import retrieve, stdlib_index

DATA = Path(__file__).resolve().parents[2] / "bindings" / "data"
SPECS = ("four_call", "fork_join", "refinement_loop", "debate", "spawn")


def test_registry_names_and_unknown_binding() -> None:
    assert list_bindings() == [
        "code", "finance", "math", "meeting_summary", "research", "science_qa",
    ]  # fmt: skip
    with pytest.raises(ConfigError, match=r"unknown binding 'nope'.*science_qa"):
        get_binding("nope")


@pytest.mark.parametrize("name", list_bindings())
def test_each_binding_has_enough_instances_provenance_and_tools(name: str) -> None:
    b = get_binding(name)
    assert len(b.info.instance_ids) >= 20
    assert b.info.provenance.source.startswith("authored for maserve-prefect")
    assert set(b.info.tools) <= set(list_tools())
    for inst in b.instances():
        assert inst.inputs["task"]["question"].strip()
    with pytest.raises(SpecError, match="no instance 'missing'"):
        b.instance("missing")


@pytest.mark.parametrize("name", list_bindings())
@pytest.mark.parametrize("spec_name", SPECS)
def test_bindings_cover_the_example_specs(name: str, spec_name: str) -> None:
    b, spec = get_binding(name), example_spec(spec_name)
    if set(spec.tools()) <= set(b.info.tools):
        b.check_covers(spec)
    else:
        with pytest.raises(SpecError, match="no tool"):
            b.check_covers(spec)


def test_spawn_spec_runs_under_research() -> None:
    get_binding("research").check_covers(example_spec("spawn"))


def test_shipped_data_is_small() -> None:
    assert sum(p.stat().st_size for p in DATA.glob("*.jsonl")) < 2_000_000


def _finance_value(kind: str, p: dict) -> float:
    if kind == "compound":
        n = p["periods_per_year"]
        return p["principal"] * (1 + p["rate"] / n) ** (n * p["years"])
    if kind == "simple":
        return p["principal"] * p["rate"] * p["years"]
    if kind == "continuous":
        return p["principal"] * math.exp(p["rate"] * p["years"])
    if kind == "present_value":
        return p["future_value"] / (1 + p["rate"]) ** p["years"]
    if kind == "npv":
        return sum(cf / (1 + p["rate"]) ** t for t, cf in enumerate(p["cash_flows"]))
    if kind == "loan_payment":
        r, n = p["annual_rate"] / 12, p["years"] * 12
        return p["principal"] * r / (1 - (1 + r) ** -n)
    if kind == "annuity_fv":
        return p["payment"] * ((1 + p["rate"]) ** p["periods"] - 1) / p["rate"]
    if kind == "effective_rate":
        n = p["periods_per_year"]
        return 100 * ((1 + p["rate"] / n) ** n - 1)
    raise AssertionError(f"unknown finance kind {kind}")


def test_finance_answers_match_formulas() -> None:
    for rec in get_binding("finance").records():
        assert rec["answer"] == pytest.approx(_finance_value(rec["kind"], rec["params"]), abs=0.006)


def test_meeting_file_is_what_the_seeded_script_generates() -> None:
    committed = (DATA / "meeting_summary.jsonl").read_text(encoding="utf-8")
    assert meeting_gen.render(meeting_gen.generate()) == committed


def test_meeting_transcripts_are_long_and_chunked() -> None:
    b = get_binding("meeting_summary")
    for inst in b.instances():
        doc = inst.inputs["document"]
        assert len(doc["text"].split()) > 3000
        assert "\n".join(doc["chunks"]) == doc["text"] and len(doc["chunks"]) == 6
        for kp in b.record(inst.instance_id)["key_points"]:
            for term in kp["terms"]:
                assert term.lower() in doc["text"].lower()


def test_research_evidence_exists_and_is_retrieved() -> None:
    docs = {d.doc_id for d in stdlib_index().documents}
    hits = 0
    records = get_binding("research").records()
    for rec in records:
        assert any(e in docs for e in rec["evidence"]), rec["id"]
        top = {h.doc_id for h in retrieve(rec["question"], k=10).hits}
        hits += bool(top & set(rec["evidence"]))
    assert hits / len(records) >= 0.8


def test_data_loads_as_package_resource() -> None:
    from maserve_prefect.bindings.base import load_jsonl

    assert load_jsonl("math.jsonl", ("id",))[0]["id"] == "math-01"
    with pytest.raises(ConfigError, match="missing"):
        load_jsonl("nope.jsonl", ("id",))
