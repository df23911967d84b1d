"""Import contract: hear/ modules import only hear.*, the engine seam, errors, stdlib and numpy.

Policies must stay pure functions over HEAR views, so nothing in hear/ may reach into the
dispatcher, the simulator, the trace store or Prefect. `maserve_prefect.errors` is allowed
because every module raises the project's error types (it imports nothing itself).
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

import maserve_prefect.hear

HEAR_DIR = Path(maserve_prefect.hear.__file__).parent
ALLOWED_PROJECT = (
    "maserve_prefect.hear",
    "maserve_prefect.engine.protocol",
    "maserve_prefect.errors",
)
ALLOWED_THIRD_PARTY = {"numpy"}


def _allowed(module: str) -> bool:
    top = module.split(".")[0]
    if top == "maserve_prefect":
        return any(module == a or module.startswith(a + ".") for a in ALLOWED_PROJECT)
    return top in sys.stdlib_module_names or top in ALLOWED_THIRD_PARTY or top == "__future__"


def violations(source: str, package: str = "maserve_prefect.hear") -> list[str]:
    """The imports in `source` (a module of `package`) that break the contract."""
    bad: list[str] = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            bad += [a.name for a in node.names if not _allowed(a.name)]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                parts = package.split(".")
                if node.level > 1:
                    parts = parts[: -(node.level - 1)]
                base = ".".join(parts + ([node.module] if node.module else []))
            else:
                base = node.module or ""
            if _allowed(base):
                continue
            # `from maserve_prefect.engine import protocol` imports a submodule
            bad += [f"{base}.{a.name}" for a in node.names if not _allowed(f"{base}.{a.name}")]
    return bad


MODULES = sorted(HEAR_DIR.glob("*.py"))


def test_hear_has_the_policy_modules() -> None:
    names = {p.stem for p in MODULES}
    assert {"policies", "force", "messages", "capabilities", "mode_calibration"} <= names


@pytest.mark.parametrize("path", MODULES, ids=lambda p: p.name)
def test_hear_module_imports_only_allowed_modules(path: Path) -> None:
    assert violations(path.read_text(encoding="utf-8")) == []


@pytest.mark.parametrize(
    ("source", "bad"),
    [
        ("from maserve_prefect.runtime.plans import Plan", ["maserve_prefect.runtime.plans.Plan"]),
        ("import maserve_prefect.engine.sim.replica", ["maserve_prefect.engine.sim.replica"]),
        ("from maserve_prefect.engine import sim, protocol", ["maserve_prefect.engine.sim"]),
        ("from ..runtime import dispatcher", ["maserve_prefect.runtime.dispatcher"]),
        ("def f():\n    import pandas\n", ["pandas"]),
        ("import prefect", ["prefect"]),
    ],
)
def test_the_checker_catches_forbidden_imports(source: str, bad: list[str]) -> None:
    assert violations(source) == bad


@pytest.mark.parametrize(
    "source",
    [
        "from . import force",
        "from .policies import CacheAware",
        "from maserve_prefect.engine import protocol",
        "import numpy as np\nimport json, bisect",
        "from maserve_prefect import errors",
    ],
)
def test_the_checker_allows_the_contract(source: str) -> None:
    assert violations(source) == []
