"""VLLMServer and VLLMProcessPool without vLLM: pure argv checks and a stand-in HTTP server.

The stand-in plays the vLLM api_server (it reads `--host` / `--port` from the same argv and
answers /health, /v1/models and, with VLLM_SERVER_DEV_MODE=1, the sleep endpoints). It forks a
child into its process group so the tests can check that stopping kills the whole group.
"""

from __future__ import annotations

import json
import stat
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from maserve_prefect.engines.vllm.pool import VLLMProcessPool
from maserve_prefect.engines.vllm.process_group import group_rss_bytes, process_group_members
from maserve_prefect.engines.vllm.server import VLLMServer
from maserve_prefect.engines.vllm.server_config import VLLMServerConfig
from maserve_prefect.errors import ConfigError, EngineError
from maserve_prefect.protocol.engine import LifecycleAction, LifecycleTicket
from maserve_prefect.protocol.outcomes import Acceptance
from maserve_prefect.protocol.state import Lifecycle

STANDIN = r"""
import http.server, json, os, signal, subprocess, sys, time
args = sys.argv[1:]
def opt(name, default=None):
    return args[args.index(name) + 1] if name in args else default
if "--exit-early" in args:
    print("boom: the stand-in cannot load its model", flush=True)
    sys.exit(3)
ignore = "--ignore-term" in args
if ignore:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
child_code = ("import signal, time\n"
              + ("signal.signal(signal.SIGTERM, signal.SIG_IGN)\n" if ignore else "")
              + "time.sleep(600)\n")
child = subprocess.Popen([sys.executable, "-c", child_code])
if opt("--pid-file"):
    with open(opt("--pid-file"), "w") as fh:
        fh.write(str(child.pid))
delay = float(opt("--health-delay", "0"))
served = opt("--served-model-name", "tiny")
dev = os.environ.get("VLLM_SERVER_DEV_MODE") == "1"
started = time.monotonic()
state = {"sleeping": False}

class H(http.server.BaseHTTPRequestHandler):
    def log_message(self, *a):
        pass
    def _send(self, code, obj):
        body = json.dumps(obj).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
    def do_GET(self):
        if self.path == "/health":
            ok = time.monotonic() - started >= delay
            return self._send(200 if ok else 503, {})
        if self.path == "/v1/models":
            return self._send(200, {"object": "list", "data": [{"id": served, "object": "model"}]})
        if self.path == "/is_sleeping" and dev:
            return self._send(200, {"is_sleeping": state["sleeping"]})
        self._send(404, {"detail": "Not Found"})
    def do_POST(self):
        if dev and self.path.startswith("/sleep"):
            state["sleeping"] = True
            return self._send(200, {"status": "sleeping"})
        if dev and self.path.startswith("/wake_up"):
            state["sleeping"] = False
            return self._send(200, {"status": "awake"})
        self._send(404, {"detail": "Not Found"})

print("stand-in serving", flush=True)
http.server.ThreadingHTTPServer((opt("--host"), int(opt("--port"))), H).serve_forever()
"""


@pytest.fixture(scope="module")
def standin(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The stand-in, executable, so it can also play the vLLM venv's `python`."""
    path = tmp_path_factory.mktemp("standin") / "python"
    path.write_text(f"#!{sys.executable}\n{STANDIN}")
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return path


def make_server(
    standin: Path, tmp_path: Path, *flags: str, config: VLLMServerConfig | None = None
) -> VLLMServer:
    cmd = [str(standin), "--host", "{host}", "--port", "{port}", *flags]
    return VLLMServer(
        config or VLLMServerConfig(tmp_path / "model"),
        "unused",
        tmp_path / "logs" / "server.log",
        command=cmd,
        health_timeout_s=30.0,
    )


@pytest.fixture()
def servers() -> Iterator[list[VLLMServer]]:
    """Servers a test started; whatever is left is killed by process group afterwards."""
    made: list[VLLMServer] = []
    yield made
    for s in made:
        s.kill()


def _flag(argv: list[str], name: str) -> str:
    return argv[argv.index(name) + 1]


# -- argv (pure) ---------------------------------------------------------------------------------


def test_argv_default_is_priority_cpu_serving() -> None:
    argv = VLLMServerConfig("/m/tiny", port=8000).argv("/venv/bin/python")
    assert argv[:3] == ["/venv/bin/python", "-m", "vllm.entrypoints.openai.api_server"]
    assert _flag(argv, "--model") == "/m/tiny"
    assert _flag(argv, "--served-model-name") == "tiny"
    assert (_flag(argv, "--host"), _flag(argv, "--port")) == ("127.0.0.1", "8000")
    assert _flag(argv, "--scheduling-policy") == "priority"
    assert _flag(argv, "--dtype") == "float32"
    assert _flag(argv, "--kv-cache-memory-bytes") == "64M"
    assert _flag(argv, "--distributed-executor-backend") == "uni"
    assert _flag(argv, "--max-model-len") == "2048"
    for flag in ("--enforce-eager", "--enable-prompt-tokens-details", "--enable-prefix-caching"):
        assert flag in argv
    for absent in ("--kv-events-config", "--enable-sleep-mode", "--max-num-seqs", "taskset"):
        assert absent not in argv


def test_argv_fcfs_without_prefix_caching_and_limits() -> None:
    cfg = VLLMServerConfig(
        "/m",
        served_model_name="m1",
        scheduling_policy="fcfs",
        enable_prefix_caching=False,
        max_num_seqs=4,
        max_num_batched_tokens=512,
        extra_args=("--foo", "bar"),
    )
    argv = cfg.argv("py", port=9)
    assert _flag(argv, "--scheduling-policy") == "fcfs"
    assert "--no-enable-prefix-caching" in argv and "--enable-prefix-caching" not in argv
    assert (_flag(argv, "--max-num-seqs"), _flag(argv, "--max-num-batched-tokens")) == ("4", "512")
    assert argv[-2:] == ["--foo", "bar"]


def test_argv_kv_events_config_is_json() -> None:
    cfg = VLLMServerConfig("/m", port=1, kv_events_endpoint="tcp://127.0.0.1:5557")
    events = json.loads(_flag(cfg.argv(), "--kv-events-config"))
    assert events == {
        "enable_kv_cache_events": True,
        "publisher": "zmq",
        "endpoint": "tcp://127.0.0.1:5557",
        "topic": "kv",
    }


def test_argv_pinned_cpus_start_with_taskset() -> None:
    argv = VLLMServerConfig("/m", port=1, cpus="2-3").argv("py")
    assert argv[:5] == ["taskset", "-c", "2-3", "py", "-m"]


def test_sleep_mode_adds_flag_and_dev_mode_env() -> None:
    cfg = VLLMServerConfig("/m", port=1, enable_sleep_mode=True, env={"X": "1"})
    assert "--enable-sleep-mode" in cfg.argv()
    env = cfg.server_env({"VLLM_CPU_KVCACHE_SPACE": "4", "PATH": "/bin"})
    assert env["VLLM_SERVER_DEV_MODE"] == "1"
    assert env["HF_HUB_OFFLINE"] == env["TRANSFORMERS_OFFLINE"] == "1"
    assert "VLLM_CPU_KVCACHE_SPACE" not in env  # would override --kv-cache-memory-bytes
    assert env["X"] == "1" and env["PATH"] == "/bin"
    assert "VLLM_SERVER_DEV_MODE" not in VLLMServerConfig("/m").server_env({})
    assert VLLMServerConfig("/m", dev_endpoints=True).server_env({})["VLLM_SERVER_DEV_MODE"] == "1"


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"scheduling_policy": "lifo"}, "unknown scheduling_policy"),
        ({"cpus": "0;1"}, "taskset list"),
        ({"port": 70000}, "outside"),
        ({"max_num_seqs": 0}, "max_num_seqs"),
    ],
)
def test_bad_config_is_a_config_error(kwargs: dict[str, object], match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        VLLMServerConfig("/m", **kwargs)  # type: ignore[arg-type]


def test_argv_needs_a_port() -> None:
    with pytest.raises(ConfigError, match="needs a port"):
        VLLMServerConfig("/m").argv()


# -- the process group ---------------------------------------------------------------------------


def test_start_healthy_stop_kills_the_whole_group(
    standin: Path, tmp_path: Path, servers: list[VLLMServer]
) -> None:
    pid_file = tmp_path / "child.pid"
    srv = make_server(standin, tmp_path, "--pid-file", str(pid_file))
    servers.append(srv)
    srv.start()
    load_s = srv.wait_healthy()
    assert load_s >= 0 and srv.healthy and srv.alive()
    child = int(pid_file.read_text())
    group = process_group_members(srv.pid or -1)
    assert srv.pid in group and child in group
    assert group_rss_bytes(srv.pid or -1) > 0
    assert srv.url == f"http://127.0.0.1:{srv.port}"
    srv.stop()
    assert process_group_members(child) == [] and process_group_members(srv.pid or -1) == []
    assert not srv.alive() and not srv.healthy
    assert [(r.action, r.ok) for r in srv.records] == [
        ("spawn", True),
        ("load", True),
        ("stop", True),
    ]
    assert all(r.end_s >= r.start_s for r in srv.records)
    srv.stop()  # idempotent: no second record
    assert len(srv.records) == 3


def test_stop_escalates_to_sigkill_when_term_is_ignored(
    standin: Path, tmp_path: Path, servers: list[VLLMServer]
) -> None:
    srv = make_server(standin, tmp_path, "--ignore-term")
    servers.append(srv)
    srv.start()
    srv.wait_healthy()
    pgid = srv.pid or -1
    srv.stop(timeout_s=0.5)
    assert process_group_members(pgid) == []
    assert srv.returncode() == -9
    assert srv.records[-1].action == "stop" and srv.records[-1].ok


def test_kill_takes_the_group_down_at_once(
    standin: Path, tmp_path: Path, servers: list[VLLMServer]
) -> None:
    srv = make_server(standin, tmp_path, "--ignore-term")
    servers.append(srv)
    srv.start()
    srv.wait_healthy()
    pgid = srv.pid or -1
    srv.kill()
    assert process_group_members(pgid) == [] and not srv.alive()
    assert srv.records[-1].action == "kill"


def test_exit_before_health_reports_the_log_tail(
    standin: Path, tmp_path: Path, servers: list[VLLMServer]
) -> None:
    srv = make_server(standin, tmp_path, "--exit-early")
    servers.append(srv)
    srv.start()
    with pytest.raises(EngineError, match=r"(?s)exited with code 3.*boom: the stand-in cannot"):
        srv.wait_healthy()
    assert srv.records[-1].action == "load" and not srv.records[-1].ok
    assert "maserve: starting" in srv.log_tail()


def test_health_timeout_names_the_url(
    standin: Path, tmp_path: Path, servers: list[VLLMServer]
) -> None:
    srv = make_server(standin, tmp_path, "--health-delay", "600")
    servers.append(srv)
    srv.start()
    with pytest.raises(EngineError, match="not healthy within 1 s"):
        srv.wait_healthy(timeout_s=1.0, poll_s=0.1)
    assert srv.alive()
    srv.stop()
    assert not srv.alive()


def test_start_twice_is_an_error(standin: Path, tmp_path: Path, servers: list[VLLMServer]) -> None:
    srv = make_server(standin, tmp_path)
    servers.append(srv)
    srv.start()
    with pytest.raises(EngineError, match="already started"):
        srv.start()


def test_context_manager_stops_on_exit(standin: Path, tmp_path: Path) -> None:
    with make_server(standin, tmp_path) as srv:
        pgid = srv.pid or -1
        assert srv.healthy
    assert process_group_members(pgid) == []


# -- sleep mode ----------------------------------------------------------------------------------


def test_sleep_without_sleep_mode_is_unsupported(
    standin: Path, tmp_path: Path, servers: list[VLLMServer]
) -> None:
    srv = make_server(standin, tmp_path)
    servers.append(srv)
    srv.start()
    srv.wait_healthy()
    for ticket in (srv.sleep(1), srv.wake()):
        assert ticket.acceptance is Acceptance.UNSUPPORTED
        assert "enable_sleep_mode" in ticket.reason
    assert srv.is_sleeping() is False
    assert srv.sleep(3).acceptance is Acceptance.REJECTED


def test_sleep_mode_missing_endpoint_is_unsupported(
    standin: Path, tmp_path: Path, servers: list[VLLMServer]
) -> None:
    cfg = VLLMServerConfig(
        tmp_path / "m", enable_sleep_mode=True, env={"VLLM_SERVER_DEV_MODE": "0"}
    )
    srv = make_server(standin, tmp_path, config=cfg)
    servers.append(srv)
    srv.start()
    srv.wait_healthy()
    ticket = srv.sleep(1)
    assert ticket.acceptance is Acceptance.UNSUPPORTED and "HTTP 404" in ticket.reason


def test_sleep_and_wake_through_dev_endpoints(
    standin: Path, tmp_path: Path, servers: list[VLLMServer]
) -> None:
    cfg = VLLMServerConfig(tmp_path / "m", enable_sleep_mode=True)
    srv = make_server(standin, tmp_path, config=cfg)
    servers.append(srv)
    srv.start()
    srv.wait_healthy()
    slept = srv.sleep(2)
    assert slept.acceptance is Acceptance.ACCEPTED and slept.done_s is not None
    assert slept.action is LifecycleAction.SLEEP and srv.is_sleeping()
    woke = srv.wake()
    assert woke.acceptance is Acceptance.ACCEPTED and not srv.is_sleeping()
    assert [r.action for r in srv.records][-2:] == ["sleep", "wake"]


# -- the pool ------------------------------------------------------------------------------------


def make_pool(standin: Path, tmp_path: Path, **kwargs: object) -> VLLMProcessPool:
    deployments = kwargs.pop("deployments", {"tiny": tmp_path / "model"})
    return VLLMProcessPool(
        standin,
        deployments=deployments,  # type: ignore[arg-type]
        log_dir=tmp_path / "logs",
        health_timeout_s=30.0,
        **kwargs,  # type: ignore[arg-type]
    )


def _wait(pool_ticket: LifecycleTicket, done: list[LifecycleTicket], pool: VLLMProcessPool) -> None:
    entry = pool._entries[pool_ticket.replica]
    assert entry.waiter is not None
    entry.waiter.join(30)
    assert done == [pool_ticket]


def test_pool_load_answers_at_once_then_reports_done(standin: Path, tmp_path: Path) -> None:
    done: list[LifecycleTicket] = []
    with make_pool(standin, tmp_path, devices=("cpu0", "cpu1"), device_cpus={"cpu1": "0"}) as pool:
        ticket = pool.load("tiny", "cpu1", on_done=done.append)
        assert ticket.acceptance is Acceptance.ACCEPTED and ticket.replica == "tiny@cpu1"
        _wait(ticket, done, pool)
        assert ticket.done_s is not None and ticket.error is None
        assert pool.status("tiny@cpu1") is Lifecycle.READY
        assert pool.server("tiny@cpu1").argv()[:3] == ["taskset", "-c", "0"]
        mem = pool.memory("cpu1")
        assert mem.residents == ("tiny@cpu1",) and 0 < mem.used_bytes < mem.total_bytes
        assert pool.memory("cpu0").used_bytes == 0
        (engine,) = pool.replicas()
        assert (engine.name, engine.deployment) == ("tiny@cpu1", "tiny")
        assert pool.replicas()[0] is engine  # cached
        assert pool.sleep("tiny@cpu1").acceptance is Acceptance.UNSUPPORTED
        pgid = pool.server("tiny@cpu1").pid or -1
        unloaded = pool.unload("tiny@cpu1")
        assert unloaded.acceptance is Acceptance.ACCEPTED and unloaded.done_s is not None
        assert process_group_members(pgid) == [] and pool.replicas() == []
        assert pool.unload("tiny@cpu1").acceptance is Acceptance.REJECTED
        actions = [(r.replica, r.action) for r in pool.lifecycle_log()]
        assert actions == [("tiny@cpu1", "spawn"), ("tiny@cpu1", "load"), ("tiny@cpu1", "stop")]


def test_pool_failed_load_sets_error_and_cleans_up(standin: Path, tmp_path: Path) -> None:
    cfg = VLLMServerConfig(tmp_path / "m", served_model_name="bad", extra_args=("--exit-early",))
    done: list[LifecycleTicket] = []
    with make_pool(standin, tmp_path, deployments={"bad": cfg}) as pool:
        ticket = pool.load("bad", "cpu0", on_done=done.append)
        assert ticket.acceptance is Acceptance.ACCEPTED
        _wait(ticket, done, pool)
        assert ticket.done_s is None and ticket.error is not None
        assert "boom" in ticket.error
        assert pool.status(ticket.replica) is Lifecycle.FAILED
        assert pool.replicas() == []


def test_pool_crash_leaves_the_routing_set(standin: Path, tmp_path: Path) -> None:
    done: list[LifecycleTicket] = []
    with make_pool(standin, tmp_path) as pool:
        t1 = pool.load("tiny", "cpu0", on_done=done.append)
        _wait(t1, done, pool)
        done.clear()
        t2 = pool.load("tiny", "cpu0", on_done=done.append)
        _wait(t2, done, pool)
        assert t2.replica == "tiny@cpu0#2" and len(pool.replicas()) == 2
        pool.server(t1.replica).kill()
        assert [e.name for e in pool.replicas()] == [t2.replica]
        assert pool.status(t1.replica) is Lifecycle.FAILED
        pgid = pool.server(t2.replica).pid or -1
    assert process_group_members(pgid) == []  # close() stopped the survivor


def test_pool_rejects_unknowns(standin: Path, tmp_path: Path) -> None:
    seen: list[LifecycleTicket] = []
    with make_pool(standin, tmp_path) as pool:
        ticket = pool.load("other", "cpu0", on_done=seen.append)
        assert ticket.acceptance is Acceptance.REJECTED and "unknown deployment" in ticket.reason
        assert seen == [ticket]
        with pytest.raises(ConfigError, match="no device"):
            pool.load("tiny", "gpu9")
        with pytest.raises(ConfigError, match="no replica"):
            pool.unload("nope")
    with pytest.raises(ConfigError, match="not in"):
        make_pool(standin, tmp_path, device_cpus={"cpu7": "0"})


def test_worker_runs_in_the_engine_process_unless_asked_otherwise() -> None:
    assert VLLMServerConfig("/m").server_env({})["VLLM_ENABLE_V1_MULTIPROCESSING"] == "0"
    env = VLLMServerConfig("/m", worker_in_process=False).server_env({})
    assert "VLLM_ENABLE_V1_MULTIPROCESSING" not in env
