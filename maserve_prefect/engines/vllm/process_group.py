"""Process groups via /proc: who is in a group, its resident memory, and signalling it.

The one idea: a server started as the leader of a new session owns one process group whose id is
the leader's pid, so "the server and everything it forked" is exactly the live processes whose
`/proc/PID/stat` names that group; signalling the group reaches them all and nothing else. Zombies
(exited, waiting to be reaped) do not count as members. psutil is not a dependency.

Examples:
    >>> import os
    >>> os.getpid() in process_group_members(os.getpgrp())
    True
"""

from __future__ import annotations

import os
import signal
from pathlib import Path

__all__ = ["group_rss_bytes", "process_group_members", "signal_group"]


def process_group_members(pgid: int) -> list[int]:
    """Pids of live (non-zombie) processes whose process group is `pgid`, ascending."""
    members: list[int] = []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        stat = _read_stat(int(entry.name))
        if stat is not None and stat[1] == pgid and stat[0] != "Z":
            members.append(int(entry.name))
    return sorted(members)


def group_rss_bytes(pgid: int) -> int:
    """Sum of VmRSS over the group's processes (shared pages count once per process)."""
    total = 0
    for pid in process_group_members(pgid):
        try:
            text = Path(f"/proc/{pid}/status").read_text()
        except OSError:
            continue  # exited meanwhile
        for line in text.splitlines():
            if line.startswith("VmRSS:"):
                total += int(line.split()[1]) * 1024
                break
    return total


def _read_stat(pid: int) -> tuple[str, int] | None:
    """(state, pgrp) from /proc/PID/stat; the command name may hold spaces and parentheses."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = raw[raw.rfind(")") + 2 :].split()
    # after the name: state, ppid, pgrp, ...
    return (fields[0], int(fields[2])) if len(fields) > 2 else None


def signal_group(pgid: int, sig: signal.Signals) -> None:
    """Send `sig` to the group `pgid`; a group already gone is not an error."""
    try:
        os.killpg(pgid, sig)
    except ProcessLookupError:
        pass
