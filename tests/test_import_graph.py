"""The architecture, checked: no import cycles anywhere, the user folders reached only through
the plugin registry, and `make lint`'s import contracts failing when one is broken.

Every import statement counts — module-level, function-level and `TYPE_CHECKING` ones — in the
library and in the user folders (`flows/`, `tasks/`, `bindings/`, `predictors/`, which ship as
`maserve_prefect.<folder>` but live outside the package directory, where import-linter does not
look).
"""

from __future__ import annotations

import ast
import shutil
import subprocess
import sys
from pathlib import Path

import networkx as nx
import pytest

ROOT = Path(__file__).resolve().parents[1]
USER_FOLDERS = ("flows", "tasks", "bindings", "predictors")


def _modules() -> dict[str, Path]:
    mods: dict[str, Path] = {}
    roots = {"maserve_prefect": ROOT / "maserve_prefect"}
    roots |= {f"maserve_prefect.{f}": ROOT / f for f in USER_FOLDERS}
    for prefix, folder in roots.items():
        for path in folder.rglob("*.py"):
            parts = path.relative_to(folder).with_suffix("").parts
            if parts[-1] == "__init__":
                parts = parts[:-1]
            mods[".".join((prefix, *parts))] = path
    return mods


def _graph() -> nx.DiGraph[str]:
    mods = _modules()
    graph: nx.DiGraph[str] = nx.DiGraph()
    for name, path in mods.items():
        graph.add_node(name)
        is_pkg = path.name == "__init__.py"
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    parts = name.split(".")[: None if is_pkg else -1]
                    parts = parts[: len(parts) - node.level + 1]
                    base = ".".join([*parts, *([node.module] if node.module else [])])
                targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in mods else base
                           for a in node.names]  # fmt: skip
            else:
                continue
            for target in targets:
                while target and target not in mods:
                    target = target.rpartition(".")[0]
                if target and target != name:
                    graph.add_edge(name, target)
    return graph


GRAPH = _graph()


def _package(module: str) -> str:
    return ".".join(module.split(".")[:2])


def test_the_graph_sees_every_module_and_lazy_imports() -> None:
    assert len(GRAPH) > 200 and "maserve_prefect.flows.native" in GRAPH
    # a function-level import (plans load their entries lazily) is an edge like any other
    assert GRAPH.has_edge("maserve_prefect.taskrunner.native", "maserve_prefect.plugins")


def test_no_import_cycle_between_modules() -> None:
    cycles = [sorted(c) for c in nx.strongly_connected_components(GRAPH) if len(c) > 1]
    assert cycles == []


def test_no_import_cycle_between_packages() -> None:
    packages: nx.DiGraph[str] = nx.DiGraph()
    for a, b in GRAPH.edges:
        if _package(a) != _package(b) and b != "maserve_prefect":
            packages.add_edge(_package(a), _package(b))
    assert list(nx.simple_cycles(packages)) == []


def test_the_library_reaches_the_user_folders_only_through_the_plugin_registry() -> None:
    user = tuple(f"maserve_prefect.{f}" for f in USER_FOLDERS)
    leaks = sorted((a, b) for a, b in GRAPH.edges if b.startswith(user) and not a.startswith(user))
    assert leaks == []


# -- the contracts of `make lint` fail when broken ------------------------------------------


def _lint_copy(tmp_path: Path, edit: tuple[str, str] | None) -> subprocess.CompletedProcess[str]:
    """`lint-imports` on a copy of the package (with one line appended to one module)."""
    shutil.copytree(ROOT / "maserve_prefect", tmp_path / "maserve_prefect",
                    ignore=shutil.ignore_patterns("__pycache__"))  # fmt: skip
    shutil.copy(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    if edit is not None:
        module, line = edit
        with (tmp_path / module).open("a", encoding="utf-8") as f:
            f.write(f"\n{line}\n")
    lint = Path(sys.executable).with_name("lint-imports")
    return subprocess.run(
        [str(lint), "--no-cache"], cwd=tmp_path, capture_output=True, text=True,
        env={"PYTHONPATH": str(tmp_path), "PATH": "/usr/bin:/bin"},
    )  # fmt: skip


def test_the_contracts_hold_on_a_clean_copy(tmp_path: Path) -> None:
    res = _lint_copy(tmp_path, None)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "0 broken" in res.stdout


@pytest.mark.parametrize(
    ("module", "line", "contract"),
    [
        (
            "maserve_prefect/hear/policies.py",
            "from maserve_prefect.engines.sim import replica as _replica  # noqa",
            "HEAR policies import only the protocol BROKEN",
        ),
        (
            "maserve_prefect/dispatch/plans.py",
            "from maserve_prefect.pool import joint_plan as _joint  # noqa",
            "Layers: clock -> protocol -> engines / trace / spec -> metrics -> dispatch / pool / "
            "hear -> taskrunner / replay -> bench / cli BROKEN",
        ),
        (
            "maserve_prefect/engines/sim/replica.py",
            "from maserve_prefect.dispatch import dispatcher as _dispatcher  # noqa",
            "Engines never import the dispatcher, the pool runtime, replay, HEAR policies or the "
            "task runner BROKEN",
        ),
        (
            "maserve_prefect/metrics/task.py",
            "from maserve_prefect.replay import arms as _arms  # noqa",
            "Metrics never import the task runner or replay BROKEN",
        ),
        (
            "maserve_prefect/engines/sim/kv/manager.py",
            "from maserve_prefect.engines.sim.hear import side as _side  # noqa",
            "No import cycle between sibling packages or modules, at any depth BROKEN",
        ),
    ],
)
def test_a_deliberately_broken_import_fails_its_contract(
    tmp_path: Path, module: str, line: str, contract: str
) -> None:
    res = _lint_copy(tmp_path, (module, line))
    assert res.returncode != 0
    assert contract in " ".join(res.stdout.split())
