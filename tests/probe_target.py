"""A node for the live conformance probe's test: serves one valid packet of run `probe-run` on
127.0.0.1, prints `ADDR <multiaddr>`, and runs until killed (at most 120 s).

    python tests/probe_target.py [--broken]

--broken is deliberately non-conforming: it judges no announcement (takes any run and protocol as a
neighbor) and serves bytes that do not hash to the digest it announces."""
from __future__ import annotations

import sys
import time

from swarm_node.config import SwarmConfig
from swarm_node.net.announce import Mesh
from swarm_node.net.fetch import Offers
from swarm_node.net.hivemind import HivemindTransport
from swarm_node.wire.codec import Packet, encode


class FlippedOffers(Offers):
    """Serves each packet with its last bit flipped: bytes that do not hash to the announced digest."""

    def get(self, digest: str) -> bytes | None:
        data = super().get(digest)
        return None if data is None else data[:-1] + bytes([data[-1] ^ 1])


def main() -> None:
    broken = "--broken" in sys.argv
    if broken:
        Mesh.judge = lambda self, ann: None
    cfg = SwarmConfig(run_id="probe-run", host_maddrs=["/ip4/127.0.0.1/tcp/0"])
    node = HivemindTransport(cfg, "m", "sha256:" + "0" * 64)
    if broken:
        node._offers = FlippedOffers(cfg.max_offers)
    node.start()
    try:
        packet = Packet(run_id=cfg.run_id, sender=node.peer_id, model_id="m", tokenizer="sha256:" + "0" * 64,
                        policy_version=1, round=3, mode="vertical", groups=[])
        node.offer(3, 1, encode(packet))
        print("ADDR", node.join_addrs()[0], flush=True)
        time.sleep(120)
    finally:
        node.close()


if __name__ == "__main__":
    main()
