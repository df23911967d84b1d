"""Which process owns a running run, and whether that process still lives.

The one idea: **a run row names its process well enough to tell, later, that it is gone.** The
owner is `host|boot id|pid|start ticks`: the host name, the kernel's boot id
(`/proc/sys/kernel/random/boot_id`), the process id and the process's start time in clock ticks
since boot (`/proc/<pid>/stat`, field 22). On the same host and boot, a pid whose start ticks
differ is another process (the pid was reused); after a reboot no process of the old boot lives.
On another host, or without procfs, liveness is unknown and nothing is concluded.

Examples:
    >>> owner_alive(current_owner())
    True
    >>> owner_alive("some-other-host|x|1|1") is None
    True
"""

from __future__ import annotations

import os
import socket
from pathlib import Path

from maserve_prefect.locks import pid_alive

__all__ = ["current_owner", "owner_alive"]

_BOOT_ID = Path("/proc/sys/kernel/random/boot_id")


def _boot_id() -> str:
    try:
        return _BOOT_ID.read_text().strip()
    except OSError:
        return ""


def _start_ticks(pid: int) -> str:
    """The process's start time in ticks since boot, or "" (no procfs, or no such process)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return ""
    # The command name (field 2) is in parentheses and may hold spaces: split after it.
    fields = stat[stat.rfind(")") + 2 :].split()
    if len(fields) <= 19 or fields[0] == "Z":  # a zombie has ended; only its parent holds it
        return ""
    return fields[19]


def current_owner() -> str:
    """This process, as recorded in a run row."""
    pid = os.getpid()
    return f"{socket.gethostname()}|{_boot_id()}|{pid}|{_start_ticks(pid)}"


def owner_alive(owner: str) -> bool | None:
    """Whether the recorded owner process still runs; None when this host cannot tell."""
    parts = owner.split("|")
    if len(parts) != 4 or parts[0] != socket.gethostname() or not parts[2].isdigit():
        return None
    _, boot, pid_text, ticks = parts
    current_boot = _boot_id()
    if boot and current_boot and boot != current_boot:
        return False  # the machine rebooted since
    pid = int(pid_text)
    if ticks:
        now = _start_ticks(pid)
        if now or Path("/proc").is_dir():
            return now == ticks
    return pid_alive(pid)
