"""`swarm-node relay`: a node without a model that others bootstrap from and relay through.

A swarm of volunteers behind home routers needs one reachable machine (a small VPS, or a home
machine with a forwarded port): NATed nodes reserve a circuit-relay slot there, and peers reach
them through it (`net/reach.py`). It joins the mesh like any node, answers announcements with peer
exchange and dial-back checks, and relays; it generates, trains and offers nothing.
"""

from __future__ import annotations

import logging
import signal
import threading
import time

from swarm_node.commands.peers import NO_TOKENIZER
from swarm_node.config import SwarmConfig
from swarm_node.status import StatusFile

logger = logging.getLogger(__name__)

RELAY_MODEL = "swarm-node-relay"  # how the relay names itself in its announcements


def run_relay(cfg: SwarmConfig, seconds: float | None, status: StatusFile | None = None) -> None:
    """Serve until SIGINT/SIGTERM (or for `seconds`)."""
    from swarm_node.net.hivemind import HivemindTransport

    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    with HivemindTransport(cfg, RELAY_MODEL, NO_TOKENIZER, produces=False) as transport:
        addrs = transport.join_addrs()
        if status is not None:
            status.update(state="running", peer_id=transport.peer_id, join_addrs=addrs,
                          reachability=transport.reachability.line)
        logger.info("relay up (%s). Others join this swarm with:\n  --peers %s", transport.reachability.line,
                    addrs[0] if addrs else "?")
        deadline = None if seconds is None else time.monotonic() + seconds
        while not stop.wait(1.0) and (deadline is None or time.monotonic() < deadline):
            if status is not None:  # whom the relay keeps (`swarm-node peers --scores OUT`)
                status.update(neighbours=transport.neighbours())
    if status is not None:
        status.update(state="done")
