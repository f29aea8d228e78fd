"""Reachability: can peers dial this node? If not, it serves through a circuit relay.

A volunteer behind a home router cannot be dialled: its router forwards nothing inward. Such a
node still opens connections outward, and libp2p's circuit relay v2 lets it *reserve* a slot at a
reachable peer, so others dial it as `<relay addr>/p2p/<relay id>/p2p-circuit/p2p/<its id>`. Every
node with `swarm.relay` on serves as a relay for others. A relayed connection usually carries
128 KiB per direction before the relay resets it (hivemind's p2pd registers its relay service a
second time with go-libp2p's defaults), so fetches over it resume on new streams (fetch.py).

    reachability "public"   p2pd forces reachability public; with swarm.public_ip it announces
                            /ip4/<public_ip>/tcp/<port> (a router port-forward, a VPS).
    reachability "private"  p2pd reserves a slot at the relays (swarm.relays, default swarm.peers)
                            and announces its circuit addresses first.
    reachability "auto"     the node starts public and asks an initial peer to dial it back
                            (DIALBACK_PROTOCOL); if no port answers it restarts p2pd as private.
                            The first node of a swarm (no peers) has nobody to ask: public.

The dial-back check is our own, not libp2p's AutoNAT, because a test must be able to read its
answer: a peer receiving {"ports": [...]} opens a plain TCP connection to each port on the IP the
request came from (never any other address, so it cannot be aimed at a third host), closes it,
and answers {"ip": ..., "open": [ports that accepted]}. A request relayed through a circuit cannot
be checked ({"status": "relayed"}). No hivemind here: the transport passes its streams in.
"""

from __future__ import annotations

import asyncio
import ipaddress
import logging
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass

from swarm_node.net.records import FrameError, decode_frame_body, encode_frame, frame_length

logger = logging.getLogger(__name__)

DIALBACK_PROTOCOL = "/swarm-node/dialback/1.0.0"
DIALBACK_CONNECT_S = 3.0  # one TCP connect to the asker
DIALBACK_TIMEOUT_S = 10.0  # the whole exchange, as the asker waits for it
MAX_PORTS = 4
MAX_FRAME = 1024
MIN_ASK_INTERVAL_S = 10.0  # a peer may ask once per 10 s
MAX_CONCURRENT = 4  # dial-backs in progress at once, for all askers
SLOT_WAIT_S = 3.0  # an asker waits this long for a check slot before it is answered busy (it waits 10 s in all)
MAX_STREAMS_PER_SUBNET = 2  # dial-back streams open at once from one public /24 (LAN and loopback: no limit)
MODES = ("auto", "public", "private")


@dataclass
class Reachability:
    """What this node found out about itself at start-up (status.json and `swarm-node doctor` show it)."""
    mode: str  # public | private | unknown
    line: str  # the one line printed for people
    addrs: list[str]  # addresses peers should dial, best first


def p2p_options(mode: str, relay: bool, relays: list[str], public_ip: str | None, port: int) -> dict:
    """Keyword arguments for hivemind's `P2P.create` for a node that is `mode` (public | private)."""
    opts = dict(use_relay=relay, auto_nat=True, nat_port_map=False)
    if mode == "private" and relay and relays:
        return {**opts, "force_reachability": "private", "use_auto_relay": True, "trusted_relays": list(relays)}
    opts["force_reachability"] = "public" if mode == "public" else "private"
    if public_ip and mode == "public":
        ip = ipaddress.ip_address(public_ip)
        opts["announce_maddrs"] = [f"/ip{ip.version}/{ip}/tcp/{port}"]
    return opts


def with_port(maddrs: list[str], port: int) -> list[str]:
    """Listen multiaddrs with `tcp/0` replaced by `tcp/<port>` (port 0: unchanged)."""
    if not port:
        return list(maddrs)
    return [m[: -len("/tcp/0")] + f"/tcp/{port}" if m.endswith("/tcp/0") else m for m in maddrs]


def announce_order(addrs: list[str]) -> list[str]:
    """Addresses in the order peers should try them: relayed (they work behind NAT), then others,
    loopback last (useful only on this machine)."""
    def rank(a: str) -> int:
        if "/p2p-circuit" in a:
            return 0
        return 2 if a.startswith("/ip4/127.") or a.startswith("/ip6/::1/") else 1
    return sorted(addrs, key=rank)


def tcp_ports(addrs: list[str]) -> list[int]:
    """The TCP ports of our listen addresses (non-circuit), deduplicated, at most MAX_PORTS."""
    ports: list[int] = []
    for a in addrs:
        parts = a.split("/")
        if "p2p-circuit" in parts or "tcp" not in parts:
            continue
        port = int(parts[parts.index("tcp") + 1])
        if port and port not in ports:
            ports.append(port)
    return ports[:MAX_PORTS]


def observed_ip(maddr: str) -> str | None:
    """The IP a stream came from (None for a relayed stream or a non-IP address)."""
    parts = maddr.split("/")
    if "p2p-circuit" in parts or len(parts) < 3 or parts[1] not in ("ip4", "ip6"):
        return None
    return parts[2]


# ---- server ----------------------------------------------------------------------------------------
class DialbackServer:
    """Answers dial-back requests: TCP-connects to the asker's own IP only, rate-limited per peer.

    `rates` (scores.PeerLimiter) and `limits` (fetch.StreamLimits), when given, judge each stream before
    anything is read, as for the other protocols: without them one id, graylisted or not, held 1,500 silent
    dial-back streams (and fds) at once. `group_of(addr)` (scores.subnet_of) names the asker's subnet: at most
    MAX_STREAMS_PER_SUBNET streams and one check at a time per subnet (others wait up to SLOT_WAIT_S), so 14
    cheap ids that each held a check for the connect timeout no longer answered every honest newcomer `busy`
    (red teams 12-13)."""

    def __init__(self, connect_timeout: float = DIALBACK_CONNECT_S, rates=None, limits=None,
                 group_of: Callable[[str], str | None] = lambda addr: None):
        self.connect_timeout, self.rates, self.limits, self.group_of = connect_timeout, rates, limits, group_of
        self.last_ask: dict[str, float] = {}
        self.active = 0
        self.checking: set[str] = set()  # subnets with a check in progress
        self.streams: Counter[str | None] = Counter()  # open dial-back streams per public subnet

    async def handle(self, peer: str, remote_addr: str, reader: asyncio.StreamReader,
                     writer: asyncio.StreamWriter) -> None:
        group = self.group_of(remote_addr)
        if self.rates is not None and not self.rates.allow(peer, "dialback") or \
                group is not None and self.streams[group] >= MAX_STREAMS_PER_SUBNET or \
                self.limits is not None and not self.limits.admit(peer):
            writer.close()  # 16 silent ids from one IP held every stream (red team 13)
            return
        if group is not None:
            self.streams[group] += 1
        try:
            reply = await self._answer(peer, remote_addr, group, reader)
            writer.write(encode_frame(reply, MAX_FRAME))
            await writer.drain()
        except Exception as e:
            logger.debug("dial-back for %s failed: %r", peer, e)
        finally:
            if self.limits is not None:
                self.limits.release(peer)
            if group is not None:
                self.streams[group] -= 1
                if not self.streams[group]:
                    del self.streams[group]
            writer.close()

    async def _answer(self, peer: str, remote_addr: str, group: str | None, reader: asyncio.StreamReader) -> dict:
        try:
            n = frame_length(await asyncio.wait_for(reader.readexactly(4), DIALBACK_CONNECT_S), MAX_FRAME)
            request = decode_frame_body(await asyncio.wait_for(reader.readexactly(n), DIALBACK_CONNECT_S))
        except FrameError:
            return {"status": "bad_request"}
        ports = request.get("ports")
        if not isinstance(ports, list) or not 0 < len(ports) <= MAX_PORTS or \
                not all(type(p) is int and 0 < p < 65536 for p in ports):
            return {"status": "bad_request"}
        ip = observed_ip(remote_addr)
        if ip is None:
            return {"status": "relayed"}
        now = time.monotonic()
        if now - self.last_ask.get(peer, -MIN_ASK_INTERVAL_S) < MIN_ASK_INTERVAL_S or not await self._slot(group):
            return {"status": "busy"}
        self.last_ask[peer] = now
        if len(self.last_ask) > 1024:
            self.last_ask = {p: t for p, t in self.last_ask.items() if now - t < MIN_ASK_INTERVAL_S}
        self.active += 1
        if group is not None:
            self.checking.add(group)
        try:
            results = await asyncio.gather(*(self._probe(ip, p) for p in ports))
        finally:
            self.active -= 1
            self.checking.discard(group)
        return {"status": "ok", "ip": ip, "open": [p for p, ok in zip(ports, results) if ok]}

    async def _slot(self, group: str | None) -> bool:
        """Wait up to SLOT_WAIT_S for one of the MAX_CONCURRENT checks, and for our subnet's one (answering `busy`
        at once told a second newcomer behind the same NAT to start not knowing it was behind one; red team 13)."""
        deadline = time.monotonic() + SLOT_WAIT_S
        while self.active >= MAX_CONCURRENT or group in self.checking:
            if time.monotonic() >= deadline:
                return False
            await asyncio.sleep(0.05)
        return True

    async def _probe(self, ip: str, port: int) -> bool:
        try:
            _, writer = await asyncio.wait_for(asyncio.open_connection(ip, port), self.connect_timeout)
        except (OSError, asyncio.TimeoutError):
            return False
        writer.close()
        return True


# ---- client ----------------------------------------------------------------------------------------
async def ask_dialback(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, ports: list[int]) -> dict:
    """Send our ports on an open dial-back stream; the peer's answer (raises on I/O or frame errors)."""
    writer.write(encode_frame({"ports": list(ports)[:MAX_PORTS]}, MAX_FRAME))
    await writer.drain()
    n = frame_length(await reader.readexactly(4), MAX_FRAME)
    return decode_frame_body(await reader.readexactly(n))


def verdict(answers: list, ports: list[int]) -> tuple[bool | None, str | None]:
    """(reachable, how) from the peers' answers: True with "ip:port" if more of the peers that checked
    found a port open than found none; False if not; None if nobody could check. An answer whose `ip`
    is not an address, or whose `open` is not a list of the ports we asked about, counts as no answer:
    one such answer made the node fail to start, one lie overruled the honest answers, and its `ip`
    went raw into the log and the terminal (red team 12)."""
    checked = []
    for a in answers:
        if not isinstance(a, dict) or a.get("status") != "ok" or not isinstance(a.get("open"), list) \
                or not all(type(p) is int and p in ports for p in a["open"]):
            continue
        try:
            checked.append((ipaddress.ip_address(a.get("ip")), a["open"]))
        except ValueError:
            continue
    if any(ip.is_global for ip, _ in checked):  # a peer on our LAN sees what the world does not
        checked = [(ip, found) for ip, found in checked if ip.is_global]
    opened = [(ip, found) for ip, found in checked if found]
    if checked and 2 * len(opened) > len(checked):
        return True, f"{opened[0][0]}:{opened[0][1][0]}"
    if checked:
        closed = next(ip for ip, found in checked if not found)
        return False, f"{closed}: ports {', '.join(map(str, ports))} closed"
    return None, None


def circuit_addrs(addrs: list[str]) -> list[str]:
    return [a for a in addrs if "/p2p-circuit" in a]


def status_line(reach: bool | None, how: str | None, addrs: list[str], relay: bool, port: int,
                asked: bool = False) -> str:
    """The one line a volunteer reads at start-up (`asked`: some peer was asked to dial back)."""
    relayed = circuit_addrs(addrs)
    if relayed:
        return f"behind NAT: serving through relay {relayed[0]}"
    if reach:
        return f"reachable at {how} (a peer dialled back)"
    if reach is None:
        why = "no initial peer answered the dial-back check" if asked else \
            "no peer to dial back (first node of the swarm?)"
        return f"reachability unknown: {why}; others reach it at " + (", ".join(addrs[:2]) or "no address")
    fix = f"forward TCP port {port} to this machine and pass --public-ip" if port else \
        "pass --port N, forward TCP port N on your router, and pass --public-ip"
    return (f"unreachable ({how}): {fix}" + ("" if relay else ", or enable relays (--relay)")
            + "; peers can still fetch from it over connections it opens")
