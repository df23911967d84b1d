"""Fuzzing every command with malformed files, paths and options (hypothesis).

The contract under test, for every `maserve` command: whatever it is given, it either succeeds or
exits non-zero with exactly one `error:` line on stderr naming what to fix — never a traceback —
and a refused command leaves nothing half written: the output folders, `MASERVE_HOME` and the
ledger's row counts are as they were. `PREFECT_API_URL` points at a port nothing listens on, so
a command whose input passes every check stops at the Prefect connection (one line too) instead
of starting a server. Few examples per command, no deadline: the suite must stay fast.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import sqlite3
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner, Result

from maserve_prefect.cli import _mount, app
from maserve_prefect.cli.checks import EXIT_FAILED_WORK

runner = CliRunner()
_mount()

FUZZ = settings(
    max_examples=12,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
    derandomize=True,
)
UNREACHABLE_API = "http://127.0.0.1:9/api"


@pytest.fixture(autouse=True)
def _isolated(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PREFECT_API_URL", UNREACHABLE_API)
    monkeypatch.delenv("MASERVE_LEDGER_URL", raising=False)
    monkeypatch.delenv("MASERVE_CAS_DIR", raising=False)


# -- the contract -------------------------------------------------------------------------------


def _tree(path: Path) -> object:
    """What is at `path`: nothing, a file's digest, or a folder's entries and digests."""
    if not path.exists():
        return None
    if path.is_file():
        return hashlib.sha256(path.read_bytes()).hexdigest()
    return sorted(
        (str(p.relative_to(path)), p.is_dir(), p.is_file() and p.read_bytes())
        for p in path.rglob("*")
    )


def _row_counts(db: Path) -> dict[str, int]:
    with sqlite3.connect(db) as conn:
        tables = [r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")]
        return {t: conn.execute(f'SELECT COUNT(*) FROM "{t}"').fetchone()[0] for t in tables}


def invoke(args: list[str], *, watch: list[Path], ledger: Path | None = None) -> Result:
    """Run `maserve ARGS` and check the contract (module docstring)."""
    before = [_tree(p) for p in watch]
    rows = _row_counts(ledger) if ledger is not None else None
    res = runner.invoke(app, args)
    shown = f"maserve {' '.join(args)}\n{res.output}"
    assert res.exception is None or isinstance(res.exception, SystemExit), (
        f"{shown}\nraised {res.exception!r}"
    )
    assert "Traceback" not in res.output, shown
    if res.exit_code != 0:
        lines = [line for line in res.stderr.splitlines() if line.strip()]
        assert len(lines) == 1 and lines[0].startswith("error: "), shown
        if res.exit_code != EXIT_FAILED_WORK:  # failed work still writes its results
            assert [_tree(p) for p in watch] == before, f"{shown}\nchanged what it watched"
            if ledger is not None:
                assert _row_counts(ledger) == rows, f"{shown}\nchanged the ledger"
    return res


@contextmanager
def scratch() -> Iterator[Path]:
    """A fresh folder per example (hypothesis reuses function-scoped fixtures)."""
    path = Path(tempfile.mkdtemp(prefix="maserve-fuzz-"))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def home_of(tmp: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    home = tmp / "home"
    monkeypatch.setenv("MASERVE_HOME", str(home))
    return home


# -- inputs -------------------------------------------------------------------------------------

JSON_VALUES = st.one_of(
    st.integers(-(2**70), 2**70),
    st.floats(allow_nan=True, allow_infinity=True),
    st.booleans(),
    st.none(),
    st.text(max_size=4),
    st.lists(st.integers(-3, 3), max_size=3),
)
FIELDS = ("timestamp", "input_length", "output_length", "hash_ids")


@st.composite
def good_row(draw: st.DrawFn) -> dict[str, Any]:
    blocks = draw(st.integers(1, 4))
    return {
        "timestamp": draw(st.one_of(st.integers(0, 10**6), st.floats(0, 1e6))),
        "input_length": draw(st.integers((blocks - 1) * 512 + 1, blocks * 512)),
        "output_length": draw(st.integers(0, 64)),
        "hash_ids": draw(st.lists(st.integers(0, 9), min_size=blocks, max_size=blocks)),
    }


MOONCAKE_LINES = st.lists(
    st.one_of(
        good_row().map(json.dumps),
        good_row().flatmap(
            lambda row: st.sampled_from(FIELDS).flatmap(
                lambda key: JSON_VALUES.map(lambda v: json.dumps(row | {key: v}))
            )
        ),
        st.dictionaries(st.sampled_from((*FIELDS, "x")), JSON_VALUES, max_size=5).map(json.dumps),
        st.text(alphabet=st.characters(blacklist_characters="\n\r"), max_size=12),
    ),
    max_size=6,
)


def place(tmp: Path, kind: str, name: str, content: str = "") -> Path:
    """A path of the given kind: a fresh name, a file, a folder, a non-empty folder, a path under
    a file."""
    path = tmp / name
    if kind == "file":
        path.write_text(content or "not what was asked for\n")
    elif kind == "dir":
        path.mkdir()
    elif kind == "nonempty":
        path.mkdir()
        (path / "keep.txt").write_text("x")
    elif kind == "under_file":
        (tmp / f"{name}-file").write_text("x")
        path = tmp / f"{name}-file" / "sub"
    return path


OUT_KINDS = st.sampled_from(["fresh", "file", "nonempty", "under_file", "dir"])


def mooncake_bundle(tmp: Path) -> Path:
    """A two-request bundle (imported with the CLI itself)."""
    src = tmp / "seed.jsonl"
    src.write_text(
        '{"timestamp": 0, "input_length": 600, "output_length": 4, "hash_ids": [1, 2]}\n'
        '{"timestamp": 50, "input_length": 300, "output_length": 4, "hash_ids": [3]}\n'
    )
    dest = tmp / "bundle"
    assert (
        runner.invoke(app, ["trace", "import-mooncake", str(src), "--out", str(dest)]).exit_code
        == 0
    )
    return dest


# -- trace --------------------------------------------------------------------------------------


@FUZZ
@given(
    lines=MOONCAKE_LINES,
    file_kind=st.sampled_from(["content", "content", "missing", "dir"]),
    out_kind=st.sampled_from(["fresh", "file", "nonempty", "under_file", "default"]),
    strict=st.booleans(),
    force=st.booleans(),
    block_size=st.sampled_from([None, 0, -1, 1, 512, 2**40]),
    model=st.sampled_from([None, "Qwen3-8B", "no-such-model"]),
)
def test_fuzz_trace_import_mooncake(
    monkeypatch: pytest.MonkeyPatch,
    lines: list[str],
    file_kind: str,
    out_kind: str,
    strict: bool,
    force: bool,
    block_size: int | None,
    model: str | None,
) -> None:
    with scratch() as tmp:
        home = home_of(tmp, monkeypatch)
        src = tmp / "t.jsonl"
        if file_kind == "content":
            src.write_text("".join(f"{line}\n" for line in lines))
        elif file_kind == "dir":
            src.mkdir()
        args = ["trace", "import-mooncake", str(src)]
        out = home / "traces" / "t" if out_kind == "default" else place(tmp, out_kind, "out")
        if out_kind != "default":
            args += ["--out", str(out)]
        args += ["--strict"] * strict + ["--force"] * force
        args += ["--block-size", str(block_size)] if block_size is not None else []
        args += ["--model", model] if model is not None else []
        res = invoke(args, watch=[out, home])
        if res.exit_code == 0:
            assert (out / "trace.jsonl").is_file()


@FUZZ
@given(
    kind=st.sampled_from(["valid", "trace_file", "file", "missing", "empty_dir", "garbage", "cut"]),
    text=st.text(max_size=60),
    cut=st.integers(0, 2000),
    view=st.sampled_from([[], ["--per-root"], ["--summary"]]),
)
def test_fuzz_trace_stats(
    monkeypatch: pytest.MonkeyPatch, kind: str, text: str, cut: int, view: list[str]
) -> None:
    with scratch() as tmp:
        home_of(tmp, monkeypatch)
        bundle = mooncake_bundle(tmp)
        path = {"valid": bundle, "trace_file": bundle / "trace.jsonl"}.get(kind, tmp / "x")
        if kind == "file":
            path.write_text(text)
        elif kind == "empty_dir":
            path.mkdir()
        elif kind == "garbage":
            path.mkdir()
            (path / "trace.jsonl").write_text(text)
        elif kind == "cut":
            raw = (bundle / "trace.jsonl").read_bytes()
            (bundle / "trace.jsonl").write_bytes(raw[: cut % max(len(raw), 1)])
            path = bundle
        res = invoke(["trace", "stats", str(path), *view], watch=[tmp])
        if kind in ("valid", "trace_file"):
            assert res.exit_code == 0, res.output


@FUZZ
@given(
    ids=st.sampled_from(
        [[], ["--run", "r"], ["--flow-run", "f"], ["--run", "r", "--flow-run", "f"]]
    ),
    out_kind=OUT_KINDS,
    ledger=st.sampled_from(["sqlite", "garbage", "under_file"]),
    wait=st.sampled_from([None, "0", "-1", "nan"]),
)
def test_fuzz_trace_export(
    monkeypatch: pytest.MonkeyPatch, ids: list[str], out_kind: str, ledger: str, wait: str | None
) -> None:
    with scratch() as tmp:
        home = home_of(tmp, monkeypatch)
        db = tmp / "ledger.db"
        _seed_ledger(db)
        url = {"sqlite": f"sqlite:///{db}", "garbage": "not a url://", "under_file": ""}[ledger]
        if ledger == "under_file":
            url = f"sqlite:///{place(tmp, 'under_file', 'l')}/ledger.db"
        out = place(tmp, out_kind, "out")
        args = ["trace", "export", *ids, "--out", str(out), "--ledger", url]
        args += ["--wait", wait] if wait is not None else []
        res = invoke(args, watch=[out, home], ledger=db)
        if res.exit_code == 0:  # a crashed run exports from the ledger alone, no Prefect needed
            assert "--run" in ids and (out / "trace.jsonl").is_file()


def _seed_ledger(db: Path) -> None:
    from maserve_prefect.trace.cas import MemoryStore
    from maserve_prefect.trace.ledger import Ledger
    from maserve_prefect.trace.model import Manifest

    with Ledger(f"sqlite:///{db}", MemoryStore()) as ledger:
        ledger.begin_run(Manifest(trace_id="r"))


# -- sim ----------------------------------------------------------------------------------------


@FUZZ
@given(
    lines=MOONCAKE_LINES,
    kind=st.sampled_from(["mooncake", "mooncake", "bundle", "missing", "other_file", "dir"]),
    gpu=st.sampled_from(["H100", "NoSuchGPU"]),
    model=st.sampled_from(["Qwen3-0.6B", "no-such-model"]),
    replicas=st.sampled_from(["1", "2", "0", "-3"]),
    seqs=st.sampled_from([None, "0", "4"]),
    out_kind=st.sampled_from(["none", "fresh", "file", "under_file"]),
)
def test_fuzz_sim_replay(
    monkeypatch: pytest.MonkeyPatch,
    lines: list[str],
    kind: str,
    gpu: str,
    model: str,
    replicas: str,
    seqs: str | None,
    out_kind: str,
) -> None:
    with scratch() as tmp:
        home = home_of(tmp, monkeypatch)
        path = {"missing": tmp / "none.jsonl", "other_file": tmp / "x.txt", "dir": tmp / "d"}.get(
            kind, tmp / "t.jsonl"
        )
        if kind == "mooncake":
            path.write_text("".join(f"{line}\n" for line in lines))
        elif kind == "bundle":
            path = mooncake_bundle(tmp)
        elif kind == "other_file":
            path.write_text("\n".join(lines))
        elif kind == "dir":
            path.mkdir()
        args = ["sim", "replay", str(path), "--gpu", gpu, "--model", model, "--replicas", replicas]
        args += ["--max-num-seqs", seqs] if seqs is not None else []
        out = place(tmp, "fresh" if out_kind == "none" else out_kind, "out")
        args += [] if out_kind == "none" else ["--out", str(out)]
        res = invoke(args, watch=[out, home])
        if res.exit_code == 0 and out_kind != "none":
            assert (out / "summary.json").is_file()


@FUZZ
@given(
    profiles=st.sampled_from(["missing", "file", "empty_dir"]),
    gpu=st.sampled_from(["H100", "Lab Card", ""]),
    base=st.sampled_from([None, "H100", "NoSuchGPU"]),
    out_kind=st.sampled_from(["none", "fresh", "dir", "under_file"]),
)
def test_fuzz_sim_calibrate(
    monkeypatch: pytest.MonkeyPatch, profiles: str, gpu: str, base: str | None, out_kind: str
) -> None:
    with scratch() as tmp:
        home = home_of(tmp, monkeypatch)
        monkeypatch.setenv("MASERVE_DEVICES_DIR", str(tmp / "devices"))
        src = place(tmp, {"missing": "fresh", "file": "file", "empty_dir": "dir"}[profiles], "p")
        args = ["sim", "calibrate", str(src), "--gpu", gpu]
        args += ["--base-gpu", base] if base is not None else []
        out = place(tmp, "fresh" if out_kind == "none" else out_kind, "out.yaml")
        args += [] if out_kind == "none" else ["--out", str(out)]
        res = invoke(args, watch=[out, home, tmp / "devices"])
        assert res.exit_code != 0  # no profile ever fits here


# -- run, replay, bench --------------------------------------------------------------------------

ENGINES = st.one_of(
    st.sampled_from(
        [
            "sim",
            "tgi",
            "openai:",
            "openai:ftp://h:1",
            "openai:http://u:SECRET@127.0.0.1:9",
            "openai:http://h:99999",
            "openai:http://127.0.0.1:9?api_key_env=1BAD",
            "openai:http://127.0.0.1:9?api_key=SECRET",
        ]
    ),
    st.text(max_size=12).map(lambda s: f"openai:{s}"),
)


@FUZZ
@given(
    workflow=st.sampled_from(["fork_join", "no_such_flow", ""]),
    users=st.sampled_from(["1", "0", "-1"]),
    engine=ENGINES,
    binding=st.sampled_from([None, "math", "nope"]),
    content=st.sampled_from(["binding", "nope"]),
    pool=st.sampled_from(["none", "missing", "garbage", "junk_mapping", "dir"]),
    rate=st.sampled_from([None, "-1", "0", "inf", "nan", "0.5"]),
    out_kind=OUT_KINDS,
    key_env=st.sampled_from([None, "1BAD", "MASERVE_FUZZ_UNSET"]),
)
def test_fuzz_run(
    monkeypatch: pytest.MonkeyPatch,
    workflow: str,
    users: str,
    engine: str,
    binding: str | None,
    content: str,
    pool: str,
    rate: str | None,
    out_kind: str,
    key_env: str | None,
) -> None:
    with scratch() as tmp:
        home = home_of(tmp, monkeypatch)
        db = tmp / "ledger.db"
        _seed_ledger(db)
        out = place(tmp, out_kind, "out")
        args = ["run", workflow, "--users", users, "--engine", engine, "--content", content]
        args += ["--out", str(out), "--ledger", f"sqlite:///{db}"]
        args += ["--binding", binding] if binding is not None else []
        args += ["--arrival-rate", rate] if rate is not None else []
        args += ["--api-key-env", key_env] if key_env is not None else []
        if pool != "none":
            pool_path = place(tmp, "dir" if pool == "dir" else "fresh", "pool.yaml")
            text = {"garbage": "{[: not yaml", "junk_mapping": "devices: 3\nnope: [1]\n"}
            if pool in text:
                pool_path.write_text(text[pool])
            args += ["--pool", str(pool_path)]
        res = invoke(args, watch=[out, home], ledger=db)
        assert res.exit_code != 0  # no Prefect API answers
        assert "SECRET" not in res.output


def _scenario_doc(bundle: str) -> dict[str, Any]:
    return {
        "name": "fz",
        "cohorts": [{"name": "t", "bundle": bundle}],
        "lock": "length",
        "arms": [{"name": "dag"}],
    }


MUTATIONS: dict[str, dict[str, Any]] = {
    "inf_rate": {"arrivals": {"kind": "poisson", "rate_per_s": float("inf")}},
    "nan_rate": {"arrivals": {"kind": "poisson", "rate_per_s": float("nan")}},
    "neg_rate": {"arrivals": {"kind": "poisson", "rate_per_s": -1.0}},
    "ok_rate": {"arrivals": {"kind": "poisson", "rate_per_s": 5.0}},
    "inf_burst": {"arrivals": {"kind": "burst", "at_s": float("inf")}},
    "inverted_window": {"window": {"start_s": 3.0, "end_s": 1.0}},
    "unknown_class": {"deadlines": {"classes": {"no-such-class": 5.0}}},
    "negative_deadline": {"deadlines": {"classes": {"mooncake": -5.0}}},
    "inverted_think": {
        "arrivals": {
            "kind": "closed_loop",
            "users": 1,
            "think_time": {"dist": "uniform", "low_s": 2.0, "high_s": 1.0},
        }
    },
    "no_arms": {"arms": []},
    "zero_blocks": {"blocks": 0},
    "bad_engine": {"engine": "tgi:http://u:SECRET@h"},
    "bad_release": {"arms": [{"name": "a", "release": "sideways"}]},
    "extra_field": {"colour": "blue"},
}


@FUZZ
@given(
    mutations=st.lists(st.sampled_from(sorted(MUTATIONS)), max_size=2),
    bundle_kind=st.sampled_from(["bundle", "bundle", "file", "missing", "cut"]),
    garbage=st.one_of(st.none(), st.text(max_size=30)),
    engine=st.one_of(st.none(), ENGINES),
    timeout=st.sampled_from([None, "0", "-1", "30"]),
    out_kind=st.sampled_from(["none", "fresh", "file", "under_file"]),
    plots_kind=st.sampled_from(["none", "none", "under_file"]),
    prefect=st.booleans(),
)
def test_fuzz_replay(
    monkeypatch: pytest.MonkeyPatch,
    mutations: list[str],
    bundle_kind: str,
    garbage: str | None,
    engine: str | None,
    timeout: str | None,
    out_kind: str,
    plots_kind: str,
    prefect: bool,
) -> None:
    with scratch() as tmp:
        home = home_of(tmp, monkeypatch)
        bundle = mooncake_bundle(tmp)
        if bundle_kind == "file":
            (tmp / "flat").write_text("x")
            bundle = tmp / "flat"
        elif bundle_kind == "missing":
            bundle = tmp / "nowhere"
        elif bundle_kind == "cut":
            raw = (bundle / "trace.jsonl").read_bytes()
            (bundle / "trace.jsonl").write_bytes(raw[: len(raw) // 2])
        doc = _scenario_doc(str(bundle))
        for m in mutations:
            doc |= MUTATIONS[m]
        path = tmp / "s.yaml"
        path.write_text(garbage if garbage is not None else yaml.safe_dump(doc))
        args = ["replay", str(path), "--prefect" if prefect else "--no-prefect"]
        args += ["--engine", engine] if engine is not None else []
        args += ["--timeout", timeout] if timeout is not None else []
        out = place(tmp, "fresh" if out_kind == "none" else out_kind, "out")
        args += [] if out_kind == "none" else ["--out", str(out)]
        plots = place(tmp, "fresh" if plots_kind == "none" else plots_kind, "plots")
        args += [] if plots_kind == "none" else ["--plots", str(plots)]
        res = invoke(args, watch=[out, plots, home, bundle])
        assert "SECRET" not in res.output
        if res.exit_code == 0 and out_kind == "fresh":
            assert (out / "summary.json").is_file()


SUITES: dict[str, str] = {
    "garbage": "{[: not yaml",
    "list": "- 1\n- 2\n",
    "unknown_kind": "name: x\nkind: sideways\nscales: {demo: {}}\n",
    "no_scenarios": "name: x\nkind: replay\nscenarios: []\nscales: {demo: {}}\n",
    "missing_scenario": "name: x\nkind: replay\nscenarios: [nowhere.yaml]\nscales: {demo: {}}\n",
    "bad_scale_field": "name: x\nkind: replay\nscenarios: [s.yaml]\nscales: {demo: {users: 0}}\n",
    "valid": "name: x\nkind: replay\nscenarios: [s.yaml]\nscales: {demo: {blocks: 1}}\n",
}


@FUZZ
@given(
    suite=st.sampled_from(sorted(SUITES)),
    scale=st.sampled_from(["nope", "", "-x"]),
    out_kind=st.sampled_from(["none", "file", "under_file"]),
    trace=st.sampled_from([None, "missing"]),
    calibrate=st.booleans(),
    prefect=st.booleans(),
)
def test_fuzz_bench_run(
    monkeypatch: pytest.MonkeyPatch,
    suite: str,
    scale: str,
    out_kind: str,
    trace: str | None,
    calibrate: bool,
    prefect: bool,
) -> None:
    with scratch() as tmp:
        home = home_of(tmp, monkeypatch)
        (tmp / "s.yaml").write_text(yaml.safe_dump(_scenario_doc(str(mooncake_bundle(tmp)))))
        path = tmp / "suite.yaml"
        path.write_text(SUITES[suite])
        args = ["bench", "run", str(path), "--scale", scale]
        args += ["--prefect" if prefect else "--no-prefect"] + ["--calibrate"] * calibrate
        out = place(tmp, "fresh" if out_kind == "none" else out_kind, "out")
        args += [] if out_kind == "none" else ["--out", str(out)]
        args += ["--trace", str(tmp / "none.jsonl")] if trace else []
        res = invoke(args, watch=[out, home])
        assert res.exit_code != 0  # never a valid scale: nothing runs


@FUZZ
@given(
    folder=st.sampled_from(["missing", "file", "empty", "garbage", "unscheduled", "scheduled"]),
    scale=st.sampled_from(["demo", "nope"]),
    limit=st.sampled_from([None, "0", "-1", "2"]),
    every=st.sampled_from([None, "0", "0.1", "5"]),
)
def test_fuzz_bench_serve(
    monkeypatch: pytest.MonkeyPatch, folder: str, scale: str, limit: str | None, every: str | None
) -> None:
    with scratch() as tmp:
        home = home_of(tmp, monkeypatch)
        suites = place(tmp, {"missing": "fresh", "file": "file"}.get(folder, "dir"), "suites")
        body = SUITES["valid"].replace("s.yaml", "../s.yaml")
        text = {"garbage": SUITES["garbage"], "unscheduled": body,
                "scheduled": body + "schedule: {interval_s: 60}\n"}  # fmt: skip
        if folder in text:
            (suites / "a.yaml").write_text(text[folder])
        args = ["bench", "serve", "--suites", str(suites), "--scale", scale]
        args += ["--limit", limit] if limit is not None else []
        args += ["--schedule-every-s", every] if every is not None else []
        res = invoke(args, watch=[suites, home])
        assert res.exit_code != 0  # no Prefect API answers: it never serves


# -- server, version ----------------------------------------------------------------------------


@FUZZ
@given(
    command=st.sampled_from(["start", "stop", "status"]),
    home_kind=st.sampled_from(["default", "fresh", "file", "under_file"]),
    port=st.sampled_from([None, "-1", "0", "65536", "10000000", "http"]),
    timeout=st.sampled_from([None, "-1", "nan"]),
    as_json=st.booleans(),
)
def test_fuzz_server(
    monkeypatch: pytest.MonkeyPatch,
    command: str,
    home_kind: str,
    port: str | None,
    timeout: str | None,
    as_json: bool,
) -> None:
    with scratch() as tmp:
        home = home_of(tmp, monkeypatch)
        args = ["server", command]
        server_home = None if home_kind == "default" else place(tmp, home_kind, "prefect")
        args += ["--home", str(server_home)] if server_home is not None else []
        if command == "start":
            # never a usable port: a start that got one would launch a real server
            args += ["--port", port or "0"]
            args += ["--timeout", timeout] if timeout is not None else []
        elif command == "stop" and timeout is not None:
            args += ["--timeout", timeout]
        elif command == "status" and as_json:
            args.append("--json")
        watch = [home] if server_home is None else [home, server_home]
        res = invoke(args, watch=watch if command == "start" else [])
        if command == "start":
            assert res.exit_code != 0


def test_version_and_a_bare_group() -> None:
    assert invoke(["version"], watch=[]).exit_code == 0
    assert invoke(["no-such-command"], watch=[]).exit_code == 2
