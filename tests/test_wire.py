"""The userspace netem (harness/netem.py) that harness/netns.py puts on a host's link: the delay it adds is
measured on the wire, frames keep their order under jitter, and TCP crosses it intact at full size."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from swarm_node.harness.netns import Internet, measure_link, unavailable

NETNS = unavailable()
pytestmark = [pytest.mark.slow, pytest.mark.skipif(NETNS is not None, reason=f"network namespaces unavailable: {NETNS}")]

_RECEIVE_ORDER = """import socket
u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); u.bind(("0.0.0.0", 5103)); u.settimeout(5)
print("ready", flush=True); got = []
try:
    while True: got.append(int(u.recv(64))); u.settimeout(1)
except socket.timeout: pass
print(" ".join(map(str, got)))"""
_SEND_ORDER = """import socket, sys, time
u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
for i in range(400): u.sendto(str(i).encode(), (sys.argv[1], 5103)); time.sleep(0.001)"""


def test_delay_is_measured_on_the_wire_and_frames_keep_their_order():
    with Internet(f"wire{os.getpid() % 1000}") as net:
        to, delayed, nat = net.host("to"), net.host("d"), net.nat_host("n")
        before = measure_link(delayed, nat, to)
        net.shape(delayed, delay_ms=60, jitter_ms=20, seed=1)
        net.shape(nat, delay_ms=30, seed=2)
        after = measure_link(delayed, nat, to)
        behind_nat = measure_link(nat, delayed, to)
        print(before, after, behind_nat, net.netem_stats())
        assert before["rtt_ms"] < 5
        assert 50 <= after["rtt_ms"] <= 90  # 60 ms +- 20 one way, nothing the other way
        assert 25 <= behind_nat["rtt_ms"] <= 60  # the NAT router's link carries the delay
        assert after["measured_kbit"] > 2000 and after["udp_lost_frac"] == 0  # 1 MB of TCP crossed intact

        receiver = subprocess.Popen(to.cmd([sys.executable, "-c", _RECEIVE_ORDER]), stdout=subprocess.PIPE, text=True)
        receiver.stdout.readline()
        subprocess.run(delayed.cmd([sys.executable, "-c", _SEND_ORDER, to.ip]), check=True, timeout=60)
        got = [int(x) for x in receiver.communicate(timeout=60)[0].split()]
        assert got == list(range(400))  # 1 ms apart under +-20 ms of jitter: netem would reorder them
        stats = net.netem_stats()
        assert stats[delayed.port]["delayed"] > 400 and stats[delayed.port]["dropped"] == 0
