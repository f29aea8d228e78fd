"""The demo's node processes: start them in their own sessions, and stop them (and all they started).

Node processes run in their own sessions (process groups), so a terminal Ctrl-C reaches only the
demo process, which stops them in order: SIGINT (the node shuts its p2pd down and exits), then
SIGTERM, then SIGKILL to the whole group, then any descendant that survived. `SIGNALS` turns
SIGINT/SIGTERM into `Interrupted` except while a child is being started and recorded.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from swarm_node.status import wait_for_status

REPO = Path(__file__).resolve().parents[2]
CHILD_ENV = {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false",
             "PYTHONUNBUFFERED": "1", "HF_HUB_DISABLE_PROGRESS_BARS": "1"}


class DemoError(RuntimeError):
    """The demo cannot go on (a node failed, the swarm did not start); the message says why."""


class Interrupted(Exception):
    """SIGINT / SIGTERM received by the demo process."""


class _Signals:
    """SIGINT/SIGTERM -> `Interrupted`, except inside `critical()` (starting a child and recording
    its pid), where the signal is held until the section ends, so no child is ever left untracked;
    and while stopping children, where a second Ctrl-C only says "hurry" (skip the grace periods)."""

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


@dataclass
class NodeProc:
    """One node process of the demo: its spec (`run.NodeSpec`), output directory and command line."""

    spec: object
    out: Path
    argv: list[str]
    popen: subprocess.Popen | None = None
    log_file: object = None
    descendants: dict = field(default_factory=dict)  # pid -> psutil.Process, refreshed while it runs

    @property
    def name(self) -> str:
        return self.spec.name if self.spec is not None else self.out.name


STARTED: list[NodeProc] = []  # every node process this demo started, stopped again on the way out


def child_env() -> dict[str, str]:
    """The environment of node processes: one torch thread, unbuffered output, this repository importable."""
    env = {**os.environ, **CHILD_ENV}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    return env


def start(proc: NodeProc) -> None:
    """Start `proc` in its own session, output to OUT/console.log, recorded in STARTED first."""
    proc.out.mkdir(parents=True, exist_ok=True)
    with SIGNALS.critical():
        STARTED.append(proc)
        proc.log_file = open(proc.out / "console.log", "ab")
        proc.popen = subprocess.Popen(proc.argv, stdout=proc.log_file, stderr=subprocess.STDOUT,
                                      stdin=subprocess.DEVNULL, env=child_env(), start_new_session=True)


def tail(path: Path, lines: int = 15) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no output)"


def wait_until_up(proc: NodeProc, timeout: float, tick=lambda: None) -> dict:
    """The node's status (OUT/status.json, written by this very process) once its swarm is up
    (`join_addrs` known) and its model loaded (`params` known); `tick()` runs while waiting."""

    def up(status: dict) -> bool:
        return status.get("pid") == proc.popen.pid and bool(status.get("join_addrs")) \
            and status.get("params") is not None

    def alive() -> bool:
        tick()
        return proc.popen.poll() is None

    log = proc.out / "console.log"
    try:
        return wait_for_status(proc.out, up, timeout, alive=alive)
    except TimeoutError:
        raise DemoError(f"node {proc.name} did not start its swarm within {timeout:.0f} s; see {log}") from None
    except RuntimeError:  # wait_for_status: the process exited first
        raise DemoError(f"node {proc.name} exited (code {proc.popen.returncode}) before its swarm started; "
                        f"last lines of {log}:\n{tail(log)}") from None


def remember_descendants(procs: list[NodeProc]) -> None:
    """Note every process the nodes started (p2pd), so they can be killed even if they leave the group."""
    import psutil

    for p in procs:
        if p.popen is None or p.popen.poll() is not None:
            continue
        try:
            for child in psutil.Process(p.popen.pid).children(recursive=True):
                p.descendants.setdefault(child.pid, child)
        except psutil.Error:
            pass


def _signal_and_wait(running: list[NodeProc], sig: signal.Signals, grace: float, group: bool) -> list[NodeProc]:
    """Send `sig` to each running node (or its process group); wait up to `grace`; returns those still running."""
    for p in running:
        try:
            os.killpg(p.popen.pid, sig) if group else os.kill(p.popen.pid, sig)
        except (ProcessLookupError, PermissionError):
            pass
    deadline = time.monotonic() + (0.5 if SIGNALS.hurry and sig != signal.SIGKILL else grace)
    while running and time.monotonic() < deadline:
        running = [p for p in running if p.popen.poll() is None]
        if SIGNALS.hurry and sig != signal.SIGKILL:
            break
        time.sleep(0.1)
    return [p for p in running if p.popen.poll() is None]


def _kill_descendants(procs: list[NodeProc]) -> None:
    import psutil

    for p in procs:  # p2pd and anything else a node started, if it outlived its node
        for child in p.descendants.values():
            try:
                if child.is_running():
                    child.kill()
            except psutil.Error:
                pass
        if p.log_file is not None:
            p.log_file.close()
            p.log_file = None


def stop_processes(procs: list[NodeProc], grace_int: float = 15.0, grace_term: float = 5.0) -> None:
    """Stop every node process and everything it started: SIGINT (the node closes its swarm and
    p2pd itself), then SIGTERM and SIGKILL to its process group, then any remembered descendant
    still alive. A Ctrl-C meanwhile skips the remaining grace periods."""
    SIGNALS.stopping = True
    try:
        remember_descendants(procs)
        running = [p for p in procs if p.popen is not None and p.popen.poll() is None]
        for sig, grace, group in ((signal.SIGINT, grace_int, False), (signal.SIGTERM, grace_term, True),
                                  (signal.SIGKILL, 5.0, True)):
            running = _signal_and_wait(running, sig, grace, group)
            if not running:
                break
        _kill_descendants(procs)
    finally:
        SIGNALS.stopping = SIGNALS.hurry = False
        SIGNALS.pending = None


def stop_all_started() -> None:
    """Stop every node this demo started, even if signals keep arriving meanwhile."""
    while True:  # a signal can land between two statements of a finally block: make sure
        try:
            stop_processes(STARTED)
            break
        except Interrupted:
            continue
    STARTED.clear()
