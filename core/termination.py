"""A termination signal as an exception, so that a long job stopped from outside unwinds like one
that failed: open MLflow runs are ended (FAILED, not left RUNNING for ever in the UI), ``finally``
blocks and context managers run, and the stages already written stay for the next run to resume.

    exit_on_termination()   # once, in a command's main, before the work starts
"""
from __future__ import annotations

import signal
import sys

TERMINATION_SIGNALS = (signal.SIGTERM, signal.SIGHUP)  # kill's default; a closed terminal


def _exit(signal_number: int, frame) -> None:
    name = signal.Signals(signal_number).name
    print(f"stopped by {name}: ending open runs; finished stages stay for the next run", file=sys.stderr)
    raise SystemExit(128 + signal_number)  # the shell's exit status for a process a signal ended


def exit_on_termination() -> None:
    """Turn TERMINATION_SIGNALS into SystemExit in the main thread (the only thread Python hands signals to)."""
    for signal_number in TERMINATION_SIGNALS:
        signal.signal(signal_number, _exit)
