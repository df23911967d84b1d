"""Registered Python tools for `tool_call` ops: a registry, a sandbox, frozen retrieval.

Importing this package registers the built-in tools (`run_tests`, `doc_search`, `web_search`,
`calculator`; see `builtin`). `call_tool(name, **kwargs)` runs one and returns a `ToolResult`
with its output, ok flag, error and measured duration.

Examples:
    >>> from maserve_prefect.tools import call_tool, list_tools
    >>> "run_tests" in list_tools()
    True
"""

from maserve_prefect.tools import builtin as builtin
from maserve_prefect.tools.registry import (
    ToolFailure,
    ToolResult,
    call_tool,
    get_tool,
    list_tools,
    register_tool,
    unregister_tool,
)
from maserve_prefect.tools.retrieval import CORPUS_MODULES, DocIndex, Document, Hit, retrieve
from maserve_prefect.tools.sandbox import (
    SandboxPolicy,
    SandboxRun,
    SandboxUnavailableError,
    jail_available,
    network_namespace_available,
    run_python_tests,
)

__all__ = [
    "CORPUS_MODULES",
    "DocIndex",
    "Document",
    "Hit",
    "SandboxPolicy",
    "SandboxRun",
    "SandboxUnavailableError",
    "ToolFailure",
    "ToolResult",
    "call_tool",
    "get_tool",
    "jail_available",
    "list_tools",
    "network_namespace_available",
    "register_tool",
    "retrieve",
    "run_python_tests",
    "unregister_tool",
]
