"""The live-Sybil harness (swarm_node/harness/sybils.py) as bench/redteam_eclipse.py --prestart uses it: hosts
started before the victim exists, that dial it only once a file names it. Real processes, real libp2p."""
from __future__ import annotations

import json
import subprocess
import sys
import time

from swarm_node.config import SwarmConfig
from swarm_node.net.hivemind import HivemindTransport

LOCAL = ["/ip4/127.0.0.1/tcp/0"]
TOKENIZER = "sha256:" + "1" * 64


def test_prestarted_sybils_wait_for_the_peers_file_then_take_the_victims_slots_without_linking_each_other(tmp_path):
    """Two Sybil processes (2 hosts and 1), as one per network namespace would be: nobody dials the
    victim before the file names it; then every Sybil does, and none links to another."""
    victims = tmp_path / "victims.txt"
    procs = [subprocess.Popen([sys.executable, "-m", "swarm_node.harness.sybils", "--k", str(k), "--peers-file",
                               str(victims), "--run-id", "prestart", "--seconds", "90",
                               "--summary", str(tmp_path / f"summary{k}.json")],
                              stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True) for k in (2, 1)]
    victim = HivemindTransport(SwarmConfig(run_id="prestart", host_maddrs=LOCAL), model_id="sybil", tokenizer=TOKENIZER)
    try:
        ids = [i for p in procs for i in p.stdout.readline().split()[1:]]  # SYBILS <id> ...: every host is up
        addrs = [a for p in procs for a in p.stdout.readline().split()[1:]]  # ADDRS <multiaddr> ...
        assert len(ids) == 3 and [a.rsplit("/", 1)[1] for a in addrs] == ids
        victim.start()
        time.sleep(3)
        assert victim.neighbours() == {}  # nobody named the victim yet: no Sybil dials it
        (tmp_path / "v.tmp").write_text(victim.join_addrs()[0] + "\n" + "".join(f"sybil {a}\n" for a in addrs))
        (tmp_path / "v.tmp").rename(victims)
        deadline = time.monotonic() + 30
        while set(victim.neighbours()) != set(ids) and time.monotonic() < deadline:
            time.sleep(0.5)
        assert set(victim.neighbours()) == set(ids)
        victim.publish(1, 1)  # the Sybils follow the victim's round and write whom each holds
        summaries = [tmp_path / f"summary{k}.json" for k in (2, 1)]
        while time.monotonic() < deadline and not all(
                s.exists() and "1" in json.loads(s.read_text())["rounds"] for s in summaries):
            time.sleep(0.5)
        held = {s: n for path in summaries for s, n in json.loads(path.read_text())["rounds"]["1"].items()}
        assert held == {s: [victim.peer_id] for s in ids}  # they know each other, yet never linked
    finally:
        for p in procs:
            p.terminate()
            p.wait(20)
        victim.close()
