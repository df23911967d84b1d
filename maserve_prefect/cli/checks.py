"""Checks every command makes of the paths it is given, before it does any work.

One idea: a path a command will write to or read from is checked up front, so a bad one ends the
command with one line naming the option and what to do — never a traceback half-way through,
never a folder half written. Nothing here creates anything.

Examples:
    >>> import tempfile, pathlib
    >>> f = pathlib.Path(tempfile.mkdtemp()) / "f"; _ = f.write_text("x")
    >>> check_out_dir(f / "sub", "--out")
    Traceback (most recent call last):
    ...
    maserve_prefect.errors.ConfigError: --out ...: ... is a file, not a folder; give a folder path
"""

from __future__ import annotations

from pathlib import Path

from rich.console import Console
from rich.markup import escape

from maserve_prefect.engines.target import redact
from maserve_prefect.errors import ConfigError

EXIT_FAILED_WORK = 4
"""Exit code of `run`, `replay` and `bench run` when ops failed or an audit failed (the results
are written first; `--allow-failures` exits 0 instead)."""


def print_error(message: str) -> None:
    """One red `error:` line on stderr; URL user info in it is redacted (`engines.target`)."""
    Console(stderr=True).print(
        f"[bold red]error:[/] {escape(redact(message))}", highlight=False, soft_wrap=True
    )


def check_out_dir(path: Path, what: str) -> None:
    """Refuse an output folder that is a file or lies under a file.

    Raises:
        ConfigError: naming `what` (the option) and the file in the way.
    """
    for p in (path, *path.parents):
        if p.exists() or p.is_symlink():
            if not p.is_dir():
                raise ConfigError(f"{what} {path}: {p} is a file, not a folder; give a folder path")
            return


def check_bundle_dir(path: Path, what: str = "bundle") -> None:
    """Refuse a bundle path that does not exist or is not a folder.

    Raises:
        ConfigError: naming `what` and what to give instead.
    """
    if not path.exists():
        raise ConfigError(f"{what} {path}: no such file or folder; give a trace bundle folder")
    if not path.is_dir():
        raise ConfigError(
            f"{what} {path}: a file, not a bundle folder; give the folder that holds "
            "trace.jsonl (e.g. one written by `maserve run --out`)"
        )
