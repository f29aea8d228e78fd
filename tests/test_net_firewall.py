"""net/firewall.py: the kernel's per-source limit on new connections, against a real handshake flood.

The flood (harness/handshake_flood.py) makes p2pd answer Noise handshakes, each with a signature of its RSA
identity key, for 32 random bytes a try (a node's p2pd speaks Noise only: TLS let a stranger pick a costlier
answer); the limit is what `swarm-node firewall` installs."""

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import hivemind
import pytest

from swarm_node.harness.netns import Internet, unavailable
from swarm_node.net import firewall
from swarm_node.net.hivemind_internals import NodeP2P
from swarm_node.net.identity import load_or_create_identity

NETNS = unavailable()
needs_netns = pytest.mark.skipif(NETNS is not None, reason=f"network namespaces unavailable: {NETNS}")
PORT = 4011
P2PD = str(Path(hivemind.__file__).parent / "hivemind_cli" / "p2pd")  # the daemon every node runs, with a node's flags
P2PD_FLAGS = NodeP2P._make_process_args()
FLOOD_S = 6.0


def test_the_ruleset_names_the_port_rate_and_burst_and_refuses_what_cannot_work():
    script = firewall.ruleset(4001, rate=7, burst=9)
    assert "tcp dport 4001 ct state new" in script and "limit rate over 7/second burst 9 packets" in script
    assert script.count("delete table inet swarm_node_conn_limit_4001") == 1  # replaced whole
    for bad in (dict(port=0), dict(port=70000), dict(port=4001, rate=0), dict(port=4001, burst=0), dict(port=1, sources=0)):
        with pytest.raises(ValueError):
            firewall.ruleset(**bad)


def _cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _flood(host, target_ip: str, seconds: float, concurrency: int = 32, interval_s: float = 0.0) -> subprocess.Popen:
    argv = [sys.executable, "-m", "swarm_node.harness.handshake_flood", "--host", target_ip, "--port", str(PORT),
            "--seconds", str(seconds), "--concurrency", str(concurrency), "--interval", str(interval_s), "--timeout", "2",
            "--security", "noise"]
    return subprocess.Popen(host.cmd(argv), stdout=subprocess.PIPE, text=True)


def _flood_costs(node_host, attacker, honest, daemon_pid: int) -> tuple[dict, float, dict]:
    """(the attacker's counts, p2pd's CPU seconds a second during the flood, an honest host's counts meanwhile)."""
    cpu0, t0 = _cpu_s(daemon_pid), time.monotonic()
    attack = _flood(attacker, node_host.ip, FLOOD_S)
    probe = _flood(honest, node_host.ip, FLOOD_S, concurrency=1, interval_s=0.5)  # an honest dialer's pace
    out_attack, out_probe = attack.communicate(timeout=60)[0], probe.communicate(timeout=60)[0]
    cpu = (_cpu_s(daemon_pid) - cpu0) / (time.monotonic() - t0)
    return json.loads(out_attack), cpu, json.loads(out_probe)


@needs_netns
@pytest.mark.slow
def test_a_handshake_flood_costs_p2pd_a_core_until_the_limit_drops_it_in_the_kernel_and_others_still_connect(tmp_path):
    _, identity = load_or_create_identity(None)
    (tmp_path / "id").write_bytes(identity)
    with Internet(f"fw{os.getpid() % 1000}") as net:
        node, attacker, honest = net.host("node"), net.host("attacker"), net.host("honest")
        daemon = subprocess.Popen(node.cmd([P2PD, *P2PD_FLAGS, "-id", str(tmp_path / "id"), "-hostAddrs", f"/ip4/{node.ip}/tcp/{PORT}",
                                            "-listen", f"/unix{tmp_path}/ctl.sock", "-q"]),
                                  stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            ready = time.monotonic() + 30
            while json.loads(_flood(honest, node.ip, 0.5, 1).communicate(timeout=30)[0])["answered"] == 0:
                assert time.monotonic() < ready, "p2pd did not answer a handshake within 30 s"
            open_attack, open_cpu, _ = _flood_costs(node, attacker, honest, daemon.pid)
            limit = node.run(sys.executable, "-m", "swarm_node", "firewall", "--port", str(PORT))
            assert "at most 10 new connections a second" in limit.stdout
            limited_attack, limited_cpu, probe = _flood_costs(node, attacker, honest, daemon.pid)
            table = node.run("nft", "list", "table", "inet", firewall.table_name(PORT)).stdout
            # room for one source's bucket, taken by the honest host: the attacker, left out, shares the overflow one
            (tmp_path / "one.nft").write_text(firewall.ruleset(PORT, sources=1))
            node.run("nft", "-f", str(tmp_path / "one.nft"))
            assert json.loads(_flood(honest, node.ip, 0.5, 1, interval_s=1.0).communicate(timeout=30)[0])["answered"] == 1
            _, overflow_cpu, _ = _flood_costs(node, attacker, honest, daemon.pid)
            node.run(sys.executable, "-m", "swarm_node", "firewall", "--port", str(PORT), "--remove")
            gone = node.run("nft", "list", "table", "inet", firewall.table_name(PORT), check=False)
        finally:
            daemon.kill()
            daemon.wait()
    print(f"\nhandshake flood {FLOOD_S:.0f} s: open {open_attack} p2pd {open_cpu:.2f} core; limited {limited_attack} "
          f"p2pd {limited_cpu:.2f} core; honest host meanwhile {probe}; the attacker in the overflow bucket: p2pd "
          f"{overflow_cpu:.2f} core")
    assert open_cpu > 0.3  # each try cost p2pd an X25519 product and an RSA signature
    dropped = sum(int(line.split("counter packets ")[1].split()[0]) for line in table.splitlines() if "counter packets " in line)
    assert dropped > 10 * FLOOD_S  # the kernel refused the attacker's SYNs ...
    assert limited_cpu < open_cpu / 3  # ... before p2pd spent anything on them
    assert overflow_cpu < open_cpu / 3  # a full set of sources does not switch the limit off
    assert probe["answered"] >= probe["tried"] - 1 >= 5  # another address, at an honest pace, is answered throughout
    assert gone.returncode != 0  # --remove deleted the table
