"""Inter-process locks on files: one holder at a time, every wait bounded.

The one idea: **an `flock` on a lock file beside what it guards, polled until a deadline.** The
kernel drops the lock when its holder exits, however it exits (SIGKILL included), so a lock file
left behind is never stale; a holder that hangs ends the waiter's wait in a one-line error that
names the file. Used where two `maserve` processes may race on one resource: the managed Prefect
server of a `MASERVE_HOME` (`prefect_server`).

Examples:
    >>> import tempfile
    >>> lock = Path(tempfile.mkdtemp()) / "x.lock"
    >>> with exclusive(lock, wait_s=1.0, what="the example"):
    ...     held = True
    >>> held
    True
"""

from __future__ import annotations

import fcntl
import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from maserve_prefect.errors import ConfigError
from maserve_prefect.settings import private_dir, private_file

__all__ = ["LockTimeoutError", "exclusive", "pid_alive"]

POLL_S = 0.1


class LockTimeoutError(ConfigError):
    """Another process held a lock longer than the caller would wait."""


@contextmanager
def exclusive(path: Path, *, wait_s: float, what: str) -> Iterator[None]:
    """Hold an exclusive `flock` on `path` (created if missing) for the block.

    Args:
        path: the lock file.
        wait_s: how long to wait for another holder before giving up.
        what: what the lock guards, for the error message.

    Raises:
        LockTimeoutError: another process held it for `wait_s`.
    """
    private_file(private_dir(path.parent) / path.name)  # owner only, like what it guards
    with path.open("a") as fh:
        deadline = time.monotonic() + wait_s
        while True:
            try:
                fcntl.flock(fh.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    raise LockTimeoutError(
                        f"another maserve process has held {path} for {wait_s:.0f} s ({what}); "
                        "wait for it to finish, or stop it and retry"
                    ) from None
                time.sleep(POLL_S)
        try:
            yield
        finally:
            fcntl.flock(fh.fileno(), fcntl.LOCK_UN)


def pid_alive(pid: int) -> bool:
    """Whether process `pid` exists (signal 0; a process of another user counts as alive)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
