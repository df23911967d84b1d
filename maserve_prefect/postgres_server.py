"""A private PostgreSQL server on a loopback port: `initdb`, `pg_ctl start`, `pg_ctl stop`.

The one idea: **a throwaway cluster in a folder, trust authentication on 127.0.0.1 only, for the
tests, the benchmarks and a first try of the shared-ledger set-up.** `LocalPostgres.start(root)`
creates a cluster in `root` (one superuser, `maserve`), starts it on a free port and returns once
it accepts connections; `create_database` makes a database; `url()` names it for SQLAlchemy
(`postgresql+psycopg://…` for the ledger, `postgresql+asyncpg://…` for the Prefect server);
`stop()` shuts it down. A production ledger is a PostgreSQL server someone runs; this module is
not needed for one (`MASERVE_LEDGER_URL` is the whole set-up).

The server binaries come from Debian's `postgresql` package (`make test` installs it when it can,
as root with apt-get): they are found on `PATH` or under `/usr/lib/postgresql/<version>/bin`,
newest version first. PostgreSQL refuses to run as root, so under root every server command runs
as the package's `postgres` system user (`runuser`) and the cluster folder belongs to it.

Examples:
    >>> pg = LocalPostgres.start(Path("/tmp/pg"))  # doctest: +SKIP
    >>> pg.create_database("ledger")  # doctest: +SKIP
    >>> pg.url("ledger")  # doctest: +SKIP
    'postgresql+psycopg://maserve@127.0.0.1:54011/ledger'
    >>> pg.stop()  # doctest: +SKIP
"""

from __future__ import annotations

import os
import pwd
import shutil
import socket
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from maserve_prefect.errors import ConfigError

__all__ = ["LocalPostgres", "find_bin_dir"]

HOST = "127.0.0.1"
SUPERUSER = "maserve"
SYSTEM_USER = "postgres"
"""The account Debian's package creates; the server runs as it when this process is root."""
INSTALL_HINT = (
    "install Debian's 'postgresql' package (apt-get install postgresql; `make test` does it as "
    "root) or put the folder holding initdb and pg_ctl on PATH"
)
_DEBIAN_ROOT = Path("/usr/lib/postgresql")


def find_bin_dir() -> Path | None:
    """The folder holding `initdb` and `pg_ctl`: `PATH` first, then Debian's newest version."""
    on_path = shutil.which("pg_ctl")
    if on_path and (Path(on_path).parent / "initdb").exists():
        return Path(on_path).parent
    if _DEBIAN_ROOT.is_dir():
        versions = sorted(
            (p for p in _DEBIAN_ROOT.iterdir() if (p / "bin" / "initdb").exists()),
            key=lambda p: int(p.name) if p.name.isdigit() else -1,
            reverse=True,
        )
        if versions:
            return versions[0] / "bin"
    return None


@dataclass(frozen=True, slots=True)
class LocalPostgres:
    """A running private cluster.

    Attributes:
        data_dir: the cluster's folder (`initdb -D`); its log is `data_dir/server.log`.
        port: the loopback TCP port it listens on.
        bin_dir: where its binaries are.
    """

    data_dir: Path
    port: int
    bin_dir: Path

    @classmethod
    def start(cls, root: Path, *, timeout_s: float = 60.0) -> LocalPostgres:
        """Create a cluster in `root` (a new or empty folder) and start it on a free port.

        Raises:
            ConfigError: no server binaries, `root` is not empty, or the server did not start
                (quotes its log).
        """
        bin_dir = find_bin_dir()
        if bin_dir is None:
            raise ConfigError(
                f"PostgreSQL server binaries (initdb, pg_ctl) not found; {INSTALL_HINT}"
            )
        root.mkdir(parents=True, exist_ok=True)
        if any(root.iterdir()):
            raise ConfigError(f"{root}: not empty; a new PostgreSQL cluster needs an empty folder")
        _hand_to_server_user(root)
        _run([str(bin_dir / "initdb"), "-D", str(root), "-U", SUPERUSER, "-A", "trust"], root)
        port = _free_port()
        options = f"-c listen_addresses={HOST} -p {port} -k {root} -c fsync=on"
        log = root / "server.log"
        cmd = [str(bin_dir / "pg_ctl"), "-D", str(root), "-l", str(log), "-o", options]
        cmd += ["-w", "-t", str(int(timeout_s)), "start"]
        try:
            _run(cmd, root)
        except ConfigError as exc:
            tail = log.read_text(errors="replace")[-2000:] if log.exists() else ""
            raise ConfigError(f"{exc}\nlast lines of {log}:\n{tail}") from None
        server = cls(data_dir=root, port=port, bin_dir=bin_dir)
        server._wait_ready(timeout_s)
        return server

    def url(self, database: str = "postgres", *, driver: str = "psycopg") -> str:
        """A SQLAlchemy URL for `database` (driver `psycopg` for the ledger, `asyncpg` for Prefect)."""
        return f"postgresql+{driver}://{SUPERUSER}@{HOST}:{self.port}/{database}"

    def create_database(self, name: str) -> str:
        """Create database `name` (an identifier: letters, digits, underscores); return its URL."""
        if not name.replace("_", "").isalnum():
            raise ConfigError(f"database name {name!r}: use letters, digits and underscores only")
        import psycopg

        with psycopg.connect(self._dsn("postgres"), autocommit=True) as conn:
            conn.execute(f'CREATE DATABASE "{name}"')
        return self.url(name)

    def stop(self, *, timeout_s: float = 30.0) -> None:
        """Shut the server down (fast mode: running sessions are ended, nothing half written)."""
        cmd = [str(self.bin_dir / "pg_ctl"), "-D", str(self.data_dir), "-m", "fast"]
        cmd += ["-w", "-t", str(int(timeout_s)), "stop"]
        _run(cmd, self.data_dir, check=False)

    def _dsn(self, database: str) -> str:
        return f"host={HOST} port={self.port} user={SUPERUSER} dbname={database}"

    def _wait_ready(self, timeout_s: float) -> None:
        import psycopg

        deadline = time.monotonic() + timeout_s
        while True:
            try:
                with psycopg.connect(self._dsn("postgres"), connect_timeout=2):
                    return
            except psycopg.OperationalError as exc:
                if time.monotonic() > deadline:
                    raise ConfigError(
                        f"PostgreSQL in {self.data_dir} did not accept connections on port "
                        f"{self.port} within {timeout_s:.0f} s ({exc}); see {self.data_dir}/server.log"
                    ) from None
                time.sleep(0.2)


def _as_root() -> bool:
    return os.geteuid() == 0


def _hand_to_server_user(root: Path) -> None:
    """Under root, give the cluster folder (and the way to it) to the `postgres` account."""
    if not _as_root():
        return
    try:
        account = pwd.getpwnam(SYSTEM_USER)
    except KeyError:
        raise ConfigError(
            f"running as root, and PostgreSQL refuses root: no '{SYSTEM_USER}' account to run it "
            f"as; {INSTALL_HINT}, or run as an ordinary user"
        ) from None
    for parent in root.parents:  # the server must be able to reach its folder
        if not parent.stat().st_mode & 0o001:
            raise ConfigError(
                f"{root}: the '{SYSTEM_USER}' account cannot reach it ({parent} is closed to "
                f"other users); put the cluster under a folder others can enter, e.g. /tmp"
            )
    os.chown(root, account.pw_uid, account.pw_gid)
    root.chmod(0o700)


def _run(cmd: list[str], cwd: Path, *, check: bool = True) -> None:
    if _as_root():
        cmd = ["runuser", "-u", SYSTEM_USER, "--", *cmd]
    proc = subprocess.run(
        cmd, cwd=cwd, stdin=subprocess.DEVNULL, capture_output=True, text=True, check=False
    )
    if check and proc.returncode != 0:
        why = (proc.stderr or proc.stdout).strip()
        raise ConfigError(f"{' '.join(cmd)} failed with code {proc.returncode}: {why}")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind((HOST, 0))
        port: int = s.getsockname()[1]
        return port
