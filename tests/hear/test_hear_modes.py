"""Role -> mode selection: the frozen mapping file, lookup, the ledger, and calibration."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hear_factories import make_engine

from maserve_prefect.errors import ConfigError
from maserve_prefect.hear.mode_calibration import DevRun, calibrate
from maserve_prefect.hear.modemap import ModeLedger, ModeMap
from maserve_prefect.hear.policies import RoleModeSelection
from maserve_prefect.protocol.controls import Force


def test_mode_map_file_round_trips_and_is_frozen(tmp_path: Path) -> None:
    m = ModeMap.of("v3", {"planner": "default", "critic": "eager"}, default="default")
    path = m.save(tmp_path / "modes.json")
    loaded = ModeMap.load(path)
    assert loaded == m and loaded.content_hash == m.content_hash
    assert json.loads(path.read_text())["sha256"] == m.content_hash
    assert [p.name for p in tmp_path.iterdir()] == ["modes.json"]  # no temp file left behind
    with pytest.raises(TypeError):
        loaded.modes["critic"] = "default"  # type: ignore[index]
    assert (
        ModeMap.of("v4", {"critic": "eager"}).content_hash
        != ModeMap.of("v3", {"critic": "eager"}).content_hash
    )


def test_an_edited_mode_map_file_is_refused(tmp_path: Path) -> None:
    path = ModeMap.of("v1", {"critic": "eager"}).save(tmp_path / "m.json")
    data = json.loads(path.read_text())
    data["modes"]["critic"] = "default"
    path.write_text(json.dumps(data))
    with pytest.raises(ConfigError, match="content hash mismatch"):
        ModeMap.load(path)


def test_lookup_returns_the_frozen_mapping_and_unknown_roles_need_a_default() -> None:
    sel = RoleModeSelection(ModeMap.of("v1", {"critic": "eager", "planner": "default"}))
    assert [sel.lookup(r) for r in ("critic", "planner")] == ["eager", "default"]
    with pytest.raises(ConfigError, match="no mode for role 'coder'"):
        sel.lookup("coder")


def test_ledger_records_requested_vs_realized_mode_and_the_fallback() -> None:
    mapping = ModeMap.of("v2", {"critic": "turbo", "planner": "default"})
    sel = RoleModeSelection(mapping, force=Force.REQUIREMENT, fallback=("eager",))
    eng = make_engine(modes=("default", "eager"))
    ledger = ModeLedger()
    for rid, role in (("r1", "critic"), ("r2", "planner")):
        out = eng.submit(rid, [sel.control(role)])
        ledger.record(mapping, rid, role, out)
    r1, r2 = ledger.records
    assert (r1.requested, r1.realized, r1.fell_back) == ("turbo", "eager", True)
    assert (r2.requested, r2.realized, r2.fell_back) == ("default", "default", False)
    assert r1.mapping_version == "v2" and ledger.num_fallbacks() == 1


def test_ledger_records_an_unsupported_request_as_never_run() -> None:
    mapping = ModeMap.of("v1", {"critic": "turbo"})
    sel = RoleModeSelection(mapping, force=Force.REQUIREMENT)
    ledger = ModeLedger()
    rec = ledger.record(
        mapping, "r1", "critic", make_engine().submit("r1", [sel.control("critic")])
    )
    assert rec.realized is None and not rec.fell_back


# --- calibration --------------------------------------------------------------------------

MAKESPANS = {
    "default": [10.0, 10.2, 9.9],
    "eager": [8.0, 8.1, 7.9],
    "jittery": [4.0, 12.0, 4.0],  # fastest median, unstable makespan
    "flaky": [5.0, 5.0, 5.0],  # fast and steady, but quality varies
}
QUALITY = {"flaky": [1.0, 0.6, 1.0]}


def run_fn(role: str, mode: str, i: int) -> DevRun:
    return DevRun(MAKESPANS[mode][i], output=(role, mode, i))


def quality_fn(role: str, mode: str, run: DevRun) -> float:
    _, _, i = run.output  # type: ignore[misc]
    return QUALITY.get(mode, [1.0, 1.0, 1.0])[i]


def test_calibrate_filters_unstable_candidates_and_ranks_by_makespan(tmp_path: Path) -> None:
    cal = calibrate(
        {"critic": ["default", "eager", "jittery", "flaky"], "planner": ["default"]},
        run_fn,
        quality_fn,
        3,
        version="dev-7",
        min_quality=0.5,
        path=tmp_path / "modes.json",
    )
    assert dict(cal.mapping.modes) == {"critic": "eager", "planner": "default"}
    by_mode = {r.mode: r for r in cal.reports if r.role == "critic"}
    assert by_mode["jittery"].passed_quality and not by_mode["jittery"].passed_stability
    assert by_mode["flaky"].passed_quality and not by_mode["flaky"].passed_stability
    assert by_mode["eager"].passed and by_mode["default"].passed
    assert cal.path is not None and ModeMap.load(cal.path) == cal.mapping
    assert cal.mapping.version == "dev-7"


def test_calibrate_is_pure_without_a_path_and_refuses_when_nothing_passes(tmp_path: Path) -> None:
    cal = calibrate({"critic": ["default", "jittery", "eager"]}, run_fn, quality_fn, 3, version="x")
    assert cal.path is None and cal.mapping.lookup("critic") == "eager"
    with pytest.raises(ConfigError, match="no candidate mode for role 'critic'"):
        calibrate(  # flaky, the reference, has uneven scores; jittery swings against it
            {"critic": ["flaky", "jittery"]},
            run_fn,
            quality_fn,
            3,
            version="x",
            path=tmp_path / "m.json",
        )
    assert list(tmp_path.iterdir()) == []
    with pytest.raises(ConfigError, match="stability_runs"):
        calibrate({"critic": ["eager"]}, run_fn, quality_fn, 1, version="x")
