"""A node process: a `swarm-node` command (or any helper program) in its own process group, with its log.

One class for the demo, the tests and the benchmarks. A node is known only by what it writes in
its --out directory (status.json, metrics.jsonl) and its console output, never by its log lines'
meaning:

    proc = NodeProcess.join(["--peers", addr], out).start()   # `swarm-node join --out OUT` on 127.0.0.1
    proc.address()              # its join address, from OUT/status.json written by this very process
    proc.rows()                 # OUT/metrics.jsonl
    stop_processes([proc])      # SIGINT, then SIGTERM and SIGKILL to its group, then any descendant left

Each process runs in its own session (process group), so a terminal Ctrl-C reaches only the
program that started it, which then stops its children in order. Output goes to `log` (default
OUT/console.log); without a log file it is collected in memory.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Callable

from swarm_node.metrics import read_metrics
from swarm_node.status import wait_for_status

REPO = Path(__file__).resolve().parents[2]
LOCAL = ["--host-maddrs", "/ip4/127.0.0.1/tcp/0"]
CHILD_ENV = {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false",
             "PYTHONUNBUFFERED": "1", "HF_HUB_DISABLE_PROGRESS_BARS": "1"}


class NodeFailed(RuntimeError):
    """A node process exited, or did not get where it was awaited in time; the message says which,
    with the last lines of its output. `exited` tells the two apart."""

    def __init__(self, message: str, exited: bool):
        super().__init__(message)
        self.exited = exited


def child_env() -> dict[str, str]:
    """The environment of node processes: one torch thread, unbuffered output, this repository importable."""
    env = {**os.environ, **CHILD_ENV}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    return env


def kept_identity(directory: Path, name: str) -> Path:
    """`directory/name.key`: a node's peer id kept across runs (so paired runs answer the same public
    schedule), without the neighbours its last run remembered (`.anchors`, net/hivemind.py): they are gone."""
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"{name}.key"
    Path(f"{path}.anchors").unlink(missing_ok=True)
    return path


def swarm_node_argv(command: str, *args: str) -> list[str]:
    """The command line of `swarm-node COMMAND ARGS` in this interpreter."""
    return [sys.executable, "-m", "swarm_node", command, *args]


class NodeProcess:
    """One child process in its own session; `start()` runs it, the rest reads what it wrote."""

    def __init__(self, argv: list[str], out: Path | None = None, log: Path | None = None, name: str | None = None):
        self.argv, self.out = list(argv), Path(out) if out is not None else None
        self.log = Path(log) if log is not None else (self.out / "console.log" if self.out is not None else None)
        self.name = name or (self.out.name if self.out is not None else " ".join(self.argv[1:3]))
        self.popen: subprocess.Popen | None = None
        self.descendants: dict = {}  # pid -> psutil.Process, refreshed by remember_descendants
        self._log_file, self._log_from = None, 0  # its output starts at this offset of the log
        self._memory: list[str] = []  # the output, when there is no log file

    @classmethod
    def join(cls, args: list[str], out: Path, listen: list[str] = LOCAL) -> NodeProcess:
        """`swarm-node join --out OUT` listening on `listen` (default: a free port on 127.0.0.1), not started."""
        return cls(swarm_node_argv("join", "--out", str(out), *listen, *args), out)

    def start(self, env: dict[str, str] | None = None, cwd: Path | None = None) -> NodeProcess:
        """Run it in a new session (env: `child_env()` unless given); returns self."""
        if self.out is not None:
            self.out.mkdir(parents=True, exist_ok=True)
        if self.log is not None:
            self._log_file = open(self.log, "ab")
            self._log_from = self._log_file.tell()
        self.popen = subprocess.Popen(self.argv, stdout=self._log_file or subprocess.PIPE, stderr=subprocess.STDOUT,
                                      stdin=subprocess.DEVNULL, env=env or child_env(), cwd=cwd,
                                      start_new_session=True)
        if self._log_file is None:
            threading.Thread(target=self._collect, daemon=True).start()
        return self

    def _collect(self) -> None:
        for line in self.popen.stdout:
            self._memory.append(line.decode(errors="replace"))

    # ---- what it wrote ---------------------------------------------------------------------------
    @property
    def pid(self) -> int:
        return self.popen.pid

    def poll(self) -> int | None:
        return self.popen.poll()

    @property
    def lines(self) -> list[str]:
        """Its output so far, line by line (with their newlines)."""
        if self.log is None:
            return list(self._memory)
        try:
            with open(self.log, "rb") as f:
                f.seek(self._log_from)
                return f.read().decode(errors="replace").splitlines(keepends=True)
        except OSError:
            return []

    def text(self, last: int = 60) -> str:
        return "".join(self.lines[-last:]) or "(no output)"

    def wait_line(self, marker: str, timeout: float = 120) -> str:
        """The first output line holding `marker`."""
        deadline = time.monotonic() + timeout
        while True:
            line = next((x for x in self.lines if marker in x), None)
            if line is not None:
                return line
            if self.poll() is not None:
                raise NodeFailed(f"{self.name} exited (code {self.popen.returncode}) before printing {marker!r}:\n"
                                 f"{self.text()}", exited=True)
            if time.monotonic() > deadline:
                raise NodeFailed(f"{self.name} printed no {marker!r} line in {timeout:.0f} s:\n{self.text()}", exited=False)
            time.sleep(0.2)

    def status(self, ready: Callable[[dict], bool], timeout: float = 120, what: str = "its status was ready",
               tick: Callable[[], None] = lambda: None) -> dict:
        """Its OUT/status.json once `ready(status)` holds (a status left by an earlier process in the
        same --out does not count); `tick()` runs while waiting."""
        def alive() -> bool:
            tick()
            return self.poll() is None

        try:
            return wait_for_status(self.out, lambda s: s.get("pid") == self.popen.pid and ready(s), timeout, alive=alive)
        except TimeoutError:
            raise NodeFailed(f"node {self.name}: still waiting for {what} after {timeout:.0f} s; see {self.log}",
                             exited=False) from None
        except RuntimeError:  # wait_for_status: the process exited first
            raise NodeFailed(f"node {self.name} exited (code {self.popen.returncode}) before {what}; last lines of "
                             f"{self.log or 'its output'}:\n{self.text(15)}", exited=True) from None

    def address(self, timeout: float = 120) -> str:
        """The node's join address (what others pass to --peers), once its swarm is up."""
        return self.status(lambda s: bool(s.get("join_addrs")), timeout, "its swarm started")["join_addrs"][0]

    def rows(self) -> list[dict]:
        """Its OUT/metrics.jsonl rows so far."""
        path = self.out / "metrics.jsonl"
        return read_metrics(path) if path.exists() else []

    def wait_rows(self, pred: Callable[[list[dict]], bool], timeout: float, what: str) -> list[dict]:
        deadline = time.monotonic() + timeout
        while not pred(rows := self.rows()):
            if self.poll() is not None:
                raise NodeFailed(f"{self.name} exited while waiting for {what}:\n{self.text()}", exited=True)
            if time.monotonic() > deadline:
                raise NodeFailed(f"timed out waiting for {what}:\n{self.text()}", exited=False)
            time.sleep(0.2)
        return rows

    def wait(self, timeout: float) -> int:
        """Its exit code, once it exits by itself within `timeout`."""
        try:
            return self.popen.wait(timeout)
        except subprocess.TimeoutExpired:
            raise NodeFailed(f"{self.name} did not finish in {timeout:.0f} s:\n{self.text()}", exited=False) from None

    # ---- stopping ---------------------------------------------------------------------------------
    def kill(self) -> None:
        """SIGKILL its process group at once (no clean shutdown)."""
        if self.popen is not None and self.popen.poll() is None:
            os.killpg(self.popen.pid, signal.SIGKILL)
            self.popen.wait(10)
        self.close_log()

    def stop(self, grace_int: float = 15.0, grace_term: float = 5.0) -> int | None:
        """Stop it and all it started (see `stop_processes`); its exit code."""
        stop_processes([self], grace_int, grace_term)
        return self.popen.returncode if self.popen is not None else None

    def close_log(self) -> None:
        if self._log_file is not None:
            self._log_file.close()
            self._log_file = None


def remember_descendants(procs: list[NodeProcess]) -> None:
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


def _signal_and_wait(running: list[NodeProcess], sig: signal.Signals, grace: float, group: bool,
                     hurry: Callable[[], bool]) -> list[NodeProcess]:
    """Send `sig` to each running node (or its process group); wait up to `grace`; returns those still running."""
    for p in running:
        try:
            os.killpg(p.popen.pid, sig) if group else os.kill(p.popen.pid, sig)
        except (ProcessLookupError, PermissionError):
            pass
    deadline = time.monotonic() + (0.5 if hurry() and sig != signal.SIGKILL else grace)
    while running and time.monotonic() < deadline:
        running = [p for p in running if p.popen.poll() is None]
        if hurry() and sig != signal.SIGKILL:
            break
        time.sleep(0.1)
    return [p for p in running if p.popen.poll() is None]


def _kill_descendants(procs: list[NodeProcess]) -> None:
    import psutil

    for p in procs:  # p2pd and anything else a node started, if it outlived its node
        for child in p.descendants.values():
            try:
                if child.is_running():
                    child.kill()
            except psutil.Error:
                pass
        p.close_log()


def stop_processes(procs: list[NodeProcess], grace_int: float = 15.0, grace_term: float = 5.0,
                   hurry: Callable[[], bool] = lambda: False) -> None:
    """Stop every node process and everything it started: SIGINT (the node closes its swarm and
    p2pd itself), then SIGTERM and SIGKILL to its process group, then any remembered descendant
    still alive. Once `hurry()` holds, the remaining grace periods are skipped."""
    remember_descendants(procs)
    running = [p for p in procs if p.popen is not None and p.popen.poll() is None]
    for sig, grace, group in ((signal.SIGINT, grace_int, False), (signal.SIGTERM, grace_term, True),
                              (signal.SIGKILL, 5.0, True)):
        running = _signal_and_wait(running, sig, grace, group, hurry)
        if not running:
            break
    _kill_descendants(procs)
