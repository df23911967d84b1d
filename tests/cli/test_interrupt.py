"""Ctrl-C handling of long commands (`cli.interrupt`, `run_cmd.caused_by_interrupt`)."""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap

from maserve_prefect.cli.interrupt import EXIT_INTERRUPTED, interruptible
from maserve_prefect.cli.run_cmd import caused_by_interrupt

CHILD = textwrap.dedent(
    """
    import os, signal, time
    from maserve_prefect.cli.interrupt import interruptible

    with interruptible() as stop:
        os.kill(os.getpid(), signal.SIGINT)
        if stop.wait(30.0):  # the event the handler sets, not a polling loop
            print("first Ctrl-C: asked to stop", flush=True)
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(60)
    print("never reached")
    """
)


def test_first_ctrl_c_sets_the_event_and_the_second_exits_at_once_quietly() -> None:
    proc = subprocess.run([sys.executable, "-c", CHILD], capture_output=True, text=True, timeout=50)
    assert proc.returncode == EXIT_INTERRUPTED
    assert proc.stdout == "first Ctrl-C: asked to stop\n"
    assert proc.stderr == ""


def test_the_handler_is_restored_after_the_block() -> None:
    before = signal.getsignal(signal.SIGINT)
    with interruptible() as stop:
        assert signal.getsignal(signal.SIGINT) is not before
        assert not stop.is_set()
    assert signal.getsignal(signal.SIGINT) is before


def test_an_interrupt_wrapped_by_a_library_is_recognized() -> None:
    try:
        try:
            raise KeyboardInterrupt
        except KeyboardInterrupt as inner:
            raise RuntimeError("wrapped") from inner
    except RuntimeError as exc:
        assert caused_by_interrupt(exc)
    assert not caused_by_interrupt(ValueError("plain"))
