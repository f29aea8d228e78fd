"""Signals of a program that runs node processes (the demo): no child is ever left behind.

Its node processes run in their own sessions, so a terminal Ctrl-C reaches only this program,
which stops them in order (`process.stop_processes`). `SIGNALS` turns SIGINT/SIGTERM into
`Interrupted`, except while a child is being started and recorded in `STARTED` (`start`), and
while children are being stopped, where a second Ctrl-C only says "hurry" (skip the grace periods).
"""

from __future__ import annotations

import contextlib
import signal
import threading

from swarm_node.harness.process import NodeProcess, stop_processes


class Interrupted(Exception):
    """SIGINT / SIGTERM received by this program."""


class _Signals:
    """SIGINT/SIGTERM -> `Interrupted`, except inside `critical()` (starting a child and recording
    its pid), where the signal is held until the section ends, so no child is ever left untracked;
    and while stopping children, where a second Ctrl-C only sets `hurry`."""

    def __init__(self):
        self.critical_depth, self.pending, self.stopping, self.hurry = 0, None, False, False

    def handler(self, signum, frame):
        if self.stopping:
            self.hurry = True
        elif self.critical_depth:
            self.pending = signum
        else:
            raise Interrupted(signal.Signals(signum).name)

    @contextlib.contextmanager
    def critical(self):
        self.critical_depth += 1
        try:
            yield
        finally:
            self.critical_depth -= 1
            if not self.critical_depth and self.pending is not None and not self.stopping:
                signum, self.pending = self.pending, None
                raise Interrupted(signal.Signals(signum).name)

    @contextlib.contextmanager
    def installed(self):
        if threading.current_thread() is not threading.main_thread():
            yield
            return
        previous = {s: signal.signal(s, self.handler) for s in (signal.SIGINT, signal.SIGTERM)}
        try:
            yield
        finally:
            for s, handler in previous.items():
                signal.signal(s, handler)


SIGNALS = _Signals()
STARTED: list[NodeProcess] = []  # every node process this program started, stopped again on the way out


def start(proc: NodeProcess) -> NodeProcess:
    """Start `proc`, recorded in STARTED first, with no signal in between."""
    with SIGNALS.critical():
        STARTED.append(proc)
        return proc.start()


def stop(procs: list[NodeProcess], grace_int: float = 15.0, grace_term: float = 5.0) -> None:
    """`stop_processes`, where a Ctrl-C meanwhile skips the remaining grace periods."""
    SIGNALS.stopping = True
    try:
        stop_processes(procs, grace_int, grace_term, hurry=lambda: SIGNALS.hurry)
    finally:
        SIGNALS.stopping = SIGNALS.hurry = False
        SIGNALS.pending = None


def stop_all_started() -> None:
    """Stop every node this program started, even if signals keep arriving meanwhile."""
    while True:  # a signal can land between two statements of a finally block: make sure
        try:
            stop(STARTED)
            break
        except Interrupted:
            continue
    STARTED.clear()
