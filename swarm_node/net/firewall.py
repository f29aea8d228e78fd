"""A per-source limit on new TCP connections to the node's port, in the kernel (nftables), before p2pd.

Every inbound libp2p connection makes p2pd answer a security handshake, for bytes a stranger built once. A
node's p2pd speaks Noise only (hivemind_internals.NodeP2P: TLS let a stranger pick a costlier answer), whose
answer carries a signature of the node's identity key, RSA-2048 since the key is also the DHT record key
(identity.py): 32 random bytes after `/multistream/1.0.0` and `/noise` buy it. Measured (red team 26 and
session 36, 2-core AMD EPYC, bare p2pd on 127.0.0.1): 2.3 ms of p2pd per such attempt against 0.45 ms of a
pure-Python attacker; full connections from fresh ids at ~190/s took a node's rounds to 0.29-0.53x
(bench/handshake_cost.py measures each handshake). Nothing above the socket can refuse them: the shield
(shield.py) acts on protocol ids, which a connection never reaches, and hivemind's p2pd has no per-address
limit (its connection manager trims old connections, it does not slow new ones).

So the refusal happens where it is cheapest: the kernel drops a SYN to our port from a source that opened more
than `rate` new connections a second (after a burst of `burst`), per IPv4 address and per IPv6 /64. An honest
peer opens one connection and keeps it; a whole NAT's worth of peers fit in the defaults. The rule lives in a
table of its own (`table_name`), replaced whole by `apply` and deleted by `remove`; it needs root
(CAP_NET_ADMIN) and nftables, and the node must listen on a fixed port (`--port`). The bound, in plain words:
one address costs the node at most `rate` handshakes a second (2-2.5 ms each, 3.5-5.5 ms a full connection,
more with a client key chosen to be slow to check), whatever it sends; k addresses cost k times that, so an
attacker with many addresses (a cloud account, a botnet) is not stopped by this rule, and sources beyond the
SOURCES_REMEMBERED that hold a bucket share one. What it costs honest peers: a SYN counts before the
handshake, so spoofed SYNs with a peer's address (~600 bytes a second) spend that address's bucket and its new
connections are dropped meanwhile (its established ones are not, nor our own outbound ones and their replies);
peers behind one NAT, or one carrier-grade NAT, share a bucket. It covers TCP on the `input` hook only: a node
in a container reached through a published port (DNAT, the forward hook), or a QUIC listen address, is not
covered, and the table does not survive a reboot.
"""

from __future__ import annotations

import shutil
import subprocess

from swarm_node.net import SwarmError

DEFAULT_RATE, DEFAULT_BURST = 10, 40  # new connections a second per source, and the burst above it
SOURCES_REMEMBERED = 65535  # sources with a bucket of their own at once (the rest share one bucket)
SOURCE_TIMEOUT_S = 60  # a source's bucket is forgotten this long after its last new connection


def table_name(port: int) -> str:
    """The nftables table (family inet) that holds the limit for `port`."""
    return f"swarm_node_conn_limit_{port}"


def ruleset(port: int, rate: int = DEFAULT_RATE, burst: int = DEFAULT_BURST, sources: int = SOURCES_REMEMBERED) -> str:
    """The nftables script that replaces the limit for `port`, `sources` addresses (or /64s) with a bucket of their
    own (ValueError for a bad argument)."""
    if not 1 <= port <= 65535:
        raise ValueError(f"a connection limit needs a fixed TCP port (1-65535), got {port}: run the node with --port")
    if rate < 1 or burst < 1 or sources < 1:
        raise ValueError(f"rate, burst and sources must be >= 1, got {rate}, {burst} and {sources}")
    table = f"inet {table_name(port)}"
    limit = f"limit rate over {rate}/second burst {burst} packets"
    sets = "".join(f"  set sources{v} {{ type {t}; flags dynamic; timeout {SOURCE_TIMEOUT_S}s; size {sources}; }}\n"
                   for v, t in (("4", "ipv4_addr"), ("6", "ipv6_addr")))
    new = f"    tcp dport {port} ct state new"
    rules = []
    for v, source in (("4", "ip saddr"), ("6", "ip6 saddr & ffff:ffff:ffff:ffff::")):
        rules.append(f"{new} update @sources{v} {{ {source} {limit} }} counter drop\n")  # a source's own bucket
        # a full set adds no more sources: those left out share one bucket (else spoofed SYNs from 65,535 addresses
        # switched the limit off for everyone else: review, session 36)
        rules.append(f"{new} {source} != @sources{v} {limit} counter drop\n")
    return (f"table {table} {{}}\ndelete table {table}\n"  # replaced whole, whether or not it existed
            f"table {table} {{\n{sets}"
            "  chain input {\n"
            "    type filter hook input priority -10; policy accept;\n"
            + "".join(rules) + "  }\n}\n")


def _nft(script: str, what: str) -> None:
    nft = shutil.which("nft") or shutil.which("nft", path="/usr/sbin:/sbin")
    if nft is None:
        raise SwarmError(f"cannot {what}: nftables is not installed (Debian/Ubuntu: sudo apt-get install nftables)")
    try:
        out = subprocess.run([nft, "-f", "-"], input=script, capture_output=True, text=True, timeout=30)
    except subprocess.TimeoutExpired:
        raise SwarmError(f"cannot {what}: nft did not answer within 30 s") from None
    if out.returncode != 0:
        reason = out.stderr.strip().splitlines()[0] if out.stderr.strip() else f"nft exited {out.returncode}"
        hint = " (run it as root: sudo swarm-node firewall ...)" if "Operation not permitted" in out.stderr else ""
        raise SwarmError(f"cannot {what}: {reason}{hint}")


def apply(port: int, rate: int = DEFAULT_RATE, burst: int = DEFAULT_BURST) -> None:
    """Install (or replace) the limit for `port`; SwarmError saying what to do if the host refuses."""
    _nft(ruleset(port, rate, burst), f"limit new connections to port {port}")


def remove(port: int) -> None:
    """Delete the limit for `port` (nothing happens if there is none)."""
    table = f"inet {table_name(port)}"
    _nft(f"table {table} {{}}\ndelete table {table}\n", f"remove the connection limit of port {port}")

