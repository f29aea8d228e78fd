"""Starting a node's libp2p daemon (p2pd) so that peers can reach it, directly or through a relay.

    start_daemon   p2pd as a public node -> ask initial peers to dial back (reach.py) -> if no port
                   answered and relays are on, restart p2pd as a private node that reserves at
                   its relays and waits for its circuit address -> the Reachability line
The policy (modes, p2pd options, the line) is in `reach.py`; this module runs it on hivemind's
`P2P`, on the transport's event loop (docs/ARCHITECTURE.md, "Behind NAT").
"""

from __future__ import annotations

import asyncio
import logging
import os
import shutil
import tempfile
import time

from hivemind.p2p import P2P, PeerID
from hivemind.utils.multiaddr import Multiaddr

from swarm_node.config import SwarmConfig
from swarm_node.net import SwarmError
from swarm_node.net.hivemind_hardening import harden_hivemind
from swarm_node.net.hivemind_internals import NodeP2P, dial, open_stream
from swarm_node.net.reach import (DIALBACK_PROTOCOL, DIALBACK_TIMEOUT_S, Reachability, announce_order, ask_dialback,
                                  p2p_options, status_line, tcp_ports, verdict, with_port)

logger = logging.getLogger(__name__)

CONNECT_TIMEOUT_S = 5.0  # dialling an initial peer (dial-back check, bootstrap)
CIRCUIT_WAIT_S = 20.0  # a static relay reserves within a second or two; give a busy machine more
MAX_ASKED = 3  # initial peers asked to dial back, in parallel
# p2pd refuses a DHT request (or response) larger than this on its length prefix, before the body is read:
# an honest one is at most a capped membership bucket (64 x ~1.5 KB); hivemind's default, 4 MiB, let one
# verify-bomb request carry 2,400 records
MAX_DHT_MESSAGE_BYTES = 512 * 1024


async def create_p2p(cfg: SwarmConfig, identity: bytes, mode: str) -> P2P:
    """Start p2pd as a `mode` (public | private) node with our key (reach.p2p_options)."""
    harden_hivemind()  # hivemind's readers of peers' bytes, bounded (hivemind_hardening.py)
    options = p2p_options(mode, cfg.relay, list(cfg.relays) or list(cfg.peers), cfg.public_ip, cfg.port)
    tmpdir = tempfile.mkdtemp(prefix="swarm-node-")
    try:  # p2pd reads the key from a file; give it our key so the peer id matches the record key
        id_file = os.path.join(tmpdir, "identity.key")
        with open(os.open(id_file, os.O_WRONLY | os.O_CREAT, 0o600), "wb") as f:
            f.write(identity)
        return await NodeP2P.create(
            host_maddrs=with_port(list(cfg.host_maddrs), cfg.port),
            announce_maddrs=list(cfg.announce_maddrs) or options.pop("announce_maddrs", None),
            identity_path=id_file, check_if_identity_free=False, startup_timeout=cfg.start_timeout_s,
            persistent_conn_max_msg_size=MAX_DHT_MESSAGE_BYTES, **options)
    except Exception as e:
        if "failed to start in" in str(e):
            raise SwarmError(f"the libp2p daemon (p2pd) did not start within {cfg.start_timeout_s:g} s; on a "
                             "slow or busy machine raise it, e.g. --set swarm.start_timeout_s=120") from None
        raise
    finally:
        shutil.rmtree(tmpdir, ignore_errors=True)


async def start_daemon(cfg: SwarmConfig, identity: bytes, initial: list[tuple[PeerID, Multiaddr]],
                       peer_id: str) -> tuple[P2P, Reachability]:
    """p2pd running as the node it can be (public, or private behind a relay), and what we found."""
    mode = "public" if cfg.reachability == "auto" else cfg.reachability
    p2p = await create_p2p(cfg, identity, mode)
    reach, how = None, None
    asked = cfg.reachability == "auto" and bool(initial)
    if asked:
        one_each = {str(p): (p, m) for p, m in reversed(initial) if str(p) != peer_id}  # one vote per peer, the first
        reach, how = await dialback(p2p, list(reversed(one_each.values()))[:MAX_ASKED])  # address it was given first
        if reach is False and cfg.relay and (cfg.relays or initial):
            await p2p.shutdown()
            mode, p2p = "private", await create_p2p(cfg, identity, "private")
    if mode == "private":
        await wait_for_circuit(p2p, peer_id)
    addrs = await visible_addrs(p2p, peer_id)
    known = mode if reach is not None or mode == "private" else "unknown"
    reachability = Reachability(known, status_line(reach, how, addrs, cfg.relay, cfg.port, asked=asked), addrs)
    unreachable = reach is False and mode != "private"
    logger.log(logging.WARNING if unreachable else logging.INFO, "%s", reachability.line)
    return p2p, reachability


async def dialback(p2p: P2P, peers: list[tuple[PeerID, Multiaddr]]) -> tuple[bool | None, str | None]:
    """Ask `peers` (in parallel) to dial our listen ports back; reach.verdict of their answers."""
    ports = tcp_ports([str(m) for m in await p2p.get_visible_maddrs()])

    async def ask(pid: PeerID, maddr: Multiaddr) -> dict:
        try:
            await asyncio.wait_for(dial(p2p, pid, maddr), CONNECT_TIMEOUT_S)
            _, reader, writer = await open_stream(p2p, pid, DIALBACK_PROTOCOL)
            try:
                return await asyncio.wait_for(ask_dialback(reader, writer, ports), DIALBACK_TIMEOUT_S)
            finally:
                writer.close()
        except Exception as e:
            logger.debug("dial-back via %s failed: %r", maddr, e)
            return {}

    answers = await asyncio.gather(*(ask(p, m) for p, m in peers))
    return verdict(list(answers), ports)


async def wait_for_circuit(p2p: P2P, peer_id: str, timeout: float = CIRCUIT_WAIT_S) -> None:
    """Wait until p2pd holds a relay reservation (a /p2p-circuit address), at most `timeout` s."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if any("/p2p-circuit" in a for a in await visible_addrs(p2p, peer_id)):
            return
        await asyncio.sleep(0.25)
    logger.warning("no relay reservation within %.0f s: peers that cannot reach us directly cannot fetch "
                   "from us until one succeeds", timeout)


async def visible_addrs(p2p: P2P, peer_id: str) -> list[str]:
    """Our transport addresses (without /p2p/<us>), relayed ones first, loopback last."""
    own = Multiaddr(f"/p2p/{peer_id}")
    return announce_order([str(m.decapsulate(own)) for m in await p2p.get_visible_maddrs(latest=True)])
