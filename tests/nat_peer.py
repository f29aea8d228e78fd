"""A transport-only swarm peer for tests/test_reach.py: offers one packet of N random bytes, or
fetches one packet of round 1 and prints what it got.

    python tests/nat_peer.py --peers MADDR --run-id RUN --offer-bytes 3145728 --seconds 120
    python tests/nat_peer.py --peers MADDR --run-id RUN --fetch --seconds 90
prints `OFFERED <digest> <peer id> <reachability>` or `FETCHED {"digests": [...], "sizes": [...], ...}`.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from swarm_node.config import SwarmConfig  # noqa: E402
from swarm_node.net.hivemind import HivemindTransport  # noqa: E402

TOKENIZER = "sha256:" + "1" * 64


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--peers", nargs="+", required=True)
    ap.add_argument("--run-id", required=True)
    ap.add_argument("--offer-bytes", type=int, default=0)
    ap.add_argument("--fetch", action="store_true")
    ap.add_argument("--seconds", type=float, default=60)
    args = ap.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    logging.getLogger("swarm_node").setLevel(logging.DEBUG)
    cfg = SwarmConfig(run_id=args.run_id, peers=args.peers, host_maddrs=["/ip4/0.0.0.0/tcp/0"],
                      fetch_timeout_s=60, max_packet_bytes=16 << 20)
    with HivemindTransport(cfg, "nat-peer", TOKENIZER) as transport:
        if args.offer_bytes:
            digest = transport.offer(1, 1, os.urandom(args.offer_bytes))
            print(f"OFFERED {digest} {transport.peer_id} {transport.reachability.line}", flush=True)
            time.sleep(args.seconds)
            return 0
        got = transport.collect(1, 1, min_peers=1, deadline_s=args.seconds)
        print("FETCHED " + json.dumps({"digests": [r.digest for r in got.packets], "sizes": [len(r.data) for r in got.packets],
                                        "peers": [r.peer_id for r in got.packets],
                                        "resumes": transport.stats()["fetch_resumes"],
                                        "reachability": transport.reachability.line}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
