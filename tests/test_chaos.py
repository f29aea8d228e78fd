"""Chaos soak, short: bench/chaos.py's "test" profile as a slow test (docs/RELIABILITY.md "Chaos soak").

Four `swarm-node join` nodes in network namespaces (one behind NAT, through a relay) and a hostile
peer, on delayed, lossy links (one also rate-limited), through a kill -9 + --resume, a freeze, a
partition and a full checkpoint disk; every invariant the soak checks must hold, each node's
held-out accuracy included. The benchmark runs as a program (`python -m bench.chaos`); this test
reads its JSON report. About 4-5 minutes on 2 cores.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from swarm_node.harness.netns import unavailable
from swarm_node.harness.process import NodeProcess

ROOT = Path(__file__).resolve().parents[1]
NETNS = unavailable()


@pytest.mark.slow
@pytest.mark.skipif(NETNS is not None, reason=f"network namespaces unavailable: {NETNS}")
def test_chaos_soak_loses_nothing(tmp_path):
    report = tmp_path / "chaos.json"
    soak = NodeProcess([sys.executable, "-m", "bench.chaos", "--profile", "test", "--seed", "0",
                        "--work", str(tmp_path / "soak"), "--out", str(report)], log=tmp_path / "chaos.log")
    try:
        soak.start(cwd=ROOT).wait(900)
    finally:
        soak.stop(grace_int=120)  # a Ctrl-C: the soak stops its nodes and deletes its namespaces
        print(soak.text(200))  # its log lines, then one PASS/FAIL line per invariant
    assert report.exists(), f"bench/chaos.py wrote no report (exit code {soak.popen.returncode})"
    result = json.loads(report.read_text())["results"]
    faults = {e["fault"] for e in result["events"]}
    assert faults == {"kill", "freeze", "split", "disk"}, result["events"]
    links = result["links"]
    assert links["measured_kbit"] < 1.1 * links["tbf_rate_kbit"]  # the rate limit holds
    assert links["udp_lost_frac"] > 0  # the loss rule drops
    assert links["rtt_ms"] >= links["rtt_expected_ms"] - 2 * links["jitter_ms"]  # the links are delayed
    failed = [f"{i['name']}: {i['figure']}" for i in result["invariants"] if not i["ok"]]
    assert not failed, "\n".join(failed)
