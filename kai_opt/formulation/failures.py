"""Words for a forked worker's failure (kai_opt.plan.FAILURE_KINDS): how a process ended, the gist of a traceback."""

from __future__ import annotations

import signal


def exit_reason(code: int | None) -> str:
    """How a process that sent nothing ended: its signal (SIGKILL is also the kernel's out-of-memory killer) or
    exit code; None: it still runs (its end of the pipe closed, or the pipe broke)."""
    if code is None:
        return "still running with its pipe closed or broken"
    if code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = f"signal {-code}"
        return f"killed by {name}" + (" (or out of memory)" if -code == signal.SIGKILL else "")
    return f"exit code {code}"


def last_line(trace: str) -> str:
    """The exception line of a formatted traceback (its last non-empty line), at most 300 characters."""
    lines = [line for line in trace.strip().splitlines() if line.strip()]
    return (lines[-1].strip() if lines else "no traceback")[:300]
