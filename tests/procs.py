"""The `procs` fixture: real child processes for end-to-end tests, through swarm_node.harness.

`procs(NodeProcess(...))` starts a process (`swarm-node join` nodes, helper programs) in its own
process group and registers it; at teardown every one is killed and the fixture checks that no
node and no p2pd daemon outlives the test.
"""

from __future__ import annotations

import time

import psutil
import pytest

from swarm_node.harness.process import NodeProcess


@pytest.fixture
def procs():
    """`procs(NodeProcess(...))` starts and registers a process; all are killed and checked for leftovers at teardown."""
    started: list[NodeProcess] = []

    def start(proc: NodeProcess) -> NodeProcess:
        started.append(proc)
        return proc.start() if proc.popen is None else proc

    yield start
    for proc in started:
        proc.kill()
    time.sleep(0.5)
    leftovers = [p for p in psutil.process_iter(["cmdline"]) if "p2pd" in " ".join(p.info["cmdline"] or [])
                 and any(proc.pid in [q.pid for q in p.parents()] for proc in started)]
    assert leftovers == []  # no node and no p2pd outlives the test
