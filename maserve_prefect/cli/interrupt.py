"""Ctrl-C for long commands: the first one asks the work to stop, a second one exits at once.

The one idea: **a signal handler only sets an event; the command's main thread does the
rest.** Python's default turns SIGINT into a `KeyboardInterrupt` wherever the main thread happens
to be (inside a lock, between two ledger writes, in `Thread.join`) while worker threads run on;
the interpreter then blocks at exit on those threads. Under `interruptible()` the first SIGINT
sets the yielded event (`taskrunner` work polls it, cancels what runs and returns what finished),
and a second one ends the process at once with `EXIT_INTERRUPTED` and no output. `exit_now`
ends a command that has saved its work without waiting for worker threads (a cancelled op stuck
in a tool cannot be interrupted; the interpreter's exit would wait for it).

Examples:
    >>> with interruptible() as stop:
    ...     stop.is_set()
    False
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from types import FrameType
from typing import NoReturn

__all__ = ["EXIT_INTERRUPTED", "exit_now", "interruptible"]

# The shell's code for a process ended by SIGINT (128 + 2).
EXIT_INTERRUPTED = 130


@contextmanager
def interruptible() -> Iterator[threading.Event]:
    """Within the block, the first SIGINT sets the yielded event; a second exits at once.

    Off the main thread (where signal handlers cannot be installed) the event is never set by a
    signal and Ctrl-C keeps Python's default.
    """
    event = threading.Event()
    if threading.current_thread() is not threading.main_thread():
        yield event
        return

    def handler(_signum: int, _frame: FrameType | None) -> None:
        if event.is_set():
            os._exit(EXIT_INTERRUPTED)  # the second Ctrl-C: quietly, now
        event.set()

    old = signal.signal(signal.SIGINT, handler)
    try:
        yield event
    finally:
        signal.signal(signal.SIGINT, old)


def exit_now(code: int) -> NoReturn:
    """Flush the console and end the process without waiting for worker threads."""
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):
            stream.flush()
    os._exit(code)
