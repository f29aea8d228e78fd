"""The live conformance probe (`swarm-node protocol conformance --peer`, SPEC.md 10.2, issue 28):
it passes against our own node (a real process on 127.0.0.1) and reports each failure of a
deliberately broken one."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from swarm_node.harness.process import NodeProcess

HERE = Path(__file__).resolve().parent


def probe(addr: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "swarm_node.commands.protocol", "conformance", "--peer", addr,
                           "--run-id", "probe-run", "--listen", "/ip4/127.0.0.1/tcp/0"],
                          capture_output=True, text=True, timeout=120, env={**os.environ, "OMP_NUM_THREADS": "1"})


@pytest.mark.slow
def test_the_probe_passes_our_node_and_reports_each_failure_of_a_broken_one(procs):
    good = procs(NodeProcess([sys.executable, str(HERE / "probe_target.py")]))
    bad = procs(NodeProcess([sys.executable, str(HERE / "probe_target.py"), "--broken"]))
    good_addr = good.wait_line("ADDR", timeout=60).split()[-1]
    bad_addr = bad.wait_line("ADDR", timeout=60).split()[-1]

    r = probe(good_addr)
    lines = r.stdout.strip().splitlines()
    assert r.returncode == 0, r.stdout + r.stderr
    assert lines[-1] == f"{len(lines) - 1} passed, 0 failed" and len(lines) - 1 >= 14
    assert all(line.startswith("PASS") for line in lines[:-1])

    r = probe(bad_addr)
    lines = r.stdout.strip().splitlines()
    failed = sorted(line.split("  ")[1].strip() for line in lines if line.startswith("FAIL"))
    assert r.returncode == 1, r.stdout + r.stderr
    assert failed == ["announce: other protocol -> wrong_protocol", "announce: other run -> wrong_run",
                      "fetch: offered packet"], r.stdout
    assert lines[-1].endswith("passed, 3 failed")


def test_conformance_needs_an_implementation_or_a_peer():
    r = subprocess.run([sys.executable, "-m", "swarm_node.commands.protocol", "conformance"], capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 2 and "give --impl" in r.stderr + r.stdout
    r = subprocess.run([sys.executable, "-m", "swarm_node.commands.protocol", "conformance", "--peer", "/ip4/127.0.0.1/tcp/1"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "/p2p/<peer id>" in r.stderr + r.stdout
