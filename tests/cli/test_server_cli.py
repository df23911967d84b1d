"""`maserve server start|status|stop` on a real server in a temporary home (always stopped)."""

from __future__ import annotations

import json
import os
import socket
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from typer.testing import CliRunner

from maserve_prefect import prefect_server
from maserve_prefect.cli.server_cmd import app
from maserve_prefect.errors import PrefectServerError

runner = CliRunner()


@pytest.fixture
def home(tmp_path: Path) -> Iterator[Path]:
    path = tmp_path / "prefect"
    try:
        yield path
    finally:
        prefect_server.stop(path, timeout_s=10)


def status_json(home: Path) -> dict[str, object]:
    result = runner.invoke(app, ["status", "--home", str(home), "--json"])
    assert result.exit_code == 0, result.output
    data: dict[str, object] = json.loads(result.output)
    return data


def test_status_without_a_server_says_not_running(home: Path) -> None:
    assert status_json(home)["running"] is False
    result = runner.invoke(app, ["stop", "--home", str(home)])
    assert result.exit_code == 0
    assert "no Prefect server was running" in result.output


def test_stale_state_file_is_not_running_and_corrupt_one_is_an_error(home: Path) -> None:
    home.mkdir(parents=True)
    state = home / prefect_server.STATE_FILE
    # a pid that cannot be alive (beyond pid_max) and a port nothing listens on
    state.write_text(
        json.dumps(
            {"pid": 2**22 + 1, "port": 9, "url": "http://127.0.0.1:9/api", "started_at": "x"}
        )
    )
    assert prefect_server.status(home).running is False
    state.write_text("{not json")
    with pytest.raises(PrefectServerError, match=r"server\.json is unreadable"):
        prefect_server.status(home)
    result = runner.invoke(app, ["status", "--home", str(home)])
    assert result.exit_code == 1
    assert "delete it" in result.output
    state.unlink()


def test_busy_port_is_refused(home: Path) -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        result = runner.invoke(app, ["start", "--home", str(home), "--port", str(port)])
    assert result.exit_code == 1
    assert f"port {port}" in result.output and "in use" in result.output


@pytest.mark.slow
def test_start_reuse_status_stop(home: Path) -> None:
    result = runner.invoke(app, ["start", "--home", str(home), "--timeout", "60"])
    assert result.exit_code == 0, result.output
    assert "started at http://127.0.0.1:" in result.output
    info = status_json(home)
    assert info["running"] is True
    assert prefect_server.api_healthy(str(info["url"]))
    assert (home / "server.log").exists()
    # The UI is on by default, at the server's root, and told the server's own API URL (the
    # "View at …" links Prefect prints open there).
    assert info["ui"] is True
    ui_url = str(info["url"]).removesuffix("/api")
    assert f"UI {ui_url}" in result.output
    page = httpx.get(f"{ui_url}/", timeout=10)
    assert page.status_code == 200 and "<html" in page.text.lower()
    settings = httpx.get(f"{ui_url}/ui-settings", timeout=10).json()
    assert settings["api_url"] == info["url"]

    again = runner.invoke(app, ["start", "--home", str(home)])
    assert again.exit_code == 0, again.output
    assert "already running" in again.output
    assert status_json(home)["pid"] == info["pid"]

    result = runner.invoke(app, ["stop", "--home", str(home)])
    assert result.exit_code == 0, result.output
    assert "stopped" in result.output
    assert status_json(home)["running"] is False
    with pytest.raises(ProcessLookupError):
        os.killpg(int(str(info["pid"])), 0)  # the whole process group is gone


@pytest.mark.slow
def test_two_commands_starting_at_once_share_one_server_and_stop_ends_it(home: Path) -> None:
    """Two processes that start the server of one fresh home together: the home's lock lets one
    start it, the other waits and finds it running; `stop` then leaves no server behind."""
    import subprocess
    import sys

    env = {**os.environ, prefect_server.ENV_PREFECT_UI: "0"}  # the API alone: no UI
    code = (
        "import sys; from pathlib import Path; from maserve_prefect import prefect_server; "
        "print(prefect_server.start(Path(sys.argv[1]), timeout_s=120).pid)"
    )
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", code, str(home)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )
        for _ in range(2)
    ]
    outputs = [p.communicate(timeout=300) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outputs
    pids = {int(out.strip()) for out, _ in outputs}
    assert len(pids) == 1, f"two servers started: {pids}"
    (pid,) = pids
    status = status_json(home)
    assert status["pid"] == pid and status["ui"] is False
    root = httpx.get(str(status["url"]).removesuffix("/api") + "/", timeout=10)
    assert root.status_code == 404

    result = runner.invoke(app, ["stop", "--home", str(home)])
    assert result.exit_code == 0, result.output
    assert status_json(home)["running"] is False
    with pytest.raises(ProcessLookupError):
        os.killpg(pid, 0)


def test_recording_api_keeps_a_configured_api_else_connects_the_managed_server(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Native recording without an API connects the one managed server (never Prefect's
    per-thread ephemeral servers); with an API configured it changes nothing."""
    started: list[str] = []

    def fake_ensure(**_: object) -> prefect_server.ServerInfo:
        started.append("managed")
        return prefect_server.ServerInfo(home=tmp_path, running=True, url="http://127.0.0.1:9/api")

    monkeypatch.setattr(prefect_server, "ensure_server", fake_ensure)
    monkeypatch.setattr(prefect_server, "configured_api_url", lambda: "http://configured/api")
    with prefect_server.recording_api():
        assert started == []
    monkeypatch.setattr(prefect_server, "configured_api_url", lambda: None)
    before = os.environ.get("PREFECT_CLIENT_MAX_RETRIES")
    before_timeout = os.environ.get("PREFECT_API_REQUEST_TIMEOUT")
    with prefect_server.recording_api():
        assert started == ["managed"]
        assert os.environ["PREFECT_API_URL"] == "http://127.0.0.1:9/api"
        # Bursts of root flow-run creations get more client retries than Prefect's default 5.
        from prefect.settings import PREFECT_CLIENT_MAX_RETRIES

        assert PREFECT_CLIENT_MAX_RETRIES.value() == prefect_server.RECORDING_MAX_RETRIES
        assert os.environ["PREFECT_CLIENT_MAX_RETRIES"] == str(prefect_server.RECORDING_MAX_RETRIES)
        # ... and a longer request timeout than Prefect's 60 s (a queued request is not resent).
        from prefect.settings import PREFECT_API_REQUEST_TIMEOUT

        assert PREFECT_API_REQUEST_TIMEOUT.value() == prefect_server.RECORDING_REQUEST_TIMEOUT_S
        assert float(os.environ["PREFECT_API_REQUEST_TIMEOUT"]) == 300.0
    assert os.environ.get("PREFECT_CLIENT_MAX_RETRIES") == before
    assert os.environ.get("PREFECT_API_REQUEST_TIMEOUT") == before_timeout
