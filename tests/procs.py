"""Real child processes for end-to-end tests: `swarm-node join` nodes and helper scripts.

`Proc` starts a command in its own process group, collects its output in the background and
reads the files a node writes in its --out directory (status.json, metrics.jsonl), never its log
lines; the `procs` fixture kills whatever a test started and checks that no node and
no p2pd daemon outlives it.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import psutil
import pytest

from swarm_node.metrics import read_metrics
from swarm_node.status import wait_for_status

LOCAL = ["--host-maddrs", "/ip4/127.0.0.1/tcp/0"]


class Proc:
    """A child process (its own process group) whose output is collected in the background."""

    def __init__(self, argv: list[str], out: Path | None = None):
        self.out, self.lines = out, []
        env = {**os.environ, "OMP_NUM_THREADS": "1"}
        self.proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
                                     start_new_session=True)
        threading.Thread(target=self._read, daemon=True).start()

    @classmethod
    def join(cls, args: list[str], out: Path, listen: list[str] = LOCAL) -> "Proc":
        """`swarm-node join --out OUT` listening on `listen` (default: a free port on 127.0.0.1)."""
        return cls([sys.executable, "-m", "swarm_node", "join", "--out", str(out), *listen, *args], out)

    def _read(self):
        for line in self.proc.stdout:
            self.lines.append(line)

    def text(self, last: int = 60) -> str:
        return "".join(self.lines[-last:])

    def wait_line(self, marker: str, timeout: float = 120) -> str:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for line in self.lines:
                if marker in line:
                    return line
            assert self.proc.poll() is None, self.text()
            time.sleep(0.2)
        raise AssertionError(f"no {marker!r} line:\n{self.text()}")

    def status(self, ready, timeout: float = 120, what: str = "its status") -> dict:
        """This process's OUT/status.json once `ready(status)` holds (a status left by an earlier
        process in the same --out does not count)."""
        try:
            return wait_for_status(self.out, lambda s: s.get("pid") == self.proc.pid and ready(s), timeout,
                                   alive=lambda: self.proc.poll() is None)
        except (TimeoutError, RuntimeError) as e:
            raise AssertionError(f"waiting for {what}: {e}\n{self.text()}") from None

    def address(self) -> str:
        """The node's join address (what others pass to --peers), once its swarm is up."""
        return self.status(lambda s: bool(s.get("join_addrs")), what="its join address")["join_addrs"][0]

    def rows(self) -> list[dict]:
        path = self.out / "metrics.jsonl"
        return read_metrics(path) if path.exists() else []

    def wait_rows(self, pred, timeout: float, what: str):
        deadline = time.monotonic() + timeout
        while not pred(self.rows()):
            assert time.monotonic() < deadline, f"timed out waiting for {what}:\n{self.text()}"
            assert self.proc.poll() is None, f"exited while waiting for {what}:\n{self.text()}"
            time.sleep(0.2)
        return self.rows()

    def wait(self, timeout: float) -> int:
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"did not finish in {timeout}s:\n{self.text()}") from None

    def kill(self):
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(10)


@pytest.fixture
def procs():
    """`procs(Proc(...))` registers a process; all are killed and checked for leftovers at teardown."""
    started: list[Proc] = []

    def start(proc: Proc) -> Proc:
        started.append(proc)
        return proc

    yield start
    for proc in started:
        proc.kill()
    time.sleep(0.5)
    leftovers = [p for p in psutil.process_iter(["cmdline"]) if "p2pd" in " ".join(p.info["cmdline"] or [])
                 and any(proc.proc.pid in [q.pid for q in p.parents()] for proc in started)]
    assert leftovers == []  # no node and no p2pd outlives the test
