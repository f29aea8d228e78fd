"""A per-source limit on new TCP connections to the node's port, in the kernel (nftables), before p2pd.

Every inbound libp2p connection makes p2pd answer a Noise handshake, and its answer carries a
signature of the node's identity key: an RSA-2048 signature, since the key is also the DHT record
key (identity.py). A stranger needs no crypto of its own to ask for it: 32 random bytes after
`/multistream/1.0.0` and `/noise` make p2pd compute two X25519 products and sign. Measured (red team 26
and session 36, 2-core AMD EPYC, bare p2pd on 127.0.0.1): 2.3 ms of p2pd per such attempt against
0.45 ms of a pure-Python attacker (0.88 of a core at 386 attempts/s); full connections from fresh
ids at ~190/s took a node's rounds to 0.29-0.53x. Nothing above the socket can refuse them: the
shield (shield.py) acts on protocol ids, which a connection never reaches, and hivemind's p2pd has no
per-address limit (its connection manager trims old connections, it does not slow new ones).

So the refusal happens where it is cheapest: the kernel drops a SYN to our port from a source that
opened more than `rate` new connections a second (after a burst of `burst`), per IPv4 address and per
IPv6 /64. An honest peer opens one connection and keeps it; a whole NAT's worth of peers fit in the
defaults. The rule lives in a table of its own (`table_name`), replaced whole by `apply` and deleted
by `remove`; it needs root (CAP_NET_ADMIN) and nftables, and the node must listen on a fixed port
(`--port`). The bound, in plain words: one address costs the node at most `rate` handshakes a second
(~2.3 ms each with an RSA identity), whatever it sends; k addresses cost k times that, so an attacker
with many addresses (a cloud account, a botnet) is not stopped by this rule.
"""

from __future__ import annotations

import shutil
import subprocess

from swarm_node.net import SwarmError

DEFAULT_RATE, DEFAULT_BURST = 10, 40  # new connections a second per source, and the burst above it
SOURCES_REMEMBERED = 65535  # sources tracked at once (the oldest expire after SOURCE_TIMEOUT_S idle)
SOURCE_TIMEOUT_S = 60


def table_name(port: int) -> str:
    """The nftables table (family inet) that holds the limit for `port`."""
    return f"swarm_node_conn_limit_{port}"


def ruleset(port: int, rate: int = DEFAULT_RATE, burst: int = DEFAULT_BURST) -> str:
    """The nftables script that replaces the limit for `port` (ValueError for a bad argument)."""
    if not 1 <= port <= 65535:
        raise ValueError(f"a connection limit needs a fixed TCP port (1-65535), got {port}: run the node with --port")
    if rate < 1 or burst < 1:
        raise ValueError(f"rate and burst must be >= 1, got {rate} and {burst}")
    table = f"inet {table_name(port)}"
    limit = f"limit rate over {rate}/second burst {burst} packets"
    sets = "".join(f"  set sources{v} {{ type {t}; flags dynamic; timeout {SOURCE_TIMEOUT_S}s; size {SOURCES_REMEMBERED}; }}\n"
                   for v, t in (("4", "ipv4_addr"), ("6", "ipv6_addr")))
    return (f"table {table} {{}}\ndelete table {table}\n"  # replaced whole, whether or not it existed
            f"table {table} {{\n{sets}"
            "  chain input {\n"
            "    type filter hook input priority -10; policy accept;\n"
            f"    tcp dport {port} ct state new add @sources4 {{ ip saddr {limit} }} counter drop\n"
            f"    tcp dport {port} ct state new add @sources6 {{ ip6 saddr & ffff:ffff:ffff:ffff:: {limit} }} counter drop\n"
            "  }\n}\n")


def _nft(script: str, what: str) -> None:
    nft = shutil.which("nft") or shutil.which("nft", path="/usr/sbin:/sbin")
    if nft is None:
        raise SwarmError(f"cannot {what}: nftables is not installed (Debian/Ubuntu: sudo apt-get install nftables)")
    out = subprocess.run([nft, "-f", "-"], input=script, capture_output=True, text=True, timeout=30)
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

