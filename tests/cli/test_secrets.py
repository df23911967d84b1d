"""No secret kept: engine URL user info and API keys never reach a file, a message or Prefect.

Every test runs a command against the stub OpenAI-compatible server (`openai_stub`), with the
credentials in the engine URL or in an environment variable, checks the server received them,
then reads every byte under the command's output folder and `MASERVE_HOME` (ledger databases,
their WAL files, the CAS, bundles, summaries) and the command's output for the secret.
"""

from __future__ import annotations

import base64
import json
import stat
from pathlib import Path

import pytest
import yaml
from openai_stub import serve
from typer.testing import CliRunner

from maserve_prefect.cli import _mount, app

runner = CliRunner()
_mount()

PASSWORD = "pw-Secret-31337"
API_KEY = "sk-test-SECRET-KEY-4242"
KEY_VAR = "MASERVE_TEST_API_KEY"


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    path = tmp_path / "home"
    monkeypatch.setenv("MASERVE_HOME", str(path))
    monkeypatch.delenv("MASERVE_LEDGER_URL", raising=False)
    monkeypatch.delenv("MASERVE_CAS_DIR", raising=False)
    return path


def _bundle_and_scenario(tmp_path: Path, engine: str = "sim") -> Path:
    """A three-request Mooncake bundle and a one-arm scenario replaying it."""
    rows = [
        {"timestamp": 100 * i, "input_length": 600, "output_length": 4, "hash_ids": [i, i + 1]}
        for i in range(3)
    ]
    src = tmp_path / "mc.jsonl"
    src.write_text("".join(json.dumps(r) + "\n" for r in rows))
    res = runner.invoke(app, ["trace", "import-mooncake", str(src), "--out", str(tmp_path / "b")])
    assert res.exit_code == 0, res.output
    scenario = {
        "name": "sec",
        "cohorts": [{"name": "t", "bundle": "b"}],
        "lock": "length",
        "engine": engine,
        "timeout_s": 60,
        "arms": [{"name": "dag"}],
    }
    path = tmp_path / "scenario.yaml"
    path.write_text(yaml.safe_dump(scenario))
    return path


def _files_holding(secret: str, *roots: Path) -> list[Path]:
    needle = secret.encode()
    found = []
    for root in roots:
        for f in sorted(root.rglob("*")) if root.exists() else []:
            if f.is_file() and needle in f.read_bytes():
                found.append(f)
    return found


def _secrets(stub_url: str) -> tuple[str, str]:
    """(engine with user info, the basic-auth token the server must receive)."""
    engine = "openai:" + stub_url.replace("http://", f"http://alice:{PASSWORD}@")
    token = base64.b64encode(f"alice:{PASSWORD}".encode()).decode()
    return engine, token


def test_replay_sends_user_info_as_basic_auth_and_keeps_it_out_of_every_file(
    tmp_path: Path, home: Path
) -> None:
    scenario = _bundle_and_scenario(tmp_path)
    out = tmp_path / "out"
    with serve() as stub:
        engine, token = _secrets(stub.url)
        res = runner.invoke(
            app, ["replay", str(scenario), "--no-prefect", "--engine", engine, "--out", str(out)]
        )
        sent = set(stub.authorizations)
    assert res.exit_code == 0, res.output
    assert sent == {f"Basic {token}"}
    assert PASSWORD not in res.output and token not in res.output
    for secret in (PASSWORD, token):
        assert _files_holding(secret, out, home, tmp_path / "b") == []
    summary = json.loads((out / "summary.json").read_text())
    assert summary["engine"] == f"openai:{stub.url.replace('http://', 'http://***@')}"
    manifest = (out / "dag-b0" / "trace.jsonl").read_text().splitlines()[0]
    assert "***@127.0.0.1" in manifest


@pytest.mark.parametrize("how", ["option", "target"])
def test_replay_sends_the_api_key_from_the_named_variable_and_never_stores_it(
    tmp_path: Path, home: Path, monkeypatch: pytest.MonkeyPatch, how: str
) -> None:
    monkeypatch.setenv(KEY_VAR, API_KEY)
    out = tmp_path / "out"
    with serve() as stub:
        if how == "option":
            scenario = _bundle_and_scenario(tmp_path, engine=f"openai:{stub.url}")
            extra = ["--api-key-env", KEY_VAR]
        else:
            scenario = _bundle_and_scenario(tmp_path, f"openai:{stub.url}?api_key_env={KEY_VAR}")
            extra = []
        res = runner.invoke(
            app, ["replay", str(scenario), "--no-prefect", "--out", str(out), *extra]
        )
        sent = set(stub.authorizations)
    assert res.exit_code == 0, res.output
    assert sent == {f"Bearer {API_KEY}"}
    assert API_KEY not in res.output
    assert _files_holding(API_KEY, out, home, tmp_path) == []
    # the variable's name is kept, so the summary says where the key came from
    assert json.loads((out / "summary.json").read_text())["engine"].endswith(
        f"?api_key_env={KEY_VAR}"
    )


def test_an_unset_key_variable_is_one_line_naming_it(tmp_path: Path, home: Path) -> None:
    scenario = _bundle_and_scenario(tmp_path, engine="openai:http://127.0.0.1:9")
    res = runner.invoke(
        app, ["replay", str(scenario), "--no-prefect", "--api-key-env", "MASERVE_TEST_UNSET_VAR"]
    )
    assert res.exit_code == 1
    assert "MASERVE_TEST_UNSET_VAR is not set" in res.output
    assert "Traceback" not in res.output and res.output.count("\n") == 1


@pytest.mark.parametrize(
    "bad",
    [
        ["--engine", f"openai:http://u:{PASSWORD}@127.0.0.1:9?api_key_env={KEY_VAR}"],
        ["--engine", f"openai:ftp://u:{PASSWORD}@127.0.0.1:9"],
        ["--engine", f"tgi:http://u:{PASSWORD}@127.0.0.1:9"],
        ["--engine", f"openai:http://u:{PASSWORD}@127.0.0.1:notaport"],
        ["--engine", "openai:http://127.0.0.1:9", "--api-key-env", API_KEY + "!"],
    ],
)
def test_refused_engines_never_echo_the_secret(bad: list[str], tmp_path: Path, home: Path) -> None:
    res = runner.invoke(app, ["run", "fork_join", "--out", str(tmp_path / "o"), *bad])
    assert res.exit_code == 1
    assert PASSWORD not in res.output and API_KEY not in res.output
    assert "Traceback" not in res.output and "error:" in res.output


def test_cannot_reach_names_the_server_without_its_password(tmp_path: Path, home: Path) -> None:
    engine = f"openai:http://alice:{PASSWORD}@127.0.0.1:9/v1"
    res = runner.invoke(app, ["run", "fork_join", "--engine", engine])
    assert res.exit_code == 1
    assert "cannot reach" in res.output and "127.0.0.1:9" in res.output
    assert PASSWORD not in res.output
    scenario = _bundle_and_scenario(tmp_path, engine=engine)
    res = runner.invoke(app, ["replay", str(scenario), "--no-prefect"])
    assert res.exit_code == 1 and "127.0.0.1:9" in res.output
    assert PASSWORD not in res.output
    assert _files_holding(PASSWORD, home) == []


def test_maserve_home_and_its_databases_are_owner_only(tmp_path: Path, home: Path) -> None:
    from maserve_prefect.trace.ledger import Ledger
    from maserve_prefect.trace.model import Manifest

    with Ledger.from_settings() as ledger:
        ledger.begin_run(Manifest(trace_id="t"))
        ledger.cas.put(b"a prompt")
    mode = {p: stat.S_IMODE(p.stat().st_mode) for p in (home, *home.rglob("*"))}
    assert mode[home] == 0o700
    assert mode[home / "ledger.db"] == 0o600
    assert {m for p, m in mode.items() if p.is_dir()} == {0o700}
    # SQLite gives its WAL and shared-memory files the database file's mode
    assert {m for p, m in mode.items() if p.is_file()} == {0o600}


def test_run_on_a_server_keeps_the_key_out_of_ledger_bundle_and_prefect(
    prefect_api: None, tmp_path: Path, home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from prefect.client.orchestration import get_client

    monkeypatch.setenv(KEY_VAR, API_KEY)
    out = tmp_path / "bundle"
    with serve() as stub:
        engine = f"openai:{stub.url}"
        args = ["run", "fork_join", "--users", "1", "--engine", engine, "--api-key-env", KEY_VAR]
        res = runner.invoke(app, [*args, "--out", str(out), "--wait", "90"])
        sent = set(stub.authorizations)
    assert res.exit_code == 0, res.output
    assert sent == {f"Bearer {API_KEY}"}
    assert API_KEY not in res.output
    assert _files_holding(API_KEY, out, home) == []
    with get_client(sync_client=True) as client:
        flows = client.read_flow_runs()
        logs = client.read_logs()
    assert flows
    recorded = json.dumps([f.model_dump(mode="json") for f in flows])
    recorded += json.dumps([log.model_dump(mode="json") for log in logs])
    assert API_KEY not in recorded


@pytest.mark.parametrize(
    "engine",
    [
        f"openai:http://127.0.0.1:9?api_key={API_KEY}",
        f"openai:http://127.0.0.1:9?api_key_env={API_KEY}-not-a-name",
    ],
)
def test_a_key_where_a_variable_name_belongs_is_not_echoed(engine: str, home: Path) -> None:
    res = runner.invoke(app, ["run", "fork_join", "--engine", engine])
    assert res.exit_code == 1 and "api_key_env" in res.output
    assert API_KEY not in res.output
