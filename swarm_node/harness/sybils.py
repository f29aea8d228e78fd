"""Live Sybils: k peer ids from one process, each its own libp2p host (p2pd), that try to eclipse a node.

Each Sybil speaks the protocol and cheats the mesh as issue 27's red team did: it announces
`degree: 0`, takes every peer that dials it, never prunes or evicts, dials every peer it learns,
names the other Sybils in peer exchange (they know each other from the start) and announces the
victims' round and model, but never offers a packet (with `--lie`: offers one nobody serves; with
`--busy`: offers one and answers every fetch `busy`, so no fetch ever finds it out; with `--stall`: offers one
and holds every fetch open without a byte, until the fetcher gives up). An honest node should give such a neighbour
no lasting slot (it credits only neighbours that deliver, `net/scores.py`) and keep its honest
neighbours however many Sybils knock. Used by bench/redteam_eclipse.py.

    python -m swarm_node.harness.sybils --k 6 --peers MADDR --run-id RUN --model DIR --summary S.json

With `--peers-file F` instead of `--peers`, the hosts start before the victims exist (64 hosts take
minutes to start on a loaded machine): they know each other's addresses, name each other in peer
exchange but never dial each other (a full mesh of 64 Sybils costs the attacker's core, not the
victim), and dial the victims once F appears: one multiaddr a line, and `sybil <multiaddr>` for
fellow Sybils in other processes (one process per network namespace, to come from many subnets).

Prints `SYBILS <id> <id> ...` and `ADDRS <multiaddr> ...` once every host is up, then follows the
honest peers' rounds for --seconds (it never gives up: a benched Sybil dials again when its bench
ends); the summary lists, per round, the neighbours each Sybil believes it holds.
"""

from __future__ import annotations

import argparse
import asyncio
import secrets
import signal
import sys
import time
from pathlib import Path

import swarm_node.net.hivemind as hivemind_transport
from swarm_node.config import SwarmConfig
from swarm_node.fsutil import write_json_atomic
from swarm_node.harness.hostile import PublicModel
from swarm_node.net import SwarmError
from swarm_node.net.announce import Mesh
from swarm_node.net.fetch import PacketServer, refuse_stream
from swarm_node.net.records import STATUS_BUSY, encode_frame

STALL_S = 60.0  # a stalling Sybil holds each fetch this long at most


class SybilMesh(Mesh):
    """A mesh that lies about itself and keeps everyone (see the module docstring); with `lie`, it also
    offers a made-up packet for its announced round, so that it looks like a producer until fetched."""

    lie = False
    others: frozenset[str] = frozenset()  # with --peers-file: the other Sybils, named in peer exchange, never dialled

    def announcement(self, to: str) -> dict:
        ann = {**super().announcement(to), "degree": 0}
        if self.lie:  # a fresh digest nobody serves, each time: fetching it is the only way to find out
            ann["offers"] = [[ann["round"], "sha256:" + secrets.token_hex(32), 4096]]
        return ann

    def _room_for(self, peer: str, now: float, group: str | None = None, offering: bool = False) -> bool:
        return True

    def prune(self, now: float | None = None) -> list[str]:
        return []

    def evict(self, now: float) -> list[str]:
        return []

    def short(self) -> bool:
        return True

    def dials_wanted(self) -> int:
        return 64

    def candidates(self, n: int, now: float, busy: set[str] = frozenset()) -> list[tuple[str, list[str]]]:
        return [(p, a) for p, a in super().candidates(n, now, busy) if p not in self.others]


class BusyServer(PacketServer):
    """Answers every fetch `busy`: an offer that is never found out to be false (red team, session 13)."""

    async def handle(self, reader, writer, peer: object = None) -> None:
        refuse_stream(writer, encode_frame({"status": STATUS_BUSY}))


class StallingServer(PacketServer):
    """Holds every fetch open without answering, for STALL_S (the fetcher's timeout ends it first):
    the adaptive form of `busy`, since a refusal is an answer and a held stream is not (session 17)."""

    async def handle(self, reader, writer, peer: object = None) -> None:
        try:
            await asyncio.sleep(STALL_S)
        finally:
            writer.close()


def learn_all(sybils: list, peers: list[tuple[str, list[str]]]) -> None:
    """Every Sybil learns `peers` (id, addrs) as candidates (its own entry is skipped): the next tick dials them."""
    async def learn(mesh: Mesh) -> None:  # on the transport's loop, where the mesh changes
        mesh.learn(peers)
    for s in sybils:
        s.call(learn(s._push.mesh), 10)


def split_maddr(maddr: str) -> tuple[str, list[str]]:
    """`/ip4/.../tcp/N/p2p/<id>` -> (id, [address without /p2p/]): how the mesh keeps a candidate."""
    addr, peer = maddr.rsplit("/p2p/", 1)
    return peer, [addr]


def wait_for_peers(path: Path, t_end: float) -> tuple[list[str], list[str]]:
    """The victims' and the fellow Sybils' multiaddrs (with /p2p/<id>) that `path` lists, once it exists
    (written whole: renamed into place)."""
    while not path.exists():
        if time.monotonic() > t_end:
            raise SystemExit(f"{path} did not appear")
        time.sleep(0.2)
    lines = [line.split() for line in path.read_text().splitlines()]
    victims = [w[0] for w in lines if len(w) == 1 and "/p2p/" in w[0]]
    return victims, [w[1] for w in lines if len(w) == 2 and w[0] == "sybil" and "/p2p/" in w[1]]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--k", type=int, default=6, help="Sybil peer ids (one p2pd each)")
    ap.add_argument("--peers", nargs="+", default=[], help="the honest node(s) to join through")
    ap.add_argument("--peers-file", default=None, help="instead of --peers: start now, join the multiaddrs this file "
                                                       "lists (one a line) once it appears")
    ap.add_argument("--run-id", required=True)
    ap.add_argument("--model", default=None, help="the public model directory: the Sybils announce its model id "
                                                    "(default: none, they announce a made-up one)")
    ap.add_argument("--host", default="127.0.0.1", help="the IPv4 address the Sybils listen on (all of them)")
    ap.add_argument("--task-options", default="{}")
    ap.add_argument("--seconds", type=float, default=900)
    ap.add_argument("--summary", default=None)
    ap.add_argument("--lie", action="store_true", help="offer a made-up packet in every announcement")
    ap.add_argument("--busy", action="store_true", help="offer a made-up packet and answer every fetch `busy`")
    ap.add_argument("--stall", action="store_true", help="offer a made-up packet and hold every fetch open, silent")
    args = ap.parse_args()
    if bool(args.peers) == bool(args.peers_file):
        ap.error("give the honest nodes either as --peers or as --peers-file")
    SybilMesh.lie = args.lie or args.busy or args.stall
    if args.busy or args.stall:
        hivemind_transport.PacketServer = BusyServer if args.busy else StallingServer
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    hivemind_transport.Mesh = SybilMesh  # every transport of this process builds a Sybil mesh
    sybils, summary = [], {"k": args.k, "ids": [], "rounds": {}}
    t_end = time.monotonic() + args.seconds
    try:
        for i in range(args.k):  # each knows the victims and the Sybils before it: they name each other
            known = args.peers + ([s.join_addrs()[0] for s in sybils[:8]] if args.peers else [])
            cfg = SwarmConfig(run_id=args.run_id, peers=known, host_maddrs=[f"/ip4/{args.host}/tcp/0"])
            sybils.append(hivemind_transport.HivemindTransport(cfg, model_id="sybil", tokenizer="sha256:" + "1" * 64))
            sybils[-1].start()
        if args.model is not None:
            public = PublicModel(args.model, args.task_options, args.run_id, sybils[0].peer_id)
            for s in sybils:
                s.model_id, s.tokenizer = public.policy.model_id, public.tokenizer
        summary["ids"], addrs = [s.peer_id for s in sybils], [s.join_addrs()[0] for s in sybils]
        if args.peers_file:
            SybilMesh.others = frozenset(summary["ids"])
            learn_all(sybils, [split_maddr(a) for a in addrs])
        print("SYBILS " + " ".join(summary["ids"]), flush=True)
        print("ADDRS " + " ".join(addrs), flush=True)
        if args.peers_file:
            victims, fellows = wait_for_peers(Path(args.peers_file), t_end)
            SybilMesh.others |= {split_maddr(m)[0] for m in fellows}
            learn_all(sybils, [split_maddr(m) for m in fellows + victims])
        ours, last = set(summary["ids"]) | SybilMesh.others, 0  # the victims' rounds only, not fellow Sybils'
        while time.monotonic() < t_end:  # never give up: a benched Sybil dials again once its bench ends
            try:
                seen = [p.round for s in sybils for p in s.peers() if p.peer_id not in ours]
                r = max(seen, default=0)
                if r > last:
                    last = r
                    for s in sybils:
                        s.publish(r, r)  # the victims' round, no offers: present, never delivering
                    summary["rounds"][r] = {s.peer_id: sorted(s.neighbours()) for s in sybils}
                    if args.summary:
                        write_json_atomic(args.summary, summary, durable=False)
            except SwarmError as e:  # one host's loop missed a call on an overloaded core: go on with all of them
                print(f"sybils: {e}", file=sys.stderr, flush=True)
            time.sleep(0.5)
        return 0
    finally:  # ending: a TERM from here on, while the interpreter shuts down, must not make it exit -15
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        if args.summary:
            write_json_atomic(args.summary, summary, durable=False)
        for s in sybils:
            s.close()


if __name__ == "__main__":
    sys.exit(main())
