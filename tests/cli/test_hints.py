"""Every `maserve ...` command a message or docstring names exists, with the options it names.

Hints are how a one-line error tells the user what to do next; one that names a command or
option the CLI does not have (the old export hint named "`maserve trace`" as a reader of the
ledger) sends them nowhere. This scans the package's source for backquoted `maserve` command
lines and resolves each against the mounted typer app.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import typer.main

import maserve_prefect
from maserve_prefect import cli

HINT = re.compile(r"`maserve((?: [a-z][a-z0-9-]*)+)([^`]*)`")
OPTION = re.compile(r"(?<![\w-])(--[a-z][a-z0-9-]*)")


def command_tree() -> Any:
    cli._mount()
    return typer.main.get_command(cli.app)


def resolve(root: Any, words: list[str]) -> tuple[Any, list[str]]:
    """The deepest command the words name, and the words left over (arguments)."""
    cmd = root
    rest = list(words)
    while rest and isinstance(getattr(cmd, "commands", None), dict):
        sub = cmd.commands.get(rest[0])  # type: ignore[attr-defined]
        if sub is None:
            break
        cmd, rest = sub, rest[1:]
    return cmd, rest


def hints() -> list[tuple[str, list[str], str]]:
    root = Path(maserve_prefect.__file__).parent
    found = []
    for path in sorted(root.rglob("*.py")):
        for m in HINT.finditer(path.read_text()):
            found.append((str(path.relative_to(root)), m.group(1).split(), m.group(2)))
    return found


def test_every_named_command_and_option_exists() -> None:
    tree = command_tree()
    found = hints()
    assert len(found) > 20  # the scan sees the hints
    bad = []
    for where, words, tail in found:
        cmd, rest = resolve(tree, words)
        if isinstance(getattr(cmd, "commands", None), dict) and rest:
            bad.append(f"{where}: `maserve {' '.join(words)}` — no command {rest[0]!r}")
            continue
        names = {opt for p in cmd.params for opt in getattr(p, "opts", [])}
        names |= {opt for p in cmd.params for opt in getattr(p, "secondary_opts", [])}
        for option in OPTION.findall(tail):
            if option not in names | {"--help"}:
                bad.append(f"{where}: `maserve {' '.join(words)}` has no option {option}")
    assert not bad, "\n".join(bad)
