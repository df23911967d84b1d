"""Every module's docstring examples run, one test per module (the id is the module's name).

One collector instead of a hand-kept list per folder. Plain `pytest --doctest-modules` on the
source folders cannot do this: `flows/`, `tasks/`, `bindings/` and `predictors/` are imported as
`maserve_prefect.flows` etc., so a file path does not name the module. This walks the package by
import name instead: `maserve_prefect` itself, then every code folder at the repository root that
is shipped as its subpackage (the user folders; whichever `maserve_prefect.<folder>` resolves),
with `pkgutil.walk_packages`. Every module with at least one example that is not `+SKIP` is
collected, so a new module's examples run without editing anything here.

Examples run with `ELLIPSIS`. A module whose examples need the Prefect API goes in
`NEEDS_PREFECT_SERVER`: its test carries the `prefect` marker and runs under the session's
temporary server (`prefect_api` in `conftest.py`); the others never start one.
"""

from __future__ import annotations

import doctest
import importlib
import importlib.util
import io
import pkgutil
from functools import cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
USER_FOLDERS = ("flows", "tasks", "bindings", "predictors")

NEEDS_PREFECT_SERVER: frozenset[str] = frozenset()
"""Modules whose examples talk to a Prefect server (none today: name one here when it does)."""

EVERY_MODULE_HAS_EXAMPLES = ("maserve_prefect.spec",)
"""Packages whose every module must keep an `Examples:` block (their public API is small)."""

MUST_HAVE_EXAMPLES = (
    # split out of `ledger` and `release`: each half keeps examples of its own
    "maserve_prefect.trace.ledger",
    "maserve_prefect.trace.runs",
    "maserve_prefect.trace.barrier",
    "maserve_prefect.trace.release",
)


def mapped_subpackages() -> list[str]:
    """`maserve_prefect.<folder>` for each root folder shipped as a subpackage of ours."""
    names = []
    for folder in sorted(p for p in ROOT.iterdir() if (p / "__init__.py").is_file()):
        name = f"maserve_prefect.{folder.name}"
        if folder.name == "maserve_prefect" or importlib.util.find_spec(name) is None:
            continue
        names.append(name)
    return names


def _walk(package: str) -> list[str]:
    pkg = importlib.import_module(package)
    found = [m.name for m in pkgutil.walk_packages(pkg.__path__, f"{package}.", onerror=_raise)]
    return [package, *found]


def _raise(name: str) -> None:
    raise ImportError(f"cannot import {name} while collecting doctests")


@cache
def all_modules() -> tuple[str, ...]:
    """Every module of the package and of its mapped subpackages, sorted, `__main__`s left out
    (running one would run a program)."""
    names = {n for pkg in ["maserve_prefect", *mapped_subpackages()] for n in _walk(pkg)}
    return tuple(sorted(n for n in names if n.rpartition(".")[2] != "__main__"))


def examples_of(name: str) -> list[doctest.DocTest]:
    module = importlib.import_module(name)
    return [t for t in doctest.DocTestFinder().find(module) if t.examples]


def _runs(test: doctest.DocTest) -> bool:
    return any(not ex.options.get(doctest.SKIP) for ex in test.examples)


@cache
def modules_with_examples() -> tuple[str, ...]:
    """Modules with an example that runs (one not all `+SKIP`)."""
    return tuple(n for n in all_modules() if any(map(_runs, examples_of(n))))


def _params() -> list[object]:
    names = modules_with_examples()
    unknown = NEEDS_PREFECT_SERVER - set(names)
    if unknown:
        raise ValueError(f"NEEDS_PREFECT_SERVER names modules without examples: {sorted(unknown)}")
    return [
        pytest.param(n, marks=[pytest.mark.prefect] if n in NEEDS_PREFECT_SERVER else [], id=n)
        for n in names
    ]


@pytest.mark.parametrize("name", _params())
def test_docstring_examples(name: str, request: pytest.FixtureRequest) -> None:
    if name in NEEDS_PREFECT_SERVER:
        request.getfixturevalue("prefect_api")
    runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS)
    report = io.StringIO()
    for test in examples_of(name):
        runner.run(test, out=report.write)
    result = runner.summarize(verbose=False)
    assert result.attempted > 0
    if result.failed:
        pytest.fail(f"{result.failed} of {result.attempted} examples failed:\n{report.getvalue()}")


def test_the_walk_reaches_every_user_folder_and_nested_packages() -> None:
    assert {f"maserve_prefect.{f}" for f in USER_FOLDERS} <= set(mapped_subpackages())
    names = all_modules()
    for folder in USER_FOLDERS:
        assert any(n.startswith(f"maserve_prefect.{folder}.") for n in modules_with_examples())
    assert "maserve_prefect.engines.sim.kv.manager" in modules_with_examples()
    assert "maserve_prefect.flows.specs" in names  # a package inside a user folder


@pytest.mark.parametrize("package", EVERY_MODULE_HAS_EXAMPLES)
def test_every_module_of_the_package_has_examples(package: str) -> None:
    modules = [n for n in all_modules() if n == package or n.startswith(f"{package}.")]
    assert len(modules) > 1
    assert [n for n in modules if n not in modules_with_examples()] == []


def test_the_modules_that_must_have_examples_have_them() -> None:
    assert [n for n in MUST_HAVE_EXAMPLES if n not in modules_with_examples()] == []
