"""Real vLLM serving on this host: the locked CPU venv, a tiny test model, servers and a pool.

`venv.ensure_vllm_python()` builds (once per lock file) the venv that runs vLLM;
`venv.build_tiny_model()` writes a random-weight Llama it can serve offline; `server.VLLMServer`
owns one server process group; `pool.VLLMProcessPool` implements the engine `Pool` protocol over
such servers. Nothing here imports vLLM itself: vLLM runs only in its own venv's processes.

Exports resolve lazily, so `python -m maserve_prefect.engines.vllm.venv` (the Makefile's call)
runs without importing the server and pool modules first.
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from maserve_prefect.engines.vllm.pool import VLLMProcessPool
    from maserve_prefect.engines.vllm.server import LifecycleRecord, VLLMServer
    from maserve_prefect.engines.vllm.server_config import VLLMServerConfig
    from maserve_prefect.engines.vllm.venv import build_tiny_model, ensure_vllm_python

_EXPORTS = {
    "LifecycleRecord": "server",
    "VLLMProcessPool": "pool",
    "VLLMServer": "server",
    "VLLMServerConfig": "server_config",
    "build_tiny_model": "venv",
    "ensure_vllm_python": "venv",
}

__all__ = [
    "LifecycleRecord",
    "VLLMProcessPool",
    "VLLMServer",
    "VLLMServerConfig",
    "build_tiny_model",
    "ensure_vllm_python",
]


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(import_module(f"{__name__}.{module}"), name)
