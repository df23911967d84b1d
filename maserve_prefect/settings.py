"""Where maserve keeps its data: one frozen `Settings` read from the environment.

Defaults (override with environment variables):

- `MASERVE_HOME` — the project data directory, default `~/.maserve`.
- `MASERVE_LEDGER_URL` — the trace ledger database, any SQLAlchemy URL; default
  `sqlite:///{MASERVE_HOME}/ledger.db` (SQLite in WAL mode). Set it to e.g.
  `postgresql+psycopg://user@host/maserve` to share one ledger between machines.
- `MASERVE_CAS_DIR` — the content-addressed payload store, default `{MASERVE_HOME}/cas`.

Reading settings has no side effects: nothing is created until a ledger or store is opened
(`trace.db.make_engine` creates the SQLite file's folder, `ContentStore` its root).

What maserve creates is readable by its owner only: folders (`MASERVE_HOME`, the CAS, the Prefect
server's home, and any missing parents) are made mode 0700 by `private_dir`, database files 0600
by `private_file` — the ledger and Prefect's database hold prompts, outputs and run history.
Folders and files that already exist keep their modes.

Examples:
    >>> s = Settings.from_env({"MASERVE_HOME": "/data/ms"})
    >>> s.ledger_url
    'sqlite:////data/ms/ledger.db'
    >>> str(s.cas_dir)
    '/data/ms/cas'
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from sqlalchemy.engine import make_url
from sqlalchemy.exc import ArgumentError

from maserve_prefect.errors import ConfigError

ENV_HOME = "MASERVE_HOME"
ENV_LEDGER_URL = "MASERVE_LEDGER_URL"
ENV_CAS_DIR = "MASERVE_CAS_DIR"
DEFAULT_HOME = "~/.maserve"


@dataclass(frozen=True, slots=True)
class Settings:
    """Resolved data locations.

    Attributes:
        home: the project data directory (absolute).
        ledger_url: SQLAlchemy URL of the trace ledger.
        cas_dir: root of the content-addressed store (absolute).
    """

    home: Path
    ledger_url: str
    cas_dir: Path

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> Settings:
        """Build settings from `env` (default: `os.environ`).

        Raises:
            ConfigError: `MASERVE_LEDGER_URL` is not a valid SQLAlchemy URL.

        Examples:
            >>> Settings.from_env({"MASERVE_HOME": "/x", "MASERVE_LEDGER_URL": "sqlite://"}).ledger_url
            'sqlite://'
        """
        env = os.environ if env is None else env
        home = Path(env.get(ENV_HOME) or DEFAULT_HOME).expanduser().resolve()
        ledger_url = env.get(ENV_LEDGER_URL) or f"sqlite:///{home / 'ledger.db'}"
        try:
            make_url(ledger_url)
        except ArgumentError as exc:
            raise ConfigError(
                f"{ENV_LEDGER_URL}={ledger_url!r} is not a database URL ({exc}); use e.g. "
                f"'sqlite:////abs/path/ledger.db' or 'postgresql+psycopg://user@host/db'"
            ) from exc
        cas_raw = env.get(ENV_CAS_DIR)
        cas_dir = Path(cas_raw).expanduser().resolve() if cas_raw else home / "cas"
        return cls(home=home, ledger_url=ledger_url, cas_dir=cas_dir)


PRIVATE_DIR_MODE = 0o700
PRIVATE_FILE_MODE = 0o600


def private_dir(path: Path) -> Path:
    """Create `path` and any missing parents readable by the owner only (mode 0700); folders
    that exist are left as they are. Returns `path`.

    Examples:
        >>> import tempfile
        >>> p = private_dir(Path(tempfile.mkdtemp()) / "a" / "b")
        >>> oct(p.stat().st_mode & 0o777), oct(p.parent.stat().st_mode & 0o777)
        ('0o700', '0o700')
    """
    missing = [p for p in (path, *path.parents) if not p.exists()]
    for p in reversed(missing):
        try:
            p.mkdir(mode=PRIVATE_DIR_MODE)
        except FileExistsError:
            if not p.is_dir():
                raise
        else:
            os.chmod(p, PRIVATE_DIR_MODE)  # mkdir's mode is masked by the umask; 0700 is exact
    return path


def private_file(path: Path) -> Path:
    """Create the empty file `path` (mode 0600) unless it exists; its folder must exist.

    SQLite gives a database's journal and WAL files the database file's mode, so creating it
    first keeps them private too.

    Examples:
        >>> import tempfile
        >>> p = private_file(Path(tempfile.mkdtemp()) / "x.db")
        >>> oct(p.stat().st_mode & 0o777)
        '0o600'
    """
    try:
        fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, PRIVATE_FILE_MODE)
    except FileExistsError:
        return path
    os.close(fd)
    return path


def get_settings() -> Settings:
    """Settings from the current environment (read afresh on every call; cheap).

    Examples:
        >>> get_settings().cas_dir.name
        'cas'
    """
    return Settings.from_env()
