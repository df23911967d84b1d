"""Where maserve keeps its data: one frozen `Settings` read from the environment.

Defaults (override with environment variables):

- `MASERVE_HOME` — the project data directory, default `~/.maserve`.
- `MASERVE_LEDGER_URL` — the trace ledger database, any SQLAlchemy URL; default
  `sqlite:///{MASERVE_HOME}/ledger.db` (SQLite in WAL mode). Set it to e.g.
  `postgresql+psycopg://user@host/maserve` to share one ledger between machines.
- `MASERVE_CAS_DIR` — the content-addressed payload store, default `{MASERVE_HOME}/cas`.

Reading settings has no side effects: nothing is created until a ledger or store is opened
(`trace.db.make_engine` creates the SQLite file's folder, `ContentStore` its root).

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


def get_settings() -> Settings:
    """Settings from the current environment (read afresh on every call; cheap).

    Examples:
        >>> get_settings().cas_dir.name
        'cas'
    """
    return Settings.from_env()
